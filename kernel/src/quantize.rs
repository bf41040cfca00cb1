//! `nvfp4_quantize` and `nvfp4_dequantize` (both architectures): f16/bf16 `[rows, K]` ⇄ NVFP4
//! (packed e2m1 values + e4m3 scales in the 128x4 blocked layout, two-level scaling with a given
//! global scale). The arithmetic, the work decomposition and the NaN/inf rules are in
//! `nvfp4_gemm_abi::quantize` (host-tested against the CPU quantizer); this file only moves bytes.
//!
//! Work item = (row, block of 16 values), grid-strided, consecutive threads on consecutive
//! blocks: the quantizer reads 32 bytes (two 16-byte loads) and writes 8 bytes of values and one
//! scale byte (zero over the padding rows of the last 128-row scale block); the dequantizer does
//! the reverse for the real rows.

#![deny(unsafe_op_in_unsafe_fn)]

use crate::ptx::{convert, cvt_f64, sreg};
use nvfp4_gemm_abi::quantize::{
    dequantize_items, dequantize_value, e4m3_to_f64, pack_codes, quantize_block_with, quantize_items, BlockOps,
    ConvertParams, BLOCK, THREADS,
};
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};

/// The block quantization's steps on the device's instructions (`BlockOps`; the same results as
/// the CPU's `Software`): the thresholds' floor is `cvt.rz.{bf16,f16}.f64`
/// (`cvt_f64::half_floor`), and a word's two codes count the thresholds below each half's
/// magnitude with packed comparisons (`set.gt.{f16,bf16}x2`, 1.0 where greater) summed onto 1024
/// (f16) or 128 (bf16), where the format's step is 1, so the count lands in the low bits. For
/// magnitudes that are not NaN (a NaN block never reaches the codes) the float order of two
/// non-negative 16-bit values is the order of their patterns, which the CPU's count compares.
pub struct DeviceOps;

impl BlockOps for DeviceOps {
    type Thresholds = [u32; 7];
    #[inline(always)]
    fn half_floor(t: f64, bf16: bool) -> (u16, bool) {
        cvt_f64::half_floor(t, bf16)
    }
    #[inline(always)]
    fn prepare(c: &[u16; 7]) -> [u32; 7] {
        c.map(|c| c as u32 | (c as u32) << 16)
    }
    #[inline(always)]
    fn codes<const W: usize>(words: [u32; W], c: &[u32; 7], bf16: bool) -> u64 {
        // One branch for the block (not a predicated pair of instructions per threshold).
        if bf16 {
            pack_codes(words, |w| code_pair::<true>(w, c))
        } else {
            pack_codes(words, |w| code_pair::<false>(w, c))
        }
    }
}

/// A word's two e2m1 codes, low half in the low nibble (`DeviceOps`'s `BlockOps::codes`; its docs say how).
#[inline(always)]
pub fn code_pair<const BF16: bool>(word: u32, c: &[u32; 7]) -> u8 {
    let mag = word & 0x7FFF_7FFF;
    let mut count = if BF16 { 0x4300_4300 } else { 0x6400_6400 };
    for &c in c {
        count = if BF16 {
            convert::add_bf16x2(count, convert::set_gt_bf16x2(mag, c))
        } else {
            convert::add_f16x2(count, convert::set_gt_f16x2(mag, c))
        };
    }
    let codes = (count & 0x0007_0007) | ((word >> 12) & 0x0008_0008);
    (codes & 0xF) as u8 | ((codes >> 12) & 0xF0) as u8
}

/// 16 bytes, so that loads and stores through it become `ld.v4` / `st.v4`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
struct U32x4([u32; 4]);

/// f16/bf16 → NVFP4. Launch: [`THREADS`] threads per CTA, any number of CTAs (grid-strided over
/// `quantize_items(rows, k)` items).
///
/// # Safety
/// `p.k` is a positive multiple of 64 and `quantize_items(p.rows, p.k) < 2^31`; `p.dense` points
/// to `rows * k` readable 16-bit floats, `p.values` to `rows * k / 2` writable bytes and
/// `p.scales` to `blocked_bytes(rows, k)` writable bytes, each 16-byte aligned; the outputs
/// overlap nothing the kernel reads. The host's `Quantizer` checks all of it before launching.
#[crate::ptx::kernel]
pub unsafe fn nvfp4_quantize(p: ConvertParams) {
    let blocks = p.k / BLOCK;
    if blocks == 0 {
        return;
    }
    let items = quantize_items(p.rows, p.k) as u32;
    let rk = rest_k(p.k);
    let global = p.global_scale as f64;
    let bf16 = p.bf16 != 0;
    let mut item = sreg::ctaid_x() * THREADS + sreg::tid_x();
    let stride = sreg::nctaid_x() * THREADS;
    while item < items {
        let (row, j) = (item / blocks, item % blocks);
        // SAFETY: (row, j) lies in the padded scale buffer.
        let scale = unsafe { (p.scales as *mut u8).add(blocked_offset(row, j, rk)) };
        if row >= p.rows {
            // SAFETY: as above.
            unsafe { *scale = 0 };
        } else {
            let first = row as usize * p.k as usize + (BLOCK * j) as usize;
            // SAFETY: row < rows, so the block's 16 values (32 bytes, 32-byte aligned) are in the
            // input.
            let (a, b) = unsafe {
                let src = (p.dense as *const u8).add(2 * first) as *const U32x4;
                ((*src).0, (*src.add(1)).0)
            };
            let (s, packed) =
                quantize_block_with::<DeviceOps>([a[0], a[1], a[2], a[3], b[0], b[1], b[2], b[3]], bf16, global);
            // SAFETY: the block's 8 packed bytes (8-byte aligned) are in the values buffer; the
            // scale byte as above.
            unsafe {
                *((p.values as *mut u8).add(first / 2) as *mut u64) = packed;
                *scale = s;
            }
        }
        item += stride;
    }
}

/// NVFP4 → f16/bf16: `e2m1 * e4m3 * g` (exact in `f64`) rounded once. Launch: [`THREADS`] threads
/// per CTA, any number of CTAs (grid-strided over `dequantize_items(rows, k)` items).
///
/// # Safety
/// `p.k` is a positive multiple of 64 and `dequantize_items(p.rows, p.k) < 2^31`; `p.values`
/// points to `rows * k / 2` readable bytes, `p.scales` to `blocked_bytes(rows, k)` readable bytes
/// and `p.dense` to `rows * k` writable 16-bit floats, each 16-byte aligned; the output overlaps
/// nothing the kernel reads. The host's `Quantizer` checks all of it before launching.
#[crate::ptx::kernel]
pub unsafe fn nvfp4_dequantize(p: ConvertParams) {
    let blocks = p.k / BLOCK;
    if blocks == 0 {
        return;
    }
    let items = dequantize_items(p.rows, p.k) as u32;
    let rk = rest_k(p.k);
    let global = p.global_scale as f64;
    let bf16 = p.bf16 != 0;
    let mut item = sreg::ctaid_x() * THREADS + sreg::tid_x();
    let stride = sreg::nctaid_x() * THREADS;
    while item < items {
        let (row, j) = (item / blocks, item % blocks);
        let first = row as usize * p.k as usize + (BLOCK * j) as usize;
        // SAFETY: row < rows: the block's 8 packed bytes (8-byte aligned) and its scale byte are in
        // bounds.
        let (codes, s) = unsafe {
            (
                *((p.values as *const u8).add(first / 2) as *const u64),
                *(p.scales as *const u8).add(blocked_offset(row, j, rk)),
            )
        };
        let unit = e4m3_to_f64(s) * global;
        let mut out = [0u32; 8];
        for (w, o) in out.iter_mut().enumerate() {
            // Byte w: elements 2w (low nibble) and 2w + 1.
            let byte = (codes >> (8 * w)) as u32;
            let (lo, hi) = (dequantize_value(byte, unit), dequantize_value(byte >> 4, unit));
            let (lo, hi) = if bf16 {
                (cvt_f64::f64_to_bf16_bits(lo), cvt_f64::f64_to_bf16_bits(hi))
            } else {
                (cvt_f64::f64_to_f16_bits(lo), cvt_f64::f64_to_f16_bits(hi))
            };
            *o = lo as u32 | (hi as u32) << 16;
        }
        // SAFETY: the block's 16 outputs (32 bytes, 32-byte aligned) are in the output buffer.
        unsafe {
            let dst = (p.dense as *mut u8).add(2 * first) as *mut U32x4;
            *dst = U32x4([out[0], out[1], out[2], out[3]]);
            *dst.add(1) = U32x4([out[4], out[5], out[6], out[7]]);
        }
        item += stride;
    }
}
