//! `sm90_dequant_tokens`: the token operand A of every group, NVFP4 → f16 (scale applied, exact),
//! into the workspace, with K permuted inside each 64-wide chunk as `token_k_position` says.
//!
//! Work item = (row, 64-wide chunk): 32 bytes of values and one 4-byte scale word in, 128 bytes out.
//! CTAs `dequant_first_cta .. + dequant_ctas` of the grid belong to each group.

use super::U32x4;
use crate::ptx::{convert, sreg};
use nvfp4_gemm_abi::scale_layout::{blocked_word_offset, rest_k};
use nvfp4_gemm_abi::sm90::{token_pair_slot, GroupParams, KernelParams, CHUNK_K, DEQUANT_THREADS};

/// See the module docs. Launch: `nvfp4_gemm_abi::sm90::dequant_launch` (`DEQUANT_THREADS`
/// threads per CTA, `Σ dequant_ctas` CTAs).
///
/// # Safety
/// `p` and the group table must be what the host's sm90 plan writes for validated buffers.
#[crate::ptx::kernel]
pub unsafe fn sm90_dequant_tokens(p: KernelParams) {
    let groups = p.groups as *const GroupParams;
    // SAFETY: `g < group_count` indexes the table.
    let group = |g: u32| unsafe { *groups.add(g as usize) };
    let cta = sreg::ctaid_x();
    // Binary search for the group that owns this CTA (groups are in order of first CTA).
    let (mut lo, mut hi) = (0u32, p.group_count);
    while hi - lo > 1 {
        let mid = (lo + hi) / 2;
        if group(mid).dequant_first_cta <= cta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    let g = group(lo);
    if cta < g.dequant_first_cta || cta >= g.dequant_first_cta + g.dequant_ctas {
        return;
    }
    let chunks = g.k / CHUNK_K;
    if chunks == 0 {
        return;
    }
    let items = g.m * chunks;
    let rk = rest_k(g.k);
    let mut item = (cta - g.dequant_first_cta) * DEQUANT_THREADS + sreg::tid_x();
    let stride = g.dequant_ctas * DEQUANT_THREADS;
    while item < items {
        let (row, c) = (item / chunks, item % chunks);
        // SAFETY: row < m and c < k/64: inside A's values, scales and the group's workspace
        // (all validated by the host; the workspace is the plan's).
        unsafe {
            let src =
                (g.a_values as *const u8).add(row as usize * (g.k / 2) as usize + 32 * c as usize) as *const U32x4;
            let v = [*src, *src.add(1)];
            let sw = *((g.a_scales as *const u8).add(blocked_word_offset(row, c, rk)) as *const u32);
            // Block scales times 2⁷; the decoder gives values times 2⁻¹⁴; a last 2⁷ makes the
            // product the exact value · scale (every step exact in f16).
            let scale = [0, 1, 2, 3].map(|q| convert::e4m3_byte_to_f16x2_times_128(sw, q));
            let mut out = [0u32; 32];
            for w in 0..8 {
                // Word w holds logical values 8w..8w+8 (scale block w / 2).
                let pairs = convert::e2m1x8_to_f16x2_scaled(v[w / 4].0[w % 4]);
                for k in 0..4 {
                    let scaled = convert::mul_f16x2(pairs[k], scale[w / 2]);
                    out[token_pair_slot(w as u32, k as u32) as usize] = convert::mul_f16x2(scaled, convert::F16X2_128);
                }
            }
            let dst = (g.workspace as *mut u8).add(2 * (row as usize * g.k as usize + 64 * c as usize)) as *mut U32x4;
            for s in 0..8 {
                *dst.add(s) = U32x4([out[4 * s], out[4 * s + 1], out[4 * s + 2], out[4 * s + 3]]);
            }
        }
        item += stride;
    }
}
