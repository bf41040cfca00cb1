//! Warp-wide prefix sums and reductions on `shfl.sync.bfly` (used by the scheduling kernels).
//! Every lane of a converged warp must call them.

use crate::ptx::warp;

/// The sum of `x` over the lanes below `lane` (exclusive prefix) and over the whole warp.
///
/// Butterfly: after step `b`, `total` is the sum over the aligned block of `2^(b+1)` lanes that
/// holds this lane; a lane in the upper half of that block adds the lower half's sum to its prefix.
#[inline(always)]
pub fn warp_exclusive_sum(x: u32, lane: u32) -> (u32, u32) {
    let (mut total, mut before) = (x, 0u32);
    for bit in 0..5 {
        let other = warp::shfl_xor(total, 1 << bit);
        if lane & (1 << bit) != 0 {
            before += other;
        }
        total += other;
    }
    (before, total)
}

/// The bitwise OR of `x` over the warp.
#[inline(always)]
pub fn warp_or(x: u32) -> u32 {
    let mut v = x;
    for bit in 0..5 {
        v |= warp::shfl_xor(v, 1 << bit);
    }
    v
}
