//! `sm90_grouped_gemm`: persistent, warp-specialized swap-AB GEMM over all tiles of all groups.
//!
//! CTA = 3 warpgroups (4 in `sm90_grouped_gemm_n192`; two consumer warpgroups and two producer
//! warps in the decode variant). Warpgroup 0 is the producer (two threads in different warps issue
//! the TMAs, see [`ProducerRole`]); the others are consumers, each owning 64 of the tile's 128
//! (192) weight rows. Per stage of 128 K values (256 in the decode variant, `GemmConfig::chunks`)
//! the producers load, completing on `full[stage]`:
//! - per 64-chunk, a `block_m × 64` f16 token box (128-byte swizzle) from the workspace (past K,
//!   zeros),
//! - per two chunks, a `block_n × 64`-byte box of packed weights (64-byte swizzle),
//! - the weights' scale blocks (per 128-row block of B's scales the tile's rows lie in, one
//!   contiguous 512-byte block per chunk, bulk copy).
//!
//! Consumers wait on `full[stage]`, and per chunk: load 8 bytes (16 e2m1 = one scale block) of each
//! of their two weight rows, decode to f16 and multiply by the block scale (exact), which gives the
//! A fragments of 4 wgmma k-steps; then `wgmma m64n128k16` against the token tile. After the stage
//! each consumer warp arrives on `empty[stage]` so the producer can refill it.
//! The epilogue scales by alpha, rounds once to f16/bf16, turns the tile into C's orientation in a
//! shared-memory buffer per warpgroup (`stmatrix .trans`) and copies whole token rows to C in
//! 16-byte stores, masking rows ≥ M and columns ≥ N.
//!
//! This module holds the variants and entry points and sets the CTA up; the producers and the
//! consumers' K loop are in [`super::mainloop`], the store of C in [`super::epilogue`].

use super::{mainloop, SharedMap, Variant};
use crate::ptx::smem;
use crate::ptx::wgmma::{self, MmaShape};
use crate::ptx::{barrier, fence, sreg, warp};
use nvfp4_gemm_abi::sm90::*;

// A consumer's stage code is unrolled over at most 4 chunks; the weight fragment offsets of a
// tile are computed for the two chunks of a box.
const _: () = {
    let mut i = 0;
    while i < GemmConfig::ALL.len() {
        assert!(GemmConfig::ALL[i].chunks <= 4 && GemmConfig::ALL[i].chunks % CHUNKS_PER_BOX == 0);
        i += 1;
    }
    assert!(CHUNKS_PER_BOX == 2);
};

// Each variant has one name: its `GemmConfig` constant, its type here and its entry points'
// suffix (the abi's `GEMM_KERNELS` names them; the entries of `GENERAL` have none).

/// 16- and 128-token tiles, 5 stages, one CTA per SM.
struct General;
impl Variant for General {
    const CFG: GemmConfig = GemmConfig::GENERAL;
    type Narrow = wgmma::N16;
    type Wide = wgmma::N128;
    const ACTIVATION_EPILOGUE: bool = true;
}

/// 128-token tiles whose group's last tile runs 64 wide when its rows fit, 5 stages, one CTA per SM.
struct T64;
impl Variant for T64 {
    const CFG: GemmConfig = GemmConfig::T64;
    type Narrow = wgmma::N64;
    type Wide = wgmma::N128;
    const ACTIVATION_EPILOGUE: bool = true;
}

/// 192 weight rows (three consumer warpgroups) × 128-token tiles, the group's last tile 64 wide
/// when its rows fit, 4 stages, one CTA per SM.
struct N192;
impl Variant for N192 {
    const CFG: GemmConfig = GemmConfig::N192;
    type Narrow = wgmma::N64;
    type Wide = wgmma::N128;
    fn grow_registers() {
        warp::setmaxnreg_inc::<{ GemmConfig::N192.consumer_registers() }>();
    }
    fn shrink_registers() {
        warp::setmaxnreg_dec::<{ GemmConfig::N192.producer_registers() }>();
    }
    const EAGER_LOADS: bool = false;
}

/// 16-token tiles only, 4 stages of 256 K, two CTAs per SM.
struct Decode;
impl Variant for Decode {
    const CFG: GemmConfig = GemmConfig::DECODE;
    type Narrow = wgmma::N16;
    type Wide = wgmma::N16;
    const EAGER_LOADS: bool = false;
}

/// The W4A16 twin of variant `V` (f16 activations, or bf16 ones with `BF16`; prepacked weights):
/// `V`'s tiles, stages and registers, with `Variant::W4A16`.
struct W4a16<V, const BF16: bool>(core::marker::PhantomData<V>);
impl<V: Variant, const BF16: bool> Variant for W4a16<V, BF16> {
    const CFG: GemmConfig = V::CFG;
    type Narrow = V::Narrow;
    type Wide = V::Wide;
    fn grow_registers() {
        V::grow_registers()
    }
    fn shrink_registers() {
        V::shrink_registers()
    }
    const EAGER_LOADS: bool = V::EAGER_LOADS;
    const W4A16: bool = true;
    const BF16_ACTIVATIONS: bool = BF16;
    const UNSCALE: f32 = if BF16 { (1u32 << w4a16::BF16_PRODUCT_EXPONENT) as f32 } else { DECODE_UNSCALE };
}

/// The token operand variant `V` reads, as the abi's table says it.
const fn token_operand<V: Variant>() -> Tokens {
    if !V::W4A16 {
        Tokens::Nvfp4
    } else if V::BF16_ACTIVATIONS {
        Tokens::Dense(w4a16::Activations::Bf16)
    } else {
        Tokens::Dense(w4a16::Activations::F16)
    }
}

/// The GEMM's entry points: `$name` runs variant `$variant` with its stages. Each must be the
/// abi's row ([`GEMM_KERNELS`]) of its variant's configuration and token operand, and the table
/// has no row without an entry (asserted at compile time); on the host, `ENTRY_POINTS` lists them
/// by name for the device model.
macro_rules! gemm_entries {
    ($($(#[$doc:meta])* $name:ident: $variant:ty;)*) => {
        $(
            $(#[$doc])*
            #[crate::ptx::kernel]
            pub unsafe fn $name(p: KernelParams) {
                // SAFETY: the caller's contract.
                unsafe { run::<$variant, { <$variant as Variant>::CFG.stages }>(&p) }
            }
            const _: () = assert!(
                GemmKernel::of(<$variant as Variant>::CFG, token_operand::<$variant>()).is_named(stringify!($name)),
                concat!("`", stringify!($name), "` is not GEMM_KERNELS' name of its variant and tokens"),
            );
        )*
        const _: () =
            assert!([$(stringify!($name)),*].len() == GEMM_KERNELS.len(), "a row of GEMM_KERNELS without entry");

        /// Every GEMM entry point with its exported name (the host build, whose device model
        /// launches the kernels by name).
        #[cfg(not(target_arch = "nvptx64"))]
        pub const ENTRY_POINTS: [(&str, unsafe fn(KernelParams)); GEMM_KERNELS.len()] =
            [$((stringify!($name), $name)),*];
    };
}

const _: () = assert!(GemmConfig::GENERAL.narrow == 16 && GemmConfig::T64.narrow == 64);
const _: () = assert!(GemmConfig::DECODE.narrow == 16 && GemmConfig::DECODE.block_m == 16);
const _: () = {
    assert!(<General as Variant>::Wide::N == GemmConfig::GENERAL.block_m);
    assert!(<T64 as Variant>::Wide::N == GemmConfig::T64.block_m);
    assert!(<N192 as Variant>::Wide::N == GemmConfig::N192.block_m);
    assert!(<Decode as Variant>::Wide::N == GemmConfig::DECODE.block_m);
};
const _: () = assert!(GemmConfig::N192.narrow == 64 && GemmConfig::N192.block_m == 128);

gemm_entries! {
    /// See the module docs. Launch: `nvfp4_gemm_abi::sm90::gemm_launch(GemmConfig::GENERAL, ..)`
    /// (`THREADS` threads, `GENERAL.dynamic_shared_memory()` bytes, a persistent grid of at most one
    /// CTA per SM).
    ///
    /// # Safety
    /// `p` and the tables it points to must be what the host's sm90 plan writes for validated
    /// buffers.
    sm90_grouped_gemm: General;

    /// The 64/128 variant: as [`sm90_grouped_gemm`] with 128-token tiles only, except that a group's
    /// last tile runs `wgmma m64n64k16` when its rows fit 64. Launch:
    /// `gemm_launch(GemmConfig::T64, ..)`.
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm`], and every group's `block_m` is 128.
    sm90_grouped_gemm_t64: T64;

    /// The 192-weight-row variant: as [`sm90_grouped_gemm_t64`] with tiles of 192 weight rows and
    /// three consumer warpgroups. Launch: `gemm_launch(GemmConfig::N192, ..)`.
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm_t64`].
    sm90_grouped_gemm_n192: N192;

    /// The decode variant, for problems whose groups all have at most `SMALL_TILE_M` tokens. Launch:
    /// `gemm_launch(GemmConfig::DECODE, ..)` (two CTAs per SM).
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm`], and every group's `block_m` is `SMALL_TILE_M`.
    sm90_grouped_gemm_decode: Decode;

    /// W4A16 on `GENERAL`'s tiles: as [`sm90_grouped_gemm`], with each group's tokens the caller's
    /// f16 activations `[m, K]` in natural order (`GroupParams::workspace` and the token maps point
    /// at them) and its weights prepacked (`nvfp4_gemm_abi::sm90::w4a16`, f16). No dequantization
    /// precedes it. Launch: `gemm_launch(GemmConfig::GENERAL, ..)`.
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm`], the weights prepacked.
    sm90_w4a16_gemm: W4a16<General, false>;

    /// W4A16 on `DECODE`'s tiles: as [`sm90_w4a16_gemm`] for groups of at most `SMALL_TILE_M`
    /// tokens. Launch: `gemm_launch(GemmConfig::DECODE, ..)` (two CTAs per SM).
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm_decode`], the weights prepacked.
    sm90_w4a16_gemm_decode: W4a16<Decode, false>;

    /// W4A16 on `T64`'s tiles: as [`sm90_w4a16_gemm`] with [`sm90_grouped_gemm_t64`]'s tiles.
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm_t64`], the weights prepacked.
    sm90_w4a16_gemm_t64: W4a16<T64, false>;

    /// W4A16 on `N192`'s tiles: as [`sm90_w4a16_gemm`] with [`sm90_grouped_gemm_n192`]'s tiles.
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm_n192`], the weights prepacked.
    sm90_w4a16_gemm_n192: W4a16<N192, false>;

    /// [`sm90_w4a16_gemm`] with bf16 activations, the weights prepacked for them (the bf16
    /// decoder and scales, `wgmma ... .bf16.bf16`, the epilogue's unscale `2^7`).
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm`], the weights prepacked for bf16.
    sm90_w4a16_bf16_gemm: W4a16<General, true>;

    /// [`sm90_w4a16_gemm_decode`] with bf16 activations.
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm_decode`], the weights prepacked for bf16.
    sm90_w4a16_bf16_gemm_decode: W4a16<Decode, true>;

    /// [`sm90_w4a16_gemm_t64`] with bf16 activations.
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm_t64`], the weights prepacked for bf16.
    sm90_w4a16_bf16_gemm_t64: W4a16<T64, true>;

    /// [`sm90_w4a16_gemm_n192`] with bf16 activations.
    ///
    /// # Safety
    /// As [`sm90_grouped_gemm_n192`], the weights prepacked for bf16.
    sm90_w4a16_bf16_gemm_n192: W4a16<N192, true>;
}

/// One CTA of variant `V` (`STAGES` = `V::CFG.stages`, as a const generic for the rings).
///
/// # Safety
/// As [`sm90_grouped_gemm`].
#[inline(always)]
unsafe fn run<V: Variant, const STAGES: u32>(p: &KernelParams) {
    const { assert!(V::CFG.stages == STAGES) };
    if GEMM_RELEASES_AT_START {
        barrier::grid_launch_dependents();
    }
    if V::W4A16 && w4a16::GEMM_WAITS_FIRST {
        // No dequantization precedes a W4A16 GEMM: a device-sized plan launches it early, right
        // after its scheduler, so every thread waits before reading the scheduler's tables.
        barrier::grid_dependency_wait();
    }
    let p = *p;
    let st = SharedMap::<V> { base: smem::dynamic_base(), variant: core::marker::PhantomData };
    let tid = sreg::tid_x();
    if tid == 0 {
        for s in 0..STAGES {
            // SAFETY: before the CTA barrier below, nobody else touches the barriers.
            unsafe {
                st.full().get(s).init(V::CFG.full_barrier_arrivals());
                st.empty().get(s).init(V::CFG.empty_barrier_arrivals());
            }
        }
        fence::mbarrier_init();
    }
    // SAFETY: every thread of the CTA reaches it.
    unsafe { barrier::sync_all() };
    // SAFETY: one thread per producer role, every consumer thread; `p` is valid (the caller's
    // contract).
    unsafe {
        match V::CFG.consumer_thread(tid) {
            None => {
                // Registers move from the producer (two threads issue copies) to the consumers;
                // the decode variant has two producer warps only and no registers to spare.
                if V::CFG.ctas_per_sm() == 1 {
                    V::shrink_registers();
                }
                // One call per role, so that each inlined copy of `produce` has its role as a
                // constant.
                match V::CFG.producer_role(tid) {
                    Some(ProducerRole::Weights) => mainloop::produce::<V, STAGES>(&st, &p, ProducerRole::Weights),
                    Some(ProducerRole::Tokens) => mainloop::produce::<V, STAGES>(&st, &p, ProducerRole::Tokens),
                    None => {}
                }
            }
            Some((cw, t)) => {
                if V::CFG.ctas_per_sm() == 1 {
                    V::grow_registers();
                }
                mainloop::consume::<V, STAGES>(&st, &p, cw, t);
            }
        }
    }
}
