//! The 32-bit instruction descriptor of
//! `tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X`.
//!
//! The descriptor is a register operand (`idesc`) that fixes the operand types, the scale type
//! and the MMA shape. Layout for `kind::mxf4nvf4`, PTX ISA 9.1 §9.7.16.4.2 Tables 43/44
//! (docs/sm100.md §3):
//!
//! | Bits         | Field                                                        |
//! |--------------|--------------------------------------------------------------|
//! | 0–1, 3, 6    | reserved, 0                                                  |
//! | 2            | sparse: 0 dense                                              |
//! | 4–5          | SF-B ID: must be 0 with `scale_vec::4X`                      |
//! | 7–9          | A type: E2M1 = 1                                             |
//! | 10–11        | B type: E2M1 = 1 (bit 12 reserved)                           |
//! | 13, 14       | negate A, negate B                                           |
//! | 15, 16       | transpose A, transpose B: must be 0 (both K-major)           |
//! | 17–22        | N >> 3                                                       |
//! | 23           | scale type: UE4M3 = 0, UE8M0 = 1                             |
//! | 24–26        | reserved, 0                                                  |
//! | 27–28        | M >> 7                                                       |
//! | 29–30        | SF-A ID: 0 with `scale_vec::4X`                              |
//! | 31           | K: 0 = 64 (1 = 96 exists on sm_103a only)                    |
//!
//! NVFP4 fixes A = B = E2M1 and scale = UE4M3 with one scale per 16 values (`scale_vec::4X`: four
//! scales per K=64 row). Only the shape and the negate bits vary, so the constructor takes those.

/// M of every `cta_group::1` block-scaled MMA the kernel issues (PTX §9.7.16.10.9.1 Table 39).
pub const MMA_M: u32 = 128;

/// K of one `kind::mxf4nvf4` MMA, in FP4 values. Source: PTX §9.7.16.10.9.1 Table 39.
pub const MMA_K: u32 = 64;

/// Smallest N, and the step between valid N values (PTX §9.7.16.10.9.1 Table 39).
pub const MMA_N_STEP: u32 = 8;

/// Largest N of a `cta_group::1` MMA (PTX §9.7.16.10.9.1 Table 39).
pub const MMA_N_MAX: u32 = 256;

/// Element type code for E2M1 in the A/B type fields of `kind::mxf4nvf4` (PTX §9.7.16.4.2
/// Table 44).
pub const E2M1_TYPE_CODE: u32 = 1;

/// Scale-factor element type, bit 23 (PTX §9.7.16.4.2 Table 43).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ScaleType {
    /// float8 e4m3 without sign (NVFP4's block scale); the seed's choice.
    Ue4m3 = 0,
    /// Power-of-two e8m0 (MXFP4's block scale).
    Ue8m0 = 1,
}

/// Why an MMA shape is rejected (PTX §9.7.16.10.9.1 Table 39, `cta_group::1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MmaShapeError {
    /// M must be 128 for the `cta_group::1` kernel (64 is legal in PTX but its TMEM layout
    /// differs and the seed dropped its BLOCK_M = 64 path).
    MNot128,
    /// N must be a multiple of 8.
    NNotMultipleOf8,
    /// N must be in 8..=256.
    NOutOfRange,
}

/// A validated `cta_group::1` block-scaled MMA shape: M = 128, N in 8..=256 step 8, K = 64.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaShape {
    n: u32,
}

impl MmaShape {
    /// Checks `m` and `n` against PTX §9.7.16.10.9.1 Table 39 (restricted to M = 128).
    pub const fn new(m: u32, n: u32) -> Result<Self, MmaShapeError> {
        if m != MMA_M {
            return Err(MmaShapeError::MNot128);
        }
        if !super::divides(MMA_N_STEP, n) {
            return Err(MmaShapeError::NNotMultipleOf8);
        }
        if n == 0 || n > MMA_N_MAX {
            return Err(MmaShapeError::NOutOfRange);
        }
        Ok(Self { n })
    }

    /// M (always 128).
    pub const fn m(self) -> u32 {
        MMA_M
    }

    /// N.
    pub const fn n(self) -> u32 {
        self.n
    }

    /// K in FP4 values (always 64).
    pub const fn k(self) -> u32 {
        MMA_K
    }
}

const SPARSE_BIT: u32 = 2;
const SFB_ID_SHIFT: u32 = 4;
const A_TYPE_SHIFT: u32 = 7;
const B_TYPE_SHIFT: u32 = 10;
const NEGATE_A_BIT: u32 = 13;
const NEGATE_B_BIT: u32 = 14;
const TRANSPOSE_A_BIT: u32 = 15;
const TRANSPOSE_B_BIT: u32 = 16;
const N_SHIFT: u32 = 17;
const SCALE_TYPE_BIT: u32 = 23;
const M_SHIFT: u32 = 27;
const SFA_ID_SHIFT: u32 = 29;
const K_BIT: u32 = 31;

/// Instruction descriptor for `kind::mxf4nvf4.block_scale.scale_vec::4X` (layout in the module
/// docs). The raw bits leave only through [`InstrDescriptor::to_bits`], for the PTX operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct InstrDescriptor(u32);

impl InstrDescriptor {
    /// The NVFP4 descriptor the seed uses: dense, A = B = E2M1, UE4M3 scales, SF IDs 0, both
    /// operands K-major, no negation, K = 64, shape `m x n`. M = 128 gives 0x08200480 for N = 128
    /// and 0x08400480 for N = 256 (docs/sm100.md §3).
    pub const fn nvfp4(m: u32, n: u32) -> Result<Self, MmaShapeError> {
        match MmaShape::new(m, n) {
            Ok(shape) => Ok(Self::nvfp4_shape(shape, false, false)),
            Err(e) => Err(e),
        }
    }

    /// The NVFP4 descriptor for a validated shape, with the negate bits exposed (bits 13/14 flip
    /// the sign of A or B; the seed leaves both clear).
    pub const fn nvfp4_shape(shape: MmaShape, negate_a: bool, negate_b: bool) -> Self {
        Self(
            (E2M1_TYPE_CODE << A_TYPE_SHIFT)
                | (E2M1_TYPE_CODE << B_TYPE_SHIFT)
                | ((negate_a as u32) << NEGATE_A_BIT)
                | ((negate_b as u32) << NEGATE_B_BIT)
                | ((shape.n() >> 3) << N_SHIFT)
                | ((ScaleType::Ue4m3 as u32) << SCALE_TYPE_BIT)
                | ((shape.m() >> 7) << M_SHIFT),
        )
    }

    /// The raw 32-bit value, for the PTX `idesc` operand.
    pub const fn to_bits(self) -> u32 {
        self.0
    }

    /// N encoded in bits 17–22.
    pub const fn n(self) -> u32 {
        ((self.0 >> N_SHIFT) & 0x3F) << 3
    }

    /// M encoded in bits 27–28.
    pub const fn m(self) -> u32 {
        ((self.0 >> M_SHIFT) & 0x3) << 7
    }

    /// Scale type encoded in bit 23.
    pub const fn scale_type(self) -> ScaleType {
        if (self.0 >> SCALE_TYPE_BIT) & 1 == 1 {
            ScaleType::Ue8m0
        } else {
            ScaleType::Ue4m3
        }
    }

    /// Whether the bits that must be zero under `scale_vec::4X` with K-major dense operands are
    /// zero: sparse, SF-B/SF-A IDs, transposes, reserved bits 0–1, 3, 6, 12, 24–26 and K = 96.
    pub const fn is_dense_k_major_4x(self) -> bool {
        let must_be_zero = (1 << SPARSE_BIT)
            | (0x3 << SFB_ID_SHIFT)
            | (1 << TRANSPOSE_A_BIT)
            | (1 << TRANSPOSE_B_BIT)
            | (0x3 << SFA_ID_SHIFT)
            | (1 << K_BIT)
            | 0b11
            | (1 << 3)
            | (1 << 6)
            | (1 << 12)
            | (0x7 << 24);
        self.0 & must_be_zero == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's expression, written out for any N.
    fn seed_idesc(block_n: u32) -> u32 {
        (1 << 7) | (1 << 10) | (block_n >> 3 << 17) | (128 >> 7 << 27)
    }

    #[test]
    fn matches_seed_constants() {
        assert_eq!(InstrDescriptor::nvfp4(128, 128).unwrap().to_bits(), 0x0820_0480);
        assert_eq!(InstrDescriptor::nvfp4(128, 256).unwrap().to_bits(), 0x0840_0480);
        assert_eq!(seed_idesc(128), 0x0820_0480);
        assert_eq!(seed_idesc(256), 0x0840_0480);
    }

    #[test]
    fn every_valid_n_matches_seed_expression_and_decodes() {
        for n in (8..=256).step_by(8) {
            let d = InstrDescriptor::nvfp4(128, n).unwrap();
            assert_eq!(d.to_bits(), seed_idesc(n), "n {n}");
            assert_eq!((d.m(), d.n()), (128, n));
            assert_eq!(d.scale_type(), ScaleType::Ue4m3);
            assert!(d.is_dense_k_major_4x());
        }
    }

    #[test]
    fn rejects_invalid_shapes() {
        assert_eq!(InstrDescriptor::nvfp4(64, 128), Err(MmaShapeError::MNot128));
        assert_eq!(InstrDescriptor::nvfp4(256, 128), Err(MmaShapeError::MNot128));
        assert_eq!(InstrDescriptor::nvfp4(128, 0), Err(MmaShapeError::NOutOfRange));
        assert_eq!(InstrDescriptor::nvfp4(128, 264), Err(MmaShapeError::NOutOfRange));
        assert_eq!(InstrDescriptor::nvfp4(128, 100), Err(MmaShapeError::NNotMultipleOf8));
        assert_eq!(InstrDescriptor::nvfp4(128, 4), Err(MmaShapeError::NNotMultipleOf8));
    }

    #[test]
    fn negate_bits() {
        let shape = MmaShape::new(128, 128).unwrap();
        let d = InstrDescriptor::nvfp4_shape(shape, true, true);
        assert_eq!(d.to_bits(), 0x0820_0480 | 1 << 13 | 1 << 14);
    }

    /// CUTLASS's `make_instr_desc_block_scaled<float_e2m1_t, float_e2m1_t, float, float_ue4m3_t,
    /// 128, N, UMMA::Major::K, UMMA::Major::K>()` (`include/cute/arch/mma_sm100_desc.hpp`), as its
    /// union `InstrDescriptorBlockScaled` lays out the bits: `a_format_` [7,10) and `b_format_`
    /// [10,13) = `MXF4Format::E2M1` = 1, `n_dim_` [17,23) = N >> 3, `scale_format_` bit 23 =
    /// `ScaleFormat::UE4M3` = 0, `m_dim_` [24,29) = M >> 4 (not M >> 7: for M = 128 the same bit,
    /// 27), SF IDs, majors (`K` = 0), negates, sparsity and `k_size_` all 0; the accumulator type
    /// does not enter the block-scaled descriptor. Packed here from those positions, independently
    /// of [`InstrDescriptor::nvfp4_shape`].
    fn cutlass_block_scaled(a_format: u32, b_format: u32, scale_format: u32, m: u32, n: u32) -> u32 {
        (a_format << 7) | (b_format << 10) | ((n >> 3) << 17) | (scale_format << 23) | ((m >> 4) << 24)
    }

    /// The literal descriptors CUTLASS produces for e2m1/e2m1/f32/ue4m3, M = 128, N = 128 and
    /// 256, beside ours.
    #[test]
    fn matches_cutlass_make_instr_desc_block_scaled() {
        const CUTLASS_M128_N128: u32 = 0x0820_0480;
        const CUTLASS_M128_N256: u32 = 0x0840_0480;
        assert_eq!(cutlass_block_scaled(1, 1, 0, 128, 128), CUTLASS_M128_N128);
        assert_eq!(cutlass_block_scaled(1, 1, 0, 128, 256), CUTLASS_M128_N256);
        assert_eq!(InstrDescriptor::nvfp4(128, 128).unwrap().to_bits(), CUTLASS_M128_N128);
        assert_eq!(InstrDescriptor::nvfp4(128, 256).unwrap().to_bits(), CUTLASS_M128_N256);
    }

    /// Usable in constant context, so a kernel can bake the descriptor in.
    #[test]
    fn const_construction() {
        const D: InstrDescriptor = match InstrDescriptor::nvfp4(128, 256) {
            Ok(d) => d,
            Err(_) => panic!("invalid shape"),
        };
        assert_eq!(D.to_bits(), 0x0840_0480);
    }
}
