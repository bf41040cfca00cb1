//! `sm90_grouped_gemm`: persistent, warp-specialized swap-AB GEMM over all tiles of all groups.
//!
//! CTA = 3 warpgroups. Warpgroup 0 is the producer (one thread issues every TMA); warpgroups 1 and 2
//! are consumers, each owning 64 of the tile's 128 weight rows. Per stage of 128 K values the
//! producer loads, completing on `full[stage]`:
//! - per valid 64-chunk, a `block_m × 64` f16 token box (128-byte swizzle) from the workspace,
//! - a `128 × 64`-byte box of packed weights (64-byte swizzle),
//! - the weights' scale blocks (one contiguous 512-byte block per chunk, bulk copy).
//!
//! Consumers wait on `full[stage]`, and per chunk: load 8 bytes (16 e2m1 = one scale block) of each
//! of their two weight rows, decode to f16 and multiply by the block scale (exact), which gives the
//! A fragments of 4 wgmma k-steps; then `wgmma m64n128k16` against the token tile. After the stage
//! each consumer warp arrives on `empty[stage]` so the producer can refill it.
//! The epilogue scales by alpha, rounds once to f16/bf16 and stores the tile, masking rows ≥ M and
//! columns ≥ N.

use crate::ptx::mbarrier::{Mbarrier, RingState};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{barrier, convert, fence, sreg, tma, warp, wgmma};
use nvfp4_gemm_abi::sm90::*;

const CFG: GemmConfig = GemmConfig::M128;
// The consumer loads both chunks of a stage up front (`load(0)`, `load(1)`).
const _: () = assert!(CHUNKS_PER_STAGE == 2);
const STAGES: u32 = CFG.stages;
type Ring = RingState<STAGES>;

struct Stages {
    base: SmemAddr,
}

impl Stages {
    #[inline(always)]
    fn stage(&self, s: u32) -> SmemAddr {
        self.base.add(s * CFG.stage_bytes())
    }
    #[inline(always)]
    fn full(&self, s: u32) -> Mbarrier {
        Mbarrier(self.base.add(CFG.barrier_offset() + 8 * s))
    }
    #[inline(always)]
    fn empty(&self, s: u32) -> Mbarrier {
        Mbarrier(self.base.add(CFG.barrier_offset() + 8 * (STAGES + s)))
    }
}

/// See the module docs. Launch: `THREADS` threads, `CFG.dynamic_shared_memory()` bytes, a
/// persistent grid of at most one CTA per SM.
#[no_mangle]
pub unsafe extern "ptx-kernel" fn sm90_grouped_gemm(p: KernelParams) {
    let st = Stages { base: smem::dynamic_base() };
    let tid = sreg::tid_x();
    if tid == 0 {
        for s in 0..STAGES {
            st.full(s).init(1);
            // Every consumer thread arrives: each thread's own shared reads of the stage are then
            // ordered before the refill by its own release (one arrival per warp left the other
            // lanes' reads unordered, and racecheck reported it).
            st.empty(s).init(128 * CONSUMER_WARPGROUPS);
        }
        fence::mbarrier_init();
    }
    barrier::sync_all();
    let warpgroup = sreg::warp_id() / 4;
    if warpgroup == 0 {
        if tid == 0 {
            produce(&st, &p);
        }
    } else {
        consume(&st, &p, warpgroup - 1, tid % 128);
    }
}

#[inline(always)]
unsafe fn produce(st: &Stages, p: &KernelParams) {
    let groups = p.groups as *const GroupParams;
    let tiles = p.tiles as *const Tile;
    let maps = p.tensor_maps as *const tma::TensorMap;
    let mut ring = Ring::START;
    let mut i = sreg::ctaid_x();
    while i < p.tile_count {
        let t = *tiles.add(i as usize);
        let g = *groups.add(t.group as usize);
        let token_map = maps.add(2 * t.group as usize);
        let weight_map = maps.add(2 * t.group as usize + 1);
        let scale_row_block =
            (g.b_scales as *const u8).add(t.n_tile as usize * nvfp4_gemm_abi::scale_layout::rest_k(g.k) as usize * 512);
        let k_stages = g.k.div_ceil(BLOCK_K);
        for ks in 0..k_stages {
            let chunks = valid_chunks(g.k, ks);
            st.empty(ring.stage).wait(ring.phase ^ 1);
            let full = st.full(ring.stage);
            let stage = st.stage(ring.stage);
            full.arrive_expect_tx(CFG.stage_tx_bytes(chunks));
            for c in 0..chunks {
                tma::load_2d(
                    stage.add(CFG.token_offset() + c * CFG.token_chunk_bytes()),
                    token_map,
                    (ks * BLOCK_K + c * CHUNK_K) as i32,
                    (t.m_tile as u32 * CFG.block_m) as i32,
                    full,
                );
            }
            tma::load_2d(
                stage.add(CFG.weight_offset()),
                weight_map,
                (ks * BLOCK_K / 2) as i32,
                (t.n_tile as u32 * BLOCK_N) as i32,
                full,
            );
            tma::load_1d(
                stage.add(CFG.scale_offset()),
                scale_row_block.add(ks as usize * CHUNKS_PER_STAGE as usize * 512),
                chunks * 512,
                full,
            );
            ring.advance();
        }
        i += sreg::nctaid_x();
    }
}

/// The f16x2 pairs of 16 e2m1 values (8 bytes, `w`) times their block scale `s` (f16x2).
#[inline(always)]
fn dequant16(w: [u32; 2], s: u32) -> [u32; 8] {
    let lo = convert::e2m1x8_to_f16x2(w[0]);
    let hi = convert::e2m1x8_to_f16x2(w[1]);
    [
        convert::mul_f16x2(lo[0], s),
        convert::mul_f16x2(lo[1], s),
        convert::mul_f16x2(lo[2], s),
        convert::mul_f16x2(lo[3], s),
        convert::mul_f16x2(hi[0], s),
        convert::mul_f16x2(hi[1], s),
        convert::mul_f16x2(hi[2], s),
        convert::mul_f16x2(hi[3], s),
    ]
}

#[inline(always)]
unsafe fn consume(st: &Stages, p: &KernelParams, cw: u32, t: u32) {
    let groups = p.groups as *const GroupParams;
    let tiles = p.tiles as *const Tile;
    let (warp, lane) = (t / 32, t % 32);
    let (g8, q) = (lane / 4, lane % 4);
    // The thread's two weight rows within the 128-row tile.
    let r0 = cw * WG_ROWS + 16 * warp + g8;
    let r1 = r0 + 8;
    // Byte offsets (inside the 64B-swizzled weight box: 16-byte unit u of row r lands at unit
    // u ^ ((r / 2) % 4)) of the thread's 8 bytes of chunk c, and of its rows' scale words inside a
    // chunk's 512-byte scale block.
    let w_off = |r: u32, c: u32| r * WEIGHT_ROW_BYTES + (((2 * c + q / 2) ^ ((r / 2) % 4)) * 16) + (q % 2) * 8;
    let s_off = |r: u32| (r % 32) * 16 + (r / 32) * 4;
    let mut ring = Ring::START;
    let mut i = sreg::ctaid_x();
    while i < p.tile_count {
        let tile = *tiles.add(i as usize);
        let g = *groups.add(tile.group as usize);
        let mut acc = [0f32; 64];
        let k_stages = g.k.div_ceil(BLOCK_K);
        // The stage whose last MMAs may still be reading it; released once they are known done.
        let mut pending: Option<u32> = None;
        for ks in 0..k_stages {
            let chunks = valid_chunks(g.k, ks);
            st.full(ring.stage).wait(ring.phase);
            let stage = st.stage(ring.stage);
            // Unrolled, so each chunk's A fragments live in their own registers: decoding chunk
            // c+1 overlaps the MMAs of chunk c, and no fragment is rewritten while an MMA in
            // flight may read it (at most two groups are ever pending).
            // All of the stage's shared loads first, in one basic block, so their latencies
            // overlap each other and the first chunk's decoding (in the K tail the loads of an
            // absent chunk read stale bytes that are never used).
            let wbase = stage.add(CFG.weight_offset());
            let load = |c: u32| {
                let sbase = stage.add(CFG.scale_offset() + 512 * c);
                (
                    [smem::ld_v2_u32(wbase.add(w_off(r0, c))), smem::ld_v2_u32(wbase.add(w_off(r1, c)))],
                    [smem::ld_u32(sbase.add(s_off(r0))), smem::ld_u32(sbase.add(s_off(r1)))],
                )
            };
            let (raw0, sw0) = load(0);
            let (raw1, sw1) = load(1);
            let raw = [raw0, raw1];
            let scale_words = [sw0, sw1];
            for c in 0..CHUNKS_PER_STAGE {
                if c < chunks {
                    let (rw, sw) = (raw[c as usize], scale_words[c as usize]);
                    let a0 = dequant16(rw[0], convert::e4m3_byte_to_f16x2(sw[0], q));
                    let a1 = dequant16(rw[1], convert::e4m3_byte_to_f16x2(sw[1], q));
                    let tokens =
                        WgmmaDesc::k_major_sw128(stage.add(CFG.token_offset() + c * CFG.token_chunk_bytes()).0);
                    wgmma::fence();
                    for j in 0..4 {
                        let frag = [a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1]];
                        wgmma::mma_m64n128k16(&mut acc, frag, tokens.advance(32 * j as u32).0, 1);
                    }
                    wgmma::commit_group();
                    // Everything but this chunk's group is done: the previous stage is free.
                    wgmma::wait_group_fenced_n128::<1>(&mut acc);
                    if c == 0 {
                        if let Some(prev) = pending.take() {
                            st.empty(prev).arrive();
                        }
                    }
                }
            }
            pending = Some(ring.stage);
            ring.advance();
        }
        wgmma::wait_group_fenced_n128::<0>(&mut acc);
        if let Some(prev) = pending {
            st.empty(prev).arrive();
        }
        store_tile(&acc, &g, tile, cw, warp, g8, q, p.out_bf16 != 0);
        i += sreg::nctaid_x();
    }
}

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

/// Writes the warpgroup's 64 × 128 accumulator tile to C (transposed: C is tokens × weights).
///
/// Register i of lane (g, q) holds D[n = n_base + g + 8·((i/2)%2)][m = m_base + 2q + 8·(i/4) + i%2].
/// Lanes g and g^1 (lane ^ 4) hold neighbouring n for the same m, so one shuffle per register pair
/// gives each lane two adjacent elements of one row of C: even g stores C[m even][g, g+1], odd g
/// stores C[m odd][g-1, g], as one 4-byte store (N is a multiple of 8, so a pair never straddles N).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn store_tile(acc: &[f32; 64], g: &GroupParams, tile: Tile, cw: u32, warp: u32, g8: u32, q: u32, bf16: bool) {
    let c = g.c as *mut u16;
    let odd = g8 % 2;
    let n_pair = tile.n_tile as u32 * BLOCK_N + cw * WG_ROWS + 16 * warp + (g8 - odd);
    let m_base = tile.m_tile as u32 * CFG.block_m + 2 * q + odd;
    unrolled!(quad in [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15] {
        for half in 0..2usize {
            // Registers 4·quad + 2·half (+1): rows n and n+8 alternate by half.
            let i = 4 * quad + 2 * half;
            let send = if odd == 0 { acc[i + 1] } else { acc[i] };
            let got = f32::from_bits(warp::shfl_xor(send.to_bits(), 4));
            let (lo, hi) = if odd == 0 { (acc[i], got) } else { (got, acc[i + 1]) };
            let n = n_pair + 8 * half as u32;
            let m = m_base + 8 * quad as u32;
            if m < g.m && n < g.n {
                let (lo, hi) = (lo * g.alpha, hi * g.alpha);
                let bits = if bf16 { convert::f32x2_to_bf16x2(lo, hi) } else { convert::f32x2_to_f16x2(lo, hi) };
                *(c.add(m as usize * g.n as usize + n as usize) as *mut u32) = bits;
            }
        }
    });
}
