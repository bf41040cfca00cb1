//! sm_90a (Hopper) kernels: the exact NVFP4 grouped GEMM through f16 wgmma (see
//! `nvfp4_gemm_abi::sm90` for the design and the shared parameters).
//!
//! - [`dequant`]: `sm90_dequant_tokens`, the token operand A → the f16 workspace;
//! - [`gemm`]: the GEMM's entry points, one per compiled [`Variant`], and the CTA's setup;
//! - [`mainloop`]: the producers' copies and the consumers' K loop (decode + wgmma);
//! - [`epilogue`]: alpha, one rounding, and C stored through the epilogue buffer;
//! - [`schedule`]: device-resident group sizes → group table and work list;
//! - [`prepack`]: `sm90_w4a16_prepack`, W4A16 weights prepacked on the GPU.

/// Expands `$body` once per listed value of `$i` (a literal), so that array indices in it are
/// constants: LLVM does not fully unroll a 64-iteration loop with branches, and an accumulator
/// array indexed by a loop variable would live in local memory.
macro_rules! unrolled {
    ($i:ident in [$($n:literal),*] $body:block) => {
        $({
            let $i: usize = $n;
            $body
        })*
    };
}

pub mod dequant;
pub mod epilogue;
pub mod gemm;
pub mod mainloop;
pub mod prepack;
pub mod schedule;

use crate::pipeline::Barriers;
use crate::ptx::smem::SmemAddr;
use crate::ptx::warp;
use crate::ptx::wgmma::MmaShape;
use crate::work::WorkCursor;
use nvfp4_gemm_abi::sm90::{
    GemmConfig, GroupParams, RowSpan, WorkItem, BLOCK_N, CONSUMER_REGISTERS, DECODE_UNSCALE, PRODUCER_REGISTERS,
};

/// 16 bytes, so that loads and stores through it become `ld.v4`/`st.v4`.
#[repr(C, align(16))]
#[derive(Clone, Copy)]
pub(crate) struct U32x4(pub [u32; 4]);

type Work<'a> = WorkCursor<'a, GroupParams>;

/// A compiled variant of the kernel: its configuration (tile heights, stages, shared memory) and
/// the wgmma width of its narrow tiles (`CFG.narrow`).
trait Variant {
    const CFG: GemmConfig;
    type Narrow: MmaShape;
    /// The wgmma width of its full tiles (`CFG.block_m`).
    type Wide: MmaShape;
    /// `setmaxnreg.inc` to the consumers' share ([`GemmConfig::consumer_registers`]; a constant of
    /// each variant, as the instruction takes an immediate).
    fn grow_registers() {
        warp::setmaxnreg_inc::<CONSUMER_REGISTERS>();
    }
    /// `setmaxnreg.dec` to the producer's share ([`GemmConfig::producer_registers`]).
    fn shrink_registers() {
        warp::setmaxnreg_dec::<PRODUCER_REGISTERS>();
    }
    /// Whether a consumer loads a chunk's weights and scales before decoding the previous one
    /// (their latencies overlap the decode) or just before decoding it, and reads the group's
    /// parameters again for the epilogue instead of keeping them through the K loop (registers
    /// fewer, for a variant whose consumers have less than 176).
    const EAGER_LOADS: bool = true;
    /// Whether the variant has the MoE block's activation epilogue (`ActivationEpilogue`): the
    /// configurations of device-sized plans' general kernels
    /// (`nvfp4_gemm_abi::moe::sm90::GENERAL_CONFIGS`), NVFP4 tokens. The decode variant leaves it
    /// out: its registers (two CTAs per SM) do not hold it without spilling.
    const ACTIVATION_EPILOGUE: bool = false;
    /// W4A16 (`nvfp4_gemm_abi::sm90::w4a16`): the tokens are the caller's f16 activations in
    /// natural K order and the weights prepacked, so a consumer thread's chunk touches all four
    /// scale blocks (one per k-step) instead of block `q`.
    const W4A16: bool = false;
    /// W4A16 with bf16 activations: the prepacked weights decode to bf16
    /// (`convert::prepacked_e2m1x8_to_16x2`, the scales `convert::e5m3_pair_to_bf16x2`) and the
    /// MMAs are `wgmma ... .f32.bf16.bf16`.
    const BF16_ACTIVATIONS: bool = false;
    /// The power of two the consumers' products lack, which the epilogue multiplies back:
    /// `2^DECODE_EXPONENT` (f16 decode), `2^BF16_PRODUCT_EXPONENT` (bf16 decode).
    const UNSCALE: f32 = DECODE_UNSCALE;
}

/// The CTA's dynamic shared memory as `V::CFG` lays it out.
struct SharedMap<V> {
    base: SmemAddr,
    variant: core::marker::PhantomData<V>,
}

impl<V: Variant> SharedMap<V> {
    /// Stage `s` (1024-byte aligned).
    #[inline(always)]
    fn stage(&self, s: u32) -> SmemAddr {
        self.base.add(V::CFG.stage_offset(s))
    }
    #[inline(always)]
    fn full(&self) -> Barriers {
        Barriers::at(self.base.add(V::CFG.full_barrier_offset(0)))
    }
    #[inline(always)]
    fn empty(&self) -> Barriers {
        Barriers::at(self.base.add(V::CFG.empty_barrier_offset(0)))
    }
    /// Consumer warpgroup `cw`'s epilogue buffer.
    #[inline(always)]
    fn epilogue(&self, cw: u32) -> SmemAddr {
        self.base.add(V::CFG.epilogue_buffer_offset(cw))
    }
}

/// The first weight row of work item `t`: its 128-row tile's, or its [`RowSpan`]'s in `N192`.
#[inline(always)]
fn tile_row0<V: Variant>(t: WorkItem) -> u32 {
    if V::CFG.block_n == BLOCK_N {
        t.tile_n * BLOCK_N
    } else {
        RowSpan::decode(t.tile_n).row0()
    }
}
