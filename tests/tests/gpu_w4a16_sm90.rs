//! W4A16 on the H200 (a `GemmPlan` of 16-bit activations, `nvfp4_gemm::w4a16`): f16 or bf16
//! activations times NVFP4 weights
//! prepacked once for them, one GEMM launch per call (no dequantization). Each group's
//! activations are its A with the block scales applied (exact in f16 and bf16; A's global scale in
//! alpha), so every case compares with the fp64 reference of the NVFP4 groups exactly as the W4A4
//! tests do (`run_case_with`: C and its guards poisoned, two runs, bitwise determinism; fp16 atol =
//! rtol = 1e-3, bf16 rtol 4e-3; full-range inputs with the fp32-accumulation allowance). Cases, for
//! both activation types: the competition's shapes, random problems with tails (M = 0, M of any
//! size, N = 8·odd, K = 64 and K % 128 = 64, up to 16 groups), 64 groups of 4 tokens (the decode
//! kernel), both input distributions, fp16 and bf16 output; every e2m1 code times every e4m3 scale
//! exactly (bf16: through the subnormal decode of 0.5); the stacked call (one buffer per operand)
//! against the per-group one; and typed errors for activations of the wrong type and bad buffers.
//! Ignored unless asked for: they need an sm_90a GPU (see `nvfp4_gemm_tests`). The weights'
//! prepack on the GPU against the CPU prepack: [`prepack`] (`gpu_w4a16_sm90/prepack.rs`).

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use nvfp4_format::{Group, GroupShape, InputDistribution, Tolerance};
use nvfp4_gemm::w4a16::{prepack, Activations};
use nvfp4_gemm::{
    Arch, Error, GemmPlan, Gpu, GroupArgs, Nvfp4Operand, OutputType, Problem, StackedArgs, TokenKind, TokenOperand,
};
use nvfp4_gemm_tests::cases::{self, Multiples, RandomShapes, BF16_TOLERANCE};
use nvfp4_gemm_tests::w4a16::Activation16;
use nvfp4_gemm_tests::{gpu_or_skip, make_groups, run_case_with, CaseReport, OutputElement};
use std::sync::Arc;

#[path = "gpu_w4a16_sm90/prepack.rs"]
mod prepack;

/// One group's W4A16 operands on the device, activations of type `A`.
struct DeviceOperands<A = f16> {
    activations: CudaSlice<A>,
    values: CudaSlice<u8>,
    scales: CudaSlice<u8>,
}

/// Uploads A with its block scales applied (type `A`, exact) and B prepacked for those
/// activations.
fn upload<A: Activation16>(stream: &Arc<CudaStream>, g: &Group) -> DeviceOperands<A> {
    let act = A::block_scaled(&g.a);
    let w = prepack(&g.b, A::KIND).expect("prepack");
    let bytes = |b: &[u8]| if b.is_empty() { stream.alloc_zeros(16) } else { stream.clone_htod(b) };
    DeviceOperands {
        activations: if act.is_empty() { stream.alloc_zeros(8).unwrap() } else { stream.clone_htod(&act).unwrap() },
        values: bytes(&w.values).unwrap(),
        scales: bytes(&w.scales).unwrap(),
    }
}

/// The W4A16 problem of `groups` (activations of type `kind`) with output `out`.
fn problem(groups: &[Group], out: OutputType, kind: Activations) -> Problem {
    let shapes: Vec<GroupShape> = groups.iter().map(|g| GroupShape::new(g.m(), g.n(), g.k())).collect();
    Problem::with_tokens(shapes, out, TokenKind::Dense(kind)).unwrap()
}

/// The GEMM kernel a plan launches (W4A16: its only launch).
fn kernel(plan: &GemmPlan) -> &'static str {
    plan.summary().launches.last().map_or("none", |l| l.kernel)
}

/// One case through a W4A16 `GemmPlan` with output type `T` and activations of type `A`.
fn run_w4a16<T: OutputElement, A: Activation16>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    groups: &[Group],
    tol: Tolerance,
    full: bool,
) -> (CaseReport, &'static str) {
    let mut plan = GemmPlan::new(gpu, problem(groups, T::TYPE, A::KIND)).expect("plan");
    let ops: Vec<DeviceOperands<A>> = groups.iter().map(|g| upload(stream, g)).collect();
    let report = run_case_with::<T>(stream, groups, tol, full, &mut |cs| {
        let mut args: Vec<GroupArgs> = ops
            .iter()
            .zip(cs.iter_mut())
            .zip(groups)
            .map(|((o, c), g)| GroupArgs {
                a: A::tokens(&o.activations),
                b: Nvfp4Operand { values: &o.values, scales: &o.scales },
                c: T::output(c),
                alpha: g.effective_alpha_f32(),
            })
            .collect();
        plan.run(stream, &mut args).expect("run");
    });
    (report, kernel(&plan))
}

fn run_cases<T: OutputElement, A: Activation16>(
    test: &str,
    cases: &[(Vec<GroupShape>, InputDistribution)],
    seed: u64,
    tol: Tolerance,
) {
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut failures = vec![];
    for (i, (shapes, dist)) in cases.iter().enumerate() {
        let groups = make_groups(shapes, *dist, seed + i as u64);
        let (r, kernel) = run_w4a16::<T, A>(&gpu, &stream, &groups, tol, *dist == InputDistribution::FullRange);
        let dims: Vec<(usize, usize, usize)> = shapes.iter().map(|s| (s.m, s.n, s.k)).collect();
        let line = format!("CASE {test}[{i}] {:?} {:?} {dist:?} {kernel} groups(m,n,k)={dims:?} {r}", A::KIND, T::TYPE);
        println!("{line}");
        if !r.passed() {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_competition_shapes() {
    let cases = cases::with_dists(cases::competition());
    run_cases::<f16, f16>("gpu_w4a16_competition_shapes", &cases, 0x4A1, Tolerance::COMPETITION);
    run_cases::<f16, bf16>("gpu_w4a16_competition_shapes", &cases, 0x4A1, Tolerance::COMPETITION);
}

/// 60 random problems with tails, half full-range; and the decode shapes scaled down in K.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_random_and_decode_shapes() {
    let mut all = cases::random(&RandomShapes {
        seed: 0x4A16_0001,
        count: 60,
        max_groups: 16,
        empty_one_in: 8,
        m: Multiples::new(0, 1, 400),
        n: Multiples::new(8, 8, 4096),
        k: Multiples::new(64, 64, 4096),
        wide: None,
        max_work: 2 << 30,
    });
    let z = cases::z;
    for shapes in [
        z(&[4; 64], &[7168; 64], &[256; 64]),
        z(&[1, 2, 3, 4, 5, 6, 7, 8], &[7168; 8], &[2048; 8]),
        z(&[16; 4], &[4096; 4], &[1088; 4]),
    ] {
        all.push((shapes.clone(), InputDistribution::Competition));
        all.push((shapes, InputDistribution::FullRange));
    }
    run_cases::<f16, f16>("gpu_w4a16_random_and_decode_shapes", &all, 0x4A2, Tolerance::COMPETITION);
    run_cases::<f16, bf16>("gpu_w4a16_random_and_decode_shapes", &all, 0x4A2, Tolerance::COMPETITION);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_bf16_output() {
    let cases: Vec<_> = cases::competition()[..4].iter().map(|s| (s.clone(), InputDistribution::Competition)).collect();
    run_cases::<bf16, f16>("gpu_w4a16_bf16_output", &cases, 0x4A3, BF16_TOLERANCE);
    run_cases::<bf16, bf16>("gpu_w4a16_bf16_output", &cases, 0x4A3, BF16_TOLERANCE);
}

/// Activations of another type than the plan's are a typed error; a buffer of the wrong size, a
/// wrong output type or a non-finite alpha is a typed error naming the group, with nothing
/// launched.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_errors() {
    let test = "gpu_w4a16_errors";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let groups = make_groups(&cases::z(&[20, 3], &[64, 128], &[128, 256]), InputDistribution::Competition, 9);
    let p = problem(&groups, OutputType::F16, Activations::F16);
    let mut plan = GemmPlan::new(&gpu, p.clone()).unwrap();
    let ops: Vec<DeviceOperands> = groups.iter().map(|g| upload(&stream, g)).collect();
    {
        let bf16_ops: Vec<DeviceOperands<bf16>> = groups.iter().map(|g| upload(&stream, g)).collect();
        let mut cs: Vec<CudaSlice<f16>> = groups.iter().map(|g| stream.alloc_zeros(g.m() * g.n()).unwrap()).collect();
        let mut args: Vec<GroupArgs> = bf16_ops
            .iter()
            .zip(cs.iter_mut())
            .map(|(o, c)| GroupArgs {
                a: TokenOperand::Bf16(&o.activations),
                b: Nvfp4Operand { values: &o.values, scales: &o.scales },
                c: nvfp4_gemm::Output::F16(c),
                alpha: 1.0,
            })
            .collect();
        let e = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(e, Error::InvalidGroup { group: 0, field: "activations", .. }), "{e}");
    }
    let mut cs: Vec<CudaSlice<f16>> = groups.iter().map(|g| stream.alloc_zeros(g.m() * g.n()).unwrap()).collect();
    let mut short = stream.alloc_zeros::<f16>(3 * 128 - 1).unwrap();
    let mut wrong_type = stream.alloc_zeros::<bf16>(3 * 128).unwrap();
    let expect_group_error = |field: &str, err: Error| match err {
        Error::InvalidGroup { group: 1, field: f, .. } => assert_eq!(f, field),
        other => panic!("{field}: {other:?}"),
    };
    for (field, which) in [("c", 0), ("c", 1), ("alpha", 2), ("activations", 3)] {
        let (c0, rest) = cs.split_at_mut(1);
        let mut args = vec![
            GroupArgs {
                a: TokenOperand::F16(&ops[0].activations),
                b: Nvfp4Operand { values: &ops[0].values, scales: &ops[0].scales },
                c: nvfp4_gemm::Output::F16(&mut c0[0]),
                alpha: 1.0,
            },
            GroupArgs {
                a: TokenOperand::F16(if which == 3 { &ops[0].activations } else { &ops[1].activations }),
                b: Nvfp4Operand { values: &ops[1].values, scales: &ops[1].scales },
                c: match which {
                    0 => nvfp4_gemm::Output::F16(&mut short),
                    1 => nvfp4_gemm::Output::Bf16(&mut wrong_type),
                    _ => nvfp4_gemm::Output::F16(&mut rest[0]),
                },
                alpha: if which == 2 { f32::NAN } else { 1.0 },
            },
        ];
        expect_group_error(field, plan.run(&stream, &mut args).unwrap_err());
    }
    stream.synchronize().unwrap();
    for c in &cs {
        assert!(stream.clone_dtoh(c).unwrap().iter().all(|x| x.to_bits() == 0), "nothing was launched");
    }
}

/// `run_stacked`: every group's activations, prepacked weights and C in one buffer each (empty
/// groups included) writes bit for bit what `run` writes with separate buffers, within the
/// reference's tolerance, and nothing outside C's parts; a second call (tables reused) too; an
/// activations buffer one element short and a wrong alpha count are typed errors that write
/// nothing.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_stacked() {
    use nvfp4_gemm_tests::GUARD;
    let test = "gpu_w4a16_stacked";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let z = cases::z;
    let cases = [
        z(&[0, 24, 4, 130, 1], &[256, 136, 512, 264, 8], &[512, 192, 256, 448, 64]),
        z(&[1, 2, 3, 4, 5, 6, 7, 8], &[1024; 8], &[512; 8]),
        z(&[80, 176, 0, 40], &[512; 4], &[1024; 4]),
    ];
    let poison = f16::from_bits(nvfp4_gemm_tests::POISON);
    for (i, shapes) in cases.iter().enumerate() {
        let groups = make_groups(shapes, InputDistribution::Competition, 0x4A5 + i as u64);
        let p = problem(&groups, OutputType::F16, Activations::F16);
        let mut plan = GemmPlan::new(&gpu, p.clone()).unwrap();
        let total = p.stacked_offsets()[groups.len()];
        let act: Vec<f16> = groups.iter().flat_map(|g| g.a.dequantize_block_scaled_f16()).collect();
        let packed: Vec<_> = groups.iter().map(|g| prepack(&g.b, Activations::F16).unwrap()).collect();
        let cat = |part: fn(&nvfp4_gemm::w4a16::W4a16Weights) -> &[u8]| -> CudaSlice<u8> {
            stream.clone_htod(&packed.iter().flat_map(part).copied().collect::<Vec<u8>>()).unwrap()
        };
        let (values, scales) = (cat(|w| &w.values), cat(|w| &w.scales));
        assert_eq!([act.len(), values.len(), scales.len()], [total.a_values, total.b_values, total.b_scales]);
        let act = stream.clone_htod(&act).unwrap();
        let alphas: Vec<f32> = groups.iter().map(|g| g.effective_alpha_f32()).collect();
        let mut c = stream.alloc_zeros::<f16>(total.c_elements + 2 * GUARD).unwrap();
        let stacked = |plan: &mut GemmPlan, c: &mut CudaSlice<f16>, short: bool, alphas: &[f32]| {
            stream.memcpy_htod(&vec![poison; c.len()], c).unwrap();
            let x = act.slice(..act.len() - usize::from(short));
            let mut view = c.slice_mut(GUARD..GUARD + total.c_elements);
            let mut args = StackedArgs {
                a: TokenOperand::F16(&x),
                b: Nvfp4Operand { values: &values, scales: &scales },
                c: nvfp4_gemm::Output::F16(&mut view),
                alphas,
            };
            let r = plan.run_stacked(&stream, &mut args);
            (r, stream.clone_dtoh(c).unwrap().iter().map(|x| x.to_bits()).collect::<Vec<u16>>())
        };
        // What `run` writes with separate buffers, laid out as the stacked C.
        let ops: Vec<DeviceOperands> = groups.iter().map(|g| upload(&stream, g)).collect();
        let mut cs: Vec<CudaSlice<f16>> =
            groups.iter().map(|g| stream.clone_htod(&vec![poison; (g.m() * g.n()).max(16)]).unwrap()).collect();
        {
            let mut views: Vec<_> = cs.iter_mut().zip(&groups).map(|(c, g)| c.slice_mut(..g.m() * g.n())).collect();
            let mut args: Vec<GroupArgs> = ops
                .iter()
                .zip(views.iter_mut())
                .zip(&alphas)
                .map(|((o, c), &alpha)| GroupArgs {
                    a: TokenOperand::F16(&o.activations),
                    b: Nvfp4Operand { values: &o.values, scales: &o.scales },
                    c: nvfp4_gemm::Output::F16(c),
                    alpha,
                })
                .collect();
            GemmPlan::new(&gpu, p.clone()).unwrap().run(&stream, &mut args).unwrap();
        }
        let mut want = vec![nvfp4_gemm_tests::POISON; GUARD];
        for (c, g) in cs.iter().zip(&groups) {
            want.extend(stream.clone_dtoh(c).unwrap()[..g.m() * g.n()].iter().map(|x| x.to_bits()));
        }
        want.extend(vec![nvfp4_gemm_tests::POISON; GUARD]);
        for call in 0..2 {
            let (r, got) = stacked(&mut plan, &mut c, false, &alphas);
            r.unwrap();
            assert!(got == want, "case {i} call {call}: run_stacked differs from run (or wrote a guard)");
        }
        let at = p.stacked_offsets();
        let got: Vec<Vec<f16>> = at
            .windows(2)
            .map(|w| {
                want[GUARD + w[0].c_elements..GUARD + w[1].c_elements].iter().map(|&b| f16::from_bits(b)).collect()
            })
            .collect();
        let reference = nvfp4_format::reference_grouped_gemm(&groups).unwrap();
        let cmp = nvfp4_format::compare(&got, &reference, Tolerance::COMPETITION).unwrap();
        println!("CASE {test}[{i}] {cmp}");
        assert!(cmp.passed(), "case {i}: {cmp}");
        let (r, got) = stacked(&mut plan, &mut c, true, &alphas);
        assert!(matches!(r, Err(Error::InvalidArgument { field: "activations", .. })), "{r:?}");
        assert!(got.iter().all(|&b| b == nvfp4_gemm_tests::POISON), "case {i}: a refused call wrote C");
        let (r, _) = stacked(&mut plan, &mut c, false, &alphas[1..]);
        assert!(matches!(r, Err(Error::InvalidArgument { field: "alphas", .. })), "{r:?}");
    }
}

/// Every e2m1 code times every e4m3 scale (negative, zero and subnormal ones included; NaN
/// left out) through the decoders on the GPU, f16 and bf16 activations: B has one row per scale
/// byte (every block of row `n` has scale byte `n`) and code `c % 16` in column `c`; A is the
/// identity (64 tokens, K = 64), so C[t][n] is B's element (n, t), which must be exactly
/// `code · scale` (exact in f16: magnitudes 2⁻¹⁰..2688). With bf16 activations the code 0.5
/// decodes to the subnormal bf16 2⁻¹²⁷ before its multiplication (docs/w4a16.md §2): a flush to
/// zero would show here as 0 in place of `0.5 · scale`.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_every_code_times_every_scale() {
    use nvfp4_format::codec::{e2m1_to_f32, e4m3_to_f32};
    use nvfp4_format::layout::blocked_offset;
    use nvfp4_format::Nvfp4Matrix;
    let test = "gpu_w4a16_every_code_times_every_scale";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let (n, k, m) = (256usize, 64usize, 64usize);
    let scale_of = |row: usize| if row & 0x7F == 0x7F { 0x38u8 } else { row as u8 };
    let mut b = Nvfp4Matrix::zeros(n, k).unwrap();
    for row in 0..n {
        for j in 0..k / 16 {
            b.scales_mut()[blocked_offset(row, j, k)] = scale_of(row);
        }
        for c in 0..k / 2 {
            b.values_mut()[row * k / 2 + c] = ((2 * c % 16) | ((2 * c + 1) % 16) << 4) as u8;
        }
    }
    let want: Vec<f64> = (0..m * n)
        .map(|i| {
            let (t, row) = (i / n, i % n);
            let (code, scale) = (e2m1_to_f32((t % 16) as u8) as f64, e4m3_to_f32(scale_of(row)) as f64);
            code * scale
        })
        .collect();
    fn run<A: Activation16>(gpu: &Gpu, stream: &Arc<CudaStream>, b: &nvfp4_format::Nvfp4Matrix, m: usize) -> Vec<f16> {
        let (n, k) = (b.rows(), b.k());
        // The identity as NVFP4: code 2 (1.0) on the diagonal, every block scale 1.0 (0x38).
        let mut a = nvfp4_format::Nvfp4Matrix::zeros(m, k).unwrap();
        for t in 0..m {
            for j in 0..k / 16 {
                a.scales_mut()[nvfp4_format::layout::blocked_offset(t, j, k)] = 0x38;
            }
            a.values_mut()[t * k / 2 + t / 2] = 2 << (4 * (t % 2));
        }
        let x = stream.clone_htod(&A::block_scaled(&a)).unwrap();
        let w = prepack(b, A::KIND).unwrap();
        let (values, scales) = (stream.clone_htod(&w.values).unwrap(), stream.clone_htod(&w.scales).unwrap());
        let mut c = stream.alloc_zeros::<f16>(m * n).unwrap();
        let p =
            Problem::with_tokens(vec![GroupShape::new(m, n, k)], OutputType::F16, TokenKind::Dense(A::KIND)).unwrap();
        let mut plan = GemmPlan::new(gpu, p).unwrap();
        let mut args = [GroupArgs {
            a: A::tokens(&x),
            b: Nvfp4Operand { values: &values, scales: &scales },
            c: nvfp4_gemm::Output::F16(&mut c),
            alpha: 1.0,
        }];
        plan.run(stream, &mut args).unwrap();
        stream.clone_dtoh(&c).unwrap()
    }
    for (kind, got) in [("f16", run::<f16>(&gpu, &stream, &b, m)), ("bf16", run::<bf16>(&gpu, &stream, &b, m))] {
        let bad: Vec<String> = got
            .iter()
            .zip(&want)
            .enumerate()
            .filter(|(_, (g, w))| g.to_f64() != **w)
            .map(|(i, (g, w))| format!("token {} scale byte {:#04x}: got {g} want {w}", i / n, i % n))
            .collect();
        println!("CASE {test} {kind}: {} of {} exact", want.len() - bad.len(), want.len());
        assert!(bad.is_empty(), "{kind} activations, {} wrong:\n{}", bad.len(), bad[..bad.len().min(8)].join("\n"));
    }
}
