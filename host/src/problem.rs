//! The problem: group shapes and output type, validated before anything touches a GPU.

use crate::error::{within, BufferName, Error, Result};
pub use crate::overlap::BufferView;
use crate::overlap::{self, Span};
use crate::rules::{self, Limit};
pub use crate::rules::{MAX_DIM, MAX_GROUPS};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
pub use nvfp4_format::GroupShape;
pub use nvfp4_gemm_abi::sm90::w4a16::Activations;

/// What a problem's token operand A is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum TokenKind {
    /// NVFP4 tokens: packed e2m1 values and e4m3 block scales in the blocked layout (W4A4).
    #[default]
    Nvfp4,
    /// 16-bit activations of this type, used as they are, times weights prepacked for them
    /// ([`crate::w4a16::prepack`]): W4A16, an sm_90a path (sm_100a multiplies NVFP4 operands
    /// natively).
    Dense(Activations),
}

impl TokenKind {
    /// Bytes of one element of A's first buffer (packed values: bytes; activations: 2).
    pub const fn a_element_bytes(self) -> u64 {
        match self {
            TokenKind::Nvfp4 => 1,
            TokenKind::Dense(_) => 2,
        }
    }

    /// The activations' type, `None` for NVFP4 tokens.
    pub const fn activations(self) -> Option<Activations> {
        match self {
            TokenKind::Nvfp4 => None,
            TokenKind::Dense(a) => Some(a),
        }
    }
}

/// Element type of C.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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
/// Rules ([`crate::rules`], checked by [`Problem::new`]): `k` is a positive multiple of
/// [`rules::K_MULTIPLE`] (64); `n` a positive multiple of [`rules::N_MULTIPLE`] (8); `m` may be 0 (the group is skipped); at most [`MAX_GROUPS`] groups; no dimension above
/// [`MAX_DIM`]; the call's buffers within [`rules::MAX_DEVICE_BYTES`] and its output tiles within
/// [`rules::MAX_TILES`] ([`crate::rules`]). Zero groups is a valid problem that does nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Problem {
    groups: Vec<GroupShape>,
    output: OutputType,
    tokens: TokenKind,
}

impl Problem {
    /// Validates the shapes: the rules above, in time proportional to the number of groups.
    /// Errors: [`Error::InvalidGroup`] for a `k` or `n` against the rules, [`Error::TooLarge`]
    /// for a limit exceeded.
    pub fn new(groups: impl Into<Vec<GroupShape>>, output: OutputType) -> Result<Problem> {
        Problem::with_tokens(groups, output, TokenKind::Nvfp4)
    }

    /// [`Problem::new`] with the token operand `tokens` (NVFP4, or W4A16's 16-bit activations).
    pub fn with_tokens(groups: impl Into<Vec<GroupShape>>, output: OutputType, tokens: TokenKind) -> Result<Problem> {
        let groups = groups.into();
        within(None, "groups", groups.len() as u64, Limit::Groups)?;
        for (g, s) in groups.iter().enumerate() {
            if let Some(reason) = rules::k_rule(s.k) {
                return Err(Error::group(g, "k", reason));
            }
            if let Some(reason) = rules::n_rule(s.n) {
                return Err(Error::group(g, "n", reason));
            }
        }
        check_groups(&groups, tokens)?;
        Ok(Problem { groups, output, tokens })
    }

    /// The group shapes.
    pub fn groups(&self) -> &[GroupShape] {
        &self.groups
    }

    /// The output type.
    pub fn output(&self) -> OutputType {
        self.output
    }

    /// The token operand.
    pub fn tokens(&self) -> TokenKind {
        self.tokens
    }

    /// Multiply-adds times two, over all groups.
    pub fn flops(&self) -> f64 {
        self.groups.iter().map(|s| 2.0 * s.m as f64 * s.n as f64 * s.k as f64).sum()
    }

    /// Bytes of the operands (A's values and blocked scales or its activations, B's values and
    /// blocked scales) plus C.
    pub fn bytes(&self) -> f64 {
        self.groups
            .iter()
            .map(|s| {
                let z = BufferSizes::with_tokens(s, self.tokens);
                let a = z.a_values as u64 * self.tokens.a_element_bytes();
                (a as usize + z.a_scales + z.b_values + z.b_scales + 2 * z.c_elements) as f64
            })
            .sum()
    }

    /// Where each group's parts lie in *stacked* buffers ([`crate::plan::StackedArgs`]: one
    /// allocation per operand, the groups' parts back to back in group order): entry `g` is group
    /// `g`'s offset in each buffer (bytes; elements for C), entry `G` the buffers' total sizes.
    /// Every part is a multiple of 16 bytes (the shape rules of [`crate::rules`]: K a multiple
    /// of 64, N of 8; scales in 512-byte blocks), so a 16-byte aligned buffer keeps every group's part aligned. A group with
    /// `m = 0` has empty A and C parts; its B part is there (a layer's every expert has weights).
    pub fn stacked_offsets(&self) -> Vec<BufferSizes> {
        let mut at = BufferSizes::ZERO;
        let mut out = Vec::with_capacity(self.groups.len() + 1);
        out.push(at);
        for s in &self.groups {
            at = at.plus(BufferSizes::with_tokens(s, self.tokens));
            out.push(at);
        }
        out
    }
}

/// Sizes each buffer of a group must have: bytes, but for W4A16's activations and C, elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferSizes {
    /// Packed A values: `m·k/2` bytes; or W4A16's activations: `m·k` elements.
    pub a_values: usize,
    /// A scales, 128x4 blocked: `ceil(m/128)·128 · k/16` (none for activations).
    pub a_scales: usize,
    /// Packed B values: `n·k/2`.
    pub b_values: usize,
    /// B scales, 128x4 blocked: `ceil(n/128)·128 · k/16`.
    pub b_scales: usize,
    /// C elements (not bytes): `m·n`.
    pub c_elements: usize,
}

impl BufferSizes {
    /// The sizes for a shape with NVFP4 tokens.
    pub fn of(s: &GroupShape) -> BufferSizes {
        BufferSizes::with_tokens(s, TokenKind::Nvfp4)
    }

    /// The sizes for a shape with the token operand `tokens`.
    pub fn with_tokens(s: &GroupShape, tokens: TokenKind) -> BufferSizes {
        let blocked = |rows: usize| nvfp4_gemm_abi::scale_layout::blocked_bytes(rows as u32, s.k as u32);
        let (a_values, a_scales) = match tokens {
            TokenKind::Nvfp4 => (s.m * s.k / 2, blocked(s.m)),
            TokenKind::Dense(_) => (s.m * s.k, 0),
        };
        BufferSizes { a_values, a_scales, b_values: s.n * s.k / 2, b_scales: blocked(s.n), c_elements: s.m * s.n }
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

/// Checks the limits of a host-sized problem's groups (whose `k` and `n` follow the shape rules,
/// [`crate::rules`]) with the token operand `tokens`: each dimension, then, group by group, the
/// running totals of device bytes (A, B, C and the sm_90a token workspace) and output tiles.
/// O(groups).
fn check_groups(groups: &[GroupShape], tokens: TokenKind) -> Result<()> {
    within(None, "groups", groups.len() as u64, Limit::Groups)?;
    let (mut bytes, mut tiles) = (0u64, 0u64);
    for (g, s) in groups.iter().enumerate() {
        for (field, v) in [("m", s.m), ("n", s.n), ("k", s.k)] {
            within(Some(g), field, v as u64, Limit::Dim)?;
        }
        // Within MAX_DIM every product below fits in 64 bits.
        let z = BufferSizes::with_tokens(s, tokens);
        // W4A16 reads its activations where they are: no token workspace.
        let workspace = if tokens == TokenKind::Nvfp4 { 2 * s.m as u64 * s.k as u64 } else { 0 };
        let parts = [
            ("a.values", z.a_values as u64 * tokens.a_element_bytes()),
            ("a.scales", z.a_scales as u64),
            ("b.values", z.b_values as u64),
            ("b.scales", z.b_scales as u64),
            ("c", 2 * z.c_elements as u64),
            ("workspace", workspace),
        ];
        for (field, b) in parts {
            bytes += b;
            within(Some(g), field, bytes, Limit::DeviceBytes)?;
        }
        tiles += rules::output_tiles(s.m, s.n);
        within(Some(g), "tiles", tiles, Limit::Tiles)?;
    }
    Ok(())
}

/// Buffer sizes of an NVFP4 tensor of `rows x k`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nvfp4Sizes {
    /// Bytes of packed values: `rows · k / 2`.
    pub values: usize,
    /// Bytes of blocked scales, padding included: `ceil(rows/128) · 128 · k / 16`.
    pub scales: usize,
}

/// The device buffers of one group, as addresses and lengths.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupBuffers {
    /// What A is (validated against the problem's token operand).
    pub a_kind: TokenKind,
    /// Packed A values (bytes), or W4A16's activations (16-bit elements).
    pub a_values: BufferView,
    /// A scales (bytes, blocked layout; empty for activations).
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

/// Appends to `out` each group's parts of stacked buffers ([`Problem::stacked_offsets`] `at`):
/// `whole` holds the A values, A scales, B values and B scales buffers, `c` the C buffer (of type
/// `c_type`), each as long as all the groups' parts; group `g`'s part runs from its offset to the
/// next group's (C in 2-byte elements), so the parts of one buffer are adjacent and disjoint.
/// `alphas` gives each group's alpha in order.
pub(crate) fn stacked_parts(
    at: &[BufferSizes],
    a_kind: TokenKind,
    whole: [BufferView; 4],
    c: BufferView,
    c_type: OutputType,
    alphas: impl Iterator<Item = f32>,
    out: &mut Vec<GroupBuffers>,
) {
    let [a_values, a_scales, b_values, b_scales] = whole;
    let part = |base: BufferView, from: usize, to: usize, bytes: u64| BufferView {
        ptr: base.ptr + from as u64 * bytes,
        len: to - from,
    };
    for (w, alpha) in at.windows(2).zip(alphas) {
        let (at, next) = (w[0], w[1]);
        out.push(GroupBuffers {
            a_kind,
            a_values: part(a_values, at.a_values, next.a_values, a_kind.a_element_bytes()),
            a_scales: part(a_scales, at.a_scales, next.a_scales, 1),
            b_values: part(b_values, at.b_values, next.b_values, 1),
            b_scales: part(b_scales, at.b_scales, next.b_scales, 1),
            c: part(c, at.c_elements, next.c_elements, 2),
            c_type,
            alpha,
        });
    }
}

pub use crate::rules::BUFFER_ALIGN;

/// Checks the buffers of every group against the problem: counts, exact lengths, alignment,
/// output type, finite alpha, and no output overlapping another buffer of the call
/// ([`Error::Overlap`]; a group with `m = 0` reads and writes nothing). Pure: runs on the CPU.
pub fn validate_buffers(problem: &Problem, buffers: &[GroupBuffers]) -> Result<()> {
    validate_buffers_in("run", problem, buffers, &mut Vec::new())
}

/// [`validate_buffers`] for the call `call`, with `spans` as the overlap check's list (kept by
/// the caller so that a call allocates nothing).
pub(crate) fn validate_buffers_in(
    call: &'static str,
    problem: &Problem,
    buffers: &[GroupBuffers],
    spans: &mut Vec<Span>,
) -> Result<()> {
    if buffers.len() != problem.groups.len() {
        return Err(Error::InvalidProblem(format!(
            "the plan has {} groups but {} were passed",
            problem.groups.len(),
            buffers.len()
        )));
    }
    let tokens = problem.tokens;
    let a_field = if tokens == TokenKind::Nvfp4 { "a.values" } else { "activations" };
    for (g, (s, b)) in problem.groups.iter().zip(buffers).enumerate() {
        if b.a_kind != tokens {
            return Err(Error::group(
                g,
                a_field,
                format!("is {}; the problem's tokens are {}", kind_words(b.a_kind), kind_words(tokens)),
            ));
        }
        let want = BufferSizes::with_tokens(s, tokens);
        let skip_a = s.m == 0;
        // Activations have no scales: their (empty) scale view is not looked at.
        let skip_scales = skip_a || tokens != TokenKind::Nvfp4;
        let checks: [(&'static str, BufferView, usize, bool); 5] = [
            (a_field, b.a_values, want.a_values, skip_a),
            ("a.scales", b.a_scales, want.a_scales, skip_scales),
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
    spans.clear();
    for (g, (s, b)) in problem.groups.iter().zip(buffers).enumerate() {
        if s.m != 0 {
            push_spans(spans, g, b);
        }
    }
    let fields = if tokens == TokenKind::Nvfp4 { &GROUP_FIELDS } else { &DENSE_GROUP_FIELDS };
    overlap::check(call, spans, overlap::group_fields(fields))
}

/// A token operand in words, for errors.
fn kind_words(kind: TokenKind) -> String {
    match kind {
        TokenKind::Nvfp4 => "NVFP4 tokens".into(),
        TokenKind::Dense(a) => format!("{a:?} activations"),
    }
}

/// The fields of a group's buffers, in the order of [`push_spans`].
const GROUP_FIELDS: [&str; 5] = ["a.values", "a.scales", "b.values", "b.scales", "c"];
/// [`GROUP_FIELDS`] of a W4A16 problem (whose A is the activations).
const DENSE_GROUP_FIELDS: [&str; 5] = ["activations", "a.scales", "b.values", "b.scales", "c"];

/// Appends group `g`'s buffers to the overlap check's list (ids `5g ..`, [`GROUP_FIELDS`]).
#[inline]
fn push_spans(spans: &mut Vec<Span>, g: usize, b: &GroupBuffers) {
    let id = 5 * g as u32;
    spans.extend([
        Span::new(id, b.a_values, b.a_kind.a_element_bytes(), false),
        Span::new(id + 1, b.a_scales, 1, false),
        Span::new(id + 2, b.b_values, 1, false),
        Span::new(id + 3, b.b_scales, 1, false),
        Span::new(id + 4, b.c, 2, true),
    ]);
}

/// The alpha a call with device-resident alphas gives each group's [`GroupBuffers::alpha`]: what
/// the group table is uploaded with before the call's copy from the device overwrites it.
pub(crate) const DEVICE_ALPHA_PLACEHOLDER: f32 = 1.0;

/// Checks a device buffer of alphas (`alphas`, `f32` elements) for a call whose groups' buffers
/// are `buffers` (validated): exactly one `f32` per group, 4-byte aligned, and no byte shared
/// with any group's C (a group with `m = 0` writes nothing). The values are not read: they are
/// copied on the device, and a NaN or infinite alpha gives NaN or infinite outputs. Pure.
pub(crate) fn validate_device_alphas(
    call: &'static str,
    problem: &Problem,
    alphas: BufferView,
    buffers: &[GroupBuffers],
) -> Result<()> {
    let groups = problem.groups.len();
    let invalid = |reason| Error::InvalidArgument { call, field: "alphas", reason };
    if alphas.len != groups {
        return Err(invalid(format!("has {} f32 values; the plan has {groups} groups", alphas.len)));
    }
    if alphas.ptr % 4 != 0 {
        return Err(invalid(format!("address {:#x} is not 4-byte aligned", alphas.ptr)));
    }
    let input = Span::new(0, alphas, 4, false);
    let name = |id: u32| match id {
        0 => BufferName { group: None, field: "alphas" },
        g => BufferName { group: Some(g as usize - 1), field: "c" },
    };
    for (g, (s, b)) in problem.groups.iter().zip(buffers).enumerate() {
        if s.m != 0 {
            overlap::check_one_output(call, Span::new(g as u32 + 1, b.c, 2, true), [input], name)?;
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
/// without the call to its drop: a call on a single stream keeps no list
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
            && self.a_kind == o.a_kind
    }
}

/// A plan's view of its calls' buffers, so that a call with the buffers of one of the last
/// [`VALIDATED_CALLS`] validated calls costs flat comparisons instead of a validation (as many as
/// the engine's table sets: the calls whose tables a plan keeps are the calls it need not check
/// again).
///
/// Each call fills [`BufferCache::start`] (its capacity is the plan's group count, so filling
/// allocates nothing); [`BufferCache::check`] compares it with the validated calls' buffers and
/// validates it only when none is equal in every field validation reads (validation is a pure
/// function of the problem and these views).
#[derive(Debug)]
pub(crate) struct BufferCache {
    /// The current call's buffers, being filled.
    current: Vec<GroupBuffers>,
    /// The buffers of the last call that passed validation (meaningful when `validated`).
    last: Vec<GroupBuffers>,
    validated: bool,
    /// Earlier calls that passed validation, the most recently validated last.
    seen: Vec<Vec<GroupBuffers>>,
    /// The overlap check's list, kept so that validation allocates nothing.
    spans: Vec<Span>,
}

/// How many validated calls a [`BufferCache`] remembers: as many as the engine's table sets.
pub(crate) const VALIDATED_CALLS: usize = crate::rules::CALLS_KEPT;

impl BufferCache {
    /// An empty cache for calls of `groups` groups.
    pub fn new(groups: usize) -> BufferCache {
        BufferCache {
            current: Vec::with_capacity(groups),
            last: Vec::with_capacity(groups),
            validated: false,
            seen: Vec::new(),
            spans: Vec::with_capacity(5 * groups),
        }
    }

    /// The current call's buffers, emptied, to be filled with one entry per group in order.
    pub fn start(&mut self) -> &mut Vec<GroupBuffers> {
        self.current.clear();
        &mut self.current
    }

    /// Checks the current call's buffers: validated against `problem` ([`validate_buffers`],
    /// same errors, for the call `call`) unless equal to the last validated call's in every field
    /// validation reads (addresses, lengths, types, alphas: the overlap rule too depends on
    /// nothing else). On success they become [`Self::buffers`]; on error the cache is unchanged.
    pub fn check(&mut self, problem: &Problem, call: &'static str) -> Result<()> {
        let same = |a: &[GroupBuffers], b: &[GroupBuffers]| {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same_tables(y) && x.same_lengths(y))
        };
        if self.validated && same(&self.last, &self.current) {
            return Ok(());
        }
        if !self.seen.iter().any(|s| same(s, &self.current)) {
            validate_buffers_in(call, problem, &self.current, &mut self.spans)?;
            if self.seen.len() == VALIDATED_CALLS {
                self.seen.remove(0);
            }
            self.seen.push(self.current.clone());
        }
        std::mem::swap(&mut self.last, &mut self.current);
        self.validated = true;
        Ok(())
    }

    /// The buffers of the last call that passed [`Self::check`].
    pub fn buffers(&self) -> &[GroupBuffers] {
        &self.last
    }
}

/// Well-formed fake buffers for a shape (exact lengths; field `i` of A values, A scales, B
/// values, B scales, C at `base + i · stride`, `i` from 1, where `stride` is 1 MiB or the largest
/// buffer rounded up to it), for CPU tests of validation and planning. They overlap nothing for
/// shapes whose largest buffer is below 40 MiB, at bases 256 MiB apart.
#[cfg(test)]
pub(crate) fn fake_buffers(s: &GroupShape, base: u64, alpha: f32) -> GroupBuffers {
    let z = BufferSizes::of(s);
    let largest = [z.a_values, z.a_scales, z.b_values, z.b_scales, 2 * z.c_elements].into_iter().max().unwrap_or(0);
    let stride = (largest as u64).next_multiple_of(0x10_0000).max(0x10_0000);
    let v = |i: u64, len| BufferView { ptr: base + stride * i, len };
    GroupBuffers {
        a_kind: TokenKind::Nvfp4,
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
    use crate::engine::{Alphas, Layout, Pick, Sets};

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
        let too_large = |s: GroupShape| match Problem::new(vec![ok, s], OutputType::F16).unwrap_err() {
            Error::TooLarge { group, field, limit, .. } => (group, field, limit),
            other => panic!("expected TooLarge, got {other:?}"),
        };
        assert_eq!(too_large(GroupShape::new(MAX_DIM + 1, 256, 512)), (Some(1), "m", Limit::Dim));
        let too_many = vec![ok; MAX_GROUPS + 1];
        assert!(matches!(
            Problem::new(too_many, OutputType::F16),
            Err(Error::TooLarge { group: None, field: "groups", limit: Limit::Groups, .. })
        ));
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
        let (first, good) = (good_buffers(&s), fake_buffers(&s, 0x1000_0000, 1.0));
        assert!(validate_buffers(&p, &[first, good]).is_ok());
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
            assert_eq!(field_of(validate_buffers(&p, &[first, bad]).unwrap_err()), (1, field));
        }
    }

    /// A buffer's group and field.
    type Named = (Option<usize>, &'static str);

    fn overlap_of(e: Error) -> (&'static str, Named, Named) {
        match e {
            Error::Overlap { call, output, other } => (call, (output.group, output.field), (other.group, other.field)),
            other => panic!("expected Overlap, got {other:?}"),
        }
    }

    /// Outputs overlapping inputs or each other, within a group and across groups, are refused
    /// naming both buffers; inputs may share memory; groups with `m = 0` and touching buffers
    /// overlap nothing.
    #[test]
    fn outputs_overlap_nothing() {
        let s = GroupShape::new(72, 384, 256);
        let p = Problem::new(vec![s, s, GroupShape::new(0, 384, 256)], OutputType::F16).unwrap();
        let bufs = [fake_buffers(&s, 0, 1.0), fake_buffers(&s, 0x1000_0000, 1.0), fake_buffers(&s, 0x2000_0000, 1.0)];
        assert!(validate_buffers(&p, &bufs).is_ok());
        let c_bytes = 2 * bufs[0].c.len as u64;
        type Edit = fn(&mut [GroupBuffers; 3], u64);
        let cases: [(Edit, Named, Named); 6] = [
            // The case: C laid over the group's own B values.
            (|b, _| b[0].c.ptr = b[0].b_values.ptr, (Some(0), "c"), (Some(0), "b.values")),
            // Eight elements into another group's A scales (from below).
            (|b, n| b[1].c.ptr = b[0].a_scales.ptr - n + 16, (Some(1), "c"), (Some(0), "a.scales")),
            // Containing another group's B scales.
            (|b, _| b[0].c.ptr = b[1].b_scales.ptr - 16, (Some(0), "c"), (Some(1), "b.scales")),
            // Two outputs: overlapping by eight elements (the one that starts inside the other
            // is named as the output), and the same C for both groups (either order).
            (|b, n| b[1].c.ptr = b[0].c.ptr + n - 16, (Some(1), "c"), (Some(0), "c")),
            (|b, _| b[1].c.ptr = b[0].c.ptr, (None, "c"), (None, "c")),
            // An input starting inside C.
            (|b, n| b[1].a_values.ptr = b[0].c.ptr + n - 16, (Some(0), "c"), (Some(1), "a.values")),
        ];
        for (i, (edit, output, other)) in cases.into_iter().enumerate() {
            let mut b = bufs;
            edit(&mut b, c_bytes);
            let got = overlap_of(validate_buffers(&p, &b).unwrap_err());
            if output.0.is_none() {
                assert!(
                    got == ("run", (Some(0), "c"), (Some(1), "c")) || got == ("run", (Some(1), "c"), (Some(0), "c"))
                );
            } else {
                assert_eq!(got, ("run", output, other), "case {i}");
            }
            // The cache validates it the same way, and keeps the last valid call.
            let mut cache = Calls::new(&p);
            assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Upload));
            assert_eq!(call(&mut cache, &p, &b), Err(validate_buffers(&p, &b).unwrap_err()), "case {i}");
            assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Current), "case {i}");
        }
        // Allowed: touching buffers, inputs shared between groups and fields, an empty group's
        // buffers anywhere (it reads and writes nothing).
        let mut b = bufs;
        b[1].c.ptr = b[0].c.ptr + c_bytes;
        b[1].a_values.ptr = b[1].c.ptr + c_bytes;
        b[1].b_values = b[0].b_values;
        b[1].b_scales = b[0].b_scales;
        b[0].a_scales.ptr = b[0].a_values.ptr;
        b[2].c = b[0].c;
        b[2].b_values.ptr = b[0].c.ptr;
        assert!(validate_buffers(&p, &b).is_ok());
    }

    /// Stacked buffers: the groups' parts of one buffer are adjacent, not overlapping; C over
    /// part of A's stacked buffer is refused, naming the groups' parts that share bytes.
    #[test]
    fn stacked_parts_are_adjacent() {
        let shapes = vec![GroupShape::new(24, 136, 192), GroupShape::new(0, 256, 512), GroupShape::new(130, 264, 448)];
        let p = Problem::new(shapes, OutputType::F16).unwrap();
        let at = p.stacked_offsets();
        let total = at[3];
        let v = |i: u64, len| BufferView { ptr: 0x1000_0000 * i, len };
        let whole = [v(1, total.a_values), v(2, total.a_scales), v(3, total.b_values), v(4, total.b_scales)];
        let parts = |whole: [BufferView; 4], c: BufferView| {
            let mut out = vec![];
            stacked_parts(&at, TokenKind::Nvfp4, whole, c, OutputType::F16, [1.0; 3].into_iter(), &mut out);
            out
        };
        let good = parts(whole, v(5, total.c_elements));
        assert_eq!(good[2].a_values.ptr, good[0].a_values.ptr + good[0].a_values.len as u64);
        assert!(validate_buffers(&p, &good).is_ok());
        // C starting in the middle of A's values: group 0's C overlaps group 2's A values.
        let c = BufferView { ptr: whole[0].ptr + at[2].a_values as u64 + 32, len: total.c_elements };
        assert_eq!(
            overlap_of(validate_buffers(&p, &parts(whole, c)).unwrap_err()),
            ("run", (Some(0), "c"), (Some(2), "a.values"))
        );
        // C right after B's scales: touching, fine; one element earlier: group 2's C overlaps.
        let end = whole[3].ptr + total.b_scales as u64;
        assert!(validate_buffers(&p, &parts(whole, BufferView { ptr: end, len: total.c_elements })).is_ok());
        let c = BufferView { ptr: end - 16, len: total.c_elements };
        let err = overlap_of(validate_buffers(&p, &parts(whole, c)).unwrap_err());
        assert_eq!((err.1 .1, err.2), ("c", (Some(2), "b.scales")));
        // The operands in one allocation, back to back: inputs, fine.
        let one = [v(1, total.a_values), v(1, total.a_scales), v(1, total.b_values), v(1, total.b_scales)];
        assert!(validate_buffers(&p, &parts(one, v(5, total.c_elements))).is_ok());
    }

    /// Host time of a full validation (lengths, alignment, types, alphas, the overlap rule) and of
    /// its overlap part alone, for the bench's shapes, d0's 64 groups and 4096 groups (printed;
    /// only correctness is asserted). The cached path ([`BufferCache::check`] with the previous
    /// call's buffers) skips both.
    #[test]
    fn validation_time() {
        use nvfp4_format::generate::shapes;
        let d0 = vec![GroupShape::new(4, 7168, 2048); 64];
        let many = vec![GroupShape::new(4, 512, 256); MAX_GROUPS];
        let sets: [(&str, Vec<GroupShape>); 6] = [
            ("b0", shapes::B0.to_vec()),
            ("b1", shapes::B1.to_vec()),
            ("b2", shapes::B2.to_vec()),
            ("b3", shapes::B3.to_vec()),
            ("d0", d0),
            ("4096 groups", many),
        ];
        for (name, shapes) in sets {
            let p = Problem::new(shapes.clone(), OutputType::F16).unwrap();
            // Groups at descending addresses (the sort has work to do).
            let n = shapes.len() as u64;
            let bufs: Vec<GroupBuffers> =
                shapes.iter().enumerate().map(|(g, s)| fake_buffers(s, 0x1000_0000 * (n - g as u64), 0.5)).collect();
            let mut spans = Vec::with_capacity(5 * shapes.len());
            let best = |f: &mut dyn FnMut()| {
                let reps = (20_000 / shapes.len()).max(10);
                let mut best = f64::INFINITY;
                for _ in 0..10 {
                    let t = std::time::Instant::now();
                    for _ in 0..reps {
                        f();
                    }
                    best = best.min(t.elapsed().as_secs_f64() * 1e6 / reps as f64);
                }
                best
            };
            let full = best(&mut || validate_buffers_in("run", &p, std::hint::black_box(&bufs), &mut spans).unwrap());
            let overlap = best(&mut || {
                spans.clear();
                for (g, b) in std::hint::black_box(&bufs).iter().enumerate() {
                    push_spans(&mut spans, g, b);
                }
                overlap::check("run", &mut spans, overlap::group_fields(&GROUP_FIELDS)).unwrap();
            });
            println!(
                "validate_buffers, {name} ({} groups): {full:.3} us per call, of which the overlap rule {overlap:.3} us",
                shapes.len()
            );
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

    /// What a call must do before its launches: the plan's tables hold its buffers, or not.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    enum TablesState {
        Current,
        Upload,
    }

    /// What a plan decides per call without a GPU: the validation cache, and the engine's upload
    /// rule over the sm_90a layout's signature.
    struct Calls {
        cache: BufferCache,
        uploads: Sets,
        layout: crate::sm90::Sm90Layout,
    }

    impl Calls {
        fn new(p: &Problem) -> Calls {
            let layout = crate::sm90::Sm90Layout::new(p, 132);
            Calls { cache: BufferCache::new(p.groups().len()), uploads: Sets::with(1), layout }
        }
    }

    /// A call with `bufs` and alphas from `alphas`: validated (or the cache's shortcut), and
    /// whether its tables must be uploaded.
    fn call_from(calls: &mut Calls, p: &Problem, alphas: Alphas, bufs: &[GroupBuffers]) -> Result<TablesState> {
        calls.cache.start().extend_from_slice(bufs);
        calls.cache.check(p, "run")?;
        calls.layout.signature(calls.cache.buffers(), calls.uploads.start(alphas));
        Ok(match calls.uploads.pick() {
            Pick::Holds(_) => TablesState::Current,
            _ => TablesState::Upload,
        })
    }

    /// A call with host alphas, not uploading.
    fn call(calls: &mut Calls, p: &Problem, bufs: &[GroupBuffers]) -> Result<TablesState> {
        call_from(calls, p, Alphas::Host, bufs)
    }

    /// A call of a plan with work: check, then upload when asked.
    fn call_and_upload(calls: &mut Calls, p: &Problem, bufs: &[GroupBuffers]) -> Result<TablesState> {
        let state = call(calls, p, bufs)?;
        if state == TablesState::Upload {
            assert_eq!(calls.cache.buffers(), bufs, "the tables are encoded from this call's buffers");
            calls.uploads.done(0);
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
        let mut cache = Calls::new(&p);
        assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Upload));
        for _ in 0..3 {
            assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Current));
        }
        // Without work (or after a failed upload) nothing is marked uploaded: every call asks.
        let mut cache = Calls::new(&p);
        assert_eq!(call(&mut cache, &p, &bufs), Ok(TablesState::Upload));
        assert_eq!(call(&mut cache, &p, &bufs), Ok(TablesState::Upload));
        cache.uploads.done(0);
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
                let mut cache = Calls::new(&p);
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
        let mut cache = Calls::new(&p);
        call_and_upload(&mut cache, &p, &bufs).unwrap();
        assert!(matches!(call_and_upload(&mut cache, &p, &bufs[..2]), Err(Error::InvalidProblem(_))));
        assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Current));
    }

    #[test]
    fn the_cache_remembers_the_validated_calls_and_still_rejects_their_broken_twins() {
        let (p, bufs) = mixed_problem();
        // VALIDATED_CALLS sets of buffers, each valid, at other addresses.
        let sets: Vec<Vec<GroupBuffers>> = (0..VALIDATED_CALLS as u64)
            .map(|i| {
                let mut set = bufs.clone();
                for b in &mut set {
                    for v in [&mut b.a_values, &mut b.a_scales, &mut b.b_values, &mut b.b_scales, &mut b.c] {
                        v.ptr += i << 40;
                    }
                }
                set
            })
            .collect();
        let mut cache = BufferCache::new(p.groups().len());
        for _ in 0..3 {
            for set in &sets {
                cache.start().extend_from_slice(set);
                cache.check(&p, "run").unwrap();
                assert_eq!(cache.buffers(), &set[..]);
            }
        }
        // A remembered call's twin with one length or type changed is validated, and rejected
        // with validation's error; the remembered calls still pass.
        type Breaker = fn(&mut GroupBuffers);
        let cases: [Breaker; 4] =
            [|b| b.a_values.len -= 1, |b| b.c.len += 1, |b| b.c_type = OutputType::Bf16, |b| b.alpha = f32::NAN];
        for (i, break_it) in cases.iter().enumerate() {
            let mut bad = sets[3].clone();
            break_it(&mut bad[0]);
            let want = validate_buffers(&p, &bad).unwrap_err();
            cache.start().extend_from_slice(&bad);
            assert_eq!(cache.check(&p, "run"), Err(want), "case {i}");
            cache.start().extend_from_slice(&sets[3]);
            cache.check(&p, "run").unwrap();
        }
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
                let mut cache = Calls::new(&p);
                assert_eq!(call_and_upload(&mut cache, &p, &bad), Err(want.clone()), "fresh, group {g} case {i}");
                assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Upload));
                assert_eq!(call_and_upload(&mut cache, &p, &bad), Err(want.clone()), "cached, group {g} case {i}");
                assert_eq!(call_and_upload(&mut cache, &p, &bad), Err(want), "again, group {g} case {i}");
                // A rejected call changes nothing: the tables still hold the valid buffers.
                assert_eq!(call_and_upload(&mut cache, &p, &bufs), Ok(TablesState::Current), "group {g} case {i}");
            }
        }
        // Group 1 has M = 0: its lengths are not checked, and a length alone does not re-encode.
        let mut cache = Calls::new(&p);
        call_and_upload(&mut cache, &p, &bufs).unwrap();
        let mut other = bufs.clone();
        other[1].b_values.len = 0;
        assert_eq!(call_and_upload(&mut cache, &p, &other), Ok(TablesState::Current));
        // But its output type is.
        other[1].c_type = OutputType::Bf16;
        let err = call_and_upload(&mut cache, &p, &other).unwrap_err();
        assert_eq!(field_of(err), (1, "c"));
    }

    /// The tables' alphas are the device's after a call with device alphas: a call with host
    /// alphas uploads again even when its alphas equal the placeholder, and a call with device
    /// alphas after one with host alphas too (then the copy overwrites them).
    #[test]
    fn the_cache_tracks_where_the_alphas_come_from() {
        let (p, bufs) = mixed_problem();
        let placeholders: Vec<GroupBuffers> =
            bufs.iter().map(|b| GroupBuffers { alpha: DEVICE_ALPHA_PLACEHOLDER, ..*b }).collect();
        let mut calls = Calls::new(&p);
        let mut call_from = |alphas, bufs: &[GroupBuffers]| {
            let state = call_from(&mut calls, &p, alphas, bufs)?;
            if state == TablesState::Upload {
                calls.uploads.done(0);
            }
            Ok::<_, Error>(state)
        };
        let (host, device) = (Alphas::Host, Alphas::Device(0x7000_0000));
        assert_eq!(call_from(host, &bufs), Ok(TablesState::Upload));
        assert_eq!(call_from(device, &placeholders), Ok(TablesState::Upload));
        assert_eq!(call_from(device, &placeholders), Ok(TablesState::Current));
        assert_eq!(call_from(host, &placeholders), Ok(TablesState::Upload));
        assert_eq!(call_from(host, &placeholders), Ok(TablesState::Current));
        assert_eq!(call_from(device, &placeholders), Ok(TablesState::Upload));
        // A changed address is seen with device alphas too.
        let mut moved = placeholders.clone();
        moved[2].c.ptr += 0x100;
        assert_eq!(call_from(device, &moved), Ok(TablesState::Upload));
        assert_eq!(call_from(device, &moved), Ok(TablesState::Current));
    }

    /// A device alphas buffer: one f32 per group, 4-byte aligned, overlapping no output (an empty
    /// group's C may lie anywhere; inputs may share its memory).
    #[test]
    fn device_alphas_are_checked() {
        let (p, bufs) = mixed_problem();
        let check = |ptr: u64, len: usize| validate_device_alphas("run", &p, BufferView { ptr, len }, &bufs);
        let argument = |r: Result<()>| match r.unwrap_err() {
            Error::InvalidArgument { call: "run", field: "alphas", reason } => reason,
            e => panic!("{e:?}"),
        };
        assert!(check(0x7000_0000, 3).is_ok());
        assert!(argument(check(0x7000_0000, 2)).contains("has 2 f32 values; the plan has 3 groups"));
        assert!(argument(check(0x7000_0000, 4)).contains("has 4"));
        assert!(argument(check(0x7000_0002, 3)).contains("not 4-byte aligned"));
        let c2 = bufs[2].c;
        assert_eq!(overlap_of(check(c2.ptr + 8, 3).unwrap_err()), ("run", (Some(2), "c"), (None, "alphas")));
        assert_eq!(overlap_of(check(c2.ptr - 8, 3).unwrap_err()), ("run", (Some(2), "c"), (None, "alphas")));
        // Touching C, inside an input, or on the C of a group with m = 0: allowed.
        assert!(check(c2.ptr + 2 * c2.len as u64, 3).is_ok());
        assert!(check(c2.ptr - 12, 3).is_ok());
        assert!(check(bufs[0].b_values.ptr, 3).is_ok());
        assert!(check(bufs[1].c.ptr, 3).is_ok());
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
        let mut cache = Calls::new(&p);
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

    /// A W4A16 problem's stacked activations split into each group's `m·K` elements, adjacent;
    /// the parts pass the checks, empty groups with any buffer too; each wrong length,
    /// misalignment, token kind, output type, alpha and overlap is a typed error naming the group
    /// and field.
    #[test]
    fn w4a16_buffers_are_checked_with_typed_errors() {
        let shapes = [(3, 136, 192), (0, 256, 64), (130, 64, 128), (1, 8, 64)];
        let shapes: Vec<GroupShape> = shapes.iter().map(|&(m, n, k)| GroupShape::new(m, n, k)).collect();
        let kind = TokenKind::Dense(Activations::F16);
        let p = Problem::with_tokens(shapes, OutputType::F16, kind).unwrap();
        let at = p.stacked_offsets();
        let total = at[p.groups().len()];
        let base = 0x1_0000_0000u64;
        let v = |ptr: u64, len| BufferView { ptr, len };
        let whole = [
            v(base, total.a_values),
            v(0, 0),
            v(base + 0x100_0000, total.b_values),
            v(base + 0x200_0000, total.b_scales),
        ];
        let mut buffers = vec![];
        let alphas = (0..p.groups().len()).map(|g| g as f32);
        stacked_parts(&at, kind, whole, v(base + 0x300_0000, total.c_elements), OutputType::F16, alphas, &mut buffers);
        let act: Vec<BufferView> = buffers.iter().map(|b| b.a_values).collect();
        assert_eq!(act.iter().map(|v| v.len).collect::<Vec<_>>(), [3 * 192, 0, 130 * 128, 64]);
        assert_eq!(act[2].ptr, base + 2 * 3 * 192);
        assert!(act.windows(2).all(|w| w[0].ptr + 2 * w[0].len as u64 == w[1].ptr), "adjacent");
        validate_buffers(&p, &buffers).unwrap();
        // A group of no rows: whatever its buffers (e.g. a placeholder allocation).
        let mut empty = buffers.clone();
        empty[1].a_values = BufferView { ptr: 0x7, len: 8 };
        validate_buffers(&p, &empty).unwrap();
        type Edit = fn(&mut GroupBuffers);
        let cases: [(Edit, &str); 7] = [
            (|b| b.a_values.len -= 1, "activations"),
            (|b| b.a_values.ptr += 8, "activations"),
            (|b| b.a_kind = TokenKind::Dense(Activations::Bf16), "activations"),
            (|b| b.b_scales.len += 1, "b.scales"),
            (|b| b.c_type = OutputType::Bf16, "c"),
            (|b| b.alpha = f32::NAN, "alpha"),
            (|b| b.b_values.ptr += 4, "b.values"),
        ];
        for (edit, field) in cases {
            let mut b = buffers.clone();
            edit(&mut b[2]);
            assert_eq!(field_of(validate_buffers(&p, &b).unwrap_err()), (2, field));
        }
        // NVFP4 tokens given to a W4A16 problem.
        let mut b = buffers.clone();
        b[0].a_kind = TokenKind::Nvfp4;
        assert_eq!(field_of(validate_buffers(&p, &b).unwrap_err()), (0, "activations"));
        // Group 3's C over group 0's activations.
        let mut b = buffers.clone();
        b[3].c.ptr = act[0].ptr + 16;
        assert_eq!(
            overlap_of(validate_buffers(&p, &b).unwrap_err()),
            ("run", (Some(3), "c"), (Some(0), "activations"))
        );
        assert!(matches!(validate_buffers(&p, &buffers[..3]), Err(Error::InvalidProblem(_))));
    }
}
