//! Where a stage's block scales come from in global memory.
//!
//! Scales are stored in the 128x4 blocked layout of [`crate::scale_layout`]: for a 128-row block,
//! the 512-byte blocks of consecutive K=64 slices are consecutive. So the scales one stage needs
//! (128 rows x `TMA_BLOCK_K` values = 4 blocks) are one contiguous run, fetched with one
//! `cp.async.bulk.shared::cta.global` per 128 rows (docs/sm100.md §8, docs/sm100.md §4).

use crate::scale_layout::{self, BLOCK_BYTES, BLOCK_ROWS};

use super::instr::MMA_K;

/// Byte offset, in a blocked scale buffer with `rest_k` blocks per row block, of the 512-byte
/// block holding rows `row0 .. row0+127` and values `k0 .. k0+63`:
/// `((row0/128) * rest_k + k0/64) * 512`. `row0` is a multiple of 128 and `k0` of 64. Computed
/// through [`scale_layout::blocked_word_offset`], the layout's own formula.
pub const fn scale_block_offset(row0: u32, k0: u32, rest_k: u32) -> usize {
    scale_layout::blocked_word_offset(row0, k0 / MMA_K, rest_k)
}

/// One bulk copy of scale blocks from global to shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScaleBulkCopy {
    /// Byte offset from the start of the operand's blocked scale buffer.
    pub src_offset: usize,
    /// Byte offset from the start of the stage's SFA or SFB region.
    pub dst_offset: u32,
    /// Bytes to copy (a multiple of 512, hence of 16 as `cp.async.bulk` requires).
    pub bytes: u32,
}

/// The bulk copy of the scales for rows `row0 .. row0+127`, values `k0 .. k0 + 64*steps`, landing
/// `dst_offset` bytes into the stage's scale region. `steps` is the number of valid K=64 slices in
/// the stage, normally `TMA_BLOCK_K / 64` = 4.
///
/// With `K % 256 != 0` the last stage has fewer valid slices; copying only those keeps the read
/// inside the row block (the seed always copies `TMA_SFA_SMEM_BYTES` = 2048, which for the last
/// row block would read past the end of the buffer) and the byte count is what `expect_tx` must
/// count for the scales.
pub const fn scale_stage_copy(row0: u32, k0: u32, steps: u32, rest_k: u32, dst_offset: u32) -> ScaleBulkCopy {
    ScaleBulkCopy { src_offset: scale_block_offset(row0, k0, rest_k), dst_offset, bytes: steps * BLOCK_BYTES }
}

/// The SFA copy of one stage for the A tile starting at row `m_offset`: one run of `steps`
/// blocks at `((m_offset/128) * rest_k + k0/64) * 512`, placed at the start of the SFA region.
pub const fn sfa_stage_copy(m_offset: u32, k0: u32, steps: u32, rest_k: u32) -> ScaleBulkCopy {
    scale_stage_copy(m_offset, k0, steps, rest_k, 0)
}

/// The SFB copies of one stage for the B tile starting at row `n_offset`, `block_n` rows wide:
/// one per 128-row block (1 for BLOCK_N = 128, 2 for 256), the second landing after the first's
/// full-stage run (`steps_per_stage * 512` = the seed's `SFB_HALF_BYTES` = 2048). Returns the
/// copies and how many of the two are used.
pub const fn sfb_stage_copies(
    n_offset: u32,
    block_n: u32,
    k0: u32,
    steps: u32,
    steps_per_stage: u32,
    rest_k: u32,
) -> ([ScaleBulkCopy; 2], usize) {
    let first = scale_stage_copy(n_offset, k0, steps, rest_k, 0);
    let second = scale_stage_copy(n_offset + BLOCK_ROWS, k0, steps, rest_k, steps_per_stage * BLOCK_BYTES);
    let count = block_n.div_ceil(BLOCK_ROWS) as usize;
    ([first, second], count)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's expression, with its `rest_k = K / 16 / 4`.
    fn seed_offset(row0: u32, off_k: u32, k: u32) -> usize {
        let rest_k = k / 16 / 4;
        let k_blk = off_k / (16 * 4);
        (((row0 / 128) * rest_k + k_blk) * 512) as usize
    }

    #[test]
    fn block_offset_matches_seed() {
        for k in [256u32, 512, 768, 1536, 2048, 4096, 7168] {
            let rest_k = scale_layout::rest_k(k);
            assert_eq!(rest_k, k / 16 / 4);
            for row0 in (0..1024).step_by(128) {
                for off_k in (0..k).step_by(256) {
                    assert_eq!(
                        scale_block_offset(row0, off_k, rest_k),
                        seed_offset(row0, off_k, k),
                        "row0 {row0} off_k {off_k} k {k}"
                    );
                }
            }
        }
    }

    #[test]
    fn full_stage_copies_match_seed_sizes() {
        // TMA_SFA_SMEM_BYTES = 128 * (256/16) = 2048 = four 512-byte blocks.
        let rest_k = scale_layout::rest_k(7168);
        let a = sfa_stage_copy(256, 1024, 4, rest_k);
        assert_eq!(a.src_offset, seed_offset(256, 1024, 7168));
        assert_eq!((a.dst_offset, a.bytes), (0, 2048));

        let (b, n) = sfb_stage_copies(512, 128, 1024, 4, 4, rest_k);
        assert_eq!(n, 1);
        assert_eq!(b[0].src_offset, seed_offset(512, 1024, 7168));
        assert_eq!((b[0].dst_offset, b[0].bytes), (0, 2048));

        // BLOCK_N = 256: SFB_src0 / SFB_src1, each SFB_HALF_BYTES = 2048, at SFB_off and +2048.
        let (b, n) = sfb_stage_copies(512, 256, 1024, 4, 4, rest_k);
        assert_eq!(n, 2);
        assert_eq!(b[0].src_offset, seed_offset(512, 1024, 7168));
        assert_eq!(b[1].src_offset, seed_offset(640, 1024, 7168));
        assert_eq!((b[0].dst_offset, b[0].bytes), (0, 2048));
        assert_eq!((b[1].dst_offset, b[1].bytes), (2048, 2048));
    }

    /// A stage's run is contiguous and covers exactly the scales of its rows and K range.
    #[test]
    fn stage_run_covers_the_right_scales() {
        let k = 768;
        let rest_k = scale_layout::rest_k(k);
        let c = sfa_stage_copy(128, 256, 4, rest_k);
        for i in 128..256 {
            for j in 256 / 16..512 / 16 {
                let o = scale_layout::blocked_offset(i, j, rest_k);
                assert!(o >= c.src_offset && o < c.src_offset + c.bytes as usize);
            }
        }
    }

    /// K = 384 (K % 256 != 0): the second stage has 2 valid K=64 slices and copies 1024 bytes,
    /// which ends exactly at the end of the row block.
    #[test]
    fn k_tail_copy_stays_in_row_block() {
        let k = 384;
        let rest_k = scale_layout::rest_k(k);
        assert_eq!(rest_k, 6);
        let c = sfa_stage_copy(128, 256, 2, rest_k);
        assert_eq!(c.bytes, 1024);
        assert_eq!(c.src_offset + c.bytes as usize, scale_layout::blocked_bytes(256, k));
    }
}
