//! The W4A16 weight prepack on the GPU (`sm90_w4a16_prepack`, `kernel/src/sm90/prepack.rs`):
//! its parameters, work decomposition and launch geometry, and the word forms of
//! [`super::w4a16`]'s permutation that it runs. The permutation has one definition, the one the
//! CPU prepack (`nvfp4_gemm::w4a16::prepack`) applies: [`packed_column`] and the decoder's
//! [`BitLayout`] for the values, [`scale_source`] and [`prepacked_scale`] for the scales. The
//! kernel applies it through forms computed from those at compile time and tested equal to them:
//! [`ChunkRowWords`] (a chunk row as 8 words: a byte gather and one fixed bit permutation,
//! `super::w4a16::prepack_chunk_row` word by word) and [`SCALE_BYTES`] ([`prepacked_scale`] as a
//! 256-byte table). What else differs is the order of the work: the CPU walks rows, the kernel
//! walks the buffers as flat arrays of 32- and 16-byte pieces, so that consecutive threads read
//! and write consecutive bytes.
//!
//! The input is a stack of `experts` weight matrices of `rows × k` as the library stores an
//! expert tensor: values `experts × rows × k/2` bytes (each matrix's rows back to back), scales
//! `experts × blocked_bytes(rows, k)` bytes (each matrix's 128x4 blocked scales, padding rows
//! included, back to back). The output has the same sizes and layout. Work items, grid-strided,
//! the value items first:
//! 1. value item `t` (`0 ..` [`value_items`]): chunk row `t`, the 32 bytes at `32·t` (a chunk row
//!    is 64 values of one row, and the rows of all experts lie back to back, so chunk rows do
//!    too): two 16-byte loads, [`ChunkRowWords::apply`], two 16-byte stores. With bf16 activations
//!    the row's scale word for the chunk is read as well ([`chunk_scale_word_offset`]), for the
//!    sign and zero folding.
//! 2. scale line `l` (`0 ..` [`scale_lines`]): the 16 bytes at `16·l` of the scale buffers
//!    ([`prepack_scale_line`]), from input lines `l` and `l ^ 8`: two 16-byte loads, one store.

use super::config::CHUNK_K;
use super::w4a16::{packed_column, prepacked_scale, scale_source, Activations, BitLayout};
use crate::launch::{LaunchGeometry, REGISTERS_PER_SM};
use crate::scale_layout::{blocked_bytes, blocked_word_offset, rest_k, BLOCK_BYTES, BLOCK_COLS};
use core::num::NonZeroU32;

/// The exported name of the prepack kernel.
pub const PREPACK_KERNEL: &str = "sm90_w4a16_prepack";
/// Threads per CTA.
pub const PREPACK_THREADS: u32 = 256;
/// Register cap of the kernel (`.maxnreg`, see `cargo xtask build-ptx`): [`PREPACK_CTAS_PER_SM`]
/// CTAs of [`PREPACK_THREADS`] fit an SM's registers.
pub const PREPACK_MAX_REGISTERS: u32 = 64;
/// Resident CTAs per SM under the register cap; the grid is at most this many per SM (the
/// threads grid-stride beyond).
pub const PREPACK_CTAS_PER_SM: u32 = REGISTERS_PER_SM / (PREPACK_THREADS * PREPACK_MAX_REGISTERS);
const _: () = assert!(PREPACK_CTAS_PER_SM == 4);

/// Register caps of the prepack kernel (`.maxnreg`, written by `cargo xtask build-ptx`).
pub const REGISTER_CAPS: [(&str, u32); 1] = [(PREPACK_KERNEL, PREPACK_MAX_REGISTERS)];

/// Bytes of one value item: a chunk row, 64 e2m1 codes.
pub const CHUNK_ROW_BYTES: u32 = CHUNK_K / 2;
/// Bytes of one scale line: 4 rows' scale words of one 128x4 block ([`prepack_scale_line`]).
pub const SCALE_LINE_BYTES: u32 = 16;
/// Lines of one 128x4 scale block.
const LINES_PER_BLOCK: u32 = BLOCK_BYTES / SCALE_LINE_BYTES;

/// Upper bound (exclusive) on the work items of one launch (value items and scale lines
/// together), so that the kernel's 32-bit item indices and grid stride cannot overflow
/// (`2^31` items are at least `2^35` values).
pub const MAX_ITEMS: u64 = 1 << 31;

/// Parameters of `sm90_w4a16_prepack` (passed by value). The four buffers are 16-byte aligned,
/// and the outputs overlap nothing (the host's `Prepacker` checks it).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct PrepackParams {
    /// Input values: `experts × rows × k/2` bytes, natural nibbles.
    pub values: u64,
    /// Input scales: `experts × blocked_bytes(rows, k)` bytes of e4m3, 128x4 blocked per expert.
    pub scales: u64,
    /// Output values, the size of `values`.
    pub out_values: u64,
    /// Output scales, the size of `scales`.
    pub out_scales: u64,
    /// Rows (N) of each expert's matrix, positive.
    pub rows: u32,
    /// Values per row, a positive multiple of 64.
    pub k: u32,
    /// Matrices in the stack, positive.
    pub experts: u32,
    /// 1 for bf16 activations, 0 for f16.
    pub bf16: u32,
}

const _: () = assert!(core::mem::size_of::<PrepackParams>() == 48);
const _: () = assert!(core::mem::align_of::<PrepackParams>() == 8);

impl PrepackParams {
    /// The activation type the weights are prepacked for.
    pub const fn activations(&self) -> Activations {
        if self.bf16 != 0 {
            Activations::Bf16
        } else {
            Activations::F16
        }
    }
}

/// [`prepacked_scale`] of every byte, computed at compile time: the kernel looks each scale up
/// (one load from a 256-byte table the L1 keeps) instead of branching per byte.
pub const SCALE_BYTES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = prepacked_scale(b as u8);
        b += 1;
    }
    t
};

/// Most terms of a within-word bit permutation: one per rotation distance.
const MAX_TERMS: usize = 32;

/// `super::w4a16::prepack_chunk_row` on a chunk row as 8 little-endian words, as word
/// operations: output word `w = 2q + h` (thread `q`'s word `h`) holds elements `i` at natural
/// columns `packed_column(q, h, i)`, and elements `k` and `k + 4` (k < 4) are the low and high
/// nibble of one natural byte. So the output word is
/// 1. a gather: byte `k` of a word `g` is natural byte `packed_column(q, h, k) / 2`;
/// 2. the folds (bf16): `(g ^ flip) & keep`, per byte from its scale block (`column / 16`);
/// 3. one bit permutation, the same for every word: bit `8k + 4u + f` of `g` (field `f` of element
///    `k + 4u`) goes to the layout's bit for it, written as `Σ rotl(g & mask_d, d)` over the
///    rotation distances `d` it uses.
///
/// Everything is computed from [`packed_column`] and the layout by a `const fn`; a kernel that
/// holds it as a constant compiles the loops of [`ChunkRowWords::apply`] into fixed shifts,
/// masks and byte permutes (a host test checks it against `prepack_chunk_row`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRowWords {
    /// Byte `k` of output word `w`'s gathered word: natural byte `gather[w][k]` (0..32).
    gather: [[u32; 4]; 8],
    /// The scale block (0..4) of that byte.
    block: [[u32; 4]; 8],
    /// Rotation distances of the bit permutation (`terms` of them).
    rotate: [u32; MAX_TERMS],
    /// The bits each distance moves.
    mask: [u32; MAX_TERMS],
    /// Distances used.
    terms: usize,
}

impl ChunkRowWords {
    /// The word form of the prepack into `layout` (the activation type's
    /// `Decoder::layout`).
    pub const fn new(layout: &BitLayout) -> ChunkRowWords {
        let mut gather = [[0u32; 4]; 8];
        let mut block = [[0u32; 4]; 8];
        let mut q = 0;
        while q < 4 {
            let mut h = 0;
            while h < 2 {
                let mut k = 0;
                while k < 4 {
                    let c = packed_column(q, h, k);
                    assert!(c % 2 == 0 && packed_column(q, h, k + 4) == c + 1, "elements k, k + 4 share a byte");
                    gather[(2 * q + h) as usize][k as usize] = c / 2;
                    block[(2 * q + h) as usize][k as usize] = c / 16;
                    k += 1;
                }
                h += 1;
            }
            q += 1;
        }
        let mut rotate = [0u32; MAX_TERMS];
        let mut mask = [0u32; MAX_TERMS];
        let mut terms = 0;
        let mut g = 0;
        while g < 32 {
            // Bit g of the gathered word: field g % 4 of element g / 8 + 4 · (g / 4 % 2).
            let (element, field) = (g / 8 + 4 * (g / 4 % 2), g % 4);
            let d = (layout.bit(element, field) + 32 - g) % 32;
            let mut t = 0;
            while t < terms && rotate[t] != d {
                t += 1;
            }
            if t == terms {
                rotate[t] = d;
                terms += 1;
            }
            mask[t] |= 1 << g;
            g += 1;
        }
        ChunkRowWords { gather, block, rotate, mask, terms }
    }

    /// Rotation distances of the bit permutation (the number of masked rotations per word).
    pub const fn terms(&self) -> usize {
        self.terms
    }

    /// The prepacked chunk row of `row` (8 little-endian words), every code's sign flipped when
    /// `negate[block]` and every code zeroed when `zero[block]`, as `prepack_chunk_row` makes it.
    #[inline(always)]
    pub fn apply(&self, row: [u32; 8], negate: [bool; 4], zero: [bool; 4]) -> [u32; 8] {
        // Per block: the sign bits of both nibbles of a byte, and the bytes kept.
        let mut flip = [0u32; 4];
        let mut keep = [0u32; 4];
        for b in 0..4 {
            flip[b] = if negate[b] { 0x88 } else { 0 };
            keep[b] = if zero[b] { 0 } else { 0xFF };
        }
        let mut out = [0u32; 8];
        for (w, o) in out.iter_mut().enumerate() {
            let (mut g, mut flips, mut keeps) = (0u32, 0u32, 0u32);
            for k in 0..4 {
                let byte = self.gather[w][k];
                g |= ((row[(byte / 4) as usize] >> (8 * (byte % 4))) & 0xFF) << (8 * k);
                let b = self.block[w][k] as usize;
                flips |= flip[b] << (8 * k);
                keeps |= keep[b] << (8 * k);
            }
            let g = (g ^ flips) & keeps;
            for t in 0..self.terms {
                *o |= (g & self.mask[t]).rotate_left(self.rotate[t]);
            }
        }
        out
    }
}

/// Value items of a stack: every chunk row of every expert.
pub const fn value_items(experts: u32, rows: u32, k: u32) -> u64 {
    experts as u64 * rows as u64 * (k / CHUNK_K) as u64
}

/// Scale lines of a stack: every 16 bytes of every expert's blocked scales (padding rows
/// included).
pub const fn scale_lines(experts: u32, rows: u32, k: u32) -> u64 {
    experts as u64 * (blocked_bytes(rows, k) / SCALE_LINE_BYTES as usize) as u64
}

/// All work items of a stack ([`value_items`] + [`scale_lines`]).
pub const fn items(experts: u32, rows: u32, k: u32) -> u64 {
    value_items(experts, rows, k) + scale_lines(experts, rows, k)
}

/// Byte offset, in the stacked input scales, of the scale word of value item `t` of a stack of
/// matrices of `rows` rows of `chunks` 64-wide chunks (`k = 64·chunks`): the four scales of the
/// chunk row (byte `b`: block `b` of the chunk, [`blocked_word_offset`]). The item is chunk
/// `t % chunks` of global row `t / chunks`, which is row `% rows` of expert `/ rows`. (Divisors
/// that cannot be zero: the kernel's divisions need no zero check.)
#[inline(always)]
pub fn chunk_scale_word_offset(t: u32, rows: NonZeroU32, chunks: NonZeroU32) -> usize {
    let (row, chunk) = (t / chunks, t % chunks);
    let (expert, n) = (row / rows, row % rows);
    let k = chunks.get() * CHUNK_K;
    expert as usize * blocked_bytes(rows.get(), k) + blocked_word_offset(n, chunk, rest_k(k))
}

/// Which of a chunk's four scale blocks flip their codes' signs (`negate`) and which zero their
/// codes (`zero`), from the chunk's scale word (byte `b`: block `b`): for bf16 activations a
/// negative scale's sign moves into its codes and a zero scale's codes become +0
/// (docs/w4a16.md §2); for f16 nothing is folded. The CPU prepack makes the same choice per
/// block.
pub const fn folds(scale_word: u32, activations: Activations) -> ([bool; 4], [bool; 4]) {
    let mut negate = [false; 4];
    let mut zero = [false; 4];
    if let Activations::Bf16 = activations {
        let mut b = 0;
        while b < 4 {
            let s = (scale_word >> (8 * b)) as u8;
            negate[b] = s & 0x80 != 0;
            zero[b] = s & 0x7F == 0;
            b += 1;
        }
    }
    (negate, zero)
}

/// The prepacked scale line `line` of a stacked blocked scale buffer, from the input's line
/// `line` (`own`) and line `line ^ 8` (`partner`), each as four little-endian words.
///
/// In the 128x4 blocked layout a 512-byte block (128 rows, one chunk's 4 scale columns) is 32
/// lines of 16 bytes, and line `ℓ` holds the scale words of rows `ℓ, ℓ + 32, ℓ + 64, ℓ + 96`
/// (word `w`: row `ℓ + 32w`; byte `j`: column `j`; [`crate::scale_layout::blocked_offset`]).
/// Blocks follow each other in every expert's buffer and experts' buffers follow each other, all
/// multiples of 512 bytes, so line `line` of the stack is line `ℓ = line % 32` of its block. The
/// prepack pairs rows `r` and `r + 8` (`r % 16 < 8`), whose words are word `w` of lines `ℓ` and
/// `ℓ ^ 8` of the same block: output byte `b` of word `w` is, with `second = ℓ / 8 % 2` and
/// `(row_step, block) = scale_source(activations, second, b)`, byte `block` of word `w` of the
/// line of row `r + 8·row_step` (`line` itself when `row_step == second`, else `line ^ 8`),
/// re-encoded for bf16 ([`prepacked_scale`], through [`SCALE_BYTES`]).
#[inline(always)]
pub fn prepack_scale_line(line: u32, own: [u32; 4], partner: [u32; 4], activations: Activations) -> [u32; 4] {
    let second = (line >> 3) & 1;
    core::array::from_fn(|word| {
        let mut out = 0u32;
        for byte in 0..BLOCK_COLS {
            let (row_step, block) = scale_source(activations, second, byte);
            let src = if row_step == second { own[word] } else { partner[word] };
            let s = (src >> (8 * block)) as u8;
            let s = match activations {
                Activations::F16 => s,
                Activations::Bf16 => SCALE_BYTES[s as usize],
            };
            out |= u32::from(s) << (8 * byte);
        }
        out
    })
}

const _: () = assert!(LINES_PER_BLOCK == 32 && BLOCK_BYTES % SCALE_LINE_BYTES == 0);

/// CTAs for `items` work items, at most `max_ctas` (the threads grid-stride beyond); 0 when there
/// is nothing to do (no launch).
pub const fn prepack_grid(items: u64, max_ctas: u32) -> u32 {
    let ctas = items.div_ceil(PREPACK_THREADS as u64);
    if ctas < max_ctas as u64 {
        ctas as u32
    } else {
        max_ctas
    }
}

/// Launch geometry for `items` work items on `sm_count` SMs: [`PREPACK_THREADS`] threads per CTA,
/// at most [`PREPACK_CTAS_PER_SM`] CTAs per SM, no shared memory.
pub const fn prepack_launch(items: u64, sm_count: u32) -> LaunchGeometry {
    let max_ctas = if sm_count == 0 { PREPACK_CTAS_PER_SM } else { sm_count * PREPACK_CTAS_PER_SM };
    LaunchGeometry { grid: prepack_grid(items, max_ctas), block: PREPACK_THREADS, cluster: 1, smem_bytes: 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::scale_layout::blocked_offset;
    use crate::sm90::w4a16::{prepack_chunk_row, Decoder};

    /// A 64-bit LCG (the abi has no generator of its own).
    fn next(state: &mut u64) -> u64 {
        *state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        *state >> 16
    }

    /// The word form is `prepack_chunk_row`, bit for bit: random rows under every combination of
    /// folds (negate, zero and both per block), both decoders; and each single code at every
    /// column, the rest zero.
    #[test]
    fn chunk_row_words_are_prepack_chunk_row() {
        for act in [Activations::F16, Activations::Bf16] {
            let layout = Decoder::of(act).layout();
            let words = ChunkRowWords::new(&layout);
            let check = |row: [u8; 32], negate: [bool; 4], zero: [bool; 4]| {
                let want = prepack_chunk_row(&row, negate, zero, &layout);
                let w: [u32; 8] =
                    core::array::from_fn(|i| u32::from_le_bytes(row[4 * i..4 * i + 4].try_into().unwrap()));
                let got = words.apply(w, negate, zero);
                for i in 0..8 {
                    assert_eq!(
                        got[i].to_le_bytes(),
                        want[4 * i..4 * i + 4],
                        "{act:?} word {i} of {row:?} {negate:?} {zero:?}"
                    );
                }
            };
            let mut state = 0x5EED_u64;
            for folds in 0..256u32 {
                let negate = core::array::from_fn(|b| folds >> b & 1 != 0);
                let zero = core::array::from_fn(|b| folds >> (4 + b) & 1 != 0);
                for _ in 0..16 {
                    let row: [u8; 32] = core::array::from_fn(|_| next(&mut state) as u8);
                    check(row, negate, zero);
                }
            }
            for c in 0..64 {
                for code in 1..16u8 {
                    let mut row = [0u8; 32];
                    row[c / 2] = code << (4 * (c % 2));
                    check(row, [false; 4], [false; 4]);
                }
            }
        }
        // Few enough rotations that the word form is cheap: 17 (f16) and 14 (bf16).
        let terms = |a| ChunkRowWords::new(&Decoder::of(a).layout()).terms();
        assert_eq!((terms(Activations::F16), terms(Activations::Bf16)), (17, 14));
    }

    #[test]
    fn scale_bytes_are_prepacked_scale() {
        for b in 0..=255u8 {
            assert_eq!(SCALE_BYTES[b as usize], prepacked_scale(b));
        }
    }

    /// A byte pattern that differs between every (buffer, offset) pair of a small stack.
    fn byte_at(i: usize) -> u8 {
        ((i ^ (i >> 8)).wrapping_mul(151) % 253) as u8
    }

    /// The line formula equals the row formula of the CPU prepack: every output byte of a stack
    /// of experts, padding rows included, is the byte of row `r + 8·row_step`, column
    /// `4·chunk + block` (`scale_source`), re-encoded for bf16.
    #[test]
    fn scale_lines_are_the_row_prepack() {
        for (experts, rows, k) in [(1u32, 1u32, 64u32), (3, 130, 192), (2, 256, 128), (1, 8, 320)] {
            let per = blocked_bytes(rows, k);
            let input: [u8; 3 * 256 * 20] = core::array::from_fn(byte_at);
            let input = &input[..experts as usize * per];
            for act in [Activations::F16, Activations::Bf16] {
                let mut by_lines = [0u8; 3 * 256 * 20];
                for l in 0..scale_lines(experts, rows, k) as u32 {
                    let at = |l: u32| -> [u32; 4] {
                        core::array::from_fn(|w| {
                            u32::from_le_bytes(input[16 * l as usize + 4 * w..][..4].try_into().unwrap())
                        })
                    };
                    let line = prepack_scale_line(l, at(l), at(l ^ 8), act);
                    for (w, word) in line.iter().enumerate() {
                        by_lines[16 * l as usize + 4 * w..][..4].copy_from_slice(&word.to_le_bytes());
                    }
                }
                let padded = crate::scale_layout::rest_m(rows) * 128;
                for e in 0..experts as usize {
                    for row in 0..padded {
                        let second = (row % 16) / 8;
                        for j in 0..k / 16 {
                            let (chunk, byte) = (j / 4, j % 4);
                            let (step, block) = scale_source(act, second, byte);
                            let from = blocked_offset(row - 8 * second + 8 * step, 4 * chunk + block, rest_k(k));
                            let s = input[e * per + from];
                            let want = if act == Activations::Bf16 { prepacked_scale(s) } else { s };
                            let at = e * per + blocked_offset(row, j, rest_k(k));
                            assert_eq!(
                                by_lines[at], want,
                                "{act:?} E={experts} N={rows} K={k}: expert {e} row {row} col {j}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Value item `t`'s scale word is the word of its row and chunk in its expert's scales.
    #[test]
    fn chunk_scale_words_follow_the_stack() {
        let (rows, k) = (130, 192);
        let chunks = k / CHUNK_K;
        let nz = |x| NonZeroU32::new(x).unwrap();
        for t in 0..value_items(3, rows, k) as u32 {
            let (row, chunk) = (t / chunks, t % chunks);
            let want =
                (row / rows) as usize * blocked_bytes(rows, k) + blocked_offset(row % rows, 4 * chunk, rest_k(k));
            assert_eq!(chunk_scale_word_offset(t, nz(rows), nz(chunks)), want, "item {t}");
        }
        assert_eq!(
            chunk_scale_word_offset(3 * 130 * 3 - 1, nz(rows), nz(chunks)),
            2 * 256 * 12 + blocked_offset(129, 8, 3)
        );
    }

    #[test]
    fn folds_follow_the_scale_bytes() {
        let word = u32::from_le_bytes([0x38, 0xB8, 0x00, 0x80]);
        assert_eq!(folds(word, Activations::F16), ([false; 4], [false; 4]));
        assert_eq!(folds(word, Activations::Bf16), ([false, true, false, true], [false, false, true, true]));
    }

    #[test]
    fn counts_and_geometry() {
        // 256 experts of 7168 × 2048: 58.7 M chunk rows, 14.7 M scale lines.
        assert_eq!(value_items(256, 7168, 2048), 256 * 7168 * 32);
        assert_eq!(scale_lines(256, 7168, 2048), 256 * 7168 * 128 / 16);
        assert!(items(256, 7168, 2048) < MAX_ITEMS && items(256, 2048, 7168) < MAX_ITEMS);
        // N = 130: 256 padded rows of scales.
        assert_eq!(scale_lines(1, 130, 64), 256 * 4 / 16);
        assert_eq!(items(0, 130, 64), 0);
        let g = prepack_launch(items(256, 7168, 2048), 132);
        assert_eq!((g.grid, g.block, g.cluster, g.smem_bytes), (132 * PREPACK_CTAS_PER_SM, 256, 1, 0));
        assert_eq!(prepack_launch(300, 132).grid, 2);
        assert_eq!(prepack_launch(0, 132).grid, 0);
        assert_eq!(PREPACK_THREADS * PREPACK_MAX_REGISTERS * PREPACK_CTAS_PER_SM, REGISTERS_PER_SM);
        let p =
            PrepackParams { values: 0, scales: 0, out_values: 0, out_scales: 0, rows: 8, k: 64, experts: 1, bf16: 1 };
        assert_eq!(p.activations(), Activations::Bf16);
        assert_eq!(PrepackParams { bf16: 0, ..p }.activations(), Activations::F16);
    }
}
