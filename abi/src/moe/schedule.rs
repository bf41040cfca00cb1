//! What the device schedulers (`sm90_schedule`, `sm100_schedule`: one scheduler generic over a
//! tile policy, `kernel/src/schedule.rs`) share: the thread ↔ group assignment, the parameters
//! common to both architectures, the shared-memory layout, and the longest-processing-time-first
//! (LPT) order of the host's sm_90a work lists, computed on the device ([`lpt_picks`]).
//!
//! A scheduler is one CTA of [`SCHEDULE_THREADS`] threads. Thread `t` owns the consecutive groups
//! [`thread_groups`]`(G, t)`; it reads their sizes, sums per-group values ([`SUMS`] of them:
//! tiles, dequantization CTAs, ...), and a CTA-wide exclusive prefix sum gives each group its
//! first work item. A second pass writes each group's size-dependent table fields and two words
//! for the fill ([`smem::group_word`]); after a barrier, warp `w` writes the items of groups
//! `w, w + warps, ...`; thread 0 writes the list's length and ORs the status bits.

use super::DeviceSizes;

/// Threads of a scheduling kernel's single CTA: the most a CTA may have. The fill writes a
/// group's items with one warp, a chain of dependent loads, divisions and stores per group, so
/// the kernel's time is the groups per warp times that chain: more warps, fewer groups each.
pub const SCHEDULE_THREADS: u32 = 1024;

/// Registers a scheduling thread may use, so that the CTA fits an SM.
pub const SCHEDULE_REGISTERS: u32 = crate::launch::REGISTERS_PER_SM / SCHEDULE_THREADS;
/// The sm_90a schedulers' register caps (`.maxnreg`, see `cargo xtask build-ptx`): alone, and
/// in the MoE block's launch with the quantization (`moe::sm90::QUANTIZE_SCHEDULE_KERNEL`).
pub const REGISTER_CAPS_SM90: [(&str, u32); 2] =
    [("sm90_schedule", SCHEDULE_REGISTERS), ("sm90_quantize_schedule", SCHEDULE_REGISTERS)];
/// The sm_100a scheduler's.
pub const REGISTER_CAPS_SM100: [(&str, u32); 1] = [("sm100_schedule", SCHEDULE_REGISTERS)];

/// Values each scheduling thread sums over its groups (unused ones are zero).
pub const SUMS: usize = 3;

/// Shift of a policy's own flags in the word a scheduler ORs over the CTA with the status bits
/// (which stay below it); they never reach the status word.
pub const FLAG_SHIFT: u32 = 16;

/// Groups each scheduling thread handles (consecutive groups, for the prefix sums): thread `t`
/// takes groups `t · per .. (t + 1) · per`.
pub const fn groups_per_thread(groups: u32) -> u32 {
    groups.div_ceil(SCHEDULE_THREADS)
}

/// The groups scheduling thread `tid` handles: `first .. end` (empty, possibly with
/// `first > end`, for the threads past the last group).
pub const fn thread_groups(groups: u32, tid: u32) -> (u32, u32) {
    let per = groups_per_thread(groups);
    let first = tid * per;
    (first, if first + per < groups { first + per } else { groups })
}

/// The parameters both schedulers read: from the device sizes, each group's size-dependent
/// fields of the architecture's group table (whose other fields the host wrote), the work list,
/// and the status bits of any clamping.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ScheduleCommon {
    /// The device sizes.
    pub sizes: DeviceSizes,
    /// Device address of the architecture's `GroupParams[G]` (read and written).
    pub groups: u64,
    /// Device address of the `WorkItem` list (written).
    pub work: u64,
    /// Device address of the `u32` sticky status word (bits ORed in).
    pub status: u64,
    /// Blocked scales of A (scale row `s` of a block-aligned group at `s · K/16`).
    pub a_scales: u64,
    /// C, `[token_rows, n]` 16-bit elements.
    pub c: u64,
    /// K of every group.
    pub k: u32,
    /// N of every group (the row length of C).
    pub n: u32,
}

const _: () = assert!(core::mem::size_of::<ScheduleCommon>() == 72);

/// Parameters of `sm100_schedule`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Sm100ScheduleParams {
    /// The common part.
    pub common: ScheduleCommon,
    /// Device address of the `u32` work length the GEMM reads (written).
    pub work_len: u64,
    /// Capacity of the work list (256-wide: a multiple of 4).
    pub max_work: u32,
    /// The GEMM's tile width, 128 or 256, which fixes the list's order
    /// (`crate::sm100::schedule::device_item_index`).
    pub block_n: u32,
}

const _: () = assert!(core::mem::size_of::<Sm100ScheduleParams>() == 88);

/// Most CTAs an LPT list is balanced over ([`lpt_picks`]; each of the first [`LPT_THREADS`]
/// scheduling threads places `LPT_MAX_CTAS / LPT_THREADS` of them).
pub const LPT_MAX_CTAS: u32 = 1024;

/// The scheduling threads that place an LPT list's CTAs (the others wait at its barriers): four
/// CTAs each, a loop the compiler keeps rolled, where one or two per thread unroll the picks into
/// more registers than [`SCHEDULE_REGISTERS`].
pub const LPT_THREADS: u32 = 256;
const _: () = assert!(LPT_THREADS <= SCHEDULE_THREADS && LPT_MAX_CTAS % LPT_THREADS == 0);

/// Byte offsets in a scheduling kernel's dynamic shared memory: the per-warp sums and status
/// (the layout of the kernel's `scan::cta_exclusive_sums`), a per-warp scratch row for CTA-wide
/// reductions, then two words per group.
pub mod smem {
    use super::{SCHEDULE_THREADS, SUMS};

    /// Warps of the scheduling CTA.
    pub const WARPS: u32 = SCHEDULE_THREADS / 32;
    /// Per-warp sums (value `j` of warp `w` at word `WARPS · j + w`), then the per-warp status.
    pub const WARP_TABLE: u32 = 0;
    /// One word per warp for CTA-wide reductions.
    pub const REDUCE: u32 = WARP_TABLE + 4 * WARPS * (SUMS as u32 + 1);
    /// Two words per group, written before the fill's barrier (the policy says what they hold).
    pub const GROUPS: u32 = REDUCE + 4 * WARPS;
    /// Word `i` (0 or 1) of group `g`.
    pub const fn group_word(g: u32, i: u32) -> u32 {
        GROUPS + 4 * (2 * g + i)
    }
    /// Bytes of dynamic shared memory for `groups` groups.
    pub const fn bytes(groups: u32) -> u32 {
        group_word(groups, 0)
    }
}

/// The loads of an LPT list's CTAs before a cost class: `high` on the CTAs below `split`, `low`
/// on the others (`high ≥ low`). The device lists have two classes (a kernel's full and narrow
/// tiles) and the first starts on empty CTAs, so these are the only loads a class starts from:
/// [`StepLoads::ZERO`] for the first, [`StepLoads::after_first`] for the second.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepLoads {
    pub low: u32,
    pub high: u32,
    pub split: u32,
}

impl StepLoads {
    /// Every CTA empty.
    pub const ZERO: StepLoads = StepLoads { low: 0, high: 0, split: 0 };

    /// The loads after a class of `count` items of cost `cost` placed on empty CTAs: the greedy
    /// then deals the items round robin (every CTA ties, the lowest index wins), so CTA `b` holds
    /// `⌈(count − b) / grid⌉` of them: `q + 1` below `r` and `q` from `r` on, `count = q·grid + r`.
    #[inline(always)]
    pub fn after_first(count: u32, cost: u32, grid: u32) -> StepLoads {
        let grid = if grid == 0 { 1 } else { grid };
        let (q, r) = (count / grid, count % grid);
        StepLoads { low: q * cost, high: (q + (r > 0) as u32) * cost, split: r }
    }

    /// CTA `i`'s load.
    #[inline(always)]
    pub fn load(self, i: u32) -> u32 {
        if i < self.split {
            self.high
        } else {
            self.low
        }
    }
}

/// The picks of CTA `b` in one cost class of the host's LPT order, on the device.
///
/// The host (`host/src/sm90`, `balance`) lays out a work list for a persistent grid of `grid`
/// CTAs: the items sorted by cost, longest first (stable: items of equal cost keep the order
/// group, weight tile, token tile), each to the CTA with the least load so far (ties: the lowest
/// index), CTA `b`'s `p`-th item at list index `p · grid + b` (holes where a CTA has fewer). The
/// device lists have two cost classes (a kernel's full and narrow tiles; every group has the same
/// K). Within a class of cost `c`, starting from loads `L_i`, the greedy's picks are the `count`
/// smallest of the pairs `(L_i + j·c, i)`, `j ≥ 0`, ordered by value then index: after a pick
/// `(v, i)` the CTA's next candidate is `(v + c, i)`, and every other candidate is at least
/// `(v, i)`. So the rank of CTA `b`'s pick `j` among the class's picks is the number of pairs
/// below `(L_b + j·c, b)`: from CTA `i` with `L_i ≤ v`, `⌈(v − L_i) / c⌉` pairs, one more when
/// `c` divides `v − L_i` and `i < b`. With [`StepLoads`] that is two terms, whatever the grid.
///
/// Calls `emit(rank, j)` for each pick `j` of CTA `b` (rank: the pick's place in the class, i.e.
/// the class's `rank`-th item in the host's order goes to CTA `b`'s queue position `j` after its
/// earlier classes' items) and returns the number of picks. Loads plus `count · cost` must fit
/// `u32` (the plan checks [`lpt_fits_u32`]).
#[inline(always)]
pub fn lpt_picks(b: u32, grid: u32, cost: u32, count: u32, loads: StepLoads, mut emit: impl FnMut(u32, u32)) -> u32 {
    // Costs are at least 1 (a 0 would be taken as 1); the test keeps division-by-zero panics
    // out of the device code.
    let cost = if cost == 0 { 1 } else { cost };
    let div = Divisor::new(cost);
    let split = if loads.split < grid { loads.split } else { grid };
    // Pairs below `(v, b)` from the CTAs `s..e`, all of load `l`.
    let below = |v: u32, l: u32, s: u32, e: u32| -> u32 {
        if s >= e || l > v {
            return 0;
        }
        let d = v - l;
        let q = div.quotient(d);
        let exact = q * cost == d;
        let lower = if b <= s {
            0
        } else if b < e {
            b - s
        } else {
            e - s
        };
        (e - s) * (q + !exact as u32) + if exact { lower } else { 0 }
    };
    let lb = loads.load(b);
    let mut j = 0;
    loop {
        let v = lb + j * cost;
        let rank = below(v, loads.high, 0, split) + below(v, loads.low, split, grid);
        if rank >= count {
            return j;
        }
        emit(rank, j);
        j += 1;
    }
}

/// Division of any `u32` by a fixed divisor `c ≥ 1` through a multiply-high and two shifts
/// (Granlund and Montgomery, "Division by invariant integers using multiplication", PLDI 1994,
/// §4): with `l = ⌈log₂ c⌉` and `m = ⌊2³² · (2ˡ − c) / c⌋ + 1`, `n / c = (t + ((n − t) >> s₁)) >>
/// s₂` where `t = (m · n) >> 32`, `s₁ = min(l, 1)`, `s₂ = max(l − 1, 0)`; exact for every `n`.
/// The GPU divides a `u32` by a variable in ~20 instructions with two dependent conversions;
/// this takes four.
#[derive(Clone, Copy, Debug)]
pub struct Divisor {
    m: u32,
    s1: u32,
    s2: u32,
}

impl Divisor {
    /// The divisor `c` (at least 1).
    #[inline(always)]
    pub fn new(c: u32) -> Divisor {
        let c = if c == 0 { 1 } else { c };
        let l = 32 - (c - 1).leading_zeros();
        let m = (((1u64 << l) - c as u64) << 32) / c as u64 + 1;
        Divisor { m: m as u32, s1: if l == 0 { 0 } else { 1 }, s2: if l == 0 { 0 } else { l - 1 } }
    }

    /// `n / c`.
    #[inline(always)]
    pub fn quotient(self, n: u32) -> u32 {
        let t = ((self.m as u64 * n as u64) >> 32) as u32;
        (t + ((n - t) >> self.s1)) >> self.s2
    }
}

/// Capacity of an LPT list of at most `max_items` items over `grid` CTAs whose items cost
/// `costs` (any order): a CTA's load is at most the average plus its last item (it took that
/// item with the least load), and each of its items costs at least the cheaper cost, so no CTA
/// holds more than `(max_items · c_max / grid + c_max) / c_min` items, and the list with its
/// holes is at most `grid` times that. `max_items` when the list is not balanced (`grid` 0 or at
/// least `max_items`: the host keeps the plain order then).
pub const fn lpt_list_capacity(max_items: u32, grid: u32, costs: [u32; 2]) -> u64 {
    if grid == 0 || max_items <= grid {
        return max_items as u64;
    }
    let (hi, lo) = if costs[0] > costs[1] { (costs[0], costs[1]) } else { (costs[1], costs[0]) };
    let depth = (max_items as u64 * hi as u64 + grid as u64 * hi as u64) / (grid as u64 * lo as u64);
    let list = depth * grid as u64;
    if list > max_items as u64 {
        list
    } else {
        max_items as u64
    }
}

/// Whether every value [`lpt_picks`] computes for at most `max_items` items over `grid` CTAs
/// fits `u32`: a load is at most `max_items · c_max / grid + c_max`, and the next candidate one
/// cost more.
pub const fn lpt_fits_u32(max_items: u32, grid: u32, costs: [u32; 2]) -> bool {
    if grid == 0 {
        return false;
    }
    let hi = if costs[0] > costs[1] { costs[0] } else { costs[1] } as u64;
    max_items as u64 * hi / grid as u64 + 3 * hi < u32::MAX as u64
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    fn next(state: &mut u64) -> u32 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (*state >> 33) as u32
    }

    /// The `count` smallest pairs `(L_i + j·c, i)` as `(i, j, rank)`, sorted by CTA and pick.
    fn smallest_pairs(loads: &[u32], cost: u32, count: u32) -> Vec<(u32, u32, u32)> {
        let mut pairs: Vec<(u32, u32, u32)> = (0..loads.len() as u32)
            .flat_map(|i| (0..count + 1).map(move |j| (i, j)))
            .map(|(i, j)| (loads[i as usize] + j * cost, i, j))
            .collect();
        pairs.sort();
        let mut picks: Vec<(u32, u32, u32)> =
            pairs[..count as usize].iter().enumerate().map(|(r, &(_, i, j))| (i, j, r as u32)).collect();
        picks.sort();
        picks
    }

    /// The picks of every CTA against the definition: the `count` smallest pairs `(L_i + j·c, i)`,
    /// from step loads of every shape (none, all equal, a split at 0, inside and at the grid).
    #[test]
    fn lpt_picks_are_the_smallest_pairs() {
        let mut st = 3u64;
        for case in 0..600 {
            // Mostly small grids; some as large as the H100's and beyond.
            let grid = if case % 40 == 7 { 100 + next(&mut st) % 200 } else { 1 + next(&mut st) % 40 };
            let cost = 1 + next(&mut st) % 300;
            let loads = match case % 5 {
                0 => StepLoads::ZERO,
                1 => {
                    let l = next(&mut st) % 1000;
                    StepLoads { low: l, high: l, split: next(&mut st) % (grid + 1) }
                }
                _ => {
                    let low = next(&mut st) % 1000;
                    // Steps of a multiple of the cost (as `after_first` gives when both classes
                    // cost the same) and of any size.
                    let step = if case % 5 == 2 { cost * (1 + next(&mut st) % 3) } else { 1 + next(&mut st) % 700 };
                    StepLoads { low, high: low + step, split: next(&mut st) % (grid + 1) }
                }
            };
            let per_cta: Vec<u32> = (0..grid).map(|i| loads.load(i)).collect();
            let count = next(&mut st) % (4 * grid + 5);
            let expected = smallest_pairs(&per_cta, cost, count);
            let mut got = Vec::new();
            let mut total = 0;
            for b in 0..grid {
                total += lpt_picks(b, grid, cost, count, loads, |r, j| got.push((b, j, r)));
            }
            assert_eq!(total, count, "case {case}");
            assert_eq!(got, expected, "case {case}: loads {loads:?} cost {cost} grid {grid}");
        }
    }

    /// `after_first` is what the greedy leaves: each CTA's pairs among the class's picks, times
    /// the cost.
    #[test]
    fn after_first_is_the_greedys_loads() {
        let mut st = 11u64;
        for case in 0..300 {
            let grid = if case % 30 == 0 { 132 } else { 1 + next(&mut st) % 60 };
            let cost = 1 + next(&mut st) % 400;
            let count = next(&mut st) % (6 * grid + 3);
            let mut want = vec![0u32; grid as usize];
            for (i, _, _) in smallest_pairs(&vec![0; grid as usize], cost, count) {
                want[i as usize] += cost;
            }
            let step = StepLoads::after_first(count, cost, grid);
            let got: Vec<u32> = (0..grid).map(|i| step.load(i)).collect();
            assert_eq!(got, want, "grid {grid} cost {cost} count {count}");
        }
    }

    /// The multiply-high division against `/`: every divisor up to 2¹⁶ and powers of two
    /// (and their neighbours) with random and extreme dividends.
    #[test]
    fn divisor_is_exact() {
        let mut st = 5u64;
        let mut divisors: Vec<u32> = (1..=1 << 16).collect();
        for k in 0..32 {
            let p = 1u32 << k;
            divisors.extend([p.wrapping_sub(1).max(1), p, p.wrapping_add(1).max(1)]);
        }
        divisors.extend((0..2000).map(|_| next(&mut st) | 1).chain([u32::MAX, u32::MAX - 1]));
        for &c in &divisors {
            let d = Divisor::new(c);
            let mut dividends = [0, 1, c - 1, c, c.wrapping_add(1), u32::MAX, u32::MAX - 1, 0, 0, 0];
            for n in dividends.iter_mut().skip(7) {
                *n = next(&mut st).wrapping_mul(2654435761) ^ next(&mut st);
            }
            for n in dividends {
                assert_eq!(d.quotient(n), n / c, "{n} / {c}");
            }
        }
    }

    #[test]
    fn list_capacity() {
        assert_eq!(lpt_list_capacity(100, 132, [228, 116]), 100);
        assert_eq!(lpt_list_capacity(100, 0, [228, 116]), 100);
        // 1000 items of at most 228 over 132 CTAs: at most (1000 · 228 / 132 + 228) / 116 = 16
        // items per CTA.
        assert_eq!(lpt_list_capacity(1000, 132, [228, 116]), 16 * 132);
        assert_eq!(lpt_list_capacity(1000, 132, [116, 228]), 16 * 132);
        assert!(lpt_fits_u32(1 << 20, 132, [228, 116]));
        assert!(!lpt_fits_u32(u32::MAX, 1, [228, 116]));
        assert!(!lpt_fits_u32(10, 0, [228, 116]));
    }

    #[test]
    fn shared_memory_and_threads() {
        // 32 warps: four words each for the scan, one for reductions.
        assert_eq!(smem::bytes(0), 4 * (32 * 4 + 32));
        assert_eq!(smem::group_word(1, 1) - smem::group_word(0, 0), 12);
        assert_eq!((groups_per_thread(1), groups_per_thread(1024), groups_per_thread(1025)), (1, 1, 2));
        assert_eq!(groups_per_thread(super::super::MAX_GROUPS), 4);
        assert_eq!([0, 1, 1023].map(|t| thread_groups(1100, t)), [(0, 2), (2, 4), (2046, 1100)]);
        assert_eq!([0, 99, 100].map(|t| thread_groups(100, t)), [(0, 1), (99, 100), (100, 100)]);
        assert_eq!(SCHEDULE_REGISTERS, 64);
        assert!(smem::bytes(super::super::MAX_GROUPS) <= 48 * 1024, "no opt-in needed");
    }
}
