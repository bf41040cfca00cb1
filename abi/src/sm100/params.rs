//! What the sm_100a GEMM kernel and its host launcher exchange, and the few layout details the
//! kernel adds on top of [`KernelConfig`].
//!
//! **Parameters.** Each kernel takes one [`KernelParams`] by value. It points at three tables the
//! host writes to device memory before the launch:
//! - `GroupParams[group_count]`: per group, the shape, alpha, scale and output pointers, and the
//!   rank of its tensor maps;
//! - the tensor-map table (128-byte `CUtensorMap`s, 128-byte aligned): A of group `g` at
//!   [`a_map_index`]`(g)`, B at [`b_map_index`]`(g)`, B's box `BLOCK_N` rows for the variant the
//!   group runs in;
//! - the work list of this variant ([`super::schedule::WorkItem`]s, built by
//!   [`super::schedule::build_work_list`], or on the device by `sm100_schedule` in the same order
//!   for device-resident group sizes, which then also writes the length `work_len_device` points
//!   at).
//!
//! **Layout additions.** The kernel departs from the seed in two places that need room the seed's
//! layout does not reserve. This module adds them to [`KernelConfig`] (the `impl` block below), so
//! that each variant's shared memory and TMEM totals have one answer; [`KernelLayout`] only pairs
//! a configuration with the name of its compiled kernel and builds its launch:
//! - two more mbarriers hand the single TMEM accumulator between the MMA warp and the epilogue
//!   warps (the seed serializes a tile's main loop and epilogue with `__syncthreads()` instead);
//!   they sit right after the TMEM slot. This costs no memory in the 221312-byte variants (the
//!   seed's rounding slack holds them) and 64 bytes in the 3-stage one;
//! - each pipeline stage gets its own TMEM columns for block scales. The seed (and CUTLASS) copy
//!   the next stage's scales with `tcgen05.cp` into the columns the previous stage's MMAs read,
//!   relying on an MMA → cp ordering that PTX ISA §9.7.16.6.2 does not list among its pipelined
//!   pairs (docs/sm100.md §1 ⚠). With one column set per stage, the copy into stage `s` is ordered
//!   after the MMAs that last read it through the stage's empty → full barrier chain instead.
//!   The accumulator and each stage's scale columns keep the seed's [`super::tmem::TmemPlan`] layout.
//!
//! These are departures D2 and D1 of docs/provenance.md §3, which also says where every other
//! value of this module comes from.

use super::config::{
    KernelConfig, EPILOGUE_WARPS, MAX_DYNAMIC_SMEM, MBARRIER_BYTES, N128_DEEP, N128_SHALLOW, N256_CLUSTER4,
    SMEM_PER_SM, SMEM_RESERVED_PER_BLOCK, THREADS, TMEM_SLOT_BYTES,
};
use super::tma::{TmaCoords, BOX_K_VALUES};
use super::tmem::{allocation_columns, ScaleCopy, TMEM_COLUMNS};
use crate::launch::LaunchGeometry;

/// One group as the kernel reads it from global memory.
#[derive(Clone, Copy, Debug, Default, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct GroupParams {
    /// Rows of A and C.
    pub m: u32,
    /// Rows of B, columns of C.
    pub n: u32,
    /// Shared dimension in FP4 values: a multiple of 64 (0 makes the kernel store zeros).
    pub k: u32,
    /// Factor applied to the fp32 accumulator before rounding (NVFP4's global scale; 1.0 if none).
    pub alpha: f32,
    /// Device address of A's block scales (128x4 blocked layout), 16-byte aligned.
    pub a_scales: u64,
    /// Device address of B's block scales (128x4 blocked layout), 16-byte aligned.
    pub b_scales: u64,
    /// Device address of C (`m` rows of `ldc` fp16/bf16 elements), 16-byte aligned.
    pub c: u64,
    /// Elements between consecutive rows of C: at least `n`, a multiple of 8.
    pub ldc: u32,
    /// Rank of both operand maps of the group: 3 for the seed's chunked map (`K % 256 == 0`),
    /// 2 for the flat map (the K tail); the `rank` field of [`super::tma::Fp4TensorMap`].
    pub map_rank: u32,
    /// Row of the group's first token in its A map: 0 when each group has its own A map; in
    /// device-sized plans (`crate::moe`) every group's A map is the whole token tensor and this
    /// is the group's first row, written by `sm100_schedule`.
    pub token_row: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<GroupParams>() == 56);
const _: () = assert!(core::mem::align_of::<GroupParams>() == 8);

/// Byte offset of [`GroupParams::alpha`] in an entry: where the host copies device-resident
/// alphas into the group table (one `f32` per `size_of::<GroupParams>()` bytes).
pub const GROUP_ALPHA_OFFSET: usize = core::mem::offset_of!(GroupParams, alpha);

impl GroupParams {
    /// Coordinates of the TMA box whose first row is `row0` (of the map: tile rows are offset by
    /// [`Self::token_row`] for A) and first value is `k0` (a multiple of 256), for a map of this
    /// group's rank. Equal to [`super::tma::Fp4TensorMap::coords`] of the
    /// map the host encoded (checked by this module's tests), so the kernel needs only the rank.
    pub const fn box_coords(&self, row0: u32, k0: u32) -> TmaCoords {
        if self.map_rank == 3 {
            TmaCoords { rank: 3, coords: [0, row0 as i32, (k0 / BOX_K_VALUES) as i32] }
        } else {
            TmaCoords { rank: 2, coords: [k0 as i32, row0 as i32, 0] }
        }
    }
}

pub use crate::work::KernelParams;

/// Index of group `g`'s A map in the tensor-map table.
pub const fn a_map_index(g: u32) -> usize {
    crate::work::first_map_index(g)
}

/// Index of group `g`'s B map in the tensor-map table.
pub const fn b_map_index(g: u32) -> usize {
    crate::work::second_map_index(g)
}

pub use crate::tensor_map::TENSOR_MAP_BYTES;

/// The `ctaMask` that names cluster rank 0, where the cluster-wide empty barriers live.
pub const CLUSTER_LEADER_MASK: u16 = 1;

/// A [`KernelConfig`] (which, with this module's additions, holds the whole shared-memory and TMEM
/// layout) and the exported name of the kernel compiled for it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelLayout {
    cfg: KernelConfig,
    name: &'static str,
}

impl KernelLayout {
    /// The layout of `cfg`'s kernel, exported as `name`.
    pub const fn new(cfg: KernelConfig, name: &'static str) -> Self {
        Self { cfg, name }
    }

    /// The configuration: tiles, stages, cluster, and the whole shared-memory and TMEM layout.
    pub const fn config(self) -> KernelConfig {
        self.cfg
    }

    /// The `#[no_mangle]` name of the kernel entry point.
    pub const fn kernel_name(self) -> &'static str {
        self.name
    }

    /// The launch over `work_len` items when `resident` CTAs of this kernel fit on the device
    /// ([`KernelConfig::resident_ctas`]): [`KernelConfig::launch_grid`] CTAs of
    /// [`super::config::THREADS`], clusters of the configuration's size, its shared memory.
    pub const fn launch(self, work_len: u32, resident: u32) -> LaunchGeometry {
        LaunchGeometry {
            grid: self.cfg.launch_grid(work_len, resident),
            block: THREADS,
            cluster: self.cfg.cluster_size(),
            smem_bytes: self.cfg.dynamic_shared_memory(),
        }
    }
}

/// The kernel's additions to the seed's layout (module docs), and the totals that follow from
/// them: the one answer for each variant's shared memory and TMEM allocation.
impl KernelConfig {
    /// The accumulator-full barrier (MMA `tcgen05.commit` → epilogue; 1 arrival), right after
    /// the TMEM slot.
    pub const fn accumulator_full_barrier_offset(self) -> u32 {
        self.tmem_slot_offset() + TMEM_SLOT_BYTES
    }

    /// The accumulator-empty barrier (epilogue threads → MMA warp; one arrival per epilogue
    /// thread).
    pub const fn accumulator_empty_barrier_offset(self) -> u32 {
        self.accumulator_full_barrier_offset() + MBARRIER_BYTES
    }

    /// Arrivals that complete the accumulator-full barrier: the MMA thread's commit.
    pub const fn accumulator_full_arrivals(self) -> u32 {
        1
    }

    /// Arrivals that complete the accumulator-empty barrier: every epilogue thread, each after
    /// its own `tcgen05.wait::ld` and `tcgen05.fence::before_thread_sync`.
    pub const fn accumulator_empty_arrivals(self) -> u32 {
        EPILOGUE_WARPS * 32
    }

    /// Bytes after the stages: the seed's barriers, the TMEM slot and the accumulator barriers,
    /// rounded up to 64. For the two 221312-byte variants this equals the seed's
    /// `MBAR_BYTES = ((barriers * NS * 8 + 63) & ~63)` (its rounding slack holds our additions);
    /// the 3-stage variant needs 64 bytes more than the seed's 110656.
    pub const fn barrier_region_bytes(self) -> u32 {
        (self.accumulator_empty_barrier_offset() + MBARRIER_BYTES - self.barrier_base()).next_multiple_of(64)
    }

    /// Dynamic shared memory to request at launch (and as
    /// `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`): the stages, then
    /// [`Self::barrier_region_bytes`].
    pub const fn dynamic_shared_memory(self) -> u32 {
        self.barrier_base() + self.barrier_region_bytes()
    }

    /// TMEM columns of one stage's scales (SFA then SFB, as [`super::tmem::TmemPlan`] lays them out).
    pub const fn scale_columns_per_stage(self) -> u32 {
        self.tmem_plan().sfb().end() - self.tmem_plan().sfa().start
    }

    /// Columns stage `stage`'s scale set is shifted by relative to the seed plan's.
    const fn stage_shift(self, stage: u32) -> u32 {
        stage * self.scale_columns_per_stage()
    }

    /// The `scale-A-tmem` column of MMA step `k` of stage `stage`.
    pub const fn sfa_column(self, stage: u32, k: u32) -> u32 {
        self.tmem_plan().sfa_column(k) + self.stage_shift(stage)
    }

    /// The `scale-B-tmem` column of MMA step `k` of stage `stage`.
    pub const fn sfb_column(self, stage: u32, k: u32) -> u32 {
        self.tmem_plan().sfb_column(k) + self.stage_shift(stage)
    }

    /// The `tcgen05.cp` of step `k`'s SFA block in stage `stage`: the seed plan's copy, moved to
    /// the stage's columns (the shared-memory offset is inside the stage's SFA region).
    pub const fn sfa_copy(self, stage: u32, k: u32) -> ScaleCopy {
        let c = self.tmem_plan().sfa_copy(k);
        ScaleCopy { smem_offset: c.smem_offset, tmem_column: c.tmem_column + self.stage_shift(stage) }
    }

    /// The `tcgen05.cp` of step `k`'s SFB block for B rows `128*half ..` in stage `stage`.
    pub const fn sfb_copy(self, stage: u32, k: u32, half: u32) -> ScaleCopy {
        let c = self.tmem_plan().sfb_copy(k, half);
        ScaleCopy { smem_offset: c.smem_offset, tmem_column: c.tmem_column + self.stage_shift(stage) }
    }

    /// Columns in use: the accumulator and one scale set per stage.
    pub const fn tmem_used_columns(self) -> u32 {
        self.tmem_plan().sfa().start + self.stages() * self.scale_columns_per_stage()
    }

    /// Columns `tcgen05.alloc` requests: the next power of two of [`Self::tmem_used_columns`].
    pub const fn tmem_allocated_columns(self) -> u32 {
        match allocation_columns(self.tmem_used_columns()) {
            Some(c) => c,
            None => panic!("scale columns of every stage exceed TMEM"),
        }
    }

    /// Resident CTAs per SM that shared memory and TMEM allow: `floor(228 KiB / (smem + 1 KiB))`,
    /// capped by `512 / allocated TMEM columns`. An upper bound (registers may lower it): the
    /// host asks the driver and never plans beyond this, because the driver does not know the
    /// TMEM use. 1 for the 221312-byte variants, 2 for [`N128_SHALLOW`].
    pub const fn max_ctas_per_sm(self) -> u32 {
        let by_smem = SMEM_PER_SM / (self.dynamic_shared_memory() + SMEM_RESERVED_PER_BLOCK);
        let by_tmem = TMEM_COLUMNS / self.tmem_allocated_columns();
        if by_smem < by_tmem {
            by_smem
        } else {
            by_tmem
        }
    }
}

/// [`N128_DEEP`]'s kernel.
pub const N128_DEEP_KERNEL: KernelLayout = KernelLayout::new(N128_DEEP, "sm100_gemm_n128_deep");
/// [`N128_SHALLOW`]'s kernel.
pub const N128_SHALLOW_KERNEL: KernelLayout = KernelLayout::new(N128_SHALLOW, "sm100_gemm_n128_shallow");
/// [`N256_CLUSTER4`]'s kernel.
pub const N256_CLUSTER4_KERNEL: KernelLayout = KernelLayout::new(N256_CLUSTER4, "sm100_gemm_n256_cluster4");

/// Every sm_100a GEMM kernel.
pub const KERNELS: [KernelLayout; 3] = [N128_DEEP_KERNEL, N128_SHALLOW_KERNEL, N256_CLUSTER4_KERNEL];

/// The kernel for a configuration; `None` for a configuration no kernel is compiled for.
pub const fn kernel_for(cfg: KernelConfig) -> Option<KernelLayout> {
    let mut i = 0;
    while i < KERNELS.len() {
        let k = KERNELS[i];
        if k.cfg.block_n() == cfg.block_n()
            && k.cfg.stages() == cfg.stages()
            && k.cfg.cluster_size() == cfg.cluster_size()
        {
            return Some(k);
        }
        i += 1;
    }
    None
}

const fn layout_fits(k: KernelLayout) -> bool {
    let cfg = k.cfg;
    cfg.dynamic_shared_memory() <= MAX_DYNAMIC_SMEM
        && cfg.accumulator_empty_barrier_offset() + MBARRIER_BYTES <= cfg.dynamic_shared_memory()
        && cfg.accumulator_full_barrier_offset() % MBARRIER_BYTES == 0
        && cfg.tmem_slot_offset() + TMEM_SLOT_BYTES <= cfg.accumulator_full_barrier_offset()
        && cfg.tmem_used_columns() <= cfg.tmem_allocated_columns()
}

const _: () = assert!(layout_fits(N128_DEEP_KERNEL));
const _: () = assert!(layout_fits(N128_SHALLOW_KERNEL));
const _: () = assert!(layout_fits(N256_CLUSTER4_KERNEL));

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sm100::config::{select_n128, BlockN, MMA_STEPS_PER_STAGE, N128_DEEP, N128_SHALLOW, N256_CLUSTER4};
    use crate::sm100::tma::Fp4TensorMap;

    #[test]
    fn alpha_offset_is_the_alpha_field() {
        let p = GroupParams { alpha: -1.5, ..GroupParams::default() };
        let at = &bytemuck::bytes_of(&p)[GROUP_ALPHA_OFFSET..][..4];
        assert_eq!(f32::from_ne_bytes(at.try_into().unwrap()), -1.5);
    }

    #[test]
    fn shared_memory_per_variant() {
        // The seed's totals where the slack holds the two accumulator barriers.
        assert_eq!(N128_DEEP.dynamic_shared_memory(), 221_312);
        assert_eq!(N256_CLUSTER4.dynamic_shared_memory(), 221_312);
        // 3 x 36864 + (6 barriers + slot + 2 barriers = 72 → 128); the seed's was 110656.
        assert_eq!(N128_SHALLOW.dynamic_shared_memory(), 110_720);
        for k in KERNELS {
            let cfg = k.config();
            assert!(cfg.dynamic_shared_memory() <= MAX_DYNAMIC_SMEM);
            // The launch asks for exactly what the kernel's layout uses.
            assert_eq!(k.launch(1, 148).smem_bytes, cfg.dynamic_shared_memory());
            assert!(cfg.accumulator_empty_barrier_offset() + MBARRIER_BYTES <= cfg.dynamic_shared_memory());
        }
    }

    #[test]
    fn barriers_do_not_overlap() {
        for k in KERNELS {
            let cfg = k.config();
            let k = cfg;
            let mut offsets = [0u32; 32];
            let mut n = 0;
            for s in 0..cfg.stages() {
                offsets[n] = cfg.full_barrier_offset(s);
                offsets[n + 1] = cfg.empty_barrier_offset(s);
                n += 2;
                if let Some(o) = cfg.cluster_empty_barrier_offset(s) {
                    offsets[n] = o;
                    n += 1;
                }
            }
            offsets[n] = k.accumulator_full_barrier_offset();
            offsets[n + 1] = k.accumulator_empty_barrier_offset();
            n += 2;
            let used = &mut offsets[..n];
            used.sort();
            for w in used.windows(2) {
                assert!(w[1] >= w[0] + MBARRIER_BYTES, "{k:?}: {w:?}");
            }
            // The TMEM slot (8 bytes) lies between the seed barriers and ours.
            let slot = cfg.tmem_slot_offset();
            assert!(used.iter().all(|&o| o + MBARRIER_BYTES <= slot || o >= slot + TMEM_SLOT_BYTES));
            assert!(used.iter().all(|&o| o % 8 == 0 && o >= cfg.barrier_base()));
            assert!(*used.last().unwrap() + MBARRIER_BYTES <= k.dynamic_shared_memory());
        }
    }

    #[test]
    fn tmem_columns_per_variant() {
        // 128 + 6 x 32 = 320 → 512; 128 + 3 x 32 = 224 → 256; 256 + 4 x 48 = 448 → 512.
        assert_eq!(N128_DEEP.tmem_used_columns(), 320);
        assert_eq!(N128_DEEP.tmem_allocated_columns(), 512);
        assert_eq!(N128_SHALLOW.tmem_used_columns(), 224);
        assert_eq!(N128_SHALLOW.tmem_allocated_columns(), 256);
        assert_eq!(N256_CLUSTER4.tmem_used_columns(), 448);
        assert_eq!(N256_CLUSTER4.tmem_allocated_columns(), 512);
        // Occupancy stays the seed's: 1, 2, 1.
        assert_eq!(N128_DEEP.max_ctas_per_sm(), 1);
        assert_eq!(N128_SHALLOW.max_ctas_per_sm(), 2);
        assert_eq!(N256_CLUSTER4.max_ctas_per_sm(), 1);
    }

    /// Stage 0 is the seed's plan; every (stage, step, half) copy hits 4 distinct columns that no
    /// other copy and not the accumulator use, and the MMA operands name the copied columns.
    #[test]
    fn stage_scale_columns_are_disjoint_and_match_copies() {
        for k in KERNELS {
            let k = k.config();
            let plan = k.tmem_plan();
            let mut owner = [None::<(u32, u32, u32)>; 512];
            for c in 0..plan.accumulator().len {
                owner[c as usize] = Some((u32::MAX, 0, 0));
            }
            for stage in 0..k.stages() {
                for step in 0..MMA_STEPS_PER_STAGE {
                    if stage == 0 {
                        assert_eq!(k.sfa_copy(0, step), plan.sfa_copy(step));
                        assert_eq!(k.sfb_column(0, step), plan.sfb_column(step));
                    }
                    assert_eq!(k.sfa_copy(stage, step).tmem_column, k.sfa_column(stage, step));
                    assert_eq!(k.sfb_copy(stage, step, 0).tmem_column, k.sfb_column(stage, step));
                    let mut copies = [(k.sfa_copy(stage, step), 0u32); 3];
                    let mut n = 1;
                    for half in 0..plan.sfb_blocks() {
                        copies[n] = (k.sfb_copy(stage, step, half), 1 + half);
                        n += 1;
                    }
                    for (copy, which) in &copies[..n] {
                        assert_eq!(copy.smem_offset % 512, 0);
                        for col in copy.tmem_column..copy.tmem_column + 4 {
                            assert!(col < k.tmem_used_columns());
                            let slot = &mut owner[col as usize];
                            assert_eq!(*slot, None, "{k:?} column {col}");
                            *slot = Some((stage, step, *which));
                        }
                    }
                }
            }
            // Every used column is owned: the plan is dense.
            assert!(owner[..k.tmem_used_columns() as usize].iter().all(Option::is_some));
        }
    }

    /// The kernel's box coordinates equal the host map's, for both map shapes.
    #[test]
    fn box_coords_match_tensor_map_coords() {
        for k in [64u32, 128, 256, 384, 512, 768, 2048, 2112, 7168] {
            for (rows, box_rows) in [(72u32, 128u32), (4096, 256), (1, 128)] {
                let map = Fp4TensorMap::for_operand(rows, k, box_rows).unwrap();
                let g = GroupParams { k, map_rank: map.rank, ..GroupParams::default() };
                for row0 in [0u32, 128, 256, 3840] {
                    for k0 in (0..k).step_by(256) {
                        assert_eq!(g.box_coords(row0, k0), map.coords(row0, k0), "k {k} row0 {row0} k0 {k0}");
                    }
                }
            }
        }
    }

    #[test]
    fn kernels_by_config() {
        assert_eq!(kernel_for(N128_DEEP), Some(N128_DEEP_KERNEL));
        assert_eq!(kernel_for(N128_SHALLOW), Some(N128_SHALLOW_KERNEL));
        assert_eq!(kernel_for(N256_CLUSTER4), Some(N256_CLUSTER4_KERNEL));
        assert_eq!(kernel_for(select_n128(1000, 148, 296)), Some(N128_SHALLOW_KERNEL));
        assert_eq!(kernel_for(KernelConfig::new(BlockN::N256, 4, 1).unwrap()), None);
        assert_eq!(N256_CLUSTER4_KERNEL.kernel_name(), "sm100_gemm_n256_cluster4");
    }

    #[test]
    fn map_indices_and_sizes() {
        assert_eq!((a_map_index(0), b_map_index(0)), (0, 1));
        assert_eq!((a_map_index(7), b_map_index(7)), (14, 15));
        assert_eq!(core::mem::size_of::<GroupParams>() % 8, 0);
        assert_eq!(CLUSTER_LEADER_MASK, 1 << 0);
    }
}
