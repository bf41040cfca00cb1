//! The MoE block's routing and combine kernels (`moe_route`, `moe_combine`; docs/moe-block.md,
//! "The GPU block"): their parameters, launch geometry, and the CPU reference of what each writes,
//! exact to the bit (the model tests compare against it).
//!
//! Routing turns the router's `topk_ids` / `topk_weights` (`[T, top_k]`) into the contiguous
//! device-sized layout of `crate::moe`: `offsets[E + 1]`, one row per local slot, the rows of
//! expert `e` at `offsets[e] .. offsets[e + 1]` in slot order (slot `s = t · top_k + k`
//! ascending: a stable counting sort). The combine sums each token's rows back:
//! `y[t] = D(Σ_k w[t, k] · o[slot_row[t · top_k + k]])` in `f32`.
//!
//! Routing runs on one of two paths with the same outputs: the one-CTA `moe_route`, or for more
//! than [`ROUTE_MULTI_CTA_ABOVE`] slots three launches over [`route_chunks`] chunks of slots
//! (`moe_route_count`, `moe_route_scan`, `moe_route_scatter`; [`RouteParams::chunks`]).

use bytemuck::{Pod, Zeroable};

/// `slot_row` of a slot whose expert is not local (outside `first_expert .. first_expert + E`).
pub const NOT_LOCAL: u32 = u32::MAX;

/// Threads of the one `moe_route` CTA.
pub const ROUTE_THREADS: u32 = 256;

/// Most local experts of one routing (`crate::moe::MAX_GROUPS`).
pub const ROUTE_MAX_EXPERTS: u32 = crate::moe::MAX_GROUPS;

/// Experts each routing thread scans (consecutive ones): `ROUTE_MAX_EXPERTS / ROUTE_THREADS`.
pub const ROUTE_EXPERTS_PER_THREAD: u32 = ROUTE_MAX_EXPERTS / ROUTE_THREADS;

/// Most slots (`T · top_k`) of one routing: every row index and `NOT_LOCAL` fit a `u32`, and
/// `T · top_k` fits the kernel's 32-bit slot counter.
pub const ROUTE_MAX_SLOTS: u64 = 1 << 31;

/// Shared memory of `moe_route`: one counter per expert, then the CTA scan's table
/// (`kernel::scan::cta_exclusive_sums::<1>`: two words per warp).
pub const ROUTE_SMEM: u32 = 4 * ROUTE_MAX_EXPERTS + 4 * 2 * (ROUTE_THREADS / 32);

const _: () = assert!(ROUTE_EXPERTS_PER_THREAD * ROUTE_THREADS == ROUTE_MAX_EXPERTS);
const _: () = assert!(ROUTE_SMEM <= crate::launch::MAX_DYNAMIC_SMEM);

/// `moe_route`'s one launch: one CTA of [`ROUTE_THREADS`] (it loops over the slots in tiles of
/// [`ROUTE_THREADS`]). `moe_route_scan` has the same geometry.
pub const fn route_launch() -> crate::launch::LaunchGeometry {
    crate::launch::LaunchGeometry { grid: 1, block: ROUTE_THREADS, cluster: 1, smem_bytes: ROUTE_SMEM }
}

/// Routings of more slots than this take the multi-CTA path. At this size the one CTA walks 16
/// tiles of slots twice (128 CTA barriers in its ranking pass), a few microseconds, comparable
/// to the two extra launches of the multi-CTA path; beyond, the one CTA's time grows with the
/// slots (about one barrier per 32 slots on one SM) while each chunk CTA's stays at a few tiles.
/// A guess from that count, not a measurement: the crossover has not been timed.
pub const ROUTE_MULTI_CTA_ABOVE: u64 = 4096;

/// Fewest slots per chunk CTA the multi-CTA path aims for (4 tiles of [`ROUTE_THREADS`]: each
/// CTA's fixed cost, its counters and three barriers, stays small beside its slots).
pub const ROUTE_CHUNK_MIN_SLOTS: u64 = 1024;

/// Most chunks of the multi-CTA path (a grid well under one wave of an H100's 132 SMs; beyond
/// 128 · 1024 slots the chunks grow instead).
pub const ROUTE_MAX_CHUNKS: u32 = 128;

/// Most per-(chunk, expert) counts the path's one scan CTA handles (`chunks · E`, 256 per
/// thread): with many experts the chunks are fewer.
pub const ROUTE_SCAN_MAX_COUNTS: u32 = 1 << 16;

/// The routing path for `slots` slots and `experts` local experts: 0 for the one-CTA
/// `moe_route`, else the multi-CTA path's chunk count: `⌈slots / ROUTE_CHUNK_MIN_SLOTS⌉`, at
/// most [`ROUTE_MAX_CHUNKS`] and `ROUTE_SCAN_MAX_COUNTS / experts` (at least 1).
pub const fn route_chunks(slots: u64, experts: u32) -> u32 {
    if slots <= ROUTE_MULTI_CTA_ABOVE {
        return 0;
    }
    let by_slots = slots.div_ceil(ROUTE_CHUNK_MIN_SLOTS);
    let by_scan = match ROUTE_SCAN_MAX_COUNTS.checked_div(experts) {
        Some(c) => c,
        None => ROUTE_MAX_CHUNKS,
    };
    let mut c = if by_slots > ROUTE_MAX_CHUNKS as u64 { ROUTE_MAX_CHUNKS } else { by_slots as u32 };
    if c > by_scan {
        c = by_scan;
    }
    if c == 0 {
        1
    } else {
        c
    }
}

/// Slots per chunk of `chunks ≥ 1` chunks over `slots` slots: `⌈slots / chunks⌉` (the last
/// chunks may hold fewer, or none).
pub const fn route_chunk_slots(slots: u64, chunks: u32) -> u32 {
    if chunks == 0 {
        return 0;
    }
    slots.div_ceil(chunks as u64) as u32
}

/// u32 words of the multi-CTA path's scratch (`RouteParams::counts`): one per (chunk, expert);
/// 0 for the one-CTA path (`chunks` 0).
pub const fn route_scratch_words(chunks: u32, experts: u32) -> u64 {
    chunks as u64 * experts as u64
}

/// `moe_route_count`'s and `moe_route_scatter`'s launch: one CTA of [`ROUTE_THREADS`] per chunk
/// (each loops over its chunk in tiles), the shared memory of `moe_route`.
pub const fn route_chunk_launch(chunks: u32) -> crate::launch::LaunchGeometry {
    crate::launch::LaunchGeometry { grid: chunks, block: ROUTE_THREADS, cluster: 1, smem_bytes: ROUTE_SMEM }
}

/// `moe_route`'s parameters (addresses are device addresses; 0 = absent where allowed).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct RouteParams {
    /// `topk_ids`, `T · top_k` int32 (or int64 with `ids_i64`).
    pub ids: u64,
    /// `topk_weights`, `T · top_k` f32 (or bf16 with `weights_bf16`); read only when
    /// `row_weight` is not 0.
    pub weights: u64,
    /// Output: `experts + 1` u32.
    pub offsets: u64,
    /// Output: `T · top_k` u32, every entry written.
    pub slot_row: u64,
    /// Output: `T · top_k` u32; entries below `offsets[experts]` written.
    pub row_token: u64,
    /// Output (0 = none): `T · top_k` f32; entries below `offsets[experts]` written.
    pub row_weight: u64,
    /// Multi-CTA path only: scratch of `chunks · experts` u32, the count of each (chunk, expert)
    /// at `c · experts + e`, then that pair's first row.
    pub counts: u64,
    /// The global id of local expert 0.
    pub first_expert: i64,
    /// Tokens `T`.
    pub tokens: u32,
    /// Slots per token (≥ 1).
    pub top_k: u32,
    /// Local experts `E` (1 ..= [`ROUTE_MAX_EXPERTS`]).
    pub experts: u32,
    /// 1: `ids` are int64.
    pub ids_i64: u32,
    /// 1: `weights` are bf16.
    pub weights_bf16: u32,
    /// 0: the one-CTA `moe_route`; else the multi-CTA path over this many chunks
    /// (1 ..= [`ROUTE_MAX_CHUNKS`]), chunk `c` the slots `c · chunk_slots ..` (up to `T · top_k`).
    pub chunks: u32,
    /// Slots per chunk (`route_chunk_slots`; `chunks · chunk_slots ≥ T · top_k`).
    pub chunk_slots: u32,
    /// Zero.
    pub pad: u32,
}
const _: () = assert!(core::mem::size_of::<RouteParams>() == 96);

/// Register caps of the routing and combine kernels and of the one-thread-per-block activation
/// (`.maxnreg`, see `cargo xtask build-ptx`): 64 per thread, so that four CTAs of any fit an SM's
/// registers (the activation took 72 uncapped: three CTAs, and an H100 issued on 61% of cycles).
pub const REGISTER_CAPS: [(&str, u32); 6] = [
    ("moe_route", 64),
    ("moe_route_count", 64),
    ("moe_route_scan", 64),
    ("moe_route_scatter", 64),
    ("moe_combine", 64),
    ("moe_activate_blocks", 64),
];
const _: () = assert!(ROUTE_THREADS * 64 <= crate::launch::REGISTERS_PER_SM);

/// Threads per `moe_combine` CTA.
pub const COMBINE_THREADS: u32 = 256;

/// 16-bit values per combine work item (one 16-byte load of a row of `o`, one store of `y`).
pub const COMBINE_VECTOR: u32 = 8;

/// `moe_combine`'s hidden size must be a positive multiple of this (the GEMM's K rule).
pub const COMBINE_H_MULTIPLE: u32 = 64;

/// `moe_combine`'s parameters.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Pod, Zeroable)]
pub struct CombineParams {
    /// The second GEMM's output, `rows x hidden` f16 (bf16 with `bf16`), in sorted rows.
    pub o: u64,
    /// `T · top_k` u32 from `moe_route`.
    pub slot_row: u64,
    /// `topk_weights` `T · top_k` f32 (bf16 with `weights_bf16`); 0: every weight is 1.
    pub weights: u64,
    /// Output: `T x hidden`, the type of `o`.
    pub y: u64,
    /// Tokens `T`.
    pub tokens: u32,
    /// Slots per token (≥ 1).
    pub top_k: u32,
    /// Hidden size `H` (a positive multiple of [`COMBINE_H_MULTIPLE`]).
    pub hidden: u32,
    /// Rows of `o`: a `slot_row` entry at or above it is skipped as not local.
    pub rows: u32,
    /// 1: `o` and `y` are bf16.
    pub bf16: u32,
    /// 1: `weights` are bf16.
    pub weights_bf16: u32,
}
const _: () = assert!(core::mem::size_of::<CombineParams>() == 56);

/// Combine work items: one per 8 values of `y`.
pub const fn combine_items(tokens: u32, hidden: u32) -> u64 {
    tokens as u64 * (hidden / COMBINE_VECTOR) as u64
}

/// `moe_combine`'s launch over `items` work items, at most `max_ctas` CTAs (≥ 1; grid-strided
/// beyond).
pub const fn combine_launch(items: u64, max_ctas: u32) -> crate::launch::LaunchGeometry {
    let ctas = items.div_ceil(COMBINE_THREADS as u64);
    let cap = if max_ctas == 0 { 1 } else { max_ctas };
    let grid = if ctas == 0 {
        1
    } else if ctas > cap as u64 {
        cap
    } else {
        ctas as u32
    };
    crate::launch::LaunchGeometry { grid, block: COMBINE_THREADS, cluster: 1, smem_bytes: 0 }
}

/// The f32 value of an f16 (or, with `bf16`, a bf16) bit pattern, exactly (integer arithmetic
/// and one exact scaling for f16 subnormals). Both kernels and the references use it.
#[inline(always)]
pub fn half_bits_to_f32(bits: u16, bf16: bool) -> f32 {
    let b = bits as u32;
    if bf16 {
        return f32::from_bits(b << 16);
    }
    let sign = (b & 0x8000) << 16;
    let exp = (b >> 10) & 0x1F;
    let man = b & 0x3FF;
    if exp == 0x1F {
        f32::from_bits(sign | 0x7F80_0000 | (man << 13))
    } else if exp != 0 {
        f32::from_bits(sign | ((exp + 112) << 23) | (man << 13))
    } else {
        // man · 2⁻²⁴: exact (man < 2¹⁰, the product a normal f32 or 0).
        f32::from_bits(sign | (man as f32 * (1.0 / 16_777_216.0)).to_bits())
    }
}

/// The local expert of a global id, or `None` for an id outside `first .. first + experts`.
#[inline(always)]
pub fn local_expert(id: i64, first: i64, experts: u32) -> Option<u32> {
    // `checked_sub`: an id far from `first` must not wrap into the range.
    match id.checked_sub(first) {
        Some(d) if (0..experts as i64).contains(&d) => Some(d as u32),
        _ => None,
    }
}

/// What `moe_route` writes, on the CPU: `(offsets, slot_row, row_token[..offsets[E]])`, the rows
/// of each expert in slot order. `ids(s)` is slot `s`'s global expert id.
#[allow(clippy::too_many_arguments)]
pub fn route_reference(
    ids: impl Fn(usize) -> i64,
    slots: usize,
    top_k: usize,
    first: i64,
    experts: u32,
    offsets: &mut [u32],
    slot_row: &mut [u32],
    row_token: &mut [u32],
) {
    let mut count = [0u32; ROUTE_MAX_EXPERTS as usize];
    for s in 0..slots {
        if let Some(e) = local_expert(ids(s), first, experts) {
            count[e as usize] += 1;
        }
    }
    offsets[0] = 0;
    for e in 0..experts as usize {
        offsets[e + 1] = offsets[e] + count[e];
    }
    let mut next = [0u32; ROUTE_MAX_EXPERTS as usize];
    next[..experts as usize].copy_from_slice(&offsets[..experts as usize]);
    for (s, row) in slot_row.iter_mut().enumerate().take(slots) {
        *row = match local_expert(ids(s), first, experts) {
            Some(e) => {
                let r = next[e as usize];
                next[e as usize] += 1;
                row_token[r as usize] = (s / top_k) as u32;
                r
            }
            None => NOT_LOCAL,
        };
    }
}

/// One value of `y` as `moe_combine` computes it: over `k` ascending, the local slots (`row`
/// not [`NOT_LOCAL`] and below the rows of `o`) add `w · o` to an `f32` sum that starts at +0,
/// one rounded multiply then one rounded add each (no fma), and the sum is rounded once to the
/// 16-bit type (nearest, ties to even). `o(row)` returns the value's bits in `row`; `weight(k)`
/// the slot's weight as f32 (1 without weights). Returns the f32 sum, before the rounding.
pub fn combine_sum(
    slot_rows: &[u32],
    rows: u32,
    weight: impl Fn(usize) -> f32,
    o: impl Fn(u32) -> u16,
    bf16: bool,
) -> f32 {
    let mut acc = 0.0f32;
    for (k, &r) in slot_rows.iter().enumerate() {
        if r != NOT_LOCAL && r < rows {
            acc += weight(k) * half_bits_to_f32(o(r), bf16);
        }
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversion_is_exact() {
        assert_eq!(half_bits_to_f32(0x3C00, false), 1.0);
        assert_eq!(half_bits_to_f32(0x0001, false), 2f32.powi(-24));
        assert_eq!(half_bits_to_f32(0x8001, false).to_bits(), (-(2f32.powi(-24))).to_bits());
        assert_eq!(half_bits_to_f32(0x8000, false).to_bits(), (-0.0f32).to_bits());
        assert_eq!(half_bits_to_f32(0x03FF, false), 1023.0 * 2f32.powi(-24));
        assert_eq!(half_bits_to_f32(0x7BFF, false), 65504.0);
        assert_eq!(half_bits_to_f32(0xFC00, false), f32::NEG_INFINITY);
        assert!(half_bits_to_f32(0x7E00, false).is_nan());
        assert_eq!(half_bits_to_f32(0x3F80, true), 1.0);
    }

    #[test]
    fn local_experts_and_the_reference_order() {
        assert_eq!(local_expert(5, 4, 2), Some(1));
        assert_eq!(local_expert(6, 4, 2), None);
        assert_eq!(local_expert(-1, 0, 8), None);
        assert_eq!(local_expert(i64::MIN, 1, 8), None);
        assert_eq!(local_expert(i64::MAX, -1, 8), None);
        let ids = [3i64, 1, -1, 3, 2, 1];
        let (mut off, mut sr, mut rt) = ([0u32; 4], [0u32; 6], [9u32; 6]);
        route_reference(|s| ids[s], 6, 2, 1, 3, &mut off, &mut sr, &mut rt);
        assert_eq!(off, [0, 2, 3, 5]);
        assert_eq!(sr, [3, 0, NOT_LOCAL, 4, 2, 1]);
        assert_eq!(rt[..5], [0, 2, 2, 0, 1]);
    }

    #[test]
    fn geometry() {
        assert_eq!(route_launch().smem_bytes, 16384 + 64);
        assert_eq!(combine_launch(0, 8).grid, 1);
        assert_eq!(combine_launch(257, 8).grid, 2);
        assert_eq!(combine_launch(1 << 20, 8).grid, 8);
        assert_eq!(combine_items(3, 128), 48);
    }

    #[test]
    fn routing_paths() {
        assert_eq!(route_chunks(0, 8), 0);
        assert_eq!(route_chunks(ROUTE_MULTI_CTA_ABOVE, 8), 0);
        assert_eq!(route_chunks(ROUTE_MULTI_CTA_ABOVE + 1, 8), 5);
        assert_eq!(route_chunks(32768, 8), 32);
        assert_eq!(route_chunks(1 << 30, 1), ROUTE_MAX_CHUNKS);
        assert_eq!(route_chunks(1 << 30, 4096), 16);
        assert_eq!(route_chunks(1 << 20, 1000), 65);
        for (slots, chunks) in [(4097u64, 5u32), (1 << 30, 128), (1000, 3), (1024, 1), (7, 7)] {
            let per = route_chunk_slots(slots, chunks) as u64;
            assert!(per * chunks as u64 >= slots && per * (chunks as u64 - 1) < slots, "{slots} {chunks}");
        }
        assert_eq!(route_chunk_slots(4097, 5), 820);
        assert_eq!(route_scratch_words(16, 4096), 1 << 16);
        assert_eq!(route_chunk_launch(5).grid, 5);
        // The path's chunk count never decreases with the slots (scratch sized for the most).
        let mut last = 0;
        for slots in (0..600_000u64).step_by(997) {
            let c = route_chunks(slots, 40);
            assert!(c >= last);
            last = c;
        }
    }
}
