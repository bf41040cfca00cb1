//! The 128x4 blocked ("reordered") layout of NVFP4 block scales, as consumed by tcgen05 block-scaled
//! MMA and cuBLAS, and as accepted by this library on every architecture.
//!
//! A matrix with `rows` rows and `K` values per row has `K/16` e4m3 scales per row. In the blocked
//! layout, rows are padded to a multiple of 128 and scale columns to a multiple of 4; each 128-row x
//! 4-column block is 512 contiguous bytes, and blocks are stored K-block-major within a row block.

/// Rows per scale block.
pub const BLOCK_ROWS: u32 = 128;
/// Scale columns (of 16 values each, so 64 values) per scale block.
pub const BLOCK_COLS: u32 = 4;
/// Bytes per 128x4 scale block.
pub const BLOCK_BYTES: u32 = BLOCK_ROWS * BLOCK_COLS;
/// Values of K covered by one scale.
pub const SCALE_VEC: u32 = 16;

/// Number of 4-column scale blocks along K: `ceil(K/16/4)`.
pub const fn rest_k(k: u32) -> u32 {
    (k / SCALE_VEC).div_ceil(BLOCK_COLS)
}

/// Number of 128-row scale blocks: `ceil(rows/128)`.
pub const fn rest_m(rows: u32) -> u32 {
    rows.div_ceil(BLOCK_ROWS)
}

/// Size in bytes of a blocked scale buffer for `rows x K`, padding included.
pub const fn blocked_bytes(rows: u32, k: u32) -> usize {
    rest_m(rows) as usize * rest_k(k) as usize * BLOCK_BYTES as usize
}

/// Byte offset of the scale of row `i`, scale column `j` (values `16j..16j+16`):
/// `((i/128)*rest_k + j/4)*512 + (i%32)*16 + ((i%128)/32)*4 + j%4`.
pub const fn blocked_offset(i: u32, j: u32, rest_k: u32) -> usize {
    ((i / 128) as usize * rest_k as usize + (j / 4) as usize) * BLOCK_BYTES as usize
        + ((i % 32) * 16 + ((i % 128) / 32) * 4 + j % 4) as usize
}

/// Byte offset of the 4 scales (one aligned 32-bit word) covering values `64c..64c+64` of row `i`.
/// Byte `q` of that word is the scale of values `64c + 16q ..+16`.
pub const fn blocked_word_offset(i: u32, c: u32, rest_k: u32) -> usize {
    blocked_offset(i, 4 * c, rest_k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formula_matches_hand_values() {
        // Row 0, column 0 is the first byte; column 1 the next.
        assert_eq!(blocked_offset(0, 0, 2), 0);
        assert_eq!(blocked_offset(0, 1, 2), 1);
        // Row 1 starts 16 bytes in; row 32 is the second 4-byte column of row 0's 16-byte line.
        assert_eq!(blocked_offset(1, 0, 2), 16);
        assert_eq!(blocked_offset(32, 0, 2), 4);
        assert_eq!(blocked_offset(127, 3, 2), 31 * 16 + 3 * 4 + 3);
        // Column 4 is the next 512-byte block; row 128 the next row block (rest_k blocks later).
        assert_eq!(blocked_offset(0, 4, 2), 512);
        assert_eq!(blocked_offset(128, 0, 2), 1024);
    }

    #[test]
    fn blocked_layout_is_a_bijection_onto_the_padded_buffer() {
        let (rows, k) = (256u32, 512u32);
        let rk = rest_k(k);
        let mut seen = [false; 256 * 32];
        assert_eq!(blocked_bytes(rows, k), seen.len());
        for i in 0..rows {
            for j in 0..k / 16 {
                let o = blocked_offset(i, j, rk);
                assert!(!seen[o], "offset {o} hit twice");
                seen[o] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn word_offset_is_four_aligned() {
        for i in 0..300 {
            for c in 0..5 {
                assert_eq!(blocked_word_offset(i, c, 5) % 4, 0);
            }
        }
    }
}
