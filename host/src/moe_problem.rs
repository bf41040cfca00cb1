//! The shape of a grouped GEMM with device-resident group sizes ([`MoeProblem`], [`TokenLayout`]),
//! the status bits of its clamped sizes ([`SizeStatus`]), and the validation of one call's buffers
//! ([`MoeBuffers`], [`validate_moe_buffers`]). Pure: no driver calls. Below the architectures'
//! device-sized plans (`sm90/`, `sm100/`), which read it, and [`crate::moe`], which re-exports it
//! with the plan.

use crate::error::{invalid, within, BufferName, Error, Result};
use crate::overlap::{self, Span};
use crate::problem::{BufferView, Nvfp4Sizes, OutputType, TokenKind, BUFFER_ALIGN};
use crate::rules::{self, Limit};
use nvfp4_gemm_abi::moe::block::Activation as KernelActivation;
use nvfp4_gemm_abi::moe::{self as abi, DeviceSizes, GroupRows};
use nvfp4_gemm_abi::scale_layout::blocked_bytes;
use nvfp4_gemm_abi::sm90::w4a16::Activations;
use std::fmt;

/// Where the groups' tokens are in the token tensor A (and their outputs in C).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TokenLayout {
    /// A is `[max_tokens, K]`, C `[max_tokens, N]`; the device array `offsets[G + 1]` (`u32`)
    /// says group `g` owns rows `offsets[g] .. offsets[g + 1]` (a router's sort). Offsets above
    /// `max_tokens` are clamped to it, a decreasing offset empties its group (both flagged).
    Contiguous {
        /// The bound `T` on the total number of tokens (rows of A and C).
        max_tokens: usize,
    },
    /// A is `[G, max_rows, K]`, C `[G, max_rows, N]`; the device array `counts[G]` (`u32`) says
    /// group `g` owns its first `counts[g]` rows. Counts above `max_rows` are clamped (flagged).
    Masked {
        /// The bound `M_max` on each group's tokens.
        max_rows: usize,
    },
}

/// A grouped GEMM with device-resident group sizes: `G` groups of `N` weights and reduction
/// length `K` (the same for every group), tokens in a [`TokenLayout`].
///
/// Rules ([`crate::rules`], checked by [`MoeProblem::new`]): `1 ≤ G ≤` [`MAX_GROUPS`](crate::rules::MAX_GROUPS); `K` a
/// positive multiple of 64; `N` a positive multiple of 8; the layout's bound at least 1; `K`, `N` and the bound at
/// most [`crate::rules::MAX_DIM`]; A, C and the work list's capacity small enough for the
/// kernels' 32-bit indexing (`token_rows · K`, `scale_rows · K`, `token_rows · N` and the most
/// output tiles below `2^31`); every buffer together within [`crate::rules::MAX_DEVICE_BYTES`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MoeProblem {
    groups: usize,
    n: usize,
    k: usize,
    layout: TokenLayout,
    output: OutputType,
    tokens: TokenKind,
    epilogue: Option<ActivationEpilogue>,
}

/// The MoE block's activation in the epilogue of its first grouped GEMM
/// ([`MoeProblem::with_activation_epilogue`]): the GEMM's output `h = D(alpha · A·Bᵀ)` is not
/// stored; its rows become the second GEMM's NVFP4 tokens `z` (`[token_rows, I]`, the activation
/// of each row's `h` quantized with the group's global scale), bit for bit what `moe_activate`
/// writes from the stored `h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ActivationEpilogue {
    /// The activation.
    pub activation: KernelActivation,
    /// Gated (`N = 2I`, `z = act(gate) · up`; the weights' rows interleaved, [`interleave_w13_row`])
    /// or not (`N = I`).
    pub gated: bool,
}

/// The row of the plain W13 (`[2I, H]`: the gate rows, then the up rows) that row `r` of the
/// weights of an activation-epilogue problem must hold (gated; the identity otherwise): each
/// 64-row slice holds the gate rows of 32 intermediate columns, then their up rows, so that one
/// consumer warpgroup of the GEMM has both inputs of its columns of `z`.
pub fn interleave_w13_row(r: usize, inter: usize, gated: bool) -> usize {
    nvfp4_gemm_abi::moe::block::epilogue_source_row(r as u32, inter as u32, gated) as usize
}

/// The global scale a W4A4 output is quantized with (the next GEMM's input scale).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum GlobalScale {
    /// One scale for every row: finite, positive.
    Tensor(f32),
    /// One scale per group (per local expert: a checkpoint's per-expert input scales), `f32
    /// [groups]` on the device, 4-byte aligned; a row of group `g` is quantized with entry `g`.
    /// The entries must be finite and positive: they are device memory, which the call does not
    /// read on the host (the expert block checks the scales it uploads).
    PerGroup(BufferView),
}

/// Where an activation-epilogue problem's call writes `z` ([`MoeBuffers::activated`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ActivatedOutput {
    /// Packed e2m1 values, [`MoeProblem::activated_sizes`]`.values` bytes, 16-byte aligned.
    pub values: BufferView,
    /// Blocked e4m3 scales in the layout's grouped form, `.scales` bytes, 16-byte aligned.
    pub scales: BufferView,
    /// The quantizer's global scale(s).
    pub global_scale: GlobalScale,
}

fn problem_error(reason: String) -> Error {
    Error::InvalidProblem(reason)
}

impl MoeProblem {
    /// Validates the shape, in constant time. Errors: [`Error::InvalidProblem`] for a shape
    /// against the rules, [`Error::TooLarge`] for a limit exceeded ([`crate::rules`]).
    pub fn new(groups: usize, n: usize, k: usize, layout: TokenLayout, output: OutputType) -> Result<MoeProblem> {
        if groups == 0 {
            return Err(problem_error("0 groups; a device-sized problem needs at least 1".into()));
        }
        within(None, "groups", groups as u64, Limit::Groups)?;
        if let Some(reason) = rules::k_rule(k) {
            return Err(problem_error(format!("k: {reason}")));
        }
        if let Some(reason) = rules::n_rule(n) {
            return Err(problem_error(format!("n: {reason}")));
        }
        let (bound_field, bound) = match layout {
            TokenLayout::Contiguous { max_tokens } => ("max_tokens", max_tokens),
            TokenLayout::Masked { max_rows } => ("max_rows", max_rows),
        };
        if bound == 0 {
            return Err(problem_error(format!("{bound_field} = 0; the token bound must be at least 1")));
        }
        for (field, v) in [("k", k), ("n", n), (bound_field, bound)] {
            within(None, field, v as u64, Limit::Dim)?;
        }
        // Token rows in 64 bits (`G · M_max` may not fit the abi's `u32` until checked).
        let rows = match layout {
            TokenLayout::Contiguous { max_tokens } => max_tokens as u64,
            TokenLayout::Masked { max_rows } => groups as u64 * max_rows as u64,
        };
        let (k64, n64) = (k as u64, n as u64);
        within(None, "a.values", rows * k64, Limit::Index32)?;
        within(None, "c", rows * n64, Limit::Index32)?;
        // From here every row count fits the abi's `u32` formulas (rows < 2^25, G ≤ 2^12).
        let p = MoeProblem { groups, n, k, layout, output, tokens: TokenKind::Nvfp4, epilogue: None };
        let scale_rows = p.scale_rows() as u64;
        within(None, "a.scales", scale_rows * k64, Limit::Index32)?;
        let tiles = abi::max_m_tiles(&p.device_sizes(0)) * nvfp4_gemm_abi::sm90::n_tiles(n as u32) as u64;
        within(None, "tiles", tiles, Limit::Index32)?;
        let b = p.b_sizes();
        let parts = [
            ("sizes", 4 * p.sizes_len() as u64),
            ("a.values", rows * k64 / 2),
            ("a.scales", scale_rows * k64 / 16),
            ("c", 2 * rows * n64),
            ("weights", groups as u64 * (b.values + b.scales) as u64),
            ("workspace", 2 * rows * k64),
        ];
        let mut bytes = 0;
        for (field, part) in parts {
            bytes += part;
            within(None, field, bytes, Limit::DeviceBytes)?;
        }
        Ok(p)
    }

    /// Groups `G`.
    pub fn groups(&self) -> usize {
        self.groups
    }
    /// Weights per group `N` (columns of C).
    pub fn n(&self) -> usize {
        self.n
    }
    /// Reduction length `K`.
    pub fn k(&self) -> usize {
        self.k
    }
    /// The token layout.
    pub fn layout(&self) -> TokenLayout {
        self.layout
    }
    /// The output type.
    pub fn output(&self) -> OutputType {
        self.output
    }

    /// The token operand (NVFP4 unless [`MoeProblem::with_tokens`] said otherwise).
    pub fn tokens(&self) -> TokenKind {
        self.tokens
    }

    /// This problem with the token operand `tokens`: NVFP4 tokens in the layout's token tensor,
    /// or W4A16's 16-bit activations `[token_rows, K]` read as they are (no quantization, no
    /// workspace; sm_90a). The limits checked by [`MoeProblem::new`] hold for either.
    pub fn with_tokens(mut self, tokens: TokenKind) -> MoeProblem {
        self.tokens = tokens;
        self
    }

    /// This problem as the MoE block's first GEMM with `activation` in its epilogue
    /// ([`ActivationEpilogue`]): its output is the second GEMM's NVFP4 tokens
    /// ([`MoeProblem::activated_sizes`], [`MoeBuffers::activated`]) and C is not written (a call
    /// passes an empty C). NVFP4 tokens, the contiguous layout; `I = N/2` (gated) or `N` a
    /// multiple of 64 (the second GEMM's K); sm_90a ([`crate::MoePlan::new`] refuses it on
    /// sm_100a).
    ///
    /// Errors: [`Error::InvalidProblem`] for a problem that breaks one of these rules,
    /// [`Error::TooLarge`] for a `z` beyond the kernels' 32-bit byte offsets.
    pub fn with_activation_epilogue(mut self, activation: KernelActivation, gated: bool) -> Result<MoeProblem> {
        self.epilogue = Some(ActivationEpilogue { activation, gated });
        self.check_epilogue()?;
        Ok(self)
    }

    /// The activation epilogue, if any.
    pub fn activation_epilogue(&self) -> Option<ActivationEpilogue> {
        self.epilogue
    }

    /// The intermediate size `I` of an activation-epilogue problem.
    fn inter(&self, gated: bool) -> usize {
        if gated {
            self.n / 2
        } else {
            self.n
        }
    }

    /// The rules of [`MoeProblem::with_activation_epilogue`] (none without the epilogue).
    pub(crate) fn check_epilogue(&self) -> Result<()> {
        let Some(e) = self.epilogue else { return Ok(()) };
        if self.tokens != TokenKind::Nvfp4 {
            return Err(problem_error("the activation epilogue takes NVFP4 tokens (W4A4)".into()));
        }
        if !matches!(self.layout, TokenLayout::Contiguous { .. }) {
            return Err(problem_error("the activation epilogue takes the contiguous token layout".into()));
        }
        let inter = self.inter(e.gated);
        if (e.gated && self.n % 2 != 0) || inter % rules::K_MULTIPLE != 0 {
            return Err(problem_error(format!(
                "n = {}: the activation epilogue's I = {inter} must be a multiple of {} (the second GEMM's K)",
                self.n,
                rules::K_MULTIPLE
            )));
        }
        let z = self.activated_sizes().expect("an epilogue problem");
        within(None, "activated.values", z.values as u64, Limit::Index32)?;
        within(None, "activated.scales", z.scales as u64, Limit::Index32)?;
        Ok(())
    }

    /// Sizes of an activation-epilogue problem's output `z` (the second GEMM's token tensor):
    /// values `token_rows · I/2` bytes, scales `scale_rows · I/16`; `None` without the epilogue.
    pub fn activated_sizes(&self) -> Option<Nvfp4Sizes> {
        self.epilogue.map(|e| {
            let inter = self.inter(e.gated);
            Nvfp4Sizes { values: self.token_rows() * inter / 2, scales: self.scale_rows() * inter / 16 }
        })
    }

    /// The sizes the device kernels read (`sizes`: the device address of the sizes array).
    pub(crate) fn device_sizes(&self, sizes: u64) -> DeviceSizes {
        let (layout, rows) = match self.layout {
            TokenLayout::Contiguous { max_tokens } => (abi::LAYOUT_CONTIGUOUS, max_tokens),
            TokenLayout::Masked { max_rows } => (abi::LAYOUT_MASKED, max_rows),
        };
        DeviceSizes { sizes, layout, groups: self.groups as u32, rows: rows as u32, reserved: 0 }
    }

    /// Rows of the token tensor A and of C: `T`, or `G · M_max`.
    pub fn token_rows(&self) -> usize {
        self.device_sizes(0).token_rows() as usize
    }

    /// Rows of A's blocked scale tensor (each group's rows start a new 128-row block):
    /// `128 · (⌈T/128⌉ + G)` or `G · ⌈M_max/128⌉ · 128`.
    pub fn scale_rows(&self) -> usize {
        self.device_sizes(0).scale_rows() as usize
    }

    /// `u32` entries of the device sizes array: `G + 1` offsets or `G` counts.
    pub fn sizes_len(&self) -> usize {
        self.device_sizes(0).sizes_len() as usize
    }

    /// Sizes of the token tensor A: values `token_rows · K/2` bytes, scales `scale_rows · K/16`.
    pub fn a_sizes(&self) -> Nvfp4Sizes {
        Nvfp4Sizes { values: self.token_rows() * self.k / 2, scales: self.scale_rows() * self.k / 16 }
    }

    /// Sizes of one group's weights B (`N x K`).
    pub fn b_sizes(&self) -> Nvfp4Sizes {
        Nvfp4Sizes { values: self.n * self.k / 2, scales: blocked_bytes(self.n as u32, self.k as u32) }
    }

    /// Elements of C: `token_rows · N` (0 for an activation-epilogue problem, which writes `z`
    /// instead).
    pub fn c_elements(&self) -> usize {
        if self.epilogue.is_some() {
            0
        } else {
            self.token_rows() * self.n
        }
    }

    /// The rows of every group for the sizes array `sizes` (host copy), clamped exactly as the
    /// device does, and the status bits the device would raise: for references and tests.
    pub fn group_rows(&self, sizes: &[u32]) -> Result<(Vec<GroupRows>, SizeStatus)> {
        if sizes.len() != self.sizes_len() {
            return Err(invalid(
                "group_rows",
                "sizes",
                format!("has {} entries, needs {}", sizes.len(), self.sizes_len()),
            ));
        }
        let s = self.device_sizes(0);
        let rows: Vec<GroupRows> = (0..self.groups as u32).map(|g| s.group(g, |i| sizes[i as usize])).collect();
        let status = rows.iter().fold(0, |acc, r| acc | r.status);
        Ok((rows, SizeStatus(status)))
    }
}

/// The plan's sticky status word: which sizes were beyond the plan's bounds since the last
/// [`MoePlan::clear_status`](crate::moe::MoePlan::clear_status) (each was clamped; see [`TokenLayout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SizeStatus(pub u32);

impl SizeStatus {
    /// No size was beyond the bounds.
    pub fn is_ok(self) -> bool {
        self.0 == 0
    }
    /// An offset was above `max_tokens` (contiguous).
    pub fn rows_over_bound(self) -> bool {
        self.0 & abi::STATUS_ROWS_OVER_BOUND != 0
    }
    /// An offset was below the previous one (contiguous).
    pub fn offsets_decreasing(self) -> bool {
        self.0 & abi::STATUS_OFFSETS_DECREASING != 0
    }
    /// A count was above `max_rows` (masked).
    pub fn count_over_bound(self) -> bool {
        self.0 & abi::STATUS_COUNT_OVER_BOUND != 0
    }
    /// The schedule did not fit the work list (never for sizes within the bounds).
    pub fn work_overflow(self) -> bool {
        self.0 & abi::STATUS_WORK_OVERFLOW != 0
    }
}

impl fmt::Display for SizeStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_ok() {
            return write!(f, "ok");
        }
        let names = [
            (self.rows_over_bound(), "offsets above max_tokens"),
            (self.offsets_decreasing(), "decreasing offsets"),
            (self.count_over_bound(), "counts above max_rows"),
            (self.work_overflow(), "work list overflow"),
        ];
        let list: Vec<&str> = names.iter().filter(|(on, _)| *on).map(|(_, n)| *n).collect();
        write!(f, "sizes clamped: {}", list.join(", "))
    }
}

/// The token operand A of one call, as the validator sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeTokens {
    /// NVFP4 tokens (W4A4, [`MoePlan`](crate::moe::MoePlan)): packed values and blocked scales
    /// (bytes, [`MoeProblem::a_sizes`]).
    Nvfp4 {
        /// Packed values.
        values: BufferView,
        /// Blocked scales.
        scales: BufferView,
    },
    /// 16-bit activations `[token_rows, K]` of type `kind`, read as they are (W4A16,
    /// a W4A16 [`MoePlan`](crate::moe::MoePlan); elements).
    Dense {
        /// The activations.
        activations: BufferView,
        /// Their type.
        kind: Activations,
    },
}

impl MoeTokens {
    /// The address of A's first byte (values or activations).
    pub fn base(&self) -> u64 {
        match self {
            MoeTokens::Nvfp4 { values, .. } => values.ptr,
            MoeTokens::Dense { activations, .. } => activations.ptr,
        }
    }

    /// The address of A's block scales (0 for activations, which have none).
    pub fn scales(&self) -> u64 {
        match self {
            MoeTokens::Nvfp4 { scales, .. } => scales.ptr,
            MoeTokens::Dense { .. } => 0,
        }
    }

    /// The activations' type, `None` for NVFP4 tokens.
    pub fn dense_kind(&self) -> Option<Activations> {
        match self {
            MoeTokens::Nvfp4 { .. } => None,
            MoeTokens::Dense { kind, .. } => Some(*kind),
        }
    }
}

/// Addresses and lengths of one call's buffers, as the validator sees them (and the layout code
/// of each architecture reads them; public for the device model's tests, `model-tests/`).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeBuffers {
    /// The sizes array (`u32` elements).
    pub sizes: BufferView,
    /// The token operand A.
    pub a: MoeTokens,
    /// Each group's weight values and scales (bytes).
    pub weights: Vec<(BufferView, BufferView)>,
    /// Each group's alpha.
    pub alphas: Vec<f32>,
    /// C (elements).
    pub c: BufferView,
    /// C's element type.
    pub c_type: OutputType,
    /// An activation-epilogue problem's output `z` ([`MoeProblem::with_activation_epilogue`]);
    /// `None` for every other problem.
    pub activated: Option<ActivatedOutput>,
}

/// Checks one call's buffers against the problem, as [`MoePlan::run`](crate::moe::MoePlan::run) does before any launch.
/// Pure: runs on the CPU.
pub fn validate_moe_buffers(p: &MoeProblem, b: &MoeBuffers) -> Result<()> {
    const CALL: &str = "moe run";
    if b.a.dense_kind() != p.tokens.activations() {
        let (field, what) = match b.a.dense_kind() {
            Some(kind) => ("activations", format!("{kind:?} activations")),
            None => ("a", "NVFP4 tokens".to_owned()),
        };
        let plan = match p.tokens.activations() {
            Some(kind) => format!("a W4A16 plan of {kind:?} activations"),
            None => "a plan of NVFP4 tokens".to_owned(),
        };
        return Err(invalid(CALL, field, format!("{what} given to {plan}")));
    }
    let a = p.a_sizes();
    let none = BufferView { ptr: 0, len: 0 };
    // The token operand's buffers: (field, view, elements, element bytes); an empty second one
    // for activations.
    let tokens = match b.a {
        MoeTokens::Nvfp4 { values, scales } => [("a.values", values, a.values, 1), ("a.scales", scales, a.scales, 1)],
        MoeTokens::Dense { activations, .. } => {
            [("activations", activations, p.token_rows() * p.k, 2), ("", none, 0, 1)]
        }
    };
    let checks = [
        ("sizes", b.sizes, p.sizes_len(), 4),
        (tokens[0].0, tokens[0].1, tokens[0].2, BUFFER_ALIGN),
        (tokens[1].0, tokens[1].1, tokens[1].2, BUFFER_ALIGN),
        ("c", b.c, p.c_elements(), BUFFER_ALIGN),
    ];
    for (field, view, len, align) in checks {
        if field.is_empty() {
            continue;
        }
        if view.len != len {
            return Err(invalid(CALL, field, format!("has {} elements; the problem needs exactly {len}", view.len)));
        }
        if view.ptr % align != 0 {
            return Err(invalid(CALL, field, format!("address {:#x} is not {align}-byte aligned", view.ptr)));
        }
    }
    if b.c_type != p.output {
        return Err(invalid(CALL, "c", format!("is {:?} but the problem's output is {:?}", b.c_type, p.output)));
    }
    if b.weights.len() != p.groups {
        return Err(invalid(CALL, "weights", format!("{} given for {} groups", b.weights.len(), p.groups)));
    }
    if b.alphas.len() != p.groups {
        return Err(invalid(CALL, "alphas", format!("{} given for {} groups", b.alphas.len(), p.groups)));
    }
    let w = p.b_sizes();
    for (g, ((values, scales), alpha)) in b.weights.iter().zip(&b.alphas).enumerate() {
        for (field, view, len) in [("b.values", values, w.values), ("b.scales", scales, w.scales)] {
            if view.len != len {
                return Err(Error::group(
                    g,
                    field,
                    format!("has {} elements; n={} k={} needs exactly {len}", view.len, p.n, p.k),
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
        if !alpha.is_finite() {
            return Err(Error::group(g, "alpha", format!("{alpha} is not finite")));
        }
    }
    validate_activated(p, b, CALL, &tokens)?;
    // C is the only output: it overlaps none of the inputs (which may share memory). Ids: 0..4
    // the call's buffers, then each group's weight values and scales.
    let fields = ["c", "sizes", tokens[0].0, tokens[1].0];
    let inputs = [
        Span::new(1, b.sizes, 4, false),
        Span::new(2, tokens[0].1, tokens[0].3, false),
        Span::new(3, tokens[1].1, tokens[1].3, false),
    ];
    let name = |id: u32| buffer_name(&fields, id);
    overlap::check_one_output(CALL, Span::new(0, b.c, 2, true), inputs.into_iter().chain(weight_spans(b, 4)), name)
}

/// The spans of every group's weight values and scales (inputs), ids from `first` on (two per
/// group), for the overlap checks of [`validate_moe_buffers`].
fn weight_spans(b: &MoeBuffers, first: u32) -> impl Iterator<Item = Span> + '_ {
    b.weights.iter().enumerate().flat_map(move |(g, (values, scales))| {
        let id = first + 2 * g as u32;
        [Span::new(id, *values, 1, false), Span::new(id + 1, *scales, 1, false)]
    })
}

/// The name of span `id`: `fields[id]` for the call's buffers, then a group's weight values or
/// scales ([`weight_spans`] from `fields.len()`).
fn buffer_name(fields: &[&'static str], id: u32) -> BufferName {
    let first = fields.len();
    match id as usize {
        i if i < first => BufferName { group: None, field: fields[i] },
        i => BufferName { group: Some((i - first) / 2), field: ["b.values", "b.scales"][(i - first) % 2] },
    }
}

/// An activation-epilogue problem's output checks ([`validate_moe_buffers`]): present exactly
/// when the problem has the epilogue; `z`'s lengths and alignment; its global scale(s); `z`
/// overlapping no input (the inputs may share memory) and its two parts apart.
fn validate_activated(
    p: &MoeProblem,
    b: &MoeBuffers,
    call: &'static str,
    tokens: &[(&'static str, BufferView, usize, u64); 2],
) -> Result<()> {
    let out = match (p.activated_sizes(), b.activated) {
        (None, None) => return Ok(()),
        (None, Some(_)) => {
            return Err(invalid(call, "activated", "given to a problem without the activation epilogue"))
        }
        (Some(_), None) => {
            return Err(invalid(call, "activated", "the problem's activation epilogue writes it; none given"))
        }
        (Some(z), Some(out)) => {
            for (field, view, len) in
                [("activated.values", out.values, z.values), ("activated.scales", out.scales, z.scales)]
            {
                if view.len != len {
                    return Err(invalid(
                        call,
                        field,
                        format!("has {} elements; the problem needs exactly {len}", view.len),
                    ));
                }
                if view.ptr % BUFFER_ALIGN != 0 {
                    return Err(invalid(
                        call,
                        field,
                        format!("address {:#x} is not {BUFFER_ALIGN}-byte aligned", view.ptr),
                    ));
                }
            }
            out
        }
    };
    let mut spans = vec![
        Span::new(0, out.values, 1, true),
        Span::new(1, out.scales, 1, true),
        Span::new(2, b.sizes, 4, false),
        Span::new(3, tokens[0].1, tokens[0].3, false),
        Span::new(4, tokens[1].1, tokens[1].3, false),
    ];
    match out.global_scale {
        GlobalScale::Tensor(s) => {
            if !(s.is_finite() && s > 0.0) {
                return Err(invalid(call, "activated.global_scale", format!("{s} is not finite and positive")));
            }
        }
        GlobalScale::PerGroup(v) => {
            if v.len != p.groups {
                return Err(invalid(
                    call,
                    "activated.global_scale",
                    format!("has {} elements; one per group needs exactly {}", v.len, p.groups),
                ));
            }
            if v.ptr % 4 != 0 {
                return Err(invalid(
                    call,
                    "activated.global_scale",
                    format!("address {:#x} is not 4-byte aligned", v.ptr),
                ));
            }
            spans.push(Span::new(5, v, 4, false));
        }
    }
    spans.extend(weight_spans(b, 6));
    let fields = ["activated.values", "activated.scales", "sizes", tokens[0].0, tokens[1].0, "activated.global_scale"];
    overlap::check(call, &mut spans, |id| buffer_name(&fields, id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::MAX_GROUPS;

    fn contiguous(groups: usize, t: usize) -> MoeProblem {
        MoeProblem::new(groups, 256, 512, TokenLayout::Contiguous { max_tokens: t }, OutputType::F16).unwrap()
    }

    #[test]
    fn problem_rules_and_sizes() {
        let p = contiguous(4, 300);
        assert_eq!((p.token_rows(), p.scale_rows(), p.sizes_len()), (300, 128 * 7, 5));
        assert_eq!(p.a_sizes(), Nvfp4Sizes { values: 300 * 256, scales: 128 * 7 * 32 });
        assert_eq!(p.b_sizes(), Nvfp4Sizes { values: 256 * 256, scales: 256 * 32 });
        assert_eq!(p.c_elements(), 300 * 256);
        let m = MoeProblem::new(3, 136, 64, TokenLayout::Masked { max_rows: 20 }, OutputType::Bf16).unwrap();
        assert_eq!((m.token_rows(), m.scale_rows(), m.sizes_len(), m.c_elements()), (60, 384, 3, 60 * 136));
        let bad = |g, n, k, layout| MoeProblem::new(g, n, k, layout, OutputType::F16).is_err();
        let c = TokenLayout::Contiguous { max_tokens: 8 };
        assert!(bad(0, 8, 64, c));
        assert!(bad(MAX_GROUPS + 1, 8, 64, c));
        assert!(bad(1, 8, 100, c));
        assert!(bad(1, 12, 64, c));
        assert!(bad(1, 8, 64, TokenLayout::Contiguous { max_tokens: 0 }));
        assert!(bad(1, 8, 64, TokenLayout::Masked { max_rows: 0 }));
        assert!(bad(1, 8, 1 << 20, TokenLayout::Contiguous { max_tokens: 4096 }), "32-bit indexing");
        assert!(!bad(MAX_GROUPS, 8, 64, c));
    }

    #[test]
    fn group_rows_clamp_like_the_device() {
        let p = contiguous(3, 100);
        let (rows, status) = p.group_rows(&[0, 40, 30, 120]).unwrap();
        assert_eq!(rows.iter().map(|r| (r.first, r.rows)).collect::<Vec<_>>(), vec![(0, 40), (40, 0), (30, 70)]);
        assert!(status.rows_over_bound() && status.offsets_decreasing() && !status.count_over_bound());
        assert_eq!(status.to_string(), "sizes clamped: offsets above max_tokens, decreasing offsets");
        assert!(p.group_rows(&[0, 1, 2]).is_err());
        let m = MoeProblem::new(2, 8, 64, TokenLayout::Masked { max_rows: 16 }, OutputType::F16).unwrap();
        let (rows, status) = m.group_rows(&[3, 17]).unwrap();
        assert_eq!(
            rows.iter().map(|r| (r.first, r.rows, r.scale_first)).collect::<Vec<_>>(),
            vec![(0, 3, 0), (16, 16, 128)]
        );
        assert!(status.count_over_bound());
        assert_eq!(SizeStatus(0).to_string(), "ok");
    }

    fn good_buffers(p: &MoeProblem) -> MoeBuffers {
        let a = p.a_sizes();
        let w = p.b_sizes();
        let v = |i: u64, len| BufferView { ptr: 0x1000_0000 * i, len };
        MoeBuffers {
            sizes: v(1, p.sizes_len()),
            a: MoeTokens::Nvfp4 { values: v(2, a.values), scales: v(3, a.scales) },
            weights: (0..p.groups() as u64).map(|g| (v(10 + 2 * g, w.values), v(11 + 2 * g, w.scales))).collect(),
            alphas: vec![1.0; p.groups()],
            c: v(4, p.c_elements()),
            c_type: p.output(),
            activated: None,
        }
    }

    fn values(b: &mut MoeBuffers) -> &mut BufferView {
        match &mut b.a {
            MoeTokens::Nvfp4 { values, .. } => values,
            MoeTokens::Dense { activations, .. } => activations,
        }
    }

    fn scales(b: &mut MoeBuffers) -> &mut BufferView {
        match &mut b.a {
            MoeTokens::Nvfp4 { scales, .. } => scales,
            MoeTokens::Dense { .. } => panic!("activations have no scales"),
        }
    }

    /// W4A16's activations: `token_rows · K` 16-bit elements, 16-byte aligned, named
    /// `activations`; C may not overlap them (2 bytes per element).
    #[test]
    fn activations_are_checked_like_a() {
        let nvfp4 = contiguous(3, 300);
        let p = nvfp4.clone().with_tokens(TokenKind::Dense(Activations::F16));
        let mut b = good_buffers(&nvfp4);
        let nvfp4_buffers = b.clone();
        b.a = MoeTokens::Dense { activations: BufferView { ptr: 0x2000_0000, len: 300 * 512 }, kind: Activations::F16 };
        assert!(validate_moe_buffers(&p, &b).is_ok());
        // The token operand must be the problem's: activations of its type, or NVFP4 tokens.
        let refused = |p: &MoeProblem, b: &MoeBuffers| match validate_moe_buffers(p, b).unwrap_err() {
            Error::InvalidArgument { field, reason, .. } => format!("{field}: {reason}"),
            other => panic!("{other:?}"),
        };
        assert_eq!(refused(&nvfp4, &b), "activations: F16 activations given to a plan of NVFP4 tokens");
        assert_eq!(refused(&p, &nvfp4_buffers), "a: NVFP4 tokens given to a W4A16 plan of F16 activations");
        let bf16 = nvfp4.clone().with_tokens(TokenKind::Dense(Activations::Bf16));
        assert_eq!(refused(&bf16, &b), "activations: F16 activations given to a W4A16 plan of Bf16 activations");
        let field = |b: &MoeBuffers| match validate_moe_buffers(&p, b).unwrap_err() {
            Error::InvalidArgument { field, .. } => field,
            Error::Overlap { other, .. } => other.field,
            other => panic!("{other:?}"),
        };
        let edits: [fn(&mut BufferView); 2] = [|v| v.len -= 1, |v| v.ptr += 8];
        for edit in edits {
            let mut bad = b.clone();
            edit(values(&mut bad));
            assert_eq!(field(&bad), "activations");
        }
        // The last element's second byte meets C.
        let mut bad = b.clone();
        bad.c.ptr = 0x2000_0000 + 2 * 300 * 512 - 16;
        assert_eq!(field(&bad), "activations");
        bad.c.ptr += 16;
        assert!(validate_moe_buffers(&p, &bad).is_ok());
    }

    #[test]
    fn run_buffers_are_checked_with_typed_errors() {
        let p = contiguous(3, 300);
        assert!(validate_moe_buffers(&p, &good_buffers(&p)).is_ok());
        type Breaker = fn(&mut MoeBuffers);
        let argument_cases: [(&str, Breaker); 9] = [
            ("sizes", |b| b.sizes.len = 3),
            ("sizes", |b| b.sizes.ptr += 2),
            ("a.values", |b| values(b).len -= 1),
            ("a.scales", |b| scales(b).len = 300 * 32), // not the grouped scale tensor
            ("a.scales", |b| scales(b).ptr += 8),
            ("c", |b| b.c.len += 1),
            ("c", |b| b.c_type = OutputType::Bf16),
            ("weights", |b| {
                b.weights.pop();
            }),
            ("alphas", |b| b.alphas.push(1.0)),
        ];
        for (field, break_it) in argument_cases {
            let mut b = good_buffers(&p);
            break_it(&mut b);
            match validate_moe_buffers(&p, &b).unwrap_err() {
                Error::InvalidArgument { field: f, .. } => assert_eq!(f, field),
                other => panic!("{field}: {other:?}"),
            }
        }
        let group_cases: [(&str, Breaker); 3] = [
            ("b.values", |b| b.weights[1].0.len += 1),
            ("b.scales", |b| b.weights[1].1.ptr += 4),
            ("alpha", |b| b.alphas[1] = f32::INFINITY),
        ];
        for (field, break_it) in group_cases {
            let mut b = good_buffers(&p);
            break_it(&mut b);
            match validate_moe_buffers(&p, &b).unwrap_err() {
                Error::InvalidGroup { group, field: f, .. } => assert_eq!((group, f), (1, field)),
                other => panic!("{field}: {other:?}"),
            }
        }
    }

    /// The activation epilogue's rules: NVFP4 tokens, the contiguous layout, I a multiple of 64;
    /// its `z` sizes; C empty.
    #[test]
    fn activation_epilogue_problems() {
        use KernelActivation::{Relu2, Silu};
        let p = MoeProblem::new(4, 256, 512, TokenLayout::Contiguous { max_tokens: 300 }, OutputType::Bf16).unwrap();
        let gated = p.clone().with_activation_epilogue(Silu, true).unwrap();
        assert_eq!(gated.activation_epilogue(), Some(ActivationEpilogue { activation: Silu, gated: true }));
        // I = 128: values 300 · 64 bytes, scales 128 · (⌈300/128⌉ + 4) rows of 8 bytes.
        assert_eq!(gated.activated_sizes(), Some(Nvfp4Sizes { values: 300 * 64, scales: 128 * 7 * 8 }));
        assert_eq!((gated.c_elements(), p.c_elements()), (0, 300 * 256));
        let plain = p.clone().with_activation_epilogue(Relu2, false).unwrap();
        assert_eq!(plain.activated_sizes(), Some(Nvfp4Sizes { values: 300 * 128, scales: 128 * 7 * 16 }));
        assert_eq!(p.activated_sizes(), None);
        let refused = |p: MoeProblem, gated: bool| match p.with_activation_epilogue(Silu, gated) {
            Err(Error::InvalidProblem(reason)) => reason,
            other => panic!("{other:?}"),
        };
        let w4a16 = p.clone().with_tokens(TokenKind::Dense(Activations::Bf16));
        assert!(refused(w4a16, true).contains("NVFP4 tokens"));
        let masked = MoeProblem::new(4, 256, 512, TokenLayout::Masked { max_rows: 30 }, OutputType::Bf16).unwrap();
        assert!(refused(masked, true).contains("contiguous"));
        let n192 = MoeProblem::new(4, 192, 512, TokenLayout::Contiguous { max_tokens: 30 }, OutputType::F16).unwrap();
        assert!(refused(n192.clone(), true).contains("I = 96 must be a multiple of 64"));
        assert!(n192.with_activation_epilogue(Relu2, false).is_ok(), "not gated: I = N = 192");
        // The interleaved W13: slice s holds gate rows 32s.. then up rows I + 32s.. .
        let rows: Vec<usize> = (0..256).map(|r| interleave_w13_row(r, 128, true)).collect();
        assert_eq!((rows[0], rows[31], rows[32], rows[63], rows[64], rows[96]), (0, 31, 128, 159, 32, 160));
        assert_eq!(interleave_w13_row(77, 128, false), 77);
    }

    /// An activation-epilogue call: `activated` present exactly when the problem has the
    /// epilogue, its lengths, alignment and global scale(s) checked, C empty, and `z` overlapping
    /// no input (the inputs may share memory).
    #[test]
    fn activated_outputs_are_checked() {
        let p = contiguous(3, 300).with_activation_epilogue(KernelActivation::Silu, true).unwrap();
        let z = p.activated_sizes().unwrap();
        let v = |i: u64, len| BufferView { ptr: 0x1000_0000 * i, len };
        let good = MoeBuffers {
            activated: Some(ActivatedOutput {
                values: v(30, z.values),
                scales: v(31, z.scales),
                global_scale: GlobalScale::PerGroup(v(32, 3)),
            }),
            ..good_buffers(&p)
        };
        assert_eq!(good.c.len, 0);
        assert!(validate_moe_buffers(&p, &good).is_ok());
        let field = |b: &MoeBuffers| match validate_moe_buffers(&p, b).unwrap_err() {
            Error::InvalidArgument { field, .. } => field,
            Error::Overlap { output, other, .. } => {
                assert_eq!(output.field, "activated.values");
                other.field
            }
            other => panic!("{other:?}"),
        };
        let with = |f: &dyn Fn(&mut ActivatedOutput)| {
            let mut b = good.clone();
            f(b.activated.as_mut().unwrap());
            b
        };
        assert_eq!(field(&MoeBuffers { activated: None, ..good.clone() }), "activated");
        assert_eq!(field(&with(&|o| o.values.len -= 1)), "activated.values");
        assert_eq!(field(&with(&|o| o.scales.ptr += 8)), "activated.scales");
        assert_eq!(field(&with(&|o| o.global_scale = GlobalScale::PerGroup(v(32, 2)))), "activated.global_scale");
        assert_eq!(field(&with(&|o| o.global_scale = GlobalScale::Tensor(f32::NAN))), "activated.global_scale");
        assert!(validate_moe_buffers(&p, &with(&|o| o.global_scale = GlobalScale::Tensor(0.5))).is_ok());
        assert_eq!(field(&with(&|o| o.values.ptr = 0x2000_0000)), "a.values");
        assert_eq!(field(&with(&|o| o.values.ptr = 0x1000_0000 * 32 - 16)), "activated.global_scale");
        assert_eq!(field(&MoeBuffers { c: v(4, 1), ..good.clone() }), "c");
        let mut on_weights = good.clone();
        on_weights.activated.as_mut().unwrap().values.ptr = 0x1000_0000 * 10;
        assert_eq!(field(&on_weights), "b.values");
        // A problem without the epilogue takes none.
        let plain = contiguous(3, 300);
        let b = MoeBuffers { activated: good.activated, ..good_buffers(&plain) };
        assert!(validate_moe_buffers(&plain, &b).unwrap_err().to_string().contains("activated"));
    }

    /// C (the only output) overlapping any input is refused, naming both; the inputs may share
    /// memory (every expert the same weights, A's values and scales in one allocation).
    #[test]
    fn run_buffers_do_not_overlap_c() {
        let p = contiguous(3, 300);
        let good = good_buffers(&p);
        let c_bytes = 2 * good.c.len as u64;
        type Edit = fn(&mut MoeBuffers, u64);
        let cases: [(Edit, (Option<usize>, &str)); 4] = [
            (|b, _| b.c.ptr = values(b).ptr, (None, "a.values")),
            (|b, n| b.c.ptr = scales(b).ptr - n + 16, (None, "a.scales")),
            (|b, _| b.c.ptr = b.sizes.ptr - 16, (None, "sizes")),
            (|b, _| b.weights[2].1.ptr = b.c.ptr + 32, (Some(2), "b.scales")),
        ];
        for (i, (edit, other)) in cases.into_iter().enumerate() {
            let mut b = good.clone();
            edit(&mut b, c_bytes);
            match validate_moe_buffers(&p, &b).unwrap_err() {
                Error::Overlap { call: "moe run", output, other: o } => {
                    assert_eq!((output.group, output.field), (None, "c"), "case {i}");
                    assert_eq!((o.group, o.field), other, "case {i}");
                }
                e => panic!("case {i}: {e:?}"),
            }
        }
        let mut shared = good.clone();
        shared.weights = vec![good.weights[0]; 3];
        let base = values(&mut shared).ptr;
        scales(&mut shared).ptr = base;
        shared.sizes.ptr = base + 64;
        shared.c.ptr = good.weights[0].1.ptr + (p.b_sizes().scales as u64).next_multiple_of(16);
        assert!(validate_moe_buffers(&p, &shared).is_ok());
    }

    /// Shapes beyond the kernels' indexing or any device's memory are refused in constant time,
    /// naming the field and the limit.
    #[test]
    fn problem_limits() {
        let too_large = |g, n, k, layout| match MoeProblem::new(g, n, k, layout, OutputType::F16).unwrap_err() {
            Error::TooLarge { group: None, field, limit, .. } => (field, limit),
            other => panic!("{other:?}"),
        };
        let c = |t| TokenLayout::Contiguous { max_tokens: t };
        assert_eq!(too_large(MAX_GROUPS + 1, 8, 64, c(8)), ("groups", Limit::Groups));
        assert_eq!(too_large(1, 8, rules::MAX_DIM + 64, c(8)), ("k", Limit::Dim));
        assert_eq!(too_large(1, rules::MAX_DIM + 8, 64, c(8)), ("n", Limit::Dim));
        assert_eq!(too_large(1, 8, 64, c(rules::MAX_DIM + 1)), ("max_tokens", Limit::Dim));
        assert_eq!(too_large(1, 8, 1 << 20, c(4096)), ("a.values", Limit::Index32));
        assert_eq!(too_large(1, 1 << 20, 64, c(4096)), ("c", Limit::Index32));
        // G · M_max beyond 32 bits: refused before the abi's u32 formulas see it.
        let masked = TokenLayout::Masked { max_rows: rules::MAX_DIM };
        assert_eq!(too_large(MAX_GROUPS, 8, 64, masked), ("a.values", Limit::Index32));
        // Every expert's weights together beyond any device.
        assert_eq!(too_large(512, 1 << 17, 1 << 14, c(16)), ("weights", Limit::DeviceBytes));
        assert!(MoeProblem::new(256, 4096, 7168, c(1 << 16), OutputType::Bf16).is_ok());
        let e = MoeProblem::new(512, 1 << 17, 1 << 14, c(16), OutputType::F16).unwrap_err().to_string();
        assert!(e.contains("`weights`") && e.contains("274877906944"), "{e}");
    }
}
