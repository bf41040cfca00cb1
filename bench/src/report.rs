//! What a bench run found, and its three renderings: the text table, the JSON file, the SVG plot.

use crate::stats::Stats;
use serde::Serialize;
use std::fmt::Write as _;
use std::path::Path;

/// The device and the ceilings measured in the same process.
#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    /// Device name, architecture and SM count.
    pub device: String,
    /// Measured device-to-device copy bandwidth, bytes read + written per second / 1e12.
    pub copy_tb_s: f64,
    /// Bytes of the copy (each direction).
    pub copy_bytes: usize,
    /// Measured bf16 tensor rate (cuBLAS 8192³), TFLOP/s; `None` without cuBLAS.
    pub tensor_tflops: Option<f64>,
    /// `loaded` or `unavailable: <why>`.
    pub cublas: String,
    /// L2 flush buffer bytes.
    pub flush_bytes: usize,
    /// The TMA ceilings (L2→SM, DRAM→SM; [`crate::ceiling`]); empty when they could not be
    /// measured (`tma_note` says why).
    pub tma: Vec<crate::ceiling::TmaCeiling>,
    /// `measured`, or why the TMA ceilings are missing.
    pub tma_note: String,
}

/// One problem's results. Times in µs; rates from the kernel-only median.
#[derive(Debug, Clone, Serialize)]
pub struct ShapeResult {
    /// Label.
    pub name: String,
    /// The shape spec.
    pub spec: String,
    /// Number of groups.
    pub groups: usize,
    /// 2·m·n·k summed over groups.
    pub flops: f64,
    /// NVFP4 bytes: A and B values + blocked scales, plus C.
    pub bytes: f64,
    /// The planner's kernel description.
    pub kernel: String,
    /// `PASS`/`FAIL` line of the comparison with the CPU reference, `None` when skipped.
    pub check: Option<String>,
    /// Whether the check passed (`true` when skipped).
    pub check_passed: bool,
    /// Competition-style per-call time.
    pub competition_us: Stats,
    /// Kernel-only time: events around one call on input set 0 after an L2 flush, the same
    /// tensors as the call before (the plan's tables current), alternated with
    /// `harness_new_us`.
    pub kernel_us: Stats,
    /// Host overhead per call, same buffers.
    pub host_cached_us: Stats,
    /// Host overhead per call, the `rotating_sets` input sets in turn (new tensors every call).
    pub host_rotating_us: Stats,
    /// Host overhead per call, same buffers, stacked (`GemmPlan::run_stacked`: one buffer per
    /// operand for all groups).
    pub host_stacked_us: Stats,
    /// Input sets the measurements with new tensors every call rotate over (`max(16, --sets)`).
    pub rotating_sets: usize,
    /// Timed as `kernel_us` (events around one `GemmPlan::run` after an L2 flush, alternated
    /// with it), but on the next input set every call: new tensors, so each call patches and
    /// uploads the plan's tables.
    pub harness_new_us: Stats,
    /// Kernel-only time of `GemmPlan::run_stacked`: events around one call on the stacked copy of
    /// set 0 after an L2 flush, same buffers every call, alternated with
    /// `harness_stacked_new_us`.
    pub kernel_stacked_us: Stats,
    /// Timed as `kernel_stacked_us`, but on the next stacked set every call (new tensors).
    pub harness_stacked_new_us: Stats,
    /// Host overhead per call of `GemmPlan::run_stacked`, the stacked sets in turn (new tensors
    /// every call).
    pub host_stacked_new_us: Stats,
    /// cuBLAS bf16 baseline, kernel-only.
    pub cublas_us: Option<Stats>,
    /// The baseline's own comparison with the (bf16-rounded) reference, or why it did not run.
    pub cublas_note: String,
    /// bytes / copy bandwidth.
    pub floor_bytes_us: f64,
    /// FLOPs / tensor rate (`None` without cuBLAS).
    pub floor_flops_us: Option<f64>,
    /// W4A16 on the same shape (`--w4a16`): f16, then bf16 activations times prepacked NVFP4
    /// weights.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub w4a16: Vec<W4a16Result>,
}

/// W4A16 on one shape (`--w4a16`): the checked input set's A with its block scales applied as
/// 16-bit activations (exact), its B prepacked for them (`nvfp4_gemm::w4a16`), through a
/// `GemmPlan` of a W4A16 problem.
#[derive(Debug, Clone, Serialize)]
pub struct W4a16Result {
    /// The activations' type: `f16` or `bf16`.
    pub activations: String,
    /// The kernel.
    pub kernel: String,
    /// Against the same CPU reference as the W4A4 row; `None` when skipped.
    pub check: Option<String>,
    /// Kernel-only time (one launch: no dequantization), same activations and C every call,
    /// alternated with `harness_new_us`.
    pub kernel_us: Stats,
    /// Timed as `kernel_us`, but on the next of the row's `rotating_sets` sets of activations and
    /// C every call (the weights fixed): the plan's tables hold the activations' addresses, so
    /// each call uploads them.
    pub harness_new_us: Stats,
    /// Host overhead per call, same activations and C.
    pub host_cached_us: Stats,
    /// Host overhead per call, the sets of activations and C in turn.
    pub host_rotating_us: Stats,
    /// Bytes / copy rate: 16-bit activations, NVFP4 weights (values and blocked scales), C.
    pub floor_bytes_us: f64,
}

impl ShapeResult {
    /// TB/s over the NVFP4 bytes, kernel-only.
    pub fn tb_s(&self) -> f64 {
        self.bytes / (self.kernel_us.median * 1e-6) / 1e12
    }

    /// TFLOP/s, kernel-only.
    pub fn tflops(&self) -> f64 {
        self.flops / (self.kernel_us.median * 1e-6) / 1e12
    }

    /// cuBLAS time over kernel-only time.
    pub fn x_cublas(&self) -> Option<f64> {
        self.cublas_us.map(|c| c.median / self.kernel_us.median)
    }

    /// The larger of the two floors.
    pub fn floor_us(&self) -> f64 {
        self.floor_flops_us.map_or(self.floor_bytes_us, |f| f.max(self.floor_bytes_us))
    }

    /// Floor over kernel-only time, in percent.
    pub fn pct_floor(&self) -> f64 {
        100.0 * self.floor_us() / self.kernel_us.median
    }
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// `nvfp4-bench <version>`.
    pub tool: String,
    /// Seconds since the Unix epoch at the end of the run.
    pub unix_time: u64,
    /// Device and ceilings.
    pub environment: Environment,
    /// The options used.
    pub options: crate::options::Options,
    /// One entry per problem.
    pub shapes: Vec<ShapeResult>,
    /// The MoE rows (only with `--moe`; absent from the JSON otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe: Option<crate::moe::MoeReport>,
    /// The W4A16 prepack rows (only with `--prepack` or `--prepack-shape`; absent from the JSON
    /// otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub prepack: Vec<crate::prepack::PrepackResult>,
    /// The expert-block rows (only with `--block` and its options; absent from the JSON
    /// otherwise).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block: Option<crate::block::BlockReport>,
}

impl Report {
    /// All checks passed (or were skipped).
    pub fn passed(&self) -> bool {
        self.shapes.iter().all(|s| s.check_passed)
            && self.moe.as_ref().is_none_or(|m| m.shapes.iter().all(|s| s.check_passed))
            && self.prepack.iter().all(|p| p.check_passed)
            && self.block.as_ref().is_none_or(crate::block::BlockReport::passed)
    }
}

fn opt(v: Option<f64>, prec: usize) -> String {
    v.map_or_else(|| "n/a".to_owned(), |x| format!("{x:.prec$}"))
}

/// The text table (`nvfp4-bench --help` explains the columns), with a header block.
pub fn table(report: &Report) -> String {
    let env = &report.environment;
    let mut out = String::new();
    let _ = writeln!(out, "device: {}", env.device);
    let _ = writeln!(
        out,
        "ceilings: copy {:.2} TB/s (read+write, {} MiB), bf16 tensor {} TFLOP/s; cuBLAS {}",
        env.copy_tb_s,
        env.copy_bytes >> 20,
        opt(env.tensor_tflops, 0),
        env.cublas
    );
    match crate::ceiling::headline(&env.tma) {
        Some(line) => {
            let _ = writeln!(out, "{line}");
        }
        None => {
            let _ = writeln!(out, "TMA ceilings: {}", env.tma_note);
        }
    }
    for t in env.tma.iter().skip(1) {
        let _ = writeln!(out, "  TMA {}→SM {:.2} TB/s ({})", t.source.name(), t.tb_s, t.describe());
    }
    let flush = match report.options.flush {
        crate::options::Flush::Write => "write (memset: the L2 left full of dirty lines)",
        crate::options::Flush::Read => "read (TMA loads: the L2 left with clean lines)",
    };
    let _ = writeln!(out, "L2 flush before each timed sample: {} MiB, {flush}", report.options.flush_bytes >> 20);
    let header = [
        "shape",
        "check",
        "comp_us",
        "kernel_us",
        "TB/s",
        "TFLOP/s",
        "cublas_us",
        "x_cublas",
        "floor_us",
        "%floor",
        "host_us",
        "stk_us",
    ];
    let rows: Vec<[String; 12]> = report
        .shapes
        .iter()
        .map(|s| {
            [
                s.name.clone(),
                match (&s.check, s.check_passed) {
                    (None, _) => "skip".into(),
                    (Some(_), true) => "PASS".into(),
                    (Some(_), false) => "FAIL".into(),
                },
                format!("{:.2}", s.competition_us.median),
                format!("{:.2}", s.kernel_us.median),
                format!("{:.3}", s.tb_s()),
                format!("{:.1}", s.tflops()),
                opt(s.cublas_us.map(|c| c.median), 2),
                opt(s.x_cublas(), 2),
                format!("{:.2}", s.floor_us()),
                format!("{:.0}%", s.pct_floor()),
                format!("{:.2}", s.host_cached_us.median),
                format!("{:.2}", s.host_stacked_us.median),
            ]
        })
        .collect();
    if !rows.is_empty() {
        out += &aligned(&header, &rows);
    }
    for s in &report.shapes {
        let _ = writeln!(
            out,
            "{}: {} | host overhead per call: {:.2} us cached, {:.2} us rotating, {:.2} us stacked, {:.2} us stacked rotating | floors: bytes {:.2} us, flops {} us",
            s.name,
            s.spec,
            s.host_cached_us.median,
            s.host_rotating_us.median,
            s.host_stacked_us.median,
            s.host_stacked_new_us.median,
            s.floor_bytes_us,
            opt(s.floor_flops_us, 2)
        );
    }
    for s in &report.shapes {
        for w in &s.w4a16 {
            let _ = writeln!(
                out,
                "{} w4a16 ({} activations): {} kernel {:.2} us ({:.3} x W4A4 kernel-only), {:.0}% of its byte floor ({:.2} us) | {}",
                s.name,
                w.activations,
                w.kernel,
                w.kernel_us.median,
                w.kernel_us.median / s.kernel_us.median,
                100.0 * w.floor_bytes_us / w.kernel_us.median,
                w.floor_bytes_us,
                w.check.as_deref().unwrap_or("check skipped")
            );
        }
    }
    if !report.shapes.is_empty() {
        out.push('\n');
        out += &new_tensor_table(report);
    }
    if let Some(moe) = &report.moe {
        if !report.shapes.is_empty() {
            out.push('\n');
        }
        out += &crate::moe::table(moe);
    }
    if !report.prepack.is_empty() {
        if !report.shapes.is_empty() || report.moe.is_some() {
            out.push('\n');
        }
        out += &crate::prepack::table(&report.prepack, env);
    }
    if let Some(block) = &report.block {
        if !report.shapes.is_empty() || report.moe.is_some() || !report.prepack.is_empty() {
            out.push('\n');
        }
        out += &crate::block::table(block);
    }
    out
}

/// Median over median, three decimals.
fn ratio(a: &Stats, b: &Stats) -> String {
    format!("{:.3}", a.median / b.median)
}

/// The table of calls with new tensors every call (bench/README.md, "New tensors every call"): a
/// row per shape and call (`run`, `run_stacked`, each W4A16 type), its kernel-only time, the
/// same call timed with new tensors every call, their ratio, and the host time per call with
/// the same and with new tensors.
fn new_tensor_table(report: &Report) -> String {
    let header = ["shape", "call", "kernel_us", "new_us", "new/kernel", "host_us", "host_new_us"];
    let row = |shape: &str, call: String, kernel: &Stats, new: &Stats, host: &Stats, host_new: &Stats| {
        [
            shape.to_owned(),
            call,
            format!("{:.2}", kernel.median),
            format!("{:.2}", new.median),
            ratio(new, kernel),
            format!("{:.2}", host.median),
            format!("{:.2}", host_new.median),
        ]
    };
    let mut rows = vec![];
    for s in &report.shapes {
        rows.push(row(&s.name, "run".into(), &s.kernel_us, &s.harness_new_us, &s.host_cached_us, &s.host_rotating_us));
        rows.push(row(
            &s.name,
            "run_stacked".into(),
            &s.kernel_stacked_us,
            &s.harness_stacked_new_us,
            &s.host_stacked_us,
            &s.host_stacked_new_us,
        ));
        for w in &s.w4a16 {
            let call = format!("w4a16 {}", w.activations);
            rows.push(row(&s.name, call, &w.kernel_us, &w.harness_new_us, &w.host_cached_us, &w.host_rotating_us));
        }
    }
    let sets = report.shapes.first().map_or(report.options.rotating_sets(), |s| s.rotating_sets);
    let mut out = format!(
        "new tensors every call ({sets} input sets in turn): new_us timed as kernel_us (events around one call after an L2 flush, median), host_us / host_new_us = host time per call, same / new tensors\n"
    );
    out += &aligned_left(&header, &rows, 2);
    out
}

/// A text table: the first column left-aligned, the others right-aligned, two spaces apart.
pub(crate) fn aligned<R: AsRef<[String]>>(header: &[&str], rows: &[R]) -> String {
    aligned_left(header, rows, 1)
}

/// A text table: the first `left` columns left-aligned, the others right-aligned, two spaces
/// apart.
pub(crate) fn aligned_left<R: AsRef<[String]>>(header: &[&str], rows: &[R], left: usize) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r.as_ref()) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, (c, w)) in cells.zip(&widths).enumerate() {
            let gap = if i == 0 { "" } else { "  " };
            if i < left {
                let _ = write!(l, "{gap}{c:<w$}");
            } else {
                let _ = write!(l, "{gap}{c:>w$}");
            }
        }
        l
    };
    let mut out = String::new();
    let _ = writeln!(out, "{}", line(&mut header.iter().copied()));
    for r in rows {
        let _ = writeln!(out, "{}", line(&mut r.as_ref().iter().map(String::as_str)));
    }
    out
}

/// The files a run writes into `out`, named by what the report holds, so that runs of different
/// kinds into one folder (the default set, then the MoE rows alone, as `cargo xtask bench` prints
/// them) keep each other's results: `nvfp4-bench.json` and `nvfp4-bench.svg` with shapes,
/// `nvfp4-bench-moe.json` with MoE rows (and no shapes), `nvfp4-bench-prepack.json` with prepack
/// rows (and neither of those), `nvfp4-bench-block.json` and `nvfp4-bench-block.svg` with block
/// rows only,
/// `nvfp4-bench-ceilings.json` with none of them.
pub fn output_paths(report: &Report, out: &Path) -> (std::path::PathBuf, Option<std::path::PathBuf>) {
    if !report.shapes.is_empty() {
        (out.join("nvfp4-bench.json"), Some(out.join("nvfp4-bench.svg")))
    } else if report.moe.is_some() {
        (out.join("nvfp4-bench-moe.json"), None)
    } else if !report.prepack.is_empty() {
        (out.join("nvfp4-bench-prepack.json"), None)
    } else if report.block.is_some() {
        (out.join("nvfp4-bench-block.json"), Some(out.join("nvfp4-bench-block.svg")))
    } else {
        (out.join("nvfp4-bench-ceilings.json"), None)
    }
}

/// Writes the report as pretty JSON.
pub fn write_json(report: &Report, path: &Path) -> Result<(), String> {
    let text = serde_json::to_string_pretty(report).map_err(|e| format!("encoding the JSON: {e}"))?;
    std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))
}

/// One plotted quantity of a shape (`None`: not measured).
type SeriesValue = fn(&ShapeResult) -> Option<f64>;

/// Draws the table as grouped bars (log-scale µs per shape: competition, kernel-only, cuBLAS,
/// floor) into an SVG file; a report of block rows only gets [`write_block_svg`]'s figure.
pub fn write_svg(report: &Report, path: &Path) -> Result<(), String> {
    if report.shapes.is_empty() {
        let json = serde_json::to_value(report).map_err(|e| format!("encoding the report: {e}"))?;
        return write_block_svg(&json, path);
    }
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    let shapes = &report.shapes;
    let competition = format!("competition ({} sets, per call)", report.options.sets);
    let series: [(&str, RGBColor, SeriesValue); 4] = [
        (&competition, RGBColor(31, 119, 180), |s| Some(s.competition_us.median)),
        ("kernel-only", RGBColor(44, 160, 44), |s| Some(s.kernel_us.median)),
        ("cuBLAS bf16 (dequantized)", RGBColor(214, 39, 40), |s| s.cublas_us.map(|c| c.median)),
        ("floor", RGBColor(127, 127, 127), |s| Some(s.floor_us())),
    ];
    let values: Vec<f64> = shapes.iter().flat_map(|s| series.iter().filter_map(move |(_, _, f)| f(s))).collect();
    let max = values.iter().cloned().fold(1.0f64, f64::max);
    let min = values.iter().cloned().fold(max, f64::min);
    let (y0, y1) = ((min * 0.5).max(0.01), max * 2.0);
    let width = (220 * shapes.len().max(1) + 200).max(800) as u32;
    let root = SVGBackend::new(path, (width, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let title = format!("NVFP4 grouped GEMM, {} — time per call (µs, log scale)", report.environment.device);
    let n = shapes.len() as f64;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 18))
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(64)
        .build_cartesian_2d(-0.5f64..(n - 0.5), (y0..y1).log_scale())
        .map_err(|x| e(&x))?;
    let names: Vec<String> = shapes.iter().map(|s| s.name.clone()).collect();
    let label = move |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 1e-6 && i >= 0.0 && (i as usize) < names.len() {
            names[i as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_labels(shapes.len().max(1))
        .x_label_formatter(&label)
        .y_desc("µs")
        .draw()
        .map_err(|x| e(&x))?;
    let bar = 0.8 / series.len() as f64;
    for (j, (name, color, value)) in series.iter().enumerate() {
        let color = *color;
        let bars: Vec<(f64, f64)> = shapes
            .iter()
            .enumerate()
            .filter_map(|(i, s)| value(s).map(|v| (i as f64 - 0.4 + j as f64 * bar, v)))
            .collect();
        chart
            .draw_series(
                bars.iter().map(|&(x, v)| Rectangle::new([(x + 0.01, y0), (x + bar - 0.01, v)], color.filled())),
            )
            .map_err(|x| e(&x))?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                Text::new(format!("{v:.1}"), (x, v * 1.08), ("sans-serif", 11).into_font().color(&BLACK))
            }))
            .map_err(|x| e(&x))?;
    }
    draw_legend(&mut chart, SeriesLabelPosition::UpperRight).map_err(|x| e(&x))?;
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

/// The series' legend of a chart, boxed, at `position`.
fn draw_legend<'a, DB, CT>(
    chart: &mut plotters::chart::ChartContext<'a, DB, CT>,
    position: plotters::chart::SeriesLabelPosition,
) -> Result<(), plotters::drawing::DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: plotters::prelude::DrawingBackend + 'a,
    CT: plotters::coord::CoordTranslate,
{
    use plotters::prelude::*;
    chart.configure_series_labels().position(position).background_style(WHITE.mix(0.85)).border_style(BLACK).draw()
}

/// One layer's curves of a block report: per precision, (T, µs) of the graph replays, and the
/// floor's (T, µs).
#[derive(Debug)]
struct BlockCurves {
    layer: String,
    /// The panel's caption: the layer and its model.
    caption: String,
    precisions: Vec<(String, Vec<(f64, f64)>)>,
    floor: Vec<(f64, f64)>,
}

/// The block rows of a bench JSON (`nvfp4-bench-block.json`, or a report's JSON), per layer in
/// the order they ran.
fn block_curves(json: &serde_json::Value) -> Result<Vec<BlockCurves>, String> {
    let runs = json["block"]["runs"].as_array().ok_or("the JSON has no block rows (`block.runs`)")?;
    let mut layers: Vec<BlockCurves> = vec![];
    for run in runs {
        let layer = run["layer"]["name"].as_str().ok_or("a block run without `layer.name`")?;
        let precision = run["precision"].as_str().ok_or("a block run without `precision`")?;
        let mut points = vec![];
        let mut floor = vec![];
        for row in run["rows"].as_array().ok_or("a block run without `rows`")? {
            let t = row["tokens"].as_f64().ok_or("a block row without `tokens`")?;
            let us = row["graph_us"]["median"].as_f64().ok_or("a block row without `graph_us.median`")?;
            points.push((t, us));
            if let Some(f) = row["floor_us"].as_f64() {
                floor.push((t, f));
            }
        }
        match layers.iter_mut().find(|l| l.layer == layer) {
            Some(l) => l.precisions.push((precision.into(), points)),
            None => {
                let caption = match run["layer"]["model"].as_str() {
                    Some(model) => format!("{layer} ({model})"),
                    None => layer.into(),
                };
                layers.push(BlockCurves {
                    layer: layer.into(),
                    caption,
                    precisions: vec![(precision.into(), points)],
                    floor,
                })
            }
        }
    }
    if layers.is_empty() {
        return Err("the JSON's block rows are empty".into());
    }
    Ok(layers)
}

/// Draws the block rows of a bench JSON into an SVG file: a panel per layer, the graph replay's µs
/// against the tokens `T` (both log scales) per precision, and the byte floor of the experts each
/// row touched.
pub fn write_block_svg(json: &serde_json::Value, path: &Path) -> Result<(), String> {
    use plotters::prelude::*;
    let e = |e: &dyn std::fmt::Display| format!("drawing {}: {e}", path.display());
    let layers = block_curves(json)?;
    let device = json["environment"]["device"].as_str().unwrap_or("GPU");
    let colors = [RGBColor(31, 119, 180), RGBColor(255, 127, 14), RGBColor(44, 160, 44), RGBColor(148, 103, 189)];
    let width = 420 * layers.len() as u32;
    let root = SVGBackend::new(path, (width, 460)).into_drawing_area();
    root.fill(&WHITE).map_err(|x| e(&x))?;
    let root = root
        .titled(
            &format!("MoE expert block, {device} — graph replay µs per call against T (log scales)"),
            ("sans-serif", 18),
        )
        .map_err(|x| e(&x))?;
    for (panel, curves) in root.split_evenly((1, layers.len())).iter().zip(&layers) {
        let all = curves.precisions.iter().flat_map(|(_, p)| p).chain(&curves.floor);
        let (mut t1, mut y0, mut y1) = (1.0f64, f64::MAX, 1.0f64);
        for &(t, us) in all {
            t1 = t1.max(t);
            y0 = y0.min(us);
            y1 = y1.max(us);
        }
        let mut chart = ChartBuilder::on(panel)
            .caption(&curves.caption, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .build_cartesian_2d((0.7f64..t1 * 1.4).log_scale(), ((y0 * 0.7).max(0.01)..y1 * 1.4).log_scale())
            .map_err(|x| e(&x))?;
        chart.configure_mesh().x_desc("T (tokens)").y_desc("µs").draw().map_err(|x| e(&x))?;
        for (i, (name, points)) in curves.precisions.iter().enumerate() {
            let color = colors[i % colors.len()];
            chart
                .draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(2)).point_size(3))
                .map_err(|x| e(&x))?
                .label(name.as_str())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], color.stroke_width(2)));
        }
        let grey = RGBColor(127, 127, 127);
        chart
            .draw_series(LineSeries::new(curves.floor.iter().copied(), grey.stroke_width(1)))
            .map_err(|x| e(&x))?
            .label("byte floor")
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 14, y)], grey.stroke_width(1)));
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(|x| e(&x))?;
    }
    root.present().map_err(|x| e(&x))?;
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn stats(x: f64) -> Stats {
        Stats { median: x, min: x, max: x, mean: x, n: 1 }
    }

    pub(crate) fn sample() -> Report {
        let shape = |name: &str, kernel: f64, cublas: Option<f64>| ShapeResult {
            name: name.into(),
            spec: "g=2,m=128:384,n=4096,k=1536".into(),
            groups: 2,
            flops: 2.0 * 512.0 * 4096.0 * 1536.0,
            bytes: 4.5e6,
            kernel: "sm90".into(),
            check: Some("PASS: 0/2097152".into()),
            check_passed: true,
            competition_us: stats(kernel + 3.0),
            kernel_us: stats(kernel),
            host_cached_us: stats(4.0),
            host_rotating_us: stats(9.0),
            host_stacked_us: stats(2.0),
            rotating_sets: 16,
            harness_new_us: stats(kernel * 1.02),
            kernel_stacked_us: stats(kernel),
            harness_stacked_new_us: stats(kernel * 1.04),
            host_stacked_new_us: stats(3.0),
            cublas_us: cublas.map(stats),
            cublas_note: "PASS".into(),
            floor_bytes_us: 1.0,
            floor_flops_us: cublas.map(|_| 8.0),
            w4a16: vec![],
        };
        Report {
            tool: "nvfp4-bench test".into(),
            unix_time: 0,
            environment: Environment {
                device: "Test GPU (sm_90a, 132 SMs)".into(),
                copy_tb_s: 4.3,
                copy_bytes: 1 << 30,
                tensor_tflops: Some(780.0),
                cublas: "loaded".into(),
                flush_bytes: 256 << 20,
                tma: crate::ceiling::tests::sample(),
                tma_note: "measured".into(),
            },
            options: crate::options::Options::default(),
            shapes: vec![shape("b0", 16.0, Some(20.0)), shape("custom", 10.0, None)],
            moe: None,
            prepack: vec![],
            block: None,
        }
    }

    /// A default run, a MoE-only run and a ceilings-only run into one folder write three
    /// different files (the default run's JSON and SVG survive the other two).
    #[test]
    fn output_files_are_named_by_content() {
        let out = Path::new("results");
        let default = sample();
        let moe_only = Report {
            shapes: vec![],
            moe: Some(crate::moe::MoeReport {
                seed: 1,
                torch: crate::moe::TorchBaseline { json: None, note: "off".into() },
                shapes: vec![],
            }),
            ..sample()
        };
        let ceilings = Report { shapes: vec![], moe: None, ..sample() };
        let prepack_only = Report { prepack: crate::prepack::tests::rows(), ..ceilings.clone() };
        let name = |r: &Report| {
            let (json, svg) = output_paths(r, out);
            (json.display().to_string(), svg.map(|p| p.display().to_string()))
        };
        assert_eq!(name(&default), ("results/nvfp4-bench.json".into(), Some("results/nvfp4-bench.svg".into())));
        assert_eq!(name(&moe_only), ("results/nvfp4-bench-moe.json".into(), None));
        assert_eq!(name(&ceilings), ("results/nvfp4-bench-ceilings.json".into(), None));
        assert_eq!(name(&prepack_only), ("results/nvfp4-bench-prepack.json".into(), None));
        let block_only = Report { block: Some(crate::block::tests::sample()), ..ceilings.clone() };
        assert_eq!(
            name(&block_only),
            ("results/nvfp4-bench-block.json".into(), Some("results/nvfp4-bench-block.svg".into()))
        );
        // Its SVG is the block figure.
        let dir = std::env::temp_dir().join(format!("nvfp4-bench-block-only-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_svg(&block_only, &dir.join("b.svg")).unwrap();
        assert!(std::fs::read_to_string(dir.join("b.svg")).unwrap().contains("byte floor"));
        let _ = std::fs::remove_dir_all(dir);
        // The block table after the others, in the JSON, and its failed check fails the run.
        let text = table(&Report { block: Some(crate::block::tests::sample()), ..sample() });
        assert!(text.contains("\n\nMoE expert block (ExpertBlock::run"), "{text}");
        assert!(!block_only.passed() && default.passed());
        let v = serde_json::to_value(&block_only).unwrap();
        assert_eq!(v["block"]["runs"][0]["layer"]["model"], "Qwen3-30B-A3B");
        assert!(serde_json::to_value(&default).unwrap().get("block").is_none());
    }

    #[test]
    fn derived_numbers() {
        let r = sample();
        let s = &r.shapes[0];
        assert!((s.tflops() - s.flops / 16e-6 / 1e12).abs() < 1e-9);
        assert!((s.tb_s() - 4.5e6 / 16e-6 / 1e12).abs() < 1e-12);
        assert_eq!(s.x_cublas(), Some(1.25));
        assert_eq!(s.floor_us(), 8.0);
        assert_eq!(s.pct_floor(), 50.0);
        assert_eq!(r.shapes[1].floor_us(), 1.0);
        assert!(r.passed());
    }

    #[test]
    fn table_has_one_aligned_row_per_shape() {
        let text = table(&sample());
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("device: Test GPU"));
        assert!(lines[1].starts_with("ceilings: copy 4.30 TB/s"));
        assert!(lines[2].starts_with("TMA L2→SM 7.50 TB/s (f16 64x128 sw128, 6 stages x 2 boxes"));
        assert!(lines[2].ends_with("TMA DRAM→SM 3.90 TB/s"));
        assert_eq!(lines[3], "  TMA L2→SM 5.00 TB/s (u8 64x128 sw64, 6 stages x 1 box = 48 KiB in flight per SM)");
        assert!(lines[4].starts_with("  TMA DRAM→SM 3.90 TB/s (f16"));
        assert_eq!(
            lines[5],
            "L2 flush before each timed sample: 256 MiB, write (memset: the L2 left full of dirty lines)"
        );
        let lines = &lines[6..];
        assert!(lines[0].starts_with("shape") && lines[0].contains("x_cublas"));
        assert!(lines[1].starts_with("b0 ") && lines[1].contains("1.25") && lines[1].contains("50%"));
        assert!(lines[2].starts_with("custom") && lines[2].contains("n/a"));
        assert_eq!(lines[0].len(), lines[1].len());
        assert_eq!(lines[1].len(), lines[2].len());
        // Without the TMA ceilings: why, on the line after the others.
        let mut r = sample();
        r.environment.tma.clear();
        r.environment.tma_note = "unavailable: test".into();
        assert_eq!(table(&r).lines().nth(2), Some("TMA ceilings: unavailable: test"));
    }

    #[test]
    fn new_tensor_table_has_a_row_per_call() {
        let mut r = sample();
        r.shapes[0].w4a16 = vec![W4a16Result {
            activations: "bf16".into(),
            kernel: "w".into(),
            check: None,
            kernel_us: stats(20.0),
            harness_new_us: stats(21.0),
            host_cached_us: stats(1.5),
            host_rotating_us: stats(3.25),
            floor_bytes_us: 1.0,
        }];
        let text = table(&r);
        let lines: Vec<&str> = text.lines().skip_while(|l| !l.starts_with("new tensors every call")).collect();
        assert!(lines[0].starts_with("new tensors every call (16 input sets in turn)"), "{text}");
        assert!(lines[1].starts_with("shape") && lines[1].ends_with("new/kernel  host_us  host_new_us"));
        let cells = |l: &str| l.split_whitespace().map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(cells(lines[2]), ["b0", "run", "16.00", "16.32", "1.020", "4.00", "9.00"]);
        assert_eq!(cells(lines[3]), ["b0", "run_stacked", "16.00", "16.64", "1.040", "2.00", "3.00"]);
        assert_eq!(cells(lines[4]), ["b0", "w4a16", "bf16", "20.00", "21.00", "1.050", "1.50", "3.25"]);
        assert!(lines[5].starts_with("custom") && lines[6].starts_with("custom") && lines.len() == 7);
        assert!(lines[1..].iter().all(|l| l.len() == lines[1].len()));
        let v = serde_json::to_value(&r).unwrap();
        let s = &v["shapes"][0];
        assert_eq!(s["rotating_sets"], 16);
        for (key, median) in [
            ("harness_new_us", 16.32),
            ("kernel_stacked_us", 16.0),
            ("harness_stacked_new_us", 16.64),
            ("host_stacked_new_us", 3.0),
            ("host_rotating_us", 9.0),
        ] {
            assert_eq!(s[key]["median"], median, "{key}");
        }
        let w = &s["w4a16"][0];
        assert_eq!((&w["harness_new_us"]["median"], &w["host_cached_us"]["median"]), (&21.0.into(), &1.5.into()));
        assert_eq!(w["host_rotating_us"]["median"], 3.25);
    }

    #[test]
    fn json_and_svg_files() {
        let dir = std::env::temp_dir().join(format!("nvfp4-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let r = sample();
        write_json(&r, &dir.join("r.json")).unwrap();
        let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(dir.join("r.json")).unwrap()).unwrap();
        assert_eq!(v["shapes"][0]["kernel_us"]["median"], 16.0);
        assert_eq!(v["shapes"][1]["cublas_us"], serde_json::Value::Null);
        assert_eq!(v["environment"]["copy_tb_s"], 4.3);
        assert_eq!(v["environment"]["tma"][0]["source"], "L2");
        assert_eq!(v["environment"]["tma"][0]["tb_s"], 7.5);
        assert_eq!(v["environment"]["tma"][2]["boxes_per_stage"], 2);
        write_svg(&r, &dir.join("r.svg")).unwrap();
        let svg = std::fs::read_to_string(dir.join("r.svg")).unwrap();
        assert!(svg.starts_with("<svg") && svg.contains("b0") && svg.contains("custom") && svg.contains("kernel-only"));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The block figure from a block JSON: a panel per layer, a curve per precision and the
    /// floor; a JSON without block rows is refused.
    #[test]
    fn block_svg() {
        let row = |t: u64, us: f64| serde_json::json!({"tokens": t, "graph_us": {"median": us}, "floor_us": us / 2.0});
        let run = |layer: &str, precision: &str| serde_json::json!({"layer": {"name": layer}, "precision": precision, "rows": [row(1, 60.0), row(64, 200.0), row(4096, 900.0)]});
        let json = serde_json::json!({
            "environment": {"device": "Test GPU"},
            "block": {"runs": [run("qwen3", "w4a4"), run("qwen3", "w4a16"), run("mixtral", "w4a4")]}
        });
        let curves = block_curves(&json).unwrap();
        assert_eq!(curves.len(), 2);
        assert_eq!((curves[0].layer.as_str(), curves[0].precisions.len(), curves[0].floor.len()), ("qwen3", 2, 3));
        assert_eq!(curves[0].precisions[1].1[1], (64.0, 200.0));
        let dir = std::env::temp_dir().join(format!("nvfp4-bench-block-svg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        write_block_svg(&json, &dir.join("b.svg")).unwrap();
        let svg = std::fs::read_to_string(dir.join("b.svg")).unwrap();
        assert!(
            svg.starts_with("<svg") && svg.contains("mixtral") && svg.contains("w4a16") && svg.contains("byte floor")
        );
        let _ = std::fs::remove_dir_all(dir);
        assert!(block_curves(&serde_json::json!({"shapes": []})).unwrap_err().contains("no block rows"));
    }
}
