//! The shape rules and size limits of every problem and call, defined once: what the kernels
//! need (`k` and `n` multiples), what they can index, what a device can hold, and how much work
//! the planner takes on. [`crate::Problem::new`], [`crate::MoeProblem::new`] and the quantizer
//! check them; [`crate::Problem::new`] and [`crate::MoeProblem::new`] refuse a shape beyond a
//! limit with [`Error::TooLarge`](crate::Error::TooLarge), which names the group, the field and the [`Limit`], in time
//! proportional to the number of groups (before any planning).
//!
//! Shape rules (the numbers the kernels rely on):
//! - `k` is a positive multiple of [`K_MULTIPLE`] (64): whole 4-scale words per row, so the
//!   blocked scale layout has no padding columns, and whole MMA steps on both architectures.
//! - `n` is a positive multiple of [`N_MULTIPLE`] (8): every row of C starts 16-byte aligned
//!   and the epilogues' 16-byte stores lie wholly inside or outside a row.
//!
use std::fmt;

/// `k` (values per row of both operands) is a positive multiple of this (the abi's
/// [`nvfp4_gemm_abi::quantize::K_MULTIPLE`], which the quantizer and both GEMMs share).
pub const K_MULTIPLE: usize = nvfp4_gemm_abi::quantize::K_MULTIPLE as usize;

/// `n` (rows of B, columns of C) is a positive multiple of this: 8 16-bit elements, 16 bytes.
pub const N_MULTIPLE: usize = 8;

/// Every device buffer a kernel reads or writes starts on this many bytes (TMA and bulk copies
/// need 16).
pub const BUFFER_ALIGN: u64 = 16;

/// How many calls' buffers a plan keeps ready: its table sets (a call whose buffers one holds
/// only launches) and the validated calls whose buffers it need not check again.
pub const CALLS_KEPT: usize = 16;

/// Bytes of `rows × k/16` e4m3 scales in the 128x4 blocked layout: rows padded to 128, scale
/// columns to 4 (docs/format.md).
pub const fn blocked_bytes(rows: usize, k: usize) -> usize {
    rows.div_ceil(128) * k.div_ceil(64) * 512
}

/// Whether `k` follows the rule: a positive multiple of [`K_MULTIPLE`].
pub const fn k_is_valid(k: usize) -> bool {
    k > 0 && k % K_MULTIPLE == 0
}

/// Whether `n` follows the rule: a positive multiple of [`N_MULTIPLE`].
pub const fn n_is_valid(n: usize) -> bool {
    n > 0 && n % N_MULTIPLE == 0
}

/// Why `k` breaks the rule, if it does (for errors).
pub(crate) fn k_rule(k: usize) -> Option<String> {
    (!k_is_valid(k)).then(|| format!("{k} is not a positive multiple of {K_MULTIPLE}"))
}

/// Why `n` breaks the rule, if it does (for errors).
pub(crate) fn n_rule(n: usize) -> Option<String> {
    (!n_is_valid(n)).then(|| format!("{n} is not a positive multiple of {N_MULTIPLE}"))
}

/// Most groups of one problem, host-sized or device-sized (the abi's bound: the device scheduler's
/// shared-memory tables are sized for it).
pub const MAX_GROUPS: usize = nvfp4_gemm_abi::moe::MAX_GROUPS as usize;

/// Largest `m`, `n` or `k` of a group (and token bound of a device-sized problem).
pub const MAX_DIM: usize = 1 << 22;

/// Most bytes of device memory the buffers of one call may need, the plan's workspace included:
/// 256 GiB, more than any GPU these kernels run on has (H100 and H200: at most 141 GB; B200:
/// 192 GB). A problem beyond it cannot be given its buffers anywhere.
pub const MAX_DEVICE_BYTES: u64 = 1 << 38;

/// Most output tiles of a host-sized problem, counted as 128 x 128 tiles of C over all groups
/// (`Σ ⌈m/128⌉ · ⌈n/128⌉`; each variant's work list has at most this many items, or four times as
/// many with sm_100a's cluster padding). The planner's time and host memory grow linearly with
/// them; `2^22` tiles are `2^36` outputs, 128 GiB of C.
pub const MAX_TILES: u64 = 1 << 22;

/// Exclusive bound on the element counts a device-sized problem's kernels index in 32 bits (its
/// token tensor, scale tensor and output, and its work list's capacity).
pub const INDEX_LIMIT: u64 = 1 << 31;

// The sm_90a token dequantization's `u32` item count (`m · k / 64`) stays below 2^31 for any
// workspace of at most `MAX_DEVICE_BYTES` (2 bytes per value).
const _: () = assert!(MAX_DEVICE_BYTES / 2 / 64 <= 1 << 31);
// A work list stays inside the kernels' `u32` walk: sm_100a pads at most 4x, an sm_90a balanced
// list with holes has at most `items · CTAs` entries (a grid of fewer than 1024 CTAs).
const _: () = assert!(MAX_TILES * 1024 <= 1 << 32);

/// Which limit a shape exceeded (in [`Error::TooLarge`](crate::Error::TooLarge)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Limit {
    /// [`MAX_GROUPS`] groups.
    Groups,
    /// [`MAX_DIM`] per dimension.
    Dim,
    /// [`MAX_DEVICE_BYTES`] of buffers.
    DeviceBytes,
    /// [`MAX_TILES`] output tiles.
    Tiles,
    /// [`INDEX_LIMIT`] (exclusive) on a device-sized problem's 32-bit element counts.
    Index32,
}

impl Limit {
    /// The largest value allowed.
    pub const fn max(self) -> u64 {
        match self {
            Limit::Groups => MAX_GROUPS as u64,
            Limit::Dim => MAX_DIM as u64,
            Limit::DeviceBytes => MAX_DEVICE_BYTES,
            Limit::Tiles => MAX_TILES,
            Limit::Index32 => INDEX_LIMIT - 1,
        }
    }

    /// Whether the limit bounds a total over the groups (bytes, tiles), whose running value
    /// [`Error::TooLarge`](crate::Error::TooLarge) reports at the group that crosses it.
    pub const fn is_total(self) -> bool {
        matches!(self, Limit::DeviceBytes | Limit::Tiles)
    }

    /// Why the limit exists, for messages.
    fn reason(self) -> &'static str {
        match self {
            Limit::Groups => "groups (the group tables' size)",
            Limit::Dim => "per dimension (the kernels' 32-bit indices)",
            Limit::DeviceBytes => "bytes of device memory for the call's buffers (more than any supported GPU has)",
            Limit::Tiles => "output tiles of 128 x 128 (the planner's bound)",
            Limit::Index32 => "elements (the kernels' 32-bit indexing)",
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at most {} {}", self.max(), self.reason())
    }
}

/// Output tiles of an `m x n` group as [`MAX_TILES`] counts them: `⌈m/128⌉ · ⌈n/128⌉`.
pub(crate) fn output_tiles(m: usize, n: usize) -> u64 {
    (m as u64).div_ceil(128) * (n as u64).div_ceil(128)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::problem::{GroupShape, OutputType, Problem};
    use std::time::Instant;

    fn too_large(shapes: Vec<GroupShape>) -> (Option<usize>, &'static str, Limit) {
        match Problem::new(shapes, OutputType::F16).unwrap_err() {
            Error::TooLarge { group, field, limit, value } => {
                assert!(value > limit.max());
                (group, field, limit)
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
    }

    /// The shapes (a C of 2^44 elements; the same in 4096 groups) are refused in
    /// microseconds, naming the group, the field and the limit.
    #[test]
    fn huge_shapes_are_refused_at_once() {
        let ok = GroupShape::new(96, 256, 512);
        let huge = GroupShape::new(1 << 22, 1 << 22, 64);
        let t = Instant::now();
        let e = Problem::new(vec![ok, huge], OutputType::F16).unwrap_err();
        let one = t.elapsed();
        assert_eq!(too_large(vec![ok, huge]), (Some(1), "c", Limit::DeviceBytes));
        let t = Instant::now();
        let many = too_large(vec![huge; MAX_GROUPS]);
        let all = t.elapsed();
        assert_eq!(many, (Some(0), "c", Limit::DeviceBytes));
        println!(
            "refusing 2^22 x 2^22: {:.1} us (one group), {:.1} us (4096 groups)",
            one.as_secs_f64() * 1e6,
            all.as_secs_f64() * 1e6
        );
        let text = e.to_string();
        assert!(
            text.starts_with("group 1: `c` brings the problem's total to") && text.contains("274877906944"),
            "{text}"
        );
        // Far below any plausible machine's time for O(groups) work, even shared.
        assert!(one.as_millis() < 100 && all.as_millis() < 100);
    }

    #[test]
    fn shape_rules() {
        assert_eq!(K_MULTIPLE, 64);
        assert!([64, 128, 7168, MAX_DIM].iter().all(|&k| k_is_valid(k)));
        assert!([0, 16, 48, 100, 7000].iter().all(|&k| !k_is_valid(k)));
        assert!([8, 136, 4096].iter().all(|&n| n_is_valid(n)));
        assert!([0, 4, 12, 250].iter().all(|&n| !n_is_valid(n)));
        assert_eq!(k_rule(100).as_deref(), Some("100 is not a positive multiple of 64"));
        assert_eq!(n_rule(12).as_deref(), Some("12 is not a positive multiple of 8"));
        assert_eq!((k_rule(64), n_rule(8)), (None, None));
        // The stacked parts stay 16-byte aligned under these rules (A and B rows of K/2 bytes,
        // C rows of N 16-bit elements).
        assert_eq!((K_MULTIPLE / 2) % 16, 0);
        assert_eq!((2 * N_MULTIPLE) % 16, 0);
    }

    #[test]
    fn every_limit_names_its_field() {
        let s = |m, n, k| GroupShape::new(m, n, k);
        assert_eq!(too_large(vec![s(1, 8, 64), s(MAX_DIM + 1, 8, 64)]), (Some(1), "m", Limit::Dim));
        assert_eq!(too_large(vec![s(1, MAX_DIM + 8, 64)]), (Some(0), "n", Limit::Dim));
        assert_eq!(too_large(vec![s(1, 8, MAX_DIM + 64)]), (Some(0), "k", Limit::Dim));
        // A alone beyond a device: m · k / 2 bytes.
        assert_eq!(too_large(vec![s(MAX_DIM, 8, MAX_DIM)]), (Some(0), "a.values", Limit::DeviceBytes));
        assert_eq!(too_large(vec![s(8, MAX_DIM, MAX_DIM)]), (Some(0), "b.values", Limit::DeviceBytes));
        // The sm_90a workspace (2 · m · k bytes) tips a problem whose operands alone would fit:
        // each group's A is 32 GiB of values, its workspace 4x that.
        assert_eq!(too_large(vec![s(1 << 20, 8, 1 << 16); 2]), (Some(1), "workspace", Limit::DeviceBytes));
        // Tiles: 4096 groups of 32 x 32 tiles are exactly the limit (C: 128 GiB); one row more
        // in the last group is one tile row more.
        let at_limit = vec![s(4096, 4096, 64); MAX_GROUPS];
        assert_eq!(at_limit.iter().map(|g| output_tiles(g.m, g.n)).sum::<u64>(), MAX_TILES);
        assert!(Problem::new(at_limit.clone(), OutputType::F16).is_ok());
        let mut over = at_limit;
        over[MAX_GROUPS - 1].m += 1;
        assert_eq!(too_large(over), (Some(MAX_GROUPS - 1), "tiles", Limit::Tiles));
        assert_eq!(too_large(vec![s(1, 8, 64); MAX_GROUPS + 1]), (None, "groups", Limit::Groups));
    }

    /// The largest problem the limits accept (one group of 2^11 x 2^11 tiles of 128, 128 GiB of
    /// C) plans through both architectures' pure layouts: the planner's work is bounded by the
    /// limits (its time printed).
    #[test]
    fn the_largest_accepted_problem_plans() {
        let big = GroupShape::new(1 << 18, 1 << 18, 64);
        let p = Problem::new(vec![big], OutputType::F16).unwrap();
        assert_eq!(output_tiles(big.m, big.n), MAX_TILES);
        assert!(Problem::new(vec![GroupShape::new((1 << 18) + 1, 1 << 18, 64)], OutputType::F16).is_err());
        let t = Instant::now();
        let sm90 = crate::sm90::Sm90Layout::new(&p, 132);
        let sm90_time = t.elapsed();
        let items = sm90.work.iter().filter(|w| !w.is_hole()).count() as u64;
        assert!(items > 0 && items <= MAX_TILES && sm90.work.len() < 1 << 32);
        let t = Instant::now();
        let sm100 =
            crate::sm100::Sm100Layout::new(&p, |k| k.config().resident_ctas(148, k.config().max_ctas_per_sm(), 37))
                .unwrap();
        let sm100_time = t.elapsed();
        assert!(sm100.tiles() as u64 >= MAX_TILES / 2);
        println!(
            "planning {MAX_TILES} tiles: sm_90a layout {:.2} s ({:?}), sm_100a layout {:.2} s",
            sm90_time.as_secs_f64(),
            sm90.config.kernel_name(),
            sm100_time.as_secs_f64()
        );
    }

    #[test]
    fn blocked_bytes_is_the_abi_s() {
        for rows in [0usize, 1, 127, 128, 129, 300] {
            for k in [64usize, 128, 192, 7168] {
                let abi = nvfp4_gemm_abi::scale_layout::blocked_bytes(rows as u32, k as u32);
                assert_eq!(blocked_bytes(rows, k), abi, "{rows} x {k}");
            }
        }
    }
}
