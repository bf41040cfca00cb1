//! The sm_100a kernel configurations: tile shape, pipeline depth, cluster, warp roles, shared
//! memory map and launch geometry. One value per variant, the single source of truth that both
//! the kernel (as `const` items) and the host (for launch) read.
//!
//! The seed compiles three variants (docs/sm100.md §8; where each value comes from, and which
//! are hardware-proven: docs/provenance.md §2):
//!
//! | Variant            | BLOCK_N | stages | cluster | stage bytes | dynamic smem |
//! |--------------------|---------|--------|---------|-------------|--------------|
//! | [`N128_DEEP`]      | 128     | 6      | 1       | 36864       | 221312       |
//! | [`N128_SHALLOW`]   | 128     | 3      | 1       | 36864       | 110656       |
//! | [`N256_CLUSTER4`]  | 256     | 4      | 4       | 55296       | 221312       |
//!
//! The 221312 B that docs/sm100.md §7 quotes is both `36864*6 + 128` (N128, 2 barriers per stage:
//! 96 B rounded to 128) and `55296*4 + 128` (N256, 3 barriers per stage: 96 B rounded to 128).
//! The kernel's additions ([`super::params`]) fit in that rounding slack; only the 3-stage
//! variant grows, to 110720 B (docs/provenance.md §3, D2).
//!
//! Per stage, shared memory holds `[A tile][B tile][SFA][SFB]`; after the last stage come the
//! mbarriers (`full[stages]`, `empty[stages]`, and for clusters `cluster_empty[stages]`), then
//! the slot `tcgen05.alloc` writes the TMEM base to, then the kernel's two accumulator barriers.

use super::divides;
use super::instr::{InstrDescriptor, MMA_K, MMA_M};
use super::tma::BOX_K_VALUES;
use super::tmem::TmemPlan;
use crate::scale_layout::{BLOCK_BYTES, BLOCK_ROWS, SCALE_VEC};

/// Rows of A per tile, the M of the MMA.
pub const BLOCK_M: u32 = MMA_M;

/// FP4 values of K per pipeline stage: one TMA box row of 128 bytes.
pub const TMA_BLOCK_K: u32 = BOX_K_VALUES;

/// K=64 MMAs per stage: `TMA_BLOCK_K / MMA_K`.
pub const MMA_STEPS_PER_STAGE: u32 = TMA_BLOCK_K / MMA_K;

/// Warps per CTA.
pub const WARPS: u32 = 8;

/// Threads per CTA.
pub const THREADS: u32 = WARPS * 32;

/// The warp that issues A and SFA loads.
pub const PRODUCER_A_WARP: u32 = 4;

/// The warp that issues the scale copies and MMAs.
pub const MMA_WARP: u32 = 5;

/// The warp that issues B and SFB loads.
pub const PRODUCER_B_WARP: u32 = 6;

/// Warps `0..EPILOGUE_WARPS` read the accumulator: warp `w` owns TMEM lanes / output rows
/// `32w .. 32w+31`.
pub const EPILOGUE_WARPS: u32 = 4;

/// The warp that runs `tcgen05.alloc` and `tcgen05.dealloc` (a whole warp must).
pub const TMEM_ALLOC_WARP: u32 = 0;

pub use crate::launch::{MAX_DYNAMIC_SMEM, MBARRIER_BYTES, SMEM_PER_SM, SMEM_RESERVED_PER_BLOCK};

/// Alignment of every stage and of the dynamic shared memory base: one 128-byte-swizzle atom
/// (8 rows x 128 B), so that descriptors keep base offset 0 (docs/sm100.md §5). The kernel
/// traps if the dynamic shared memory base is not aligned to it.
pub const STAGE_ALIGN: u32 = crate::launch::DYNAMIC_SMEM_ALIGN;

/// Bytes reserved after the barriers for the TMEM base address `tcgen05.alloc` writes (4 used).
/// The seed lets alloc write into stage 0 and never reads it (it assumes base 0); this slot lets
/// the kernel read the real base back. It fits in the seed's rounding slack for all three
/// variants, so the totals stay the seed's.
pub const TMEM_SLOT_BYTES: u32 = 8;

/// The tile width along N.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BlockN {
    /// 128-wide tiles, no cluster.
    N128 = 128,
    /// 256-wide tiles, clusters of 4 sharing A by multicast.
    N256 = 256,
}

impl BlockN {
    /// The width in columns.
    pub const fn get(self) -> u32 {
        self as u32
    }
}

/// The tile width the seed picks for one group: 256 when `N ≥ 4096`, `K ≥ 2048` and
/// `N % 256 == 0`, else 128. Wide tiles halve the A traffic per output column, which pays when
/// there are many N tiles and a long K loop to amortize the 4-stage pipeline.
pub const fn choose_block_n(n: u32, k: u32) -> BlockN {
    if n >= 4096 && k >= 2048 && divides(256, n) {
        BlockN::N256
    } else {
        BlockN::N128
    }
}

/// What a warp does in the seed's warp-specialized CTA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WarpRole {
    /// Warps 0–3: read the accumulator from TMEM, convert, store C.
    Epilogue,
    /// Warp 4: TMA of A (multicast by rank 0 in a cluster) and bulk copy of SFA.
    ProducerA,
    /// Warp 5: `tcgen05.cp` of the scales and `tcgen05.mma`, then `tcgen05.commit`.
    Mma,
    /// Warp 6: TMA of B and bulk copy of SFB.
    ProducerB,
    /// Warp 7: no role in the main loop.
    Idle,
}

impl WarpRole {
    /// The role of warp `warp` (0..8).
    pub const fn of_warp(warp: u32) -> Self {
        match warp {
            PRODUCER_A_WARP => Self::ProducerA,
            MMA_WARP => Self::Mma,
            PRODUCER_B_WARP => Self::ProducerB,
            w if w < EPILOGUE_WARPS => Self::Epilogue,
            _ => Self::Idle,
        }
    }
}

/// Why a configuration is rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConfigError {
    /// At least one stage.
    NoStages,
    /// Cluster size must be 1, or 4 with BLOCK_N = 256 (the seed's multicast path).
    Cluster,
    /// A stage is not a multiple of [`STAGE_ALIGN`].
    StageAlignment,
    /// Dynamic shared memory exceeds [`MAX_DYNAMIC_SMEM`].
    SharedMemory,
    /// The TMEM plan does not fit.
    Tmem,
}

/// One compiled kernel variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KernelConfig {
    block_n: BlockN,
    stages: u32,
    cluster_size: u32,
}

impl KernelConfig {
    /// Checks a variant: stage sizes multiples of 1024, smem within 227 KiB, TMEM plan within 512
    /// columns, cluster 1 (any BLOCK_N) or 4 (BLOCK_N = 256, multicast of A).
    pub const fn new(block_n: BlockN, stages: u32, cluster_size: u32) -> Result<Self, ConfigError> {
        let cfg = Self { block_n, stages, cluster_size };
        if stages == 0 {
            return Err(ConfigError::NoStages);
        }
        match (block_n, cluster_size) {
            (_, 1) | (BlockN::N256, 4) => {}
            _ => return Err(ConfigError::Cluster),
        }
        if !divides(STAGE_ALIGN, cfg.stage_bytes()) {
            return Err(ConfigError::StageAlignment);
        }
        if cfg.dynamic_shared_memory() > MAX_DYNAMIC_SMEM {
            return Err(ConfigError::SharedMemory);
        }
        if TmemPlan::new(block_n.get(), MMA_STEPS_PER_STAGE).is_err()
            || super::tmem::allocation_columns(cfg.tmem_used_columns()).is_none()
        {
            return Err(ConfigError::Tmem);
        }
        Ok(cfg)
    }

    /// Tile rows (M side): 128.
    pub const fn block_m(self) -> u32 {
        BLOCK_M
    }

    /// Tile columns (N side).
    pub const fn block_n(self) -> u32 {
        self.block_n.get()
    }

    /// K values per stage: 256.
    pub const fn block_k(self) -> u32 {
        TMA_BLOCK_K
    }

    /// K values per MMA: 64.
    pub const fn mma_k(self) -> u32 {
        MMA_K
    }

    /// Pipeline stages.
    pub const fn stages(self) -> u32 {
        self.stages
    }

    /// CTAs per cluster.
    pub const fn cluster_size(self) -> u32 {
        self.cluster_size
    }

    /// Whether CTA rank 0 multicasts A to the cluster (cluster size > 1).
    pub const fn multicast_a(self) -> bool {
        self.cluster_size > 1
    }

    /// The `ctaMask` of the A multicast: every CTA of the cluster.
    pub const fn multicast_mask(self) -> u16 {
        ((1u32 << self.cluster_size) - 1) as u16
    }

    /// MMAs per full stage: 4.
    pub const fn mma_steps_per_stage(self) -> u32 {
        MMA_STEPS_PER_STAGE
    }

    /// Bytes of the A tile per stage: `128 * 256/2` = 16384.
    pub const fn a_stage_bytes(self) -> u32 {
        BLOCK_M * (TMA_BLOCK_K / 2)
    }

    /// Bytes of the B tile per stage: 16384 or 32768.
    pub const fn b_stage_bytes(self) -> u32 {
        self.block_n() * (TMA_BLOCK_K / 2)
    }

    /// Bytes of A scales per stage: `128 * 256/16` = 2048 (four 512-byte blocks).
    pub const fn sfa_stage_bytes(self) -> u32 {
        BLOCK_M * (TMA_BLOCK_K / SCALE_VEC)
    }

    /// Bytes of B scales per stage: 2048 or 4096.
    pub const fn sfb_stage_bytes(self) -> u32 {
        self.block_n() * (TMA_BLOCK_K / SCALE_VEC)
    }

    /// Bytes per stage: 36864 (BLOCK_N = 128) or 55296 (256).
    pub const fn stage_bytes(self) -> u32 {
        self.a_stage_bytes() + self.b_stage_bytes() + self.sfa_stage_bytes() + self.sfb_stage_bytes()
    }

    /// Offset of the A tile inside a stage: 0.
    pub const fn a_offset(self) -> u32 {
        0
    }

    /// Offset of the B tile inside a stage.
    pub const fn b_offset(self) -> u32 {
        self.a_stage_bytes()
    }

    /// Offset of SFA inside a stage.
    pub const fn sfa_offset(self) -> u32 {
        self.b_offset() + self.b_stage_bytes()
    }

    /// Offset of SFB inside a stage.
    pub const fn sfb_offset(self) -> u32 {
        self.sfa_offset() + self.sfa_stage_bytes()
    }

    /// Offset of stage `s` from the dynamic smem base.
    pub const fn stage_offset(self, s: u32) -> u32 {
        s * self.stage_bytes()
    }

    /// mbarriers per stage: full and empty, plus the cluster-wide empty barrier with multicast.
    pub const fn barriers_per_stage(self) -> u32 {
        if self.multicast_a() {
            3
        } else {
            2
        }
    }

    /// Offset of the first mbarrier: right after the stages.
    pub const fn barrier_base(self) -> u32 {
        self.stages * self.stage_bytes()
    }

    /// The full barrier of stage `s` (TMA → MMA; 2 arrivals, one per producer warp, plus
    /// transaction bytes).
    pub const fn full_barrier_offset(self, s: u32) -> u32 {
        self.barrier_base() + s * MBARRIER_BYTES
    }

    /// The empty barrier of stage `s` (MMA commit → producers; 1 arrival).
    pub const fn empty_barrier_offset(self, s: u32) -> u32 {
        self.barrier_base() + (self.stages + s) * MBARRIER_BYTES
    }

    /// The cluster-wide empty barrier of stage `s`, used in rank 0 only (cluster size arrivals,
    /// one per CTA's MMA warp) before it multicasts into the stage again; `None` without a
    /// cluster.
    ///
    /// ⚠ The seed arrives on it (`mbarrier_arrive_cluster`) right after *issuing* a stage's MMAs,
    /// not when they complete (docs/sm100.md §6); the safe alternative is
    /// `tcgen05.commit...multicast::cluster` with `ctaMask` = rank 0 on this same barrier, which
    /// is what the kernel does (docs/provenance.md §3, D3).
    pub const fn cluster_empty_barrier_offset(self, s: u32) -> Option<u32> {
        if self.multicast_a() {
            Some(self.barrier_base() + (2 * self.stages + s) * MBARRIER_BYTES)
        } else {
            None
        }
    }

    /// Arrivals that complete a full barrier phase: 2 (A/SFA producer and B/SFB producer).
    pub const fn full_barrier_arrivals(self) -> u32 {
        2
    }

    /// Arrivals that complete an empty barrier phase: 1 (`tcgen05.commit`).
    pub const fn empty_barrier_arrivals(self) -> u32 {
        1
    }

    /// Arrivals that complete a cluster-empty barrier phase: one per CTA of the cluster.
    pub const fn cluster_empty_barrier_arrivals(self) -> u32 {
        self.cluster_size
    }

    /// Offset of the 8-byte slot `tcgen05.alloc` writes the TMEM base to: after the barriers.
    pub const fn tmem_slot_offset(self) -> u32 {
        self.barrier_base() + self.barriers_per_stage() * self.stages * MBARRIER_BYTES
    }

    /// Block dimensions: `[256, 1, 1]`.
    pub const fn block(self) -> [u32; 3] {
        [THREADS, 1, 1]
    }

    /// Cluster dimensions: `[cluster_size, 1, 1]`.
    pub const fn cluster_dims(self) -> [u32; 3] {
        [self.cluster_size, 1, 1]
    }

    /// The MMA instruction descriptor for this tile.
    pub const fn instr_descriptor(self) -> InstrDescriptor {
        match InstrDescriptor::nvfp4(BLOCK_M, self.block_n()) {
            Ok(d) => d,
            Err(_) => panic!("BLOCK_N is 128 or 256"),
        }
    }

    /// The TMEM column plan for this tile.
    pub const fn tmem_plan(self) -> TmemPlan {
        match TmemPlan::new(self.block_n(), MMA_STEPS_PER_STAGE) {
            Ok(p) => p,
            Err(_) => panic!("checked in KernelConfig::new"),
        }
    }

    /// Stages of the K loop: `ceil(K / 256)`. The seed uses `K / TMA_BLOCK_K` and requires
    /// `K % 256 == 0`; rounding up admits the K tail (see [`super::tma::Fp4MapLayout::Flat2d`]).
    pub const fn k_iterations(self, k: u32) -> u32 {
        k.div_ceil(TMA_BLOCK_K)
    }

    /// Valid K=64 MMAs in stage `k_iter` of a `K`-long loop: 4, except in a K tail. The MMA
    /// warp issues the scale copies and MMAs only for `k <` this: the A/B bytes past K are zeros,
    /// but the scale bytes of the missing blocks are stale shared memory that may hold an e4m3
    /// NaN, and `0 x NaN` would poison the accumulator.
    pub const fn mma_steps_in_stage(self, k: u32, k_iter: u32) -> u32 {
        let left = (k - k_iter * TMA_BLOCK_K) / MMA_K;
        if left < MMA_STEPS_PER_STAGE {
            left
        } else {
            MMA_STEPS_PER_STAGE
        }
    }

    /// Bytes the A producer announces with `arrive.expect_tx` for stage `k_iter`: the full A box
    /// (out-of-bounds bytes count, docs/sm100.md §5) plus the SFA blocks actually copied.
    /// For a full stage this is the seed's `TMA_A_SMEM_BYTES + TMA_SFA_SMEM_BYTES` = 18432.
    /// In a cluster every CTA announces the A bytes although only rank 0 issues the multicast:
    /// the multicast completes the same transaction count on each CTA's barrier (PTX
    /// §9.7.9.27.1.2).
    pub const fn producer_a_tx_bytes(self, k: u32, k_iter: u32) -> u32 {
        self.a_stage_bytes() + self.mma_steps_in_stage(k, k_iter) * BLOCK_BYTES
    }

    /// Bytes the B producer announces for stage `k_iter`: full B box plus SFB blocks copied
    /// (one run per 128 rows). For a full stage this is the seed's
    /// `TMA_B_SMEM_BYTES + TMA_SFB_SMEM_BYTES` = 18432 or 36864.
    pub const fn producer_b_tx_bytes(self, k: u32, k_iter: u32) -> u32 {
        self.b_stage_bytes() + self.mma_steps_in_stage(k, k_iter) * BLOCK_BYTES * (self.block_n() / BLOCK_ROWS)
    }

    /// CTAs of this kernel the whole device holds at once: `active_clusters` clusters for a
    /// cluster kernel (the driver's `cuOccupancyMaxActiveClusters`, which sees how clusters fit
    /// into GPCs: fragmentation can leave fewer 4-CTA clusters resident than `SMs / 4`), else
    /// `sm_count * ctas_per_sm` (`cuOccupancyMaxActiveBlocksPerMultiprocessor`).
    pub const fn resident_ctas(self, sm_count: u32, ctas_per_sm: u32, active_clusters: u32) -> u32 {
        if self.cluster_size > 1 {
            active_clusters * self.cluster_size
        } else {
            sm_count * ctas_per_sm
        }
    }

    /// The grid for `num_items` work items when `resident` CTAs fit on the device at once
    /// ([`Self::resident_ctas`]): one CTA per item if they all fit in one wave, else a persistent
    /// grid of one wave (CTAs loop over the list with grid stride), rounded down to whole
    /// clusters.
    pub const fn launch_grid(self, num_items: u32, resident: u32) -> u32 {
        let wave = resident / self.cluster_size * self.cluster_size;
        if num_items > wave {
            wave
        } else {
            num_items
        }
    }
}

const fn valid(cfg: Result<KernelConfig, ConfigError>) -> KernelConfig {
    match cfg {
        Ok(c) => c,
        Err(_) => panic!("invalid sm100 kernel configuration"),
    }
}

/// BLOCK_N = 128 with 6 stages: the default 128-wide variant, one CTA per SM (221312 B).
pub const N128_DEEP: KernelConfig = valid(KernelConfig::new(BlockN::N128, 6, 1));

/// BLOCK_N = 128 with 3 stages (110720 B; the seed's 110656 plus one 64-byte step for the
/// accumulator barriers), two CTAs per SM: used when the work list is longer than two waves of
/// [`N128_DEEP`] (see [`select_n128`]).
///
/// ⚠ Not hardware-proven: the seed picks it only past 296 items on 148 SMs, which no benchmark
/// or test shape reaches (b1, the longest list, is 256-wide). With two CTAs per SM the second
/// CTA's TMEM allocation starts at column 256, so the seed's assumed base 0 would be wrong here:
/// the kernel reads the base back from [`KernelConfig::tmem_slot_offset`] (docs/provenance.md §3,
/// D4).
pub const N128_SHALLOW: KernelConfig = valid(KernelConfig::new(BlockN::N128, 3, 1));

/// BLOCK_N = 256 with 4 stages in clusters of 4 that share A by multicast (221312 B).
pub const N256_CLUSTER4: KernelConfig = valid(KernelConfig::new(BlockN::N256, 4, 4));

// Static checks per knob of each variant (the `valid` calls above already enforce them; these
// make each rule visible and fail the build on their own).
const _: () = assert!(N128_DEEP.dynamic_shared_memory() <= MAX_DYNAMIC_SMEM);
const _: () = assert!(N128_SHALLOW.dynamic_shared_memory() <= MAX_DYNAMIC_SMEM);
const _: () = assert!(N256_CLUSTER4.dynamic_shared_memory() <= MAX_DYNAMIC_SMEM);
const _: () = assert!(divides(STAGE_ALIGN, N128_DEEP.stage_bytes()));
const _: () = assert!(divides(STAGE_ALIGN, N256_CLUSTER4.stage_bytes()));
const _: () = assert!(divides(STAGE_ALIGN, N128_DEEP.b_offset()) && divides(STAGE_ALIGN, N256_CLUSTER4.b_offset()));
const _: () = assert!(divides(MBARRIER_BYTES, N128_DEEP.barrier_base()));
const _: () =
    assert!(divides(STAGE_ALIGN, N128_SHALLOW.stage_bytes()) && divides(STAGE_ALIGN, N256_CLUSTER4.a_offset()));
const _: () = assert!(divides(STAGE_ALIGN, N128_SHALLOW.stage_bytes()));
const _: () = assert!(divides(MMA_K, TMA_BLOCK_K) && THREADS == 256);
const _: () = assert!(WARPS > PRODUCER_B_WARP && EPILOGUE_WARPS * 32 == BLOCK_M);

/// The seed's choice between [`N128_DEEP`] and [`N128_SHALLOW`] for `num_items` 128-wide items:
/// shallow when it fits more CTAs per wave and the list is longer than two deep waves.
/// `wave_deep` / `wave_shallow` are the variants' [`KernelConfig::resident_ctas`].
pub const fn select_n128(num_items: u32, wave_deep: u32, wave_shallow: u32) -> KernelConfig {
    if wave_shallow > wave_deep && num_items > 2 * wave_deep {
        N128_SHALLOW
    } else {
        N128_DEEP
    }
}

/// The variant for a group's tile width: [`N128_DEEP`] or [`N256_CLUSTER4`] (the 3-stage choice
/// is made per launch by [`select_n128`]).
pub const fn for_block_n(block_n: BlockN) -> KernelConfig {
    match block_n {
        BlockN::N128 => N128_DEEP,
        BlockN::N256 => N256_CLUSTER4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's `((barriers * NS * 8 + 63) & ~63)`.
    fn seed_mbar_bytes(barriers_per_stage: u32, ns: u32) -> u32 {
        (barriers_per_stage * ns * 8 + 63) & !63
    }

    #[test]
    fn seed_stage_sizes() {
        // STAGE_128_K256 = 128*(256/2) + 128*(256/2) + 128*(256/16) + 128*(256/16).
        assert_eq!(N128_DEEP.stage_bytes(), 36864);
        assert_eq!(N128_SHALLOW.stage_bytes(), 36864);
        // STAGE_256_K256 = 128*(256/2) + 256*(256/2) + 128*(256/16) + 256*(256/16).
        assert_eq!(N256_CLUSTER4.stage_bytes(), 55296);
        assert_eq!((N128_DEEP.a_stage_bytes(), N128_DEEP.b_stage_bytes()), (16384, 16384));
        assert_eq!((N128_DEEP.sfa_stage_bytes(), N128_DEEP.sfb_stage_bytes()), (2048, 2048));
        assert_eq!(N256_CLUSTER4.b_stage_bytes(), 32768);
        assert_eq!(N256_CLUSTER4.sfb_stage_bytes(), 4096);
    }

    #[test]
    fn seed_total_shared_memory() {
        // SMEM_128_HI_K256 = STAGE_128_K256 * 6 + MBAR_BYTES_DEEP_HI.
        assert_eq!(N128_DEEP.barrier_region_bytes(), seed_mbar_bytes(2, 6));
        assert_eq!(N128_DEEP.dynamic_shared_memory(), 221_312);
        // SMEM_128_LO_K256 = STAGE_128_K256 * 3 + MBAR_BYTES_DEEP_LO = 110656: the seed's slack
        // (64 - 48 bytes) cannot hold the TMEM slot and the two accumulator barriers, so ours is
        // one 64-byte step larger.
        assert_eq!(N128_SHALLOW.barrier_region_bytes(), seed_mbar_bytes(2, 3) + 64);
        assert_eq!(N128_SHALLOW.dynamic_shared_memory(), 110_720);
        // SMEM_256_HI_K256 = STAGE_256_K256 * 4 + MBAR_BYTES_WIDE_HI (3 barriers per stage).
        assert_eq!(N256_CLUSTER4.barrier_region_bytes(), seed_mbar_bytes(3, 4));
        assert_eq!(N256_CLUSTER4.dynamic_shared_memory(), 221_312);
    }

    #[test]
    fn stage_layout_offsets() {
        assert_eq!(N128_DEEP.b_offset(), 16384);
        assert_eq!(N128_DEEP.sfa_offset(), 32768);
        assert_eq!(N128_DEEP.sfb_offset(), 34816);
        assert_eq!(N256_CLUSTER4.sfa_offset(), 49152);
        assert_eq!(N256_CLUSTER4.sfb_offset(), 51200);
        for cfg in [N128_DEEP, N128_SHALLOW, N256_CLUSTER4] {
            for s in 0..cfg.stages() {
                assert_eq!(cfg.stage_offset(s) % STAGE_ALIGN, 0);
            }
            assert_eq!(cfg.sfa_offset() % 16, 0);
            assert_eq!(cfg.sfb_offset() % 16, 0);
        }
    }

    #[test]
    fn barrier_offsets_fit_region() {
        let c = N256_CLUSTER4;
        assert_eq!(c.full_barrier_offset(0), 4 * 55296);
        assert_eq!(c.empty_barrier_offset(1), 4 * 55296 + 5 * 8);
        assert_eq!(c.cluster_empty_barrier_offset(3), Some(4 * 55296 + 11 * 8));
        assert_eq!(N128_DEEP.cluster_empty_barrier_offset(0), None);
        for cfg in [N128_DEEP, N128_SHALLOW, N256_CLUSTER4] {
            assert_eq!(cfg.tmem_slot_offset() % 8, 0);
            assert!(cfg.tmem_slot_offset() + TMEM_SLOT_BYTES <= cfg.barrier_base() + cfg.barrier_region_bytes());
            assert_eq!(cfg.barrier_base() + cfg.barrier_region_bytes(), cfg.dynamic_shared_memory());
        }
    }

    #[test]
    fn launch_shape() {
        assert_eq!(N128_DEEP.block(), [256, 1, 1]);
        assert_eq!(N128_DEEP.cluster_dims(), [1, 1, 1]);
        assert_eq!(N256_CLUSTER4.cluster_dims(), [4, 1, 1]);
        assert_eq!(N256_CLUSTER4.multicast_mask(), 0xF);
        assert!(!N128_DEEP.multicast_a());
        assert_eq!(N128_DEEP.instr_descriptor().to_bits(), 0x0820_0480);
        assert_eq!(N256_CLUSTER4.instr_descriptor().to_bits(), 0x0840_0480);
        assert_eq!(N128_DEEP.tmem_allocated_columns(), 512);
        assert_eq!(N256_CLUSTER4.tmem_allocated_columns(), 512);
        assert_eq!(N128_DEEP.mma_steps_per_stage(), 4);
    }

    #[test]
    fn warp_roles() {
        use WarpRole::*;
        let roles: [WarpRole; 8] = core::array::from_fn(|w| WarpRole::of_warp(w as u32));
        assert_eq!(roles, [Epilogue, Epilogue, Epilogue, Epilogue, ProducerA, Mma, ProducerB, Idle]);
    }

    #[test]
    fn tx_bytes_match_seed_for_full_stages() {
        // expect_bytes = do_A ? (TMA_A_SMEM_BYTES + TMA_SFA_SMEM_BYTES)
        //                     : (TMA_B_SMEM_BYTES + TMA_SFB_SMEM_BYTES).
        assert_eq!(N128_DEEP.producer_a_tx_bytes(1024, 2), 16384 + 2048);
        assert_eq!(N128_DEEP.producer_b_tx_bytes(1024, 2), 16384 + 2048);
        assert_eq!(N256_CLUSTER4.producer_b_tx_bytes(7168, 0), 32768 + 4096);
        // The two producers together announce one stage.
        for cfg in [N128_DEEP, N256_CLUSTER4] {
            assert_eq!(cfg.producer_a_tx_bytes(2048, 0) + cfg.producer_b_tx_bytes(2048, 0), cfg.stage_bytes());
        }
    }

    #[test]
    fn k_tail_steps_and_tx() {
        let c = N128_DEEP;
        assert_eq!(c.k_iterations(7168), 28);
        assert_eq!(c.k_iterations(384), 2);
        assert_eq!(c.mma_steps_in_stage(384, 0), 4);
        assert_eq!(c.mma_steps_in_stage(384, 1), 2);
        assert_eq!(c.k_iterations(128), 1);
        assert_eq!(c.mma_steps_in_stage(128, 0), 2);
        // Full box, partial scales.
        assert_eq!(c.producer_a_tx_bytes(384, 1), 16384 + 1024);
        assert_eq!(c.producer_b_tx_bytes(384, 1), 16384 + 1024);
    }

    #[test]
    fn occupancy_and_grid() {
        assert_eq!(N128_DEEP.max_ctas_per_sm(), 1);
        assert_eq!(N128_SHALLOW.max_ctas_per_sm(), 2);
        assert_eq!(N256_CLUSTER4.max_ctas_per_sm(), 1);
        // 148 SMs: b2 has 120 items → one CTA each; 200 items → persistent over 148.
        assert_eq!(N128_DEEP.resident_ctas(148, 1, 0), 148);
        assert_eq!(N128_SHALLOW.resident_ctas(148, 2, 0), 296);
        assert_eq!(N128_DEEP.launch_grid(120, 148), 120);
        assert_eq!(N128_DEEP.launch_grid(200, 148), 148);
        // Clusters: the driver's count of resident clusters decides, not SMs / 4: 37 clusters on
        // 148 SMs → 148 CTAs; with GPC fragmentation leaving 34 resident → 136.
        assert_eq!(N256_CLUSTER4.resident_ctas(148, 1, 37), 148);
        assert_eq!(N256_CLUSTER4.launch_grid(364, N256_CLUSTER4.resident_ctas(148, 1, 37)), 148);
        assert_eq!(N256_CLUSTER4.launch_grid(364, N256_CLUSTER4.resident_ctas(148, 1, 34)), 136);
        assert_eq!(N256_CLUSTER4.launch_grid(364, 146), 144);
        assert_eq!(N256_CLUSTER4.launch_grid(8, 148), 8);
    }

    #[test]
    fn stage_selection() {
        // 148 SMs, deep 1 CTA/SM, shallow 2: shallow only past 296 items.
        assert_eq!(select_n128(296, 148, 296), N128_DEEP);
        assert_eq!(select_n128(297, 148, 296), N128_SHALLOW);
        // No occupancy gain: always deep.
        assert_eq!(select_n128(10_000, 148, 148), N128_DEEP);
    }

    #[test]
    fn block_n_choice() {
        // Benchmarks: b0 (N 4096, K 7168) and b1 (N 7168, K 2048) wide; b2 (N 3072) and b3
        // (K 1536) narrow.
        assert_eq!(choose_block_n(4096, 7168), BlockN::N256);
        assert_eq!(choose_block_n(7168, 2048), BlockN::N256);
        assert_eq!(choose_block_n(3072, 4096), BlockN::N128);
        assert_eq!(choose_block_n(4096, 1536), BlockN::N128);
        // N not a multiple of 256.
        assert_eq!(choose_block_n(4224, 4096), BlockN::N128);
        assert_eq!(for_block_n(BlockN::N256), N256_CLUSTER4);
    }

    #[test]
    fn rejected_configs() {
        assert_eq!(KernelConfig::new(BlockN::N128, 0, 1), Err(ConfigError::NoStages));
        assert_eq!(KernelConfig::new(BlockN::N128, 6, 4), Err(ConfigError::Cluster));
        assert_eq!(KernelConfig::new(BlockN::N256, 4, 2), Err(ConfigError::Cluster));
        assert_eq!(KernelConfig::new(BlockN::N128, 7, 1), Err(ConfigError::SharedMemory));
        assert_eq!(KernelConfig::new(BlockN::N256, 5, 4), Err(ConfigError::SharedMemory));
        assert!(KernelConfig::new(BlockN::N256, 4, 1).is_ok());
    }
}
