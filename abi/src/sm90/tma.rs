//! The GEMM's tensor maps: each group's token map (its f16 workspace, 128-byte swizzle, the
//! wgmma B operand's layout) and weight map (packed B, 64-byte swizzle), the last tile's token map
//! (boxes of exactly its rows), and where each sits in the tensor-map table.

use super::config::{GemmConfig, BLOCK_N, CHUNK_K, WEIGHT_ROW_BYTES};
use crate::tensor_map::{TensorMapDataType, TensorMapSwizzle, TiledMap, L2_PROMOTION};

/// Index of group `g`'s token map (the f16 workspace) in the tensor-map table.
pub const fn token_map_index(g: u32) -> usize {
    crate::work::first_map_index(g)
}

/// Index of group `g`'s weight map (packed B) in the tensor-map table.
pub const fn weight_map_index(g: u32) -> usize {
    crate::work::second_map_index(g)
}

/// Index of the token map of group `g`'s last tile in a table of `groups` groups' maps: after
/// every group's token and weight maps (the first of them is where group `groups`' token map
/// would be).
pub const fn tail_token_map_index(g: u32, groups: u32) -> usize {
    crate::work::first_map_index(groups) + g as usize
}

/// Tensor maps of a host-sized plan of `groups` groups: a token, a weight and a last-tile token
/// map per group.
pub const fn map_count(groups: u32) -> usize {
    3 * groups as usize
}

/// The token map of a group under variant `cfg`: its `m × k` f16 workspace, one
/// `CHUNK_K × cfg.tile_rows(m)` box per chunk, 128-byte swizzle (the wgmma B operand's layout, see
/// [`WgmmaDesc::k_major_sw128`](super::WgmmaDesc::k_major_sw128)).
pub const fn token_map(cfg: GemmConfig, m: u32, k: u32) -> TiledMap<2> {
    token_map_with_box(m, k, cfg.tile_rows(m))
}

/// The token map of a group's last tile under variant `cfg`: as [`token_map`] with boxes of
/// [`tail_box_rows`] rows.
pub const fn tail_token_map(cfg: GemmConfig, m: u32, k: u32) -> TiledMap<2> {
    token_map_with_box(m, k, tail_box_rows(m, cfg.tile_rows(m)))
}

/// Rows of the box that loads the last tile of a group of `m` tokens in tiles of `block_m` rows:
/// exactly the tile's own rows (8 for an empty group, which has no tiles). The TMA zero-fills a
/// box's rows past the tensor, but those zeros still cross the L2→SM path (measured with ncu on
/// d0, 4 tokens per group: the bytes read are exactly those of 16-row boxes), so a full-height box
/// over a short tile moves up to `block_m − 1` rows of zeros per stage. A box need not fill a
/// 128-byte swizzle atom (8 rows): the TMA swizzles each row by its shared-memory address, and
/// the stage's rows past the box keep older bytes, which reach only columns of C past `m`.
pub const fn tail_box_rows(m: u32, block_m: u32) -> u32 {
    let rows = if m == 0 { 0 } else { m - (m - 1) / block_m * block_m };
    if rows == 0 {
        8
    } else {
        rows
    }
}

/// A token map over `rows × k` f16 with boxes of `block_m` rows (device-sized plans share one map
/// per box height over the whole workspace, see `crate::moe`).
pub const fn token_map_with_box(rows: u32, k: u32, block_m: u32) -> TiledMap<2> {
    TiledMap {
        element: TensorMapDataType::F16,
        dims: [k as u64, rows as u64],
        strides_bytes: [2 * k as u64, 0],
        box_dims: [CHUNK_K, block_m],
        swizzle: TensorMapSwizzle::B128,
        l2_promotion: L2_PROMOTION,
    }
}

/// The weight map of a group: packed B (`n × k/2` bytes), one `WEIGHT_ROW_BYTES × BLOCK_N` box
/// per stage, 64-byte swizzle (undone by [`weight_fragment_offset`](super::weight_fragment_offset)).
pub const fn weight_map(n: u32, k: u32) -> TiledMap<2> {
    weight_map_with_box(n, k, BLOCK_N)
}

/// The weight map of a group under variant `cfg`: boxes of `cfg.block_n` rows.
pub const fn weight_map_for(cfg: GemmConfig, n: u32, k: u32) -> TiledMap<2> {
    weight_map_with_box(n, k, cfg.block_n)
}

/// Packed B (`n × k/2` bytes) in boxes of `WEIGHT_ROW_BYTES × rows`, 64-byte swizzle.
pub const fn weight_map_with_box(n: u32, k: u32, rows: u32) -> TiledMap<2> {
    TiledMap {
        element: TensorMapDataType::U8,
        dims: [k as u64 / 2, n as u64],
        strides_bytes: [k as u64 / 2, 0],
        box_dims: [WEIGHT_ROW_BYTES, rows],
        swizzle: TensorMapSwizzle::B64,
        l2_promotion: L2_PROMOTION,
    }
}

#[cfg(test)]
mod tests {
    use crate::sm90::*;
    use crate::tensor_map::{TensorMapDataType, TensorMapSwizzle, L2_PROMOTION};

    #[test]
    fn maps() {
        assert_eq!((token_map_index(3), weight_map_index(3)), (6, 7));
        let t = token_map(GemmConfig::GENERAL, 96, 512);
        assert_eq!((t.dims, t.strides_bytes, t.box_dims), ([512, 96], [1024, 0], [64, 128]));
        assert_eq!(
            (t.element, t.swizzle, t.l2_promotion),
            (TensorMapDataType::F16, TensorMapSwizzle::B128, L2_PROMOTION)
        );
        let w = weight_map(256, 512);
        assert_eq!((w.dims, w.strides_bytes, w.box_dims), ([256, 256], [256, 0], [64, 128]));
        assert_eq!((w.element, w.swizzle), (TensorMapDataType::U8, TensorMapSwizzle::B64));
        assert_eq!(weight_map_for(GemmConfig::N192, 4096, 256).box_dims, [WEIGHT_ROW_BYTES, 192]);
        assert_eq!(weight_map_for(GemmConfig::GENERAL, 4096, 256), weight_map(4096, 256));
        // Token boxes: a group's tile rows, and the last tile's own rows.
        assert_eq!(token_map(GemmConfig::GENERAL, 5, 256).box_dims, [CHUNK_K, 16]);
        assert_eq!(tail_token_map(GemmConfig::GENERAL, 5, 256).box_dims, [CHUNK_K, 5]);
        assert_eq!(tail_token_map(GemmConfig::GENERAL, 200, 256).box_dims, [CHUNK_K, 72]);
        assert_eq!(token_map(GemmConfig::GENERAL, 200, 256).box_dims, [CHUNK_K, 128]);
    }

    /// The last tile's box covers exactly its rows;
    /// the tail maps sit after all token and weight maps, each index once.
    #[test]
    fn tail_boxes_cover_the_last_tile() {
        for block_m in [16, 128] {
            for m in 1..=600 {
                let rows = m - (m_tiles(m, block_m) - 1) * block_m;
                let b = tail_box_rows(m, block_m);
                assert!(b == rows && b <= block_m, "m {m} block_m {block_m}");
            }
        }
        assert_eq!((tail_box_rows(4, 16), tail_box_rows(16, 16), tail_box_rows(176, 128)), (4, 16, 48));
        assert_eq!((tail_box_rows(128, 128), tail_box_rows(0, 128)), (128, 8));
        let groups = 5;
        let mut seen = [false; map_count(5)];
        for g in 0..groups {
            for i in [token_map_index(g), weight_map_index(g), tail_token_map_index(g, groups)] {
                assert!(i < map_count(groups) && !seen[i], "group {g} index {i}");
                seen[i] = true;
            }
        }
    }
}
