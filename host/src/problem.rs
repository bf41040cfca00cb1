//! The problem: group shapes and output type, validated before anything touches a GPU.

use crate::error::{Error, Result};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
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

    /// Where each group's parts lie in *stacked* buffers ([`crate::plan::StackedArgs`]: one
    /// allocation per operand, the groups' parts back to back in group order): entry `g` is group
    /// `g`'s offset in each buffer (bytes; elements for C), entry `G` the buffers' total sizes.
    /// Every part is a multiple of 16 bytes (K a multiple of 64, N of 8, scales in 512-byte
    /// blocks), so a 16-byte aligned buffer keeps every group's part aligned. A group with
    /// `m = 0` has empty A and C parts; its B part is there (a layer's every expert has weights).
    pub fn stacked_offsets(&self) -> Vec<BufferSizes> {
        let mut at = BufferSizes::ZERO;
        let mut out = Vec::with_capacity(self.groups.len() + 1);
        out.push(at);
        for s in &self.groups {
            at = at.plus(BufferSizes::of(s));
            out.push(at);
        }
        out
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

    /// All fields zero: where the first group's parts of stacked buffers start.
    pub const ZERO: BufferSizes = BufferSizes { a_values: 0, a_scales: 0, b_values: 0, b_scales: 0, c_elements: 0 };

    /// Field by field sum.
    fn plus(self, o: BufferSizes) -> BufferSizes {
        BufferSizes {
            a_values: self.a_values + o.a_values,
            a_scales: self.a_scales + o.a_scales,
            b_values: self.b_values + o.b_values,
            b_scales: self.b_scales + o.b_scales,
            c_elements: self.c_elements + o.c_elements,
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

/// The views of one call's buffers and cudarc's stream-ordering guards for them ([`SyncOnDrop`]).
///
/// While the context manages cross-stream synchronization (more than one stream and event
/// tracking on), a buffer's guard records its read or write event when dropped, so it is kept until
/// the call's launches are enqueued. Otherwise dropping a `Record` guard does nothing (cudarc checks
/// the same condition on drop, and the guard holds only references), so it is forgotten at once
/// without the call to its drop (PERF.md #46): a call on a single stream keeps no list
/// of guards and allocates nothing for them, however many groups it has. Other guards (a
/// `DevicePtr` whose guard synchronizes) are always kept. (This follows cudarc 0.19's
/// `SyncOnDrop`, pinned in the workspace: check it again when cudarc is upgraded.)
pub(crate) struct CallBuffers<'s> {
    stream: &'s CudaStream,
    keep_records: bool,
    guards: Vec<SyncOnDrop<'s>>,
}

impl<'s> CallBuffers<'s> {
    /// Views on `stream`; asks once whether the context manages cross-stream synchronization.
    pub fn new(stream: &'s CudaStream) -> CallBuffers<'s> {
        let keep_records = stream.context().is_managing_stream_synchronization();
        CallBuffers { stream, keep_records, guards: Vec::new() }
    }

    #[inline(always)]
    fn hold(&mut self, guard: SyncOnDrop<'s>) {
        match guard {
            // Its drop would do nothing while the context does not manage synchronization (it
            // only holds references): skip the call.
            SyncOnDrop::Record(_) if !self.keep_records => std::mem::forget(guard),
            guard => self.guards.push(guard),
        }
    }

    /// Address and length of a buffer the call reads.
    #[inline(always)]
    pub fn read<T>(&mut self, p: &'s dyn DevicePtr<T>) -> BufferView {
        let len = p.len();
        let (ptr, guard) = p.device_ptr(self.stream);
        self.hold(guard);
        BufferView { ptr, len }
    }

    /// Address and length of a buffer the call writes.
    #[inline(always)]
    pub fn write<T>(&mut self, p: &'s mut dyn DevicePtrMut<T>) -> BufferView {
        let len = p.len();
        let (ptr, guard) = p.device_ptr_mut(self.stream);
        self.hold(guard);
        BufferView { ptr, len }
    }
}

impl GroupBuffers {
    /// Whether `o` has the same addresses and alpha (bit for bit): what a plan's device tables
    /// are encoded from. (Bitwise, without branches: it runs once per group and call.)
    #[inline]
    fn same_tables(&self, o: &GroupBuffers) -> bool {
        ((self.a_values.ptr ^ o.a_values.ptr)
            | (self.a_scales.ptr ^ o.a_scales.ptr)
            | (self.b_values.ptr ^ o.b_values.ptr)
            | (self.b_scales.ptr ^ o.b_scales.ptr)
            | (self.c.ptr ^ o.c.ptr)
            | u64::from(self.alpha.to_bits() ^ o.alpha.to_bits()))
            == 0
    }

    /// Whether `o` also has the same lengths and output type: everything [`validate_buffers`]
    /// looks at besides the problem (with [`Self::same_tables`]).
    #[inline]
    fn same_lengths(&self, o: &GroupBuffers) -> bool {
        ((self.a_values.len ^ o.a_values.len)
            | (self.a_scales.len ^ o.a_scales.len)
            | (self.b_values.len ^ o.b_values.len)
            | (self.b_scales.len ^ o.b_scales.len)
            | (self.c.len ^ o.c.len))
            == 0
            && self.c_type == o.c_type
    }
}

/// What a call must do before its launches, from [`BufferCache::check`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TablesState {
    /// The device tables hold this call's addresses and alphas already: launch only.
    Current,
    /// Encode the tables for this call's buffers and upload them, then
    /// [`BufferCache::set_uploaded`].
    Upload,
}

/// A plan's view of its calls' buffers, so that a call with the buffers of the previous one costs
/// one flat comparison per group: no validation, no encoding, no allocation.
///
/// Each call fills [`BufferCache::start`] (its capacity is the plan's group count, so filling
/// allocates nothing); [`BufferCache::check`] compares it with the last validated call's buffers,
/// validates it only when anything differs (validation is a pure function of the problem and
/// these views), and says whether the tables must be encoded again (addresses or alphas differ
/// from those the tables were encoded from, or there are none yet).
#[derive(Debug)]
pub(crate) struct BufferCache {
    /// The current call's buffers, being filled.
    current: Vec<GroupBuffers>,
    /// The buffers of the last call that passed validation (meaningful when `validated`).
    last: Vec<GroupBuffers>,
    validated: bool,
    /// Whether the device tables were encoded from `last`'s addresses and alphas.
    uploaded: bool,
}

impl BufferCache {
    /// An empty cache for calls of `groups` groups.
    pub fn new(groups: usize) -> BufferCache {
        BufferCache {
            current: Vec::with_capacity(groups),
            last: Vec::with_capacity(groups),
            validated: false,
            uploaded: false,
        }
    }

    /// The current call's buffers, emptied, to be filled with one entry per group in order.
    pub fn start(&mut self) -> &mut Vec<GroupBuffers> {
        self.current.clear();
        &mut self.current
    }

    /// Checks the current call's buffers: validated against `problem` ([`validate_buffers`],
    /// same errors) unless equal to the last validated call's in every field validation reads.
    /// On success they become [`Self::buffers`]; on error the cache is unchanged (the last valid
    /// call's buffers and what the tables hold).
    pub fn check(&mut self, problem: &Problem) -> Result<TablesState> {
        let (mut same, mut same_tables) = (false, false);
        if self.validated && self.last.len() == self.current.len() {
            (same, same_tables) = (true, true);
            for (last, now) in self.last.iter().zip(&self.current) {
                if !last.same_tables(now) {
                    (same, same_tables) = (false, false);
                    break;
                }
                same &= last.same_lengths(now);
            }
        }
        if !same {
            validate_buffers(problem, &self.current)?;
            std::mem::swap(&mut self.last, &mut self.current);
            self.validated = true;
        }
        if self.uploaded && same_tables {
            Ok(TablesState::Current)
        } else {
            // Until the upload succeeds the tables hold nothing known.
            self.uploaded = false;
            Ok(TablesState::Upload)
        }
    }

    /// The buffers of the last call that passed [`Self::check`].
    pub fn buffers(&self) -> &[GroupBuffers] {
        &self.last
    }

    /// Records that the device tables now hold the addresses and alphas of [`Self::buffers`].
    pub fn set_uploaded(&mut self) {
        self.uploaded = self.validated;
    }
}

/// Well-formed fake buffers for a shape (16-byte aligned addresses from `base`, exact lengths),
/// for CPU tests of validation and planning.
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

    /// Stacked buffers: each group's part starts where the previous one ends, has exactly the
    /// group's sizes, and starts 16-byte aligned (C in 2-byte elements); empty groups have empty A
    /// and C parts but their B.
    #[test]
    fn stacked_offsets_are_prefix_sums_of_aligned_parts() {
        let shapes = vec![
            GroupShape::new(0, 256, 512),
            GroupShape::new(24, 136, 192),
            GroupShape::new(1, 8, 64),
            GroupShape::new(130, 264, 448),
        ];
        let p = Problem::new(shapes.clone(), OutputType::F16).unwrap();
        let at = p.stacked_offsets();
        assert_eq!((at.len(), at[0]), (5, BufferSizes::ZERO));
        for (g, s) in shapes.iter().enumerate() {
            let z = BufferSizes::of(s);
            assert_eq!(at[g + 1], at[g].plus(z), "group {g}");
            let o = at[g];
            for bytes in [o.a_values, o.a_scales, o.b_values, o.b_scales, 2 * o.c_elements] {
                assert_eq!(bytes as u64 % BUFFER_ALIGN, 0, "group {g}");
            }
        }
        assert_eq!((at[1].a_values, at[1].a_scales, at[1].c_elements), (0, 0, 0));
        assert_eq!(at[1].b_values, 256 * 512 / 2);
        assert_eq!(at[4].c_elements, 24 * 136 + 8 + 130 * 264);
        assert_eq!(at[4].a_scales, 128 * 192 / 16 + 128 * 64 / 16 + 256 * 448 / 16);
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

    /// Fills the cache with `bufs` as a call would and checks it.
    fn call(cache: &mut BufferCache, p: &Problem, bufs: &[GroupBuffers]) -> Result<TablesState> {
        cache.start().extend_from_slice(bufs);
        cache.check(p)
    }

    /// A call of a plan with work: check, then upload when asked.
    fn call_and_upload(cache: &mut BufferCache, p: &Problem, bufs: &[GroupBuffers]) -> Result<TablesState> {
        let state = call(cache, p, bufs)?;
        if state == TablesState::Upload {
            assert_eq!(cache.buffers(), bufs, "the tables are encoded from this call's buffers");
            cache.set_uploaded();
        }
        Ok(state)
    }

    fn mixed_problem() -> (Problem, Vec<GroupBuffers>) {
        let shapes = [GroupShape::new(72, 384, 256), GroupShape::new(0, 256, 512), GroupShape::new(16, 4096, 1024)];
        let p = Problem::new(shapes.to_vec(), OutputType::F16).unwrap();
        let bufs = shapes.iter().enumerate().map(|(g, s)| fake_buffers(s, 0x1000_0000 * g as u64, 0.5)).collect();
        (p, bufs)
    }

    #[test]
    fn the_cache_uploads_once_for_unchanged_buffers() {
        let (p, bufs) = mixed_problem();
        let mut cache = BufferCache::new(bufs.len());
        assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Upload));
        for _ in 0..3 {
            assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Current));
        }
        // Without work (or after a failed upload) nothing is marked uploaded: every call asks.
        let mut cache = BufferCache::new(bufs.len());
        assert_eq!(call(&mut cache, &p, &bufs), Ok(TablesState::Upload));
        assert_eq!(call(&mut cache, &p, &bufs), Ok(TablesState::Upload));
        cache.set_uploaded();
        assert_eq!(call(&mut cache, &p, &bufs), Ok(TablesState::Current));
    }

    #[test]
    fn the_cache_detects_every_changed_address_and_alpha() {
        let (p, bufs) = mixed_problem();
        type Change = fn(&mut GroupBuffers);
        let changes: [(&str, Change); 8] = [
            ("a.values", |b| b.a_values.ptr += 0x100),
            ("a.scales", |b| b.a_scales.ptr += 0x100),
            ("b.values", |b| b.b_values.ptr += 0x100),
            ("b.scales", |b| b.b_scales.ptr += 0x100),
            ("c", |b| b.c.ptr += 0x100),
            ("alpha", |b| b.alpha = 0.25),
            ("alpha +0 -> -0", |b| b.alpha = -0.0),
            ("alpha one ulp", |b| b.alpha = f32::from_bits(b.alpha.to_bits() + 1)),
        ];
        for g in 0..bufs.len() {
            for (what, change) in changes {
                let mut cache = BufferCache::new(bufs.len());
                let mut start = bufs.clone();
                if what == "alpha +0 -> -0" {
                    start[g].alpha = 0.0;
                }
                let mut changed = start.clone();
                change(&mut changed[g]);
                assert_eq!(call_and_upload(&mut cache, &p, &start), Ok(TablesState::Upload));
                assert_eq!(call_and_upload(&mut cache, &p, &changed), Ok(TablesState::Upload), "group {g} {what}");
                assert_eq!(call_and_upload(&mut cache, &p, &changed), Ok(TablesState::Current), "group {g} {what}");
                // Back to the first buffers: the tables hold the changed ones now.
                assert_eq!(call_and_upload(&mut cache, &p, &start), Ok(TablesState::Upload), "group {g} {what}");
            }
        }
        // A different group count is a different call (and an error).
        let mut cache = BufferCache::new(bufs.len());
        call_and_upload(&mut cache, &p, &bufs).unwrap();
        assert!(matches!(call_and_upload(&mut cache, &p, &bufs[..2]), Err(Error::InvalidProblem(_))));
        assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Current));
    }

    #[test]
    fn the_cache_rejects_what_validation_rejects_with_the_same_error() {
        let (p, bufs) = mixed_problem();
        type Breaker = fn(&mut GroupBuffers);
        // Same addresses and alpha as the cached call (or not): either way validated.
        let cases: [Breaker; 12] = [
            |b| b.a_values.len -= 1,
            |b| b.a_scales.len += 16,
            |b| b.b_values.len += 1,
            |b| b.b_scales.len = 0,
            |b| b.c.len -= 1,
            |b| b.c_type = OutputType::Bf16,
            |b| b.a_values.ptr += 8,
            |b| b.a_scales.ptr += 4,
            |b| b.b_scales.ptr += 2,
            |b| b.c.ptr += 1,
            |b| b.alpha = f32::INFINITY,
            |b| b.alpha = f32::NAN,
        ];
        for g in [0, 2] {
            for (i, break_it) in cases.iter().enumerate() {
                let mut bad = bufs.clone();
                break_it(&mut bad[g]);
                let want = validate_buffers(&p, &bad).unwrap_err();
                let mut cache = BufferCache::new(bufs.len());
                assert_eq!(call_and_upload(&mut cache, &p, &bad), Err(want.clone()), "fresh, group {g} case {i}");
                assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Upload));
                assert_eq!(call_and_upload(&mut cache, &p, &bad), Err(want.clone()), "cached, group {g} case {i}");
                assert_eq!(call_and_upload(&mut cache, &p, &bad), Err(want), "again, group {g} case {i}");
                // A rejected call changes nothing: the tables still hold the valid buffers.
                assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Current), "group {g} case {i}");
            }
        }
        // Group 1 has M = 0: its lengths are not checked, and a length alone does not re-encode.
        let mut cache = BufferCache::new(bufs.len());
        call_and_upload(&mut cache, &p, &bufs).unwrap();
        let mut other = bufs.clone();
        other[1].b_values.len = 0;
        assert_eq!(call_and_upload(&mut cache, &p, &other), Ok(TablesState::Current));
        // But its output type is.
        other[1].c_type = OutputType::Bf16;
        let err = call_and_upload(&mut cache, &p, &other).unwrap_err();
        assert_eq!(field_of(err), (1, "c"));
    }

    /// Host time of the cached and the changing check for 64 groups (printed; only correctness
    /// is asserted).
    #[test]
    fn cache_time_for_64_groups() {
        let s = GroupShape::new(4, 7168, 2048);
        let p = Problem::new(vec![s; 64], OutputType::F16).unwrap();
        let sets: Vec<Vec<GroupBuffers>> = (0..2u64)
            .map(|set| (0..64).map(|g| fake_buffers(&s, 0x1000_0000 * (2 * g + set), 0.5)).collect())
            .collect();
        let mut cache = BufferCache::new(64);
        for (name, rotate) in [("same buffers", false), ("alternating buffers", true)] {
            // The best of 20 batches of 1000 calls (the machine may be shared).
            let mut best = f64::INFINITY;
            for batch in 0..20 {
                let t = std::time::Instant::now();
                for i in 0..1000 {
                    let bufs = std::hint::black_box(&sets[if rotate { i % 2 } else { 0 }]);
                    // The cache holds set 0 when each loop starts (uploaded by the first call).
                    let want = match (rotate, batch == 0 && i == 0) {
                        (false, true) | (true, false) => TablesState::Upload,
                        (false, false) | (true, true) => TablesState::Current,
                    };
                    assert_eq!(call_and_upload(&mut cache, &p, bufs), Ok(want));
                }
                best = best.min(t.elapsed().as_secs_f64() * 1e3);
            }
            println!("BufferCache::check, 64 groups, {name}: {best:.3} us per call");
        }
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
