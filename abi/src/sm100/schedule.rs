//! The persistent schedule: the host-built list of output tiles each kernel variant walks.
//!
//! The seed launches one kernel per tile width, each over its own list of
//! [`WorkItem`]s; CTA `b` takes items `b, b + grid, b + 2*grid, ...`. The order of the list is
//! the schedule:
//! - 128-wide tiles go N-tile-major across groups (for `tile_n`, for group, for `tile_m`), so a
//!   wave of CTAs reads the same B column strip of several groups while it is in L2;
//! - 256-wide tiles go group, `tile_m`, `tile_n`, and each `(group, tile_m)` run is padded to a
//!   multiple of the cluster size, so the 4 CTAs of a cluster always share one A tile (which rank
//!   0 multicasts).
//!
//! Everything here is allocation-free: the caller sizes the buffer with [`work_list_len`] and
//! [`build_work_list`] fills it.
//!
//! Both orders are the seed's and ran on hardware (docs/provenance.md §2, the work-item row).
//!
//! With device-resident group sizes (`crate::moe`) the list is built on the device by
//! `sm100_schedule`, in the same order: [`slots_per_m_tile`], [`slot_tile_n`] and
//! [`device_item_index`] say where each item goes (docs/moe.md §2b).

use super::config::{choose_block_n, for_block_n, BlockN, BLOCK_M};

pub use crate::work::WorkItem;

/// The shape of one group's GEMM: `C[m, n] = A[m, k] · B[n, k]ᵀ`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GroupShape {
    /// Rows of A and C (tokens); 0 skips the group.
    pub m: u32,
    /// Rows of B, columns of C.
    pub n: u32,
    /// Shared dimension, in FP4 values.
    pub k: u32,
}

impl GroupShape {
    /// The tile width the seed uses for this group ([`choose_block_n`]).
    pub const fn block_n(self) -> BlockN {
        choose_block_n(self.n, self.k)
    }

    /// Tiles along M: `ceil(m / 128)`.
    pub const fn tiles_m(self) -> u32 {
        self.m.div_ceil(BLOCK_M)
    }

    /// Tiles along N at this group's width: `ceil(n / BLOCK_N)`.
    pub const fn tiles_n(self) -> u32 {
        self.n.div_ceil(self.block_n().get())
    }
}

/// The buffer passed to [`build_work_list`] is shorter than the list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WorkListTooSmall {
    /// The length the list needs ([`work_list_len`]).
    pub needed: usize,
}

const fn in_list(g: GroupShape, block_n: BlockN) -> bool {
    g.block_n() as u32 == block_n as u32
}

/// Length of the `block_n` list for `groups`, padding included.
pub const fn work_list_len(groups: &[GroupShape], block_n: BlockN) -> usize {
    let cluster = for_block_n(block_n).cluster_size();
    let mut total = 0usize;
    let mut i = 0;
    while i < groups.len() {
        let g = groups[i];
        if in_list(g, block_n) {
            let per_row = g.tiles_n().next_multiple_of(cluster);
            let per_row = if g.tiles_n() == 0 { 0 } else { per_row };
            total += g.tiles_m() as usize * per_row as usize;
        }
        i += 1;
    }
    total
}

/// Writes the seed's work list for the groups that use `block_n` tiles into `out` and returns
/// its length; `Err` (with nothing promised about `out`) when `out` is too short.
///
/// - [`BlockN::N128`]: `for tile_n { for group { for tile_m } }`, skipping groups with fewer N
///   tiles.
/// - [`BlockN::N256`]: `for group { for tile_m { for tile_n } }`, each `tile_m` run padded with
///   copies of `(group, tile_m, 0)` up to a multiple of 4. A padding item recomputes tile
///   `(group, tile_m, 0)` and stores the same values again: harmless, and it keeps its cluster
///   full for the multicast. (Alternative: a flag telling the kernel to skip the store.)
///
/// Groups with `m = 0` or `n = 0` contribute nothing. Groups with `k = 0` still get items; the
/// kernel must then store zeros without running an MMA (the seed does not handle `k = 0`).
pub const fn build_work_list(
    groups: &[GroupShape],
    block_n: BlockN,
    out: &mut [WorkItem],
) -> Result<usize, WorkListTooSmall> {
    let needed = work_list_len(groups, block_n);
    if out.len() < needed {
        return Err(WorkListTooSmall { needed });
    }
    let mut len = 0usize;
    match block_n {
        BlockN::N128 => {
            let mut max_tn = 0;
            let mut i = 0;
            while i < groups.len() {
                if in_list(groups[i], block_n) && groups[i].tiles_n() > max_tn {
                    max_tn = groups[i].tiles_n();
                }
                i += 1;
            }
            let mut tn = 0;
            while tn < max_tn {
                let mut i = 0;
                while i < groups.len() {
                    let g = groups[i];
                    if in_list(g, block_n) && tn < g.tiles_n() {
                        let mut tm = 0;
                        while tm < g.tiles_m() {
                            out[len] = WorkItem { group: i as u32, tile_m: tm, tile_n: tn };
                            len += 1;
                            tm += 1;
                        }
                    }
                    i += 1;
                }
                tn += 1;
            }
        }
        BlockN::N256 => {
            let cluster = for_block_n(block_n).cluster_size();
            let mut i = 0;
            while i < groups.len() {
                let g = groups[i];
                if in_list(g, block_n) && g.tiles_n() > 0 {
                    let padded = g.tiles_n().next_multiple_of(cluster);
                    let mut tm = 0;
                    while tm < g.tiles_m() {
                        let mut tn = 0;
                        while tn < padded {
                            out[len] =
                                WorkItem { group: i as u32, tile_m: tm, tile_n: if tn < g.tiles_n() { tn } else { 0 } };
                            len += 1;
                            tn += 1;
                        }
                        tm += 1;
                    }
                }
                i += 1;
            }
        }
    }
    Ok(len)
}

/// Items per M tile of a list of width `block_n` over groups of `n` columns: the N tiles, for
/// the 256-wide list padded to a multiple of the cluster size (the padding items repeat
/// `tile_n = 0`, as [`build_work_list`] pads).
pub const fn slots_per_m_tile(n: u32, block_n: BlockN) -> u32 {
    n.div_ceil(block_n.get()).next_multiple_of(for_block_n(block_n).cluster_size())
}

/// The `tile_n` of slot `slot` of an M tile ([`slots_per_m_tile`]): the slot itself, or 0 for a
/// padding slot.
pub const fn slot_tile_n(slot: u32, n: u32, block_n: BlockN) -> u32 {
    if slot < n.div_ceil(block_n.get()) {
        slot
    } else {
        0
    }
}

/// Where a list built on the device (`sm100_schedule`, for device-resident group sizes) puts the
/// item of M-tile row `row` and slot `slot`. There every group has the same N and K, so every
/// group is in the one list of width `block_n`; the groups' M tiles are numbered in group order
/// (row = the number of M tiles of the groups before + `tile_m`), and the list holds the rows
/// `0..rows` with `slots` items each. The index is the item's position in [`build_work_list`]'s
/// order for the same groups (checked by the tests): `tile_n`-major for 128-wide tiles
/// (`slot · rows + row`), M-tile-major with the cluster padding for 256-wide ones
/// (`row · slots + slot`), so each aligned run of 4 items shares one A tile.
pub const fn device_item_index(block_n: BlockN, rows: u32, slots: u32, row: u32, slot: u32) -> u32 {
    match block_n {
        BlockN::N128 => slot * rows + row,
        BlockN::N256 => row * slots + slot,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn shapes<const G: usize>(m: [u32; G], n: [u32; G], k: [u32; G]) -> [GroupShape; G] {
        let mut out = [GroupShape { m: 0, n: 0, k: 0 }; G];
        let mut i = 0;
        while i < G {
            out[i] = GroupShape { m: m[i], n: n[i], k: k[i] };
            i += 1;
        }
        out
    }

    fn item(group: u32, tile_m: u32, tile_n: u32) -> WorkItem {
        WorkItem { group, tile_m, tile_n }
    }

    fn build(groups: &[GroupShape], block_n: BlockN, buf: &mut [WorkItem]) -> usize {
        let len = build_work_list(groups, block_n, buf).unwrap();
        assert_eq!(len, work_list_len(groups, block_n));
        len
    }

    /// Every real tile of the `block_n` groups appears, padding aside, and nothing else.
    fn assert_covers(groups: &[GroupShape], block_n: BlockN, items: &[WorkItem]) {
        let mut count = 0;
        for (p, g) in groups.iter().enumerate() {
            if g.block_n() != block_n {
                assert!(items.iter().all(|w| w.group != p as u32));
                continue;
            }
            for tm in 0..g.tiles_m() {
                for tn in 0..g.tiles_n() {
                    let hits = items.iter().filter(|w| **w == item(p as u32, tm, tn)).count();
                    let padding = if tn == 0 { g.tiles_n().next_multiple_of(4) - g.tiles_n() } else { 0 };
                    let extra = if block_n == BlockN::N256 { padding as usize } else { 0 };
                    assert_eq!(hits, 1 + extra, "group {p} tile ({tm}, {tn})");
                    count += 1 + extra;
                }
            }
        }
        assert_eq!(count, items.len());
    }

    #[test]
    fn competition_test_1_by_hand() {
        let g = shapes([96, 128], [128, 256], [256, 512]);
        let mut buf = [WorkItem::default(); 8];
        let len = build(&g, BlockN::N128, &mut buf);
        assert_eq!(&buf[..len], &[item(0, 0, 0), item(1, 0, 0), item(1, 0, 1)]);
        assert_eq!(work_list_len(&g, BlockN::N256), 0);
    }

    #[test]
    fn competition_test_4_by_hand() {
        let g = shapes([80, 128, 256], [384, 256, 128], [256, 512, 256]);
        let mut buf = [WorkItem::default(); 16];
        let len = build(&g, BlockN::N128, &mut buf);
        assert_eq!(
            &buf[..len],
            &[item(0, 0, 0), item(1, 0, 0), item(2, 0, 0), item(2, 1, 0), item(0, 0, 1), item(1, 0, 1), item(0, 0, 2),]
        );
    }

    /// docs/measuring.md §1's ten competition shapes: all 128-wide, tile_n-major, every tile once.
    #[test]
    fn all_competition_shapes() {
        let tests: [&[GroupShape]; 10] = [
            &shapes([96, 128], [128, 256], [256, 512]),
            &shapes([256, 72], [512, 384], [256, 256]),
            &shapes([128, 128], [128, 256], [512, 256]),
            &shapes([80, 128, 256], [384, 256, 128], [256, 512, 256]),
            &shapes([64, 72, 96], [128, 384, 512], [512, 512, 256]),
            &shapes([64, 256, 128], [768, 128, 256], [512, 256, 512]),
            &shapes([128, 128, 64], [256, 512, 512], [768, 256, 768]),
            &shapes([128; 4], [128; 4], [512, 256, 512, 256]),
            &shapes([40, 56, 384, 512], [512, 384, 256, 128], [256; 4]),
            &shapes([512, 384, 256, 128], [256; 4], [512, 768, 512, 768]),
        ];
        let expected_len = [3, 11, 3, 7, 8, 10, 10, 4, 17, 20];
        for (t, g) in tests.iter().enumerate() {
            let mut buf = [WorkItem::default(); 64];
            let len = build(g, BlockN::N128, &mut buf);
            assert_eq!(len, expected_len[t], "test {}", t + 1);
            let items = &buf[..len];
            assert_covers(g, BlockN::N128, items);
            assert!(items.windows(2).all(|w| w[0].tile_n <= w[1].tile_n), "test {}", t + 1);
            assert_eq!(work_list_len(g, BlockN::N256), 0);
        }
    }

    /// docs/measuring.md §1 benchmarks: b0/b1 256-wide (no padding: 16 and 28 N tiles), b2/b3 128-wide.
    #[test]
    fn benchmark_shapes() {
        let b0 = shapes([80, 176, 128, 72, 64, 248, 96, 160], [4096; 8], [7168; 8]);
        let b1 = shapes([40, 76, 168, 72, 164, 148, 196, 160], [7168; 8], [2048; 8]);
        let b2 = shapes([192, 320], [3072; 2], [4096; 2]);
        let b3 = shapes([128, 384], [4096; 2], [1536; 2]);
        let mut buf = [WorkItem::default(); 400];
        for (g, wide, len) in [
            (&b0[..], BlockN::N256, 176),
            (&b1[..], BlockN::N256, 364),
            (&b2[..], BlockN::N128, 120),
            (&b3[..], BlockN::N128, 128),
        ] {
            assert_eq!(build(g, wide, &mut buf), len);
            assert_covers(g, wide, &buf[..len]);
        }
        // b0: group 0 has one M tile, so items 0..16 are (0, 0, 0..16), then group 1 tile_m 0.
        let len = build(&b0, BlockN::N256, &mut buf);
        assert_eq!(len, 176);
        assert!((0..16).all(|t| buf[t as usize] == item(0, 0, t)));
        assert_eq!(buf[16], item(1, 0, 0));
        assert_eq!(buf[32], item(1, 1, 0));
    }

    /// Every aligned run of 4 items in a 256-wide list shares (problem, tile_m): one A tile per
    /// cluster, which is what the multicast needs.
    #[test]
    fn wide_list_is_padded_to_clusters() {
        // N = 4608 = 18 tiles of 256 → 2 padding items per tile_m; N = 4352 = 17 → 3.
        let g = shapes([200, 128, 0], [4608, 4352, 4096], [2048; 3]);
        let mut buf = [WorkItem::default(); 64];
        let len = build(&g, BlockN::N256, &mut buf);
        assert_eq!(len, 2 * 20 + 20);
        let items = &buf[..len];
        assert_covers(&g, BlockN::N256, items);
        for c in items.chunks(4) {
            assert_eq!(c.len(), 4);
            assert!(c.iter().all(|w| (w.group, w.tile_m) == (c[0].group, c[0].tile_m)));
        }
        // Padding repeats tile_n 0 of the same tile_m.
        assert_eq!(&items[18..20], &[item(0, 0, 0), item(0, 0, 0)]);
        assert_eq!(&items[57..60], &[item(1, 0, 0); 3]);
    }

    #[test]
    fn mixed_widths_split_into_two_lists() {
        let g = shapes([128, 64, 0, 300], [4096, 512, 4096, 8192], [4096, 512, 4096, 1024]);
        let mut buf = [WorkItem::default(); 256];
        let wide = build(&g, BlockN::N256, &mut buf);
        assert_eq!(wide, 16);
        assert_covers(&g, BlockN::N256, &buf[..wide]);
        let narrow = build(&g, BlockN::N128, &mut buf);
        // Group 1: 4 N tiles x 1; group 3 (K < 2048): 64 N tiles x 3.
        assert_eq!(narrow, 4 + 64 * 3);
        assert_covers(&g, BlockN::N128, &buf[..narrow]);
    }

    #[test]
    fn short_buffer_is_an_error() {
        let g = shapes([256], [256], [256]);
        let mut buf = [WorkItem::default(); 3];
        assert_eq!(build_work_list(&g, BlockN::N128, &mut buf), Err(WorkListTooSmall { needed: 4 }));
        assert_eq!(build_work_list(&[], BlockN::N128, &mut []), Ok(0));
    }

    #[test]
    fn const_evaluable() {
        const G: [GroupShape; 2] = shapes([96, 128], [128, 256], [256, 512]);
        const LIST: ([WorkItem; 3], usize) = {
            let mut buf = [WorkItem { group: 0, tile_m: 0, tile_n: 0 }; 3];
            let len = match build_work_list(&G, BlockN::N128, &mut buf) {
                Ok(l) => l,
                Err(_) => panic!("too small"),
            };
            (buf, len)
        };
        assert_eq!(LIST.1, 3);
        assert_eq!(LIST.0[2], item(1, 0, 1));
    }

    /// For groups of one N and K (the device-sized case), the device formula puts every item
    /// where the host-built list has it, for both widths, and a list cut after `rows` M tiles is
    /// a prefix of each N tile's run (128-wide) or of the list (256-wide).
    #[test]
    fn device_index_is_the_host_order() {
        let mut state = 5u64;
        let mut next = |below: u32| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((state >> 33) as u32) % below
        };
        for (n, k) in [(136u32, 320u32), (256, 256), (4096, 2048), (4352, 2112), (7168, 2048)] {
            for _ in 0..40 {
                let count = 1 + next(7) as usize;
                let mut groups = [GroupShape::default(); 8];
                for g in groups.iter_mut().take(count) {
                    *g = GroupShape { m: if next(4) == 0 { 0 } else { next(400) }, n, k };
                }
                let groups = &groups[..count];
                let block_n = choose_block_n(n, k);
                let mut host = [WorkItem::default(); 512];
                let len = build_work_list(groups, block_n, &mut host).unwrap();
                let slots = slots_per_m_tile(n, block_n);
                let rows: u32 = groups.iter().map(|g| g.tiles_m()).sum();
                assert_eq!(len as u32, rows * slots);
                if block_n == BlockN::N256 {
                    assert_eq!(slots % 4, 0);
                }
                let mut device = [WorkItem::default(); 512];
                let mut row = 0;
                for (i, g) in groups.iter().enumerate() {
                    for tile_m in 0..g.tiles_m() {
                        for slot in 0..slots {
                            let at = device_item_index(block_n, rows, slots, row + tile_m, slot);
                            device[at as usize] =
                                WorkItem { group: i as u32, tile_m, tile_n: slot_tile_n(slot, n, block_n) };
                        }
                    }
                    row += g.tiles_m();
                }
                assert_eq!(&device[..len], &host[..len], "{groups:?}");
            }
        }
        assert_eq!((slots_per_m_tile(136, BlockN::N128), slots_per_m_tile(4352, BlockN::N256)), (2, 20));
        assert_eq!((slot_tile_n(17, 4352, BlockN::N256), slot_tile_n(16, 4352, BlockN::N256)), (0, 16));
    }
}
