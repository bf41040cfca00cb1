//! The compiled GEMM variants, one table: [`GEMM_KERNELS`] has a row per GEMM entry point of
//! `kernel/src/sm90/gemm.rs` — its exported name, its variant's configuration, the token operand
//! it reads. The variants ([`GemmConfig::ALL`]), the kernel names
//! ([`GemmConfig::kernel_name`], [`GemmConfig::w4a16_kernel_name`]) and the register cap of every
//! sm_90a kernel ([`REGISTER_CAPS`]) derive from it; the variant a problem needs
//! ([`config_for`]) picks among its configurations.
//!
//! A variant is its configuration (a constant here), its rows (one per token operand: W4A4 and
//! both W4A16 twins) and its entry points in `kernel/src/sm90/gemm.rs`, which assert at compile
//! time that each entry is a row and that the table has no other; `tests/tests/sm90_static.rs`
//! checks the committed PTX's GEMM entries and their `.maxnreg` against the table. Whether the
//! host's cost model considers a variant is the host's choice (`host/src/sm90/`).

use super::config::{
    GemmConfig, BLOCK_N, CHUNKS_PER_BOX, CONSUMER_WARPGROUPS, PRODUCER_REGISTERS, SMALL_TILE_M, TAIL_TILE_M, THREADS,
    WARPGROUP_THREADS,
};
use super::tokens::{DEQUANT_KERNEL, DEQUANT_MAX_REGISTERS};
use super::w4a16::Activations;
use crate::launch::REGISTERS_PER_SM;

impl GemmConfig {
    /// 16- or 128-token tiles (wgmma N = 16 or 128), 5 stages (`sm90_grouped_gemm`).
    pub const GENERAL: GemmConfig =
        GemmConfig { block_m: 128, narrow: SMALL_TILE_M, stages: 5, block_n: BLOCK_N, chunks: CHUNKS_PER_BOX };
    /// The decode variant (`sm90_grouped_gemm_decode`): only 16-token tiles, 4 stages of 256 K
    /// (26 KiB: two weight boxes), two CTAs per SM (registers capped at [`DECODE_MAX_REGISTERS`])
    /// so that each scheduler has twice the warps to hide the decode's latencies.
    pub const DECODE: GemmConfig = GemmConfig {
        block_m: SMALL_TILE_M,
        narrow: SMALL_TILE_M,
        stages: 4,
        block_n: BLOCK_N,
        chunks: 2 * CHUNKS_PER_BOX,
    };
    /// 128-token tiles whose group's last tile runs `wgmma m64n64k16` when the group's last rows
    /// fit 64 (`sm90_grouped_gemm_t64`), 5 stages: less padding for prefill groups (b0 computes
    /// 1216 token rows instead of 1408). Every group's `block_m` (tile pitch and token box) is 128.
    pub const T64: GemmConfig =
        GemmConfig { block_m: 128, narrow: TAIL_TILE_M, stages: 5, block_n: BLOCK_N, chunks: CHUNKS_PER_BOX };
    /// 192 weight rows × 128 tokens per tile (`sm90_grouped_gemm_n192`): three consumer warpgroups
    /// read each token tile (a third fewer token bytes per MMA than `GENERAL`, three consumer warps
    /// per scheduler instead of two to hide the decode's latencies), the 64-wide last tiles of
    /// `T64`, 4 stages of 46 KiB. A tile's 192 rows span two 128-row blocks of B's scales (the
    /// second half of one and all of the next, or the reverse); where N ends inside a tile, the
    /// warpgroups whose rows lie past it only release the stages.
    pub const N192: GemmConfig =
        GemmConfig { block_m: 128, narrow: TAIL_TILE_M, stages: 4, block_n: 192, chunks: CHUNKS_PER_BOX };

    /// Every compiled variant: the configurations of [`GEMM_KERNELS`]' W4A4 rows, in its order.
    pub const ALL: [GemmConfig; VARIANTS] = {
        let mut all = [GemmConfig::GENERAL; VARIANTS];
        let (mut i, mut n) = (0, 0);
        while i < GEMM_KERNELS.len() {
            if GEMM_KERNELS[i].tokens.same_as(Tokens::Nvfp4) {
                all[n] = GEMM_KERNELS[i].config;
                n += 1;
            }
            i += 1;
        }
        all
    };

    /// The exported name of this variant's W4A4 kernel (NVFP4 tokens).
    pub const fn kernel_name(&self) -> &'static str {
        GemmKernel::of(*self, Tokens::Nvfp4).name
    }

    /// The exported name of this variant's W4A16 twin for `activations`: it shares everything with
    /// the W4A4 kernel but the token source and the decode's scales.
    pub const fn w4a16_kernel_name(&self, activations: Activations) -> &'static str {
        GemmKernel::of(*self, Tokens::Dense(activations)).name
    }
}

/// The token operand a GEMM kernel reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tokens {
    /// NVFP4 tokens, which [`DEQUANT_KERNEL`] turns into the f16 workspace first (W4A4).
    Nvfp4,
    /// The caller's 16-bit activations, against weights prepacked for them (W4A16,
    /// [`super::w4a16`]).
    Dense(Activations),
}

impl Tokens {
    /// Every token operand, in the order of a variant's rows.
    pub const ALL: [Tokens; 3] = [Tokens::Nvfp4, Tokens::Dense(Activations::F16), Tokens::Dense(Activations::Bf16)];

    /// `self == other` where a constant needs it (`PartialEq` is not `const`).
    pub const fn same_as(self, other: Tokens) -> bool {
        match (self, other) {
            (Tokens::Nvfp4, Tokens::Nvfp4) => true,
            (Tokens::Dense(a), Tokens::Dense(b)) => a as u8 == b as u8,
            _ => false,
        }
    }
}

/// A GEMM entry point: a row of [`GEMM_KERNELS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmKernel {
    /// The exported (`#[no_mangle]`) name of the entry point.
    pub name: &'static str,
    /// Its variant.
    pub config: GemmConfig,
    /// The token operand it reads.
    pub tokens: Tokens,
}

const NVFP4: Tokens = Tokens::Nvfp4;
const F16: Tokens = Tokens::Dense(Activations::F16);
const BF16: Tokens = Tokens::Dense(Activations::Bf16);

const fn row(name: &'static str, config: GemmConfig, tokens: Tokens) -> GemmKernel {
    GemmKernel { name, config, tokens }
}

/// Every sm_90a GEMM entry point, a variant's three together: the W4A4 kernel (named
/// `sm90_grouped_gemm` and the variant's suffix), its W4A16 twins for f16 (`sm90_w4a16_gemm`…)
/// and bf16 activations (`sm90_w4a16_bf16_gemm`…, the bf16 decoder and scales,
/// `wgmma ... .bf16.bf16`).
pub const GEMM_KERNELS: [GemmKernel; 12] = [
    row("sm90_grouped_gemm", GemmConfig::GENERAL, NVFP4),
    row("sm90_w4a16_gemm", GemmConfig::GENERAL, F16),
    row("sm90_w4a16_bf16_gemm", GemmConfig::GENERAL, BF16),
    row("sm90_grouped_gemm_t64", GemmConfig::T64, NVFP4),
    row("sm90_w4a16_gemm_t64", GemmConfig::T64, F16),
    row("sm90_w4a16_bf16_gemm_t64", GemmConfig::T64, BF16),
    row("sm90_grouped_gemm_decode", GemmConfig::DECODE, NVFP4),
    row("sm90_w4a16_gemm_decode", GemmConfig::DECODE, F16),
    row("sm90_w4a16_bf16_gemm_decode", GemmConfig::DECODE, BF16),
    row("sm90_grouped_gemm_n192", GemmConfig::N192, NVFP4),
    row("sm90_w4a16_gemm_n192", GemmConfig::N192, F16),
    row("sm90_w4a16_bf16_gemm_n192", GemmConfig::N192, BF16),
];

/// The number of variants: W4A4 rows of the table.
const VARIANTS: usize = {
    let (mut i, mut n) = (0, 0);
    while i < GEMM_KERNELS.len() {
        if GEMM_KERNELS[i].tokens.same_as(Tokens::Nvfp4) {
            n += 1;
        }
        i += 1;
    }
    n
};

impl GemmKernel {
    /// The register cap per thread (`.maxnreg`): its variant's ([`GemmConfig::max_registers`], what
    /// the variant's CTAs per SM leave each thread), the same for a W4A4 kernel and its twins.
    pub const fn max_registers(&self) -> u32 {
        self.config.max_registers()
    }

    /// The kernel of variant `config` that reads `tokens`. Every variant has one per token
    /// operand (asserted below); a configuration that is no variant panics (at compile time in a
    /// constant).
    pub const fn of(config: GemmConfig, tokens: Tokens) -> GemmKernel {
        let mut i = 0;
        while i < GEMM_KERNELS.len() {
            let k = GEMM_KERNELS[i];
            if k.config.same_as(&config) && k.tokens.same_as(tokens) {
                return k;
            }
            i += 1;
        }
        panic!("no sm_90a GEMM kernel of this configuration")
    }

    /// The kernel exported as `name`, if it is a GEMM kernel.
    pub const fn named(name: &str) -> Option<GemmKernel> {
        let mut i = 0;
        while i < GEMM_KERNELS.len() {
            if GEMM_KERNELS[i].is_named(name) {
                return Some(GEMM_KERNELS[i]);
            }
            i += 1;
        }
        None
    }

    /// Whether it is exported as `name` (a comparison constants can make).
    pub const fn is_named(&self, name: &str) -> bool {
        let (a, b) = (self.name.as_bytes(), name.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }
}

// Every row's configuration fits the hardware and is a variant; a variant has exactly one kernel
// per token operand; no two rows share a name.
const _: () = {
    let mut i = 0;
    while i < GEMM_KERNELS.len() {
        let k = GEMM_KERNELS[i];
        assert!(k.config.is_valid() && k.config.stage_bytes() % 1024 == 0);
        let mut variant = false;
        let mut v = 0;
        while v < VARIANTS {
            variant |= GemmConfig::ALL[v].same_as(&k.config);
            v += 1;
        }
        assert!(variant, "a W4A16 row whose configuration has no W4A4 kernel");
        let (mut j, mut same_kernel) = (0, 0);
        while j < GEMM_KERNELS.len() {
            let o = GEMM_KERNELS[j];
            assert!(i == j || !o.is_named(k.name), "two rows of one name");
            if o.config.same_as(&k.config) && o.tokens.same_as(k.tokens) {
                same_kernel += 1;
            }
            j += 1;
        }
        assert!(same_kernel == 1, "two kernels of one variant and token operand");
        i += 1;
    }
    assert!(GEMM_KERNELS.len() == VARIANTS * Tokens::ALL.len(), "a variant without all its W4A16 twins");
};

/// Register cap per thread of the 384-thread variants (`GENERAL`, `T64`): the SM's 65536
/// registers / 384, rounded down to 8 ([`GemmConfig::max_registers`]).
pub const MAX_REGISTERS: u32 = GemmConfig::GENERAL.max_registers();
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

/// Per-kernel register caps of the sm_90a module (`.maxnreg`, inserted into the PTX by
/// `cargo xtask build-ptx`, which fails on a name that is no entry of the PTX): every GEMM kernel
/// ([`GemmKernel::max_registers`]), then the token dequantization.
pub const REGISTER_CAPS: [(&str, u32); GEMM_KERNELS.len() + 1] = {
    let mut caps = [(DEQUANT_KERNEL, DEQUANT_MAX_REGISTERS); GEMM_KERNELS.len() + 1];
    let mut i = 0;
    while i < GEMM_KERNELS.len() {
        caps[i] = (GEMM_KERNELS[i].name, GEMM_KERNELS[i].max_registers());
        i += 1;
    }
    caps
};

/// Token rows per tile of a group of `m` tokens in the [`GemmConfig::GENERAL`] variant (what the
/// device-sized plans' scheduler uses): 16 for decode-sized groups, else 128. Each width is a
/// compiled copy of the consumer loop; ptxas keeps the MMAs of at most two widths in one function
/// pipelined (with three it serializes them, C7512), so each variant has two.
pub const fn token_tile_rows(m: u32) -> u32 {
    GemmConfig::GENERAL.tile_rows(m)
}

/// The configuration for a problem whose groups have these token counts: the decode variant
/// ([`GemmConfig::DECODE`], two CTAs per SM) when every group fits one 16-token tile, else the
/// general one ([`GemmConfig::GENERAL`], which runs 16-token tiles for the small groups among larger
/// ones). Device-sized plans (`crate::moe`) use it on their bound as is (their scheduler picks the
/// widths with [`token_tile_rows`]); host-sized plans may take [`GemmConfig::T64`] instead
/// where its balanced work list ends sooner.
pub fn config_for(mut m: impl Iterator<Item = u32>) -> GemmConfig {
    if m.all(|m| m <= SMALL_TILE_M) {
        GemmConfig::DECODE
    } else {
        GemmConfig::GENERAL
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_choice() {
        assert_eq!(config_for([4, 0, 16].into_iter()), GemmConfig::DECODE);
        assert_eq!(config_for([4, 17].into_iter()), GemmConfig::GENERAL);
        assert_eq!(config_for([16].into_iter()), GemmConfig::DECODE);
        assert_eq!(config_for([17].into_iter()), GemmConfig::GENERAL);
        let rows = [0, 1, 8, 16, 17, 64, 128, 600].map(token_tile_rows);
        assert_eq!(rows, [16, 16, 16, 16, 128, 128, 128, 128]);
    }

    /// The exported names the kernel crate's entry points have (a renamed entry is a changed
    /// interface for whoever launches or profiles it by name).
    #[test]
    fn kernel_names() {
        assert_eq!(GemmConfig::ALL, [GemmConfig::GENERAL, GemmConfig::T64, GemmConfig::DECODE, GemmConfig::N192]);
        assert_eq!(
            GemmConfig::ALL.map(|c| c.kernel_name()),
            ["sm90_grouped_gemm", "sm90_grouped_gemm_t64", "sm90_grouped_gemm_decode", "sm90_grouped_gemm_n192"]
        );
        assert_eq!(
            GemmConfig::ALL.map(|c| c.w4a16_kernel_name(Activations::F16)),
            ["sm90_w4a16_gemm", "sm90_w4a16_gemm_t64", "sm90_w4a16_gemm_decode", "sm90_w4a16_gemm_n192"]
        );
        assert_eq!(
            GemmConfig::ALL.map(|c| c.w4a16_kernel_name(Activations::Bf16)),
            [
                "sm90_w4a16_bf16_gemm",
                "sm90_w4a16_bf16_gemm_t64",
                "sm90_w4a16_bf16_gemm_decode",
                "sm90_w4a16_bf16_gemm_n192"
            ]
        );
        for k in GEMM_KERNELS {
            assert_eq!(GemmKernel::named(k.name), Some(k));
            assert_eq!(GemmKernel::of(k.config, k.tokens), k);
        }
        assert_eq!(GemmKernel::named(DEQUANT_KERNEL), None);
        assert_eq!(GemmKernel::named("sm90_grouped_gemm_t6"), None);
    }

    #[test]
    fn registers_and_threads() {
        assert_eq!(THREADS, 384);
        assert_eq!(MAX_REGISTERS, 168);
        assert_eq!((PRODUCER_REGISTERS, CONSUMER_REGISTERS), (40, 232));
        assert_eq!(DECODE_MAX_REGISTERS, 96);
        // Every GEMM kernel has its variant's cap (the W4A16 twins their W4A4 kernel's), the
        // dequantization 64.
        let cap = |name: &str| REGISTER_CAPS.iter().find(|(n, _)| *n == name).map(|&(_, r)| r);
        assert_eq!(
            GemmConfig::ALL.map(|c| Tokens::ALL.map(|t| cap(GemmKernel::of(c, t).name))),
            [[Some(168); 3], [Some(168); 3], [Some(96); 3], [Some(128); 3]]
        );
        assert_eq!((REGISTER_CAPS.len(), cap(DEQUANT_KERNEL)), (13, Some(64)));
    }
}
