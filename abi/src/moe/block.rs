//! The MoE expert block's own kernels around the two grouped GEMMs (docs/moe-block.md, "The GPU
//! block"): the gather of token rows into the sorted layout (with the router weight at the
//! input), before the first GEMM, and the activation (with requantization for W4A4) between the
//! two GEMMs. Parameters, launch numbers and the exact arithmetic both kernels run, as plain
//! functions so that tests and the host block evaluate the very same operations.
//!
//! # The activation's f32 arithmetic
//!
//! `silu(g) = g · σ(g)` and `gelu_tanh(g) = g/2 · (1 + tanh(u)) = g · σ(2u)` with
//! `u = √(2/π) · (g + 0.044715 g³)`, so both are [`gate_times_sigmoid`]`(g, s)` with `s = g` or
//! `s = 2u`. `σ(s)` is evaluated from `e = exp(−|s|)` ([`exp_neg`], which never overflows):
//! `1 / (1 + e)` for `s ≥ 0`, `e / (1 + e)` below. Only IEEE `f32` additions, multiplications,
//! divisions, comparisons, conversions and bit manipulation are used (no fused multiply-add, no
//! approximate instruction), so the device and the CPU model compute the same bits. `relu2` is
//! exact: `max(h, 0)²` in `f64` (22 significant bits at most).
//!
//! The stored value is `z = D(a · up)` (gated) or `z = D(a)`, with the product of the `f32` (or
//! exact) activation `a` and the 16-bit `up` formed in `f64`, where it is exact (24 + 11
//! significant bits), and rounded once to `D`: the only departure from the fp64 contract is `a`
//! itself. Its error against an accurate `f64` evaluation (measured over every finite f16 and
//! bf16 input, asserted by `model-tests/tests/model_moe_block.rs`; docs/moe-block.md §7):
//! `|a − act(g)| ≤ SILU_REL_ERROR · |act(g)| + TINY` for silu and
//! `|a − act(g)| ≤ GELU_REL_ERROR · (1 + |s|) · |act(g)| + TINY` for gelu_tanh, the `(1 + |s|)`
//! being the rounding of the argument `s` amplified by `σ`'s slope on the negative side.

use crate::moe::DeviceSizes;

/// Threads per CTA of both kernels (as the quantizer's).
pub const THREADS: u32 = crate::quantize::THREADS;

/// The activation between the two GEMMs.
pub const ACT_SILU: u32 = 0;
/// `gelu` with the tanh approximation.
pub const ACT_GELU_TANH: u32 = 1;
/// `max(h, 0)²`.
pub const ACT_RELU2: u32 = 2;

/// The activation, as the kernels' parameter ([`ActivateParams::activation`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Activation {
    /// `g / (1 + e^(−g))`.
    Silu = ACT_SILU,
    /// `g/2 · (1 + tanh(√(2/π) · (g + 0.044715 g³)))`.
    GeluTanh = ACT_GELU_TANH,
    /// `max(h, 0)²`.
    Relu2 = ACT_RELU2,
}

impl Activation {
    /// Every activation.
    pub const ALL: [Activation; 3] = [Activation::Silu, Activation::GeluTanh, Activation::Relu2];

    /// The kernels' code for a parameter value (unknown codes are silu's).
    pub const fn from_code(code: u32) -> Activation {
        match code {
            ACT_GELU_TANH => Activation::GeluTanh,
            ACT_RELU2 => Activation::Relu2,
            _ => Activation::Silu,
        }
    }

    /// The activation of the stored gate (or W1) value `h`, exactly as the kernel computes it,
    /// as `f64` (silu, gelu_tanh: an `f32` value; relu2: exact).
    #[inline(always)]
    pub fn apply(self, h: f32) -> f64 {
        match self {
            Activation::Silu => gate_times_sigmoid(h, h) as f64,
            Activation::GeluTanh => gate_times_sigmoid(h, gelu_argument(h)) as f64,
            Activation::Relu2 => {
                let r = if h > 0.0 { h as f64 } else { 0.0 };
                r * r
            }
        }
    }
}

/// Measured bound of silu's relative error (see the module docs).
pub const SILU_REL_ERROR: f64 = 2.0 * f32::EPSILON as f64;
/// Measured bound of gelu_tanh's relative error per unit of `1 + |s|` (see the module docs).
pub const GELU_REL_ERROR: f64 = 2.0 * f32::EPSILON as f64;
/// Absolute slack of both bounds: results below f32's normal range lose relative precision
/// (`2^−147`, four of f32's smallest subnormals).
pub const TINY: f64 = 5.605_193_857_299_268e-45;

/// `log2(e)`.
const LOG2_E: f32 = core::f32::consts::LOG2_E;
/// `ln 2` split: the high part has 16 significant bits, so `k · LN2_HI` is exact for `k < 256`.
const LN2_HI: f32 = f32::from_bits(0x3F31_7200);
/// `ln 2 − LN2_HI`, rounded to f32.
const LN2_LO: f32 = f32::from_bits(0x35BF_BE8E);
/// Beyond this `|s|`, `g · e^(−|s|)` is below half of f32's smallest subnormal for every `g`
/// with `|g| ≤ |s|` (silu's and gelu_tanh's gates): 0.
pub const EXP_ZERO_BELOW: f32 = 120.0;

/// `e^(−a)` for `a ≥ 0` (NaN for NaN) in `f32`, as `m` with `e^(−a) = m · 2^−64` (so that `m` is
/// normal for every `a` up to [`EXP_ZERO_BELOW`], 0 beyond): `a = k·ln 2 + r` with
/// `k = ⌊a·log2 e + 1/2⌋`, `|r| ≲ 0.35`; `e^(−r)` by its degree-7 Taylor polynomial (truncation
/// below 6e-9 relative), Horner; times `2^(64 − k)`, exact.
#[inline(always)]
pub fn exp_neg_scaled(a: f32) -> f32 {
    if a > EXP_ZERO_BELOW {
        return 0.0;
    }
    // `a` NaN: `k` = 0 (saturating conversion), the polynomial propagates the NaN.
    let k = (a * LOG2_E + 0.5) as i32;
    let kf = k as f32;
    let r = (a - kf * LN2_HI) - kf * LN2_LO;
    let y = -r;
    let p = 1.0
        + y * (1.0
            + y * (0.5
                + y * (1.0 / 6.0 + y * (1.0 / 24.0 + y * (1.0 / 120.0 + y * (1.0 / 720.0 + y * (1.0 / 5040.0)))))));
    // 0 <= k <= 174: 2^(64 - k) is normal and p · 2^(64 - k) exact.
    p * f32::from_bits(((127 + 64 - k) as u32) << 23)
}

/// `2^−64`.
const TWO_M64: f32 = f32::from_bits((127 - 64) << 23);

/// `e^(−a)` for `a ≥ 0`: [`exp_neg_scaled`] times `2^−64`, one rounding (subnormal results).
#[inline(always)]
pub fn exp_neg(a: f32) -> f32 {
    exp_neg_scaled(a) * TWO_M64
}

/// `g · σ(s)` in `f32`: `g / (1 + e)` for `s ≥ 0`, `g · e / (1 + e)` otherwise, with
/// `e = e^(−|s|)`; below, the product and quotient are formed on `m = e · 2^64` (normal) and scaled
/// back at the end, so that a result in f32's subnormal range is rounded once.
#[inline(always)]
pub fn gate_times_sigmoid(g: f32, s: f32) -> f32 {
    let m = exp_neg_scaled(f32::from_bits(s.to_bits() & 0x7FFF_FFFF));
    let d = 1.0 + m * TWO_M64;
    // One quotient whatever the sign (the numerator and the scaling selected, the same
    // operations as a branch per sign): on the device the lanes of a warp hold gates of both
    // signs, and two branches would each run the division.
    let positive = s >= 0.0;
    let q = (if positive { g } else { g * m }) / d;
    if positive {
        q
    } else {
        q * TWO_M64
    }
}

/// gelu_tanh's `s = 2 · √(2/π) · (g + 0.044715 g³)` in `f32` (as `2√(2/π) · g · (1 + 0.044715 g²)`).
#[inline(always)]
pub fn gelu_argument(g: f32) -> f32 {
    // 2 · √(2/π) = 1.5957691216..., rounded to f32.
    const C: f32 = f32::from_bits(0x3FCC_422A);
    const A: f32 = 0.044715;
    (C * g) * (1.0 + A * (g * g))
}

/// Parameters of the gather before the first GEMM, inside the grouped quantizer's parameters
/// ([`crate::moe::GroupedConvertParams::gather`]). All zero: today's grouped quantization (row `r`
/// reads input row `r`, no weight, NVFP4 output).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Gather {
    /// Device address of `u32 row_token[rows]`: token row `r` of the sorted layout reads input
    /// row `row_token[r]` of `x` (`[tokens, k]`). 0: row `r` reads input row `r`.
    pub row_token: u64,
    /// Device address of `f32 row_weight[rows]`: the row is `D(x · w)` (product in `f64`,
    /// exact, one rounding). 0: no weight.
    pub row_weight: u64,
    /// Rows of `x` when `row_token` is set; a token id at or beyond it reads zeros.
    pub tokens: u32,
    /// 1: write the (weighted) 16-bit rows to `convert.values` as a dense `[rows, k]` tensor of
    /// the input type (W4A16) instead of quantizing; `convert.scales` unused.
    pub dense_output: u32,
    /// Device address of `f32 group_scales[groups]`: a row of group `g` is quantized with
    /// `group_scales[g]` (each finite and positive) instead of `convert.global_scale` (an MoE
    /// checkpoint's per-expert input scales). 0: `convert.global_scale` for every row.
    pub group_scales: u64,
    /// Device address of an sm_90a GEMM's f16 token workspace ([`crate::sm90::TokenWorkspace`]), where each
    /// quantized row is also written dequantized; 0: none.
    pub workspace: u64,
}

const _: () = assert!(core::mem::size_of::<Gather>() == 40);

/// Parameters of `moe_activate` (both architectures): `h` `[rows, n1]` of the 16-bit type `D`
/// (`n1 = 2I` gated, gate columns first, else `I`) → `z = D(act(gate) · up)` or `D(act(h))`,
/// `[rows, I]`, written as `D` (W4A16) or quantized to NVFP4 with `global_scale` (W4A4: packed
/// values `[rows, I/2]` and blocked scales in the grouped layout of `sizes`). Only rows of
/// groups are read and written.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ActivateParams {
    /// The first GEMM's output, `[sizes.token_rows(), n1]` `D`, 16-byte aligned.
    pub h: u64,
    /// W4A16: `z` `[rows, I]` `D`; W4A4: packed e2m1 values `[rows, I/2]`. 16-byte aligned.
    pub out: u64,
    /// W4A4: the blocked scales, `sizes.scale_rows()` rows of `I/16` bytes; else 0.
    pub scales: u64,
    /// The device sizes (the same as the GEMMs').
    pub sizes: DeviceSizes,
    /// `I`, a positive multiple of 64.
    pub inter: u32,
    /// [`ACT_SILU`], [`ACT_GELU_TANH`] or [`ACT_RELU2`].
    pub activation: u32,
    /// 1: `n1 = 2I`, `z = act(gate) · up`; 0: `n1 = I`.
    pub gated: u32,
    /// 1 when `D` is bf16, 0 for f16.
    pub bf16: u32,
    /// 1: quantize `z` (W4A4); 0: store it (W4A16).
    pub quantize: u32,
    /// The second GEMM's input scale `s2` (W4A4; finite, positive) when `group_scales` is 0.
    pub global_scale: f32,
    /// W4A4: device address of `f32 group_scales[groups]`, the second GEMM's input scale per
    /// group (each finite and positive), used instead of `global_scale`; 0: `global_scale`.
    pub group_scales: u64,
    /// W4A4: device address of the second GEMM's f16 token workspace ([`crate::sm90::TokenWorkspace`]),
    /// where each quantized row is also written dequantized; 0: none.
    pub workspace: u64,
}

const _: () = assert!(core::mem::size_of::<ActivateParams>() == 88);

/// The first grouped GEMM's activation epilogue (sm_90a, NVFP4 tokens, a device-sized contiguous
/// layout: the MoE block under W4A4): instead of storing `h = D(alpha · acc)`, each consumer
/// warpgroup turns its 64 weight rows of `h`, rounded to `D` exactly as C would be, into `z`
/// (what `moe_activate` computes from those rows, bit for bit) and quantizes `z` into the second
/// GEMM's token operand; `h` never reaches memory. `values == 0`: the plain epilogue.
///
/// The first GEMM's weights must then be W13 with its rows interleaved per warpgroup
/// ([`epilogue_source_row`]): each block of [`EPILOGUE_SLICE_ROWS`] rows holds the gate rows of
/// 32 consecutive intermediate columns and then their up rows (gated), or the W1 rows of 64
/// consecutive columns (not gated), so that a warpgroup has every input of its columns of `z`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ActivationEpilogue {
    /// Device address of `z`'s packed e2m1 values, `[rows, I/2]` bytes (the block's token rows;
    /// row `r` of the layout at `r · I/2`), 16-byte aligned; 0: the plain epilogue.
    pub values: u64,
    /// `z`'s blocked e4m3 scales in the contiguous grouped layout of the same sizes (`I/16`
    /// columns).
    pub scales: u64,
    /// 0, or the device address of `f32 group_scales[groups]`: the quantizer's global scale of
    /// each group (expert), instead of `global_scale`.
    pub group_scales: u64,
    /// The quantizer's global scale (finite, positive) when `group_scales` is 0.
    pub global_scale: f32,
    /// [`ACT_SILU`], [`ACT_GELU_TANH`] or [`ACT_RELU2`].
    pub activation: u32,
    /// 1: `N = 2I`, rows interleaved gate/up per slice; 0: `N = I`.
    pub gated: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<ActivationEpilogue>() == 40);

/// Weight rows of one warpgroup's slice of the interleaved W13 ([`ActivationEpilogue`]): the
/// sm_90a consumer warpgroup's rows (`nvfp4_gemm_abi::sm90::WG_ROWS`).
pub const EPILOGUE_SLICE_ROWS: u32 = 64;

const _: () = assert!(EPILOGUE_SLICE_ROWS == crate::sm90::WG_ROWS);

/// Intermediate columns of one slice: 32 gated (gate and up rows), 64 not gated.
pub const fn epilogue_slice_columns(gated: bool) -> u32 {
    if gated {
        EPILOGUE_SLICE_ROWS / 2
    } else {
        EPILOGUE_SLICE_ROWS
    }
}

/// The row of the plain W13 (`[2I, H]`: gate rows `0..I`, then up rows) that row `r` of the
/// interleaved W13 holds: slice `s = r / 64`, `i = r % 64`: gate row `32s + i` for `i < 32`, up
/// row `I + 32s + i − 32` above. Not gated: the identity.
pub const fn epilogue_source_row(r: u32, inter: u32, gated: bool) -> u32 {
    if !gated {
        return r;
    }
    let (s, i) = (r / EPILOGUE_SLICE_ROWS, r % EPILOGUE_SLICE_ROWS);
    let half = EPILOGUE_SLICE_ROWS / 2;
    if i < half {
        half * s + i
    } else {
        inter + half * s + (i - half)
    }
}

/// Threads sharing one block of 16 outputs in `moe_activate`, the kernel of calls with few blocks
/// (each computes 4 of them, the quantization exchanges their largest magnitudes): a call's few
/// rows at small T spread over 4× the threads with a quarter of the dependent work each.
/// `moe_activate_blocks` gives a block one thread.
pub const ACTIVATE_PARTS: u32 = 4;

/// Routed blocks of 16 outputs from which a W4A4 call (the kernel quantizes) runs
/// `moe_activate_blocks` (one thread per block) instead of `moe_activate`: one thread then
/// computes a block's scale and rounding thresholds once instead of in each of
/// [`ACTIVATE_PARTS`] threads, which pays once the call has enough blocks to keep the GPU busy
/// without splitting them. On an H100 (`ncu`, per launch): 24.6k blocks (Qwen3, T = 64) 11.1 µs
/// with 4 parts against 22.5 with 1; 115k (Mixtral, T = 64) 26.0 against 23.7.
pub const ACTIVATE_WHOLE_BLOCKS_W4A4: u64 = 132 * 512;

/// The same for W4A16 (no quantization: only the item's bookkeeping is shared): 197k blocks
/// (Qwen3, T = 512) 28.7 µs with 4 parts against 33.1 with 1; 917k (Mixtral, T = 512) 104.8
/// against 101.7.
pub const ACTIVATE_WHOLE_BLOCKS_W4A16: u64 = 132 * 4096;

/// Threads per block of 16 outputs for `rows` rows of `inter` outputs, quantized (W4A4) or not:
/// 1 (`moe_activate_blocks`) from [`ACTIVATE_WHOLE_BLOCKS_W4A4`] or
/// [`ACTIVATE_WHOLE_BLOCKS_W4A16`] blocks on, else [`ACTIVATE_PARTS`] (`moe_activate`).
pub const fn activate_parts(rows: u32, inter: u32, quantize: bool) -> u32 {
    let from = if quantize { ACTIVATE_WHOLE_BLOCKS_W4A4 } else { ACTIVATE_WHOLE_BLOCKS_W4A16 };
    if rows as u64 * (inter / crate::quantize::BLOCK) as u64 >= from {
        1
    } else {
        ACTIVATE_PARTS
    }
}

/// Work items of the activation kernel of `parts` threads per block: every token row's blocks of
/// 16 outputs, `parts` items each.
pub const fn activate_items(rows: u32, inter: u32, parts: u32) -> u64 {
    rows as u64 * (inter / crate::quantize::BLOCK) as u64 * parts as u64
}

/// The activated value of one output, exactly as `moe_activate` stores it before the final
/// rounding: `a · up` (gated) or `a`, in `f64` (exact), from the stored 16-bit values.
#[inline(always)]
pub fn activated(act: Activation, gate: u16, up: Option<u16>, bf16: bool) -> f64 {
    let g = crate::quantize::half_to_f64(gate, bf16) as f32;
    let a = act.apply(g);
    match up {
        Some(u) => a * crate::quantize::half_to_f64(u, bf16),
        None => a,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;

    #[test]
    fn layouts() {
        assert_eq!(core::mem::offset_of!(ActivateParams, sizes), 24);
        assert_eq!(core::mem::offset_of!(ActivateParams, inter), 48);
        assert_eq!(core::mem::offset_of!(ActivateParams, global_scale), 68);
        assert_eq!(core::mem::offset_of!(ActivateParams, group_scales), 72);
        assert_eq!(core::mem::offset_of!(Gather, group_scales), 24);
        assert_eq!(activate_items(3, 128, 4), 96);
        assert_eq!(activate_items(3, 128, 1), 24);
        // Mixtral's intermediate (896 blocks a row): W4A4 4 parts up to 75 rows, then 1; W4A16
        // up to 603.
        assert_eq!((activate_parts(75, 14336, true), activate_parts(76, 14336, true)), (4, 1));
        assert_eq!((activate_parts(603, 14336, false), activate_parts(604, 14336, false)), (4, 1));
        assert_eq!(activate_parts(0, 14336, true), 4);
        assert_eq!(core::mem::offset_of!(ActivationEpilogue, global_scale), 24);
        for a in Activation::ALL {
            assert_eq!(Activation::from_code(a as u32), a);
        }
    }

    #[test]
    fn interleaved_rows_are_a_permutation() {
        let inter = 192;
        let mut seen = std::vec![false; 2 * inter as usize];
        for r in 0..2 * inter {
            let src = epilogue_source_row(r, inter, true);
            assert!(!seen[src as usize], "row {src} twice");
            seen[src as usize] = true;
        }
        // Slice 1: gate columns 32..64, then their up rows.
        assert_eq!(epilogue_source_row(64, inter, true), 32);
        assert_eq!(epilogue_source_row(95, inter, true), 63);
        assert_eq!(epilogue_source_row(96, inter, true), inter + 32);
        assert_eq!(epilogue_source_row(127, inter, true), inter + 63);
        assert_eq!(epilogue_source_row(77, inter, false), 77);
        assert_eq!((epilogue_slice_columns(true), epilogue_slice_columns(false)), (32, 64));
    }

    #[test]
    fn exp_by_hand() {
        assert_eq!(exp_neg(0.0), 1.0);
        assert_eq!(exp_neg(200.0), 0.0);
        assert_eq!(exp_neg(110.0), 0.0);
        assert_eq!(exp_neg(f32::INFINITY), 0.0);
        assert!(exp_neg(f32::NAN).is_nan());
        let mut a = 0.0f32;
        while a < 120.0 {
            let want = (-(a as f64)).exp();
            let got = exp_neg(a) as f64;
            assert!((got - want).abs() <= 3.0 * f32::EPSILON as f64 * want + 1.5e-45, "{a}: {got} vs {want}");
            a += 0.0137;
        }
    }

    #[test]
    fn activations_by_hand() {
        assert_eq!(Activation::Relu2.apply(-3.0), 0.0);
        assert_eq!(Activation::Relu2.apply(3.0), 9.0);
        assert_eq!(Activation::Silu.apply(0.0), 0.0);
        assert_eq!(Activation::GeluTanh.apply(0.0), 0.0);
        assert_eq!(Activation::Silu.apply(1000.0), 1000.0);
        assert_eq!(Activation::Silu.apply(-1000.0), 0.0);
        assert_eq!(Activation::GeluTanh.apply(-1000.0), 0.0);
        assert!(Activation::Silu.apply(f32::NAN).is_nan());
        assert_eq!(activated(Activation::Relu2, 0x4000, Some(0x4200), false), 12.0);
    }
}
