//! `nvfp4-bench`: see `nvfp4-bench --help` and bench/README.md.

use indicatif::{ProgressBar, ProgressStyle};
use nvfp4_gemm_bench::block::BlockReport;
use nvfp4_gemm_bench::measure::Bench;
use nvfp4_gemm_bench::moe::{MoeReport, RoutingFile};
use nvfp4_gemm_bench::options::{self, Options, Parsed};
use nvfp4_gemm_bench::report::{self, Report};
use std::panic::AssertUnwindSafe;
use std::process::ExitCode;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Progress steps per shape: `Bench::shape` calls its step callback this many times after the
/// first, and once more with `--w4a16`.
const STEPS_PER_SHAPE: u64 = 7;

/// Progress steps per MoE row: `Bench::moe_shape` calls its step callback this many times after
/// the first, and twice more with `--w4a16`.
const STEPS_PER_MOE: u64 = 3;

/// Progress steps per prepack row: `Bench::prepack_shape` calls its step callback this many times
/// after the first.
const STEPS_PER_PREPACK: u64 = 2;

fn run(o: Options) -> Result<ExitCode, String> {
    let started = Instant::now();
    if let Some(json) = &o.block_svg {
        let text = std::fs::read_to_string(json).map_err(|e| format!("{}: {e}", json.display()))?;
        let value: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", json.display()))?;
        let svg = json.with_extension("svg");
        report::write_block_svg(&value, &svg)?;
        eprintln!("wrote {}", svg.display());
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(path) = &o.write_routing {
        RoutingFile::new(&o.moe, o.seed).write(path)?;
        eprintln!("wrote the routings of {} MoE shapes (seed {}) to {}", o.moe.len(), o.seed, path.display());
        return Ok(ExitCode::SUCCESS);
    }
    // The PyTorch baseline runs first, with the GPU to itself.
    let torch = if o.moe.is_empty() {
        None
    } else {
        std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
        let t = nvfp4_gemm_bench::torch::baseline(&o);
        eprintln!("PyTorch baseline: {}", t.note);
        Some(t)
    };
    let mut bench = Bench::new(&o)?;
    std::fs::create_dir_all(&o.out).map_err(|e| format!("{}: {e}", o.out.display()))?;
    let steps_per_shape = STEPS_PER_SHAPE + u64::from(o.w4a16);
    let steps_per_moe = STEPS_PER_MOE + 2 * u64::from(o.w4a16);
    // `Bench::block_layer` calls its step callback once before drawing the weights, then per
    // precision once before planning, once before the check (unless --no-check) and once per
    // token count.
    let steps_per_block = o.block.precisions.len() as u64 * (1 + u64::from(o.check) + o.block.tokens.len() as u64);
    let pb = ProgressBar::new(
        1 + steps_per_shape * o.problems.len() as u64
            + steps_per_moe * o.moe.len() as u64
            + STEPS_PER_PREPACK * o.prepack.len() as u64
            + steps_per_block * o.block.layers.len() as u64,
    );
    pb.set_style(
        ProgressStyle::with_template("{elapsed_precise} [{bar:30.cyan/blue}] {pos}/{len} {msg}")
            .map_err(|e| e.to_string())?
            .progress_chars("=> "),
    );
    // The bar hides itself when stderr is not a terminal (a log file); then each step is a line.
    let log = |pb: &ProgressBar, msg: String| {
        if pb.is_hidden() {
            eprintln!("[{:7.1}s] {msg}", started.elapsed().as_secs_f64());
        }
        pb.set_message(msg);
    };
    log(&pb, format!("{}: measuring the ceilings (copy bandwidth, bf16 tensor rate, TMA bandwidth)", bench.device()));
    let environment = bench.environment(&o)?;
    pb.inc(1);
    if !environment.cublas.starts_with("loaded") {
        pb.suspend(|| eprintln!("baseline unavailable: {}", environment.cublas.trim_start_matches("unavailable: ")));
    }
    let mut shapes = vec![];
    let mut errors = vec![];
    for named in &o.problems {
        let mut steps: u64 = 0;
        // A panic inside one shape (cudarc panics on some driver failures) is reported like an
        // error, and the other shapes still run.
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            bench.shape(named, &o, &environment, &mut |phase| {
                if steps > 0 {
                    pb.inc(1);
                }
                steps += 1;
                log(&pb, format!("{}: {phase}", named.name));
            })
        }))
        .unwrap_or_else(|_| Err("panicked (message above)".into()));
        pb.inc(steps_per_shape.saturating_sub(steps.saturating_sub(1)));
        match result {
            Ok(r) => {
                let check = r.check.as_deref().unwrap_or("check skipped (--no-check)");
                pb.suspend(|| {
                    eprintln!("{}: {}", r.name, r.kernel);
                    eprintln!("{}: {check}", r.name);
                    eprintln!("{}: cuBLAS: {}", r.name, r.cublas_note);
                });
                shapes.push(r);
            }
            Err(e) => {
                pb.suspend(|| eprintln!("{}: ERROR: {e}", named.name));
                errors.push(format!("{}: {e}", named.name));
            }
        }
    }
    let mut moe_rows = vec![];
    for shape in &o.moe {
        let torch = torch.as_ref().expect("made when there are MoE rows");
        let mut steps: u64 = 0;
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            bench.moe_shape(shape, &o, torch, &mut |phase| {
                if steps > 0 {
                    pb.inc(1);
                }
                steps += 1;
                log(&pb, format!("{}: {phase}", shape.name));
            })
        }))
        .unwrap_or_else(|_| Err("panicked (message above)".into()));
        pb.inc(steps_per_moe.saturating_sub(steps.saturating_sub(1)));
        match result {
            Ok(r) => {
                let check = r.check.as_deref().unwrap_or("check skipped (--no-check)");
                pb.suspend(|| {
                    eprintln!("{}: GemmPlan {}; MoePlan {}", r.name, r.plan_kernel, r.moe_kernel);
                    eprintln!("{}: {check}", r.name);
                });
                moe_rows.push(r);
            }
            Err(e) => {
                pb.suspend(|| eprintln!("{}: ERROR: {e}", shape.name));
                errors.push(format!("{}: {e}", shape.name));
            }
        }
    }
    let mut prepack_rows = vec![];
    for shape in &o.prepack {
        let mut steps: u64 = 0;
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            bench.prepack_shape(shape, &o, &environment, &mut |phase| {
                if steps > 0 {
                    pb.inc(1);
                }
                steps += 1;
                log(&pb, format!("{}: {phase}", shape.name));
            })
        }))
        .unwrap_or_else(|_| Err("panicked (message above)".into()));
        pb.inc(STEPS_PER_PREPACK.saturating_sub(steps.saturating_sub(1)));
        match result {
            Ok(rows) => {
                pb.suspend(|| {
                    for r in &rows {
                        eprintln!(
                            "{} {}: {}",
                            r.name,
                            r.activations,
                            r.check.as_deref().unwrap_or("check skipped (--no-check)")
                        );
                    }
                });
                prepack_rows.extend(rows);
            }
            Err(e) => {
                pb.suspend(|| eprintln!("{}: ERROR: {e}", shape.name));
                errors.push(format!("{}: {e}", shape.name));
            }
        }
    }
    let mut block_runs = vec![];
    for layer in &o.block.layers {
        let mut steps: u64 = 0;
        let result = std::panic::catch_unwind(AssertUnwindSafe(|| {
            bench.block_layer(layer, &o, &environment, &mut |phase| {
                if steps > 0 {
                    pb.inc(1);
                }
                steps += 1;
                log(&pb, format!("block {}: {phase}", layer.name));
            })
        }))
        .unwrap_or_else(|_| Err("panicked (message above)".into()));
        pb.inc(steps_per_block.saturating_sub(steps.saturating_sub(1)));
        match result {
            Ok(runs) => {
                pb.suspend(|| {
                    for r in &runs {
                        let check = r.check.as_deref().unwrap_or("check skipped (--no-check)");
                        eprintln!("block {} {}: {check}", r.layer.name, r.precision.name());
                    }
                });
                block_runs.extend(runs);
            }
            Err(e) => {
                pb.suspend(|| eprintln!("block {}: ERROR: {e}", layer.name));
                errors.push(format!("block {}: {e}", layer.name));
            }
        }
    }
    pb.finish_and_clear();
    let block = (!o.block.layers.is_empty()).then_some(BlockReport {
        seed: o.seed,
        iters: o.iters,
        check_tokens: o.block.check_tokens,
        copy_tb_s: environment.copy_tb_s,
        runs: block_runs,
    });
    let unix_time = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let report = Report {
        tool: format!("nvfp4-bench {}", env!("CARGO_PKG_VERSION")),
        unix_time,
        environment,
        options: o.clone(),
        shapes,
        moe: torch.map(|torch| MoeReport { seed: o.seed, torch, shapes: moe_rows }),
        prepack: prepack_rows,
        block,
    };
    let (json, svg) = report::output_paths(&report, &o.out);
    report::write_json(&report, &json)?;
    let mut wrote = json.display().to_string();
    if let Some(svg) = svg {
        report::write_svg(&report, &svg)?;
        wrote += &format!(" and {}", svg.display());
    }
    eprintln!("wrote {wrote} ({:.1} s)", started.elapsed().as_secs_f64());
    print!("{}", report::table(&report));
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    Ok(if report.passed() { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match options::parse(&args) {
        Ok(Parsed::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Ok(Parsed::Run(o)) => run(o),
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("nvfp4-bench: error: {e}");
            ExitCode::from(2)
        }
    }
}
