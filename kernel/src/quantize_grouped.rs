//! `nvfp4_quantize_grouped` (both architectures): the token tensor of a device-sized grouped
//! GEMM, f16/bf16 → NVFP4, with each group's block scales at its own 128-row-aligned offset
//! (`nvfp4_gemm_abi::moe`). The same arithmetic as `nvfp4_quantize`, bit for bit; only the rows
//! of groups are read and written (with the sizes clamped as the scheduler clamps them), and
//! padding scale rows are left as they are.
//!
//! Work item = (token row, block of 16 values), grid-strided; each item finds its row's scale row
//! from the device sizes (a binary search over the offsets, or a division for the masked layout).

use crate::ptx::sreg;
use nvfp4_gemm_abi::moe::GroupedConvertParams;
use nvfp4_gemm_abi::quantize::{quantize_block, BLOCK, THREADS};
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};

/// 16 bytes, so that loads through it become `ld.v4`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct U32x4([u32; 4]);

/// See the module docs. Launch: [`THREADS`] threads per CTA, any number of CTAs (grid-strided
/// over `rows · k / 16` items).
///
/// # Safety
/// As `nvfp4_quantize` with `p.convert.rows` the token rows, except that `p.convert.scales` holds
/// `p.sizes.scale_rows()` scale rows; `p.sizes.sizes` points to `p.sizes.sizes_len()` readable
/// `u32`s. The host's `Quantizer::quantize_grouped` checks all of it before launching.
#[crate::ptx::kernel]
pub unsafe fn nvfp4_quantize_grouped(p: GroupedConvertParams) {
    let c = p.convert;
    let blocks = c.k / BLOCK;
    if blocks == 0 || p.sizes.groups == 0 {
        return;
    }
    let items = c.rows * blocks;
    let rk = rest_k(c.k);
    let global = c.global_scale as f64;
    let bf16 = c.bf16 != 0;
    // SAFETY: the sizes array is readable (the caller's contract).
    let load = unsafe { crate::moe::sizes_reader(&p.sizes) };
    let mut item = sreg::ctaid_x() * THREADS + sreg::tid_x();
    let stride = sreg::nctaid_x() * THREADS;
    while item < items {
        let (row, j) = (item / blocks, item % blocks);
        if let Some(scale_row) = p.sizes.scale_row(row, load) {
            let first = row as usize * c.k as usize + (BLOCK * j) as usize;
            // SAFETY: row < rows: the block's 16 values (32 bytes, 32-byte aligned) are in the
            // input; its 8 packed bytes in the values; `scale_row` is below the scale rows.
            unsafe {
                let src = (c.dense as *const u8).add(2 * first) as *const U32x4;
                let (a, b) = ((*src).0, (*src.add(1)).0);
                let (s, packed) = quantize_block([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]], bf16, global);
                *((c.values as *mut u8).add(first / 2) as *mut u64) = packed;
                *(c.scales as *mut u8).add(blocked_offset(scale_row, j, rk)) = s;
            }
        }
        item += stride;
    }
}
