//! Parameters and launch shapes of the hardware probes (`tma_probe`, `sync_probe`,
//! `wgmma_probe_n16`, `wgmma_probe_n128`; sm_90a): small kernels that exercise exactly the Hopper features the device model implements and the sm_90a kernels use
//! (TMA tile loads with swizzle and out-of-bounds fill, bulk copies, mbarrier phases and
//! transaction bytes, a 2-CTA cluster exchange through remote arrivals, `wgmma` fragments and
//! descriptors), each writing what it observed to global memory, so that the H200 and the model
//! can be compared bit for bit (`nvfp4_gemm_diag::probe`, `tests/tests/gpu_probe_sm90.rs`).

use nvfp4_gemm_abi::launch::LaunchGeometry;

pub mod sm100;

/// The one parameter of every probe kernel, by value. What `args` means depends on the probe
/// (see the constants below).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C)]
pub struct ProbeParams {
    /// A tensor map in global memory (64-byte aligned), or 0.
    pub map: u64,
    /// First input buffer (bulk-copy source, wgmma A fragments).
    pub input: u64,
    /// Second input buffer (the cluster probe's mailbox, wgmma initial accumulators).
    pub input2: u64,
    /// Output buffer.
    pub out: u64,
    /// Probe-specific arguments.
    pub args: [u32; 8],
}

/// Bytes before a probe's data in dynamic shared memory: its mbarriers (the data stays
/// 1024-byte aligned, as the 128-byte swizzle needs).
pub const PROBE_BARRIER_BYTES: u32 = 1024;
/// Status word a probe writes after its data: every wait completed.
pub const PROBE_OK: u32 = 0x600D;
/// Status word when a wait gave up ([`PROBE_WAIT_LIMIT_NS`]): the hardware disagreed with the
/// probe's expectation of when a phase completes (the model reports a deadlock instead).
pub const PROBE_TIMED_OUT: u32 = 0xDEAD;
/// How long a probe waits for one mbarrier phase before it records [`PROBE_TIMED_OUT`] and goes
/// on (so that a disagreement cannot hang the GPU test), in `%globaltimer` nanoseconds.
pub const PROBE_WAIT_LIMIT_NS: u64 = 2_000_000_000;

/// `tma_probe`: threads of its one CTA.
pub const TMA_PROBE_THREADS: u32 = 128;
/// `tma_probe`: largest 2D box (bytes) plus bulk copy (bytes) it can hold.
pub const TMA_PROBE_MAX_BYTES: u32 = 128 * 128 + 1024;
/// `tma_probe` `args`: innermost box coordinate (elements, as i32).
pub const TMA_ARG_C0: usize = 0;
/// `tma_probe` `args`: outer box coordinate (rows, as i32).
pub const TMA_ARG_C1: usize = 1;
/// `tma_probe` `args`: bytes of the 2D box (the tile lands at the start of the data region).
pub const TMA_ARG_BOX_BYTES: usize = 2;
/// `tma_probe` `args`: bytes of the bulk copy from `input` (a multiple of 16, may be 0), landing
/// right after the box.
pub const TMA_ARG_BULK_BYTES: usize = 3;
/// `tma_probe` `args`: 0 = `arrive.expect_tx` before the copies (as the kernels do), 1 = after
/// them (the transaction count may go negative first).
pub const TMA_ARG_COPIES_FIRST: usize = 4;

/// The `tma_probe` launch: one CTA.
pub const fn tma_probe_launch() -> LaunchGeometry {
    LaunchGeometry {
        grid: 1,
        block: TMA_PROBE_THREADS,
        cluster: 1,
        smem_bytes: PROBE_BARRIER_BYTES + TMA_PROBE_MAX_BYTES,
    }
}

/// `sync_probe`: CTAs per cluster.
pub const SYNC_PROBE_CLUSTER: u32 = 2;
/// `sync_probe`: CTAs (two clusters).
pub const SYNC_PROBE_CTAS: u32 = 2 * SYNC_PROBE_CLUSTER;
/// `sync_probe`: threads per CTA (two warps: consumer in warp 0, producer in warp 1).
pub const SYNC_PROBE_THREADS: u32 = 64;
/// `sync_probe`: rounds of the two-stage ring (each stage is refilled three times).
pub const SYNC_RING_ROUNDS: u32 = 8;
/// `sync_probe`: stages of the ring.
pub const SYNC_RING_STAGES: u32 = 2;
/// `sync_probe`: bytes of each ring round's bulk copy (from `input + 16·round`).
pub const SYNC_RING_BYTES: u32 = 16;
/// `sync_probe`: rounds of the cluster ping-pong.
pub const SYNC_PINGPONG_ROUNDS: u32 = 4;
/// `sync_probe`: rounds of the all-thread gather.
pub const SYNC_GATHER_ROUNDS: u32 = 2;
/// `sync_probe`: words of output per CTA.
pub const SYNC_LOG_WORDS: u32 = 256;
/// `sync_probe` log: `[ctaid, nctaid, cluster_ctarank, cluster_nctarank, clusterid,
/// nclusterid, ntid, PROBE_OK]`, written by thread 0.
pub const SYNC_LOG_SREGS: u32 = 0;
/// `sync_probe` log: the 4 words the consumer read from the ring, per round.
pub const SYNC_LOG_RING: u32 = 8;
/// `sync_probe` log: the word each rank read from its mailbox, per ping-pong round.
pub const SYNC_LOG_PINGPONG: u32 = SYNC_LOG_RING + 4 * SYNC_RING_ROUNDS;
/// `sync_probe` log: `try_wait.parity 1` on a fresh barrier (1: passed at once).
pub const SYNC_LOG_FRESH: u32 = SYNC_LOG_PINGPONG + SYNC_PINGPONG_ROUNDS;
/// `sync_probe` log: per round and thread, the sum of the gather slots after the wait.
pub const SYNC_LOG_GATHER: u32 = 64;
/// `sync_probe` log: per thread, [`PROBE_OK`] or [`PROBE_TIMED_OUT`].
pub const SYNC_LOG_STATUS: u32 = SYNC_LOG_GATHER + SYNC_GATHER_ROUNDS * SYNC_PROBE_THREADS;
const _: () = assert!(SYNC_LOG_FRESH < SYNC_LOG_GATHER && SYNC_LOG_STATUS + SYNC_PROBE_THREADS <= SYNC_LOG_WORDS);
/// `sync_probe`: words of the mailbox (`input2`, zeroed): per cluster, rank 0's and rank 1's
/// word per round.
pub const SYNC_MAILBOX_WORDS: u32 = SYNC_PROBE_CTAS * SYNC_PINGPONG_ROUNDS;

/// The `sync_probe` launch: two clusters of two CTAs.
pub const fn sync_probe_launch() -> LaunchGeometry {
    LaunchGeometry {
        grid: SYNC_PROBE_CTAS,
        block: SYNC_PROBE_THREADS,
        cluster: SYNC_PROBE_CLUSTER,
        smem_bytes: PROBE_BARRIER_BYTES + SYNC_RING_STAGES * 128 + 4 * SYNC_PROBE_THREADS,
    }
}

/// `wgmma_probe_*`: threads (two warpgroups, each its own `wgmma`s on the same B tile).
pub const WGMMA_PROBE_THREADS: u32 = 256;
/// `wgmma_probe_*`: most 64-wide K chunks (each 4 k-steps of 16).
pub const WGMMA_PROBE_MAX_CHUNKS: u32 = 2;
/// `wgmma_probe_*` `args`: K chunks (1 or 2): B is `chunks` boxes of the token map at
/// K = 64·c, loaded with one TMA each.
pub const WGMMA_ARG_CHUNKS: usize = 0;
/// `wgmma_probe_*` `args`: scale-d of the first MMA (0: D = A·B, ignoring the initial
/// accumulators; 1: D += A·B).
pub const WGMMA_ARG_SCALE_D_FIRST: usize = 1;

/// The `wgmma_probe_*` launch for wgmma width `n` (16 or 128): one CTA, B tiles of `n` rows of
/// 128 bytes per chunk.
pub const fn wgmma_probe_launch(n: u32) -> LaunchGeometry {
    LaunchGeometry {
        grid: 1,
        block: WGMMA_PROBE_THREADS,
        cluster: 1,
        smem_bytes: PROBE_BARRIER_BYTES + WGMMA_PROBE_MAX_CHUNKS * n * 128,
    }
}
