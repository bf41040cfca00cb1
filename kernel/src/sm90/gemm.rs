//! `sm90_grouped_gemm`: persistent, warp-specialized swap-AB GEMM over all tiles of all groups.
//!
//! CTA = 3 warpgroups. Warpgroup 0 is the producer (one thread issues every load); warpgroups 1
//! and 2 are consumers, each owning 64 of the tile's 128 weight rows. Per stage of 256 K values the
//! producer loads, completing on `full[stage]`:
//! - the packed FP4 token tile (`block_m` rows × 128 bytes, 128B swizzle) and its scale blocks,
//! - the packed FP4 weight tile (128 rows × 128 bytes, 128B swizzle) and its scale blocks.
//!
//! Consumers, per stage: wait on `full[stage]`; decode the token tile to f16 (each of the 256
//! consumer threads one row × one 64-chunk) into the stage's f16 token buffer, in the permuted,
//! swizzled layout wgmma reads; `fence.proxy.async` + a barrier of the 256 consumer threads; then
//! per chunk decode 8 bytes (16 e2m1 = one scale block) of each of their two weight rows into A
//! fragments and issue 4 × `wgmma m64n64k16`. The ring stage is released as soon as its bytes are
//! in registers or in the f16 buffer (no MMA reads the ring). The epilogue scales by alpha, rounds
//! once to f16/bf16 and stores the tile, masking rows ≥ M and columns ≥ N.

use crate::ptx::mbarrier::{Mbarrier, RingState};
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::{barrier, convert, fence, sreg, tma, wgmma};
use nvfp4_gemm_abi::scale_layout::rest_k;
use nvfp4_gemm_abi::sm90::*;

const CFG: GemmConfig = GemmConfig::M64;
const STAGES: u32 = CFG.stages;
type Ring = RingState<STAGES>;

struct Smem {
    base: SmemAddr,
}

impl Smem {
    #[inline(always)]
    fn stage(&self, s: u32) -> SmemAddr {
        self.base.add(s * CFG.stage_bytes())
    }
    #[inline(always)]
    fn token_buffer(&self, b: u32) -> SmemAddr {
        self.base.add(CFG.token_buffer_offset() + b * CFG.token_buffer_bytes())
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
    let sm = Smem { base: smem::dynamic_base() };
    let tid = sreg::tid_x();
    if tid == 0 {
        for s in 0..STAGES {
            sm.full(s).init(1);
            sm.empty(s).init(4 * CONSUMER_WARPGROUPS);
        }
        fence::mbarrier_init();
    }
    barrier::sync_all();
    let warpgroup = sreg::warp_id() / 4;
    if warpgroup == 0 {
        if tid == 0 {
            produce(&sm, &p);
        }
    } else {
        consume(&sm, &p, warpgroup - 1, tid % 128);
    }
}

#[inline(always)]
unsafe fn produce(sm: &Smem, p: &KernelParams) {
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
        let (m0, n0) = (t.m_tile as u32 * CFG.block_m, t.n_tile as u32 * BLOCK_N);
        // Scale blocks of the 128-row blocks holding the tile's rows (contiguous along K).
        let rk = rest_k(g.k) as usize;
        let a_scales = (g.a_scales as *const u8).add((m0 / 128) as usize * rk * 512);
        let b_scales = (g.b_scales as *const u8).add((n0 / 128) as usize * rk * 512);
        for ks in 0..g.k.div_ceil(BLOCK_K) {
            let chunks = valid_chunks(g.k, ks);
            sm.empty(ring.stage).wait(ring.phase ^ 1);
            let full = sm.full(ring.stage);
            let stage = sm.stage(ring.stage);
            let k_bytes = (ks * BLOCK_K / 2) as i32;
            let scale_off = ks as usize * CHUNKS_PER_STAGE as usize * 512;
            full.arrive_expect_tx(CFG.stage_tx_bytes(chunks));
            tma::load_2d(stage.add(CFG.token_offset()), token_map, k_bytes, m0 as i32, full);
            tma::load_1d(stage.add(CFG.token_scale_offset()), a_scales.add(scale_off), chunks * 512, full);
            tma::load_2d(stage.add(CFG.weight_offset()), weight_map, k_bytes, n0 as i32, full);
            tma::load_1d(stage.add(CFG.weight_scale_offset()), b_scales.add(scale_off), chunks * 512, full);
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

/// Byte offset of 16-byte unit `u` (0..8) of row `r` in a 128B-swizzled tile of 128-byte rows.
#[inline(always)]
fn swizzled(r: u32, u: u32) -> u32 {
    r * 128 + ((u ^ (r % 8)) * 16)
}

/// Byte offset of row `r`'s scale word in a 512-byte 128x4 scale block.
#[inline(always)]
fn scale_word(r: u32) -> u32 {
    (r % 32) * 16 + ((r % 128) / 32) * 4
}

/// Decodes one token row × one 64-chunk (32 packed bytes, 4 scales) from the ring stage into the
/// f16 token buffer, K permuted as `token_k_position` says.
#[inline(always)]
unsafe fn decode_token_chunk(stage: SmemAddr, buffer: SmemAddr, row: u32, scale_row: u32, c: u32) {
    let src = stage.add(CFG.token_offset());
    let lo = smem::ld_v4_u32(src.add(swizzled(row, 2 * c)));
    let hi = smem::ld_v4_u32(src.add(swizzled(row, 2 * c + 1)));
    let packed = [lo[0], lo[1], lo[2], lo[3], hi[0], hi[1], hi[2], hi[3]];
    let sw = smem::ld_u32(stage.add(CFG.token_scale_offset() + 512 * c + scale_word(scale_row)));
    let scale = [
        convert::e4m3_byte_to_f16x2(sw, 0),
        convert::e4m3_byte_to_f16x2(sw, 1),
        convert::e4m3_byte_to_f16x2(sw, 2),
        convert::e4m3_byte_to_f16x2(sw, 3),
    ];
    let mut out = [0u32; 32];
    for w in 0..8usize {
        let pairs = convert::e2m1x8_to_f16x2(packed[w]);
        for i in 0..4 {
            // Byte b holds logical values 2b, 2b+1 = 16q + 4j + {0,1} or {2,3}: see token_k_position.
            let b = 4 * w + i;
            out[8 * ((b % 8) / 2) + b / 8 + 4 * (b % 2)] = convert::mul_f16x2(pairs[i], scale[b / 8]);
        }
    }
    let dst = buffer.add(c * CFG.token_chunk_bytes());
    for u in 0..8usize {
        let v = [out[4 * u], out[4 * u + 1], out[4 * u + 2], out[4 * u + 3]];
        smem::st_v4_u32(dst.add(swizzled(row, u as u32)), v);
    }
}

#[inline(always)]
unsafe fn consume(sm: &Smem, p: &KernelParams, cw: u32, t: u32) {
    let groups = p.groups as *const GroupParams;
    let tiles = p.tiles as *const Tile;
    let (warp, lane) = (t / 32, t % 32);
    let (g8, q) = (lane / 4, lane % 4);
    // The thread's two weight rows within the 128-row tile.
    let r0 = cw * WG_ROWS + 16 * warp + g8;
    let r1 = r0 + 8;
    // Token decoding: consumer thread u takes token row u/4, chunk u%4.
    let u = cw * 128 + t;
    let (token_row, token_chunk) = (u / 4, u % 4);
    // Byte offset (inside the 128B-swizzled weight box) of the thread's 8 bytes of chunk c.
    let w_off = |r: u32, c: u32| swizzled(r, 2 * c + q / 2) + (q % 2) * 8;
    let mut ring = Ring::START;
    let mut buffer = 0u32;
    let mut i = sreg::ctaid_x();
    while i < p.tile_count {
        let tile = *tiles.add(i as usize);
        let g = *groups.add(tile.group as usize);
        let m0 = tile.m_tile as u32 * CFG.block_m;
        let mut acc = [0f32; 32];
        for ks in 0..g.k.div_ceil(BLOCK_K) {
            let chunks = valid_chunks(g.k, ks);
            sm.full(ring.stage).wait(ring.phase);
            let stage = sm.stage(ring.stage);
            let tokens = sm.token_buffer(buffer);
            if token_chunk < chunks {
                decode_token_chunk(stage, tokens, token_row, m0 + token_row, token_chunk);
            }
            fence::proxy_async_shared();
            barrier::sync(CONSUMER_BARRIER, CONSUMER_THREADS);
            // Unrolled, so each chunk's A fragments live in their own registers: decoding chunk
            // c+1 overlaps the MMAs of chunk c, and no fragment is rewritten while an MMA in
            // flight may read it (at most two groups are ever pending).
            for c in 0..CHUNKS_PER_STAGE {
                if c < chunks {
                    let wbase = stage.add(CFG.weight_offset());
                    let sbase = stage.add(CFG.weight_scale_offset() + 512 * c);
                    let s0 = convert::e4m3_byte_to_f16x2(smem::ld_u32(sbase.add(scale_word(r0))), q);
                    let s1 = convert::e4m3_byte_to_f16x2(smem::ld_u32(sbase.add(scale_word(r1))), q);
                    let a0 = dequant16(smem::ld_v2_u32(wbase.add(w_off(r0, c))), s0);
                    let a1 = dequant16(smem::ld_v2_u32(wbase.add(w_off(r1, c))), s1);
                    let desc = WgmmaDesc::k_major_sw128(tokens.add(c * CFG.token_chunk_bytes()).0);
                    wgmma::fence();
                    for j in 0..4 {
                        let frag = [a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1]];
                        wgmma::mma_m64n64k16(&mut acc, frag, desc.advance(32 * j as u32).0, 1);
                    }
                    wgmma::commit_group();
                    wgmma::wait_group_fenced_n64::<1>(&mut acc);
                }
            }
            // Every byte of the ring stage is now in registers or in the f16 buffer.
            if lane == 0 {
                sm.empty(ring.stage).arrive();
            }
            ring.advance();
            buffer = if buffer + 1 == TOKEN_BUFFERS { 0 } else { buffer + 1 };
        }
        wgmma::wait_group_fenced_n64::<0>(&mut acc);
        store_tile(&acc, &g, tile, cw, warp, g8, q, p.out_bf16 != 0);
        i += sreg::nctaid_x();
    }
}

/// Writes the warpgroup's 64 × `block_m` accumulator tile to C (transposed: C is tokens × weights).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn store_tile(acc: &[f32; 32], g: &GroupParams, tile: Tile, cw: u32, warp: u32, g8: u32, q: u32, bf16: bool) {
    let c = g.c as *mut u16;
    let n_base = tile.n_tile as u32 * BLOCK_N + cw * WG_ROWS + 16 * warp + g8;
    let m_base = tile.m_tile as u32 * CFG.block_m + 2 * q;
    for (i, &v) in acc.iter().enumerate() {
        let i = i as u32;
        let n = n_base + 8 * ((i / 2) % 2);
        let m = m_base + 8 * (i / 4) + (i % 2);
        if m < g.m && n < g.n {
            let x = v * g.alpha;
            let bits = if bf16 { convert::f32_to_bf16(x) } else { convert::f32_to_f16(x) };
            *c.add(m as usize * g.n as usize + n as usize) = bits;
        }
    }
}
