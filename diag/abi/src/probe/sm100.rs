//! Parameters and launch shapes of the sm_100a hardware probes (`diag/kernel/src/probe_sm100.rs`):
//! small kernels that exercise exactly the Blackwell features the device model implements and the
//! sm_100a GEMM uses, each writing what it observed to global memory, so that the first B200 and
//! the model can be compared byte for byte (`nvfp4_gemm_diag::probe::sm100`,
//! `tests/tests/gpu_probe_sm100.rs`):
//! - `tmem_probe`: `tcgen05.alloc`, 33 `tcgen05.cp.32x128b.warpx4` of 512-byte scale blocks,
//!   `tcgen05.ld.16x256b` read-back of a 128 × 128 TMEM window;
//! - `umma_probe`: FP4 TMA boxes (2D or 3D maps, boxes wider than K, rows past the tensor) and
//!   bulk-copied scale blocks, their scale copies, 1–4 K = 64 steps of
//!   `tcgen05.mma.kind::mxf4nvf4.block_scale.scale_vec::4X` with N = 128 or 256, the accumulator
//!   read back, and the operand tiles as they lay in shared memory;
//! - `tma4_multicast_probe`: a cluster of 4; rank 0 multicasts one FP4 box into every CTA, each CTA
//!   then arrives on rank 0's barrier with `tcgen05.commit ... multicast::cluster`.
//!
//! Every kernel takes one [`ProbeParams`] by value; the constants below say what its fields and
//! `args` mean. The descriptor fields, TMEM columns and maps come from this crate's sm100 modules
//! (the GEMM's own encodings) with, per case, the variants the device model's strict mode rejects
//! (an LBO the ISA calls unused, scale columns off the 4-column grid), which only hardware can
//! settle.

pub use super::{ProbeParams, PROBE_BARRIER_BYTES, PROBE_OK, PROBE_TIMED_OUT, PROBE_WAIT_LIMIT_NS};
use nvfp4_gemm_abi::launch::LaunchGeometry;
use nvfp4_gemm_abi::scale_layout::BLOCK_BYTES;

/// Threads of every sm_100a probe CTA: four warps, one per TMEM lane quarter.
pub const SM100_PROBE_THREADS: u32 = 128;

/// Words one warp reads with two `tcgen05.ld.16x256b.x16` (two 16-lane halves × 32 lanes × 64
/// registers), per 128 columns.
pub const LD_WORDS_PER_WARP_CHUNK: u32 = 2 * 32 * 64;

/// `tmem_probe`: TMEM columns allocated.
pub const TMEM_PROBE_ALLOC: u32 = 512;
/// `tmem_probe`: the first column read back (relative to the allocation).
pub const TMEM_PROBE_WINDOW: u32 = 128;
/// `tmem_probe`: columns read back (one `.x16` load per 16 lanes).
pub const TMEM_PROBE_COLUMNS: u32 = 128;
/// `tmem_probe`: 512-byte scale blocks copied: one per 4 columns of the window, and one more
/// that covers the window's first columns when the copies are shifted.
pub const TMEM_PROBE_BLOCKS: u32 = TMEM_PROBE_COLUMNS / 4 + 1;
/// `tmem_probe` `args`: the copies' column shift `s` (0..=3): block `j` goes to columns
/// `TMEM_PROBE_WINDOW - 4 + s + 4j ..+4`.
pub const TMEM_ARG_SHIFT: usize = 0;
/// `tmem_probe` `args`: LBO of the copies' source descriptor, bytes.
pub const TMEM_ARG_LBO: usize = 1;
/// `tmem_probe`: bytes written to `out`: every warp's registers (by warp, half, lane, register),
/// then the status word.
pub const TMEM_PROBE_OUT_BYTES: u32 = 4 * (4 * LD_WORDS_PER_WARP_CHUNK + 1);

/// The first column of `tmem_probe`'s block `j` with column shift `shift`, relative to the
/// allocation.
pub const fn tmem_probe_copy_column(j: u32, shift: u32) -> u32 {
    TMEM_PROBE_WINDOW - 4 + shift + 4 * j
}

/// The `tmem_probe` launch: one CTA; `input` holds [`TMEM_PROBE_BLOCKS`] blocks of 512 bytes.
pub const fn tmem_probe_launch() -> LaunchGeometry {
    LaunchGeometry {
        grid: 1,
        block: SM100_PROBE_THREADS,
        cluster: 1,
        smem_bytes: PROBE_BARRIER_BYTES + TMEM_PROBE_BLOCKS * BLOCK_BYTES,
    }
}

/// `umma_probe`: TMEM columns allocated (accumulator of up to 256 columns, then the scales).
pub const UMMA_PROBE_ALLOC: u32 = 512;
/// `umma_probe`: largest N.
pub const UMMA_PROBE_MAX_N: u32 = 256;
/// `umma_probe`: most K = 64 steps (one 256-value box).
pub const UMMA_PROBE_MAX_STEPS: u32 = 4;
/// `umma_probe`: bytes of one operand row in shared memory (256 e2m1 values).
pub const UMMA_PROBE_ROW_BYTES: u32 = 128;
/// `umma_probe`: offset of the A tile (128 rows) in dynamic shared memory, 1024-byte aligned.
pub const UMMA_PROBE_A_OFFSET: u32 = PROBE_BARRIER_BYTES;
/// `umma_probe`: offset of the B tile (N rows), 1024-byte aligned.
pub const UMMA_PROBE_B_OFFSET: u32 = UMMA_PROBE_A_OFFSET + 128 * UMMA_PROBE_ROW_BYTES;
/// `umma_probe`: offset of the SFA blocks (one per step).
pub const UMMA_PROBE_SFA_OFFSET: u32 = UMMA_PROBE_B_OFFSET + UMMA_PROBE_MAX_N * UMMA_PROBE_ROW_BYTES;
/// `umma_probe`: offset of the SFB blocks: per 128 rows of B, a run of [`UMMA_PROBE_MAX_STEPS`]
/// blocks (the GEMM's stage layout).
pub const UMMA_PROBE_SFB_OFFSET: u32 = UMMA_PROBE_SFA_OFFSET + UMMA_PROBE_MAX_STEPS * BLOCK_BYTES;
/// `umma_probe`: dynamic shared memory.
pub const UMMA_PROBE_SMEM: u32 = UMMA_PROBE_SFB_OFFSET + 2 * UMMA_PROBE_MAX_STEPS * BLOCK_BYTES;
/// `umma_probe` `args`: N (128 or 256).
pub const UMMA_ARG_N: usize = 0;
/// `umma_probe` `args`: K = 64 steps (1..=4), MMAs issued, each `advance`d by 32 bytes.
pub const UMMA_ARG_STEPS: usize = 1;
/// `umma_probe` `args`: rank of both maps (2 or 3).
pub const UMMA_ARG_MAP_RANK: usize = 2;
/// `umma_probe` `args`: the box's first K value (a multiple of 256).
pub const UMMA_ARG_K0: usize = 3;
/// `umma_probe` `args`: LBO of the operand descriptors, bytes.
pub const UMMA_ARG_OPERAND_LBO: usize = 4;
/// `umma_probe` `args`: LBO of the scale-copy descriptors, bytes.
pub const UMMA_ARG_SCALE_LBO: usize = 5;
/// `umma_probe` `args`: columns added to every scale column of the GEMM's plan (copies and MMAs
/// alike).
pub const UMMA_ARG_SCALE_SHIFT: usize = 6;

/// `umma_probe`: bytes written to `out` for width `n`: the A tile and the B tile as they lay in
/// shared memory, every warp's accumulator registers (by warp, 128-column chunk, half, lane,
/// register), the status word.
pub const fn umma_probe_out_bytes(n: u32) -> u32 {
    128 * UMMA_PROBE_ROW_BYTES + n * UMMA_PROBE_ROW_BYTES + 4 * (4 * (n / 128) * LD_WORDS_PER_WARP_CHUNK + 1)
}

/// The `umma_probe` launch: one CTA. `map` points to two tensor maps (A, then B), `input` to the
/// SFA blocks of the steps, `input2` to the SFB blocks (per 128 rows of B, one run of `steps`).
pub const fn umma_probe_launch() -> LaunchGeometry {
    LaunchGeometry { grid: 1, block: SM100_PROBE_THREADS, cluster: 1, smem_bytes: UMMA_PROBE_SMEM }
}

/// `tma4_multicast_probe`: CTAs of the cluster (and of the grid).
pub const MULTICAST_PROBE_CLUSTER: u32 = 4;
/// `tma4_multicast_probe`: largest box (256 rows of 128 bytes).
pub const MULTICAST_PROBE_MAX_BYTES: u32 = 256 * 128;
/// `tma4_multicast_probe` `args`: rank of the map (2 or 3).
pub const MULTICAST_ARG_MAP_RANK: usize = 0;
/// `tma4_multicast_probe` `args`: the box's coordinates, innermost first (as i32; the third is
/// used by 3D maps only).
pub const MULTICAST_ARG_C0: usize = 1;
/// See [`MULTICAST_ARG_C0`].
pub const MULTICAST_ARG_C1: usize = 2;
/// See [`MULTICAST_ARG_C0`].
pub const MULTICAST_ARG_C2: usize = 3;
/// `tma4_multicast_probe` `args`: bytes of the box.
pub const MULTICAST_ARG_BOX_BYTES: usize = 4;
/// `tma4_multicast_probe`: words each CTA writes after its box: the status of its wait for the
/// box, of rank 0's wait for the four commit arrivals (rank 0 only, else 0), its
/// `%cluster_ctarank`, `%cluster_nctarank`.
pub const MULTICAST_LOG_WORDS: u32 = 4;

/// `tma4_multicast_probe`: bytes each CTA writes for a box of `box_bytes`.
pub const fn multicast_probe_cta_bytes(box_bytes: u32) -> u32 {
    box_bytes + 4 * MULTICAST_LOG_WORDS
}

/// The `tma4_multicast_probe` launch: one cluster of four CTAs.
pub const fn multicast_probe_launch() -> LaunchGeometry {
    LaunchGeometry {
        grid: MULTICAST_PROBE_CLUSTER,
        block: SM100_PROBE_THREADS,
        cluster: MULTICAST_PROBE_CLUSTER,
        smem_bytes: PROBE_BARRIER_BYTES + MULTICAST_PROBE_MAX_BYTES,
    }
}

const _: () = assert!(UMMA_PROBE_B_OFFSET % 1024 == 0 && UMMA_PROBE_A_OFFSET % 1024 == 0);
const _: () = assert!(UMMA_PROBE_SMEM <= nvfp4_gemm_abi::launch::MAX_DYNAMIC_SMEM);
const _: () = assert!(tmem_probe_copy_column(TMEM_PROBE_BLOCKS - 1, 3) + 4 <= TMEM_PROBE_ALLOC);

#[cfg(test)]
mod tests {
    use super::*;

    /// The shifted copies cover the whole read-back window, whatever the shift.
    #[test]
    fn tmem_probe_copies_cover_the_window() {
        for shift in 0..4 {
            let first = tmem_probe_copy_column(0, shift);
            let end = tmem_probe_copy_column(TMEM_PROBE_BLOCKS - 1, shift) + 4;
            assert!(first <= TMEM_PROBE_WINDOW && end >= TMEM_PROBE_WINDOW + TMEM_PROBE_COLUMNS, "shift {shift}");
        }
    }

    #[test]
    fn umma_probe_layout() {
        assert_eq!(UMMA_PROBE_SMEM, 1024 + 16384 + 32768 + 2048 + 4096);
        assert_eq!(umma_probe_out_bytes(128), 16384 + 16384 + 4 * (4 * 4096 + 1));
        assert_eq!(TMEM_PROBE_OUT_BYTES, 4 * (16384 + 1));
    }
}
