//! The token workspace: the K permutation the f16 tokens are stored in (so that each consumer
//! thread's A fragment is one scale block of its weight row) and the token-dequantization kernel:
//! its name, register cap and work split (items, slots, CTAs per group).

use super::config::CHUNK_K;

/// The exported name of the token-dequantization kernel.
pub const DEQUANT_KERNEL: &str = "sm90_dequant_tokens";
/// Register cap of the token-dequantization kernel (256-thread CTAs, several per SM).
pub const DEQUANT_MAX_REGISTERS: u32 = 64;
/// Threads per CTA of the token dequantization kernel.
pub const DEQUANT_THREADS: u32 = 256;
/// Threads per work item (one row × 64-wide chunk: 128 bytes of f16 out) of the token
/// dequantization kernel: each writes one 16-byte slot, so that a warp stores 512 contiguous bytes.
pub const DEQUANT_THREADS_PER_ITEM: u32 = 8;
/// Work items each token-dequantization thread takes per pass (their loads are issued together).
pub const DEQUANT_ITEMS_PER_THREAD: u32 = 4;
/// Work items one token-dequantization CTA covers per pass: item `i` of a pass goes to threads
/// `8 · (i % 32) ..` (so a warp covers 4 consecutive items), in round `i / 32`.
pub const DEQUANT_ITEMS_PER_CTA: u32 = DEQUANT_THREADS / DEQUANT_THREADS_PER_ITEM * DEQUANT_ITEMS_PER_THREAD;
/// Token-dequantization CTAs per SM a device-sized plan's grid holds (48 registers × 256 threads:
/// five fit an SM's registers; four leave room for a GEMM starting early); its CTAs take the
/// scheduled CTAs grid-strided.
pub const DEQUANT_GRID_CTAS_PER_SM: u32 = 4;
/// Most token-dequantization CTAs per group (each grid-strides over the group's rows × chunks).
pub const MAX_DEQUANT_CTAS_PER_GROUP: u32 = 256;

/// Token-dequantization CTAs of a group of `m` rows and reduction length `k`:
/// `min(⌈m · k/64 / DEQUANT_ITEMS_PER_CTA⌉, MAX_DEQUANT_CTAS_PER_GROUP)`.
pub const fn dequant_ctas(m: u32, k: u32) -> u32 {
    let ctas = (m as u64 * (k / CHUNK_K) as u64).div_ceil(DEQUANT_ITEMS_PER_CTA as u64);
    if ctas < MAX_DEQUANT_CTAS_PER_GROUP as u64 {
        ctas as u32
    } else {
        MAX_DEQUANT_CTAS_PER_GROUP
    }
}

/// Where thread `j` (0..8) of a token-dequantization work item finds its inputs and puts its
/// output: it writes 16-byte slot `j` of the item's 128-byte f16 row, i.e. the four f16x2 pairs
/// `4j .. 4j + 4` of [`token_pair_slot`]; pair `4j + q` is pair `j % 4` (of the decoder's four)
/// of packed word `j / 4 + 2q`, scaled by block `q`. Returns those four word indices (0..8).
pub const fn dequant_slot_words(j: u32) -> [u32; 4] {
    let h = j / 4;
    [h, h + 2, h + 4, h + 6]
}

/// Position (0..64) in a 64-wide K chunk of the f16 token workspace where logical value `l`
/// (0..64) of the chunk is stored.
///
/// wgmma k-step `j` (physical columns `16j..16j+16`) gives thread `q` (lane % 4) the A-fragment
/// registers `2q, 2q+1` (register 0) and `2q+8, 2q+9` (register 2). Thread `q` decodes the 16
/// logical values `16q..16q+16` (one scale block: two 32-bit words of packed e2m1) into 8 f16x2
/// pairs: pair `p = 4h + k` of word `h` holds values `8h + k` (low half) and `8h + k + 4` (high
/// half), the order the shift-and-mask decoder produces them in (see the kernel's
/// `ptx::convert::e2m1x8_to_f16x2_scaled`). Pair `p` feeds k-step `p / 2`, register `2·(p % 2)`.
/// Over the four k-steps thread `q` consumes exactly scale block `q`. The tokens are stored in the
/// same order, so the dot products are unchanged.
pub const fn token_k_position(l: u32) -> u32 {
    let q = l / 16;
    let t = l % 16;
    let (h, upper, k) = (t / 8, (t % 8) / 4, t % 4);
    let p = 4 * h + k;
    16 * (p / 2) + 2 * q + 8 * (p % 2) + upper
}

/// Where the decoder's pair `k` (0..4) of packed word `w` (0..8) of a row's chunk — logical values
/// `8w + k` and `8w + k + 4` — goes in the chunk's workspace row, in units of f16 pairs (0..32):
/// [`token_k_position`]`(8w + k) / 2`. The permutation puts the two values of a pair adjacent and
/// in order (checked by the tests), so the dequantization kernel stores whole f16x2 words.
pub const fn token_pair_slot(w: u32, k: u32) -> u32 {
    token_k_position(8 * w + k) / 2
}

/// The f16 token workspace of an sm_90a grouped GEMM of NVFP4 tokens (the operand its general and
/// decode kernels read through their token maps): row `r` of the token layout at byte
/// `r · 2K`, each of its 64-wide K chunks 128 bytes, logical value `l` of a chunk at position
/// [`token_k_position`]`(l)`, holding `e2m1 · e4m3` exactly (the block scale
/// applied, the global scale not: it is in the GEMM's alpha). `sm90_dequant_tokens` writes it from
/// the NVFP4 tokens; a quantizing kernel given its address (`moe::block::Gather::workspace`,
/// `moe::block::ActivateParams::workspace`) writes the same bytes as it quantizes, so that the GEMM's plan
/// needs no dequantization launch. Rows of no group are not written.
pub struct TokenWorkspace;

impl TokenWorkspace {
    /// Bytes of the workspace of `rows` token rows of `k` values.
    pub const fn bytes(rows: usize, k: usize) -> usize {
        rows * k * 2
    }

    /// Byte offset of the f16 pair that holds the decoded pair `pair` (0..4) of packed word
    /// `word` (0..2) of scale block `block` (0..k/16) of row `row`: logical values
    /// `8·word + pair` and `8·word + pair + 4` of the block, low half first (the order of the
    /// dequantization's decoder, [`token_pair_slot`]).
    pub const fn pair_offset(row: u32, k: u32, block: u32, word: u32, pair: u32) -> usize {
        let chunk = block / 4;
        let slot = token_pair_slot(2 * (block % 4) + word, pair);
        Self::bytes(row as usize, k as usize) + chunk as usize * 128 + 4 * slot as usize
    }
}

#[cfg(test)]
mod tests {
    use crate::sm90::*;

    #[test]
    fn token_permutation_is_a_bijection_and_gives_each_thread_one_scale_block() {
        let mut seen = [false; 64];
        for l in 0..64 {
            let p = token_k_position(l) as usize;
            assert!(!seen[p]);
            seen[p] = true;
        }
        // Thread q's fragment columns over the 4 k-steps are exactly logical 16q..16q+16.
        for q in 0..4u32 {
            let mut logical: [u32; 16] = [0; 16];
            let mut n = 0;
            for j in 0..4 {
                for col in [2 * q, 2 * q + 1, 2 * q + 8, 2 * q + 9] {
                    let phys = 16 * j + col;
                    logical[n] = (0..64).find(|&l| token_k_position(l) == phys).unwrap();
                    n += 1;
                }
            }
            logical.sort();
            assert_eq!(logical, core::array::from_fn(|i| 16 * q + i as u32));
        }
    }

    #[test]
    fn dequant_slots_cover_each_pair_once() {
        // Slot j, element q holds pair j % 4 of word dequant_slot_words(j)[q], scale block q.
        let mut seen = [false; 32];
        for j in 0..DEQUANT_THREADS_PER_ITEM {
            for (q, w) in dequant_slot_words(j).into_iter().enumerate() {
                assert_eq!(token_pair_slot(w, j % 4), 4 * j + q as u32, "slot {j} element {q}");
                assert_eq!(w / 2, q as u32, "word {w} is in scale block {q}");
                assert!(!seen[(4 * w + j % 4) as usize]);
                seen[(4 * w + j % 4) as usize] = true;
            }
        }
        assert!(seen[..].iter().filter(|&&x| x).count() == 32);
        assert_eq!(DEQUANT_ITEMS_PER_CTA, 128);
        assert_eq!(dequant_ctas(96, 512), 6);
        assert_eq!(dequant_ctas(248, 7168), 217);
        assert_eq!(dequant_ctas(1024, 7168), 256);
    }

    #[test]
    fn token_pair_slots_follow_the_k_permutation() {
        let mut seen = [false; 32];
        for w in 0..8u32 {
            for k in 0..4 {
                let slot = token_pair_slot(w, k);
                // The decoder's pair (8w+k, 8w+k+4) is one f16x2 word, low value first.
                assert_eq!(token_k_position(8 * w + k), 2 * slot);
                assert_eq!(token_k_position(8 * w + k + 4), 2 * slot + 1);
                assert!(!seen[slot as usize]);
                seen[slot as usize] = true;
            }
        }
        // The consumer's fragments: pair p of thread q's block feeds k-step p/2, register 2·(p%2).
        for q in 0..4u32 {
            for p in 0..8u32 {
                let (w, k) = (2 * q + p / 4, p % 4);
                assert_eq!(2 * token_pair_slot(w, k), 16 * (p / 2) + 2 * q + 8 * (p % 2));
            }
        }
    }
}
