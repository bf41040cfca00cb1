//! Device-resident group sizes on the H200 (`nvfp4_gemm::moe`): bf16 activations quantized on the
//! GPU in the contiguous and masked layouts (`Quantizer::quantize_grouped`) and multiplied by each
//! expert's NVFP4 weights (`MoePlan`), the group sizes read on the device only.
//!
//! Every call is checked against the CPU, with the expected group rows computed on the host from
//! the same sizes (`MoeProblem::group_rows`, which clamps like the device):
//! - the quantized tokens of every group's rows equal `nvfp4_format::quantize_with_global_scale`
//!   of those rows bit for bit (values and each row's block scales at the group's scale offset);
//!   token rows of no group keep their poison;
//! - C (poisoned, with poisoned guard elements before and after) equals, on every group's rows,
//!   the fp64 reference within the competition tolerance (plus the fp32-accumulation allowance of
//!   `nvfp4_gemm_tests::accumulation_allowance`), and bit for bit the host-sized `GemmPlan` on the
//!   same (CPU-quantized) operands; rows of no group and the guards keep their poison;
//! - the plan's status word equals the status bits the host expects (clamped sizes raise them).
//!
//! CUDA graphs: quantization and GEMM are captured once and replayed for many routings (offsets
//! and counts rewritten on the device by a copy captured in the graph, activations rewritten
//! between replays), including empty experts, one expert taking every token and sizes beyond the
//! bounds; every replay is checked as above.
//! Ignored unless asked for: they need an sm_90a GPU (see `nvfp4_gemm_tests`).

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use nvfp4_format::codec::f64_to_bf16;
use nvfp4_format::{
    quantize_with_global_scale, random_matrix, Group, GroupShape, InputDistribution, Nvfp4Matrix, SplitMix64,
};
use nvfp4_gemm::moe::{MoeArgs, MoeKernels, MoeOptions, MoePlan, MoeProblem, SizeStatus, TokenLayout};
use nvfp4_gemm::quantize::Quantizer;
use nvfp4_gemm::{Arch, DeviceNvfp4, Error, GemmPlan, Gpu, GroupArgs, Output, OutputType, Problem};
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};
use nvfp4_gemm_tests::moe::{
    capture, check_bounds, check_groups, contiguous_routings, for_routings, masked_routings, offsets_of,
    random_offsets, unowned_rows, with_capture_stream, Failures,
};
use nvfp4_gemm_tests::{gpu_or_skip, GUARD, POISON};
use std::sync::Arc;

/// The whole expert block (`nvfp4_gemm::moe_block::ExpertBlock`) against the fp64 reference.
#[path = "gpu_moe_sm90/block.rs"]
mod block;

/// Byte written over the quantized tokens before each call: rows of no group must keep it.
const A_POISON: u8 = 0xA5;
/// Global scale of the activations (they are about N(0, 1), amax well below 6 · 448 · g).
const G_X: f32 = 1.0 / 256.0;

/// One MoE layer: the problem, each expert's NVFP4 weights on the host and the device, alphas.
struct Layer {
    problem: MoeProblem,
    weights: Vec<Nvfp4Matrix>,
    dev_weights: Vec<DeviceNvfp4>,
    alphas: Vec<f32>,
}

impl Layer {
    fn new(stream: &Arc<CudaStream>, problem: MoeProblem, seed: u64) -> Layer {
        let mut rng = SplitMix64::new(seed);
        let weights: Vec<Nvfp4Matrix> = (0..problem.groups())
            .map(|_| random_matrix(problem.n(), problem.k(), InputDistribution::Competition, &mut rng).unwrap())
            .collect();
        let dev_weights = weights.iter().map(|w| DeviceNvfp4::upload(stream, w).unwrap()).collect();
        // The reference's effective alpha: 1 · g_x · g_w (the weights' global scale is 1).
        let alphas = weights.iter().map(|w| (G_X as f64 * w.global_scale() as f64) as f32).collect();
        Layer { problem, weights, dev_weights, alphas }
    }
}

/// The device buffers of a layer's calls, allocated once.
struct Buffers {
    x: CudaSlice<bf16>,
    /// The sizes the kernels read.
    sizes: CudaSlice<u32>,
    /// Where the host writes a routing for a graph replay (copied into `sizes` inside the graph).
    staging: CudaSlice<u32>,
    a: DeviceNvfp4,
    /// C with `GUARD` elements before and after.
    c: CudaSlice<f16>,
}

impl Buffers {
    fn new(stream: &Arc<CudaStream>, p: &MoeProblem) -> Buffers {
        Buffers {
            x: stream.alloc_zeros(p.token_rows() * p.k()).unwrap(),
            sizes: stream.alloc_zeros(p.sizes_len()).unwrap(),
            staging: stream.alloc_zeros(p.sizes_len()).unwrap(),
            a: DeviceNvfp4::alloc_zeros_sized(stream, p.a_sizes()).unwrap(),
            c: stream.alloc_zeros(p.c_elements() + 2 * GUARD).unwrap(),
        }
    }

    /// Writes the activations and poisons A and C (all of it, guards included), on `stream`.
    fn prepare(&mut self, stream: &Arc<CudaStream>, x: &[bf16]) {
        stream.memcpy_htod(x, &mut self.x).unwrap();
        stream.memcpy_htod(&vec![A_POISON; self.a.values.len()], &mut self.a.values).unwrap();
        stream.memcpy_htod(&vec![A_POISON; self.a.scales.len()], &mut self.a.scales).unwrap();
        stream.memcpy_htod(&vec![f16::from_bits(POISON); self.c.len()], &mut self.c).unwrap();
    }
}

/// Quantizes `bufs.x` and runs the GEMM, reading the sizes from `bufs.sizes` (no sync).
fn layer_call(stream: &Arc<CudaStream>, q: &Quantizer, plan: &mut MoePlan, layer: &Layer, bufs: &mut Buffers) {
    let p = layer.problem.clone();
    q.quantize_grouped(stream, &bufs.x, &p, &bufs.sizes, G_X, bufs.a.operand_mut()).unwrap();
    let weights: Vec<_> = layer.dev_weights.iter().map(|w| w.operand()).collect();
    let len = bufs.c.len() - 2 * GUARD;
    let mut c = bufs.c.slice_mut(GUARD..GUARD + len);
    let mut args = MoeArgs {
        sizes: &bufs.sizes,
        a: bufs.a.operand().into(),
        weights: &weights,
        alphas: &layer.alphas,
        c: Output::F16(&mut c),
    };
    plan.run(stream, &mut args).unwrap();
}

/// Random activations: Gaussian, a few whole rows of zeros, a few scaled rows.
fn activations(rng: &mut SplitMix64, rows: usize, k: usize) -> Vec<bf16> {
    let mut x = Vec::with_capacity(rows * k);
    for _ in 0..rows {
        let kind = rng.below(16);
        let scale = if kind == 1 {
            4.0
        } else if kind == 2 {
            0.01
        } else {
            1.0
        };
        for _ in 0..k {
            x.push(if kind == 0 { bf16::ZERO } else { f64_to_bf16(rng.normal() * scale) });
        }
    }
    x
}

/// Checks one call's results (see the module docs); returns the failures, described.
#[allow(clippy::too_many_arguments)]
fn check(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    plan: &MoePlan,
    layer: &Layer,
    bufs: &Buffers,
    x: &[bf16],
    sizes: &[u32],
    what: &str,
) -> Vec<String> {
    let p = &layer.problem;
    let (n, k) = (p.n(), p.k());
    let (rows, expected_status) = p.group_rows(sizes).unwrap();
    let mut f = Failures::new(what);
    let status = plan.read_status(stream).unwrap();
    let a_values = stream.clone_dtoh(&bufs.a.values).unwrap();
    let a_scales = stream.clone_dtoh(&bufs.a.scales).unwrap();
    let c: Vec<u16> = stream.clone_dtoh(&bufs.c).unwrap().iter().map(|v| v.to_bits()).collect();
    let c = check_bounds(&mut f, &c, p, &rows, status, expected_status);
    // Rows of no group keep their poison in A too.
    for row in unowned_rows(p, &rows) {
        if a_values[row * k / 2..(row + 1) * k / 2].iter().any(|&b| b != A_POISON) {
            f.fail(format!("A row {row} belongs to no group but was written"));
        }
    }
    if expected_status.offsets_decreasing() {
        // Groups may overlap: their results are unspecified (only bounds are checked).
        return f.list;
    }
    // Each group: its quantized tokens, then its outputs against the reference and the
    // host-sized plan.
    let rk = rest_k(k as u32);
    let mut groups = vec![];
    let mut shapes = vec![];
    let mut spans = vec![];
    for (g, r) in rows.iter().enumerate() {
        if r.rows == 0 {
            continue;
        }
        let (first, m) = (r.first as usize, r.rows as usize);
        let cpu = quantize_with_global_scale(&x[first * k..(first + m) * k], m, k, G_X).unwrap();
        if cpu.values() != &a_values[first * k / 2..(first + m) * k / 2] {
            f.fail(format!("group {g}: quantized values differ from the CPU quantizer"));
        }
        let mut bad_scales = 0;
        for i in 0..m as u32 {
            for j in 0..(k / 16) as u32 {
                let gpu_byte = a_scales[blocked_offset(r.scale_first + i, j, rk)];
                if gpu_byte != cpu.scales()[blocked_offset(i, j, rk)] {
                    bad_scales += 1;
                }
            }
        }
        if bad_scales > 0 {
            f.fail(format!("group {g}: {bad_scales} block scales differ from the CPU quantizer"));
        }
        groups.push(Group::new(cpu, layer.weights[g].clone(), 1.0).unwrap());
        shapes.push(GroupShape::new(m, n, k));
        spans.push((g, first, m));
    }
    if !groups.is_empty() {
        let host_sized = host_sized_gemm(gpu, &groups, &shapes, layer, &spans);
        check_groups(&mut f, c, n, &spans, &groups, &host_sized, "GemmPlan");
    }
    f.list
}

/// The host-sized `GemmPlan` on the same operands (CPU-quantized tokens): C's bits per group.
/// Everything on the context's default stream (where `GemmPlan::new` allocates its tables).
fn host_sized_gemm(
    gpu: &Gpu,
    groups: &[Group],
    shapes: &[GroupShape],
    layer: &Layer,
    spans: &[(usize, usize, usize)],
) -> Vec<Vec<u16>> {
    let stream = &gpu.context().default_stream();
    let mut plan = GemmPlan::new(gpu, Problem::new(shapes.to_vec(), OutputType::F16).unwrap()).unwrap();
    let a: Vec<DeviceNvfp4> = groups.iter().map(|g| DeviceNvfp4::upload(stream, &g.a).unwrap()).collect();
    let mut cs: Vec<CudaSlice<f16>> = shapes.iter().map(|s| stream.alloc_zeros(s.m * s.n).unwrap()).collect();
    {
        let mut args: Vec<GroupArgs> = a
            .iter()
            .zip(cs.iter_mut())
            .zip(spans)
            .map(|((a, c), &(g, _, _))| GroupArgs {
                a: a.operand().into(),
                b: layer.dev_weights[g].operand(),
                c: Output::F16(c),
                alpha: layer.alphas[g],
            })
            .collect();
        plan.run(stream, &mut args).unwrap();
    }
    cs.iter().map(|c| stream.clone_dtoh(c).unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

/// Runs every routing through the layer (outside any graph) and checks each call.
fn run_routings(test: &str, gpu: &Gpu, layer: &Layer, routings: &[(String, Vec<u32>)], seed: u64) {
    run_routings_with(test, gpu, layer, routings, seed, &MoeOptions::default());
}

/// [`run_routings`] with a plan made with `options`.
fn run_routings_with(
    test: &str,
    gpu: &Gpu,
    layer: &Layer,
    routings: &[(String, Vec<u32>)],
    seed: u64,
    options: &MoeOptions,
) {
    let stream = gpu.context().default_stream();
    let q = Quantizer::new(gpu).unwrap();
    let mut plan = MoePlan::with_options(gpu, layer.problem.clone(), options).unwrap();
    let mut bufs = Buffers::new(&stream, &layer.problem);
    let mut rng = SplitMix64::new(seed);
    for_routings(test, routings, 1, |_, name, sizes| {
        let x = activations(&mut rng, layer.problem.token_rows(), layer.problem.k());
        bufs.prepare(&stream, &x);
        stream.memcpy_htod(sizes, &mut bufs.sizes).unwrap();
        plan.clear_status(&stream).unwrap();
        layer_call(&stream, &q, &mut plan, layer, &mut bufs);
        stream.synchronize().unwrap();
        let what = format!("{:?} N={} K={} {name}", layer.problem.layout(), layer.problem.n(), layer.problem.k());
        let f = check(gpu, &stream, &plan, layer, &bufs, &x, sizes, &what);
        (what, f)
    });
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_contiguous_matches_cpu() {
    let test = "gpu_moe_contiguous_matches_cpu";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut rng = SplitMix64::new(0xC0_0001);
    // (experts, N, K, max tokens): many small experts, K tails (320: a half stage), N not a
    // multiple of 128, T not a multiple of 128, one expert.
    for (g, n, k, t) in
        [(8, 256, 512, 600), (5, 136, 320, 300), (64, 128, 256, 512), (1, 128, 2048, 200), (16, 512, 1024, 129)]
    {
        let p = MoeProblem::new(g, n, k, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
        let layer = Layer::new(&stream, p, rng.next_u64());
        let routings = contiguous_routings(&mut rng, g, t);
        run_routings(test, &gpu, &layer, &routings, rng.next_u64());
    }
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_masked_matches_cpu() {
    let test = "gpu_moe_masked_matches_cpu";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut rng = SplitMix64::new(0x3A5C);
    // (experts, N, K, M_max): decode sizes (≤ 16 rows: narrow tiles), a bound above 128 (two
    // token tiles), K tail, N not a multiple of 128.
    for (g, n, k, m) in [(6, 256, 512, 16), (4, 136, 320, 200), (32, 128, 1024, 5), (3, 384, 256, 129)] {
        let p = MoeProblem::new(g, n, k, TokenLayout::Masked { max_rows: m }, OutputType::F16).unwrap();
        let layer = Layer::new(&stream, p, rng.next_u64());
        let routings = masked_routings(&mut rng, g, m);
        run_routings(test, &gpu, &layer, &routings, rng.next_u64());
    }
}

/// Plans share the module's kernels, and a kernel's shared-memory limit is the function's: a
/// plan made after another (here one of fewer groups, whose scheduler needs less shared memory)
/// must not lower the limit the first one launches with.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_plans_made_later_leave_earlier_plans_launchable() {
    let test = "gpu_moe_plans_made_later_leave_earlier_plans_launchable";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut rng = SplitMix64::new(0x5A3D);
    let (n, k, m) = (256, 512, 96);
    let big = MoeProblem::new(16, n, k, TokenLayout::Masked { max_rows: m }, OutputType::F16).unwrap();
    let layer = Layer::new(&stream, big, rng.next_u64());
    let q = Quantizer::new(&gpu).unwrap();
    let mut plan = MoePlan::new(&gpu, layer.problem.clone()).unwrap();
    let small = MoeProblem::new(8, n, k, TokenLayout::Masked { max_rows: m }, OutputType::F16).unwrap();
    let _later = MoePlan::new(&gpu, small).unwrap();
    let mut bufs = Buffers::new(&stream, &layer.problem);
    let x = activations(&mut rng, layer.problem.token_rows(), k);
    bufs.prepare(&stream, &x);
    let sizes: Vec<u32> = (0..16).map(|_| rng.below(m as u64 + 1) as u32).collect();
    stream.memcpy_htod(&sizes, &mut bufs.sizes).unwrap();
    layer_call(&stream, &q, &mut plan, &layer, &mut bufs);
    stream.synchronize().unwrap();
    let failures = check(&gpu, &stream, &plan, &layer, &bufs, &x, &sizes, "16 groups after a plan of 8");
    assert!(failures.is_empty(), "{test}:\n{}", failures.join("\n"));
}

/// Offsets beyond the bound are clamped (the rows up to the bound computed), decreasing offsets
/// empty their group; each raises its status bit, and nothing outside the tensors (guards) or
/// outside the groups' rows is written.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_contiguous_overflow_clamps_and_flags() {
    let test = "gpu_moe_contiguous_overflow_clamps_and_flags";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let (g, t) = (4usize, 300usize);
    let p = MoeProblem::new(g, 256, 512, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
    let layer = Layer::new(&stream, p, 77);
    let routings = vec![
        ("last offset beyond T".to_string(), vec![0, 100, 250, 280, 350]),
        ("two offsets beyond T".to_string(), vec![0, 10, 290, 400, 500]),
        ("every offset beyond T".to_string(), vec![301, 400, 500, 600, u32::MAX]),
        ("decreasing".to_string(), vec![0, 200, 100, 150, 300]),
        ("decreasing and beyond".to_string(), vec![50, 20, u32::MAX, 0, 299]),
    ];
    run_routings(test, &gpu, &layer, &routings, 78);
    // Expected bits, explicitly (the checks above compare with `group_rows`).
    let bits = |s: &[u32]| layer.problem.group_rows(s).unwrap().1;
    assert!(bits(&routings[0].1).rows_over_bound() && !bits(&routings[0].1).offsets_decreasing());
    assert!(bits(&routings[3].1).offsets_decreasing() && !bits(&routings[3].1).rows_over_bound());
}

/// Counts beyond `M_max` are clamped and flagged; the status word is sticky until cleared.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_masked_overflow_clamps_and_flags() {
    let test = "gpu_moe_masked_overflow_clamps_and_flags";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let (g, m) = (3usize, 20usize);
    let p = MoeProblem::new(g, 128, 256, TokenLayout::Masked { max_rows: m }, OutputType::F16).unwrap();
    let layer = Layer::new(&stream, p, 99);
    let routings = vec![
        ("one count beyond M_max".to_string(), vec![25, 3, 20]),
        ("every count beyond M_max".to_string(), vec![21, 1000, u32::MAX]),
    ];
    run_routings(test, &gpu, &layer, &routings, 100);

    // Sticky: an overflowing call, then a good one without clearing, then cleared.
    let q = Quantizer::new(&gpu).unwrap();
    let mut plan = MoePlan::new(&gpu, layer.problem.clone()).unwrap();
    let mut bufs = Buffers::new(&stream, &layer.problem);
    let x = activations(&mut SplitMix64::new(5), layer.problem.token_rows(), layer.problem.k());
    bufs.prepare(&stream, &x);
    assert!(plan.read_status(&stream).unwrap().is_ok(), "a new plan's status is clear");
    stream.memcpy_htod(&[30u32, 0, 0], &mut bufs.sizes).unwrap();
    layer_call(&stream, &q, &mut plan, &layer, &mut bufs);
    stream.memcpy_htod(&[1u32, 2, 3], &mut bufs.sizes).unwrap();
    layer_call(&stream, &q, &mut plan, &layer, &mut bufs);
    assert_eq!(plan.read_status(&stream).unwrap(), SizeStatus(nvfp4_gemm_abi::moe::STATUS_COUNT_OVER_BOUND));
    plan.clear_status(&stream).unwrap();
    layer_call(&stream, &q, &mut plan, &layer, &mut bufs);
    assert!(plan.read_status(&stream).unwrap().is_ok());
}

/// A call with a wrong buffer is a typed error and launches nothing (C keeps its poison).
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_contiguous_bad_buffers_launch_nothing() {
    let test = "gpu_moe_contiguous_bad_buffers_launch_nothing";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let p = MoeProblem::new(2, 128, 256, TokenLayout::Contiguous { max_tokens: 64 }, OutputType::F16).unwrap();
    let layer = Layer::new(&stream, p.clone(), 3);
    let mut plan = MoePlan::new(&gpu, p.clone()).unwrap();
    let mut bufs = Buffers::new(&stream, &p);
    bufs.prepare(&stream, &vec![bf16::ONE; p.token_rows() * p.k()]);
    stream.memcpy_htod(&[0u32, 32, 64], &mut bufs.sizes).unwrap();
    let short_sizes = stream.alloc_zeros::<u32>(2).unwrap();
    let weights: Vec<_> = layer.dev_weights.iter().map(|w| w.operand()).collect();
    let len = bufs.c.len() - 2 * GUARD;
    {
        let mut c = bufs.c.slice_mut(GUARD..GUARD + len);
        let mut args = MoeArgs {
            sizes: &short_sizes,
            a: bufs.a.operand().into(),
            weights: &weights,
            alphas: &layer.alphas,
            c: Output::F16(&mut c),
        };
        let e = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { field: "sizes", .. }), "{e}");
        let mut args = MoeArgs {
            sizes: &bufs.sizes,
            a: bufs.a.operand().into(),
            weights: &weights[..1],
            alphas: &layer.alphas,
            c: Output::F16(&mut c),
        };
        let e = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { field: "weights", .. }), "{e}");
    }
    let q = Quantizer::new(&gpu).unwrap();
    let e = q.quantize_grouped(&stream, &bufs.x, &p, &short_sizes, G_X, bufs.a.operand_mut()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { field: "sizes", .. }), "{e}");
    stream.synchronize().unwrap();
    let c = stream.clone_dtoh(&bufs.c).unwrap();
    assert!(c.iter().all(|v| v.to_bits() == POISON), "C was written");
    assert!(stream.clone_dtoh(&bufs.a.values).unwrap().iter().all(|&b| b == A_POISON), "A was written");
}

/// Captures once, replays every routing (written to the staging buffer between replays, with new
/// activations and poisoned outputs), and checks every replay.
fn replay_routings(test: &str, gpu: &Gpu, problem: MoeProblem, routings: &[(String, Vec<u32>)], seed: u64) {
    replay_routings_with(test, gpu, problem, routings, seed, &MoeOptions::default());
}

/// [`replay_routings`] with a plan made with `options`.
fn replay_routings_with(
    test: &str,
    gpu: &Gpu,
    problem: MoeProblem,
    routings: &[(String, Vec<u32>)],
    seed: u64,
    options: &MoeOptions,
) {
    with_capture_stream(gpu, |stream| {
        let layer = Layer::new(stream, problem, seed);
        let q = Quantizer::new(gpu).unwrap();
        let mut plan = MoePlan::with_options(gpu, layer.problem.clone(), options).unwrap();
        let mut bufs = Buffers::new(stream, &layer.problem);
        let mut rng = SplitMix64::new(seed + 1);
        // A first call outside the capture uploads the weights' tables.
        let x = activations(&mut rng, layer.problem.token_rows(), layer.problem.k());
        bufs.prepare(stream, &x);
        stream.memcpy_htod(&routings[0].1, &mut bufs.sizes).unwrap();
        layer_call(stream, &q, &mut plan, &layer, &mut bufs);
        stream.synchronize().unwrap();
        // The graph: `sizes ← staging` (how a routing reaches a replay), status cleared, the layer.
        let (graph, ()) = capture(stream, || {
            stream.memcpy_dtod(&bufs.staging, &mut bufs.sizes).unwrap();
            plan.clear_status(stream).unwrap();
            layer_call(stream, &q, &mut plan, &layer, &mut bufs);
        });
        for_routings(test, routings, 2, |round, name, sizes| {
            let x = activations(&mut rng, layer.problem.token_rows(), layer.problem.k());
            bufs.prepare(stream, &x);
            stream.memcpy_htod(sizes, &mut bufs.staging).unwrap();
            graph.launch().unwrap();
            stream.synchronize().unwrap();
            let what = format!("replay {round} {:?} {name}", layer.problem.layout());
            let f = check(gpu, stream, &plan, &layer, &bufs, &x, sizes, &what);
            (what, f)
        });
    });
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_contiguous_graph_replays_routings() {
    let test = "gpu_moe_contiguous_graph_replays_routings";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let (g, n, k, t) = (16usize, 128usize, 512usize, 384usize);
    let p = MoeProblem::new(g, n, k, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
    let mut rng = SplitMix64::new(0x6AF);
    let mut routings = contiguous_routings(&mut rng, g, t);
    routings.push((
        "offsets beyond T (clamped, flagged)".into(),
        vec![0, 50, 100, 150, 200, 250, 300, 350, 383, 390, 400, 401, 402, 403, 404, 405, 406],
    ));
    routings.push(("random again".into(), random_offsets(&mut rng, g, t / 2)));
    replay_routings(test, &gpu, p, &routings, 0x6B0);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_masked_graph_replays_counts() {
    let test = "gpu_moe_masked_graph_replays_counts";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let (g, n, k, m) = (8usize, 136usize, 576usize, 24usize);
    let p = MoeProblem::new(g, n, k, TokenLayout::Masked { max_rows: m }, OutputType::F16).unwrap();
    let mut rng = SplitMix64::new(0x3A5);
    let mut routings: Vec<(String, Vec<u32>)> =
        (0..4).map(|i| (format!("random {i}"), (0..g).map(|_| rng.below(m as u64 + 1) as u32).collect())).collect();
    routings.push(("all empty".into(), vec![0; g]));
    routings.push(("all full".into(), vec![m as u32; g]));
    let mut one = vec![0u32; g];
    one[3] = m as u32;
    routings.push(("one expert".into(), one));
    routings.push(("counts beyond M_max (clamped, flagged)".into(), vec![m as u32 + 1, 0, 7, u32::MAX, 24, 25, 1, 2]));
    replay_routings(test, &gpu, p, &routings, 0x3A6);
}

/// Every plan option on the same routings: the decode kernel alone (groups of more than 16 tokens
/// as several 16-token tiles), the general kernel alone (16- and 128-token tiles, or 64-wide last
/// tiles), and the automatic choice with 64-wide last tiles; contiguous and masked, K tail, N not a
/// multiple of 128. Each call is checked as in the tests above (against the CPU and bit for bit
/// against `GemmPlan`, whose kernel for the same sizes may differ: every kernel issues the same
/// k16 steps in the same order for an output element).
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_kernel_options_match_cpu() {
    let test = "gpu_moe_kernel_options_match_cpu";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut rng = SplitMix64::new(0x0B7);
    let options = [
        MoeOptions { kernels: MoeKernels::Decode, tail64: false, spans192: false, caller_dequantizes: false },
        MoeOptions { kernels: MoeKernels::General, tail64: false, spans192: false, caller_dequantizes: false },
        MoeOptions { kernels: MoeKernels::General, tail64: true, spans192: false, caller_dequantizes: false },
        MoeOptions { kernels: MoeKernels::Auto, tail64: true, spans192: false, caller_dequantizes: false },
        MoeOptions { kernels: MoeKernels::General, tail64: false, spans192: true, caller_dequantizes: false },
        MoeOptions { kernels: MoeKernels::Auto, tail64: false, spans192: true, caller_dequantizes: false },
        MoeOptions { kernels: MoeKernels::AutoGeneralFirst, tail64: false, spans192: true, caller_dequantizes: false },
    ];
    let (g, n, k, t) = (16usize, 136usize, 576usize, 400usize);
    let contiguous = MoeProblem::new(g, n, k, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
    let layer = Layer::new(&stream, contiguous, rng.next_u64());
    let mut routings = contiguous_routings(&mut rng, g, t);
    routings.push(("at most 16 each".into(), offsets_of(&(0..g).map(|e| (e % 17) as u32).collect::<Vec<_>>(), 3)));
    for o in &options {
        run_routings_with(&format!("{test} {o:?}"), &gpu, &layer, &routings, rng.next_u64(), o);
    }
    let (g, m) = (6usize, 150usize);
    let masked = MoeProblem::new(g, 256, 320, TokenLayout::Masked { max_rows: m }, OutputType::F16).unwrap();
    let layer = Layer::new(&stream, masked, rng.next_u64());
    let routings = vec![
        ("random".to_string(), (0..g).map(|_| rng.below(m as u64 + 1) as u32).collect()),
        ("small".to_string(), vec![1, 16, 0, 5, 16, 9]),
        ("one of 17, one of 65, one of 150".to_string(), vec![17, 0, 65, 0, 150, 3]),
    ];
    for o in &options {
        run_routings_with(&format!("{test} {o:?}"), &gpu, &layer, &routings, rng.next_u64(), o);
    }
}

/// One captured graph of a plan of the decode kernel alone replays routings of every size (the
/// larger groups as several 16-token tiles), and one of the automatic choice with 64-wide tails
/// switches between the decode and the general kernel from one replay to the next, as does one
/// pairing the decode kernel with `N192` (two weight maps per group), in either launch order.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_options_graph_replays_routings() {
    let test = "gpu_moe_options_graph_replays_routings";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let (g, n, k, t) = (12usize, 128usize, 512usize, 300usize);
    let p = MoeProblem::new(g, n, k, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
    let mut rng = SplitMix64::new(0x6C1);
    let mut routings = contiguous_routings(&mut rng, g, t);
    routings.insert(1, ("at most 16 each".into(), offsets_of(&vec![16; g], 0)));
    for o in [
        MoeOptions { kernels: MoeKernels::Decode, tail64: false, spans192: false, caller_dequantizes: false },
        MoeOptions { kernels: MoeKernels::Auto, tail64: true, spans192: false, caller_dequantizes: false },
        MoeOptions { kernels: MoeKernels::Auto, tail64: false, spans192: true, caller_dequantizes: false },
        MoeOptions { kernels: MoeKernels::AutoGeneralFirst, tail64: false, spans192: true, caller_dequantizes: false },
    ] {
        replay_routings_with(&format!("{test} {o:?}"), &gpu, p.clone(), &routings, 0x6C2, &o);
    }
}
