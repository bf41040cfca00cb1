//! W4A16 — f16 or bf16 activations times NVFP4 weights — on sm_90a: the prepacked weight format
//! (docs/w4a16.md §2). The activations are wgmma's B operand in their natural K order, so the K
//! permutation that W4A4 applies to the tokens ([`super::token_k_position`]) is applied to the
//! weights instead, once: each consumer thread still loads 8 bytes per row and chunk
//! ([`super::weight_fragment_offset`]) and decodes them with the same decoder, and the pairs it gets
//! are its A-fragment registers for the natural columns. The scales keep the blocked layout: for
//! f16 activations they are the e4m3 bytes as given (the kernel converts the four of a chunk with
//! `cvt.rn.f16x2.e4m3x2`, as W4A4 converts one); for bf16 activations each byte is re-encoded
//! ([`prepacked_scale`]) so that it converts to bf16 with integer operations, and every block's
//! scale made non-negative (its sign moved into its codes).

use super::config::CHUNK_K;

/// The natural column (0..64) of a 64-wide chunk row that the prepacked format stores as element
/// `i` (0..8) of word `h` (0, 1) of consumer thread `q`'s (0..4) 8 bytes (bytes `8q + 4h ..` of
/// the chunk row, a little-endian word; where the element's four code bits lie in it:
/// [`Decoder::source_bit`]).
///
/// The decoder ([`Decoder`]) makes output word `k` of word `h` from elements `k` (low half) and
/// `k + 4` (high half); pair `p = 4h + k` feeds wgmma k-step `p / 2`, register `2·(p % 2)` (the
/// consumer's fragment order), whose columns for thread `q` are `16·(p/2) + 2q + 8·(p % 2)` and
/// the next one (PTX ISA, wgmma register fragments for A).
pub const fn packed_column(q: u32, h: u32, i: u32) -> u32 {
    let p = 4 * h + i % 4;
    16 * (p / 2) + 2 * q + 8 * (p % 2) + i / 4
}

/// Where the prepacked format stores natural column `c` (0..64) of a chunk row: `(q, h, i)` of
/// [`packed_column`], whose inverse this is.
pub const fn packed_place(c: u32) -> (u32, u32, u32) {
    // c = 16j + 2q + 8s + u, p = 2j + s = 4h + k, element i = k + 4u.
    let (j, r) = (c / 16, c % 16);
    let (s, r) = (r / 8, r % 8);
    let (q, u) = (r / 2, r % 2);
    let p = 2 * j + s;
    (q, p / 4, p % 4 + 4 * u)
}

/// How a W4A16 decoder forms output word `k` from a prepacked 32-bit word `w`, before the mask
/// [`Decoder::keep`] leaves the fields of its two values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WordStep {
    /// `w` itself (one `lop3` in all).
    Identity,
    /// `w` rotated right by this many bits (`shf.r.wrap`, then the mask).
    RotateRight(u32),
    /// `(w & mask) · multiplier` mod 2³² (`lop3`, `mul.lo`, then the mask): each set bit of the
    /// multiplier shifts a copy of the masked bits left, and the copies share no bit, so the
    /// product is their OR (no carries; [`Decoder::copies_are_disjoint`]).
    MaskMultiply {
        /// The bits of the word's two values.
        mask: u32,
        /// A sum of powers of two, one per shift.
        multiplier: u32,
    },
}

/// A W4A16 weight decoder: each prepacked word (8 e2m1 codes) becomes four 16x2 words, word `k`
/// holding elements `k` (low half) and `k + 4` (high half) with their code bits moved to
/// `field_bits` (m, e0, e1, sign; plus 16 in the high half) and every other bit clear. For f16 the
/// fields are bits 9, 10, 11, 15 (the value times 2⁻¹⁴, 0.5 a subnormal), for bf16 bits 6, 7, 8,
/// 15 (times 2⁻¹²⁶, 0.5 the subnormal 2⁻¹²⁷). The prepack puts each code bit where its word's
/// step finds it ([`Decoder::source_bit`]): 8 integer operations per 8 values for bf16, 9 for
/// f16, where decoding natural nibbles takes 15 and 11 (docs/w4a16.md §2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoder {
    /// Bit of the m, e0, e1 and sign bits of a code in the low half of an output word.
    pub field_bits: [u32; 4],
    /// The step of each output word.
    pub steps: [WordStep; 4],
}

/// The f16 decoder: word 0 in place, word 1 rotated, words 2 and 3 by two shifted copies each.
pub const F16_DECODER: Decoder = Decoder {
    field_bits: [9, 10, 11, 15],
    steps: [
        WordStep::Identity,
        WordStep::RotateRight(3),
        WordStep::MaskMultiply { mask: 0x0033_0033, multiplier: (1 << 6) | (1 << 8) | (1 << 15) },
        WordStep::MaskMultiply { mask: 0x01C8_01C8, multiplier: (1 << 3) | (1 << 12) },
    ],
};

/// The bf16 decoder: word 0 in place, words 1 and 2 rotated, word 3 by three shifted copies.
pub const BF16_DECODER: Decoder = Decoder {
    field_bits: [6, 7, 8, 15],
    steps: [
        WordStep::Identity,
        WordStep::RotateRight(3),
        WordStep::RotateRight(6),
        WordStep::MaskMultiply { mask: 0x001B_001B, multiplier: (1 << 3) | (1 << 8) | (1 << 14) },
    ],
};

impl Decoder {
    /// The decoder of prepacked weights for `activations`.
    pub const fn of(activations: Activations) -> Decoder {
        match activations {
            Activations::F16 => F16_DECODER,
            Activations::Bf16 => BF16_DECODER,
        }
    }

    /// The bits an output word keeps: the four fields of both halves.
    pub const fn keep(&self) -> u32 {
        let mut keep = 0;
        let mut f = 0;
        while f < 4 {
            keep |= (1 << self.field_bits[f]) | (1 << (self.field_bits[f] + 16));
            f += 1;
        }
        keep
    }

    /// Output word `k` of prepacked word `w`, as plain arithmetic (the kernel's
    /// `convert::prepacked_e2m1x8_to_16x2` does the same with `mul.lo.u32` in `asm!`).
    pub const fn word(&self, w: u32, k: usize) -> u32 {
        let moved = match self.steps[k] {
            WordStep::Identity => w,
            WordStep::RotateRight(r) => w.rotate_right(r),
            WordStep::MaskMultiply { mask, multiplier } => (w & mask).wrapping_mul(multiplier),
        };
        moved & self.keep()
    }

    /// Every element's source bits ([`Decoder::source_bit`]), computed once for loops over many
    /// words.
    pub const fn layout(&self) -> BitLayout {
        let mut bits = [[0u32; 4]; 8];
        let mut i = 0;
        while i < 8 {
            let mut f = 0;
            while f < 4 {
                bits[i][f] = self.source_bit(i as u32, f as u32);
                f += 1;
            }
            i += 1;
        }
        BitLayout { bits }
    }

    /// The bit of a prepacked word that output word `k` moves to `target` (a bit of
    /// [`Decoder::keep`]); `None` if none does.
    const fn source_of(&self, k: usize, target: u32) -> Option<u32> {
        match self.steps[k] {
            WordStep::Identity => Some(target),
            WordStep::RotateRight(r) => Some((target + r) % 32),
            WordStep::MaskMultiply { mask, multiplier } => {
                let mut s = 0;
                while s <= target {
                    if mask >> s & 1 != 0 && multiplier >> (target - s) & 1 != 0 {
                        return Some(s);
                    }
                    s += 1;
                }
                None
            }
        }
    }

    /// The bit of a prepacked word that holds bit `field` (0 m, 1 e0, 2 e1, 3 sign) of element `i`
    /// (0..8) of the word: the prepack's layout.
    pub const fn source_bit(&self, i: u32, field: u32) -> u32 {
        let target = self.field_bits[field as usize] + 16 * (i / 4);
        match self.source_of((i % 4) as usize, target) {
            Some(s) => s,
            None => panic!("a field no step reaches"),
        }
    }

    /// For every [`WordStep::MaskMultiply`]: its mask is exactly the bits of its word's two
    /// values, and the copies the multiplier makes of it share no bit below 32, so the product
    /// is their OR (no carries) for every word. With the layout a bijection (a host test), the one
    /// copy that lands on a kept bit carries that field.
    pub const fn copies_are_disjoint(&self) -> bool {
        let mut k = 0;
        while k < 4 {
            if let WordStep::MaskMultiply { mask, multiplier } = self.steps[k] {
                let mut sources = 0u32;
                let mut f = 0;
                while f < 8 {
                    sources |= 1 << self.source_bit(k as u32 + 4 * (f / 4), f % 4);
                    f += 1;
                }
                if sources != mask {
                    return false;
                }
                let mut seen = 0u32;
                let mut t = 0;
                while t < 32 {
                    if multiplier >> t & 1 != 0 {
                        let copy = mask << t;
                        if copy & seen != 0 {
                            return false;
                        }
                        seen |= copy;
                    }
                    t += 1;
                }
            }
            k += 1;
        }
        true
    }
}

const _: () = assert!(F16_DECODER.copies_are_disjoint() && BF16_DECODER.copies_are_disjoint());

/// Where a decoder's prepacked word keeps the four code bits of each of its 8 elements
/// ([`Decoder::layout`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BitLayout {
    /// `bits[i][field]`: the bit of field `field` (0 m, 1 e0, 2 e1, 3 sign) of element `i`.
    bits: [[u32; 4]; 8],
}

impl BitLayout {
    /// The bit of field `field` (0 m, 1 e0, 2 e1, 3 sign) of element `i` (0..8).
    pub const fn bit(&self, i: u32, field: u32) -> u32 {
        self.bits[i as usize][field as usize]
    }

    /// The prepacked word of eight codes (`codes[i]`: element `i`'s 4-bit code).
    pub fn place(&self, codes: [u32; 8]) -> u32 {
        let mut w = 0;
        for (code, bits) in codes.iter().zip(&self.bits) {
            for (f, bit) in bits.iter().enumerate() {
                w |= (code >> f & 1) << bit;
            }
        }
        w
    }

    /// Element `i`'s 4-bit code in prepacked word `w` (the inverse of [`BitLayout::place`]).
    pub fn code(&self, w: u32, i: u32) -> u32 {
        self.bits[i as usize].iter().enumerate().fold(0, |x, (f, bit)| x | ((w >> bit & 1) << f))
    }
}

/// The prepacked scale word of row `r` of a 128-row scale block (`r % 16 < 8`: the rows whose
/// consumer thread also holds row `r + 8`) and of row `r + 8` hold both rows' four chunk scales,
/// paired for the decoder: byte `b` of the word of row `r + 8·second` (`second` 0 or 1) is the
/// scale of row `r + 8·row_step` for block `block` of the chunk, `(row_step, block)` as
/// returned. f16: `[r.0, r8.0, r.1, r8.1]` then `[r.2, r8.2, r.3, r8.3]` — each half-word is the
/// pair (row `r`, row `r + 8`) of one k-step, converted by one `cvt.rn.f16x2.e4m3x2`; bf16:
/// `[r.0, r.1, r8.0, r8.1]` then `[r.2, r.3, r8.2, r8.3]` — shifting the word left or right by 4
/// puts both rows' byte of one k-step under the mask of `scale_bf16_bits`.
pub const fn scale_source(activations: Activations, second: u32, byte: u32) -> (u32, u32) {
    let (row_step, block) = match activations {
        Activations::F16 => (byte % 2, byte / 2),
        Activations::Bf16 => (byte / 2, byte % 2),
    };
    (row_step, 2 * second + block)
}

/// Columns per chunk row, and bytes.
const CHUNK_BYTES: u32 = CHUNK_K / 2;

/// The exponent the bf16 consumers' products lack: a decoded value (`value · 2⁻¹²⁶`) times its
/// re-encoded scale as bf16 (`|scale| · 2¹¹⁹`) is `value · |scale| · 2⁻⁷`, which the epilogue
/// multiplies back (the f16 decode's products lack `DECODE_EXPONENT`, as in W4A4).
pub const BF16_PRODUCT_EXPONENT: u32 = 7;

/// Every thread of a W4A16 GEMM executes `griddepcontrol.wait` before it reads the group table,
/// the work list or its length: no dequantization precedes these kernels, so a device-sized plan
/// launches them right after its scheduler (which lets its dependents start at once) with
/// programmatic stream serialization, and the wait is what orders the scheduler's tables before
/// their reads. After a plain launch the wait returns at once.
pub const GEMM_WAITS_FIRST: bool = true;

/// The activations' type of a W4A16 kernel (and of its prepacked weights).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Activations {
    /// f16 activations: values permuted, e4m3 scales as given.
    F16,
    /// bf16 activations: values permuted with each block's scale sign folded in, scales
    /// re-encoded ([`prepacked_scale`]).
    Bf16,
}

/// The prepacked scale byte of an e4m3 scale byte, sign ignored (the prepack moves a negative
/// scale's sign into its block's codes): bits 14–7 of the f16 value `|scale| · 2⁷` — an unsigned
/// e5m3 (f16's 5 exponent bits, bias 15, and the top 3 of its mantissa bits) that holds every
/// e4m3 magnitude exactly (times 2⁷ they lie in [2⁻², 57344], normal in f16, with at most 4
/// significant bits). Zero gives 0; NaN (`0x7F`, `0xFF`) gives `0xFC`, an f16 NaN's bits.
pub const fn prepacked_scale(e4m3: u8) -> u8 {
    let (e, m) = (((e4m3 >> 3) & 0xF) as u32, (e4m3 & 7) as u32);
    if e == 15 && m == 7 {
        return 0xFC;
    }
    if e == 0 && m == 0 {
        return 0;
    }
    // |scale| · 2⁷ = 2^e · (1 + m/8) for a normal e4m3 (bias 7), m · 2⁻² for a subnormal one.
    let (exponent, mantissa) = if e > 0 {
        (e as i32, m)
    } else {
        // m · 2⁻² with m in 1..8: its leading bit at `lead`, renormalized to 3 mantissa bits.
        let lead: u32 = if m >= 4 {
            2
        } else if m >= 2 {
            1
        } else {
            0
        };
        (lead as i32 - 2, (m << (3 - lead)) & 7)
    };
    // f16 exponent field: exponent + 15 (at least 13: normal).
    ((((exponent + 15) as u32) << 3) | mantissa) as u8
}

/// The f16 bits of a prepacked scale byte: `byte << 7` (`|scale| · 2⁷`).
pub const fn scale_f16_bits(byte: u8) -> u16 {
    (byte as u16) << 7
}

/// The bf16 bits of a prepacked scale byte times 2¹¹²: `(byte << 4) + 0x7000`, i.e. the f16
/// exponent field `e` becomes the low 5 bits of bf16's exponent field and `0x7000` its top bits
/// `111`, so the value is `2^(e + 97) · (1 + m/8)` = `|scale| · 2¹¹⁹`. No carry: the two terms
/// share no bit. A zero scale's byte gives 2⁹⁷ (its block's codes are all +0), NaN's gives NaN.
pub const fn scale_bf16_bits(byte: u8) -> u16 {
    ((byte as u16) << 4) + 0x7000
}

/// Prepacks one chunk row (32 bytes of packed e2m1, natural order: column `2b` in the low nibble
/// of byte `b`) into `out`, each code's bits where `layout` (the activation type's
/// [`Decoder::layout`]) puts them in its thread's word ([`packed_place`]), every code's sign
/// flipped when `negate[block]` and every code zeroed when `zero[block]` (`block` = column / 16).
/// (The GPU prepack runs the word form of this function, [`super::prepack::ChunkRowWords`],
/// derived from the same [`packed_column`] and layout and tested equal to it.)
pub fn prepack_chunk_row(
    row: &[u8; CHUNK_BYTES as usize],
    negate: [bool; 4],
    zero: [bool; 4],
    layout: &BitLayout,
) -> [u8; 32] {
    // The codes of each thread's word `2q + h`, by element.
    let mut codes = [[0u32; 8]; 8];
    for c in 0..CHUNK_K {
        let mut code = (row[(c / 2) as usize] >> (4 * (c % 2))) & 0xF;
        let block = (c / 16) as usize;
        if zero[block] {
            code = 0;
        } else if negate[block] {
            code ^= 8;
        }
        let (q, h, i) = packed_place(c);
        codes[(2 * q + h) as usize][i as usize] = u32::from(code);
    }
    let mut out = [0u8; CHUNK_BYTES as usize];
    for (w, codes) in codes.iter().enumerate() {
        out[4 * w..4 * w + 4].copy_from_slice(&layout.place(*codes).to_le_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_places_are_a_bijection_and_invert_packed_column() {
        let mut seen = [false; 64];
        for q in 0..4 {
            for h in 0..2 {
                for i in 0..8 {
                    let c = packed_column(q, h, i);
                    assert!(!seen[c as usize], "column {c} twice");
                    seen[c as usize] = true;
                    assert_eq!(packed_place(c), (q, h, i), "q {q} h {h} i {i}");
                }
            }
        }
    }

    /// Thread `q`'s decoder pair `p` holds the columns of its fragment register: for k-step `j`,
    /// register 0 columns `16j + 2q, +1`, register 2 `16j + 2q + 8, +9`, low value first.
    #[test]
    fn decoder_pairs_are_the_natural_fragment_registers() {
        for q in 0..4 {
            for p in 0..8 {
                let (h, k) = (p / 4, p % 4);
                let (j, s) = (p / 2, p % 2);
                assert_eq!(packed_column(q, h, k), 16 * j + 2 * q + 8 * s);
                assert_eq!(packed_column(q, h, k + 4), 16 * j + 2 * q + 8 * s + 1);
            }
        }
    }

    fn e4m3(byte: u8) -> f64 {
        let (e, m) = (((byte >> 3) & 0xF) as i32, (byte & 7) as f64);
        let mag = if e == 0 { m * 2f64.powi(-9) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
        if byte & 0x80 != 0 {
            -mag
        } else {
            mag
        }
    }

    /// The value of a finite 16-bit float with `e` exponent bits (bias `2^(e−1) − 1`), the rest
    /// mantissa.
    fn float16(bits: u16, e: u32) -> f64 {
        let (m_bits, bias) = (15 - e, (1i32 << (e - 1)) - 1);
        let exp = ((bits >> m_bits) & ((1 << e) - 1)) as i32;
        assert!(exp < (1 << e) - 1, "not finite: {bits:#x}");
        let m = (bits & ((1 << m_bits) - 1)) as f64 / (1u32 << m_bits) as f64;
        let mag = if exp == 0 { m * 2f64.powi(1 - bias) } else { (1.0 + m) * 2f64.powi(exp - bias) };
        if bits & 0x8000 != 0 {
            -mag
        } else {
            mag
        }
    }

    fn f16_bits(bits: u16) -> f64 {
        float16(bits, 5)
    }

    fn bf16_bits(bits: u16) -> f64 {
        float16(bits, 8)
    }

    /// Every e4m3 byte: the prepacked byte is `|scale| · 2⁷` as f16 and `|scale| · 2¹¹⁹` as bf16,
    /// exactly; zero is zero (f16), NaN is NaN (both).
    #[test]
    fn prepacked_scales_are_exact_in_f16_and_bf16() {
        for byte in 0..=255u8 {
            let b = prepacked_scale(byte);
            if byte & 0x7F == 0x7F {
                assert_eq!(b, 0xFC);
                assert!(scale_f16_bits(b) & 0x7C00 == 0x7C00 && scale_f16_bits(b) & 0x3FF != 0, "f16 NaN");
                let bf = scale_bf16_bits(b);
                assert!(bf & 0x7F80 == 0x7F80 && bf & 0x7F != 0, "bf16 NaN: {bf:#x}");
                continue;
            }
            let s = e4m3(byte).abs();
            assert_eq!(f16_bits(scale_f16_bits(b)), s * 128.0, "{byte:#x} as f16");
            if s > 0.0 {
                assert_eq!(bf16_bits(scale_bf16_bits(b)), s * 2f64.powi(119), "{byte:#x} as bf16");
                assert!((scale_f16_bits(b) >> 10) & 0x1F > 0, "{byte:#x}: a normal f16");
            } else {
                assert_eq!(b, 0);
            }
        }
    }

    /// Each decoder's layout puts the 32 code bits of a word's 8 elements on distinct bits, and
    /// decoding any word gives each element's code bits at its fields (both halves), nothing
    /// else: for every element, every code, the other elements random.
    #[test]
    fn decoders_read_every_code_bit_from_the_prepacked_layout() {
        for (name, d) in [("f16", F16_DECODER), ("bf16", BF16_DECODER)] {
            let mut used = 0u64;
            for i in 0..8 {
                for f in 0..4 {
                    let b = d.source_bit(i, f);
                    assert!(b < 32 && used >> b & 1 == 0, "{name}: bit {b} twice");
                    used |= 1 << b;
                }
            }
            assert_eq!(used, 0xFFFF_FFFF, "{name}");
            assert!(d.copies_are_disjoint(), "{name}");
            let layout = d.layout();
            let field = |code: u32| (0..4).fold(0u32, |x, f| x | ((code >> f & 1) << d.field_bits[f as usize]));
            let mut state = 0x9E37_79B9_7F4A_7C15u64;
            for i in 0..8u32 {
                for code in 0..16u32 {
                    for _ in 0..64 {
                        state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let mut codes: [u32; 8] = core::array::from_fn(|e| (state >> (4 * e + 20)) as u32 & 0xF);
                        codes[i as usize] = code;
                        let w = layout.place(codes);
                        for k in 0..4 {
                            let want = field(codes[k]) | (field(codes[k + 4]) << 16);
                            assert_eq!(d.word(w, k), want, "{name}: word {k} of {w:#010x}");
                        }
                    }
                }
            }
        }
    }

    /// Scale words: over one 16-row group, every (row, block) byte appears once, the f16 half-words
    /// and the bf16 shifted bytes pair rows `r` and `r + 8` of one block.
    #[test]
    fn scale_words_pair_the_rows_of_one_thread() {
        for act in [Activations::F16, Activations::Bf16] {
            let mut seen = [[false; 4]; 2];
            for second in 0..2 {
                for byte in 0..4 {
                    let (r, b) = scale_source(act, second, byte);
                    assert!(!seen[r as usize][b as usize]);
                    seen[r as usize][b as usize] = true;
                }
            }
            for j in 0..4 {
                let (second, half) = (j / 2, j % 2);
                let bytes = match act {
                    // Half-word `half`: bytes 2·half, 2·half + 1 (low value first).
                    Activations::F16 => [2 * half, 2 * half + 1],
                    // Shifted left (j even) or right by 4: byte `half` and byte `2 + half`.
                    Activations::Bf16 => [half, 2 + half],
                };
                assert_eq!(scale_source(act, second, bytes[0]), (0, j), "{act:?} k-step {j}");
                assert_eq!(scale_source(act, second, bytes[1]), (1, j), "{act:?} k-step {j}");
            }
        }
    }

    #[test]
    fn chunk_rows_move_every_code_and_fold_signs_and_zeros() {
        let row: [u8; 32] = core::array::from_fn(|b| (b as u8).wrapping_mul(37).wrapping_add(11));
        let code = |r: &[u8; 32], c: u32| (r[(c / 2) as usize] >> (4 * (c % 2))) & 0xF;
        for act in [Activations::F16, Activations::Bf16] {
            let layout = Decoder::of(act).layout();
            let packed = prepack_chunk_row(&row, [false, true, false, false], [false, false, true, false], &layout);
            for c in 0..64 {
                let (q, h, i) = packed_place(c);
                let w = u32::from_le_bytes(packed[(8 * q + 4 * h) as usize..][..4].try_into().unwrap());
                let got = layout.code(w, i) as u8;
                let want = match c / 16 {
                    1 => code(&row, c) ^ 8,
                    2 => 0,
                    _ => code(&row, c),
                };
                assert_eq!(got, want, "{act:?} column {c}");
            }
        }
    }
}
