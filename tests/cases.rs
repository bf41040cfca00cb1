//! The problem lists, the random-problem generator and the test bodies both architectures' GPU
//! tests share.

use crate::{gpu_or_skip, make_groups, run_case, OutputElement};
use half::{bf16, f16};
use nvfp4_format::{GroupShape, InputDistribution, SplitMix64, Tolerance};
use nvfp4_gemm::Arch;

/// Both input distributions.
pub const DISTS: [InputDistribution; 2] = [InputDistribution::Competition, InputDistribution::FullRange];

/// The bf16 check: one rounding to 8 significant bits (rtol 4e-3), atol as the competition's.
pub const BF16_TOLERANCE: Tolerance = Tolerance::new(1e-3, 4e-3);

/// Groups from per-group lists of M, N and K.
pub fn z(m: &[usize], n: &[usize], k: &[usize]) -> Vec<GroupShape> {
    GroupShape::zip(m, n, k).unwrap()
}

/// The competition's 10 test shapes and one with K = 128 and 384
/// (`nvfp4_format::generate::shapes::COMPETITION`).
pub fn competition() -> Vec<Vec<GroupShape>> {
    nvfp4_format::generate::shapes::competition()
}

/// The 4 benchmark shapes.
pub fn benchmark() -> Vec<Vec<GroupShape>> {
    use nvfp4_format::generate::shapes::*;
    vec![B0.to_vec(), B1.to_vec(), B2.to_vec(), B3.to_vec()]
}

/// Each case once per input distribution.
pub fn with_dists(cases: Vec<Vec<GroupShape>>) -> Vec<(Vec<GroupShape>, InputDistribution)> {
    cases.into_iter().flat_map(|c| DISTS.map(|d| (c.clone(), d))).collect()
}

/// The values `min, min + step, …, max`, drawn uniformly.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Multiples {
    /// Smallest value.
    pub min: usize,
    /// Distance between values (at least 1).
    pub step: usize,
    /// Largest value (`min` plus a multiple of `step`).
    pub max: usize,
}

impl Multiples {
    /// `min..=max` in steps of `step`.
    pub const fn new(min: usize, step: usize, max: usize) -> Self {
        Self { min, step, max }
    }

    fn draw(&self, rng: &mut SplitMix64) -> usize {
        self.min + self.step * rng.below(((self.max - self.min) / self.step + 1) as u64) as usize
    }
}

/// Groups of a second kind, drawn with probability `1 / one_in` (to reach a kernel path the
/// common sizes rarely do).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wide {
    /// One group in `one_in` is of this kind.
    pub one_in: u64,
    /// Its N.
    pub n: Multiples,
    /// Its K.
    pub k: Multiples,
}

/// The constraints of [`random`]. Per group, in this order: empty (M = 0) with probability
/// `1 / empty_one_in`, otherwise M from `m`; then, with `wide`, whether the group is wide; then N
/// and K from `n` and `k` (or from the wide ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RandomShapes {
    /// Seed of the generator.
    pub seed: u64,
    /// Problems to draw.
    pub count: usize,
    /// Groups per problem, drawn from `1..=max_groups`.
    pub max_groups: usize,
    /// One group in `empty_one_in` has M = 0.
    pub empty_one_in: u64,
    /// M of the other groups.
    pub m: Multiples,
    /// N of a group.
    pub n: Multiples,
    /// K of a group.
    pub k: Multiples,
    /// Optionally, a second kind of group with its own N and K.
    pub wide: Option<Wide>,
    /// Most Σ m·n·k of a problem (keeps the CPU reference fast); a problem above it is dropped
    /// and another one drawn.
    pub max_work: usize,
}

/// `c.count` seeded random problems under the constraints `c`, alternating the two input
/// distributions ([`DISTS`]).
pub fn random(c: &RandomShapes) -> Vec<(Vec<GroupShape>, InputDistribution)> {
    let mut rng = SplitMix64::new(c.seed);
    let mut cases = vec![];
    while cases.len() < c.count {
        let g = 1 + rng.below(c.max_groups as u64) as usize;
        let shapes: Vec<GroupShape> = (0..g)
            .map(|_| {
                let m = if rng.below(c.empty_one_in) == 0 { 0 } else { c.m.draw(&mut rng) };
                let (n, k) = match c.wide {
                    Some(w) if rng.below(w.one_in) == 0 => (w.n, w.k),
                    _ => (c.n, c.k),
                };
                let n = n.draw(&mut rng);
                let k = k.draw(&mut rng);
                GroupShape::new(m, n, k)
            })
            .collect();
        let work: usize = shapes.iter().map(|s| s.m * s.n * s.k).sum();
        if work <= c.max_work {
            cases.push((shapes, DISTS[cases.len() % 2]));
        }
    }
    cases
}

/// Runs every case on GPU 0 with output type `T` and tolerance `tol` (skipping with a printed
/// reason unless the GPU is `arch`); full-range cases also get the fp32-accumulation allowance.
/// Prints one `CASE` line each (with the first mismatching elements of a failing one) and fails
/// listing every failing case.
pub fn run_cases<T: OutputElement>(
    test: &str,
    arch: Arch,
    cases: &[(Vec<GroupShape>, InputDistribution)],
    seed: u64,
    tol: Tolerance,
) {
    let Some(gpu) = gpu_or_skip(test, arch) else { return };
    let stream = gpu.context().default_stream();
    let mut failures = vec![];
    for (i, (shapes, dist)) in cases.iter().enumerate() {
        let dist = *dist;
        let groups = make_groups(shapes, dist, seed + i as u64);
        let r = run_case::<T>(&gpu, &stream, &groups, tol, dist == InputDistribution::FullRange);
        let dims: Vec<(usize, usize, usize)> = shapes.iter().map(|s| (s.m, s.n, s.k)).collect();
        let line = format!("CASE {test}[{i}] {:?} {dist:?} groups(m,n,k)={dims:?} {r}", T::TYPE);
        println!("{line}");
        if !r.passed() {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
}

/// fp16 output, atol = rtol = 1e-3 ([`run_cases`]).
pub fn run_all(test: &str, arch: Arch, cases: &[(Vec<GroupShape>, InputDistribution)], seed: u64) {
    run_cases::<f16>(test, arch, cases, seed, Tolerance::COMPETITION);
}

/// bf16 output on the competition's distribution, against the bf16 reference with
/// [`BF16_TOLERANCE`] ([`run_cases`]: guards, poison and determinism as for fp16).
pub fn run_bf16(test: &str, arch: Arch, shape_lists: &[Vec<GroupShape>], seed: u64) {
    let cases: Vec<_> = shape_lists.iter().map(|s| (s.clone(), InputDistribution::Competition)).collect();
    run_cases::<bf16>(test, arch, &cases, seed, BF16_TOLERANCE);
}

/// M = 0 groups are skipped, a problem of no groups or of only such groups runs and writes
/// nothing, and a buffer of the wrong size or type is a typed error with C left untouched.
pub fn empty_groups_and_bad_buffers(test: &str, arch: Arch) {
    use nvfp4_gemm::{DeviceNvfp4, Error, GemmPlan, GroupArgs, Output, OutputType, Problem};
    let Some(gpu) = gpu_or_skip(test, arch) else { return };
    let stream = gpu.context().default_stream();
    let mut none = GemmPlan::new(&gpu, Problem::new(vec![], OutputType::F16).unwrap()).unwrap();
    none.run(&stream, &mut []).unwrap();

    let shapes = vec![GroupShape::new(0, 256, 512), GroupShape::new(24, 136, 192)];
    let groups = make_groups(&shapes, InputDistribution::Competition, 5);
    let dev: Vec<_> = groups
        .iter()
        .map(|g| (DeviceNvfp4::upload(&stream, &g.a).unwrap(), DeviceNvfp4::upload(&stream, &g.b).unwrap()))
        .collect();
    let poison = f16::from_bits(crate::POISON);
    let untouched =
        |c: &cudarc::driver::CudaSlice<f16>| stream.clone_dtoh(c).unwrap().iter().all(|x| x.to_bits() == crate::POISON);
    let mut c0 = stream.clone_htod(&[poison; 16]).unwrap();
    let mut c1 = stream.clone_htod(&vec![poison; 24 * 136]).unwrap();

    // Only the empty group: nothing to do, nothing written.
    let mut empty = GemmPlan::new(&gpu, Problem::new(vec![shapes[0]], OutputType::F16).unwrap()).unwrap();
    let mut args =
        vec![GroupArgs { a: dev[0].0.operand().into(), b: dev[0].1.operand(), c: Output::F16(&mut c0), alpha: 1.0 }];
    empty.run(&stream, &mut args).unwrap();
    drop(args);
    stream.synchronize().unwrap();
    assert!(untouched(&c0), "an empty group's C was written");

    let mut plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::F16).unwrap()).unwrap();
    // Wrong: group 1's C one row short.
    let mut short = stream.clone_htod(&vec![poison; 23 * 136]).unwrap();
    {
        let mut args = vec![
            GroupArgs { a: dev[0].0.operand().into(), b: dev[0].1.operand(), c: Output::F16(&mut c0), alpha: 1.0 },
            GroupArgs { a: dev[1].0.operand().into(), b: dev[1].1.operand(), c: Output::F16(&mut short), alpha: 1.0 },
        ];
        let err = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(err, Error::InvalidGroup { group: 1, field: "c", .. }), "{err}");
    }
    stream.synchronize().unwrap();
    assert!(untouched(&short), "C written despite the error");
    // Wrong: group 1's C is bf16 in an fp16 problem.
    let mut wrong_type = stream.clone_htod(&vec![bf16::from_bits(crate::POISON); 24 * 136]).unwrap();
    {
        let mut args = vec![
            GroupArgs { a: dev[0].0.operand().into(), b: dev[0].1.operand(), c: Output::F16(&mut c0), alpha: 1.0 },
            GroupArgs {
                a: dev[1].0.operand().into(),
                b: dev[1].1.operand(),
                c: Output::Bf16(&mut wrong_type),
                alpha: 1.0,
            },
        ];
        let err = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(err, Error::InvalidGroup { group: 1, field: "c", .. }), "{err}");
    }
    // Wrong: group 1's B values one byte short.
    let short_b = stream.clone_htod(&groups[1].b.values()[1..]).unwrap();
    {
        let b = nvfp4_gemm::Nvfp4Operand { values: &short_b, scales: &dev[1].1.scales };
        let mut args = vec![
            GroupArgs { a: dev[0].0.operand().into(), b: dev[0].1.operand(), c: Output::F16(&mut c0), alpha: 1.0 },
            GroupArgs { a: dev[1].0.operand().into(), b, c: Output::F16(&mut c1), alpha: 1.0 },
        ];
        let err = plan.run(&stream, &mut args).unwrap_err();
        assert!(matches!(err, Error::InvalidGroup { group: 1, field: "b.values", .. }), "{err}");
    }
    stream.synchronize().unwrap();
    assert!(untouched(&c1), "C written despite the error");
    assert!(untouched(&c0), "an empty group's C was written");
    {
        let mut args = vec![
            GroupArgs { a: dev[0].0.operand().into(), b: dev[0].1.operand(), c: Output::F16(&mut c0), alpha: 1.0 },
            GroupArgs { a: dev[1].0.operand().into(), b: dev[1].1.operand(), c: Output::F16(&mut c1), alpha: 1.0 },
        ];
        plan.run(&stream, &mut args).unwrap();
    }
    stream.synchronize().unwrap();
    assert!(untouched(&c0), "an empty group's C was written");
    let got = vec![stream.clone_dtoh(&c0).unwrap()[..0].to_vec(), stream.clone_dtoh(&c1).unwrap()];
    let cmp =
        nvfp4_format::compare(&got, &nvfp4_format::reference_grouped_gemm(&groups).unwrap(), Tolerance::COMPETITION)
            .unwrap();
    println!("CASE {test} {cmp}");
    assert!(cmp.passed(), "{cmp}");
}

/// [`nvfp4_gemm::GemmPlan::run_stacked`]: every group's operands and C in one buffer each (C
/// between poisoned guards). The output equals, bit for bit, what [`nvfp4_gemm::GemmPlan::run`]
/// writes with each group's buffers separate, matches the reference, and nothing outside C's
/// parts is written; a second call (the plan's cached path) and a call with other alphas agree
/// with `run` too; a buffer one byte short and a wrong alpha count are typed errors that write
/// nothing.
pub fn stacked_buffers(test: &str, arch: Arch) {
    use crate::GUARD;
    use cudarc::driver::CudaSlice;
    use nvfp4_gemm::{DeviceGroup, Error, GemmPlan, GroupArgs, Nvfp4Operand, Output, OutputType, Problem, StackedArgs};
    let Some(gpu) = gpu_or_skip(test, arch) else { return };
    let stream = gpu.context().default_stream();
    let cases = [
        z(&[0, 24, 4, 130, 1], &[256, 136, 512, 264, 8], &[512, 192, 256, 448, 64]),
        z(&[1, 2, 3, 4, 5, 6, 7, 8], &[1024; 8], &[512; 8]),
        z(&[80, 176, 0, 40], &[512; 4], &[1024; 4]),
    ];
    for (i, shapes) in cases.iter().enumerate() {
        let groups = make_groups(shapes, InputDistribution::Competition, 70 + i as u64);
        let problem = Problem::new(shapes.clone(), OutputType::F16).unwrap();
        let total = problem.stacked_offsets()[shapes.len()];
        let cat = |part: fn(&nvfp4_format::Group) -> &[u8]| -> CudaSlice<u8> {
            let bytes: Vec<u8> = groups.iter().flat_map(part).copied().collect();
            stream.clone_htod(&bytes).unwrap()
        };
        let (a_values, a_scales) = (cat(|g| g.a.values()), cat(|g| g.a.scales()));
        let (b_values, b_scales) = (cat(|g| g.b.values()), cat(|g| g.b.scales()));
        assert_eq!(
            [a_values.len(), a_scales.len(), b_values.len(), b_scales.len()],
            [total.a_values, total.a_scales, total.b_values, total.b_scales]
        );
        let poison = f16::from_bits(crate::POISON);
        let mut c = stream.clone_htod(&vec![poison; total.c_elements + 2 * GUARD]).unwrap();
        let mut alphas: Vec<f32> = groups.iter().map(|g| g.effective_alpha_f32()).collect();
        let mut plan = GemmPlan::new(&gpu, problem.clone()).unwrap();
        let stacked = |plan: &mut GemmPlan, c: &mut CudaSlice<f16>, alphas: &[f32], short: bool| {
            stream.memcpy_htod(&vec![poison; c.len()], c).unwrap();
            let values = a_values.slice(..a_values.len() - usize::from(short));
            let mut view = c.slice_mut(GUARD..GUARD + total.c_elements);
            let mut args = StackedArgs {
                a: Nvfp4Operand { values: &values, scales: &a_scales }.into(),
                b: Nvfp4Operand { values: &b_values, scales: &b_scales },
                c: Output::F16(&mut view),
                alphas,
            };
            let r = plan.run_stacked(&stream, &mut args);
            (r, stream.clone_dtoh(c).unwrap().iter().map(|x| x.to_bits()).collect::<Vec<u16>>())
        };
        // What `run` writes with separate buffers, laid out as the stacked C.
        let separate = |alphas: &[f32]| -> Vec<u16> {
            let dev: Vec<DeviceGroup> = groups.iter().map(|g| DeviceGroup::upload(&stream, g).unwrap()).collect();
            let mut cs: Vec<CudaSlice<f16>> = shapes
                .iter()
                .map(|s| stream.clone_htod(&vec![poison; if s.m == 0 { 16 } else { s.m * s.n }]).unwrap())
                .collect();
            let mut args: Vec<GroupArgs> = dev
                .iter()
                .zip(cs.iter_mut())
                .zip(alphas)
                .map(|((d, c), &alpha)| GroupArgs { alpha, ..d.args(Output::F16(c)) })
                .collect();
            GemmPlan::new(&gpu, problem.clone()).unwrap().run(&stream, &mut args).unwrap();
            drop(args);
            let mut out = vec![crate::POISON; GUARD];
            for (c, s) in cs.iter().zip(shapes) {
                out.extend(stream.clone_dtoh(c).unwrap()[..s.m * s.n].iter().map(|x| x.to_bits()));
            }
            out.extend(vec![crate::POISON; GUARD]);
            out
        };
        let want = separate(&alphas);
        for call in 0..2 {
            let (r, got) = stacked(&mut plan, &mut c, &alphas, false);
            r.unwrap();
            assert!(got == want, "case {i} call {call}: run_stacked differs from run (or wrote a guard)");
        }
        let got: Vec<Vec<f16>> = problem
            .stacked_offsets()
            .windows(2)
            .map(|w| {
                want[GUARD + w[0].c_elements..GUARD + w[1].c_elements].iter().map(|&b| f16::from_bits(b)).collect()
            })
            .collect();
        let cmp = nvfp4_format::compare(
            &got,
            &nvfp4_format::reference_grouped_gemm(&groups).unwrap(),
            Tolerance::COMPETITION,
        )
        .unwrap();
        println!("CASE {test}[{i}] {cmp}");
        assert!(cmp.passed(), "case {i}: {cmp}");
        alphas.iter_mut().enumerate().for_each(|(g, a)| *a *= if g % 2 == 0 { 0.5 } else { -2.0 });
        let (r, got) = stacked(&mut plan, &mut c, &alphas, false);
        r.unwrap();
        assert!(got == separate(&alphas), "case {i}: other alphas: run_stacked differs from run");
        let untouched = |got: &[u16]| got.iter().all(|&b| b == crate::POISON);
        let (r, got) = stacked(&mut plan, &mut c, &alphas, true);
        assert!(matches!(r, Err(Error::InvalidArgument { field: "a.values", .. })), "{r:?}");
        assert!(untouched(&got), "case {i}: C written despite a short buffer");
        let (r, got) = stacked(&mut plan, &mut c, &alphas[1..], false);
        assert!(matches!(r, Err(Error::InvalidArgument { field: "alphas", .. })), "{r:?}");
        assert!(untouched(&got), "case {i}: C written despite a wrong alpha count");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const C: RandomShapes = RandomShapes {
        seed: 7,
        count: 300,
        max_groups: 5,
        empty_one_in: 4,
        m: Multiples::new(0, 1, 16),
        n: Multiples::new(8, 8, 256),
        k: Multiples::new(64, 64, 512),
        wide: Some(Wide { one_in: 3, n: Multiples::new(4096, 256, 8192), k: Multiples::new(2048, 64, 4096) }),
        max_work: 2 << 30,
    };

    #[test]
    fn random_problems_keep_their_constraints() {
        let cases = random(&C);
        assert_eq!(cases.len(), 300);
        assert_eq!(cases, random(&C), "not deterministic");
        let mut seen = (0, 0, 0);
        for (i, (shapes, dist)) in cases.iter().enumerate() {
            assert_eq!(*dist, DISTS[i % 2]);
            assert!((1..=5).contains(&shapes.len()));
            assert!(shapes.iter().map(|s| s.m * s.n * s.k).sum::<usize>() <= C.max_work);
            for s in shapes {
                assert!(s.m <= 16);
                let wide = s.n >= 4096;
                let (n, k) =
                    if wide { (Multiples::new(4096, 256, 8192), Multiples::new(2048, 64, 4096)) } else { (C.n, C.k) };
                assert!(s.n >= n.min && s.n <= n.max && (s.n - n.min) % n.step == 0, "{s:?}");
                assert!(s.k >= k.min && s.k <= k.max && (s.k - k.min) % k.step == 0, "{s:?}");
                seen.0 += usize::from(s.m == 0);
                seen.1 += usize::from(wide);
                seen.2 += 1;
            }
        }
        // Empty groups about one in four (plus M = 0 drawn from `m`), wide ones about one in three.
        let (empty, wide, all) = (seen.0 as f64, seen.1 as f64, seen.2 as f64);
        assert!((0.18..0.35).contains(&(empty / all)), "{empty}/{all}");
        assert!((0.25..0.42).contains(&(wide / all)), "{wide}/{all}");
        // Without `wide`, nothing is wide.
        let narrow = random(&RandomShapes { wide: None, ..C });
        assert!(narrow.iter().flat_map(|c| &c.0).all(|s| s.n <= 256 && s.k <= 512));
    }
}
