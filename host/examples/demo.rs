//! The main job: the grouped GEMM on the benchmark shapes.
//!
//! On a Hopper (or Blackwell) GPU it runs each benchmark shape, checks every element against the CPU reference
//! (atol = rtol = 1e-3) and prints the median time of 20 launches measured with CUDA events
//! (inputs resident, L2 not flushed: `nvfp4-bench` measures properly). Without a suitable GPU it
//! says why and runs the CPU reference on a small problem instead.
//!
//! Run: `cargo run --release --example demo`

use nvfp4_gemm::format::{compare, random_groups, reference_grouped_gemm, GroupShape, InputDistribution, Tolerance};
use nvfp4_gemm::{DeviceGroup, GemmPlan, Gpu, GroupArgs, Output, OutputType, Problem};
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = match Gpu::new(0) {
        Ok(gpu) => {
            if gpu.arch() == nvfp4_gemm::Arch::Sm100a {
                println!("Note: the sm_100a kernel has only been checked statically; this is its first run.");
            }
            gpu
        }
        Err(e) => {
            println!("No GPU run: {e}.");
            return cpu_only();
        }
    };
    println!("GPU: {} ({}, {} SMs)", gpu.name(), gpu.arch().name(), gpu.sm_count());
    let stream = gpu.context().default_stream();
    use nvfp4_gemm::format::generate::shapes::*;
    println!(
        "{:<4} {:>3} {:>6} {:>6} {:>10} {:>9} {:>8}  check",
        "case", "g", "N", "K", "median µs", "TFLOP/s", "TB/s"
    );
    for (name, shapes) in [("b0", &B0[..]), ("b1", &B1[..]), ("b2", &B2[..]), ("b3", &B3[..])] {
        let groups = random_groups(shapes, InputDistribution::Competition, 7)?;
        let problem = Problem::new(shapes.to_vec(), OutputType::F16)?;
        let (flops, bytes) = (problem.flops(), problem.bytes());
        let mut plan = GemmPlan::new(&gpu, problem)?;
        let dev = groups.iter().map(|g| DeviceGroup::upload(&stream, g)).collect::<Result<Vec<_>, _>>()?;
        let mut cs =
            groups.iter().map(|g| stream.alloc_zeros::<half::f16>(g.m() * g.n())).collect::<Result<Vec<_>, _>>()?;
        let mut times = vec![];
        for it in 0..23 {
            let start = stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            let mut args: Vec<GroupArgs> = dev.iter().zip(cs.iter_mut()).map(|(d, c)| d.args(Output::F16(c))).collect();
            plan.run(&stream, &mut args)?;
            let end = stream.record_event(Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT))?;
            if it >= 3 {
                times.push(start.elapsed_ms(&end)? as f64 * 1e3);
            }
        }
        times.sort_by(f64::total_cmp);
        let us = times[times.len() / 2];
        let got: Vec<Vec<half::f16>> = cs.iter().map(|c| stream.clone_dtoh(c)).collect::<Result<_, _>>()?;
        let cmp = compare(&got, &reference_grouped_gemm(&groups)?, Tolerance::COMPETITION)?;
        println!(
            "{name:<4} {:>3} {:>6} {:>6} {us:>10.1} {:>9.1} {:>8.2}  {}",
            shapes.len(),
            shapes[0].n,
            shapes[0].k,
            flops / us * 1e-6,
            bytes / us * 1e-6,
            if cmp.passed() { "PASS".to_string() } else { cmp.to_string() }
        );
        if !cmp.passed() {
            return Err(format!("{name}: {cmp}").into());
        }
    }
    Ok(())
}

/// Without a GPU: the CPU reference on a small problem (two groups with tails).
fn cpu_only() -> Result<(), Box<dyn std::error::Error>> {
    let shapes = [GroupShape::new(96, 256, 512), GroupShape::new(40, 136, 320)];
    let groups = random_groups(&shapes, InputDistribution::Competition, 7)?;
    let t = Instant::now();
    let out = reference_grouped_gemm(&groups)?;
    println!("CPU reference for {} groups ({:?}) in {:.1} ms:", groups.len(), shapes, t.elapsed().as_secs_f64() * 1e3);
    for (g, o) in out.iter().enumerate() {
        let sum: f64 = o.data.iter().map(|x| x.to_f64()).sum();
        println!("  group {g}: C is {}x{}, C[0][0..4] = {:?}, sum = {sum}", o.rows, o.cols, &o.data[..4]);
    }
    Ok(())
}
