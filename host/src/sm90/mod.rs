//! Host side of the sm_90a (Hopper) kernels: work list, token workspace, tensor maps, parameters
//! and launch geometry ([`Sm90Layout`], no driver calls), and the device half ([`Sm90Plan`]).
//! The kernels' configuration (`nvfp4_gemm_abi::sm90`) is the one source of the numbers used here.
//!
//! A problem becomes two launches over one group table and one tensor-map table (`[2g]` the
//! group's f16 token workspace, `[2g+1]` its packed weights): `sm90_dequant_tokens` (A → f16
//! workspace), then `sm90_grouped_gemm` over the work list.
//!
//! [`Sm90Layout`] is public (through [`crate::layout`]) so that the CPU model of the device runs
//! the kernels on exactly these tables.

mod device_sizes;
mod plan;

pub(crate) use device_sizes::Sm90DevicePlan;
pub use device_sizes::{Sm90DeviceLayout, Sm90DeviceTables};
pub(crate) use plan::Sm90Plan;

use crate::driver::tensor_map::{DriverEncoder, TiledMapEncoder};
use crate::error::Result;
use crate::problem::{GroupBuffers, OutputType, Problem};
use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::sm90::{self, GemmConfig, GroupParams, KernelParams, WorkItem};
use nvfp4_gemm_abi::tensor_map::TensorMap;

/// Everything about a problem that does not depend on buffer addresses.
#[derive(Debug, Clone)]
pub struct Sm90Layout {
    /// The GEMM's configuration (tile, stages, shared memory).
    pub config: GemmConfig,
    /// The GEMM's work list: group, then weight tile, then token tile.
    pub work: Vec<WorkItem>,
    /// Byte offset of each group's f16 tokens in the workspace.
    pub workspace_offsets: Vec<u64>,
    /// Bytes of the token workspace (at least 16).
    pub workspace_bytes: usize,
    /// (first CTA, CTA count) of each group in the dequantization grid.
    pub dequant_ctas: Vec<(u32, u32)>,
    /// CTAs of the dequantization grid (0: no group has tokens).
    pub dequant_grid: u32,
    /// Geometry of `sm90_grouped_gemm`.
    pub gemm: LaunchGeometry,
    /// Geometry of `sm90_dequant_tokens`.
    pub dequant: LaunchGeometry,
}

impl Sm90Layout {
    /// Plans `problem` for a device with `sm_count` SMs (the persistent GEMM grid).
    pub fn new(problem: &Problem, sm_count: u32) -> Sm90Layout {
        let config = sm90::config_for(problem.groups().iter().map(|s| s.m as u32));
        let mut work = vec![];
        let mut workspace_offsets = vec![];
        let mut dequant_ctas = vec![];
        let (mut ws, mut ctas) = (0u64, 0u32);
        for (g, s) in problem.groups().iter().enumerate() {
            let (m, n, k) = (s.m as u32, s.n as u32, s.k as u32);
            // Weight tiles outermost, token tiles inside: CTAs that run at the same time share
            // weight tiles (L2 hits), and the small token workspace stays in L2 throughout.
            for tile_n in 0..sm90::n_tiles(n) {
                for tile_m in 0..sm90::m_tiles(m, sm90::token_tile_rows(m)) {
                    work.push(WorkItem { group: g as u32, tile_m, tile_n });
                }
            }
            workspace_offsets.push(ws);
            ws += (s.m * s.k * 2) as u64;
            let c = sm90::dequant_ctas(m, k);
            dequant_ctas.push((ctas, c));
            ctas += c;
        }
        Sm90Layout {
            config,
            gemm: sm90::gemm_launch(config, work.len() as u32, sm_count),
            dequant: sm90::dequant_launch(ctas),
            work,
            workspace_offsets,
            workspace_bytes: ws.max(16) as usize,
            dequant_ctas,
            dequant_grid: ctas,
        }
    }

    /// Group parameters for these buffers, with the workspace at device address `workspace`.
    pub fn group_params(&self, problem: &Problem, buffers: &[GroupBuffers], workspace: u64) -> Vec<GroupParams> {
        problem
            .groups()
            .iter()
            .zip(buffers)
            .enumerate()
            .map(|(g, (s, b))| GroupParams {
                m: s.m as u32,
                n: s.n as u32,
                k: s.k as u32,
                alpha: b.alpha,
                a_values: b.a_values.ptr,
                a_scales: b.a_scales.ptr,
                b_scales: b.b_scales.ptr,
                c: b.c.ptr,
                workspace: workspace + self.workspace_offsets[g],
                dequant_first_cta: self.dequant_ctas[g].0,
                dequant_ctas: self.dequant_ctas[g].1,
                block_m: sm90::token_tile_rows(s.m as u32),
                reserved: 0,
                token_row: 0,
                token_map: sm90::token_map_index(g as u32) as u32,
            })
            .collect()
    }

    /// Group parameters and tensor maps ([`sm90::token_map_index`], [`sm90::weight_map_index`])
    /// for these buffers. Encoding the maps calls the driver (`cuTensorMapEncodeTiled`).
    pub fn encode(
        &self,
        problem: &Problem,
        buffers: &[GroupBuffers],
        workspace: u64,
    ) -> Result<(Vec<GroupParams>, Vec<TensorMap>)> {
        self.encode_with(&DriverEncoder, problem, buffers, workspace)
    }

    /// [`Self::encode`] with the maps encoded by `encoder`.
    pub fn encode_with(
        &self,
        encoder: &impl TiledMapEncoder,
        problem: &Problem,
        buffers: &[GroupBuffers],
        workspace: u64,
    ) -> Result<(Vec<GroupParams>, Vec<TensorMap>)> {
        let params = self.group_params(problem, buffers, workspace);
        let mut maps = vec![TensorMap::ZERO; 2 * buffers.len()];
        for (g, (s, p)) in problem.groups().iter().zip(&params).enumerate() {
            if s.m == 0 {
                // No tile reads this group's maps.
                continue;
            }
            let (m, n, k) = (s.m as u32, s.n as u32, s.k as u32);
            maps[sm90::token_map_index(g as u32)] = encoder.encode(&sm90::token_map(m, k), p.workspace)?;
            maps[sm90::weight_map_index(g as u32)] =
                encoder.encode(&sm90::weight_map(n, k), buffers[g].b_values.ptr)?;
        }
        Ok((params, maps))
    }

    /// The parameters of both kernels, given the device addresses of the tables.
    pub fn kernel_params(&self, groups: u64, tensor_maps: u64, work: u64, problem: &Problem) -> KernelParams {
        KernelParams {
            groups,
            tensor_maps,
            work,
            work_len: self.work.len() as u32,
            group_count: problem.groups().len() as u32,
            out_bf16: (problem.output() == OutputType::Bf16) as u32,
            reserved: 0,
            work_len_device: 0,
        }
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
        assert_eq!(l.work.len(), 2 + 4);
        assert_eq!(l.work[0], WorkItem { group: 0, tile_m: 0, tile_n: 0 });
        assert_eq!(l.work[1], WorkItem { group: 0, tile_m: 0, tile_n: 1 });
        assert_eq!(l.work[2], WorkItem { group: 2, tile_m: 0, tile_n: 0 });
        assert_eq!(l.work[3], WorkItem { group: 2, tile_m: 1, tile_n: 0 });
        assert_eq!(l.workspace_offsets, vec![0, 96 * 512 * 2, 96 * 512 * 2]);
        // 96 rows × 8 chunks = 768 items = 3 CTAs; group 1 has none; 130 × 2 = 260 → 2.
        assert_eq!(l.dequant_ctas, vec![(0, 3), (3, 0), (3, 2)]);
        assert_eq!(l.gemm, LaunchGeometry { grid: 6, block: 384, cluster: 1, smem_bytes: 210_000 });
        assert_eq!(l.dequant, LaunchGeometry { grid: 5, block: 256, cluster: 1, smem_bytes: 0 });
    }

    #[test]
    fn group_and_kernel_params() {
        let p =
            Problem::new(vec![GroupShape::new(96, 256, 512), GroupShape::new(0, 128, 256)], OutputType::Bf16).unwrap();
        let l = Sm90Layout::new(&p, 132);
        let buffers: Vec<GroupBuffers> = p
            .groups()
            .iter()
            .enumerate()
            .map(|(g, s)| crate::problem::fake_buffers(s, 0x1000_0000 * g as u64, 0.5))
            .collect();
        let params = l.group_params(&p, &buffers, 0x9000_0000);
        assert_eq!(params[0].workspace, 0x9000_0000);
        assert_eq!(params[1].workspace, 0x9000_0000 + 96 * 512 * 2);
        assert_eq!((params[0].dequant_first_cta, params[0].dequant_ctas), (0, 3));
        assert_eq!((params[0].alpha, params[0].b_scales), (0.5, buffers[0].b_scales.ptr));
        assert_eq!(
            l.kernel_params(0x1000, 0x2000, 0x3000, &p),
            KernelParams {
                groups: 0x1000,
                tensor_maps: 0x2000,
                work: 0x3000,
                work_len: 2,
                group_count: 2,
                out_bf16: 1,
                reserved: 0,
                work_len_device: 0
            }
        );
    }
}
