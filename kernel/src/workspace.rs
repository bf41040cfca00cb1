//! The f16 token workspace of an sm_90a GEMM (`nvfp4_gemm_abi::sm90::TokenWorkspace`): the
//! one decoding of an NVFP4 block into it, which `sm90_dequant_tokens` applies to the tokens in
//! memory and the block's quantizing kernels (`nvfp4_quantize_grouped`, `moe_activate`) to the
//! block they have just quantized, so that both write the same bytes.

use crate::ptx::convert;
use nvfp4_gemm_abi::sm90::TokenWorkspace;
use nvfp4_gemm_abi::sm90::DECODE_UNSCALE_F16X2;

/// Decoded pair `pair` (0..4) of packed e2m1 word `word` — logical values `pair` and `pair + 4`
/// of its eight — times the block scale `scale` (an e4m3 value broadcast to both halves, e.g.
/// `convert::e4m3_byte_to_f16x2`), in f16: exact (the decoder's values times 2⁻¹⁴ times the
/// scale are exact in f16, `convert::e4m3_bytes_to_f16x2`, and times 2¹⁴ at most 6 · 448).
#[inline(always)]
pub fn dequantized_pair(word: u32, pair: u32, scale: u32) -> u32 {
    let values = convert::e2m1x2_pair_to_f16x2_scaled(word, 4 * pair);
    convert::mul_f16x2(convert::mul_f16x2(values, scale), DECODE_UNSCALE_F16X2)
}

/// Writes pairs `first .. first + count` of packed word `half` (0 or 1: values `8·half ..
/// 8·half + 8`) of scale block `block` of row `row` (`k` values per row) into the workspace at
/// `workspace`, decoded with the block's e4m3 scale byte `scale`.
///
/// # Safety
/// `workspace` holds the workspace of at least `row + 1` rows of `k` values (writable).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub unsafe fn store_pairs(
    workspace: u64,
    row: u32,
    k: u32,
    block: u32,
    half: u32,
    word: u32,
    scale: u8,
    first: u32,
    count: u32,
) {
    let scale = convert::e4m3_byte_to_f16x2(scale as u32, 0);
    for i in 0..count {
        let pair = first + i;
        let at = TokenWorkspace::pair_offset(row, k, block, half, pair);
        // SAFETY: inside the row's 2k bytes (the caller's contract); 4-byte aligned.
        unsafe { *((workspace as *mut u8).add(at) as *mut u32) = dequantized_pair(word, pair, scale) };
    }
}

/// Writes a whole scale block (16 values, `packed` as the quantizer stores them: value `2i` in the
/// low nibble of byte `i`) of row `row`, as [`store_pairs`] does for each half.
///
/// # Safety
/// As [`store_pairs`].
#[inline(always)]
pub unsafe fn store_block(workspace: u64, row: u32, k: u32, block: u32, packed: u64, scale: u8) {
    for half in 0..2 {
        // SAFETY: the caller's contract.
        unsafe { store_pairs(workspace, row, k, block, half, (packed >> (32 * half)) as u32, scale, 0, 4) };
    }
}
