//! `sm90_w4a16_prepack`: a stack of experts' NVFP4 weights → the W4A16 prepacked format
//! (docs/w4a16.md §2), for f16 or bf16 activations. The permutation is the abi's, in the word
//! forms `nvfp4_gemm_abi::sm90::prepack` derives from the definitions the CPU prepack applies
//! (`ChunkRowWords`, `prepack_scale_line`); this file only moves bytes. Work items and their
//! order: `nvfp4_gemm_abi::sm90::prepack`.
//!
//! Each thread grid-strides over the value items (one 32-byte chunk row: two 16-byte loads, two
//! 16-byte stores; with bf16 activations also the chunk's 4-byte scale word), then over the scale
//! lines (two 16-byte loads, one 16-byte store). Consecutive threads take consecutive items, so a
//! warp's loads and stores cover contiguous bytes.

use super::U32x4;
use crate::ptx::sreg;
use core::num::NonZeroU32;
use nvfp4_gemm_abi::sm90::prepack::{
    chunk_scale_word_offset, folds, prepack_scale_line, scale_lines, value_items, ChunkRowWords, PrepackParams,
    CHUNK_ROW_BYTES, PREPACK_THREADS, SCALE_LINE_BYTES,
};
use nvfp4_gemm_abi::sm90::w4a16::{Activations, Decoder};
use nvfp4_gemm_abi::sm90::CHUNK_K;

/// The chunk-row prepack of each activation type's decoder layout: constants, so that it
/// compiles to fixed shifts, masks and byte permutes.
const F16_WORDS: ChunkRowWords = ChunkRowWords::new(&Decoder::of(Activations::F16).layout());
const BF16_WORDS: ChunkRowWords = ChunkRowWords::new(&Decoder::of(Activations::Bf16).layout());

/// See the module docs. Launch: `nvfp4_gemm_abi::sm90::prepack::prepack_launch`
/// ([`PREPACK_THREADS`] threads per CTA, any number of CTAs).
///
/// # Safety
/// `p.k` is a positive multiple of 64, `p.rows` and `p.experts` are positive and
/// `items(p.experts, p.rows, p.k) < MAX_ITEMS`; `p.values` and `p.out_values` point to
/// `experts · rows · k/2` bytes, `p.scales` and `p.out_scales` to `experts · blocked_bytes(rows,
/// k)` bytes, each 16-byte aligned, the inputs readable and the outputs writable; the outputs
/// overlap nothing. The host's `Prepacker` checks all of it before launching.
#[crate::ptx::kernel]
pub unsafe fn sm90_w4a16_prepack(p: PrepackParams) {
    // Both positive for every launch the host makes.
    let (Some(rows), Some(chunks)) = (NonZeroU32::new(p.rows), NonZeroU32::new(p.k / CHUNK_K)) else {
        return;
    };
    let first = sreg::ctaid_x() * PREPACK_THREADS + sreg::tid_x();
    let stride = sreg::nctaid_x() * PREPACK_THREADS;
    // Each branch runs the abi's functions on a constant layout and activation type.
    // SAFETY: the kernel's contract.
    unsafe {
        match p.activations() {
            Activations::F16 => {
                values(&p, rows, chunks, Activations::F16, &F16_WORDS, first, stride);
                scales(&p, Activations::F16, first, stride);
            }
            Activations::Bf16 => {
                values(&p, rows, chunks, Activations::Bf16, &BF16_WORDS, first, stride);
                scales(&p, Activations::Bf16, first, stride);
            }
        }
    }
}

/// The value items `first, first + stride, ..`: each chunk row prepacked by `words`, with the
/// chunk's sign and zero folds for `activations`.
///
/// # Safety
/// The kernel's contract.
#[inline(always)]
unsafe fn values(
    p: &PrepackParams,
    rows: NonZeroU32,
    chunks: NonZeroU32,
    activations: Activations,
    words: &ChunkRowWords,
    first: u32,
    stride: u32,
) {
    let items = value_items(p.experts, p.rows, p.k) as u32;
    let mut t = first;
    while t < items {
        let at = CHUNK_ROW_BYTES as usize * t as usize;
        // SAFETY: t < items: the chunk row's 32 bytes (16-byte aligned) are in both value
        // buffers, and its scale word (4-byte aligned) in the input scales.
        unsafe {
            let src = (p.values as *const u8).add(at) as *const U32x4;
            let (lo, hi) = ((*src).0, (*src.add(1)).0);
            let word = match activations {
                Activations::F16 => 0,
                Activations::Bf16 => {
                    *((p.scales as *const u8).add(chunk_scale_word_offset(t, rows, chunks)) as *const u32)
                }
            };
            let (negate, zero) = folds(word, activations);
            let out = words.apply([lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]], negate, zero);
            let dst = (p.out_values as *mut u8).add(at) as *mut U32x4;
            *dst = U32x4([out[0], out[1], out[2], out[3]]);
            *dst.add(1) = U32x4([out[4], out[5], out[6], out[7]]);
        }
        t += stride;
    }
}

/// The scale lines `first, first + stride, ..`: each from input lines `l` and `l ^ 8` by
/// `prepack_scale_line`.
///
/// # Safety
/// The kernel's contract.
#[inline(always)]
unsafe fn scales(p: &PrepackParams, activations: Activations, first: u32, stride: u32) {
    let lines = scale_lines(p.experts, p.rows, p.k) as u32;
    let mut l = first;
    while l < lines {
        // SAFETY: l < lines, and l ^ 8 too (lines come in blocks of 32): both 16-byte lines are in
        // the input scales, line l in the output's.
        unsafe {
            let src = p.scales as *const U32x4;
            let (own, partner) = ((*src.add(l as usize)).0, (*src.add((l ^ 8) as usize)).0);
            let dst = (p.out_scales as *mut u8).add(SCALE_LINE_BYTES as usize * l as usize) as *mut U32x4;
            *dst = U32x4(prepack_scale_line(l, own, partner, activations));
        }
        l += stride;
    }
}
