//! `moe_activate` (both architectures): the MoE block's activation between its two grouped GEMMs
//! (docs/moe-block.md, "The GPU block"), per row of a group: `z[j] = D(act(h[j]) · h[I + j])`
//! (gated) or `D(act(h[j]))`, the activation's `f32` arithmetic `nvfp4_gemm_abi::moe::block`'s
//! (the product exact in `f64`, one rounding to `D`), then either stored as `D` (W4A16) or
//! quantized with the second GEMM's input scale (one, or one per group) into the grouped NVFP4
//! layout (W4A4: the same block arithmetic and scale rows as `nvfp4_quantize_grouped`).
//!
//! Work item = (token row, block of 16 outputs, part): in `moe_activate` (calls of few blocks)
//! each thread computes 4 outputs, the 4 threads of a block (lanes `4i .. 4i + 4`) exchange their
//! parts' largest magnitudes and each quantizes its part (`quantize_block_part`: together exactly
//! `quantize_block`), so that a call's few rows at small T spread over 4× the threads with a
//! quarter of the dependent work each; in `moe_activate_blocks` (calls of many blocks) a thread
//! computes the whole block, and its scale and thresholds once. Grid-strided; rows of no group
//! are skipped. With `workspace` set (W4A4 on sm_90a), each quantized block is also written
//! dequantized into the second GEMM's f16 token workspace (`crate::workspace`).

use crate::ptx::cvt_f64::half_bits_to_f32;
use crate::ptx::sreg;
use crate::quantize::DeviceOps;
use crate::quantize_grouped::{round_to_half, row_global_scale};
use nvfp4_gemm_abi::moe::block::{ActivateParams, Activation, ACTIVATE_PARTS};
use nvfp4_gemm_abi::quantize::{block_part_amax, quantize_block_part_with, BLOCK, THREADS};
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};

/// One output word (two values) from a gate word and an up word (`None`: not gated).
#[inline(always)]
pub(crate) fn word(act: Activation, gate: u32, up: Option<u32>, bf16: bool) -> u32 {
    let lo = activated(act, gate as u16, up.map(|u| u as u16), bf16);
    let hi = activated(act, (gate >> 16) as u16, up.map(|u| (u >> 16) as u16), bf16);
    round_to_half(lo, bf16) as u32 | (round_to_half(hi, bf16) as u32) << 16
}

/// `nvfp4_gemm_abi::moe::block::activated` with the 16-bit values widened by the conversion
/// instructions (`half_bits_to_f32`: exact, as the reference's `half_to_f64` is; a NaN may keep
/// its payload, which the arithmetic after it does not read).
#[inline(always)]
fn activated(act: Activation, gate: u16, up: Option<u16>, bf16: bool) -> f64 {
    let a = act.apply(half_bits_to_f32(gate, bf16));
    match up {
        Some(u) => a * half_bits_to_f32(u, bf16) as f64,
        None => a,
    }
}

/// 4 consecutive 16-bit values at `p` (8-byte aligned) as 2 words.
///
/// # Safety
/// 8 readable bytes at `p`.
#[inline(always)]
unsafe fn load4(p: *const u8) -> [u32; 2] {
    // SAFETY: the caller's contract.
    let v = unsafe { *(p as *const u64) };
    [v as u32, (v >> 32) as u32]
}

/// Where a thread's gate (and up) values are and how they are activated.
#[derive(Clone, Copy)]
struct Source {
    h: *const u8,
    /// Values per row of `h`.
    n1: usize,
    /// Offset of a gate value's up value (0: not gated).
    up: usize,
    act: Activation,
    bf16: bool,
}

impl Source {
    /// The 2 output words of the 4 outputs from value `src` of `h` on.
    ///
    /// # Safety
    /// `src` (and `src + up`) index 4 readable values of `h`, 8-byte aligned.
    #[inline(always)]
    unsafe fn chunk(&self, src: usize) -> [u32; 2] {
        // SAFETY: the caller's contract.
        let g = unsafe { load4(self.h.add(2 * src)) };
        if self.up != 0 {
            // SAFETY: as above.
            let u = unsafe { load4(self.h.add(2 * (src + self.up))) };
            [word(self.act, g[0], Some(u[0]), self.bf16), word(self.act, g[1], Some(u[1]), self.bf16)]
        } else {
            [word(self.act, g[0], None, self.bf16), word(self.act, g[1], None, self.bf16)]
        }
    }

    /// `W` (2 or 8) output words from value `src` on, each chunk computed by name rather than in
    /// a loop (a loop over the activation's large body stays rolled and puts the words in local
    /// memory).
    ///
    /// # Safety
    /// As [`Self::chunk`], for `2W` values.
    #[inline(always)]
    unsafe fn words<const W: usize>(&self, src: usize) -> [u32; W] {
        // SAFETY: the caller's contract.
        unsafe {
            if W == 2 {
                let c = self.chunk(src);
                core::array::from_fn(|i| c[i])
            } else {
                let (a, b) = (self.chunk(src), self.chunk(src + 4));
                let (c, d) = (self.chunk(src + 8), self.chunk(src + 12));
                let all = [a[0], a[1], b[0], b[1], c[0], c[1], d[0], d[1]];
                core::array::from_fn(|i| all[i])
            }
        }
    }
}

/// Stores `W` words at `p`, `4W`-byte aligned.
///
/// # Safety
/// `4W` writable bytes at `p`, so aligned.
#[inline(always)]
unsafe fn store_words<const W: usize>(p: *mut u8, z: [u32; W]) {
    let mut i = 0;
    while i < W {
        // SAFETY: the caller's contract.
        unsafe { *(p as *mut u64).add(i / 2) = z[i] as u64 | (z[i + 1] as u64) << 32 };
        i += 2;
    }
}

/// See the module docs. Launch: [`THREADS`] threads per CTA, any number of CTAs (grid-strided
/// over `activate_items(rows, I, ACTIVATE_PARTS)` items).
///
/// # Safety
/// `p.h` holds `rows · n1` readable 16-bit values (`rows = p.sizes.token_rows()`, `n1 = 2I`
/// gated, else `I`); `p.out` `rows · I` writable 16-bit values (W4A16) or `rows · I / 2` bytes
/// (W4A4), and then `p.scales` `p.sizes.scale_rows() · I / 16` bytes and, with `p.group_scales`
/// set, that address `p.sizes.groups` readable `f32`s; with `p.workspace` set, it holds the
/// workspace of `rows` rows of `I` values (writable); `p.sizes.sizes` points to
/// `p.sizes.sizes_len()` readable `u32`s; the outputs overlap nothing the kernel reads. The host's
/// `Quantizer::activate_grouped_views` checks all of it before launching.
#[crate::ptx::kernel]
pub unsafe fn moe_activate(p: ActivateParams) {
    // SAFETY: the caller's contract.
    unsafe { activate::<ACTIVATE_PARTS, 2>(p) }
}

/// [`moe_activate`] with one thread per block of 16 outputs, for calls of many blocks
/// (`activate_parts`). Launch: as [`moe_activate`] over `activate_items(rows, I, 1)` items.
///
/// # Safety
/// As [`moe_activate`].
#[crate::ptx::kernel]
pub unsafe fn moe_activate_blocks(p: ActivateParams) {
    // SAFETY: the caller's contract.
    unsafe { activate::<1, 8>(p) }
}

/// [`moe_activate`] with `PARTS` threads per block of 16 outputs, `W` words (`2W` outputs) each.
///
/// # Safety
/// As [`moe_activate`].
#[inline(always)]
unsafe fn activate<const PARTS: u32, const W: usize>(p: ActivateParams) {
    const { assert!(PARTS * W as u32 * 2 == BLOCK && (W == 2 || W == 8)) };
    crate::moe::start_in_chain();
    let inter = p.inter;
    let blocks = inter / BLOCK;
    if blocks == 0 || p.sizes.groups == 0 {
        return;
    }
    let rows = p.sizes.token_rows();
    // Rows past the last group's end hold nothing to activate (`rows_end`: the whole warp calls
    // it, before any lane leaves).
    // SAFETY: the sizes array is readable (the caller's contract).
    let end = unsafe { crate::moe::rows_end(&p.sizes) };
    let items = if end < rows { end } else { rows } * blocks * PARTS;
    let gated = p.gated != 0;
    let source = Source {
        h: p.h as *const u8,
        n1: if gated { 2 * inter } else { inter } as usize,
        up: if gated { inter as usize } else { 0 },
        act: Activation::from_code(p.activation),
        bf16: p.bf16 != 0,
    };
    let rk = rest_k(inter);
    let global = p.global_scale as f64;
    let bf16 = source.bf16;
    // SAFETY: the sizes array is readable (the caller's contract).
    let load = unsafe { crate::moe::sizes_reader(&p.sizes) };
    let lane = sreg::lane_id();
    let mut item = sreg::ctaid_x() * THREADS + sreg::tid_x();
    let stride = sreg::nctaid_x() * THREADS;
    // Whole warps run every round (the quantization's exchange takes all 32 lanes): a warp goes
    // on while its first item is below the end; a block's items are in `PARTS` aligned lanes (the
    // stride is a multiple of 32).
    while item - lane < items {
        let (q, part) = (item / PARTS, item % PARTS);
        let (row, j) = (q / blocks, q % blocks);
        let located = if item < items { p.sizes.locate(row, load) } else { None };
        // The part's `2W` outputs start at column `16 j + 2W part` of the row.
        let col = (BLOCK * j + 2 * W as u32 * part) as usize;
        let z: [u32; W] = match located {
            // SAFETY: row < rows: the gate (and up) values are in `h` (the caller's contract);
            // 8-byte aligned (`col` a multiple of 4, `n1` of 64, `h` 16-byte aligned).
            Some(_) => unsafe { source.words(row as usize * source.n1 + col) },
            None => [0; W],
        };
        let first = row as usize * inter as usize + col;
        if p.quantize != 0 {
            let amax = crate::scan::lanes_max(block_part_amax(z) as u32, PARTS.trailing_zeros()) as u16;
            let quantized = located.map(|(group, scale_row)| {
                // SAFETY: `group_scales`, when set, holds an `f32` per group (the caller's
                // contract).
                let global = unsafe { row_global_scale(p.group_scales, group, global) };
                (scale_row, quantize_block_part_with::<DeviceOps, W>(z, amax, bf16, global))
            });
            // In the 4-thread kernel, a workspace word (values `8h .. 8h + 8` of the block) is
            // parts `2h` and `2h + 1`, lanes `l` and `l ^ 1`: the whole warp swaps its parts.
            let partner = if W == 2 && p.workspace != 0 {
                crate::ptx::warp::shfl_xor(quantized.map_or(0, |(_, (_, packed))| packed as u32 & 0xFFFF), 1)
            } else {
                0
            };
            if let Some((scale_row, (s, packed))) = quantized {
                // SAFETY: the outputs of row < rows (the caller's contract), the part's `W`
                // bytes `W`-byte aligned; `scale_row` is below the scale rows; the workspace,
                // when set, holds the rows (the caller's contract).
                unsafe {
                    let at = (p.out as *mut u8).add(first / 2);
                    if W == 8 {
                        *(at as *mut u64) = packed;
                    } else {
                        *(at as *mut u16) = packed as u16;
                    }
                    if part == 0 {
                        *(p.scales as *mut u8).add(blocked_offset(scale_row, j, rk)) = s;
                    }
                    if p.workspace != 0 {
                        if W == 8 {
                            crate::workspace::store_block(p.workspace, row, inter, j, packed, s);
                        } else {
                            // Part `2h + e` writes pairs `2e` and `2e + 1` of word `h`.
                            let (half, upper) = (part / 2, part % 2);
                            let mine = packed as u32 & 0xFFFF;
                            let word = if upper == 0 { mine | partner << 16 } else { partner | mine << 16 };
                            crate::workspace::store_pairs(p.workspace, row, inter, j, half, word, s, 2 * upper, 2);
                        }
                    }
                }
            }
        } else if located.is_some() {
            // SAFETY: the row's `2W` outputs in `out` (the caller's contract), `4W`-byte aligned.
            unsafe { store_words((p.out as *mut u8).add(2 * first), z) };
        }
        item += stride;
    }
}
