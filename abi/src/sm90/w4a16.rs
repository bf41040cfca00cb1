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

/// The natural column (0..64) of a 64-wide chunk row that the prepacked format stores in nibble
/// `i` (0..8) of word `h` (0, 1) of consumer thread `q`'s (0..4) 8 bytes (bytes `8q + 4h ..` of
/// the chunk row, nibble `i` at bits `4i` of the little-endian word).
///
/// The decoder (`ptx::convert::e2m1x8_to_f16x2_scaled`) makes pair `k` of word `h` from nibbles
/// `k` (low half) and `k + 4` (high half); pair `p = 4h + k` feeds wgmma k-step `p / 2`, register
/// `2·(p % 2)` (the consumer's fragment order), whose columns for thread `q` are `16·(p/2) + 2q +
/// 8·(p % 2)` and the next one (PTX ISA, wgmma register fragments for A).
pub const fn packed_column(q: u32, h: u32, i: u32) -> u32 {
    let p = 4 * h + i % 4;
    16 * (p / 2) + 2 * q + 8 * (p % 2) + i / 4
}

/// Where the prepacked format stores natural column `c` (0..64) of a chunk row: the byte (0..32)
/// and the nibble's shift in it (0 or 4). The inverse of [`packed_column`].
pub const fn packed_position(c: u32) -> (u32, u32) {
    // c = 16j + 2q + 8s + u, p = 2j + s = 4h + k, nibble i = k + 4u.
    let (j, r) = (c / 16, c % 16);
    let (s, r) = (r / 8, r % 8);
    let (q, u) = (r / 2, r % 2);
    let p = 2 * j + s;
    let (h, k) = (p / 4, p % 4);
    let i = k + 4 * u;
    (8 * q + 4 * h + i / 2, 4 * (i % 2))
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

/// The exported name of the W4A16 kernel (f16 activations) of configuration `cfg`: each W4A4
/// variant has its W4A16 twin, which shares everything with it but the token source and the
/// decode's scales.
pub const fn kernel_name(cfg: super::GemmConfig) -> &'static str {
    kernel_name_of(cfg, Activations::F16)
}

/// The exported name of the W4A16 kernel of configuration `cfg` for `activations`: the f16 twins
/// `sm90_w4a16_gemm*` and the bf16 ones `sm90_w4a16_bf16_gemm*` (the bf16 decoder and scales,
/// `wgmma ... .bf16.bf16`).
pub const fn kernel_name_of(cfg: super::GemmConfig, activations: Activations) -> &'static str {
    let variant = if cfg.block_m == super::SMALL_TILE_M {
        3
    } else if cfg.block_n > super::BLOCK_N {
        2
    } else if cfg.narrow == super::TAIL_TILE_M {
        1
    } else {
        0
    };
    match activations {
        Activations::F16 => {
            ["sm90_w4a16_gemm", "sm90_w4a16_gemm_t64", "sm90_w4a16_gemm_n192", "sm90_w4a16_gemm_decode"][variant]
        }
        Activations::Bf16 => [
            "sm90_w4a16_bf16_gemm",
            "sm90_w4a16_bf16_gemm_t64",
            "sm90_w4a16_bf16_gemm_n192",
            "sm90_w4a16_bf16_gemm_decode",
        ][variant],
    }
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
/// of byte `b`) into `out`, flipping every code's sign when `negate[block]` and zeroing every code
/// when `zero[block]` (`block` = column / 16).
pub fn prepack_chunk_row(row: &[u8; CHUNK_BYTES as usize], negate: [bool; 4], zero: [bool; 4]) -> [u8; 32] {
    let mut out = [0u8; CHUNK_BYTES as usize];
    let mut c = 0;
    while c < CHUNK_K {
        let mut code = (row[(c / 2) as usize] >> (4 * (c % 2))) & 0xF;
        let block = (c / 16) as usize;
        if zero[block] {
            code = 0;
        } else if negate[block] {
            code ^= 8;
        }
        let (byte, shift) = packed_position(c);
        out[byte as usize] |= code << shift;
        c += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packed_positions_are_a_bijection_and_invert_packed_column() {
        let mut seen = [false; 64];
        for q in 0..4 {
            for h in 0..2 {
                for i in 0..8 {
                    let c = packed_column(q, h, i);
                    assert!(!seen[c as usize], "column {c} twice");
                    seen[c as usize] = true;
                    assert_eq!(packed_position(c), (8 * q + 4 * h + i / 2, 4 * (i % 2)), "q {q} h {h} i {i}");
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

    #[test]
    fn chunk_rows_move_every_code_and_fold_signs_and_zeros() {
        let row: [u8; 32] = core::array::from_fn(|b| (b as u8).wrapping_mul(37).wrapping_add(11));
        let code = |r: &[u8; 32], c: u32| (r[(c / 2) as usize] >> (4 * (c % 2))) & 0xF;
        let packed = prepack_chunk_row(&row, [false, true, false, false], [false, false, true, false]);
        for c in 0..64 {
            let (byte, shift) = packed_position(c);
            let got = (packed[byte as usize] >> shift) & 0xF;
            let want = match c / 16 {
                1 => code(&row, c) ^ 8,
                2 => 0,
                _ => code(&row, c),
            };
            assert_eq!(got, want, "column {c}");
        }
    }
}
