//! W4A16 on the H200 (`nvfp4_gemm::w4a16`): f16 activations times NVFP4 weights prepacked once,
//! one GEMM launch per call (no dequantization). Each group's activations are its A with the
//! block scales applied (exact in f16; A's global scale in alpha), so every case compares with the
//! fp64 reference of the NVFP4 groups exactly as the W4A4 tests do (`run_case_with`: C and its
//! guards poisoned, two runs, bitwise determinism; fp16 atol = rtol = 1e-3, bf16 rtol 4e-3;
//! full-range inputs with the fp32-accumulation allowance). Cases: the competition's shapes, random
//! problems with tails (M = 0, M of any size, N = 8·odd, K = 64 and K % 128 = 64, up to 16 groups),
//! 64 groups of 4 tokens (the decode kernel), both input distributions, fp16 and bf16 output; the
//! stacked call (one buffer per operand) against the per-group one; and typed errors for bf16
//! activations and bad buffers.
//! Ignored unless asked for: they need an sm_90a GPU (see `nvfp4_gemm_tests`).

use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use nvfp4_format::{Group, GroupShape, InputDistribution, Tolerance};
use nvfp4_gemm::w4a16::{prepack, Activations, W4a16Args, W4a16Plan};
use nvfp4_gemm::{Arch, Error, Gpu, Nvfp4Operand, OutputType, Problem};
use nvfp4_gemm_tests::cases::{self, Multiples, RandomShapes, BF16_TOLERANCE};
use nvfp4_gemm_tests::{gpu_or_skip, make_groups, run_case_with, CaseReport, OutputElement};
use std::sync::Arc;

/// One group's W4A16 operands on the device.
struct DeviceOperands {
    activations: CudaSlice<f16>,
    values: CudaSlice<u8>,
    scales: CudaSlice<u8>,
}

/// Uploads A with its block scales applied (f16) and B prepacked for f16 activations.
fn upload(stream: &Arc<CudaStream>, g: &Group) -> DeviceOperands {
    let act = g.a.dequantize_block_scaled_f16();
    let w = prepack(&g.b, Activations::F16).expect("prepack");
    let bytes = |b: &[u8]| if b.is_empty() { stream.alloc_zeros(16) } else { stream.clone_htod(b) };
    DeviceOperands {
        activations: if act.is_empty() { stream.alloc_zeros(8).unwrap() } else { stream.clone_htod(&act).unwrap() },
        values: bytes(&w.values).unwrap(),
        scales: bytes(&w.scales).unwrap(),
    }
}

fn problem(groups: &[Group], out: OutputType) -> Problem {
    Problem::new(groups.iter().map(|g| GroupShape::new(g.m(), g.n(), g.k())).collect::<Vec<_>>(), out).unwrap()
}

/// One case through a `W4a16Plan` with output type `T`.
fn run_w4a16<T: OutputElement>(
    gpu: &Gpu,
    stream: &Arc<CudaStream>,
    groups: &[Group],
    tol: Tolerance,
    full: bool,
) -> (CaseReport, &'static str) {
    let mut plan = W4a16Plan::new(gpu, problem(groups, T::TYPE), Activations::F16).expect("plan");
    let ops: Vec<DeviceOperands> = groups.iter().map(|g| upload(stream, g)).collect();
    let report = run_case_with::<T>(stream, groups, tol, full, &mut |cs| {
        let mut args: Vec<W4a16Args> = ops
            .iter()
            .zip(cs.iter_mut())
            .zip(groups)
            .map(|((o, c), g)| W4a16Args {
                activations: &o.activations,
                weights: Nvfp4Operand { values: &o.values, scales: &o.scales },
                c: T::output(c),
                alpha: g.effective_alpha_f32(),
            })
            .collect();
        plan.run(stream, &mut args).expect("run");
    });
    (report, plan.kernel())
}

fn run_cases<T: OutputElement>(test: &str, cases: &[(Vec<GroupShape>, InputDistribution)], seed: u64, tol: Tolerance) {
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let mut failures = vec![];
    for (i, (shapes, dist)) in cases.iter().enumerate() {
        let groups = make_groups(shapes, *dist, seed + i as u64);
        let (r, kernel) = run_w4a16::<T>(&gpu, &stream, &groups, tol, *dist == InputDistribution::FullRange);
        let dims: Vec<(usize, usize, usize)> = shapes.iter().map(|s| (s.m, s.n, s.k)).collect();
        let line = format!("CASE {test}[{i}] {:?} {dist:?} {kernel} groups(m,n,k)={dims:?} {r}", T::TYPE);
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
    run_cases::<f16>(
        "gpu_w4a16_competition_shapes",
        &cases::with_dists(cases::competition()),
        0x4A1,
        Tolerance::COMPETITION,
    );
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
    run_cases::<f16>("gpu_w4a16_random_and_decode_shapes", &all, 0x4A2, Tolerance::COMPETITION);
}

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_bf16_output() {
    let cases: Vec<_> = cases::competition()[..4].iter().map(|s| (s.clone(), InputDistribution::Competition)).collect();
    run_cases::<bf16>("gpu_w4a16_bf16_output", &cases, 0x4A3, BF16_TOLERANCE);
}

/// bf16 activations (not built) and sm_100a are `Unsupported`; a buffer of the wrong size, a
/// wrong output type or a non-finite alpha is a typed error naming the group, with nothing
/// launched.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_errors() {
    let test = "gpu_w4a16_errors";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let groups = make_groups(&cases::z(&[20, 3], &[64, 128], &[128, 256]), InputDistribution::Competition, 9);
    let p = problem(&groups, OutputType::F16);
    assert!(matches!(W4a16Plan::new(&gpu, p.clone(), Activations::Bf16), Err(Error::Unsupported(_))));
    let mut plan = W4a16Plan::new(&gpu, p, Activations::F16).unwrap();
    let ops: Vec<DeviceOperands> = groups.iter().map(|g| upload(&stream, g)).collect();
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
            W4a16Args {
                activations: &ops[0].activations,
                weights: Nvfp4Operand { values: &ops[0].values, scales: &ops[0].scales },
                c: nvfp4_gemm::Output::F16(&mut c0[0]),
                alpha: 1.0,
            },
            W4a16Args {
                activations: if which == 3 { &ops[0].activations } else { &ops[1].activations },
                weights: Nvfp4Operand { values: &ops[1].values, scales: &ops[1].scales },
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
    use nvfp4_gemm::w4a16::W4a16StackedArgs;
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
        let p = problem(&groups, OutputType::F16);
        let mut plan = W4a16Plan::new(&gpu, p.clone(), Activations::F16).unwrap();
        let total = plan.stacked_offsets()[groups.len()];
        let act: Vec<f16> = groups.iter().flat_map(|g| g.a.dequantize_block_scaled_f16()).collect();
        let packed: Vec<_> = groups.iter().map(|g| prepack(&g.b, Activations::F16).unwrap()).collect();
        let cat = |part: fn(&nvfp4_gemm::w4a16::W4a16Weights) -> &[u8]| -> CudaSlice<u8> {
            stream.clone_htod(&packed.iter().flat_map(part).copied().collect::<Vec<u8>>()).unwrap()
        };
        let (values, scales) = (cat(|w| &w.values), cat(|w| &w.scales));
        assert_eq!([act.len(), values.len(), scales.len()], [2 * total.a_values, total.b_values, total.b_scales]);
        let act = stream.clone_htod(&act).unwrap();
        let alphas: Vec<f32> = groups.iter().map(|g| g.effective_alpha_f32()).collect();
        let mut c = stream.alloc_zeros::<f16>(total.c_elements + 2 * GUARD).unwrap();
        let stacked = |plan: &mut W4a16Plan, c: &mut CudaSlice<f16>, short: bool, alphas: &[f32]| {
            stream.memcpy_htod(&vec![poison; c.len()], c).unwrap();
            let x = act.slice(..act.len() - usize::from(short));
            let mut view = c.slice_mut(GUARD..GUARD + total.c_elements);
            let mut args = W4a16StackedArgs {
                activations: &x,
                weights: Nvfp4Operand { values: &values, scales: &scales },
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
            let mut args: Vec<W4a16Args> = ops
                .iter()
                .zip(views.iter_mut())
                .zip(&alphas)
                .map(|((o, c), &alpha)| W4a16Args {
                    activations: &o.activations,
                    weights: Nvfp4Operand { values: &o.values, scales: &o.scales },
                    c: nvfp4_gemm::Output::F16(c),
                    alpha,
                })
                .collect();
            W4a16Plan::new(&gpu, p.clone(), Activations::F16).unwrap().run(&stream, &mut args).unwrap();
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
        let at = plan.stacked_offsets().to_vec();
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
