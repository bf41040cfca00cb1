//! What the GEMM reads from device memory besides the tensor maps: the group table
//! ([`GroupParams`]), and the `tile_n` of an `N192` work item ([`RowSpan`]).

use super::config::{BLOCK_N, WG_ROWS};
pub use crate::work::{KernelParams, WorkItem};

/// The weight rows one `N192` work item covers: `warpgroups` (1..=3) consecutive blocks of
/// [`WG_ROWS`] rows from row `64 · first`. The host picks the spans of each group's N (192 or 128
/// rows, and what N leaves at its end) to balance the CTAs' work; the item's `tile_n` holds
/// [`RowSpan::encode`]. (The 128-row variants' `tile_n` is a plain 128-row tile index.)
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowSpan {
    /// First row, in units of [`WG_ROWS`].
    pub first: u32,
    /// Consumer warpgroups with rows (1..=3).
    pub warpgroups: u32,
}

impl RowSpan {
    /// Bit position of `warpgroups` in the encoded `tile_n`.
    const SHIFT: u32 = 24;

    /// The `tile_n` word of a work item.
    pub const fn encode(self) -> u32 {
        self.first | (self.warpgroups << Self::SHIFT)
    }

    /// The span a work item's `tile_n` names.
    pub const fn decode(tile_n: u32) -> RowSpan {
        RowSpan { first: tile_n & ((1 << Self::SHIFT) - 1), warpgroups: tile_n >> Self::SHIFT }
    }

    /// The first weight row.
    pub const fn row0(self) -> u32 {
        self.first * WG_ROWS
    }

    /// The first 128-row block of B's scales the span touches.
    pub const fn first_scale_block(self) -> u32 {
        self.row0() / BLOCK_N
    }

    /// The 128-row scale blocks the span's rows below `n` lie in (1 or 2).
    pub const fn scale_blocks(self, n: u32) -> u32 {
        let end = if self.row0() + self.warpgroups * WG_ROWS < n { self.row0() + self.warpgroups * WG_ROWS } else { n };
        (end - 1) / BLOCK_N - self.first_scale_block() + 1
    }

    /// The spans of `n` weight rows: `twos` spans of 128 rows first, then as many of 192 as fit,
    /// then what is left (64 or 128 rows). `twos` is capped at what `n` holds.
    pub fn split(n: u32, twos: u32) -> impl Iterator<Item = RowSpan> {
        let split = SpanSplit::new(n, twos);
        (0..split.count()).map(move |j| split.span(j))
    }
}

/// [`RowSpan::split`] in numbers, so that span `j` is found without walking the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpanSplit {
    /// Spans of 128 rows, first.
    pub twos: u32,
    /// Spans of 192 rows, after them.
    pub threes: u32,
    /// Blocks of 64 rows in the last span (0: no such span).
    pub rest: u32,
}

impl SpanSplit {
    /// The split of `n` rows with `twos` spans of 128 rows (capped at what `n` holds).
    pub const fn new(n: u32, twos: u32) -> SpanSplit {
        let units = n.div_ceil(WG_ROWS);
        let twos = if 2 * twos < units { twos } else { units / 2 };
        let threes = (units - 2 * twos) / 3;
        SpanSplit { twos, threes, rest: units - 2 * twos - 3 * threes }
    }

    /// The spans.
    pub const fn count(&self) -> u32 {
        self.twos + self.threes + (self.rest > 0) as u32
    }

    /// Span `j` (below [`Self::count`]).
    pub const fn span(&self, j: u32) -> RowSpan {
        if j < self.twos {
            RowSpan { first: 2 * j, warpgroups: 2 }
        } else if j < self.twos + self.threes {
            RowSpan { first: 2 * self.twos + 3 * (j - self.twos), warpgroups: 3 }
        } else {
            RowSpan { first: 2 * self.twos + 3 * self.threes, warpgroups: self.rest }
        }
    }
}

/// One group as the kernels see it (device memory, written by the host before the launch).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Default, bytemuck::Pod, bytemuck::Zeroable)]
pub struct GroupParams {
    /// Tokens (rows of A and of C).
    pub m: u32,
    /// Weights (rows of B, columns of C).
    pub n: u32,
    /// Reduction length (a multiple of 64).
    pub k: u32,
    /// Scale applied to the fp32 accumulator before rounding.
    pub alpha: f32,
    /// Packed e2m1 values of A, `m × k/2` bytes.
    pub a_values: u64,
    /// e4m3 scales of A, 128x4 blocked layout.
    pub a_scales: u64,
    /// e4m3 scales of B, 128x4 blocked layout.
    pub b_scales: u64,
    /// Output C, `m × n` f16 (or bf16) elements, row-major.
    pub c: u64,
    /// This group's f16 tokens in the workspace (`m × k` elements, K permuted per chunk).
    pub workspace: u64,
    /// Index of the first token-dequantization CTA of this group.
    pub dequant_first_cta: u32,
    /// Token-dequantization CTAs for this group.
    pub dequant_ctas: u32,
    /// Token rows per tile of this group ([`GemmConfig::tile_rows`](super::GemmConfig::tile_rows)`(m)`):
    /// the wgmma N and the height of a stage's token region.
    pub block_m: u32,
    /// Token rows one load of the group's last tile brings: the box height of its token map
    /// (`tail_token_map`), [`tail_box_rows`](super::tail_box_rows)`(m, block_m)` — the tile's own
    /// rows, where the other tiles load `block_m`. The stage's rows past it keep older bytes, which
    /// only reach the tile's columns past `m`, never stored.
    pub tail_rows: u32,
    /// Row of the group's first token in its token map (0 when each group has its own map; the
    /// group's first row of the shared workspace map in device-sized plans, `crate::moe`).
    pub token_row: u32,
    /// Index of the group's token map in the tensor-map table
    /// ([`token_map_index`](super::token_map_index) when each group has its own map).
    pub token_map: u32,
    /// Index of the token map of the group's last tile, boxes of `tail_rows` rows
    /// ([`tail_token_map_index`](super::tail_token_map_index) when each group has its own maps;
    /// `token_map` in device-sized plans, whose boxes are whole tiles).
    pub tail_token_map: u32,
    /// Zero.
    pub reserved: u32,
}

const _: () = assert!(core::mem::size_of::<GroupParams>() == 88);

/// Byte offset of [`GroupParams::alpha`] in an entry: where the host copies device-resident
/// alphas into the group table (one `f32` per `size_of::<GroupParams>()` bytes).
pub const GROUP_ALPHA_OFFSET: usize = core::mem::offset_of!(GroupParams, alpha);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alpha_offset_is_the_alpha_field() {
        let p = GroupParams { alpha: -1.5, ..GroupParams::default() };
        let at = &bytemuck::bytes_of(&p)[GROUP_ALPHA_OFFSET..][..4];
        assert_eq!(f32::from_ne_bytes(at.try_into().unwrap()), -1.5);
    }

    #[test]
    fn row_spans() {
        // 128-row spans first, 192-row ones, then the rest; the scale blocks they touch.
        // (count, the first eight as (first, warpgroups), warpgroups in all).
        let spans = |n, twos| {
            let (mut count, mut first, mut total) = (0, [(0, 0); 8], 0);
            for s in RowSpan::split(n, twos) {
                if count < 8 {
                    first[count] = (s.first, s.warpgroups);
                }
                count += 1;
                total += s.warpgroups;
            }
            (count, first, total)
        };
        let (count, _, total) = spans(4096, 0);
        assert_eq!((count, total), (22, 64));
        let (count, first, total) = spans(4096, 2);
        assert_eq!((count, total), (22, 64));
        assert_eq!(first[..3], [(0, 2), (2, 2), (4, 3)]);
        assert_eq!((spans(136, 0).0, spans(136, 0).1[0]), (1, (0, 3)));
        assert_eq!(spans(136, 5).0, 2);
        assert_eq!(spans(136, 5).1[..2], [(0, 2), (2, 1)]);
        assert_eq!(spans(392, 1).1[..3], [(0, 2), (2, 3), (5, 2)]);
        assert_eq!(spans(72, 0).1[0], (0, 2));
        for s in [(0, 3), (1, 3), (2, 2), (3, 1)].map(|(first, warpgroups)| RowSpan { first, warpgroups }) {
            assert_eq!(RowSpan::decode(s.encode()), s);
        }
        let span = |first, warpgroups| RowSpan { first, warpgroups };
        assert_eq!([span(0, 3), span(1, 3), span(2, 2), span(1, 1)].map(|s| s.first_scale_block()), [0, 0, 1, 0]);
        assert_eq!(
            [(span(0, 3), 4096), (span(1, 3), 4096), (span(1, 1), 4096), (span(63, 1), 4096), (span(0, 3), 100)]
                .map(|(s, n)| s.scale_blocks(n)),
            [2, 2, 1, 1, 1]
        );
    }
}
