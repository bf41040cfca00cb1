//! W4A16 with device-resident group sizes on the H200 (a `MoePlan` of 16-bit activations): f16
//! or bf16 activations `[token_rows, K]` read as they are, every expert's NVFP4 weights prepacked
//! once for them, the group sizes (contiguous offsets or masked counts) read on the device only.
//!
//! Each routing's activations are random NVFP4 groups (global scale 1) with their block scales
//! applied — exact in f16 and bf16 — at the rows the sizes give each group (clamped as the device clamps
//! them, `MoeProblem::group_rows`); every other row is NaN, so a tile that reads rows of no group
//! must keep them out of the groups' results. Every call is checked:
//! - C (poisoned, with poisoned guards) equals, on every group's rows, the fp64 reference of the
//!   NVFP4 groups within the competition tolerance (plus the fp32-accumulation allowance), and bit
//!   for bit the host-sized W4A16 `GemmPlan` on the same groups; rows of no group and the guards keep
//!   their poison;
//! - the plan's status word equals the bits the host expects.
//!
//! Both layouts with empty experts, one expert taking every token, sizes beyond the bounds, every
//! kernel option, both activation types; a CUDA graph (bf16 activations) captured once and
//! replayed for many routings; typed errors.
//! Ignored unless asked for: they need an sm_90a GPU (see `nvfp4_gemm_tests`).

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use nvfp4_format::{random_matrix, Group, GroupShape, InputDistribution, Nvfp4Matrix, SplitMix64};
use nvfp4_gemm::moe::{MoeArgs, MoeKernels, MoeOptions, MoePlan, MoeProblem, SizeStatus, TokenLayout};
use nvfp4_gemm::w4a16::{prepack, Activations};
use nvfp4_gemm::{
    Arch, Error, GemmPlan, Gpu, GroupArgs, Nvfp4Operand, Output, OutputType, Problem, TokenKind, TokenOperand,
};
use nvfp4_gemm_tests::moe::{
    capture, check_bounds, check_groups, contiguous_routings, for_routings, masked_routings, random_offsets,
    with_capture_stream, Failures,
};
use nvfp4_gemm_tests::w4a16::Activation16;
use nvfp4_gemm_tests::{gpu_or_skip, GUARD, POISON};
use std::sync::Arc;

/// One MoE layer: the problem (of activations of `kind`), each expert's NVFP4 weights on the host
/// and prepacked on the device for those activations, alphas (the weights' global scale: the
/// activations' is 1).
struct Layer {
    problem: MoeProblem,
    kind: Activations,
    weights: Vec<Nvfp4Matrix>,
    packed: Vec<(CudaSlice<u8>, CudaSlice<u8>)>,
    alphas: Vec<f32>,
}

impl Layer {
    fn new(stream: &Arc<CudaStream>, problem: MoeProblem, kind: Activations, seed: u64) -> Layer {
        let mut rng = SplitMix64::new(seed);
        let weights: Vec<Nvfp4Matrix> = (0..problem.groups())
            .map(|_| random_matrix(problem.n(), problem.k(), InputDistribution::Competition, &mut rng).unwrap())
            .collect();
        let packed = weights
            .iter()
            .map(|w| {
                let p = prepack(w, kind).unwrap();
                (stream.clone_htod(&p.values).unwrap(), stream.clone_htod(&p.scales).unwrap())
            })
            .collect();
        let alphas = weights.iter().map(|w| w.global_scale()).collect();
        let problem = problem.with_tokens(TokenKind::Dense(kind));
        Layer { problem, kind, weights, packed, alphas }
    }

    fn operands(&self) -> Vec<Nvfp4Operand<'_>> {
        self.packed.iter().map(|(values, scales)| Nvfp4Operand { values, scales }).collect()
    }
}

/// One routing's inputs: the groups (A of each group's clamped rows, global scale 1) and the
/// activations `[token_rows, K]` of type `A` (module docs).
struct Routing<A> {
    sizes: Vec<u32>,
    groups: Vec<Option<Group>>,
    x: Vec<A>,
}

impl<A: Activation16> Routing<A> {
    fn new(layer: &Layer, sizes: &[u32], rng: &mut SplitMix64) -> Routing<A> {
        assert_eq!(layer.kind, A::KIND, "weights prepacked for these activations");
        let p = &layer.problem;
        let k = p.k();
        let (rows, _) = p.group_rows(sizes).unwrap();
        let mut x = vec![A::NAN; p.token_rows() * k];
        let mut groups = vec![];
        for (r, w) in rows.iter().zip(&layer.weights) {
            if r.rows == 0 {
                groups.push(None);
                continue;
            }
            let mut a = random_matrix(r.rows as usize, k, InputDistribution::Competition, rng).unwrap();
            a.set_global_scale(1.0);
            let first = r.first as usize * k;
            x[first..first + r.rows as usize * k].copy_from_slice(&A::block_scaled(&a));
            groups.push(Some(Group::new(a, w.clone(), 1.0).unwrap()));
        }
        Routing { sizes: sizes.to_vec(), groups, x }
    }
}

/// The device buffers of a layer's calls, allocated once (activations of type `A`).
struct Buffers<A> {
    x: CudaSlice<A>,
    /// The sizes the kernels read.
    sizes: CudaSlice<u32>,
    /// Where a routing is written for a graph replay (copied into `sizes` inside the graph).
    staging: CudaSlice<u32>,
    /// C with `GUARD` elements before and after.
    c: CudaSlice<f16>,
}

impl<A: Activation16> Buffers<A> {
    fn new(stream: &Arc<CudaStream>, p: &MoeProblem) -> Buffers<A> {
        Buffers {
            x: stream.alloc_zeros(p.token_rows() * p.k()).unwrap(),
            sizes: stream.alloc_zeros(p.sizes_len()).unwrap(),
            staging: stream.alloc_zeros(p.sizes_len()).unwrap(),
            c: stream.alloc_zeros(p.c_elements() + 2 * GUARD).unwrap(),
        }
    }

    /// Writes the routing's activations and poisons C (guards included), on `stream`.
    fn prepare(&mut self, stream: &Arc<CudaStream>, routing: &Routing<A>) {
        stream.memcpy_htod(&routing.x, &mut self.x).unwrap();
        stream.memcpy_htod(&vec![f16::from_bits(POISON); self.c.len()], &mut self.c).unwrap();
    }
}

/// The GEMM, reading the sizes from `bufs.sizes` (no sync).
fn call<A: Activation16>(
    stream: &Arc<CudaStream>,
    plan: &mut MoePlan,
    layer: &Layer,
    bufs: &mut Buffers<A>,
) -> nvfp4_gemm::Result<()> {
    let weights = layer.operands();
    let len = bufs.c.len() - 2 * GUARD;
    let mut c = bufs.c.slice_mut(GUARD..GUARD + len);
    let mut args = MoeArgs {
        sizes: &bufs.sizes,
        a: A::tokens(&bufs.x),
        weights: &weights,
        alphas: &layer.alphas,
        c: Output::F16(&mut c),
    };
    plan.run(stream, &mut args)
}

/// Checks one call (module docs); returns the failures, described.
fn check<A: Activation16>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    plan: &MoePlan,
    layer: &Layer,
    bufs: &Buffers<A>,
    routing: &Routing<A>,
    what: &str,
) -> Vec<String> {
    let p = &layer.problem;
    let (rows, expected_status) = p.group_rows(&routing.sizes).unwrap();
    let mut f = Failures::new(what);
    let status = plan.read_status(stream).unwrap();
    let c: Vec<u16> = stream.clone_dtoh(&bufs.c).unwrap().iter().map(|v| v.to_bits()).collect();
    let c = check_bounds(&mut f, &c, p, &rows, status, expected_status);
    if expected_status.offsets_decreasing() {
        // Groups may overlap: their results are unspecified (only bounds are checked).
        return f.list;
    }
    let spans: Vec<(usize, usize, usize)> = rows
        .iter()
        .enumerate()
        .filter(|(_, r)| r.rows > 0)
        .map(|(g, r)| (g, r.first as usize, r.rows as usize))
        .collect();
    let groups: Vec<Group> =
        spans.iter().map(|&(g, _, _)| routing.groups[g].clone().expect("a non-empty group")).collect();
    if !groups.is_empty() {
        let host_sized = host_sized_w4a16(gpu, layer, bufs, &spans);
        check_groups(&mut f, c, p.n(), &spans, &groups, &host_sized, "the host-sized W4A16 plan");
    }
    f.list
}

/// The host-sized W4A16 `GemmPlan` on each non-empty group's rows of the same activations and the
/// same prepacked weights: C's bits per group. On the context's default stream (where
/// `GemmPlan::new` allocates), after the caller's stream was synchronized.
fn host_sized_w4a16<A: Activation16>(
    gpu: &Gpu,
    layer: &Layer,
    bufs: &Buffers<A>,
    spans: &[(usize, usize, usize)],
) -> Vec<Vec<u16>> {
    let stream = &gpu.context().default_stream();
    let (n, k) = (layer.problem.n(), layer.problem.k());
    let shapes: Vec<GroupShape> = spans.iter().map(|&(_, _, m)| GroupShape::new(m, n, k)).collect();
    let problem = Problem::with_tokens(shapes, OutputType::F16, TokenKind::Dense(A::KIND)).unwrap();
    let mut plan = GemmPlan::new(gpu, problem).unwrap();
    let xs: Vec<_> = spans.iter().map(|&(_, first, m)| bufs.x.slice(first * k..(first + m) * k)).collect();
    let mut cs: Vec<CudaSlice<f16>> = spans.iter().map(|&(_, _, m)| stream.alloc_zeros(m * n).unwrap()).collect();
    {
        let mut args: Vec<GroupArgs> = xs
            .iter()
            .zip(cs.iter_mut())
            .zip(spans)
            .map(|((x, c), &(g, _, _))| GroupArgs {
                a: A::tokens(x),
                b: Nvfp4Operand { values: &layer.packed[g].0, scales: &layer.packed[g].1 },
                c: Output::F16(c),
                alpha: layer.alphas[g],
            })
            .collect();
        plan.run(stream, &mut args).unwrap();
    }
    cs.iter().map(|c| stream.clone_dtoh(c).unwrap().iter().map(|v| v.to_bits()).collect()).collect()
}

/// Runs every routing through the layer with a plan of `options` and activations of type `A`
/// (outside any graph) and checks each call.
fn run_routings<A: Activation16>(
    test: &str,
    gpu: &Gpu,
    layer: &Layer,
    routings: &[(String, Vec<u32>)],
    seed: u64,
    options: &MoeOptions,
) {
    let stream = gpu.context().default_stream();
    let mut plan = MoePlan::with_options(gpu, layer.problem.clone(), options).unwrap();
    let mut bufs = Buffers::<A>::new(&stream, &layer.problem);
    let mut rng = SplitMix64::new(seed);
    for_routings(test, routings, 1, |_, name, sizes| {
        let routing = Routing::<A>::new(layer, sizes, &mut rng);
        bufs.prepare(&stream, &routing);
        stream.memcpy_htod(sizes, &mut bufs.sizes).unwrap();
        plan.clear_status(&stream).unwrap();
        call(&stream, &mut plan, layer, &mut bufs).unwrap();
        stream.synchronize().unwrap();
        let p = &layer.problem;
        let what = format!("{:?} {:?} N={} K={} {options:?} {name}", A::KIND, p.layout(), p.n(), p.k());
        let f = check(gpu, &stream, &plan, layer, &bufs, &routing, &what);
        (what, f)
    });
}

const OPTIONS: [MoeOptions; 6] = [
    MoeOptions { kernels: MoeKernels::Auto, tail64: false, spans192: false, caller_dequantizes: false },
    MoeOptions { kernels: MoeKernels::AutoGeneralFirst, tail64: false, spans192: true, caller_dequantizes: false },
    MoeOptions { kernels: MoeKernels::Decode, tail64: false, spans192: false, caller_dequantizes: false },
    MoeOptions { kernels: MoeKernels::General, tail64: true, spans192: false, caller_dequantizes: false },
    MoeOptions { kernels: MoeKernels::General, tail64: false, spans192: true, caller_dequantizes: false },
    MoeOptions { kernels: MoeKernels::Auto, tail64: false, spans192: true, caller_dequantizes: false },
];

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_w4a16_contiguous_matches_cpu() {
    let test = "gpu_moe_w4a16_contiguous_matches_cpu";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut rng = SplitMix64::new(0xA16_C001);
    // (experts, N, K, max tokens): many small experts, K tails (320: a half stage), N not a
    // multiple of 128, T not a multiple of 128, one expert; every kernel option on the second;
    // f16 and bf16 activations.
    for (i, (g, n, k, t)) in
        [(8, 256, 512, 600), (5, 136, 320, 300), (64, 128, 256, 512), (1, 128, 2048, 200), (16, 512, 1024, 129)]
            .into_iter()
            .enumerate()
    {
        let p = MoeProblem::new(g, n, k, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
        let routings = contiguous_routings(&mut rng, g, t);
        let options: &[MoeOptions] = if i == 1 { &OPTIONS } else { &OPTIONS[..1] };
        let layer = Layer::new(&stream, p.clone(), Activations::F16, rng.next_u64());
        for o in options {
            run_routings::<f16>(test, &gpu, &layer, &routings, rng.next_u64(), o);
        }
        let layer = Layer::new(&stream, p, Activations::Bf16, rng.next_u64());
        for o in options {
            run_routings::<bf16>(test, &gpu, &layer, &routings, rng.next_u64(), o);
        }
    }
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_w4a16_masked_matches_cpu() {
    let test = "gpu_moe_w4a16_masked_matches_cpu";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut rng = SplitMix64::new(0xA16_3A5C);
    // (experts, N, K, M_max): decode sizes (≤ 16 rows), a bound above 128 (two token tiles), K
    // tail, N not a multiple of 128.
    for (g, n, k, m) in [(6, 256, 512, 16), (4, 136, 320, 200), (32, 128, 1024, 5), (3, 384, 256, 129)] {
        let p = MoeProblem::new(g, n, k, TokenLayout::Masked { max_rows: m }, OutputType::F16).unwrap();
        let mut routings = masked_routings(&mut rng, g, m);
        routings.push((
            "counts beyond M_max".to_string(),
            (0..g).map(|i| if i % 2 == 0 { m as u32 + 7 } else { 1 }).collect(),
        ));
        let layer = Layer::new(&stream, p.clone(), Activations::F16, rng.next_u64());
        run_routings::<f16>(test, &gpu, &layer, &routings, rng.next_u64(), &OPTIONS[0]);
        let layer = Layer::new(&stream, p, Activations::Bf16, rng.next_u64());
        run_routings::<bf16>(test, &gpu, &layer, &routings, rng.next_u64(), &OPTIONS[0]);
    }
}

/// Offsets beyond the bound are clamped, decreasing offsets empty their group; each raises its
/// status bit, and nothing outside the tensors or the groups' rows is written.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_w4a16_contiguous_overflow_clamps_and_flags() {
    let test = "gpu_moe_w4a16_contiguous_overflow_clamps_and_flags";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let p = MoeProblem::new(4, 256, 512, TokenLayout::Contiguous { max_tokens: 300 }, OutputType::F16).unwrap();
    let layer = Layer::new(&stream, p, Activations::F16, 77);
    let routings = vec![
        ("last offset beyond T".to_string(), vec![0, 100, 250, 280, 350]),
        ("every offset beyond T".to_string(), vec![301, 400, 500, 600, u32::MAX]),
        ("decreasing".to_string(), vec![0, 200, 100, 150, 300]),
        ("decreasing and beyond".to_string(), vec![50, 20, u32::MAX, 0, 299]),
    ];
    run_routings::<f16>(test, &gpu, &layer, &routings, 78, &OPTIONS[0]);
}

/// Captures `sizes ← staging`, a status clear and the GEMM once, then replays every routing
/// (written to the staging buffer between replays, new activations in the same buffer, C
/// poisoned), twice, checking every replay.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_w4a16_graph_replays_routings() {
    let test = "gpu_moe_w4a16_graph_replays_routings";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let (g, n, k, t) = (16usize, 128usize, 512usize, 384usize);
    let p = MoeProblem::new(g, n, k, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap();
    let mut rng = SplitMix64::new(0xA16_6AF);
    let mut routings = contiguous_routings(&mut rng, g, t);
    routings.push((
        "offsets beyond T (clamped, flagged)".into(),
        vec![0, 50, 100, 150, 200, 250, 300, 350, 383, 390, 400, 401, 402, 403, 404, 405, 406],
    ));
    routings.push(("random again".into(), random_offsets(&mut rng, g, t / 2)));
    with_capture_stream(&gpu, |stream| {
        // bf16 activations, as a serving engine's.
        let layer = Layer::new(stream, p, Activations::Bf16, 0xA16_6B0);
        let mut plan = MoePlan::new(&gpu, layer.problem.clone()).unwrap();
        let mut bufs = Buffers::<bf16>::new(stream, &layer.problem);
        // A first call outside the capture uploads the tables (the weights' and activations' maps).
        let first = Routing::new(&layer, &routings[0].1, &mut rng);
        bufs.prepare(stream, &first);
        stream.memcpy_htod(&routings[0].1, &mut bufs.sizes).unwrap();
        call(stream, &mut plan, &layer, &mut bufs).unwrap();
        stream.synchronize().unwrap();
        // The graph: `sizes ← staging` (how a routing reaches a replay), status cleared, the GEMM.
        let (graph, captured) = capture(stream, || {
            stream.memcpy_dtod(&bufs.staging, &mut bufs.sizes).unwrap();
            plan.clear_status(stream).unwrap();
            call(stream, &mut plan, &layer, &mut bufs)
        });
        captured.unwrap();
        for_routings(test, &routings, 2, |round, name, sizes| {
            let routing = Routing::new(&layer, sizes, &mut rng);
            bufs.prepare(stream, &routing);
            stream.memcpy_htod(sizes, &mut bufs.staging).unwrap();
            graph.launch().unwrap();
            stream.synchronize().unwrap();
            let what = format!("replay {round} {name}");
            let f = check(&gpu, stream, &plan, &layer, &bufs, &routing, &what);
            (what, f)
        });
    });
}

/// A call with a wrong buffer, or activations of another type than the plan's, is a typed error
/// that launches nothing (C keeps its poison); the status stays sticky until cleared.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_moe_w4a16_errors_and_sticky_status() {
    let test = "gpu_moe_w4a16_errors_and_sticky_status";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let p = MoeProblem::new(3, 128, 256, TokenLayout::Masked { max_rows: 20 }, OutputType::F16).unwrap();
    let layer = Layer::new(&stream, p.clone(), Activations::F16, 3);
    let mut plan = MoePlan::new(&gpu, layer.problem.clone()).unwrap();
    assert!(plan.summary().kernel.contains("sm90_w4a16_gemm"), "{}", plan.summary().kernel);
    let mut bufs = Buffers::<f16>::new(&stream, &p);
    let routing = Routing::new(&layer, &[3, 0, 20], &mut SplitMix64::new(4));
    bufs.prepare(&stream, &routing);
    stream.memcpy_htod(&routing.sizes, &mut bufs.sizes).unwrap();
    let short_x = stream.alloc_zeros::<f16>(p.token_rows() * p.k() - 8).unwrap();
    let bf16_x = stream.alloc_zeros::<bf16>(p.token_rows() * p.k()).unwrap();
    let weights = layer.operands();
    let len = bufs.c.len() - 2 * GUARD;
    {
        let mut c = bufs.c.slice_mut(GUARD..GUARD + len);
        let mut args = MoeArgs {
            sizes: &bufs.sizes,
            a: TokenOperand::F16(&short_x),
            weights: &weights,
            alphas: &layer.alphas,
            c: Output::F16(&mut c),
        };
        let e = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { field: "activations", .. }), "{e}");
        let mut args = MoeArgs {
            sizes: &bufs.sizes,
            a: TokenOperand::Bf16(&bf16_x),
            weights: &weights,
            alphas: &layer.alphas,
            c: Output::F16(&mut c),
        };
        let e = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { field: "activations", .. }), "bf16 for an f16 plan: {e}");
        let mut args = MoeArgs {
            sizes: &bufs.sizes,
            a: TokenOperand::F16(&bufs.x),
            weights: &weights[..2],
            alphas: &layer.alphas,
            c: Output::F16(&mut c),
        };
        let e = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { field: "weights", .. }), "{e}");
    }
    stream.synchronize().unwrap();
    assert!(stream.clone_dtoh(&bufs.c).unwrap().iter().all(|v| v.to_bits() == POISON), "C was written");
    // Sticky: an overflowing call, then a good one without clearing, then cleared.
    stream.memcpy_htod(&[30u32, 0, 0], &mut bufs.sizes).unwrap();
    call(&stream, &mut plan, &layer, &mut bufs).unwrap();
    stream.memcpy_htod(&[1u32, 2, 3], &mut bufs.sizes).unwrap();
    call(&stream, &mut plan, &layer, &mut bufs).unwrap();
    assert_eq!(plan.read_status(&stream).unwrap(), SizeStatus(nvfp4_gemm_abi::moe::STATUS_COUNT_OVER_BOUND));
    plan.clear_status(&stream).unwrap();
    call(&stream, &mut plan, &layer, &mut bufs).unwrap();
    assert!(plan.read_status(&stream).unwrap().is_ok());
}
