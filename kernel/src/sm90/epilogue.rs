//! The GEMM's epilogue: each consumer warpgroup scales its accumulators by alpha, rounds once to
//! f16/bf16, turns the tile into C's orientation in its shared-memory buffer (`stmatrix .trans`)
//! and copies whole token rows to C in 16-byte stores, masking rows ≥ M and columns ≥ N — or,
//! with the MoE block's activation epilogue (`ActivationEpilogue`, NVFP4 tokens only), turns
//! those rounded rows into the activated, quantized `z` instead of storing them.

use super::{tile_row0, SharedMap, Variant};
use crate::activate::word;
use crate::ptx::smem::{self, SmemAddr};
use crate::ptx::wgmma::{self, MmaShape};
use crate::ptx::{barrier, convert, gmem, opaque_u32, opaque_u64, sreg};
use crate::quantize_grouped::row_global_scale;
use nvfp4_gemm_abi::moe::block::{epilogue_slice_columns, Activation, ActivationEpilogue, EPILOGUE_SLICE_ROWS};
use nvfp4_gemm_abi::moe::contiguous_scale_first;
use nvfp4_gemm_abi::quantize::{block_part_amax, quantize_block_part_with, BLOCK};
use nvfp4_gemm_abi::scale_layout::{blocked_offset, rest_k};
use nvfp4_gemm_abi::sm90::*;

/// Stored chunks hold the lane groups' weight rows, `lane_group_row(g)` for g = 0..8 (pairs
/// kept); word w of a chunk is weights `lane_group_row(2w)` and `+ 1`, so C's word k is the
/// stored word `lane_group_row(2k) / 2`.
const C_WORDS: [usize; 4] = [
    (lane_group_row(0) / 2) as usize,
    (lane_group_row(2) / 2) as usize,
    (lane_group_row(4) / 2) as usize,
    (lane_group_row(6) / 2) as usize,
];

/// Words `2p`, `2p + 1` (weights `8k + 4p .. 8k + 4p + 4`) of chunk `k` of token row `row` of
/// the epilogue buffer (`p` 0 or 1).
///
/// # Safety
/// As [`c_chunk`].
#[inline(always)]
unsafe fn c_pair(buf: SmemAddr, row: u32, k: u32, p: u32) -> [u32; 2] {
    let slot = buf.add(epilogue_slot(row, k));
    let (w0, w1) = if p == 0 { (C_WORDS[0], C_WORDS[1]) } else { (C_WORDS[2], C_WORDS[3]) };
    // SAFETY: the caller's contract.
    unsafe { [smem::ld_u32(slot.add(4 * w0 as u32)), smem::ld_u32(slot.add(4 * w1 as u32))] }
}

/// Chunk `k` (weights `8k .. 8k + 8` of the warpgroup's 64) of token row `row` of the epilogue
/// buffer, in C's word order.
///
/// # Safety
/// `row` below the round's rows, `k < 8`, after the barrier that follows the buffer's writes.
#[inline(always)]
unsafe fn c_chunk(buf: SmemAddr, row: u32, k: u32) -> [u32; 4] {
    // SAFETY: the caller's contract.
    let v = unsafe { smem::ld_v4_u32(buf.add(epilogue_slot(row, k))) };
    [v[C_WORDS[0]], v[C_WORDS[1]], v[C_WORDS[2]], v[C_WORDS[3]]]
}

/// Named barrier of consumer warpgroup 0's epilogue buffer; warpgroup `cw` uses `+ cw` (ids 1..=3;
/// 0 is the CTA barrier).
const EPILOGUE_BARRIER: u32 = 1;

/// The accumulator pair `(acc[i], acc[i + 1])` (tokens m, m + 1 of one weight) scaled by
/// `unscale` (`Variant::UNSCALE`: 2¹⁴, [`DECODE_UNSCALE`], or 2⁷ for W4A16's bf16 decode) and
/// alpha and rounded once to f16x2 or bf16x2, token m in the low half (the weights were decoded
/// times 1/`unscale`, `dequant16`; multiplying by it first is exact, so this is alpha times the
/// unscaled sum, as if decoded unscaled).
#[inline(always)]
fn round_pair(acc_i: f32, acc_i1: f32, alpha: f32, bf16: bool, unscale: f32) -> u32 {
    let (m, m1) = (acc_i * unscale * alpha, acc_i1 * unscale * alpha);
    if bf16 {
        convert::f32x2_to_bf16x2(m, m1)
    } else {
        convert::f32x2_to_f16x2(m, m1)
    }
}

/// Writes the warpgroup's 64 × `S::N` accumulator tile to C (transposed: C is tokens × weights)
/// through its epilogue buffer, [`EPILOGUE_ROWS`] token rows at a time (a 16-token tile of the
/// decode variant in one round of 16, its buffer's height):
/// 1. each register pair rounded (`round_pair`) is one element pair of an 8 × 8 matrix (the
///    warp's weight row `g` or `g + 8`, tokens `2q, 2q + 1` of a quad) in the layout `stmatrix`
///    takes; `stmatrix .trans` stores its columns, so each stored 16 bytes are 8 weights of one
///    token row ([`epilogue_slot`]): C's orientation, with no exchange between lanes;
/// 2. after a barrier of the warpgroup, each thread copies 16-byte chunks of whole rows to C
///    (eight consecutive threads write one row's 128 bytes: full sectors), each store predicated
///    on `m < M` and `n < N` (N is a multiple of 8: a chunk lies wholly inside or outside).
///
/// A barrier before each round keeps the buffer until the previous round's (or tile's) copies
/// have read it.
///
/// # Safety
/// Every thread of a consumer warpgroup; `g.c` valid for `g.m × g.n` elements, 16-byte aligned
/// (validated by the host).
#[inline(always)]
pub(super) unsafe fn store_tile<V: Variant, S: MmaShape>(
    st: &SharedMap<V>,
    acc: &wgmma::Accumulators,
    g: &GroupParams,
    tile: WorkItem,
    bf16: bool,
    e: &ActivationEpilogue,
) {
    // A round's rows fit the buffer: tiles narrower than a round are one round of their height.
    const {
        assert!(if S::N < EPILOGUE_ROWS {
            S::N <= V::CFG.epilogue_rows()
        } else {
            V::CFG.epilogue_rows() == EPILOGUE_ROWS && S::N <= 2 * EPILOGUE_ROWS
        })
    };
    let Some((cw, t)) = V::CFG.consumer_thread(sreg::tid_x()) else { return };
    let (warp, lane) = (t / 32, t % 32);
    let buf = st.epilogue(cw);
    let bar = EPILOGUE_BARRIER + cw;
    // `stmatrix`: lane `l` addresses column (token) `l % 8` of matrix `l / 8`; matrix `j` of the
    // call for quads 2p, 2p + 1 is quad 2p + j / 2, rows `g` (j even) or `g + 8` of the warp's 16.
    let (col, j) = (lane % 8, lane / 8);
    let chunk = 2 * warp + j % 2;
    let activated = V::ACTIVATION_EPILOGUE && e.values != 0;
    let c = g.c as *mut u16;
    let n_first = tile_row0::<V>(tile) + cw * WG_ROWS;
    let m_first = tile.tile_m * g.block_m;
    unrolled!(round in [0, 1] {
        let round = round as u32;
        // Rounds past N / 64 do not exist for narrower widths (a constant condition).
        if round * EPILOGUE_ROWS < S::N {
            // SAFETY: the 128 threads of the warpgroup, each round.
            unsafe { barrier::sync_named(bar, WARPGROUP_THREADS) };
            unrolled!(p in [0, 1, 2, 3] {
                let quad0 = 8 * round as usize + 2 * p;
                if quad0 < (S::N / 8) as usize {
                    let r: [u32; 4] = core::array::from_fn(|jj| {
                        let i = 4 * (quad0 + jj / 2) + 2 * (jj % 2);
                        round_pair(acc[i], acc[i + 1], g.alpha, bf16, V::UNSCALE)
                    });
                    let row = 8 * (2 * p as u32 + j / 2) + col;
                    // SAFETY: 16-byte slots inside the warpgroup's buffer, which no other
                    // warpgroup uses and whose readers passed the barrier above.
                    unsafe { smem::stmatrix_x4_trans(buf.add(epilogue_slot(row, chunk)), r) };
                }
            });
            // SAFETY: as above.
            unsafe { barrier::sync_named(bar, WARPGROUP_THREADS) };
            let rows = EPILOGUE_ROWS.min(S::N - round * EPILOGUE_ROWS);
            if activated {
                // SAFETY: the round's rows of the buffer, written before the barrier above; the
                // epilogue's outputs (validated by the host).
                unsafe { store_activated(buf, e, g, tile.group, n_first, m_first + round * EPILOGUE_ROWS, rows, t, bf16) };
            } else {
                unrolled!(it in [0, 1, 2, 3] {
                    let idx = it as u32 * WARPGROUP_THREADS + t;
                    if it as u32 * WARPGROUP_THREADS < 8 * rows {
                        let (row, k) = (idx / 8, idx % 8);
                        // SAFETY: a 16-byte slot of the buffer, written before the barrier above.
                        let v = unsafe { c_chunk(buf, row, k) };
                        let (m, n) = (m_first + round * EPILOGUE_ROWS + row, n_first + 8 * k);
                        let at = c.wrapping_add(m as usize * g.n as usize + n as usize) as *mut u32;
                        // SAFETY: written only inside C (m < M, n < N), 16-byte aligned there.
                        unsafe { gmem::st_v4_u32_if(at, v, m < g.m && n < g.n) };
                    }
                });
            }
        }
    });
}

/// The activation epilogue's copy of one round: the buffer holds `rows` token rows (tokens
/// `m0 ..` of the group) of the warpgroup's 64 weights, rounded to `D` as C would be; with the
/// interleaved W13 (`ActivationEpilogue`) those are, gated, the gate and up values of 32
/// consecutive intermediate columns (`32 · s ..`, `s = n_first / 64`), otherwise W1's values of
/// 64 columns. Work item = (row, block of 16 columns of `z`, quarter): each thread computes 4
/// values `z = D(act(gate) · up)` or `D(act(h))` word by word as `moe_activate` does, the four
/// threads of a block (lanes `4i .. 4i + 4`) exchange their parts' largest magnitudes, and each
/// quantizes its part with the group's global scale (`quantize_block_part`: with the others,
/// exactly the block `moe_activate` and the grouped quantizer quantize); the first also stores
/// the scale byte at the row's scale row (`contiguous_scale_first(group, token_row) + m`), each
/// its 2 bytes of packed values at the row's place in the token layout (`token_row + m`). Rows
/// `m ≥ M` and a slice past N store nothing. Quarter blocks keep the registers of the
/// register-bound variants (decode, N192) within their budgets.
///
/// # Safety
/// Every thread `t` of the warpgroup after the round's buffer barrier (whole warps take part in
/// the exchange: `rows · blocks · 4` is a multiple of 32 for `rows` a multiple of 8); `e.values`
/// holds the layout's token rows of `I/2` bytes and `e.scales` its scale rows of `I/16` bytes
/// (`I = N/2` gated, else `N`), `e.group_scales` (when set) one `f32` per group; the group is
/// contiguous in a device-sized layout (`g.token_row` its first row).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn store_activated(
    buf: SmemAddr,
    e: &ActivationEpilogue,
    g: &GroupParams,
    group: u32,
    n_first: u32,
    m0: u32,
    rows: u32,
    t: u32,
    bf16: bool,
) {
    if n_first >= g.n {
        return;
    }
    // Every input of the activation and the quantizer, opaque: otherwise LLVM hoists what it
    // computes from them (the global scale in f64, the thresholds' constants) out of the tile
    // loop, and those registers stay taken through every main loop.
    let e = ActivationEpilogue {
        values: opaque_u64(e.values),
        scales: opaque_u64(e.scales),
        group_scales: opaque_u64(e.group_scales),
        global_scale: f32::from_bits(opaque_u32(e.global_scale.to_bits())),
        activation: opaque_u32(e.activation),
        gated: opaque_u32(e.gated),
        reserved: 0,
    };
    let bf16 = opaque_u32(bf16 as u32) != 0;
    let group = opaque_u32(group);
    let gated = e.gated != 0;
    let inter = if gated { g.n / 2 } else { g.n };
    // Blocks of 16 columns of z per row of the slice: 2 gated, 4 not.
    let blocks = epilogue_slice_columns(gated) / BLOCK;
    let col0 = n_first / EPILOGUE_SLICE_ROWS * epilogue_slice_columns(gated);
    let act = Activation::from_code(e.activation);
    // A loop rather than unrolled copies: one item's values are live at a time. Its bound is
    // warp-uniform: the exchange below takes the whole warp.
    let items = rows * blocks * 4;
    let mut idx = t;
    while idx < items {
        let (q, part) = (idx / 4, idx % 4);
        let (row, b) = (q / blocks, q % blocks);
        // The part's 4 values: words `2 (part % 2) ..` of the block's chunk `part / 2`.
        let (k, pair) = (2 * b + part / 2, part % 2);
        // SAFETY: words of the round's rows (the caller's contract).
        let z = unsafe {
            let gate = c_pair(buf, row, k, pair);
            if gated {
                let up = c_pair(buf, row, 4 + k, pair);
                [word(act, gate[0], Some(up[0]), bf16), word(act, gate[1], Some(up[1]), bf16)]
            } else {
                [word(act, gate[0], None, bf16), word(act, gate[1], None, bf16)]
            }
        };
        let amax = crate::scan::lanes_max(block_part_amax(z) as u32, 2) as u16;
        let m = m0 + row;
        if m < g.m {
            // SAFETY: `group_scales`, when set, holds an `f32` per group (the caller's contract).
            let global = unsafe { row_global_scale(e.group_scales, group, e.global_scale as f64) };
            let (s, packed) = quantize_block_part_with::<crate::quantize::DeviceOps, 2>(z, amax, bf16, global);
            let col = col0 + BLOCK * b + 4 * part;
            // Byte offsets in u32: the host keeps both outputs below 4 GiB.
            let at = (g.token_row + m) * (inter / 2) + col / 2;
            // SAFETY: the part's 2 bytes of values and the block's scale byte, inside the outputs
            // (the caller's contract).
            unsafe {
                *((e.values as *mut u8).add(at as usize) as *mut u16) = packed as u16;
                if part == 0 {
                    let scale_row = contiguous_scale_first(group, g.token_row) + m;
                    *(e.scales as *mut u8).add(blocked_offset(scale_row, col / BLOCK, rest_k(inter))) = s;
                }
            }
        }
        idx += WARPGROUP_THREADS;
    }
}
