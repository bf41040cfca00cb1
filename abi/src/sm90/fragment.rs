//! Where a consumer thread finds its weight fragments in a stage: which weight rows its lane
//! group holds, the 8-byte words of the 64-byte-swizzled weight box, and the rows' scale words.

use super::config::WEIGHT_ROW_BYTES;

/// The weight row, within its group of 8, whose A-fragment rows lane group `g` (lane / 4) of a
/// consumer warp holds: `g` with bits 1 and 2 swapped (0, 1, 4, 5, 2, 3, 6, 7). wgmma fixes that
/// lane group `g` holds fragment rows `g` and `g + 8` of the warp's 16 (PTX ISA, wgmma register
/// fragments); which weight rows of the tile they are is the kernel's choice, as long as the loads
/// and the epilogue agree. With the identity, a half-warp (lane groups 0–3 or 4–7, the 16 lanes
/// an 8-byte shared load serves per pass) reads rows `r` and `r + 2`, which the 64-byte swizzle
/// puts on the same banks: each such load took 4 shared wavefronts instead of 2 (ncu on b1: 11%
/// of the kernel's shared wavefronts "excessive", exactly these loads). Rows `{0, 1, 4, 5}` and
/// `{2, 3, 6, 7}` cover all 32 banks (test `half_warps_read_weights_without_bank_conflicts`).
/// Bit 0 is kept, so lane groups `g` and `g ^ 1` still hold neighbouring weights (the epilogue's
/// pairs).
pub const fn lane_group_row(g: u32) -> u32 {
    (g & 1) | ((g & 2) << 1) | ((g & 4) >> 1)
}

/// Byte offset, inside a 64-byte-swizzled weight box, of the 8 bytes (16 e2m1 values: one
/// scale block) that thread `q` (lane % 4) of a consumer reads for weight row `row` (0..block_n) and
/// chunk `chunk` of the box (0..[`CHUNKS_PER_BOX`](super::CHUNKS_PER_BOX)). Logically they are
/// bytes `32·chunk + 8·q ..` of the row, i.e. 16-byte unit `2·chunk + q/2`, half `q % 2`; the
/// 64-byte swizzle moves unit `u` of row `r` to `u ^ ((r / 2) % 4)`.
pub const fn weight_fragment_offset(row: u32, chunk: u32, q: u32) -> u32 {
    row * WEIGHT_ROW_BYTES + (((2 * chunk + q / 2) ^ ((row / 2) % 4)) * 16) + (q % 2) * 8
}

/// Byte offset of the 4-byte scale word of weight row `row` (0..128) inside a chunk's 512-byte
/// scale block: the 128x4 blocked layout's `(row % 32) * 16 + (row / 32) * 4`
/// ([`crate::scale_layout::blocked_word_offset`] within one block). Byte `q` of the word scales
/// the row's values `16q .. 16q + 16` of the chunk.
pub const fn scale_word_offset(row: u32) -> u32 {
    (row % 32) * 16 + (row / 32) * 4
}

#[cfg(test)]
mod tests {
    use crate::sm90::*;

    /// The consumers' 8-byte reads undo the 64-byte swizzle: together they read every byte of the
    /// weight box once, and each read is the logical 8 bytes `32·chunk + 8·q` of its row.
    #[test]
    fn weight_fragments_undo_the_64b_swizzle() {
        let swizzle64 = |row: u32, logical: u32| row * 64 + (((logical / 16) ^ ((row / 2) % 4)) * 16) + logical % 16;
        let mut seen = [false; (BLOCK_N * WEIGHT_ROW_BYTES / 8) as usize];
        for row in 0..BLOCK_N {
            for chunk in 0..CHUNKS_PER_BOX {
                for q in 0..4 {
                    let o = weight_fragment_offset(row, chunk, q);
                    assert_eq!(o % 8, 0);
                    assert_eq!(o, swizzle64(row, 32 * chunk + 8 * q));
                    assert!(!seen[o as usize / 8]);
                    seen[o as usize / 8] = true;
                }
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    /// Every half-warp's 8-byte weight loads (lane groups 0–3 or 4–7, four lanes `q` each, rows
    /// `16w + lane_group_row(g)` and `+ 8`) touch 32 distinct banks, in every chunk: one shared
    /// wavefront per half-warp. The rows are a permutation of the warp's 16, pairs kept.
    #[test]
    fn half_warps_read_weights_without_bank_conflicts() {
        let mut rows = [0u32; 8];
        for (g, r) in rows.iter_mut().enumerate() {
            *r = lane_group_row(g as u32);
        }
        assert!((0..8).all(|g| lane_group_row(g) ^ 1 == lane_group_row(g ^ 1)));
        rows.sort_unstable();
        assert_eq!(rows, [0, 1, 2, 3, 4, 5, 6, 7]);
        for warp in 0..4 {
            for plus8 in [0, 8] {
                for chunk in 0..CHUNKS_PER_BOX {
                    for half in 0..2 {
                        let mut banks = [0u32; 32];
                        for g in 4 * half..4 * half + 4 {
                            for q in 0..4 {
                                let o = weight_fragment_offset(16 * warp + lane_group_row(g) + plus8, chunk, q);
                                banks[(o / 4 % 32) as usize] += 1;
                                banks[(o / 4 % 32 + 1) as usize] += 1;
                            }
                        }
                        assert!(
                            banks.iter().all(|&b| b == 1),
                            "warp {warp} +{plus8} chunk {chunk} half {half}: {banks:?}"
                        );
                    }
                }
            }
        }
        // The identity (the layout before) conflicts: rows r and r + 2 use the same 8 banks.
        let banks = |row| (0..4).fold(0u32, |m, q| m | 3 << (weight_fragment_offset(row, 0, q) / 4 % 32));
        assert_eq!((banks(0), banks(2)), (0xFF, 0xFF));
    }

    #[test]
    fn scale_words_are_the_blocked_layout() {
        for row in 0..BLOCK_N {
            assert_eq!(scale_word_offset(row) as usize, crate::scale_layout::blocked_word_offset(row, 0, 1));
        }
    }
}
