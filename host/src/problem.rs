//! The problem: group shapes and output type, validated before anything touches a GPU.

use crate::error::{Error, Result};
pub use nvfp4_format::GroupShape;

/// Most groups one call may have. The limit comes from the 16-bit group index of the work list
/// and the size of the per-call parameter tables; MoE layers have at most a few hundred experts.
pub const MAX_GROUPS: usize = 4096;

/// Largest M, N or K accepted: per-dimension indices are 32-bit in the kernels, and tile indices
/// 16-bit (65535 tiles of 64 rows).
pub const MAX_DIM: usize = 1 << 22;

/// Element type of C.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutputType {
    /// IEEE half precision (the default).
    #[default]
    F16,
    /// bfloat16.
    Bf16,
}

/// A grouped GEMM problem: `C_g[m, n] = alpha_g · A_g[m, k] · B_g[n, k]ᵀ` for each group, both
/// operands NVFP4 (K-major), C row-major.
///
/// Rules (checked by [`Problem::new`]): `k` is a positive multiple of 64; `n` a positive multiple
/// of 8; `m` may be 0 (the group is skipped); at most [`MAX_GROUPS`] groups; no dimension above
/// [`MAX_DIM`]. Zero groups is a valid problem that does nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    groups: Vec<GroupShape>,
    output: OutputType,
}

impl Problem {
    /// Validates the shapes.
    pub fn new(groups: impl Into<Vec<GroupShape>>, output: OutputType) -> Result<Problem> {
        let groups = groups.into();
        if groups.len() > MAX_GROUPS {
            return Err(Error::InvalidProblem(format!("{} groups; at most {MAX_GROUPS} are supported", groups.len())));
        }
        for (g, s) in groups.iter().enumerate() {
            if s.k == 0 || s.k % 64 != 0 {
                return Err(Error::group(g, "k", format!("{} is not a positive multiple of 64", s.k)));
            }
            if s.n == 0 || s.n % 8 != 0 {
                return Err(Error::group(g, "n", format!("{} is not a positive multiple of 8", s.n)));
            }
            for (field, v) in [("m", s.m), ("n", s.n), ("k", s.k)] {
                if v > MAX_DIM {
                    return Err(Error::group(g, field, format!("{v} exceeds the largest supported size {MAX_DIM}")));
                }
            }
        }
        Ok(Problem { groups, output })
    }

    /// The group shapes.
    pub fn groups(&self) -> &[GroupShape] {
        &self.groups
    }

    /// The output type.
    pub fn output(&self) -> OutputType {
        self.output
    }

    /// Multiply-adds times two, over all groups.
    pub fn flops(&self) -> f64 {
        self.groups.iter().map(|s| 2.0 * s.m as f64 * s.n as f64 * s.k as f64).sum()
    }

    /// Bytes of the NVFP4 operands (values and blocked scales) plus C.
    pub fn bytes(&self) -> f64 {
        self.groups
            .iter()
            .map(|s| {
                let op =
                    |rows: usize| rows * s.k / 2 + nvfp4_gemm_abi::scale_layout::blocked_bytes(rows as u32, s.k as u32);
                (op(s.m) + op(s.n) + 2 * s.m * s.n) as f64
            })
            .sum()
    }
}

/// Sizes in bytes each buffer of a group must have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSizes {
    /// Packed A values: `m·k/2`.
    pub a_values: usize,
    /// A scales, 128x4 blocked: `ceil(m/128)·128 · k/16`.
    pub a_scales: usize,
    /// Packed B values: `n·k/2`.
    pub b_values: usize,
    /// B scales, 128x4 blocked: `ceil(n/128)·128 · k/16`.
    pub b_scales: usize,
    /// C elements (not bytes): `m·n`.
    pub c_elements: usize,
}

impl BufferSizes {
    /// The sizes for a shape.
    pub fn of(s: &GroupShape) -> BufferSizes {
        let blocked = |rows: usize| nvfp4_gemm_abi::scale_layout::blocked_bytes(rows as u32, s.k as u32);
        BufferSizes {
            a_values: s.m * s.k / 2,
            a_scales: blocked(s.m),
            b_values: s.n * s.k / 2,
            b_scales: blocked(s.n),
            c_elements: s.m * s.n,
        }
    }
}

/// Address and length (in elements) of one device buffer, as the validator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferView {
    /// Device address.
    pub ptr: u64,
    /// Length in elements.
    pub len: usize,
}

/// The device buffers of one group, as addresses and lengths.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupBuffers {
    /// Packed A values (bytes).
    pub a_values: BufferView,
    /// A scales (bytes, blocked layout).
    pub a_scales: BufferView,
    /// Packed B values (bytes).
    pub b_values: BufferView,
    /// B scales (bytes, blocked layout).
    pub b_scales: BufferView,
    /// C (16-bit elements).
    pub c: BufferView,
    /// Output type of the C buffer.
    pub c_type: OutputType,
    /// alpha.
    pub alpha: f32,
}

/// Every device buffer must start on this many bytes (TMA and bulk copies need 16).
pub const BUFFER_ALIGN: u64 = 16;

/// Checks the buffers of every group against the problem: counts, exact lengths, alignment,
/// output type, finite alpha. Pure: runs on the CPU.
pub fn validate_buffers(problem: &Problem, buffers: &[GroupBuffers]) -> Result<()> {
    if buffers.len() != problem.groups.len() {
        return Err(Error::InvalidProblem(format!(
            "the plan has {} groups but {} were passed",
            problem.groups.len(),
            buffers.len()
        )));
    }
    for (g, (s, b)) in problem.groups.iter().zip(buffers).enumerate() {
        let want = BufferSizes::of(s);
        let skip_a = s.m == 0;
        let checks: [(&'static str, BufferView, usize, bool); 5] = [
            ("a.values", b.a_values, want.a_values, skip_a),
            ("a.scales", b.a_scales, want.a_scales, skip_a),
            ("b.values", b.b_values, want.b_values, skip_a),
            ("b.scales", b.b_scales, want.b_scales, skip_a),
            ("c", b.c, want.c_elements, skip_a),
        ];
        for (field, view, len, skip) in checks {
            if skip {
                continue;
            }
            if view.len != len {
                return Err(Error::group(
                    g,
                    field,
                    format!("has {} elements; m={} n={} k={} needs exactly {len}", view.len, s.m, s.n, s.k),
                ));
            }
            if view.ptr % BUFFER_ALIGN != 0 {
                return Err(Error::group(
                    g,
                    field,
                    format!("address {:#x} is not {BUFFER_ALIGN}-byte aligned", view.ptr),
                ));
            }
        }
        if b.c_type != problem.output {
            return Err(Error::group(
                g,
                "c",
                format!("is {:?} but the problem's output is {:?}", b.c_type, problem.output),
            ));
        }
        if !b.alpha.is_finite() {
            return Err(Error::group(g, "alpha", format!("{} is not finite", b.alpha)));
        }
    }
    Ok(())
}

/// Well-formed fake buffers for a shape (16-byte aligned addresses from `base`, exact lengths),
/// for CPU tests of validation and planning.
/// Address and length of a buffer a call reads; the guard (kept in `guards` until the launches are
/// enqueued) records the read on drop.
pub(crate) fn view<'s, T>(
    p: &'s dyn cudarc::driver::DevicePtr<T>,
    stream: &'s cudarc::driver::CudaStream,
    guards: &mut Vec<cudarc::driver::SyncOnDrop<'s>>,
) -> BufferView {
    let len = p.len();
    let (ptr, guard) = p.device_ptr(stream);
    guards.push(guard);
    BufferView { ptr, len }
}

/// Address and length of a buffer a call writes; the guard records the write on drop.
pub(crate) fn view_mut<'s, T>(
    p: &'s mut dyn cudarc::driver::DevicePtrMut<T>,
    stream: &'s cudarc::driver::CudaStream,
    guards: &mut Vec<cudarc::driver::SyncOnDrop<'s>>,
) -> BufferView {
    let len = p.len();
    let (ptr, guard) = p.device_ptr_mut(stream);
    guards.push(guard);
    BufferView { ptr, len }
}

#[cfg(test)]
pub(crate) fn fake_buffers(s: &GroupShape, base: u64, alpha: f32) -> GroupBuffers {
    let z = BufferSizes::of(s);
    let v = |i: u64, len| BufferView { ptr: base + 0x10_0000 * i, len };
    GroupBuffers {
        a_values: v(1, z.a_values),
        a_scales: v(2, z.a_scales),
        b_values: v(3, z.b_values),
        b_scales: v(4, z.b_scales),
        c: v(5, z.c_elements),
        c_type: OutputType::F16,
        alpha,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(e: Error) -> (usize, &'static str) {
        match e {
            Error::InvalidGroup { group, field, .. } => (group, field),
            other => panic!("expected InvalidGroup, got {other:?}"),
        }
    }

    #[test]
    fn shape_rules() {
        let ok = GroupShape::new(96, 256, 512);
        assert!(Problem::new(vec![ok], OutputType::F16).is_ok());
        assert!(Problem::new(vec![], OutputType::F16).is_ok(), "zero groups is a no-op problem");
        assert!(Problem::new(vec![GroupShape::new(0, 256, 512)], OutputType::F16).is_ok(), "M = 0 is skipped");
        let bad = |s: GroupShape| field_of(Problem::new(vec![ok, s], OutputType::F16).unwrap_err());
        assert_eq!(bad(GroupShape::new(8, 256, 100)), (1, "k"));
        assert_eq!(bad(GroupShape::new(8, 256, 0)), (1, "k"));
        assert_eq!(bad(GroupShape::new(8, 250, 512)), (1, "n"));
        assert_eq!(bad(GroupShape::new(8, 0, 512)), (1, "n"));
        assert_eq!(bad(GroupShape::new(MAX_DIM + 1, 256, 512)), (1, "m"));
        let too_many = vec![ok; MAX_GROUPS + 1];
        assert!(matches!(Problem::new(too_many, OutputType::F16), Err(Error::InvalidProblem(_))));
    }

    fn good_buffers(s: &GroupShape) -> GroupBuffers {
        fake_buffers(s, 0, 1.0)
    }

    #[test]
    fn buffer_rules_name_the_group_and_field() {
        let s = GroupShape::new(72, 384, 256);
        let p = Problem::new(vec![s, s], OutputType::F16).unwrap();
        let good = good_buffers(&s);
        assert!(validate_buffers(&p, &[good, good]).is_ok());
        assert!(matches!(validate_buffers(&p, &[good]), Err(Error::InvalidProblem(_))));
        type Breaker = fn(&mut GroupBuffers);
        let cases: [(&str, Breaker); 10] = [
            ("a.values", |b| b.a_values.len -= 1),
            ("a.scales", |b| b.a_scales.len = 72 * 16), // plain layout size, not padded to 128 rows
            ("b.values", |b| b.b_values.len += 1),
            ("b.scales", |b| b.b_scales.len = 0),
            ("c", |b| b.c.len = 72 * 383),
            ("a.values", |b| b.a_values.ptr += 8),
            ("b.scales", |b| b.b_scales.ptr += 4),
            ("c", |b| b.c.ptr += 2),
            ("c", |b| b.c_type = OutputType::Bf16),
            ("alpha", |b| b.alpha = f32::NAN),
        ];
        for (field, break_it) in cases {
            let mut bad = good;
            break_it(&mut bad);
            assert_eq!(field_of(validate_buffers(&p, &[good, bad]).unwrap_err()), (1, field));
        }
    }

    #[test]
    fn skipped_groups_need_no_buffers() {
        let s = GroupShape::new(0, 384, 256);
        let p = Problem::new(vec![s], OutputType::F16).unwrap();
        let mut b = good_buffers(&s);
        b.b_values.len = 0;
        assert!(validate_buffers(&p, &[b]).is_ok());
    }

    #[test]
    fn sizes() {
        let z = BufferSizes::of(&GroupShape::new(130, 264, 128));
        assert_eq!(z.a_values, 130 * 64);
        assert_eq!(z.a_scales, 256 * 8);
        assert_eq!(z.b_values, 264 * 64);
        assert_eq!(z.b_scales, 384 * 8);
        assert_eq!(z.c_elements, 130 * 264);
    }
}
