//! `moe_activate` (both architectures): the MoE block's activation between its two grouped GEMMs
//! (docs/moe-block.md, "The GPU block"), per row of a group: `z[j] = D(act(h[j]) · h[I + j])`
//! (gated) or `D(act(h[j]))`, the activation's `f32` arithmetic `nvfp4_gemm_abi::moe::block`'s
//! (the product exact in `f64`, one rounding to `D`), then either stored as `D` (W4A16) or
//! quantized with the second GEMM's input scale (one, or one per group) into the grouped NVFP4
//! layout (W4A4: the same block arithmetic and scale rows as `nvfp4_quantize_grouped`).
//!
//! Work item = (token row, block of 16 outputs, quarter): each thread computes 4 outputs, the 4
//! threads of a block (lanes `4i .. 4i + 4`) exchange their parts' largest magnitudes and each
//! quantizes its part (`quantize_block_part`: together exactly `quantize_block`), so that a
//! call's few rows at small T spread over 4× the threads with a quarter of the dependent work
//! each. Grid-strided; rows of no group are skipped.

use crate::ptx::sreg;
use crate::quantize_grouped::{round_to_half, row_global_scale};
use nvfp4_gemm_abi::moe::block::{activated, ActivateParams, Activation, ACTIVATE_PARTS};
use nvfp4_gemm_abi::quantize::{block_part_amax, quantize_block_part, BLOCK, THREADS};
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};

/// One output word (two values) from a gate word and an up word (`None`: not gated).
#[inline(always)]
pub(crate) fn word(act: Activation, gate: u32, up: Option<u32>, bf16: bool) -> u32 {
    let lo = activated(act, gate as u16, up.map(|u| u as u16), bf16);
    let hi = activated(act, (gate >> 16) as u16, up.map(|u| (u >> 16) as u16), bf16);
    round_to_half(lo, bf16) as u32 | (round_to_half(hi, bf16) as u32) << 16
}

// Each part is the 4 values `load4` reads.
const _: () = assert!(BLOCK / ACTIVATE_PARTS == 4);

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

/// See the module docs. Launch: [`THREADS`] threads per CTA, any number of CTAs (grid-strided
/// over `activate_items(rows, I)` items).
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
    let items = if end < rows { end } else { rows } * blocks * ACTIVATE_PARTS;
    let n1 = if p.gated != 0 { 2 * inter } else { inter };
    let rk = rest_k(inter);
    let global = p.global_scale as f64;
    let bf16 = p.bf16 != 0;
    let act = Activation::from_code(p.activation);
    // SAFETY: the sizes array is readable (the caller's contract).
    let load = unsafe { crate::moe::sizes_reader(&p.sizes) };
    let lane = sreg::lane_id();
    let mut item = sreg::ctaid_x() * THREADS + sreg::tid_x();
    let stride = sreg::nctaid_x() * THREADS;
    // Whole warps run every round (the quantization's exchange takes all 32 lanes): a warp goes
    // on while its first item is below the end; a block's 4 items are in 4 aligned lanes (the
    // stride is a multiple of 32).
    while item - lane < items {
        let (q, part) = (item / ACTIVATE_PARTS, item % ACTIVATE_PARTS);
        let (row, j) = (q / blocks, q % blocks);
        let located = if item < items { p.sizes.locate(row, load) } else { None };
        // The part's 4 outputs start at column `16 j + 4 part` of the row.
        let col = (BLOCK * j + 4 * part) as usize;
        let z = match located {
            // SAFETY: row < rows: the gate (and up) values are in `h` (the caller's contract);
            // 8-byte aligned (`col` and `n1` multiples of 4).
            Some(_) => unsafe {
                let src = row as usize * n1 as usize + col;
                let g = load4((p.h as *const u8).add(2 * src));
                if p.gated != 0 {
                    let u = load4((p.h as *const u8).add(2 * (src + inter as usize)));
                    [word(act, g[0], Some(u[0]), bf16), word(act, g[1], Some(u[1]), bf16)]
                } else {
                    [word(act, g[0], None, bf16), word(act, g[1], None, bf16)]
                }
            },
            None => [0, 0],
        };
        let first = row as usize * inter as usize + col;
        if p.quantize != 0 {
            let amax = crate::scan::lanes_max(block_part_amax(z) as u32, ACTIVATE_PARTS.trailing_zeros()) as u16;
            if let Some((group, scale_row)) = located {
                // SAFETY: the outputs of row < rows (the caller's contract), the part's 2 bytes
                // 2-byte aligned; `scale_row` is below the scale rows; `group_scales`, when set,
                // holds an `f32` per group.
                unsafe {
                    let global = row_global_scale(p.group_scales, group, global);
                    let (s, packed) = quantize_block_part(z, amax, bf16, global);
                    *((p.out as *mut u8).add(first / 2) as *mut u16) = packed as u16;
                    if part == 0 {
                        *(p.scales as *mut u8).add(blocked_offset(scale_row, j, rk)) = s;
                    }
                }
            }
        } else if located.is_some() {
            // SAFETY: the row's 4 outputs in `out` (the caller's contract), 8-byte aligned.
            unsafe { *((p.out as *mut u8).add(2 * first) as *mut u64) = z[0] as u64 | (z[1] as u64) << 32 };
        }
        item += stride;
    }
}
