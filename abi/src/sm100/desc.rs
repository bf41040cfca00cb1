//! Shared-memory matrix descriptors for `tcgen05.mma` and `tcgen05.cp`.
//!
//! A descriptor tells the tensor core where an operand tile sits in shared memory and how its
//! 16-byte chunks are laid out. The 64-bit encoding is PTX ISA 9.1 §9.7.16.4.1, Table 40
//! (docs/sm100.md §2):
//!
//! | Bits  | Field                                                       |
//! |-------|-------------------------------------------------------------|
//! | 0–13  | start address, `(addr & 0x3FFFF) >> 4`                      |
//! | 16–29 | leading-dimension byte offset (LBO) `>> 4`                  |
//! | 32–45 | stride-dimension byte offset (SBO) `>> 4`                   |
//! | 46–48 | fixed constant `0b001`                                      |
//! | 49–51 | base offset (0 when the swizzle pattern is 1024-B aligned)  |
//! | 52    | LBO mode: 0 relative (1 absolute exists on sm_103a only)    |
//! | 61–63 | swizzle mode ([`SmemSwizzle`])                              |
//!
//! Bits 14–15, 30–31 and 53–60 are zero. This is *not* Hopper's wgmma encoding, which keeps the
//! swizzle in bits 62–63 with different codes.
//!
//! Two descriptors are used by the NVFP4 kernel, both hardware-proven by the seed:
//! - [`SmemDescriptor::operand_k_major_sw128`] for the A and B tiles written by TMA with a 128-byte
//!   swizzle: SBO 1024 (eight 128-byte rows form one swizzle atom), LBO 0;
//! - [`SmemDescriptor::scale_factors`] for a 512-byte scale block read by `tcgen05.cp`: no swizzle,
//!   SBO 128 (eight 16-byte rows per core matrix), LBO 0.

/// Mask applied to a shared-memory byte address before it is shifted into a 14-bit field: the
/// descriptor addresses 256 KiB of the `shared::cta` window in 16-byte units.
///
/// Source: PTX §9.7.16.4.1.
pub const DESC_ADDRESS_MASK: u32 = 0x3_FFFF;

/// Byte distance between consecutive 8-row groups of a K-major, 128-byte-swizzled operand: eight
/// rows of 128 bytes. Source: PTX §9.7.16.3.2, docs/sm100.md §2.
pub const OPERAND_SBO_BYTES: u32 = 8 * 128;

/// Byte distance between consecutive 8-row core matrices of a 512-byte scale block (8 rows of
/// 16 bytes). Source: docs/sm100.md §2.
pub const SCALE_SBO_BYTES: u32 = 8 * 16;

/// The LBO the seed encodes for both descriptors. PTX §9.7.16.3.1.1 says the field is "not used,
/// assumed 1" for K-major swizzled layouts and CUTLASS writes 1 (16 bytes); the seed writes 0 and
/// ran on B200, so 0 is what this module encodes. Use [`LBO_ASSUMED_ONE_BYTES`] to try CUTLASS's
/// value.
pub const SEED_LBO_BYTES: u32 = 0;

/// The LBO CUTLASS writes (field value 1, i.e. 16 bytes): the alternative to [`SEED_LBO_BYTES`]
/// described in docs/sm100.md §2 ⚠. Not used by the seed's constructors.
pub const LBO_ASSUMED_ONE_BYTES: u32 = 16;

/// Bytes along K covered by one `kind::mxf4nvf4` MMA (K = 64 FP4 values, two per byte). Advancing
/// an operand descriptor by this many bytes selects the next K=64 slice inside the swizzle atom.
/// Source: docs/sm100.md §5 "+32 bytes per MMA".
pub const OPERAND_K_STEP_BYTES: u32 = 32;

/// Bytes of one 128-row x 4-column scale block, the unit of one `tcgen05.cp.32x128b.warpx4`.
/// Advancing a scale descriptor by this many bytes selects the next K=64 step's scales.
/// Source: docs/sm100.md §4.
pub const SCALE_K_STEP_BYTES: u32 = crate::scale_layout::BLOCK_BYTES;

/// Swizzle mode of a tcgen05 shared-memory descriptor, bits 61–63 (PTX §9.7.16.4.1 Table 40).
///
/// The codes differ from both Hopper's wgmma descriptor and the TMA tensor-map enum; a tile
/// written by TMA with `CU_TENSOR_MAP_SWIZZLE_128B` is read with [`SmemSwizzle::B128`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SmemSwizzle {
    /// No swizzle: core matrices are 8 rows x 16 bytes, contiguous.
    None = 0,
    /// 128-byte swizzle with a 32-byte atomic unit (sm_100a `SWIZZLE_128B_BASE32B`).
    B128Base32 = 1,
    /// 128-byte swizzle: 16-byte chunk `c` of row `r` lands at `c ^ (r % 8)` (TMA `SWIZZLE_128B`).
    B128 = 2,
    /// 64-byte swizzle.
    B64 = 4,
    /// 32-byte swizzle.
    B32 = 6,
}

impl SmemSwizzle {
    /// Decodes the 3-bit field; `None` (the `Option`) for the reserved codes 3, 5 and 7.
    pub const fn from_bits(bits: u8) -> Option<Self> {
        match bits {
            0 => Some(Self::None),
            1 => Some(Self::B128Base32),
            2 => Some(Self::B128),
            4 => Some(Self::B64),
            6 => Some(Self::B32),
            _ => None,
        }
    }
}

/// How the LBO field is interpreted, bit 52 (PTX §9.7.16.4.1 Table 40).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum LboMode {
    /// LBO is a byte offset relative to the start address; the only mode on sm_100a.
    Relative = 0,
    /// LBO is an absolute address; sm_103a only.
    Absolute = 1,
}

/// The named fields of a [`SmemDescriptor`], in bytes where the hardware stores `bytes >> 4`.
///
/// Build one, then call [`SmemDescriptorFields::encode`]. Byte quantities are masked with
/// [`DESC_ADDRESS_MASK`] and truncated to 16-byte units exactly like the seed's `desc_encode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SmemDescriptorFields {
    /// Start of the tile in the `shared::cta` window, bytes; bits 0–13 hold `(addr & 0x3FFFF) >> 4`.
    pub start_address: u32,
    /// Leading-dimension byte offset (LBO), bits 16–29 as `>> 4`.
    pub leading_byte_offset: u32,
    /// Stride-dimension byte offset (SBO), bits 32–45 as `>> 4`.
    pub stride_byte_offset: u32,
    /// Base offset, bits 49–51 (3 bits): 0 when the swizzle pattern starts 1024-byte aligned,
    /// otherwise `(pattern_start >> 7) & 7`.
    pub base_offset: u8,
    /// LBO interpretation, bit 52.
    pub lbo_mode: LboMode,
    /// Swizzle mode, bits 61–63.
    pub swizzle: SmemSwizzle,
}

/// The fixed `0b001` in bits 46–48 that every sm_100 descriptor carries (CUTLASS `version_ = 1`).
const FIXED_BITS_46: u64 = 1 << 46;

const START_SHIFT: u32 = 0;
const LBO_SHIFT: u32 = 16;
const SBO_SHIFT: u32 = 32;
const BASE_OFFSET_SHIFT: u32 = 49;
const LBO_MODE_SHIFT: u32 = 52;
const SWIZZLE_SHIFT: u32 = 61;
const FIELD14: u64 = 0x3FFF;

/// Encodes a byte quantity into a 14-bit descriptor field: the seed's `desc_encode`.
const fn encode14(bytes: u32) -> u64 {
    ((bytes & DESC_ADDRESS_MASK) >> 4) as u64
}

impl SmemDescriptorFields {
    /// Packs the fields into the 64-bit layout of PTX §9.7.16.4.1 Table 40.
    pub const fn encode(self) -> SmemDescriptor {
        SmemDescriptor(
            (encode14(self.start_address) << START_SHIFT)
                | (encode14(self.leading_byte_offset) << LBO_SHIFT)
                | (encode14(self.stride_byte_offset) << SBO_SHIFT)
                | FIXED_BITS_46
                | (((self.base_offset & 0x7) as u64) << BASE_OFFSET_SHIFT)
                | ((self.lbo_mode as u64) << LBO_MODE_SHIFT)
                | ((self.swizzle as u64) << SWIZZLE_SHIFT),
        )
    }
}

/// A tcgen05 shared-memory matrix descriptor (64 bits; layout in the module docs).
///
/// The raw bits leave this type only through [`SmemDescriptor::to_bits`], which the PTX wrapper
/// feeds to `tcgen05.mma` / `tcgen05.cp` as the `a-desc` / `b-desc` / `s-desc` operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct SmemDescriptor(u64);

impl SmemDescriptor {
    /// Descriptor of a K-major operand tile written by TMA with the 128-byte swizzle, as the seed
    /// builds it: SBO 1024, LBO 0, base offset 0, swizzle [`SmemSwizzle::B128`]. Equals
    /// `(addr >> 4) | 0x4000_4040_0000_0000` for `addr < 256 KiB`.
    ///
    /// `addr` must be the tile start plus a multiple of [`OPERAND_K_STEP_BYTES`] inside the first
    /// 128 bytes, with the tile 1024-byte aligned, so that base offset 0 is right (docs/sm100.md §5).
    /// Source: docs/sm100.md §2 "Operands".
    pub const fn operand_k_major_sw128(addr: u32) -> Self {
        SmemDescriptorFields {
            start_address: addr,
            leading_byte_offset: SEED_LBO_BYTES,
            stride_byte_offset: OPERAND_SBO_BYTES,
            base_offset: 0,
            lbo_mode: LboMode::Relative,
            swizzle: SmemSwizzle::B128,
        }
        .encode()
    }

    /// Descriptor of a 512-byte scale block (32 rows of 16 bytes, no swizzle) read by
    /// `tcgen05.cp.cta_group::1.32x128b.warpx4`: SBO 128, LBO 0. Equals
    /// `(addr >> 4) | 0x0000_4008_0000_0000`. LBO is irrelevant because a row is one 16-byte
    /// column. Source: docs/sm100.md §2 "Scales".
    pub const fn scale_factors(addr: u32) -> Self {
        SmemDescriptorFields {
            start_address: addr,
            leading_byte_offset: SEED_LBO_BYTES,
            stride_byte_offset: SCALE_SBO_BYTES,
            base_offset: 0,
            lbo_mode: LboMode::Relative,
            swizzle: SmemSwizzle::None,
        }
        .encode()
    }

    /// The same descriptor with its start address moved by `bytes` (a multiple of 16), every
    /// other field unchanged; the address wraps inside the 14-bit field instead of carrying into
    /// bit 14. The MMA loop uses it to step K ([`OPERAND_K_STEP_BYTES`] per K=64 slice) and the
    /// scale copy to step blocks ([`SCALE_K_STEP_BYTES`]). The seed adds `bytes >> 4` to the whole
    /// 64-bit value, which is the same while the address stays below 256 KiB.
    pub const fn advance_bytes(self, bytes: u32) -> Self {
        let start = (self.0 & FIELD14).wrapping_add((bytes >> 4) as u64) & FIELD14;
        Self((self.0 & !FIELD14) | start)
    }

    /// The raw 64-bit value, for the PTX operand.
    pub const fn to_bits(self) -> u64 {
        self.0
    }

    /// Reinterprets raw bits (for example a value read back from a kernel dump) as a descriptor.
    pub const fn from_bits(bits: u64) -> Self {
        Self(bits)
    }

    /// Start address in bytes (the 16-byte-unit field times 16).
    pub const fn start_address(self) -> u32 {
        (((self.0 >> START_SHIFT) & FIELD14) as u32) << 4
    }

    /// Leading-dimension byte offset in bytes.
    pub const fn leading_byte_offset(self) -> u32 {
        (((self.0 >> LBO_SHIFT) & FIELD14) as u32) << 4
    }

    /// Stride-dimension byte offset in bytes.
    pub const fn stride_byte_offset(self) -> u32 {
        (((self.0 >> SBO_SHIFT) & FIELD14) as u32) << 4
    }

    /// Base offset field, bits 49–51.
    pub const fn base_offset(self) -> u8 {
        ((self.0 >> BASE_OFFSET_SHIFT) & 0x7) as u8
    }

    /// Swizzle field, bits 61–63; `None` for a reserved code.
    pub const fn swizzle(self) -> Option<SmemSwizzle> {
        SmemSwizzle::from_bits(((self.0 >> SWIZZLE_SHIFT) & 0x7) as u8)
    }

    /// Decodes every field; `None` when the swizzle code is reserved or the fixed bits 46–48 are
    /// not `0b001`.
    pub const fn fields(self) -> Option<SmemDescriptorFields> {
        if (self.0 >> 46) & 0x7 != 1 {
            return None;
        }
        let swizzle = match self.swizzle() {
            Some(s) => s,
            None => return None,
        };
        let lbo_mode = if (self.0 >> LBO_MODE_SHIFT) & 1 == 1 { LboMode::Absolute } else { LboMode::Relative };
        Some(SmemDescriptorFields {
            start_address: self.start_address(),
            leading_byte_offset: self.leading_byte_offset(),
            stride_byte_offset: self.stride_byte_offset(),
            base_offset: self.base_offset(),
            lbo_mode,
            swizzle,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seed's operand descriptor written out: `desc_encode(addr) | desc_encode(1024) << 32 |
    /// 1 << 46 | 2 << 61`.
    const SEED_OPERAND_HIGH_BITS: u64 = 0x4000_4040_0000_0000;
    /// The seed's scale descriptor written out: `desc_encode(addr) | desc_encode(128) << 32 |
    /// 1 << 46`.
    const SEED_SCALE_HIGH_BITS: u64 = 0x0000_4008_0000_0000;

    fn seed_desc_encode(x: u64) -> u64 {
        (x & 0x3_FFFF) >> 4
    }

    #[test]
    fn high_bits_are_the_seed_expression() {
        assert_eq!(seed_desc_encode(1024) << 32 | 1 << 46 | 2 << 61, SEED_OPERAND_HIGH_BITS);
        assert_eq!(seed_desc_encode(128) << 32 | 1 << 46, SEED_SCALE_HIGH_BITS);
    }

    /// Every operand address the seed can form: stage bases of both tile widths, each k step.
    #[test]
    fn operand_descriptor_matches_seed_for_every_stage_and_k_step() {
        // (stage bytes, stages, B offset inside a stage): BLOCK_N=128 x 6 and BLOCK_N=256 x 4.
        for (stage_bytes, stages, b_off) in [(36864u32, 6u32, 16384u32), (55296, 4, 16384)] {
            // The dynamic smem base is 1024-aligned; try a few plausible placements.
            for smem_base in [0u32, 1024, 2048, 0x4000] {
                for s in 0..stages {
                    let stage_base = smem_base + s * stage_bytes;
                    for tile in [stage_base, stage_base + b_off] {
                        let first = SmemDescriptor::operand_k_major_sw128(tile);
                        for k in 0..4u32 {
                            let addr = tile + k * 32;
                            let want = (addr as u64 >> 4) | SEED_OPERAND_HIGH_BITS;
                            let built = SmemDescriptor::operand_k_major_sw128(addr);
                            assert_eq!(built.to_bits(), want, "addr {addr:#x}");
                            let stepped = first.advance_bytes(k * OPERAND_K_STEP_BYTES);
                            assert_eq!(stepped, built, "addr {addr:#x} via advance");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn k_step_adds_two_address_units() {
        let d = SmemDescriptor::operand_k_major_sw128(0x400);
        assert_eq!(d.advance_bytes(OPERAND_K_STEP_BYTES).to_bits() - d.to_bits(), 2);
        assert_eq!(OPERAND_K_STEP_BYTES, 64 / 2);
    }

    /// The seed builds `make_desc_SF(0)` once and adds `(stage_base + SF_off) >> 4` and then
    /// `k * (512 >> 4)`; both routes must agree with the direct constructor.
    #[test]
    fn scale_descriptor_matches_seed_construction() {
        let seed_sf_zero = seed_desc_encode(0) | seed_desc_encode(128) << 32 | 1 << 46;
        assert_eq!(SmemDescriptor::scale_factors(0).to_bits(), seed_sf_zero);
        // SFA/SFB offsets inside a stage: BLOCK_N=128 (32768, 34816), BLOCK_N=256 (49152, 51200).
        for (stage_bytes, stages, sf_offs) in [(36864u32, 6u32, [32768u32, 34816]), (55296, 4, [49152, 51200])] {
            for s in 0..stages {
                for off in sf_offs {
                    let addr = 1024 + s * stage_bytes + off;
                    let seed = seed_sf_zero + (addr as u64 >> 4);
                    let base = SmemDescriptor::scale_factors(addr);
                    assert_eq!(base.to_bits(), seed);
                    assert_eq!(base.to_bits(), (addr as u64 >> 4) | SEED_SCALE_HIGH_BITS);
                    for k in 0..4u32 {
                        assert_eq!(base.advance_bytes(k * SCALE_K_STEP_BYTES).to_bits(), seed + k as u64 * (512 >> 4));
                    }
                }
            }
        }
    }

    #[test]
    fn fields_round_trip() {
        let f = SmemDescriptorFields {
            start_address: 0x3_FFF0,
            leading_byte_offset: LBO_ASSUMED_ONE_BYTES,
            stride_byte_offset: OPERAND_SBO_BYTES,
            base_offset: 5,
            lbo_mode: LboMode::Relative,
            swizzle: SmemSwizzle::B64,
        };
        assert_eq!(f.encode().fields(), Some(f));
        let seed = SmemDescriptor::operand_k_major_sw128(0x1_2340);
        assert_eq!(seed.start_address(), 0x1_2340);
        assert_eq!(seed.leading_byte_offset(), 0);
        assert_eq!(seed.stride_byte_offset(), 1024);
        assert_eq!(seed.base_offset(), 0);
        assert_eq!(seed.swizzle(), Some(SmemSwizzle::B128));
        assert_eq!(SmemDescriptor::from_bits(0).fields(), None);
    }

    #[test]
    fn cutlass_lbo_sets_field_one() {
        let f = SmemDescriptorFields {
            start_address: 0,
            leading_byte_offset: LBO_ASSUMED_ONE_BYTES,
            stride_byte_offset: OPERAND_SBO_BYTES,
            base_offset: 0,
            lbo_mode: LboMode::Relative,
            swizzle: SmemSwizzle::B128,
        };
        assert_eq!(f.encode().to_bits(), SEED_OPERAND_HIGH_BITS | 1 << 16);
    }

    #[test]
    fn address_is_masked_to_256_kib_and_advance_wraps_in_field() {
        // desc_encode masks with 0x3FFFF: an address in the next 256 KiB encodes the same.
        assert_eq!(SmemDescriptor::operand_k_major_sw128(0x4_0400), SmemDescriptor::operand_k_major_sw128(0x400));
        let top = SmemDescriptor::scale_factors(0x3_FFF0);
        assert_eq!(top.advance_bytes(16).start_address(), 0);
        assert_eq!(top.advance_bytes(16).stride_byte_offset(), SCALE_SBO_BYTES);
    }
}
