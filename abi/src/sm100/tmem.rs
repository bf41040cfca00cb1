//! Tensor memory (TMEM): addresses and the per-CTA column plan of the NVFP4 kernel.
//!
//! TMEM is 128 lanes x 512 columns of 32-bit cells per SM (PTX ISA 9.1 §9.7.16.1). A CTA
//! allocates a power-of-two number of columns in [32, 512] with `tcgen05.alloc` and addresses a
//! cell as `lane << 16 | column` (§9.7.16.1.1). The kernel keeps three things there
//! (docs/sm100.md §4 and §6):
//! - the fp32 accumulator, lane m = output row m, column n = output column n: columns
//!   `[0, BLOCK_N)`;
//! - the A scales of one stage (SFA): 4 columns per K=64 MMA step, right after the accumulator;
//! - the B scales of one stage (SFB): `4 * BLOCK_N/128` columns per step, right after SFA.
//!
//! Each `tcgen05.cp.32x128b.warpx4` moves one 512-byte scale block (128 rows x 4 scales) into 4
//! columns: row `32g + r` of the block lands in lane `r` (replicated to the four lane quarters),
//! column `c + g`, one byte per scale.
//!
//! Where the column plan comes from, and what of it ran on hardware: docs/provenance.md §2 (TMEM
//! rows) and §3, D1 and D4.

/// Columns of TMEM per SM (PTX §9.7.16.1; CUTLASS `tmem_allocator_sm100.hpp`).
pub const TMEM_COLUMNS: u32 = 512;

/// Lanes of TMEM per SM; one per accumulator row of an M = 128 MMA (PTX §9.7.16.1).
pub const TMEM_LANES: u32 = 128;

/// Smallest `tcgen05.alloc` column count (PTX §9.7.16.7.1).
pub const TMEM_MIN_ALLOC_COLUMNS: u32 = 32;

/// Lanes a single warp may access: warp `w` sees lanes `32*(w%4) .. 32*(w%4)+31`
/// (PTX §9.7.16.8.1).
pub const TMEM_LANES_PER_WARP: u32 = 32;

/// TMEM columns one `tcgen05.cp.32x128b.warpx4` fills: a 512-byte block of 128 rows is 32 lines
/// of 16 bytes, i.e. four 32-bit columns (docs/sm100.md §4).
pub const SCALE_COLUMNS_PER_COPY: u32 = 4;

/// A TMEM address: lane in bits 16–31, column in bits 0–15 (PTX §9.7.16.1.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct TmemAddress(u32);

impl TmemAddress {
    /// The cell at `lane`, `column`: `lane << 16 | column`.
    pub const fn new(lane: u32, column: u32) -> Self {
        Self((lane << 16) | (column & 0xFFFF))
    }

    /// Reinterprets the value `tcgen05.alloc` wrote to shared memory.
    pub const fn from_bits(bits: u32) -> Self {
        Self(bits)
    }

    /// The raw value, for a PTX `[taddr]` operand.
    pub const fn to_bits(self) -> u32 {
        self.0
    }

    /// Lane, bits 16–31.
    pub const fn lane(self) -> u32 {
        self.0 >> 16
    }

    /// Column, bits 0–15.
    pub const fn column(self) -> u32 {
        self.0 & 0xFFFF
    }

    /// The address `columns` further right in the same lane.
    pub const fn add_columns(self, columns: u32) -> Self {
        Self::new(self.lane(), self.column() + columns)
    }

    /// The address `lanes` further down in the same column.
    pub const fn add_lanes(self, lanes: u32) -> Self {
        Self::new(self.lane() + lanes, self.column())
    }
}

/// The first lane warp `warp` may access: `32 * (warp % 4)` (PTX §9.7.16.8.1). The seed's
/// epilogue warps 0–3 read lanes `warp*32 + 16*m` with `tcgen05.ld.16x256b`.
pub const fn warp_lane_base(warp: u32) -> u32 {
    TMEM_LANES_PER_WARP * (warp % 4)
}

/// The `tcgen05.alloc` column count for `used` columns: the next power of two, at least
/// [`TMEM_MIN_ALLOC_COLUMNS`]; `None` when more than [`TMEM_COLUMNS`] are needed
/// (PTX §9.7.16.7.1).
pub const fn allocation_columns(used: u32) -> Option<u32> {
    if used > TMEM_COLUMNS {
        return None;
    }
    let p = used.next_power_of_two();
    Some(if p < TMEM_MIN_ALLOC_COLUMNS { TMEM_MIN_ALLOC_COLUMNS } else { p })
}

/// A half-open range of TMEM columns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ColumnRange {
    /// First column.
    pub start: u32,
    /// Number of columns.
    pub len: u32,
}

impl ColumnRange {
    /// One past the last column.
    pub const fn end(self) -> u32 {
        self.start + self.len
    }
}

/// One `tcgen05.cp.32x128b.warpx4` of a stage: which 512-byte scale block (by byte offset from
/// the start of the stage's SFA or SFB region in shared memory) goes to which TMEM column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ScaleCopy {
    /// Byte offset of the 512-byte block inside the stage's SFA or SFB region.
    pub smem_offset: u32,
    /// First of the 4 destination columns, relative to the allocation base.
    pub tmem_column: u32,
}

/// Why a TMEM plan is rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TmemPlanError {
    /// BLOCK_N must be 128 or 256: the SFB copies move whole 128-row scale blocks.
    BlockN,
    /// At least one MMA step per stage.
    NoSteps,
    /// Accumulator plus scales exceed 512 columns.
    TooManyColumns,
}

/// The seed's TMEM column plan for one CTA (docs/sm100.md §4 "Column plan"):
///
/// | Columns                                   | Content                                 |
/// |-------------------------------------------|-----------------------------------------|
/// | `[0, BLOCK_N)`                            | fp32 accumulator, lane = row            |
/// | `[BLOCK_N, BLOCK_N + 4*steps)`            | SFA, 4 columns per K=64 step            |
/// | `[.., .. + 4*(BLOCK_N/128)*steps)`        | SFB, 4 columns per 128 B rows per step  |
///
/// Columns are relative to the allocation base, which the kernel reads back from shared memory
/// (the seed assumed 0). The kernel adds one scale column set per stage and allocates for all
/// of them: `KernelConfig::tmem_allocated_columns` is the allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TmemPlan {
    block_n: u32,
    steps_per_stage: u32,
}

impl TmemPlan {
    /// The plan for a `BLOCK_N`-wide tile with `steps_per_stage` K=64 MMAs per stage
    /// (`TMA_BLOCK_K / MMA_K` = 4 in the seed).
    pub const fn new(block_n: u32, steps_per_stage: u32) -> Result<Self, TmemPlanError> {
        if block_n != 128 && block_n != 256 {
            return Err(TmemPlanError::BlockN);
        }
        if steps_per_stage == 0 {
            return Err(TmemPlanError::NoSteps);
        }
        let plan = Self { block_n, steps_per_stage };
        if plan.used_columns() > TMEM_COLUMNS {
            return Err(TmemPlanError::TooManyColumns);
        }
        Ok(plan)
    }

    /// Columns holding the fp32 accumulator: `[0, BLOCK_N)`, one column per output column
    /// (docs/sm100.md §6; the seed's comment "2 columns per fp32" is wrong, see §4).
    pub const fn accumulator(self) -> ColumnRange {
        ColumnRange { start: 0, len: self.block_n }
    }

    /// Scale blocks (of 128 rows) that cover B's `BLOCK_N` rows: 1 or 2.
    pub const fn sfb_blocks(self) -> u32 {
        self.block_n / 128
    }

    /// Columns holding SFA for every step of a stage.
    pub const fn sfa(self) -> ColumnRange {
        ColumnRange { start: self.block_n, len: SCALE_COLUMNS_PER_COPY * self.steps_per_stage }
    }

    /// Columns holding SFB for every step of a stage.
    pub const fn sfb(self) -> ColumnRange {
        ColumnRange { start: self.sfa().end(), len: SCALE_COLUMNS_PER_COPY * self.sfb_blocks() * self.steps_per_stage }
    }

    /// Columns in use: 160 for BLOCK_N = 128, 304 for BLOCK_N = 256 (4 steps).
    pub const fn used_columns(self) -> u32 {
        self.sfb().end()
    }

    /// The `scale-A-tmem` column of MMA step `k`: `SFA + 4k`.
    pub const fn sfa_column(self, k: u32) -> u32 {
        self.sfa().start + SCALE_COLUMNS_PER_COPY * k
    }

    /// The `scale-B-tmem` column of MMA step `k`: `SFB + 4k` (N=128) or `SFB + 8k` (N=256).
    pub const fn sfb_column(self, k: u32) -> u32 {
        self.sfb().start + SCALE_COLUMNS_PER_COPY * self.sfb_blocks() * k
    }

    /// The copy of step `k`'s SFA block: smem block `k` (the stage's SFA region holds
    /// `steps_per_stage` consecutive 512-byte blocks) into [`TmemPlan::sfa_column`].
    pub const fn sfa_copy(self, k: u32) -> ScaleCopy {
        ScaleCopy { smem_offset: k * crate::scale_layout::BLOCK_BYTES, tmem_column: self.sfa_column(k) }
    }

    /// The copy of step `k`'s SFB block for B rows `128*half .. 128*half+127`. The stage's SFB
    /// region holds one run of `steps_per_stage` blocks per 128 rows (two bulk copies in the seed
    /// for N=256), so block `(half, k)` sits at `(half*steps + k) * 512`; its columns are
    /// `sfb_column(k) + 4*half`.
    ///
    /// ⚠ For `half = 1` the seed's line is elided ("⋯ 5 unchanged lines" after
    /// `if constexpr (BLOCK_N == 256) {`); this is inferred from the SFB bulk-copy offsets
    /// (`SFB_off + SFB_HALF_BYTES`) and the `k * 8` column step (docs/sm100.md §4 ⚠).
    pub const fn sfb_copy(self, k: u32, half: u32) -> ScaleCopy {
        ScaleCopy {
            smem_offset: (half * self.steps_per_stage + k) * crate::scale_layout::BLOCK_BYTES,
            tmem_column: self.sfb_column(k) + SCALE_COLUMNS_PER_COPY * half,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_encoding() {
        assert_eq!(TmemAddress::new(0, 0).to_bits(), 0);
        assert_eq!(TmemAddress::new(96, 128).to_bits(), 96 << 16 | 128);
        let a = TmemAddress::new(16, 300);
        assert_eq!((a.lane(), a.column()), (16, 300));
        assert_eq!(a.add_columns(4).to_bits(), 16 << 16 | 304);
        assert_eq!(a.add_lanes(32).to_bits(), 48 << 16 | 300);
        assert_eq!(TmemAddress::from_bits(0x0020_0100), TmemAddress::new(32, 256));
    }

    /// The seed's epilogue: `tcgen05_ld_16x256b_x16(tmp, warp_id * 32 + m * 16, col_base)`.
    #[test]
    fn epilogue_lanes_stay_in_each_warps_quarter() {
        for warp in 0..4 {
            for m in 0..2 {
                let lane = warp * 32 + m * 16;
                assert_eq!(lane / 32 * 32, warp_lane_base(warp));
            }
        }
        assert_eq!(warp_lane_base(5), 32);
    }

    #[test]
    fn seed_plan_block_n_128() {
        let p = TmemPlan::new(128, 4).unwrap();
        assert_eq!(p.accumulator(), ColumnRange { start: 0, len: 128 });
        // SFA_tmem = BLOCK_N; SFB_tmem = SFA_tmem + 4 * (256 / 64).
        assert_eq!(p.sfa(), ColumnRange { start: 128, len: 16 });
        assert_eq!(p.sfb(), ColumnRange { start: 144, len: 16 });
        assert_eq!(p.used_columns(), 160);
        // The seed's TMEM_COLS = BLOCK_N * 2.
        assert_eq!(allocation_columns(p.used_columns()), Some(256));
        for k in 0..4 {
            assert_eq!(p.sfa_column(k), 128 + k * 4);
            assert_eq!(p.sfb_column(k), 144 + k * 4);
            assert_eq!(p.sfa_copy(k), ScaleCopy { smem_offset: 512 * k, tmem_column: 128 + 4 * k });
            assert_eq!(p.sfb_copy(k, 0), ScaleCopy { smem_offset: 512 * k, tmem_column: 144 + 4 * k });
        }
    }

    #[test]
    fn seed_plan_block_n_256() {
        let p = TmemPlan::new(256, 4).unwrap();
        assert_eq!(p.accumulator(), ColumnRange { start: 0, len: 256 });
        assert_eq!(p.sfa(), ColumnRange { start: 256, len: 16 });
        assert_eq!(p.sfb(), ColumnRange { start: 272, len: 32 });
        assert_eq!(p.used_columns(), 304);
        assert_eq!(allocation_columns(p.used_columns()), Some(512));
        for k in 0..4 {
            assert_eq!(p.sfa_column(k), 256 + k * 4);
            // scale_B_tmem = SFB_tmem + k * 8.
            assert_eq!(p.sfb_column(k), 272 + k * 8);
            assert_eq!(p.sfb_copy(k, 0).tmem_column, 272 + 8 * k);
            assert_eq!(p.sfb_copy(k, 1).tmem_column, 272 + 8 * k + 4);
            // SFB_HALF_BYTES = 128 * (256 / 16) = 2048 separates the two row blocks.
            assert_eq!(p.sfb_copy(k, 1).smem_offset, 2048 + 512 * k);
        }
    }

    #[test]
    fn columns_do_not_overlap() {
        for (n, steps) in [(128, 4), (256, 4), (128, 1), (256, 8)] {
            let p = TmemPlan::new(n, steps).unwrap();
            assert!(p.accumulator().end() <= p.sfa().start);
            assert!(p.sfa().end() <= p.sfb().start);
            assert!(p.used_columns() <= TMEM_COLUMNS);
        }
    }

    #[test]
    fn allocation_rounding_and_rejections() {
        assert_eq!(allocation_columns(0), Some(32));
        assert_eq!(allocation_columns(33), Some(64));
        assert_eq!(allocation_columns(512), Some(512));
        assert_eq!(allocation_columns(513), None);
        assert_eq!(TmemPlan::new(192, 4), Err(TmemPlanError::BlockN));
        assert_eq!(TmemPlan::new(128, 0), Err(TmemPlanError::NoSteps));
        assert_eq!(TmemPlan::new(256, 22), Err(TmemPlanError::TooManyColumns));
    }
}
