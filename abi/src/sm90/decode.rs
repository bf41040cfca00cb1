//! The e2m1 → f16 decode of both sm_90a kernels. The decoder (the kernel's
//! `ptx::convert::e2m1x8_to_f16x2_scaled`) places a code's magnitude bits `eem` at f16 bits 11..9
//! as they are, which reads as the e2m1 value times 2⁻¹⁴ (f16's exponent bias is 15, e2m1's 1);
//! the token dequantization (in f16) and the GEMM's epilogue (in f32) multiply the 2¹⁴ back in
//! after the block scale, which is exact.

/// The power of two the decoder's values lack: they are the e2m1 values times
/// `2^-DECODE_EXPONENT`.
pub const DECODE_EXPONENT: u32 = 14;

/// `2^DECODE_EXPONENT` in f32: the GEMM's epilogue multiplies the accumulators by it.
pub const DECODE_UNSCALE: f32 = (1u32 << DECODE_EXPONENT) as f32;

/// `2^DECODE_EXPONENT` as an f16 (exponent field `DECODE_EXPONENT + 15`, mantissa 0) in both
/// halves of an f16x2: the token dequantization multiplies its scaled pairs by it.
pub const DECODE_UNSCALE_F16X2: u32 = ((DECODE_EXPONENT + F16_EXPONENT_BIAS) << F16_MANTISSA_BITS) * 0x0001_0001;

const F16_EXPONENT_BIAS: u32 = 15;
const F16_MANTISSA_BITS: u32 = 10;

#[cfg(test)]
mod tests {
    use super::*;

    /// The value of f16 bits `h` (finite).
    fn f16_value(h: u32) -> f64 {
        let (sign, exponent, mantissa) = (h >> 15 & 1, (h >> 10 & 0x1F) as i32, (h & 0x3FF) as f64);
        let magnitude = if exponent == 0 {
            mantissa * 2f64.powi(-24)
        } else {
            (1.0 + mantissa / 1024.0) * 2f64.powi(exponent - 15)
        };
        if sign == 1 {
            -magnitude
        } else {
            magnitude
        }
    }

    #[test]
    fn decoded_values_times_the_unscale_are_the_e2m1_values() {
        const E2M1: [f64; 8] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0];
        assert_eq!(DECODE_UNSCALE, 16384.0);
        assert_eq!(DECODE_UNSCALE_F16X2 >> 16, DECODE_UNSCALE_F16X2 & 0xFFFF);
        assert_eq!(f16_value(DECODE_UNSCALE_F16X2 & 0xFFFF), DECODE_UNSCALE as f64);
        // A magnitude code at f16 bits 11..9, as the decoder places it.
        for (code, value) in E2M1.into_iter().enumerate() {
            assert_eq!(f16_value((code as u32) << 9) * DECODE_UNSCALE as f64, value, "code {code}");
        }
    }
}
