//! The consumers' epilogue buffer: each warpgroup's tile of C, turned into C's orientation by
//! `stmatrix .trans`, then copied to C in 16-byte chunks of whole token rows. Its size and place
//! are the configuration's ([`GemmConfig::epilogue_offset`](super::GemmConfig::epilogue_offset));
//! here is where each 16 bytes of it lie.

use super::config::EPILOGUE_ROW_BYTES;

/// Offset in an epilogue buffer of the 16 bytes holding weights `8 chunk .. 8 chunk + 8` of token
/// row `row` (0..[`EPILOGUE_ROWS`](super::EPILOGUE_ROWS)): chunk `chunk ^ (row % 8)` of the row.
/// The XOR puts the 8 rows one `stmatrix` matrix writes (rows `8i..8i+8`, one chunk) on 8
/// different bank quads, and a quarter warp reading one row's 8 chunks back reads 32 banks.
/// (ncu's bank-conflict counter on the H200 still shows 18% extra store wavefronts on b1; an XOR
/// with the quad parity as well, against another grouping of an `.x4`'s rows, does not lower it.)
pub const fn epilogue_slot(row: u32, chunk: u32) -> u32 {
    row * EPILOGUE_ROW_BYTES + ((chunk ^ (row % 8)) * 16)
}

#[cfg(test)]
mod tests {
    use crate::sm90::*;

    /// The epilogue buffer: every (row, chunk) has its own 16 bytes inside the buffer; the 8 rows
    /// of one `stmatrix` matrix (rows `8i..8i+8`, one chunk) and the 8 chunks of one row (a
    /// quarter warp's 16-byte loads) each cover the 32 banks once; the buffers fit the variants'
    /// shared memory after the barriers.
    #[test]
    fn epilogue_buffer_slots_are_distinct_and_conflict_free() {
        const BYTES: u32 = EPILOGUE_ROWS * EPILOGUE_ROW_BYTES;
        let mut seen = [false; (BYTES / 16) as usize];
        for row in 0..EPILOGUE_ROWS {
            for chunk in 0..8 {
                let o = epilogue_slot(row, chunk);
                assert!(o % 16 == 0 && o + 16 <= BYTES);
                // Rows below r stay below r · 128 bytes: a buffer of fewer rows holds its own.
                assert!(o / EPILOGUE_ROW_BYTES == row);
                assert!(!core::mem::replace(&mut seen[(o / 16) as usize], true), "row {row} chunk {chunk}");
            }
        }
        let quads = |slots: &mut dyn Iterator<Item = u32>| slots.fold(0u32, |m, o| m | 1 << (o / 16 % 8));
        for i in 0..EPILOGUE_ROWS / 8 {
            for chunk in 0..8 {
                let rows = &mut (8 * i..8 * i + 8).map(|r| epilogue_slot(r, chunk));
                assert_eq!(quads(rows), 0xFF, "rows {i}, chunk {chunk}");
            }
        }
        for row in 0..EPILOGUE_ROWS {
            assert_eq!(quads(&mut (0..8).map(|c| epilogue_slot(row, c))), 0xFF, "row {row}");
        }
        for c in GemmConfig::ALL {
            assert_eq!(c.epilogue_rows(), c.block_m.min(EPILOGUE_ROWS));
            assert!(c.epilogue_offset() >= c.empty_barrier_offset(c.stages) && c.epilogue_offset() % 128 == 0);
            assert_eq!(
                c.dynamic_shared_memory(),
                c.epilogue_offset() + c.consumer_warpgroups() * c.epilogue_buffer_bytes()
            );
            assert!(c.is_valid(), "{c:?}: {} bytes", c.dynamic_shared_memory());
        }
        assert_eq!(GemmConfig::N192.dynamic_shared_memory(), 4 * 46 * 1024 + 128 + 3 * 8192);
        assert_eq!(GemmConfig::DECODE.epilogue_buffer_bytes(), 16 * 128);
    }
}
