//! Comparing a grouped GEMM's output with the reference.
//!
//! An element passes when `|got − expected| ≤ atol + rtol·|expected|` (the competition's check,
//! with atol = rtol = 1e-3). Beyond that rule: a NaN in `got` always fails (even against a NaN
//! reference), and an infinity passes only against the same infinity.

use core::fmt;

use crate::codec::HostFloat;
use crate::error::FormatError;
use crate::reference::GroupOutput;

/// Absolute and relative tolerance.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    /// Absolute part.
    pub atol: f64,
    /// Relative part (times `|expected|`).
    pub rtol: f64,
}

impl Tolerance {
    /// The competition's check: atol = rtol = 1e-3.
    pub const COMPETITION: Self = Self { atol: 1e-3, rtol: 1e-3 };

    /// A tolerance.
    pub const fn new(atol: f64, rtol: f64) -> Self {
        Self { atol, rtol }
    }

    /// Whether `got` passes against `expected` (module docs for NaN and infinities).
    pub fn accepts(&self, got: f64, expected: f64) -> bool {
        self.excess(got, expected) <= 1.0
    }

    /// `|got − expected| / (atol + rtol·|expected|)`: at most 1 passes. Infinite for a NaN in
    /// `got`, and for an infinity on one side that the other side does not match; 0 for equal
    /// values (including equal infinities).
    pub fn excess(&self, got: f64, expected: f64) -> f64 {
        if got.is_nan() {
            return f64::INFINITY;
        }
        if got == expected {
            return 0.0;
        }
        if !got.is_finite() || !expected.is_finite() {
            return f64::INFINITY;
        }
        let allowed = self.atol + self.rtol * expected.abs();
        let diff = (got - expected).abs();
        if allowed > 0.0 {
            diff / allowed
        } else {
            f64::INFINITY
        }
    }
}

/// One element of the comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Element {
    /// Group index.
    pub group: usize,
    /// Row (M index).
    pub row: usize,
    /// Column (N index).
    pub col: usize,
    /// The value under test.
    pub got: f64,
    /// The reference value.
    pub expected: f64,
    /// [`Tolerance::excess`] of this element (≤ 1 passes).
    pub excess: f64,
}

/// The outcome of [`compare`]: counts, the worst element and the normalized error.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The tolerance used.
    pub tolerance: Tolerance,
    /// Elements compared, over all groups.
    pub checked: usize,
    /// Elements outside the tolerance (NaNs included).
    pub failed: usize,
    /// NaNs in `got`.
    pub nan_count: usize,
    /// The element with the largest excess (the first such one); `None` when nothing was
    /// compared.
    pub worst: Option<Element>,
    /// `‖got − expected‖₂ / ‖expected‖₂` over all groups (0 when both norms are 0, ∞ when only
    /// the reference's is; NaN when `got` holds a NaN).
    pub normalized_error: f64,
}

impl Comparison {
    /// Whether every element passed.
    pub fn passed(&self) -> bool {
        self.failed == 0
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}/{} elements outside |got - ref| <= {:e} + {:e}*|ref| ({} NaN); normalized error {:.3e}",
            if self.passed() { "PASS" } else { "FAIL" },
            self.failed,
            self.checked,
            self.tolerance.atol,
            self.tolerance.rtol,
            self.nan_count,
            self.normalized_error,
        )?;
        if let Some(w) = &self.worst {
            write!(
                f,
                "; worst: group {} row {} col {}: got {} expected {} (|diff| = {:.3e}, {:.3} of the allowed)",
                w.group,
                w.row,
                w.col,
                w.got,
                w.expected,
                (w.got - w.expected).abs(),
                w.excess,
            )?;
        }
        Ok(())
    }
}

/// Compares per-group outputs `got` (row-major, any [`HostFloat`]) with reference outputs
/// `expected`. Errors when the number of groups or a group's element count differs.
pub fn compare<G, T, E>(got: &[G], expected: &[GroupOutput<E>], tolerance: Tolerance) -> Result<Comparison, FormatError>
where
    G: AsRef<[T]>,
    T: HostFloat,
    E: HostFloat,
{
    if got.len() != expected.len() {
        return Err(FormatError::ShapeMismatch {
            what: "number of groups",
            group: None,
            expected: expected.len(),
            actual: got.len(),
        });
    }
    let mut out = Comparison { tolerance, checked: 0, failed: 0, nan_count: 0, worst: None, normalized_error: 0.0 };
    let (mut diff2, mut ref2) = (0.0f64, 0.0f64);
    for (group, (g, e)) in got.iter().zip(expected).enumerate() {
        let g = g.as_ref();
        if g.len() != e.data.len() {
            return Err(FormatError::ShapeMismatch {
                what: "elements in a group's output",
                group: Some(group),
                expected: e.data.len(),
                actual: g.len(),
            });
        }
        for (idx, (&x, &y)) in g.iter().zip(&e.data).enumerate() {
            let (x, y) = (x.to_f64(), y.to_f64());
            let excess = tolerance.excess(x, y);
            out.checked += 1;
            out.nan_count += usize::from(x.is_nan());
            out.failed += usize::from(excess > 1.0);
            if out.worst.is_none_or(|w| excess > w.excess) {
                out.worst = Some(Element {
                    group,
                    row: idx / e.cols.max(1),
                    col: idx % e.cols.max(1),
                    got: x,
                    expected: y,
                    excess,
                });
            }
            diff2 += if x == y { 0.0 } else { (x - y) * (x - y) };
            ref2 += y * y;
        }
    }
    out.normalized_error = if diff2 == 0.0 { 0.0 } else { diff2.sqrt() / ref2.sqrt() };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;

    fn out(rows: usize, cols: usize, data: Vec<f32>) -> GroupOutput<f32> {
        GroupOutput { rows, cols, data }
    }

    #[test]
    fn tolerance_rule() {
        let t = Tolerance::COMPETITION;
        assert!(t.accepts(1.0, 1.0));
        assert!(t.accepts(1.0019, 1.0)); // allowed 2e-3
        assert!(!t.accepts(1.0021, 1.0));
        assert!(t.accepts(0.001, 0.0));
        assert!(!t.accepts(f64::NAN, f64::NAN));
        assert!(!t.accepts(f64::NAN, 1.0));
        assert!(t.accepts(f64::INFINITY, f64::INFINITY));
        assert!(!t.accepts(f64::INFINITY, f64::NEG_INFINITY));
        assert!(!t.accepts(1e30, f64::INFINITY));
        assert!(!t.accepts(f64::INFINITY, 1e30));
        assert_eq!(Tolerance::new(0.0, 0.0).excess(1.0, 1.0), 0.0);
        assert_eq!(Tolerance::new(0.0, 0.0).excess(1.0, 2.0), f64::INFINITY);
    }

    #[test]
    fn reports_the_worst_element_and_the_normalized_error() {
        let expected = vec![out(2, 2, vec![1.0, 2.0, 3.0, 4.0]), out(1, 3, vec![0.0, -1.0, 10.0])];
        let got = vec![vec![1.0f32, 2.0, 3.0, 4.0], vec![0.0005, -1.0, 10.2]];
        let c = compare(&got, &expected, Tolerance::COMPETITION).unwrap();
        assert_eq!((c.checked, c.failed, c.nan_count), (7, 1, 0));
        assert!(!c.passed());
        let w = c.worst.unwrap();
        assert_eq!((w.group, w.row, w.col), (1, 0, 2));
        assert!((w.got - 10.2).abs() < 1e-5 && w.expected == 10.0);
        let num = (0.0005f32 as f64).powi(2) + (10.2f32 as f64 - 10.0).powi(2);
        let den = 1.0 + 4.0 + 9.0 + 16.0 + 1.0 + 100.0;
        assert!((c.normalized_error - (num / den).sqrt()).abs() < 1e-12);
        let text = c.to_string();
        assert!(text.starts_with("FAIL: 1/7"), "{text}");
        assert!(text.contains("group 1 row 0 col 2"), "{text}");

        // A GroupOutput is itself usable as `got`.
        let same = compare(&expected, &expected, Tolerance::COMPETITION).unwrap();
        assert!(same.passed() && same.normalized_error == 0.0);
        assert!(same.to_string().starts_with("PASS: 0/7"));
    }

    #[test]
    fn nan_always_fails_and_shapes_are_checked() {
        let expected = vec![GroupOutput { rows: 1, cols: 2, data: vec![f16::from_f32(1.0), f16::NAN] }];
        let got = vec![vec![f16::from_f32(1.0), f16::NAN]];
        let c = compare(&got, &expected, Tolerance::new(1.0, 1.0)).unwrap();
        assert_eq!((c.failed, c.nan_count), (1, 1));
        assert_eq!(c.worst.unwrap().col, 1);
        assert!(c.normalized_error.is_nan());

        assert!(matches!(
            compare(&[vec![1.0f32]], &[out(1, 2, vec![1.0, 2.0])], Tolerance::COMPETITION),
            Err(FormatError::ShapeMismatch { group: Some(0), expected: 2, actual: 1, .. })
        ));
        assert!(matches!(
            compare::<Vec<f32>, f32, f32>(&[], &[out(0, 0, vec![])], Tolerance::COMPETITION),
            Err(FormatError::ShapeMismatch { group: None, .. })
        ));
        let empty = compare::<Vec<f32>, f32, f32>(&[vec![]], &[out(0, 4, vec![])], Tolerance::COMPETITION).unwrap();
        assert!(empty.passed() && empty.worst.is_none());
    }
}
