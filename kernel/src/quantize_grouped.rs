//! `nvfp4_quantize_grouped` (both architectures): the token tensor of a device-sized grouped
//! GEMM, f16/bf16 → NVFP4, with each group's block scales at its own 128-row-aligned offset
//! (`nvfp4_gemm_abi::moe`). The same arithmetic as `nvfp4_quantize`, bit for bit; only the rows
//! of groups are read and written (with the sizes clamped as the scheduler clamps them), and
//! padding scale rows are left as they are.
//!
//! With `gather` set (`nvfp4_gemm_abi::moe::block::Gather`) it is the MoE block's first step:
//! row `r` reads token row `row_token[r]` of `x`, optionally multiplied by `row_weight[r]` (the
//! product of a 16-bit value and an `f32` has at most 11 + 24 significant bits, exact in `f64`,
//! then rounded once to the input type, `D(x · w)` as the contract's step 1 says), and is either
//! quantized as above (W4A4, with the row's group's own global scale when `group_scales` is set)
//! or stored as 16-bit (W4A16).
//!
//! Work item = (token row, block of 16 values), grid-strided; each item finds its row's scale row
//! from the device sizes (a binary search over the offsets, or a division for the masked layout).

use crate::ptx::{cvt_f64, sreg};
use crate::quantize::DeviceOps;
use nvfp4_gemm_abi::moe::block::Gather;
use nvfp4_gemm_abi::moe::GroupedConvertParams;
use nvfp4_gemm_abi::quantize::{half_to_f64, quantize_block_with, BLOCK, THREADS};
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};

/// 16 bytes, so that loads and stores through it become `ld.v4` / `st.v4`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub(crate) struct U32x4(pub(crate) [u32; 4]);

/// `x` rounded once to the 16-bit type (bf16 when `bf16`), as its bit pattern.
#[inline(always)]
pub(crate) fn round_to_half(x: f64, bf16: bool) -> u16 {
    if bf16 {
        cvt_f64::f64_to_bf16_bits(x)
    } else {
        cvt_f64::f64_to_f16_bits(x)
    }
}

/// The global scale a row of group `group` is quantized with: `group_scales[group]` when that
/// address is set (`Gather::group_scales`, `ActivateParams::group_scales`), else `global`.
///
/// # Safety
/// With `group_scales` set, it holds a readable `f32` at index `group`.
#[inline(always)]
pub(crate) unsafe fn row_global_scale(group_scales: u64, group: u32, global: f64) -> f64 {
    if group_scales == 0 {
        global
    } else {
        // SAFETY: the caller's contract.
        unsafe { *(group_scales as *const f32).add(group as usize) as f64 }
    }
}

/// Both halves of `word` times `w`, each rounded once.
#[inline(always)]
fn weigh(word: u32, w: f64, bf16: bool) -> u32 {
    let lo = round_to_half(half_to_f64(word as u16, bf16) * w, bf16);
    let hi = round_to_half(half_to_f64((word >> 16) as u16, bf16) * w, bf16);
    lo as u32 | (hi as u32) << 16
}

/// The 16 input values of output row `row`, block `j`, as 8 words: the gathered token's (zeros
/// for a token id out of range), weighted when the gather says so.
///
/// # Safety
/// As the kernel's.
#[inline(always)]
unsafe fn load_block(dense: u64, k: u32, g: &Gather, row: u32, j: u32, bf16: bool) -> [u32; 8] {
    let token = if g.row_token == 0 {
        row
    } else {
        // SAFETY: `row_token` holds a `u32` per token row (the caller's contract).
        unsafe { *(g.row_token as *const u32).add(row as usize) }
    };
    if g.row_token != 0 && token >= g.tokens {
        return [0; 8];
    }
    let first = token as usize * k as usize + (BLOCK * j) as usize;
    // SAFETY: token is a row of the input: its block's 32 bytes (32-byte aligned) are readable.
    let (a, b) = unsafe {
        let src = (dense as *const u8).add(2 * first) as *const U32x4;
        ((*src).0, (*src.add(1)).0)
    };
    let words = [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]];
    if g.row_weight == 0 {
        return words;
    }
    // SAFETY: `row_weight` holds an `f32` per token row (the caller's contract).
    let w = unsafe { *(g.row_weight as *const f32).add(row as usize) } as f64;
    let [w0, w1, w2, w3, w4, w5, w6, w7] = words;
    [
        weigh(w0, w, bf16),
        weigh(w1, w, bf16),
        weigh(w2, w, bf16),
        weigh(w3, w, bf16),
        weigh(w4, w, bf16),
        weigh(w5, w, bf16),
        weigh(w6, w, bf16),
        weigh(w7, w, bf16),
    ]
}

/// See the module docs. Launch: [`THREADS`] threads per CTA, any number of CTAs (grid-strided
/// over `rows · k / 16` items).
///
/// # Safety
/// As `nvfp4_quantize` with `p.convert.rows` the token rows, except that `p.convert.scales` holds
/// `p.sizes.scale_rows()` scale rows; `p.sizes.sizes` points to `p.sizes.sizes_len()` readable
/// `u32`s. With `p.gather.row_token` set, `p.convert.dense` holds `p.gather.tokens` rows and
/// `row_token` `rows` readable `u32`s; with `row_weight` set, it holds `rows` readable `f32`s;
/// with `group_scales` set, `p.sizes.groups` readable `f32`s;
/// with `dense_output`, `p.convert.values` holds `rows · k` writable 16-bit values; with
/// `workspace` set, it holds the workspace of `rows` rows of `k` values (writable). The host's
/// `Quantizer::quantize_grouped` and `quantize_grouped_gather_views` check all of it before
/// launching.
#[crate::ptx::kernel]
pub unsafe fn nvfp4_quantize_grouped(p: GroupedConvertParams) {
    crate::moe::start_in_chain();
    // SAFETY: the caller's contract; the launch's CTAs of `THREADS` threads.
    unsafe { quantize_grouped(&p, sreg::ctaid_x(), sreg::nctaid_x(), THREADS) }
}

/// The kernel's loop after its start, on CTA `cta` of `ctas` quantizing CTAs of `threads`
/// threads (`sm90_quantize_schedule` runs it on the CTAs after its schedulers').
///
/// # Safety
/// As the kernel's, after `start_in_chain`; every thread of those CTAs calls it.
#[inline(always)]
pub(crate) unsafe fn quantize_grouped(p: &GroupedConvertParams, cta: u32, ctas: u32, threads: u32) {
    let c = p.convert;
    let blocks = c.k / BLOCK;
    if blocks == 0 || p.sizes.groups == 0 {
        return;
    }
    // Rows past the last group's end hold nothing to quantize (`rows_end`: the whole warp
    // calls it, before any lane leaves).
    // SAFETY: the sizes array is readable (the caller's contract).
    let end = unsafe { crate::moe::rows_end(&p.sizes) };
    let items = if end < c.rows { end } else { c.rows } * blocks;
    let rk = rest_k(c.k);
    let global = c.global_scale as f64;
    let bf16 = c.bf16 != 0;
    // SAFETY: the sizes array is readable (the caller's contract).
    let load = unsafe { crate::moe::sizes_reader(&p.sizes) };
    let mut item = cta * threads + sreg::tid_x();
    let stride = ctas * threads;
    while item < items {
        let (row, j) = (item / blocks, item % blocks);
        if let Some((group, scale_row)) = p.sizes.locate(row, load) {
            let first = row as usize * c.k as usize + (BLOCK * j) as usize;
            // SAFETY: row < rows: the block's input is readable (`load_block`); its 8 packed
            // bytes (or 32 16-bit bytes) are in the output; `scale_row` is below the scale rows.
            unsafe {
                let w = load_block(c.dense, c.k, &p.gather, row, j, bf16);
                if p.gather.dense_output != 0 {
                    let dst = (c.values as *mut u8).add(2 * first) as *mut U32x4;
                    *dst = U32x4([w[0], w[1], w[2], w[3]]);
                    *dst.add(1) = U32x4([w[4], w[5], w[6], w[7]]);
                } else {
                    let global = row_global_scale(p.gather.group_scales, group, global);
                    let (s, packed) = quantize_block_with::<DeviceOps>(w, bf16, global);
                    *((c.values as *mut u8).add(first / 2) as *mut u64) = packed;
                    *(c.scales as *mut u8).add(blocked_offset(scale_row, j, rk)) = s;
                    if p.gather.workspace != 0 {
                        crate::workspace::store_block(p.gather.workspace, row, c.k, j, packed, s);
                    }
                }
            }
        }
        item += stride;
    }
}
