//! The wgmma shared-memory matrix descriptor of the token operand, as a typed value.

/// Swizzle mode of a wgmma descriptor, bits 62–63 (PTX ISA §9.7.15.5.1.2.2). Not the tcgen05
/// codes (`crate::sm100::SmemSwizzle`) nor the tensor-map enum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum WgmmaSwizzle {
    /// Core matrices stored densely.
    None = 0,
    /// 128-byte swizzle (16-byte chunk `c` of row `r` at `c ^ (r % 8)`; TMA `SWIZZLE_128B`).
    B128 = 1,
    /// 64-byte swizzle.
    B64 = 2,
    /// 32-byte swizzle.
    B32 = 3,
}

/// Mask of the shared-memory byte address a wgmma descriptor encodes (18 bits, 16-byte units).
pub const WGMMA_ADDRESS_MASK: u32 = 0x3_FFFF;

/// Byte distance between 8-row groups of a K-major, 128-byte-swizzled tile: eight 128-byte rows.
pub const WGMMA_SBO_BYTES: u32 = 8 * 128;

/// The LBO written for K-major swizzled tiles: the PTX ISA says the field is unused there
/// ("assumed 1"); 16 bytes (field value 1) by convention.
pub const WGMMA_LBO_BYTES: u32 = 16;

/// The named fields of a [`WgmmaDesc`], in bytes where the hardware stores `bytes >> 4`.
///
/// | bits  | field                                                  |
/// |-------|--------------------------------------------------------|
/// | 0–13  | start address, `(addr & 0x3FFFF) >> 4`                 |
/// | 16–29 | leading byte offset (LBO) `>> 4`                       |
/// | 32–45 | stride byte offset (SBO) `>> 4`                        |
/// | 49–51 | base offset (0: swizzle patterns start 1024-aligned)   |
/// | 62–63 | swizzle ([`WgmmaSwizzle`])                             |
///
/// All other bits are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WgmmaDescFields {
    /// Start of the tile in the `shared::cta` window, bytes.
    pub start_address: u32,
    /// Leading-dimension byte offset (LBO).
    pub leading_byte_offset: u32,
    /// Stride-dimension byte offset (SBO).
    pub stride_byte_offset: u32,
    /// Base offset, 3 bits.
    pub base_offset: u8,
    /// Swizzle mode.
    pub swizzle: WgmmaSwizzle,
}

const fn field14(bytes: u32) -> u64 {
    ((bytes & WGMMA_ADDRESS_MASK) >> 4) as u64 & 0x3FFF
}

impl WgmmaDescFields {
    /// Packs the fields into the 64-bit layout of the table above.
    pub const fn encode(self) -> WgmmaDesc {
        WgmmaDesc(
            field14(self.start_address)
                | (field14(self.leading_byte_offset) << 16)
                | (field14(self.stride_byte_offset) << 32)
                | (((self.base_offset & 0x7) as u64) << 49)
                | ((self.swizzle as u64) << 62),
        )
    }
}

/// A wgmma shared-memory matrix descriptor (64 bits; fields in [`WgmmaDescFields`]).
/// The raw bits leave this type only through [`WgmmaDesc::to_bits`], the PTX operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(transparent)]
pub struct WgmmaDesc(u64);

impl WgmmaDesc {
    /// K-major, 128-byte swizzle, 8-row groups [`WGMMA_SBO_BYTES`] apart: a tile of 128-byte rows
    /// (64 f16 of K) starting at the 1024-aligned shared address `start` (the f16 token chunks).
    pub const fn k_major_sw128(start: u32) -> Self {
        WgmmaDescFields {
            start_address: start,
            leading_byte_offset: WGMMA_LBO_BYTES,
            stride_byte_offset: WGMMA_SBO_BYTES,
            base_offset: 0,
            swizzle: WgmmaSwizzle::B128,
        }
        .encode()
    }

    /// The same tile advanced by `bytes` along K inside the swizzle atom (k-step `j` of 16 f16 is
    /// [`TOKEN_K_STEP_BYTES`](super::TOKEN_K_STEP_BYTES)`·j` bytes): the start-address field moves,
    /// the swizzle follows the absolute address bits.
    ///
    /// Only the low word changes (the start address is bits 0–13 and stays below 2¹⁴ units of
    /// 16 bytes inside shared memory), so the sum is computed in 32 bits: the kernel then adds one
    /// 32-bit register per MMA and keeps the constant high word, instead of a 64-bit add.
    pub const fn advance(self, bytes: u32) -> Self {
        let low = (self.0 as u32).wrapping_add(bytes >> 4);
        WgmmaDesc((self.0 & !0xFFFF_FFFF) | low as u64)
    }

    /// The 64-bit operand of `wgmma.mma_async`.
    pub const fn to_bits(self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use crate::launch::MAX_DYNAMIC_SMEM;
    use crate::sm90::*;

    #[test]
    fn descriptor_fields() {
        // Start 0x400 → 0x40; LBO 16 → 1 at bit 16; SBO 1024 → 64 at bit 32; 128B swizzle → 1 at bit 62.
        let d = WgmmaDesc::k_major_sw128(0x400);
        assert_eq!(d.to_bits(), 0x40 | (1 << 16) | (64u64 << 32) | (1u64 << 62));
        assert_eq!(d.advance(TOKEN_K_STEP_BYTES).to_bits(), d.to_bits() + 2);
        // The largest start address a kernel uses stays in the low word.
        let last = WgmmaDesc::k_major_sw128(MAX_DYNAMIC_SMEM - 1024);
        assert_eq!(last.advance(3 * TOKEN_K_STEP_BYTES).to_bits(), last.to_bits() + 6);
        // Each field lands in its bits and nowhere else.
        let zero = WgmmaDescFields {
            start_address: 0,
            leading_byte_offset: 0,
            stride_byte_offset: 0,
            base_offset: 0,
            swizzle: WgmmaSwizzle::None,
        };
        assert_eq!(zero.encode().to_bits(), 0);
        assert_eq!(WgmmaDescFields { start_address: 0x3FFF0, ..zero }.encode().to_bits(), 0x3FFF);
        assert_eq!(WgmmaDescFields { start_address: 0x40000, ..zero }.encode().to_bits(), 0, "18-bit address");
        assert_eq!(WgmmaDescFields { leading_byte_offset: 0x3FFF0, ..zero }.encode().to_bits(), 0x3FFF << 16);
        assert_eq!(WgmmaDescFields { stride_byte_offset: 0x3FFF0, ..zero }.encode().to_bits(), 0x3FFFu64 << 32);
        assert_eq!(WgmmaDescFields { base_offset: 0xFF, ..zero }.encode().to_bits(), 7u64 << 49);
        for (sw, code) in [(WgmmaSwizzle::B128, 1u64), (WgmmaSwizzle::B64, 2), (WgmmaSwizzle::B32, 3)] {
            assert_eq!(WgmmaDescFields { swizzle: sw, ..zero }.encode().to_bits(), code << 62);
        }
    }
}
