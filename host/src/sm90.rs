//! Host side of the sm_90a (Hopper) kernels: work list, token workspace, tensor maps, parameters
//! and launch geometry. The kernels' configuration (`nvfp4_gemm_abi::sm90`) is the one source of
//! the numbers used here.

use crate::driver::launch::LaunchGeometry;
use crate::driver::tensor_map::{Element, Swizzle, TensorMap, TiledMap};
use crate::error::Result;
use crate::problem::{GroupBuffers, Problem};
use nvfp4_gemm_abi::sm90::{self, GemmConfig, GroupParams, Tile};

/// Most token-dequantization CTAs per group (each grid-strides over the group's rows × chunks).
const MAX_DEQUANT_CTAS_PER_GROUP: u32 = 256;

/// Everything about a problem that does not depend on buffer addresses.
#[derive(Debug, Clone)]
pub(crate) struct Sm90Layout {
    pub config: GemmConfig,
    pub tiles: Vec<Tile>,
    /// Byte offset of each group's f16 tokens in the workspace.
    pub workspace_offsets: Vec<u64>,
    pub workspace_bytes: usize,
    /// (first CTA, CTA count) of each group in the dequantization grid.
    pub dequant_ctas: Vec<(u32, u32)>,
    pub dequant_grid: u32,
    pub gemm: LaunchGeometry,
    pub dequant: LaunchGeometry,
}

impl Sm90Layout {
    pub fn new(problem: &Problem, sm_count: u32) -> Sm90Layout {
        let config = GemmConfig::M128;
        let mut tiles = vec![];
        let mut workspace_offsets = vec![];
        let mut dequant_ctas = vec![];
        let (mut ws, mut ctas) = (0u64, 0u32);
        for (g, s) in problem.groups().iter().enumerate() {
            let (m, n, k) = (s.m as u32, s.n as u32, s.k as u32);
            // Weight tiles outermost, token tiles inside: CTAs that run at the same time share
            // weight tiles (L2 hits), and the small token workspace stays in L2 throughout.
            for n_tile in 0..sm90::n_tiles(n) {
                for m_tile in 0..sm90::m_tiles(m, config.block_m) {
                    tiles.push(Tile { group: g as u16, m_tile: m_tile as u16, n_tile: n_tile as u16, reserved: 0 });
                }
            }
            workspace_offsets.push(ws);
            ws += (s.m * s.k * 2) as u64;
            let items = m * (k / 64);
            let c = items.div_ceil(sm90::DEQUANT_THREADS).min(MAX_DEQUANT_CTAS_PER_GROUP);
            dequant_ctas.push((ctas, c));
            ctas += c;
        }
        let grid = (tiles.len() as u32).min(sm_count).max(1);
        Sm90Layout {
            config,
            gemm: LaunchGeometry { grid, block: sm90::THREADS, cluster: 1, smem_bytes: config.dynamic_shared_memory() },
            dequant: LaunchGeometry { grid: ctas.max(1), block: sm90::DEQUANT_THREADS, cluster: 1, smem_bytes: 0 },
            tiles,
            workspace_offsets,
            workspace_bytes: ws.max(16) as usize,
            dequant_ctas,
            dequant_grid: ctas,
        }
    }

    /// Group parameters and tensor maps (`[2g]` tokens, `[2g+1]` weights) for these buffers.
    pub fn encode(
        &self,
        problem: &Problem,
        buffers: &[GroupBuffers],
        workspace: u64,
    ) -> Result<(Vec<GroupParams>, Vec<TensorMap>)> {
        let mut params = Vec::with_capacity(buffers.len());
        let mut maps = Vec::with_capacity(2 * buffers.len());
        for (g, (s, b)) in problem.groups().iter().zip(buffers).enumerate() {
            let ws = workspace + self.workspace_offsets[g];
            params.push(GroupParams {
                m: s.m as u32,
                n: s.n as u32,
                k: s.k as u32,
                alpha: b.alpha,
                a_values: b.a_values.ptr,
                a_scales: b.a_scales.ptr,
                b_scales: b.b_scales.ptr,
                c: b.c.ptr,
                workspace: ws,
                dequant_first_cta: self.dequant_ctas[g].0,
                dequant_ctas: self.dequant_ctas[g].1,
            });
            if s.m == 0 {
                // No tile reads this group's maps.
                maps.push(TensorMap([0; 128]));
                maps.push(TensorMap([0; 128]));
                continue;
            }
            let tokens = TiledMap::<2> {
                element: Element::F16,
                dims: [s.k as u64, s.m as u64],
                strides_bytes: [2 * s.k as u64, 0],
                box_dims: [sm90::CHUNK_K, self.config.block_m],
                swizzle: Swizzle::B128,
            };
            let weights = TiledMap::<2> {
                element: Element::U8,
                dims: [s.k as u64 / 2, s.n as u64],
                strides_bytes: [s.k as u64 / 2, 0],
                box_dims: [sm90::WEIGHT_ROW_BYTES, sm90::BLOCK_N],
                swizzle: Swizzle::B64,
            };
            maps.push(tokens.encode(ws)?);
            maps.push(weights.encode(b.b_values.ptr)?);
        }
        Ok((params, maps))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::problem::{GroupShape, OutputType};

    #[test]
    fn layout_of_a_small_problem() {
        let p = Problem::new(
            vec![GroupShape::new(96, 256, 512), GroupShape::new(0, 128, 256), GroupShape::new(130, 136, 128)],
            OutputType::F16,
        )
        .unwrap();
        let l = Sm90Layout::new(&p, 132);
        // group 0: 2 n-tiles × 1 m-tile; group 1: none; group 2: 2 × 2.
        assert_eq!(l.tiles.len(), 2 + 4);
        assert_eq!(l.tiles[0], Tile { group: 0, m_tile: 0, n_tile: 0, reserved: 0 });
        assert_eq!(l.tiles[1], Tile { group: 0, m_tile: 0, n_tile: 1, reserved: 0 });
        assert_eq!(l.tiles[2], Tile { group: 2, m_tile: 0, n_tile: 0, reserved: 0 });
        assert_eq!(l.tiles[3], Tile { group: 2, m_tile: 1, n_tile: 0, reserved: 0 });
        assert_eq!(l.workspace_offsets, vec![0, 96 * 512 * 2, 96 * 512 * 2]);
        // 96 rows × 8 chunks = 768 items = 3 CTAs; group 1 has none; 130 × 2 = 260 → 2.
        assert_eq!(l.dequant_ctas, vec![(0, 3), (3, 0), (3, 2)]);
        assert_eq!(l.gemm.grid, 6);
        assert_eq!(l.gemm.smem_bytes, GemmConfig::M128.dynamic_shared_memory());
    }
}
