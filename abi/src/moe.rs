//! Device-resident group sizes (mixture-of-experts serving): the two token layouts, how each
//! group's rows, scale rows and output rows derive from sizes that live on the device, the sticky
//! status flags for sizes beyond the plan's bounds, and the parameters of the kernels that read
//! them (the grouped quantizer and the schedulers).
//!
//! # Layouts
//!
//! The token operand A of all `G` groups is one NVFP4 tensor of `token_rows` rows and `K` values
//! per row (packed values: row `r` at byte `r · K/2`, the same row as the f16/bf16 input it was
//! quantized from), and C is one `[token_rows, N]` tensor with row `r` the output of token row `r`.
//!
//! - **Contiguous** ([`LAYOUT_CONTIGUOUS`]): `token_rows = T`, the plan's bound on the total number
//!   of tokens. The device array `offsets[G + 1]` (`u32`) says group `g` owns rows
//!   `offsets[g] .. offsets[g + 1]`, as a router's sort produces them (rows outside every group are
//!   neither read nor written).
//! - **Masked** ([`LAYOUT_MASKED`]): `token_rows = G · M_max`. The device array `counts[G]` says
//!   group `g` owns rows `g · M_max .. g · M_max + counts[g]`.
//!
//! # Scale rows
//!
//! The block scales of A are in the 128x4 blocked layout, one row per token row, but each group's
//! rows start a new 128-row block (a block interleaves 128 rows, so two groups cannot share one).
//! Group `g`, whose first token row is `first` (after clamping, below), has its row `i` at scale
//! row `scale_first + i`, where
//!
//! - contiguous: `scale_first = 128 · (⌈first / 128⌉ + g)` ([`contiguous_scale_first`]): a group's
//!   own offset and index give it, so the quantizer needs no prefix sum over the groups, and the
//!   groups' blocks are disjoint for any sizes (`⌈a/128⌉ + ⌈b/128⌉ ≤ ⌈(a+b)/128⌉ + 1`). The scale
//!   tensor has [`contiguous_scale_rows`]`(G, T) = 128 · (⌈T / 128⌉ + G)` rows.
//! - masked: `scale_first = g · ⌈M_max / 128⌉ · 128`; [`masked_scale_rows`] rows.
//!
//! Scale bytes of rows that belong to no group (the padding of each group's last block) are never
//! read or written.
//!
//! # Sizes beyond the bounds
//!
//! Sizes are clamped, and every clamp raises a bit of the plan's sticky status word
//! ([`STATUS_ROWS_OVER_BOUND`], [`STATUS_OFFSETS_DECREASING`], [`STATUS_COUNT_OVER_BOUND`]), which
//! the host reads later:
//! - contiguous: each offset is clamped to `T`; a group whose clamped end is below its clamped
//!   start is empty. Every row a kernel touches is therefore below `T`, every scale row below
//!   [`contiguous_scale_rows`]. Decreasing offsets can make groups overlap: the results of the
//!   overlapping rows are then unspecified (but nothing outside the tensors is touched);
//! - masked: each count is clamped to `M_max`.
//!
//! The schedulers' shared contract is [`schedule`]; the sm_90a kernel choice and tile numbering
//! [`sm90`].

pub mod block;
pub mod schedule;
pub mod sm90;

/// The kernels of a device-sized chain that are not GEMMs or schedulers — the grouped quantizer
/// (`nvfp4_quantize_grouped`), the block's routing (`moe_route`, `moe_route_count`,
/// `moe_route_scan`, `moe_route_scatter`), activation (`moe_activate`, `moe_activate_blocks`)
/// and combine (`moe_combine`) — execute `griddepcontrol.wait` before they touch global memory
/// and `griddepcontrol.launch_dependents` right after, so each may be launched with programmatic
/// stream serialization (programmatic dependent launch): scheduled while the kernel before it
/// still runs, and letting the kernel after it be scheduled while it runs. The wait orders every
/// access after the previous kernel's completion, so an early start changes no result. The host
/// starts the quantizer and the routing early; the activation and the combine follow a GEMM and
/// start once it has ended (the host's reasons are beside its launches).
pub const STARTS_EARLY: bool = true;

/// The kernels [`STARTS_EARLY`] covers, by entry name (the static PTX tests check that each
/// waits before its first branch and its first memory access other than its parameters).
pub const EARLY_KERNELS: [&str; 8] = [
    "nvfp4_quantize_grouped",
    "moe_route",
    "moe_route_count",
    "moe_route_scan",
    "moe_route_scatter",
    "moe_activate",
    "moe_activate_blocks",
    "moe_combine",
];

/// Group `g` owns rows `offsets[g] .. offsets[g + 1]` of one `[T, K]` token tensor.
pub const LAYOUT_CONTIGUOUS: u32 = 0;
/// Group `g` owns rows `g · M_max .. g · M_max + counts[g]` of a `[G, M_max, K]` token tensor.
pub const LAYOUT_MASKED: u32 = 1;

/// Status bit: an offset exceeded the total-rows bound `T` (clamped to `T`).
pub const STATUS_ROWS_OVER_BOUND: u32 = 1;
/// Status bit: an offset was smaller than the previous one (that group was empty).
pub const STATUS_OFFSETS_DECREASING: u32 = 2;
/// Status bit: a count exceeded `M_max` (clamped to `M_max`).
pub const STATUS_COUNT_OVER_BOUND: u32 = 4;
/// Status bit: the scheduled work exceeded the plan's work-list capacity (truncated). Cannot
/// happen for sizes within the bounds of [`max_m_tiles`]; checked anyway.
pub const STATUS_WORK_OVERFLOW: u32 = 8;

/// Most groups of a device-sized plan.
pub const MAX_GROUPS: u32 = 4096;

/// Scale rows per blocked-layout row block.
const BLOCK_ROWS: u32 = crate::scale_layout::BLOCK_ROWS;

/// The device sizes of one call: where they are and how to read them (passed by value inside the
/// kernels' parameters).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct DeviceSizes {
    /// Device address of `u32 offsets[groups + 1]` (contiguous) or `u32 counts[groups]` (masked),
    /// 4-byte aligned.
    pub sizes: u64,
    /// [`LAYOUT_CONTIGUOUS`] or [`LAYOUT_MASKED`].
    pub layout: u32,
    /// Groups `G` (at most [`MAX_GROUPS`]).
    pub groups: u32,
    /// Contiguous: the total-rows bound `T`; masked: rows per group `M_max`.
    pub rows: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<DeviceSizes>() == 24);

impl DeviceSizes {
    /// Rows of the token tensor (and of C): `T`, or `G · M_max`.
    pub const fn token_rows(&self) -> u32 {
        if self.layout == LAYOUT_MASKED {
            self.groups * self.rows
        } else {
            self.rows
        }
    }

    /// Rows of the blocked scale tensor of A.
    pub const fn scale_rows(&self) -> u32 {
        if self.layout == LAYOUT_MASKED {
            masked_scale_rows(self.groups, self.rows)
        } else {
            contiguous_scale_rows(self.groups, self.rows)
        }
    }

    /// Entries of the device sizes array: `G + 1` offsets or `G` counts.
    pub const fn sizes_len(&self) -> u32 {
        if self.layout == LAYOUT_MASKED {
            self.groups
        } else {
            self.groups + 1
        }
    }

    /// The rows of group `g` (`g < groups`), reading entry `i` of the sizes array with `load(i)`.
    #[inline(always)]
    pub fn group(&self, g: u32, load: impl Fn(u32) -> u32) -> GroupRows {
        if self.layout == LAYOUT_MASKED {
            masked_group(g, load(g), self.rows)
        } else {
            contiguous_group(g, load(g), load(g + 1), self.rows)
        }
    }

    /// A share of the end of the rows any group holds: the largest clamped offset among
    /// `1 + part, 1 + part + parts, …` up to `G` (contiguous; the largest over every share is one
    /// past the last row [`Self::locate`] can place in a group, since a row it places lies below
    /// its group's clamped end), or [`Self::token_rows`] (masked). Grid-strided kernels over the
    /// bound's rows stop there instead of searching the groups for every row of the bound; a warp
    /// reads the offsets in 32 shares and combines them by max.
    #[inline(always)]
    pub fn rows_end_part(&self, load: impl Fn(u32) -> u32, part: u32, parts: u32) -> u32 {
        if self.layout == LAYOUT_MASKED {
            return self.token_rows();
        }
        let mut end = 0;
        let mut g = 1 + part;
        while g <= self.groups {
            let o = load(g);
            let o = if o < self.rows { o } else { self.rows };
            if o > end {
                end = o;
            }
            g += parts;
        }
        end
    }

    /// The scale row of token row `row`, if the row belongs to a group (`load` as for
    /// [`Self::group`]): [`Self::locate`]'s second number.
    #[inline(always)]
    pub fn scale_row(&self, row: u32, load: impl Fn(u32) -> u32) -> Option<u32> {
        self.locate(row, load).map(|(_, scale_row)| scale_row)
    }

    /// The group of token row `row` and the row's scale row, if the row belongs to a group
    /// (`load` as for [`Self::group`]). Contiguous: a binary search over the clamped offsets (for
    /// decreasing offsets it finds some group or none; the row it returns still lies in the scale
    /// tensor).
    #[inline(always)]
    pub fn locate(&self, row: u32, load: impl Fn(u32) -> u32) -> Option<(u32, u32)> {
        if self.layout == LAYOUT_MASKED {
            if self.rows == 0 {
                return None;
            }
            let (g, i) = (row / self.rows, row % self.rows);
            let count = load(g);
            if i < count {
                Some((g, masked_scale_first(g, self.rows) + i))
            } else {
                None
            }
        } else {
            let t = self.rows;
            let clamped = |g: u32| {
                let o = load(g);
                if o < t {
                    o
                } else {
                    t
                }
            };
            // The last group whose clamped start is at or before `row`.
            let (mut lo, mut hi) = (0u32, self.groups);
            if self.groups == 0 || clamped(0) > row {
                return None;
            }
            while hi - lo > 1 {
                let mid = (lo + hi) / 2;
                if clamped(mid) <= row {
                    lo = mid;
                } else {
                    hi = mid;
                }
            }
            let (first, end) = (clamped(lo), clamped(lo + 1));
            if row < end {
                Some((lo, contiguous_scale_first(lo, first) + (row - first)))
            } else {
                None
            }
        }
    }
}

/// One group's rows as a kernel uses them, after clamping.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GroupRows {
    /// First token row (of A, the f16 workspace, and C).
    pub first: u32,
    /// Rows (tokens) of the group.
    pub rows: u32,
    /// First scale row of A's blocked scales (a multiple of 128).
    pub scale_first: u32,
    /// Status bits raised by clamping this group's sizes.
    pub status: u32,
}

/// First scale row of contiguous group `g` whose first token row is `first`:
/// `128 · (⌈first / 128⌉ + g)`.
pub const fn contiguous_scale_first(g: u32, first: u32) -> u32 {
    BLOCK_ROWS * (first.div_ceil(BLOCK_ROWS) + g)
}

/// Scale rows of a contiguous layout with `groups` groups and at most `total_rows` tokens:
/// `128 · (⌈T / 128⌉ + G)` (an upper bound on every group's last scale row + 1).
pub const fn contiguous_scale_rows(groups: u32, total_rows: u32) -> u32 {
    BLOCK_ROWS * (total_rows.div_ceil(BLOCK_ROWS) + groups)
}

/// First scale row of masked group `g` with `max_rows` rows per group.
pub const fn masked_scale_first(g: u32, max_rows: u32) -> u32 {
    g * max_rows.div_ceil(BLOCK_ROWS) * BLOCK_ROWS
}

/// Scale rows of a masked layout: `G · ⌈M_max / 128⌉ · 128`.
pub const fn masked_scale_rows(groups: u32, max_rows: u32) -> u32 {
    masked_scale_first(groups, max_rows)
}

/// Contiguous group `g` from its raw offsets `start = offsets[g]`, `end = offsets[g + 1]` and the
/// total-rows bound `t`: both clamped to `t`; empty when the clamped end is below the start.
pub const fn contiguous_group(g: u32, start: u32, end: u32, t: u32) -> GroupRows {
    let mut status = 0;
    if start > t || end > t {
        status |= STATUS_ROWS_OVER_BOUND;
    }
    if end < start {
        status |= STATUS_OFFSETS_DECREASING;
    }
    let first = if start < t { start } else { t };
    let last = if end < t { end } else { t };
    let rows = last.saturating_sub(first);
    GroupRows { first, rows, scale_first: contiguous_scale_first(g, first), status }
}

/// Masked group `g` from its raw count and `max_rows`: the count clamped to `max_rows`.
pub const fn masked_group(g: u32, count: u32, max_rows: u32) -> GroupRows {
    let (rows, status) = if count > max_rows { (max_rows, STATUS_COUNT_OVER_BOUND) } else { (count, 0) };
    GroupRows { first: g * max_rows, rows, scale_first: masked_scale_first(g, max_rows), status }
}

/// Token tiles (of the sm_90a kernel's widths, [`crate::sm90::token_tile_rows`]) of a group of `m`
/// tokens: 0, 1 for up to 16 tokens, else `⌈m / 128⌉` — so `⌈m / 128⌉` for every `m`, the M tiles
/// of the sm_100a kernel too, and [`max_m_tiles`] bounds both architectures' lists.
pub const fn sm90_m_tiles(m: u32) -> u32 {
    crate::sm90::m_tiles(m, crate::sm90::token_tile_rows(m))
}

/// Most token tiles over all groups for tiles of at most 128 rows where a group of 1..=16 rows
/// takes one tile: [`max_tiles`] of 128 rows.
pub const fn max_m_tiles(s: &DeviceSizes) -> u64 {
    max_tiles(s, BLOCK_ROWS)
}

/// Most tiles of `rows` rows (a group of `m` rows takes `⌈m / rows⌉`) over all groups:
/// contiguous, `min(G, T) + ⌊(T − min(G, T)) / rows⌋` (each non-empty group of `m` rows takes at
/// most `1 + ⌊(m − 1) / rows⌋`, and the sum grows with the number of non-empty groups); masked,
/// `G · ⌈M_max / rows⌉`.
pub const fn max_tiles(s: &DeviceSizes, rows: u32) -> u64 {
    if s.layout == LAYOUT_MASKED {
        s.groups as u64 * s.rows.div_ceil(rows) as u64
    } else {
        let t = s.rows as u64;
        let k = if (s.groups as u64) < t { s.groups as u64 } else { t };
        k + (t - k) / rows as u64
    }
}

/// Most non-empty groups: `min(G, T)` (contiguous, offsets within the bound) or `G` (masked).
pub const fn max_busy_groups(s: &DeviceSizes) -> u64 {
    if s.layout == LAYOUT_MASKED || s.groups < s.rows {
        s.groups as u64
    } else {
        s.rows as u64
    }
}

/// Parameters of the grouped quantizer `nvfp4_quantize_grouped` (both architectures).
///
/// `convert` is as for `nvfp4_quantize` with `rows` = the token tensor's rows and `scales` the
/// grouped scale tensor ([`DeviceSizes::scale_rows`] rows); only the rows of groups are quantized.
/// `gather` (all zero for a plain grouped quantization) makes each row read a token row of
/// another tensor, optionally weighted, and optionally stores the rows unquantized
/// ([`block::Gather`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GroupedConvertParams {
    /// Input, outputs, shape of the token tensor, global scale, input type.
    pub convert: crate::quantize::ConvertParams,
    /// The device sizes.
    pub sizes: DeviceSizes,
    /// Where each row comes from, its router weight, the output kind.
    pub gather: block::Gather,
}

const _: () = assert!(core::mem::size_of::<GroupedConvertParams>() == 104);

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    fn contiguous(groups: u32, t: u32) -> DeviceSizes {
        DeviceSizes { sizes: 0, layout: LAYOUT_CONTIGUOUS, groups, rows: t, reserved: 0 }
    }

    fn masked(groups: u32, m: u32) -> DeviceSizes {
        DeviceSizes { sizes: 0, layout: LAYOUT_MASKED, groups, rows: m, reserved: 0 }
    }

    #[test]
    fn scale_offsets_by_hand() {
        assert_eq!(contiguous_scale_first(0, 0), 0);
        assert_eq!(contiguous_scale_first(1, 5), 256);
        assert_eq!(contiguous_scale_first(2, 128), 384);
        assert_eq!(contiguous_scale_first(3, 129), 128 * 5);
        assert_eq!(contiguous_scale_rows(4, 300), 128 * 7);
        assert_eq!(masked_scale_first(3, 20), 384);
        assert_eq!(masked_scale_rows(3, 130), 768);
        let s = contiguous(4, 300);
        assert_eq!((s.token_rows(), s.scale_rows(), s.sizes_len()), (300, 896, 5));
        let s = masked(4, 20);
        assert_eq!((s.token_rows(), s.scale_rows(), s.sizes_len()), (80, 512, 4));
    }

    #[test]
    fn clamping_raises_the_status_bits() {
        assert_eq!(contiguous_group(1, 5, 9, 10), GroupRows { first: 5, rows: 4, scale_first: 256, status: 0 });
        assert_eq!(
            contiguous_group(1, 5, 12, 10),
            GroupRows { first: 5, rows: 5, scale_first: 256, status: STATUS_ROWS_OVER_BOUND }
        );
        assert_eq!(contiguous_group(2, 11, 12, 10).rows, 0);
        assert_eq!(
            contiguous_group(2, 8, 3, 10),
            GroupRows { first: 8, rows: 0, scale_first: 384, status: STATUS_OFFSETS_DECREASING }
        );
        assert_eq!(
            masked_group(2, 7, 5),
            GroupRows { first: 10, rows: 5, scale_first: 256, status: STATUS_COUNT_OVER_BOUND }
        );
        assert_eq!(masked_group(2, 5, 5).status, 0);
    }

    /// A tiny deterministic generator for the exhaustive checks below.
    fn next(state: &mut u64) -> u32 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*state >> 33) as u32
    }

    /// For arbitrary (also decreasing, also out-of-bound) offsets: every group's scale rows lie
    /// in the scale tensor, non-empty groups' 128-row blocks are disjoint when the offsets are
    /// non-decreasing, and the per-row lookup the quantizer does agrees with the per-group view.
    #[test]
    fn contiguous_rows_and_scale_rows_stay_in_bounds() {
        let mut st = 7u64;
        for case in 0..3000 {
            let groups = 1 + next(&mut st) % 12;
            let t = next(&mut st) % 700;
            let monotone = case % 3 != 0;
            let mut offsets: Vec<u32> = (0..=groups).map(|_| next(&mut st) % (t + 40 + 1)).collect();
            if monotone {
                offsets.sort();
                if case % 2 == 0 {
                    // Also within the bound, starting at 0.
                    offsets.iter_mut().for_each(|o| *o = (*o).min(t));
                    offsets[0] = 0;
                }
            }
            let s = contiguous(groups, t);
            let load = |i: u32| offsets[i as usize];
            let mut owner: Vec<Option<(u32, u32)>> = std::vec![None; t as usize];
            let mut blocks = std::vec![false; (s.scale_rows() / 128) as usize];
            let mut status = 0;
            for g in 0..groups {
                let r = s.group(g, load);
                status |= r.status;
                assert!(r.first + r.rows <= t);
                assert_eq!(r.scale_first % 128, 0);
                assert!(r.scale_first + r.rows <= s.scale_rows(), "case {case} g {g}: {r:?} {offsets:?}");
                if r.rows > 0 && status & STATUS_OFFSETS_DECREASING == 0 {
                    for b in r.scale_first / 128..(r.scale_first + r.rows).div_ceil(128) {
                        assert!(!blocks[b as usize], "block {b} shared");
                        blocks[b as usize] = true;
                    }
                    for row in r.first..r.first + r.rows {
                        owner[row as usize] = Some((g, r.scale_first + (row - r.first)));
                    }
                }
            }
            let in_bound = offsets.iter().all(|&o| o <= t);
            assert_eq!(status & STATUS_ROWS_OVER_BOUND != 0, !in_bound);
            let monotone_now = offsets.windows(2).all(|w| w[0] <= w[1]);
            assert_eq!(status & STATUS_OFFSETS_DECREASING != 0, !monotone_now);
            // The rows' end: the same from one share or 32 combined, and no row at or past it
            // is placed in a group.
            let end = s.rows_end_part(load, 0, 1);
            assert_eq!((0..32).map(|l| s.rows_end_part(load, l, 32)).max(), Some(end));
            assert!(end <= t);
            for row in 0..t {
                let got = s.locate(row, load);
                assert!(row < end || got.is_none(), "case {case} row {row} end {end} {offsets:?}");
                assert_eq!(got.map(|(_, sr)| sr), s.scale_row(row, load));
                if let Some((g, sr)) = got {
                    assert!(sr < s.scale_rows() && g < groups);
                }
                if monotone_now {
                    assert_eq!(got, owner[row as usize], "case {case} row {row} {offsets:?}");
                }
            }
        }
    }

    #[test]
    fn masked_rows() {
        let s = masked(3, 20);
        let counts = [0u32, 20, 25];
        let load = |i: u32| counts[i as usize];
        assert_eq!(s.scale_row(0, load), None);
        assert_eq!(s.scale_row(20, load), Some(128));
        assert_eq!(s.scale_row(39, load), Some(147));
        assert_eq!(s.scale_row(59, load), Some(275), "clamped count 25 → 20 covers the last row");
        assert_eq!(s.locate(39, load), Some((1, 147)));
        assert_eq!(s.locate(59, load), Some((2, 275)));
        assert_eq!(s.group(2, load).status, STATUS_COUNT_OVER_BOUND);
        assert_eq!(s.rows_end_part(load, 5, 32), s.token_rows());
    }

    /// The tile bound is the maximum over every way to split `T` tokens into `G` groups.
    #[test]
    fn max_tiles_is_the_maximum() {
        type Memo = std::collections::BTreeMap<(u32, u32), u64>;
        fn best(groups: u32, left: u32, tiles: &dyn Fn(u32) -> u32, memo: &mut Memo) -> u64 {
            if groups == 0 {
                return 0;
            }
            if let Some(&v) = memo.get(&(groups, left)) {
                return v;
            }
            let v = (0..=left).map(|m| tiles(m) as u64 + best(groups - 1, left - m, tiles, memo)).max().unwrap();
            memo.insert((groups, left), v);
            v
        }
        for groups in 1..5 {
            let (mut memo, mut memo16, mut busy) = (Memo::new(), Memo::new(), Memo::new());
            for t in (0..400).step_by(7) {
                let s = contiguous(groups, t);
                assert_eq!(max_m_tiles(&s), best(groups, t, &sm90_m_tiles, &mut memo), "G={groups} T={t}");
                assert_eq!(max_tiles(&s, 16), best(groups, t, &|m| m.div_ceil(16), &mut memo16), "G={groups} T={t}");
                assert_eq!(max_busy_groups(&s), best(groups, t, &|m| (m > 0) as u32, &mut busy), "G={groups} T={t}");
            }
        }
        assert_eq!(max_m_tiles(&masked(5, 16)), 5);
        assert_eq!(max_m_tiles(&masked(5, 300)), 15);
        assert_eq!((max_tiles(&masked(5, 40), 16), max_busy_groups(&masked(5, 40))), (15, 5));
        assert_eq!(sm90_m_tiles(0), 0);
        // The sm_90a token tiles are the sm_100a M tiles (128 rows).
        for m in 0..2000 {
            assert_eq!(sm90_m_tiles(m), m.div_ceil(crate::sm100::config::BLOCK_M), "m {m}");
        }
    }
}
