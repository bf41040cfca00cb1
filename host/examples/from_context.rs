//! Using the GEMM inside an application that already owns the GPU: its CUDA context, its stream and
//! its device buffers (candle, mistral.rs, or plain cudarc).
//!
//! - [`Gpu::from_context`] loads this library's kernels into the application's context: no second
//!   context, and the buffers stay where they are.
//! - [`GemmPlan::run`] enqueues on the application's stream and borrows its buffers (any cudarc
//!   `CudaSlice` or view: NVFP4 operands as bytes, C as `f16`/`bf16`); it allocates nothing and
//!   does not synchronize.
//! - The global scales of NVFP4 tensors are not in the bytes: fold them into `alpha`
//!   (`alpha · g_a · g_b`, [`nvfp4_gemm::format::Group::effective_alpha_f32`]).
//!
//! With candle (`cuda` feature): `let stream = device.as_cuda_device()?.cuda_stream();` is the
//! stream, `stream.context()` the context, and a `u8` tensor's `CudaStorage::as_cuda_slice::<u8>()`
//! its bytes (mind the layout's start offset). candle's cudarc links libcuda at build time, so
//! depend on this crate with `default-features = false, features = ["dynamic-linking"]`;
//! `.ci/candle-check/` builds exactly that.
//!
//! Run: `cargo run --release --example from_context` (without a GPU it says why and exits).

use cudarc::driver::{CudaContext, CudaSlice};
use half::f16;
use nvfp4_gemm::format::{compare, random_groups, reference_grouped_gemm, GroupShape, InputDistribution, Tolerance};
use nvfp4_gemm::{driver_present, GemmPlan, Gpu, GroupArgs, Nvfp4Operand, Output, OutputType, Problem};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if !driver_present() {
        println!("No CUDA driver on this machine: nothing to run.");
        return Ok(());
    }
    // The application's context and stream (candle: its device's stream and `stream.context()`).
    let ctx = CudaContext::new(0)?;
    let stream = ctx.new_stream()?;
    let gpu = match Gpu::from_context(ctx.clone()) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("No run: {e}.");
            return Ok(());
        }
    };

    // The application's tensors: NVFP4 operands as raw bytes on the device, C as f16.
    let shapes = vec![GroupShape::new(96, 256, 512), GroupShape::new(40, 136, 320)];
    let groups = random_groups(&shapes, InputDistribution::Competition, 3)?;
    let upload = |b: &[u8]| stream.clone_htod(b);
    let mut operands: Vec<[CudaSlice<u8>; 4]> = vec![];
    for g in &groups {
        operands.push([upload(g.a.values())?, upload(g.a.scales())?, upload(g.b.values())?, upload(g.b.scales())?]);
    }
    let mut cs: Vec<CudaSlice<f16>> = shapes.iter().map(|s| stream.alloc_zeros(s.m * s.n)).collect::<Result<_, _>>()?;

    // Plan once per shape set; run per call on the application's stream.
    let mut plan = GemmPlan::new(&gpu, Problem::new(shapes, OutputType::F16)?)?;
    let mut args: Vec<GroupArgs> = operands
        .iter()
        .zip(cs.iter_mut())
        .zip(&groups)
        .map(|(([av, asc, bv, bsc], c), g)| GroupArgs {
            a: Nvfp4Operand { values: av, scales: asc }.into(),
            b: Nvfp4Operand { values: bv, scales: bsc },
            c: Output::F16(c),
            alpha: g.effective_alpha_f32(),
        })
        .collect();
    plan.run(&stream, &mut args)?;
    drop(args);

    let got: Vec<Vec<f16>> = cs.iter().map(|c| stream.clone_dtoh(c)).collect::<Result<_, _>>()?;
    let cmp = compare(&got, &reference_grouped_gemm(&groups)?, Tolerance::COMPETITION)?;
    println!("{} on {}: {cmp}", if cmp.passed() { "PASS" } else { "FAIL" }, gpu.name());
    if cmp.passed() {
        Ok(())
    } else {
        Err(cmp.to_string().into())
    }
}
