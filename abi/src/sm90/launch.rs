//! Launch geometry of the GEMM and the token dequantization, and the GEMM's early start.

use super::config::GemmConfig;
use super::tokens::DEQUANT_THREADS;
use crate::launch::LaunchGeometry;

/// The GEMM kernels may start before the token dequantization that precedes them has finished
/// (programmatic dependent launch): only the token producer thread
/// ([`ProducerRole::Tokens`](super::ProducerRole::Tokens)) reads what the dequantization wrote (the
/// workspace, through TMA), and it executes `griddepcontrol.wait` before its first token load,
/// while the weight producer already fills the ring with weights; the dequantization lets it be
/// scheduled at its start (`griddepcontrol.launch_dependents`). The host launches the GEMM with
/// programmatic stream serialization when a dequantization precedes it in the same call.
pub const GEMM_STARTS_EARLY: bool = true;

/// Every thread of the GEMM kernels executes `griddepcontrol.launch_dependents` at its start:
/// a kernel launched early after a GEMM (programmatic stream serialization) is scheduled as soon
/// as the GEMM's CTAs all run, and must wait (`griddepcontrol.wait`) before it touches what the
/// GEMM writes. The host launches early after a GEMM only kernels that wait first (a following
/// plan's scheduler) and the general GEMM after the decode one, which reads only its scheduler's
/// tables and the weights before its wait. After a plain launch the instruction has no effect.
pub const GEMM_RELEASES_AT_START: bool = true;

/// The GEMM launch for `work_len` tiles on `sm_count` SMs: a persistent grid of at most
/// [`GemmConfig::ctas_per_sm`] CTAs per SM (at least one CTA), the configuration's threads and
/// shared memory.
pub const fn gemm_launch(cfg: GemmConfig, work_len: u32, sm_count: u32) -> LaunchGeometry {
    let resident = sm_count * cfg.ctas_per_sm();
    let grid = if work_len < resident { work_len } else { resident };
    LaunchGeometry {
        grid: if grid == 0 { 1 } else { grid },
        block: cfg.threads(),
        cluster: 1,
        smem_bytes: cfg.dynamic_shared_memory(),
    }
}

/// The token-dequantization launch over `ctas` CTAs (at least one).
pub const fn dequant_launch(ctas: u32) -> LaunchGeometry {
    LaunchGeometry { grid: if ctas == 0 { 1 } else { ctas }, block: DEQUANT_THREADS, cluster: 1, smem_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use crate::launch::LaunchGeometry;
    use crate::sm90::*;

    #[test]
    fn launches() {
        let c = GemmConfig::GENERAL;
        assert_eq!(
            gemm_launch(c, 6, 132),
            LaunchGeometry { grid: 6, block: 384, cluster: 1, smem_bytes: c.dynamic_shared_memory() }
        );
        assert_eq!(gemm_launch(c, 1000, 132).grid, 132);
        assert_eq!(gemm_launch(c, 0, 132).grid, 1);
        // The decode variant: two CTAs per SM.
        let d = GemmConfig::DECODE;
        assert_eq!(gemm_launch(d, 10_000, 132).grid, 264);
        assert_eq!(gemm_launch(c, 10_000, 132).grid, 132);
        assert_eq!(gemm_launch(d, 10, 132).block, 320);
        assert_eq!(dequant_launch(0), LaunchGeometry { grid: 1, block: 256, cluster: 1, smem_bytes: 0 });
    }
}
