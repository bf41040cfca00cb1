//! The library in a mixture-of-experts layer: the activations (bf16) and the router's per-expert
//! token offsets are on the GPU; each step quantizes the activations to NVFP4 on the GPU and runs
//! the grouped GEMM with the group sizes read on the device, captured once in a CUDA graph and
//! replayed for every new routing (no host synchronisation inside a step). Each replay is checked
//! against the CPU quantizer and the fp64 reference, and timed.
//!
//! Run: `cargo run --release --example moe_layer` (sm_90a or sm_100a; the sm_100a path has only run in
//! the CPU model of the device, `model-tests/`; without a GPU it says why it does nothing).

use cudarc::driver::sys::{CUevent_flags, CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaSlice, CudaStream};
use half::bf16;
use nvfp4_gemm::format::codec::f64_to_bf16;
use nvfp4_gemm::format::{
    quantize_with_global_scale, random_matrix, reference_grouped_gemm_f64, Group, InputDistribution, Nvfp4Matrix,
    SplitMix64,
};
use nvfp4_gemm::moe::{MoeArgs, MoePlan, MoeProblem, TokenLayout};
use nvfp4_gemm::quantize::Quantizer;
use nvfp4_gemm::{DeviceNvfp4, Gpu, Nvfp4Operand, Output, OutputType};
use std::sync::Arc;

/// The activations' global scale (they are about N(0, 1)).
const G_X: f32 = 1.0 / 256.0;

/// One layer's device buffers, allocated once.
struct LayerBuffers {
    /// Sorted activations `[max_tokens, K]`, written by the previous layer.
    x: CudaSlice<bf16>,
    /// `offsets[experts + 1]`, written by the router.
    offsets: CudaSlice<u32>,
    /// The NVFP4 tokens.
    a: DeviceNvfp4,
    /// `[max_tokens, N]`.
    c: CudaSlice<bf16>,
}

/// The layer: quantize, then the grouped GEMM. Launches only; captured as it is.
fn moe_layer(
    stream: &Arc<CudaStream>,
    quantizer: &Quantizer,
    plan: &mut MoePlan,
    bufs: &mut LayerBuffers,
    weights: &[Nvfp4Operand<'_>],
    alphas: &[f32],
) -> nvfp4_gemm::Result<()> {
    let problem = plan.problem().clone();
    quantizer.quantize_grouped(stream, &bufs.x, &problem, &bufs.offsets, G_X, bufs.a.operand_mut())?;
    let mut args =
        MoeArgs { sizes: &bufs.offsets, a: bufs.a.operand().into(), weights, alphas, c: Output::Bf16(&mut bufs.c) };
    plan.run(stream, &mut args)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            println!("No GPU run: {e}.");
            return Ok(());
        }
    };
    // Graph capture needs a stream of its own, and no waits on events recorded outside the
    // capture: one stream, no cross-stream event tracking.
    // SAFETY: every buffer below is used on `stream` only.
    unsafe { gpu.context().disable_event_tracking() };
    let stream = gpu.context().new_stream()?;
    let (experts, n, k, max_tokens) = (32usize, 512usize, 1024usize, 256usize);
    let problem = MoeProblem::new(experts, n, k, TokenLayout::Contiguous { max_tokens }, OutputType::Bf16)?;
    let quantizer = Quantizer::new(&gpu)?;
    let mut plan = MoePlan::new(&gpu, problem.clone())?;
    println!("{}: {} experts, N = {n}, K = {k}, up to {max_tokens} tokens", gpu.name(), experts);

    // The experts' weights (a model loads them once; random here).
    let mut rng = SplitMix64::new(2026);
    let host_w: Vec<Nvfp4Matrix> = (0..experts)
        .map(|_| random_matrix(n, k, InputDistribution::Competition, &mut rng))
        .collect::<Result<_, _>>()?;
    let weights: Vec<DeviceNvfp4> = host_w.iter().map(|w| DeviceNvfp4::upload(&stream, w)).collect::<Result<_, _>>()?;
    let b: Vec<Nvfp4Operand> = weights.iter().map(|w| w.operand()).collect();
    let alphas = vec![G_X; experts]; // g_x · g_w, the weights' global scale being 1

    let mut bufs = LayerBuffers {
        x: stream.alloc_zeros(problem.token_rows() * k)?,
        offsets: stream.alloc_zeros(problem.sizes_len())?,
        a: DeviceNvfp4::alloc_zeros_sized(&stream, problem.a_sizes())?,
        c: stream.alloc_zeros(problem.c_elements())?,
    };

    // One call outside the capture uploads the weights' tables; then capture the layer.
    moe_layer(&stream, &quantizer, &mut plan, &mut bufs, &b, &alphas)?;
    stream.synchronize()?;
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    moe_layer(&stream, &quantizer, &mut plan, &mut bufs, &b, &alphas)?;
    let graph = stream.end_capture(CUgraphInstantiate_flags(0))?.ok_or("the capture made no graph")?;

    for step in 0..5 {
        // This step's router outputs (a model's router kernel writes them on the device).
        let tokens = [max_tokens, 40, 1, max_tokens / 2, 0][step];
        let mut counts = vec![0u32; experts];
        for _ in 0..tokens {
            counts[rng.below(if step == 2 { 1 } else { experts as u64 }) as usize] += 1;
        }
        let mut offsets = vec![0u32];
        for c in &counts {
            offsets.push(offsets[offsets.len() - 1] + c);
        }
        let x: Vec<bf16> = (0..max_tokens * k).map(|_| f64_to_bf16(rng.normal())).collect();
        stream.memcpy_htod(&x, &mut bufs.x)?;
        stream.memcpy_htod(&offsets, &mut bufs.offsets)?;

        let start = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        graph.launch()?;
        let end = stream.record_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let c = stream.clone_dtoh(&bufs.c)?;
        let us = start.elapsed_ms(&end)? as f64 * 1e3;

        // Check each expert's rows: CPU quantizer, fp64 reference.
        let mut worst = 0.0f64;
        for e in 0..experts {
            let (first, m) = (offsets[e] as usize, counts[e] as usize);
            if m == 0 {
                continue;
            }
            let a = quantize_with_global_scale(&x[first * k..(first + m) * k], m, k, G_X)?;
            let reference = reference_grouped_gemm_f64(&[Group::new(a, host_w[e].clone(), 1.0)?])?;
            for (i, r) in reference[0].data.iter().enumerate() {
                let got = c[first * n + i].to_f64();
                worst = worst.max((got - r).abs() / (1.0 + r.abs()));
            }
        }
        let ok = worst < 1e-2;
        let active = counts.iter().filter(|&&c| c > 0).count();
        println!(
            "step {step}: {tokens:>3} tokens over {active:>2} experts: replay {us:7.1} µs, max rel. error {worst:.1e} {}",
            if ok { "ok" } else { "FAIL" }
        );
        if !ok {
            return Err("a replay differs from the CPU reference".into());
        }
    }
    println!("size status: {}", plan.read_status(&stream)?);
    Ok(())
}
