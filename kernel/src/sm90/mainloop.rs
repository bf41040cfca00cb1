//! The GEMM's main loop: two producer threads fill a ring of shared-memory stages with TMA and
//! bulk copies; each consumer warpgroup decodes its weight rows into wgmma A fragments and
//! multiplies them against the stage's token chunks, then hands the tile to the epilogue.

use super::{epilogue, tile_row0, SharedMap, Variant, Work};
use crate::pipeline::{Consumer, Producer, Scope, Stage};
use crate::ptx::mbarrier::Mbarrier;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::wgmma::MmaShape;
use crate::ptx::{barrier, convert, tma, wgmma};
use nvfp4_gemm_abi::scale_layout::{rest_k, BLOCK_BYTES as SCALE_BLOCK_BYTES};
use nvfp4_gemm_abi::sm90::*;

/// A producer thread (`role`, see [`ProducerRole`]): per stage, its half of the copies —
/// the weight box and the weight scale blocks, or the token chunks — with its own
/// `arrive.expect_tx` on the stage's full barrier (which counts both producers' arrivals). Both
/// walk the same work list and ring, each waiting for the consumers' release of a stage.
///
/// Every stage is loaded with all its chunks: past K, a token box lies wholly out of bounds (the
/// TMA writes zeros and credits its bytes like any box), the weight boxes' columns likewise, and
/// the stage's first scale block is copied again into each such chunk's place (finite scales for
/// the zero weights, so the chunk adds exact zeros where a consumer computes it).
///
/// # Safety
/// One thread per role in the CTA; barriers initialized; `p` valid.
#[inline(always)]
pub(super) unsafe fn produce<V: Variant, const STAGES: u32>(st: &SharedMap<V>, p: &KernelParams, role: ProducerRole) {
    let mut work = Work::new(p);
    let mut ring = Producer::<STAGES>::new(st.full(), st.empty(), Scope::Cta);
    // The token producer has not yet waited for the token dequantization (W4A16 has none: its
    // threads waited at the start, `w4a16::GEMM_WAITS_FIRST`).
    let mut before_tokens = !(V::W4A16 && w4a16::GEMM_WAITS_FIRST);
    // SAFETY: the list holds `work_len` items; each names a group of the table.
    while let Some(t) = unsafe { work.next_item() } {
        // SAFETY: as above.
        let g = unsafe { work.group(t.group) };
        match role {
            ProducerRole::Weights => {
                let weight_map = work.tensor_map(weight_map_index(t.group));
                // The 128-row blocks of B's blocked scales the tile's rows lie in: one for
                // 128-row tiles.
                let (first_block, slots) = if V::CFG.block_n == BLOCK_N {
                    (t.tile_n, 1)
                } else {
                    let span = RowSpan::decode(t.tile_n);
                    (span.first_scale_block(), span.scale_blocks(g.n))
                };
                let scale_row_block = (g.b_scales as *const u8)
                    .wrapping_add(first_block as usize * rest_k(g.k) as usize * SCALE_BLOCK_BYTES as usize);
                let tx = V::CFG.weight_tx_bytes(slots);
                fill_tile(st, &mut ring, V::CFG.k_stages(g.k), tx, |buf, full, ks| {
                    let chunks = V::CFG.valid_chunks(g.k, ks);
                    // SAFETY: the map is the group's, the stage is free (acquired), the scale
                    // blocks of the valid chunks lie inside B's scale buffer (validated by the
                    // host).
                    unsafe {
                        for b in 0..V::CFG.weight_boxes() {
                            tma::load_2d(
                                buf.add(V::CFG.weight_box_offset(b)),
                                weight_map,
                                ((ks * V::CFG.weight_boxes() + b) * WEIGHT_ROW_BYTES) as i32,
                                tile_row0::<V>(t) as i32,
                                full,
                            );
                        }
                        for slot in 0..slots {
                            let first = scale_row_block
                                .add(((slot * rest_k(g.k) + ks * V::CFG.chunks) * SCALE_BLOCK_BYTES) as usize);
                            tma::load_1d(
                                buf.add(V::CFG.scale_block_offset(slot, 0)),
                                first,
                                chunks * SCALE_BLOCK_BYTES,
                                full,
                            );
                            for c in chunks..V::CFG.chunks {
                                tma::load_1d(
                                    buf.add(V::CFG.scale_block_offset(slot, c)),
                                    first,
                                    SCALE_BLOCK_BYTES,
                                    full,
                                );
                            }
                        }
                    }
                });
            }
            ProducerRole::Tokens => {
                // The group's last tile loads only its own rows, from its own map.
                let last_tile = (t.tile_m + 1) * g.block_m >= g.m;
                let (token_map, token_rows) = if last_tile {
                    (work.tensor_map(g.tail_token_map as usize), g.tail_rows)
                } else {
                    (work.tensor_map(g.token_map as usize), g.block_m)
                };
                let row = (g.token_row + t.tile_m * g.block_m) as i32;
                let tx = V::CFG.token_tx_bytes(token_rows);
                if before_tokens {
                    // The workspace is written by the token dequantization, which this grid may
                    // overlap (`GEMM_STARTS_EARLY`): wait for it before the first token load, but
                    // after reading the first item, its group and map, which the host or the
                    // scheduler wrote before the dequantization began (the weight loads start
                    // without waiting).
                    tma::prefetch_tensormap(token_map);
                    barrier::grid_dependency_wait();
                    before_tokens = false;
                }
                fill_tile(st, &mut ring, V::CFG.k_stages(g.k), tx, |buf, full, ks| {
                    // SAFETY: the map is the group's, the stage is free (acquired).
                    unsafe {
                        for c in 0..V::CFG.chunks {
                            let k = (ks * V::CFG.block_k() + c * CHUNK_K) as i32;
                            tma::load_2d(buf.add(V::CFG.token_offset(c)), token_map, k, row, full);
                        }
                    }
                });
            }
        }
    }
    if role == ProducerRole::Tokens && before_tokens {
        // A CTA without work still waits, so that this grid never ends before the
        // dequantization it overlaps (the kernels after it in the stream rely on that).
        barrier::grid_dependency_wait();
    }
}

/// A producer's pass over one tile: per stage `ks` of `stages`, wait for the consumers' release,
/// announce `tx_bytes` on the stage's full barrier, issue `copies(stage buffer, full barrier, ks)`
/// (each completing on that barrier) and move on.
#[inline(always)]
fn fill_tile<V: Variant, const STAGES: u32>(
    st: &SharedMap<V>,
    ring: &mut Producer<STAGES>,
    stages: u32,
    tx_bytes: u32,
    mut copies: impl FnMut(SmemAddr, Mbarrier, u32),
) {
    for ks in 0..stages {
        let stage = ring.acquire();
        stage.full.arrive_expect_tx(tx_bytes);
        copies(st.stage(stage.index), stage.full, ks);
        ring.commit(stage);
    }
}

/// The f16x2 pairs of 16 e2m1 values (8 bytes, `w`) times their block scale, one half of `s`
/// (`HIGH`: the upper; f16): each value comes out as `value · scale · 2⁻¹⁴`, exact in f16
/// (`convert::e4m3_bytes_to_f16x2`: multiples of 2⁻²⁴ of at most 6 significant bits, magnitudes
/// in [2⁻²⁴, 0.17], subnormal below 2⁻¹⁴); the epilogue multiplies the 2¹⁴ back in. Pair `p`
/// holds values `8·(p/4) + p%4` and that plus 4 (see `token_k_position`).
#[inline(always)]
fn dequant16<const HIGH: bool>(w: [u32; 2], s: u32) -> [u32; 8] {
    let lo = convert::e2m1x8_to_f16x2_scaled(w[0]);
    let hi = convert::e2m1x8_to_f16x2_scaled(w[1]);
    let m = convert::mul_f16x2_by_half::<HIGH>;
    [m(lo[0], s), m(lo[1], s), m(lo[2], s), m(lo[3], s), m(hi[0], s), m(hi[1], s), m(hi[2], s), m(hi[3], s)]
}

/// [`dequant16`] for W4A16's prepacked weights, with the scale of pair `p` in `s[p / 2]` (one
/// half, `HIGH`): pair `p` holds the natural columns of k-step `p / 2`, which lie in scale block
/// `p / 2` (`nvfp4_gemm_abi::sm90::w4a16::packed_column`). Decoded by
/// `convert::prepacked_e2m1x8_to_16x2` (f16 values ×2⁻¹⁴, or `BF16` values ×2⁻¹²⁶) and multiplied
/// by the scales (f16 e4m3 scales, or bf16 `|scale|·2¹¹⁹`): the products `value · scale · 2⁻¹⁴`
/// (f16) or `value · |scale| · 2⁻⁷` (bf16), exact in the 16-bit type.
#[inline(always)]
fn dequant16_per_step<const HIGH: bool, const BF16: bool>(w: [u32; 2], s: [u32; 4]) -> [u32; 8] {
    let lo = convert::prepacked_e2m1x8_to_16x2::<BF16>(w[0]);
    let hi = convert::prepacked_e2m1x8_to_16x2::<BF16>(w[1]);
    let m = if BF16 {
        convert::mul_bf16x2_by_half::<HIGH> as fn(u32, u32) -> u32
    } else {
        convert::mul_f16x2_by_half::<HIGH> as fn(u32, u32) -> u32
    };
    [
        m(lo[0], s[0]),
        m(lo[1], s[0]),
        m(lo[2], s[1]),
        m(lo[3], s[1]),
        m(hi[0], s[2]),
        m(hi[1], s[2]),
        m(hi[2], s[3]),
        m(hi[3], s[3]),
    ]
}

/// A consumer warpgroup (`cw`, thread `t` of 128): per tile, the K loop of decode + wgmma, then
/// the epilogue.
///
/// # Safety
/// Every thread of consumer warpgroup `cw`; barriers initialized; `p` valid.
#[inline(always)]
pub(super) unsafe fn consume<V: Variant, const STAGES: u32>(st: &SharedMap<V>, p: &KernelParams, cw: u32, t: u32) {
    let mut work = Work::new(p);
    let mut ring = Consumer::<STAGES>::new(st.full(), st.empty());
    let bf16 = p.out_bf16 != 0;
    // SAFETY: the list holds `work_len` items; each names a group of the table.
    while let Some(tile) = unsafe { work.next_item() } {
        // SAFETY: as above.
        let g = unsafe { work.group(tile.group) };
        // One compiled copy of the tile loop per wgmma width; `tile_width` picks it (the decode
        // variant compiles the narrow width only).
        // SAFETY: as this function's.
        unsafe {
            if V::CFG.block_m == V::CFG.narrow || V::CFG.tile_width(g.m, g.block_m, tile.tile_m) == V::CFG.narrow {
                consume_tile::<V, STAGES, V::Narrow>(st, &mut ring, p, &g, tile, cw, t, bf16)
            } else {
                consume_tile::<V, STAGES, V::Wide>(st, &mut ring, p, &g, tile, cw, t, bf16)
            }
        }
    }
}

/// One tile of `S::N` tokens × 128 weights: every K stage (decode + wgmma), then the epilogue.
///
/// # Safety
/// As [`consume`]; `S::N` is the tile's `tile_width`.
#[inline(always)]
unsafe fn consume_tile<V: Variant, const STAGES: u32, S: MmaShape>(
    st: &SharedMap<V>,
    ring: &mut Consumer<STAGES>,
    p: &KernelParams,
    g: &GroupParams,
    tile: WorkItem,
    cw: u32,
    t: u32,
    bf16: bool,
) {
    let (warp, lane) = (t / 32, t % 32);
    let (g8, q) = (lane / 4, lane % 4);
    // The thread's two weight rows within the tile, and where their scales are: the stage's scale
    // slot and the rows within that 128-row block (a warpgroup's 64 rows never straddle one).
    let r0 = cw * WG_ROWS + 16 * warp + lane_group_row(g8);
    let r1 = r0 + 8;
    let (slot, s0) = if V::CFG.block_n == BLOCK_N {
        (0, r0)
    } else {
        let row = tile_row0::<V>(tile) + r0;
        (row / BLOCK_N - RowSpan::decode(tile.tile_n).first_scale_block(), row % BLOCK_N)
    };
    let s1 = s0 + 8;
    if V::CFG.block_n != BLOCK_N && cw >= RowSpan::decode(tile.tile_n).warpgroups {
        // The item's rows end before this warpgroup's: nothing to compute or store, but the
        // stages are released like every consumer's (the empty barriers count all of them).
        for _ in 0..V::CFG.k_stages(g.k) {
            ring.wait().release();
        }
        return;
    }
    // Stage 0's first token chunk; every other chunk's descriptor is this one advanced by its
    // offset (one addition: shared addresses stay inside the 14-bit field, `WgmmaDesc::advance`).
    let tokens0 = WgmmaDesc::k_major_sw128(st.stage(0).add(V::CFG.token_offset(0)).0);
    let mut acc: wgmma::Accumulators = [0.0; 64];
    // The stage whose last MMAs may still be reading it; released once they are known done.
    let mut pending: Option<Stage> = None;
    const { assert!(STAGES <= 8, "the unrolled ring has 8 copies") };
    let rows = FragmentRows {
        weights: [
            [weight_fragment_offset(r0, 0, q), weight_fragment_offset(r1, 0, q)],
            [weight_fragment_offset(r0, 1, q), weight_fragment_offset(r1, 1, q)],
        ],
        scales: [
            V::CFG.scale_block_offset(slot, 0) + scale_word_offset(s0),
            V::CFG.scale_block_offset(slot, 0) + scale_word_offset(s1),
        ],
        q,
    };
    let stages = V::CFG.k_stages(g.k);
    // One copy of the stage per ring index, so that every shared-memory offset, descriptor and
    // barrier of a stage is a constant (199 instructions per stage in the decode variant, against
    // 235 with the index a variable); a tile starts wherever the ring stands (the first pass skips
    // the copies before it) and ends after its last stage.
    let mut ks = 0;
    'tile: loop {
        unrolled!(s in [0, 1, 2, 3, 4, 5, 6, 7] {
            if (s as u32) < STAGES && ring.next_index() == s as u32 {
                if ks == stages {
                    break 'tile;
                }
                let stage = ring.wait_at(s as u32);
                // SAFETY: as this function's.
                unsafe { consume_stage::<V, S>(st, stage, rows, tokens0, &mut acc, &mut pending) };
                ks += 1;
            }
        });
    }
    S::wait::<0>(&mut acc);
    if let Some(prev) = pending {
        prev.release();
    }
    // SAFETY: the tile's group indexes the table (read again where registers are short).
    let (g, bf16) = if V::EAGER_LOADS {
        (*g, bf16)
    } else {
        (unsafe { *(p.groups as *const GroupParams).add(tile.group as usize) }, p.out_bf16 != 0)
    };
    // SAFETY: C of the group is valid for `m × n` elements (validated by the host); every thread
    // of the warpgroup stores.
    unsafe { epilogue::store_tile::<V, S>(st, &acc, &g, tile, bf16, &p.epilogue) };
}

/// Where the thread's fragments lie in a stage, computed once per tile: its two weight rows'
/// 8-byte words per chunk of a weight box (offsets from the box, swizzle undone; chunk `c` of the
/// stage is chunk `c % 2` of box `c / 2`) and their scale words in chunk 0's scale block (from
/// the stage; chunk `c`'s are `c · SCALE_BLOCK_BYTES` further).
#[derive(Clone, Copy)]
struct FragmentRows {
    weights: [[u32; 2]; CHUNKS_PER_BOX as usize],
    scales: [u32; 2],
    q: u32,
}

/// One stage of a consumer's K loop: per chunk, decode the thread's weight fragments and
/// issue the warpgroup's 4 wgmma k-steps against the token chunk; the previous stage (`pending`)
/// is released once this stage's first MMAs show that its own are done, and this stage becomes
/// `pending`.
///
/// # Safety
/// As [`consume`]; `stage` is full.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
// The unrolled last chunk's look-ahead load is never read (its condition is constant false).
#[allow(unused_assignments)]
unsafe fn consume_stage<V: Variant, S: MmaShape>(
    st: &SharedMap<V>,
    stage: Stage,
    rows: FragmentRows,
    tokens0: WgmmaDesc,
    acc: &mut wgmma::Accumulators,
    pending: &mut Option<Stage>,
) {
    let FragmentRows { weights, scales: scale_words, q } = rows;
    // The caller's loop is unrolled over the ring, so the stage index is a constant: every
    // address below is the CTA's shared base plus a constant and the thread's offsets. The
    // offset `z` (0) is opaque to LLVM, so that it keeps those sums in this copy of the stage
    // instead of hoisting all copies' out of the loop (each would hold a register); ptxas sees
    // the zero and folds the constants into the loads' immediates and the descriptors.
    let z = SmemAddr(0).opaque().0;
    let buf = st.stage(0).add(z + V::CFG.stage_offset(stage.index));
    let load = |c: u32| {
        let wbase = buf.add(V::CFG.weight_box_offset(c / CHUNKS_PER_BOX));
        let sbase = buf.add(c * SCALE_BLOCK_BYTES);
        let w = weights[(c % CHUNKS_PER_BOX) as usize];
        // SAFETY: aligned offsets inside the stage, which is full and not yet released.
        unsafe {
            (
                [smem::ld_v2_u32(wbase.add(w[0])), smem::ld_v2_u32(wbase.add(w[1]))],
                [smem::ld_u32(sbase.add(scale_words[0])), smem::ld_u32(sbase.add(scale_words[1]))],
            )
        }
    };
    // `EAGER_LOADS`: chunk c+1's shared loads are issued before chunk c is decoded, in one basic
    // block, so their latencies overlap that decoding (the first two chunks' loads come first).
    let mut ahead = load(0);
    // Unrolled, so each chunk's A fragments live in their own registers: decoding chunk c+1
    // overlaps the MMAs of chunk c, and no fragment is rewritten while an MMA in flight may read
    // it (at most two groups are ever pending). Every chunk runs, without a branch (with one in
    // each copy of the stage, ptxas serializes the wgmma pipeline): a K tail's chunks past K are
    // zero weights under finite scales times zero tokens (see `produce`), adding exact zeros.
    unrolled!(c in [0, 1, 2, 3] {
        let c = c as u32;
        if c < V::CFG.chunks {
            let (rw, sw) = if c == 0 || V::EAGER_LOADS { ahead } else { load(c) };
            if V::EAGER_LOADS && c + 1 < V::CFG.chunks {
                ahead = load(c + 1);
            }
            // Both rows' block scales, see `dequant16`: block `q` for every pair (the tokens are
            // permuted so), or in W4A16 block `j` for the pairs of k-step `j` (natural order),
            // whose prepacked scale words pair rows `r0` and `r1` of one k-step
            // (`nvfp4_gemm_abi::sm90::w4a16::scale_source`): k-steps 0, 1 in `sw[0]`, 2, 3 in `sw[1]`.
            let (a0, a1) = if V::W4A16 && V::BF16_ACTIVATIONS {
                let scales = [
                    convert::e5m3_pair_to_bf16x2::<false>(sw[0]),
                    convert::e5m3_pair_to_bf16x2::<true>(sw[0]),
                    convert::e5m3_pair_to_bf16x2::<false>(sw[1]),
                    convert::e5m3_pair_to_bf16x2::<true>(sw[1]),
                ];
                (dequant16_per_step::<false, true>(rw[0], scales), dequant16_per_step::<true, true>(rw[1], scales))
            } else if V::W4A16 {
                let scales = [
                    convert::e4m3x2_half_to_f16x2::<false>(sw[0]),
                    convert::e4m3x2_half_to_f16x2::<true>(sw[0]),
                    convert::e4m3x2_half_to_f16x2::<false>(sw[1]),
                    convert::e4m3x2_half_to_f16x2::<true>(sw[1]),
                ];
                (dequant16_per_step::<false, false>(rw[0], scales), dequant16_per_step::<true, false>(rw[1], scales))
            } else {
                let scales = convert::e4m3_bytes_to_f16x2(sw[0], sw[1], q);
                (dequant16::<false>(rw[0], scales), dequant16::<true>(rw[1], scales))
            };
            let tokens = tokens0.advance(z + V::CFG.stage_offset(stage.index) + V::CFG.token_offset(c));
            wgmma::fence();
            for j in 0..K_STEPS_PER_CHUNK as usize {
                let frag = [a0[2 * j], a1[2 * j], a0[2 * j + 1], a1[2 * j + 1]];
                // SAFETY: the whole warpgroup, converged; the token chunk stays in place until the
                // stage is released, after a wait_group covers this MMA.
                let desc = tokens.advance(TOKEN_K_STEP_BYTES * j as u32).to_bits();
                // SAFETY: as above.
                unsafe {
                    if V::BF16_ACTIVATIONS {
                        S::mma_bf16(acc, frag, desc, 1)
                    } else {
                        S::mma(acc, frag, desc, 1)
                    }
                };
            }
            wgmma::commit_group();
            // Everything but this chunk's group is done: the previous stage is free.
            S::wait::<1>(acc);
            if c == 0 {
                if let Some(prev) = pending.take() {
                    prev.release();
                }
            }
        }
    });
    *pending = Some(stage);
}
