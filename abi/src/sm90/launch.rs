//! Launch geometry of the GEMM and the token dequantization, and the register caps of every
//! sm_90a kernel (`.maxnreg`) with the shares `setmaxnreg` moves between the GEMM's roles.

use super::config::{GemmConfig, CONSUMER_WARPGROUPS, THREADS, WARPGROUP_THREADS};
use super::tokens::DEQUANT_THREADS;
use super::w4a16::Activations;
use crate::launch::{LaunchGeometry, REGISTERS_PER_SM};

/// Register cap per thread of the 384-thread variants (`GENERAL`, `T64`): the SM's 65536
/// registers / 384, rounded down to 8 ([`GemmConfig::max_registers`]).
pub const MAX_REGISTERS: u32 = GemmConfig::GENERAL.max_registers();
/// Registers per thread the producer warpgroup keeps after `setmaxnreg.dec` (one thread issues
/// copies; 40 is plenty).
pub const PRODUCER_REGISTERS: u32 = 40;
/// Registers per thread each consumer warpgroup of the 384-thread variants takes with
/// `setmaxnreg.inc` ([`GemmConfig::consumer_registers`]): what the producer gave back, shared by
/// the consumers, a multiple of 8. The pool is what the CTA was launched with (`MAX_REGISTERS` per
/// thread), not the SM's 65536: `setmaxnreg.inc` waits until the registers it asks for are free in
/// the CTA, so asking for more than the CTA holds never returns (a hang on the H200 when the
/// producer kept 48 and the consumers asked for 232: 65536 > 64512).
pub const CONSUMER_REGISTERS: u32 = GemmConfig::GENERAL.consumer_registers();
const _: () = assert!(
    WARPGROUP_THREADS * (PRODUCER_REGISTERS + CONSUMER_WARPGROUPS * CONSUMER_REGISTERS) <= MAX_REGISTERS * THREADS
        && CONSUMER_REGISTERS <= 256
);
const _: () = assert!(MAX_REGISTERS * THREADS <= REGISTERS_PER_SM);

/// Register cap of the decode variant: two CTAs of [`DECODE_THREADS`](super::DECODE_THREADS) per SM
/// ([`GemmConfig::max_registers`]).
pub const DECODE_MAX_REGISTERS: u32 = GemmConfig::DECODE.max_registers();
/// Register cap of the token-dequantization kernel (256-thread CTAs, several per SM).
pub const DEQUANT_MAX_REGISTERS: u32 = 64;
/// The exported name of the token-dequantization kernel.
pub const DEQUANT_KERNEL: &str = "sm90_dequant_tokens";
/// Per-kernel register caps of the sm_90a module (`.maxnreg`, inserted into the PTX by
/// `cargo xtask build-ptx`, which fails on a name that is no entry of the PTX): each kernel is
/// sized for a number of resident CTAs.
pub const REGISTER_CAPS: [(&str, u32); 13] = [
    gemm_cap(GemmConfig::GENERAL),
    gemm_cap(GemmConfig::T64),
    gemm_cap(GemmConfig::DECODE),
    gemm_cap(GemmConfig::N192),
    (DEQUANT_KERNEL, DEQUANT_MAX_REGISTERS),
    w4a16_cap(GemmConfig::GENERAL, Activations::F16),
    w4a16_cap(GemmConfig::T64, Activations::F16),
    w4a16_cap(GemmConfig::DECODE, Activations::F16),
    w4a16_cap(GemmConfig::N192, Activations::F16),
    w4a16_cap(GemmConfig::GENERAL, Activations::Bf16),
    w4a16_cap(GemmConfig::T64, Activations::Bf16),
    w4a16_cap(GemmConfig::DECODE, Activations::Bf16),
    w4a16_cap(GemmConfig::N192, Activations::Bf16),
];

/// A W4A16 variant's kernel name and register cap (its W4A4 twin's).
const fn w4a16_cap(cfg: GemmConfig, activations: Activations) -> (&'static str, u32) {
    (super::w4a16::kernel_name_of(cfg, activations), cfg.max_registers())
}

/// A GEMM variant's kernel name and register cap.
const fn gemm_cap(cfg: GemmConfig) -> (&'static str, u32) {
    (cfg.kernel_name(), cfg.max_registers())
}

/// The GEMM kernels may start before the token dequantization that precedes them has finished
/// (programmatic dependent launch): only the token producer thread
/// ([`ProducerRole::Tokens`](super::ProducerRole::Tokens)) reads what the dequantization wrote (the
/// workspace, through TMA), and it executes `griddepcontrol.wait` before its first token load,
/// while the weight producer already fills the ring with weights; the dequantization lets it be
/// scheduled at its start (`griddepcontrol.launch_dependents`). The host launches the GEMM with
/// programmatic stream serialization when a dequantization precedes it in the same call.
pub const GEMM_STARTS_EARLY: bool = true;

/// The GEMM launch for `work_len` tiles on `sm_count` SMs: a persistent grid of at most one CTA
/// per SM (at least one CTA), [`THREADS`] threads, the configuration's shared memory.
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
    fn registers_and_threads() {
        assert_eq!(THREADS, 384);
        assert_eq!(MAX_REGISTERS, 168);
        assert_eq!((PRODUCER_REGISTERS, CONSUMER_REGISTERS), (40, 232));
        assert_eq!(DECODE_MAX_REGISTERS, 96);
    }

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
