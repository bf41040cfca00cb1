//! The GEMM's epilogue: each consumer warpgroup scales its accumulators by alpha, rounds once to
//! f16/bf16, turns the tile into C's orientation in its shared-memory buffer (`stmatrix .trans`)
//! and copies whole token rows to C in 16-byte stores, masking rows ≥ M and columns ≥ N.

use super::{tile_row0, SharedMap, Variant};
use crate::ptx::smem;
use crate::ptx::wgmma::{self, MmaShape};
use crate::ptx::{barrier, convert, gmem, sreg};
use nvfp4_gemm_abi::sm90::*;

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
    // Stored chunks hold the lane groups' weight rows, `lane_group_row(g)` for g = 0..8 (pairs
    // kept); word w of a chunk is weights `lane_group_row(2w)` and `+ 1`, so C's word k is the
    // stored word `lane_group_row(2k) / 2`.
    const W: [usize; 4] = [
        (lane_group_row(0) / 2) as usize,
        (lane_group_row(2) / 2) as usize,
        (lane_group_row(4) / 2) as usize,
        (lane_group_row(6) / 2) as usize,
    ];
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
            unrolled!(it in [0, 1, 2, 3] {
                let idx = it as u32 * WARPGROUP_THREADS + t;
                if it as u32 * WARPGROUP_THREADS < 8 * EPILOGUE_ROWS.min(S::N - round * EPILOGUE_ROWS) {
                    let (row, k) = (idx / 8, idx % 8);
                    // SAFETY: a 16-byte slot of the buffer, written before the barrier above.
                    let v = unsafe { smem::ld_v4_u32(buf.add(epilogue_slot(row, k))) };
                    let (m, n) = (m_first + round * EPILOGUE_ROWS + row, n_first + 8 * k);
                    let at = c.wrapping_add(m as usize * g.n as usize + n as usize) as *mut u32;
                    // SAFETY: written only inside C (m < M, n < N), 16-byte aligned there.
                    unsafe { gmem::st_v4_u32_if(at, [v[W[0]], v[W[1]], v[W[2]], v[W[3]]], m < g.m && n < g.n) };
                }
            });
        }
    });
}
