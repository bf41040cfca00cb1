//! One end-to-end case: upload, two poisoned runs, guards, determinism, and the comparison with the
//! CPU reference, for either output type.

use cudarc::driver::{CudaSlice, CudaStream, CudaViewMut, DevicePtrMut, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use nvfp4_format::{compare, Comparison, Element, Group, GroupOutput, GroupShape, HostFloat, Tolerance};
use nvfp4_gemm::{DeviceGroup, GemmPlan, GroupArgs, Output, OutputType, Problem};
use std::fmt;
use std::sync::Arc;

/// Bit pattern written into C (and its guards) before every run: a NaN in both fp16 and bf16, so
/// an element the kernel never wrote fails the comparison.
pub const POISON: u16 = 0x7FFF;
/// Poisoned elements before and after each C buffer, checked untouched after the run.
pub const GUARD: usize = 64;
/// Mismatching elements a [`CaseReport`] lists (the first ones, in group and index order).
const LISTED: usize = 8;

/// An output element type of the GEMM: fp16 or bf16.
pub trait OutputElement: HostFloat + DeviceRepr + ValidAsZeroBits + Unpin {
    /// The problem's output type.
    const TYPE: OutputType;
    /// The value with bit pattern `bits`.
    fn with_bits(bits: u16) -> Self;
    /// The bit pattern.
    fn bits(self) -> u16;
    /// The library's output argument for buffer `c`.
    fn output(c: &mut dyn DevicePtrMut<Self>) -> Output<'_>;
}

impl OutputElement for f16 {
    const TYPE: OutputType = OutputType::F16;
    fn with_bits(bits: u16) -> Self {
        f16::from_bits(bits)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
    fn output(c: &mut dyn DevicePtrMut<Self>) -> Output<'_> {
        Output::F16(c)
    }
}

impl OutputElement for bf16 {
    const TYPE: OutputType = OutputType::Bf16;
    fn with_bits(bits: u16) -> Self {
        bf16::from_bits(bits)
    }
    fn bits(self) -> u16 {
        self.to_bits()
    }
    fn output(c: &mut dyn DevicePtrMut<Self>) -> Output<'_> {
        Output::Bf16(c)
    }
}

/// One element that failed its check.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Mismatch {
    /// Group index.
    pub group: usize,
    /// Row-major index in the group's C.
    pub index: usize,
    /// Columns of the group's C (row = index / cols, col = index % cols).
    pub cols: usize,
    /// The kernel's value.
    pub got: f64,
    /// The reference value it was judged against: the reference rounded to the output type, or,
    /// for an element re-judged with the accumulation allowance, the exact (fp64) one.
    pub expected: f64,
    /// The largest `|got − expected|` the check accepted for this element.
    pub allowed: f64,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let cols = self.cols.max(1);
        write!(
            f,
            "group {} index {} (row {}, col {}): got {} expected {} |diff| {:.3e} > allowed {:.3e}",
            self.group,
            self.index,
            self.index / cols,
            self.index % cols,
            self.got,
            self.expected,
            (self.got - self.expected).abs(),
            self.allowed,
        )
    }
}

/// What one end-to-end case found.
pub struct CaseReport {
    /// Against the CPU reference.
    pub comparison: Comparison,
    /// Elements outside the strict tolerance that were accepted under [`accumulation_allowance`]
    /// (only for cases run with the allowance).
    pub within_allowance: usize,
    /// The first few failing elements (at most 8), each with its reference and tolerance.
    pub mismatches: Vec<Mismatch>,
    /// Guard elements around C that changed.
    pub guard_corruptions: usize,
    /// True when a second run on the same inputs gave bitwise the same C.
    pub deterministic: bool,
}

impl CaseReport {
    /// Every check passed.
    pub fn passed(&self) -> bool {
        self.comparison.passed() && self.guard_corruptions == 0 && self.deterministic
    }
}

/// `guards=… deterministic=… fp32_allowed=… <comparison>`, then one line per listed mismatch.
impl fmt::Display for CaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "guards={} deterministic={} fp32_allowed={} {}",
            self.guard_corruptions, self.deterministic, self.within_allowance, self.comparison
        )?;
        for m in &self.mismatches {
            write!(f, "\n    {m}")?;
        }
        Ok(())
    }
}

/// How far fp32 accumulation may move a result: `(K/16 + 2) · 2⁻²¹ · Σ|a_k·b_k| · |alpha|`.
///
/// wgmma adds 16 exact products at a time to an fp32 accumulator, truncating each sum to about
/// 24 bits, so each of the K/16 steps can lose ~2⁻²³ of the running sum of magnitudes; we allow 4×
/// that. With the competition's inputs every partial sum is exactly representable in fp32 (small
/// multiples of 1/64), so those cases get no such allowance and must match to atol = rtol = 1e-3
/// (in practice bit-exactly). Full-range inputs span 2⁻¹⁸..7·10⁶ per product and cancel heavily;
/// no fp32-accumulating kernel can meet a pure 1e-3 bound there.
pub fn accumulation_allowance(k: usize, abs_sum: f64) -> f64 {
    (k as f64 / 16.0 + 2.0) * (-21f64).exp2() * abs_sum
}

/// Σ|a_k·b_k|·|alpha| of every output element (what [`accumulation_allowance`] scales): the f64
/// reference on the groups with their operands' sign bits cleared and |alpha|.
pub fn abs_reference(groups: &[Group]) -> Vec<GroupOutput<f64>> {
    let abs_groups: Vec<Group> = groups
        .iter()
        .map(|g| {
            let mut g = g.clone();
            g.a.values_mut().iter_mut().for_each(|v| *v &= 0x77);
            g.b.values_mut().iter_mut().for_each(|v| *v &= 0x77);
            g.alpha = g.alpha.abs();
            g
        })
        .collect();
    nvfp4_format::reference_grouped_gemm_f64(&abs_groups).expect("abs reference")
}

/// Uploads `groups`, runs the plan twice with output type `T` (poisoning C and its guards first
/// each time), checks the guards and the determinism, and compares with the CPU reference rounded
/// to `T` under `tol`.
/// `fp32_allowance`: accept elements outside `tol` when they are within [`accumulation_allowance`]
/// of the exact reference (for inputs whose partial sums are not exact in fp32).
pub fn run_case<T: OutputElement>(
    gpu: &nvfp4_gemm::Gpu,
    stream: &Arc<CudaStream>,
    groups: &[Group],
    tol: Tolerance,
    fp32_allowance: bool,
) -> CaseReport {
    let shapes: Vec<GroupShape> = groups.iter().map(|g| GroupShape::new(g.m(), g.n(), g.k())).collect();
    let problem = Problem::new(shapes, T::TYPE).expect("valid problem");
    let mut plan = GemmPlan::new(gpu, problem).expect("plan");
    let inputs: Vec<DeviceGroup> = groups.iter().map(|g| DeviceGroup::upload(stream, g).expect("upload")).collect();
    run_case_with::<T>(stream, groups, tol, fp32_allowance, &mut |cs| {
        let mut args: Vec<GroupArgs> = inputs.iter().zip(cs.iter_mut()).map(|(d, c)| d.args(T::output(c))).collect();
        plan.run(stream, &mut args).expect("run");
    })
}

/// [`run_case`] with the GEMM given by `run`, which gets each group's C (`m · n` elements of `T`)
/// and launches on `stream` whatever computes `groups` into them.
pub fn run_case_with<T: OutputElement>(
    stream: &Arc<CudaStream>,
    groups: &[Group],
    tol: Tolerance,
    fp32_allowance: bool,
    run: &mut dyn FnMut(&mut [CudaViewMut<'_, T>]),
) -> CaseReport {
    let mut cs: Vec<CudaSlice<T>> =
        groups.iter().map(|g| stream.alloc_zeros::<T>(g.m() * g.n() + 2 * GUARD).expect("alloc C")).collect();
    let mut outputs: Vec<Vec<Vec<u16>>> = vec![];
    let mut guard_corruptions = 0;
    for _ in 0..2 {
        for c in cs.iter_mut() {
            let poison = vec![T::with_bits(POISON); c.len()];
            stream.memcpy_htod(&poison, c).expect("poison C");
        }
        {
            let mut views: Vec<_> = cs
                .iter_mut()
                .map(|c| {
                    let len = c.len() - 2 * GUARD;
                    c.slice_mut(GUARD..GUARD + len)
                })
                .collect();
            run(&mut views);
        }
        stream.synchronize().expect("synchronize");
        let mut run = vec![];
        for c in &cs {
            let host: Vec<u16> = stream.clone_dtoh(c).expect("download C").iter().map(|x| x.bits()).collect();
            let n = host.len();
            guard_corruptions += host[..GUARD].iter().chain(&host[n - GUARD..]).filter(|&&x| x != POISON).count();
            run.push(host[GUARD..n - GUARD].to_vec());
        }
        outputs.push(run);
    }
    let deterministic = outputs[0] == outputs[1];
    let got: Vec<Vec<T>> = outputs[0].iter().map(|g| g.iter().map(|&b| T::with_bits(b)).collect()).collect();
    let exact = nvfp4_format::reference_grouped_gemm_f64(groups).expect("f64 reference");
    let expected: Vec<GroupOutput<T>> = exact.iter().map(GroupOutput::rounded).collect();
    let mut comparison = compare(&got, &expected, tol).expect("compare");
    let abs = fp32_allowance.then(|| abs_reference(groups));
    let mut mismatches = vec![];
    let (mut failed, mut worst): (usize, Option<Element>) = (0, None);
    if abs.is_some() || !comparison.passed() {
        for (gi, (g, (e, q))) in got.iter().zip(exact.iter().zip(&expected)).enumerate() {
            let k = groups[gi].k();
            for (idx, (x, (r, q))) in g.iter().zip(e.data.iter().zip(&q.data)).enumerate() {
                let x = x.to_f64();
                let mismatch = |expected: f64, allowed: f64| Mismatch {
                    group: gi,
                    index: idx,
                    cols: e.cols,
                    got: x,
                    expected,
                    allowed,
                };
                match &abs {
                    // Strictly-failing elements are re-judged with the accumulation allowance; a
                    // NaN or an error beyond it fails.
                    Some(abs) if !tol.accepts(x, *r) => {
                        let err = (x - r).abs();
                        let allowed = tol.atol + tol.rtol * r.abs() + accumulation_allowance(k, abs[gi].data[idx]);
                        if x.is_nan() || err > allowed {
                            failed += 1;
                            let excess = err / allowed;
                            if worst.is_none_or(|w| excess > w.excess) {
                                let (row, col) = (idx / e.cols, idx % e.cols);
                                worst = Some(Element { group: gi, row, col, got: x, expected: *r, excess });
                            }
                            if mismatches.len() < LISTED {
                                mismatches.push(mismatch(*r, allowed));
                            }
                        }
                    }
                    Some(_) => {}
                    None => {
                        let q = q.to_f64();
                        if !tol.accepts(x, q) && mismatches.len() < LISTED {
                            mismatches.push(mismatch(q, tol.atol + tol.rtol * q.abs()));
                        }
                    }
                }
            }
        }
    }
    let within_allowance = if fp32_allowance { comparison.failed - failed } else { 0 };
    if fp32_allowance && !comparison.passed() {
        comparison.failed = failed;
        comparison.worst = worst;
    }
    CaseReport { comparison, within_allowance, mismatches, guard_corruptions, deterministic }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_case_lists_its_elements_with_the_tolerance() {
        let m = Mismatch { group: 2, index: 130, cols: 128, got: 1.5, expected: 1.25, allowed: 2.25e-3 };
        let text = m.to_string();
        assert_eq!(text, "group 2 index 130 (row 1, col 2): got 1.5 expected 1.25 |diff| 2.500e-1 > allowed 2.250e-3");
        let comparison =
            compare(&[vec![1.5f32]], &[GroupOutput { rows: 1, cols: 1, data: vec![1.25f32] }], Tolerance::COMPETITION)
                .unwrap();
        let r = CaseReport {
            comparison,
            within_allowance: 0,
            mismatches: vec![m],
            guard_corruptions: 0,
            deterministic: true,
        };
        assert!(!r.passed());
        let text = r.to_string();
        assert!(text.starts_with("guards=0 deterministic=true fp32_allowed=0 FAIL: 1/1"), "{text}");
        assert!(text.contains("1e-3 + 1e-3*|ref|"), "{text}");
        assert!(text.ends_with(
            "\n    group 2 index 130 (row 1, col 2): got 1.5 expected 1.25 |diff| 2.500e-1 > allowed 2.250e-3"
        ));
    }
}
