//! `moe_activate` (both architectures): the MoE block's activation between its two grouped GEMMs
//! (docs/moe-block.md, "The GPU block"), per row of a group: `z[j] = D(act(h[j]) · h[I + j])`
//! (gated) or `D(act(h[j]))`, the activation's `f32` arithmetic `nvfp4_gemm_abi::moe::block`'s
//! (the product exact in `f64`, one rounding to `D`), then either stored as `D` (W4A16) or
//! quantized with the second GEMM's input scale (one, or one per group) into the grouped NVFP4
//! layout (W4A4: the same block arithmetic and scale rows as `nvfp4_quantize_grouped`).
//!
//! Work item = (token row, block of 16 outputs), grid-strided; rows of no group are skipped.

use crate::ptx::sreg;
use crate::quantize_grouped::{round_to_half, row_global_scale, U32x4};
use nvfp4_gemm_abi::moe::block::{activated, ActivateParams, Activation};
use nvfp4_gemm_abi::quantize::{quantize_block, BLOCK, THREADS};
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};

/// One output word (two values) from a gate word and an up word (`None`: not gated).
#[inline(always)]
pub(crate) fn word(act: Activation, gate: u32, up: Option<u32>, bf16: bool) -> u32 {
    let lo = activated(act, gate as u16, up.map(|u| u as u16), bf16);
    let hi = activated(act, (gate >> 16) as u16, up.map(|u| (u >> 16) as u16), bf16);
    round_to_half(lo, bf16) as u32 | (round_to_half(hi, bf16) as u32) << 16
}

/// 16 consecutive 16-bit values at `p` (32-byte aligned) as 8 words.
///
/// # Safety
/// 32 readable bytes at `p`.
#[inline(always)]
unsafe fn load16(p: *const u8) -> [u32; 8] {
    // SAFETY: the caller's contract.
    let (a, b) = unsafe { ((*(p as *const U32x4)).0, (*(p as *const U32x4).add(1)).0) };
    [a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]]
}

/// See the module docs. Launch: [`THREADS`] threads per CTA, any number of CTAs (grid-strided
/// over `rows · I / 16` items).
///
/// # Safety
/// `p.h` holds `rows · n1` readable 16-bit values (`rows = p.sizes.token_rows()`, `n1 = 2I`
/// gated, else `I`); `p.out` `rows · I` writable 16-bit values (W4A16) or `rows · I / 2` bytes
/// (W4A4), and then `p.scales` `p.sizes.scale_rows() · I / 16` bytes and, with `p.group_scales`
/// set, that address `p.sizes.groups` readable `f32`s; `p.sizes.sizes` points to
/// `p.sizes.sizes_len()` readable `u32`s; the outputs overlap nothing the kernel reads. The host's
/// `Quantizer::activate_grouped_views` checks all of it before launching.
#[crate::ptx::kernel]
pub unsafe fn moe_activate(p: ActivateParams) {
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
    let items = if end < rows { end } else { rows } * blocks;
    let n1 = if p.gated != 0 { 2 * inter } else { inter };
    let rk = rest_k(inter);
    let global = p.global_scale as f64;
    let bf16 = p.bf16 != 0;
    let act = Activation::from_code(p.activation);
    // SAFETY: the sizes array is readable (the caller's contract).
    let load = unsafe { crate::moe::sizes_reader(&p.sizes) };
    let mut item = sreg::ctaid_x() * THREADS + sreg::tid_x();
    let stride = sreg::nctaid_x() * THREADS;
    while item < items {
        let (row, j) = (item / blocks, item % blocks);
        if let Some((group, scale_row)) = p.sizes.locate(row, load) {
            let src = row as usize * n1 as usize + (BLOCK * j) as usize;
            let first = row as usize * inter as usize + (BLOCK * j) as usize;
            // SAFETY: row < rows: the gate (and up) blocks are in `h`, the outputs in `out` /
            // `scales` (the caller's contract); `scale_row` is below the scale rows.
            unsafe {
                let g = load16((p.h as *const u8).add(2 * src));
                let z = if p.gated != 0 {
                    let u = load16((p.h as *const u8).add(2 * (src + inter as usize)));
                    [
                        word(act, g[0], Some(u[0]), bf16),
                        word(act, g[1], Some(u[1]), bf16),
                        word(act, g[2], Some(u[2]), bf16),
                        word(act, g[3], Some(u[3]), bf16),
                        word(act, g[4], Some(u[4]), bf16),
                        word(act, g[5], Some(u[5]), bf16),
                        word(act, g[6], Some(u[6]), bf16),
                        word(act, g[7], Some(u[7]), bf16),
                    ]
                } else {
                    [
                        word(act, g[0], None, bf16),
                        word(act, g[1], None, bf16),
                        word(act, g[2], None, bf16),
                        word(act, g[3], None, bf16),
                        word(act, g[4], None, bf16),
                        word(act, g[5], None, bf16),
                        word(act, g[6], None, bf16),
                        word(act, g[7], None, bf16),
                    ]
                };
                if p.quantize != 0 {
                    let global = row_global_scale(p.group_scales, group, global);
                    let (s, packed) = quantize_block(z, bf16, global);
                    *((p.out as *mut u8).add(first / 2) as *mut u64) = packed;
                    *(p.scales as *mut u8).add(blocked_offset(scale_row, j, rk)) = s;
                } else {
                    let dst = (p.out as *mut u8).add(2 * first) as *mut U32x4;
                    *dst = U32x4([z[0], z[1], z[2], z[3]]);
                    *dst.add(1) = U32x4([z[4], z[5], z[6], z[7]]);
                }
            }
        }
        item += stride;
    }
}
