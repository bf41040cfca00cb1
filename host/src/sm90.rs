//! Host side of the sm_90a (Hopper) kernel: work list, tensor maps, parameters and launch
//! geometry. The kernels' configuration (`nvfp4_gemm_abi::sm90`) is the one source of
//! the numbers used here.

use crate::driver::launch::LaunchGeometry;
use crate::driver::tensor_map::{Element, Swizzle, TensorMap, TiledMap};
use crate::error::Result;
use crate::problem::{GroupBuffers, Problem};
use nvfp4_gemm_abi::sm90::{self, GemmConfig, GroupParams, Tile};

/// Everything about a problem that does not depend on buffer addresses.
#[derive(Debug, Clone)]
pub(crate) struct Sm90Layout {
    pub config: GemmConfig,
    pub tiles: Vec<Tile>,
    pub gemm: LaunchGeometry,
}

impl Sm90Layout {
    pub fn new(problem: &Problem, sm_count: u32) -> Sm90Layout {
        let config = GemmConfig::M64;
        let mut tiles = vec![];
        for (g, s) in problem.groups().iter().enumerate() {
            let (m, n) = (s.m as u32, s.n as u32);
            // Weight tiles outermost, token tiles inside: CTAs that run at the same time share
            // weight tiles (L2 hits), and the small token operand stays in L2 throughout.
            for n_tile in 0..sm90::n_tiles(n) {
                for m_tile in 0..sm90::m_tiles(m, config.block_m) {
                    tiles.push(Tile { group: g as u16, m_tile: m_tile as u16, n_tile: n_tile as u16, reserved: 0 });
                }
            }
        }
        let grid = (tiles.len() as u32).min(sm_count).max(1);
        Sm90Layout {
            config,
            gemm: LaunchGeometry {
                grid,
                block: sm90::THREADS,
                cluster: 1,
                smem_bytes: config.dynamic_shared_memory(),
            },
            tiles,
        }
    }

    /// Group parameters and tensor maps (`[2g]` tokens, `[2g+1]` weights) for these buffers.
    pub fn encode(&self, problem: &Problem, buffers: &[GroupBuffers]) -> Result<(Vec<GroupParams>, Vec<TensorMap>)> {
        let mut params = Vec::with_capacity(buffers.len());
        let mut maps = Vec::with_capacity(2 * buffers.len());
        for (s, b) in problem.groups().iter().zip(buffers) {
            params.push(GroupParams {
                m: s.m as u32,
                n: s.n as u32,
                k: s.k as u32,
                alpha: b.alpha,
                a_scales: b.a_scales.ptr,
                b_scales: b.b_scales.ptr,
                c: b.c.ptr,
            });
            if s.m == 0 {
                // No tile reads this group's maps.
                maps.push(TensorMap([0; 128]));
                maps.push(TensorMap([0; 128]));
                continue;
            }
            // Packed FP4 as bytes: a row of K values is K/2 bytes; one box row is a 256-value stage.
            let packed = |rows: usize, box_rows: u32| TiledMap::<2> {
                element: Element::U8,
                dims: [s.k as u64 / 2, rows as u64],
                strides_bytes: [s.k as u64 / 2, 0],
                box_dims: [sm90::BLOCK_K / 2, box_rows],
                swizzle: Swizzle::B128,
            };
            maps.push(packed(s.m, self.config.block_m).encode(b.a_values.ptr)?);
            maps.push(packed(s.n, sm90::BLOCK_N).encode(b.b_values.ptr)?);
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
        // group 0: 2 n-tiles × 2 m-tiles; group 1: none; group 2: 2 × 3.
        assert_eq!(l.tiles.len(), 4 + 6);
        assert_eq!(l.tiles[0], Tile { group: 0, m_tile: 0, n_tile: 0, reserved: 0 });
        assert_eq!(l.tiles[1], Tile { group: 0, m_tile: 1, n_tile: 0, reserved: 0 });
        assert_eq!(l.tiles[4].group, 2);
        assert_eq!(l.gemm.grid, 10);
        assert_eq!(l.gemm.smem_bytes, GemmConfig::M64.dynamic_shared_memory());
    }
}
