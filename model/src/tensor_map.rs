//! The model's tensor maps: a 128-byte encoding of a tiled tensor description, what the TMA reads.
//!
//! There is no CUDA driver in the model, so `cuTensorMapEncodeTiled`'s opaque `CUtensorMap` cannot
//! be interpreted. The host side, when it runs kernels in the model, calls [`encode_tiled`] with
//! the same arguments instead; the kernel passes the 128 bytes by pointer exactly as it passes a
//! driver map. The encoder applies the driver's documented validity rules (CUDA Driver API,
//! `cuTensorMapEncodeTiled`) and rejects what the model does not implement (interleaved layouts,
//! element strides other than 1, NaN out-of-bounds fill, a swizzled box row narrower than its
//! swizzle span).
//!
//! Layout of the 128 bytes (little endian): `0..4` magic `"NVMT"`, `4` version 1, `5` element
//! type, `6` rank, `7` swizzle, `16..24` global address, `24..64` five dimensions (u64, innermost
//! first), `64..96` four byte strides of dimensions 1..5 (u64), `96..106` five box extents (u16),
//! the rest zero.

/// Element types (the subset of `CUtensorMapDataType` the model implements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElementType {
    /// `UINT8`.
    U8,
    /// `UINT16`.
    U16,
    /// `FLOAT16`.
    F16,
    /// `BFLOAT16`.
    Bf16,
    /// `UINT32`.
    U32,
    /// `FLOAT32`.
    F32,
    /// `16U4_ALIGN8B`: 4-bit elements packed two per byte (element `2i` in the low nibble), 16 per
    /// 8 bytes, copied as is into shared memory without padding (PTX ISA 9.0 §5.5.1.1.1, `.b4x16`).
    /// Dimensions and coordinates count 4-bit elements.
    U4x16Align8,
}

impl ElementType {
    /// Bits per element.
    pub const fn bits(self) -> u32 {
        match self {
            ElementType::U4x16Align8 => 4,
            ElementType::U8 => 8,
            ElementType::U16 | ElementType::F16 | ElementType::Bf16 => 16,
            ElementType::U32 | ElementType::F32 => 32,
        }
    }

    fn code(self) -> u8 {
        match self {
            ElementType::U8 => 0,
            ElementType::U16 => 1,
            ElementType::U32 => 2,
            ElementType::F16 => 6,
            ElementType::F32 => 7,
            ElementType::Bf16 => 9,
            ElementType::U4x16Align8 => 13,
        }
    }

    fn from_code(c: u8) -> Option<Self> {
        Some(match c {
            0 => ElementType::U8,
            1 => ElementType::U16,
            2 => ElementType::U32,
            6 => ElementType::F16,
            7 => ElementType::F32,
            9 => ElementType::Bf16,
            13 => ElementType::U4x16Align8,
            _ => return None,
        })
    }
}

/// Shared-memory swizzle of a tensor copy (PTX ISA 9.0 §5.5.7, 16-byte atomicity).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swizzle {
    /// Dense rows.
    None,
    /// 32-byte span: address bit 4 ^= bit 7.
    B32,
    /// 64-byte span: bits 4–5 ^= bits 7–8.
    B64,
    /// 128-byte span: bits 4–6 ^= bits 7–9.
    B128,
}

impl Swizzle {
    /// Span in bytes (0 for none).
    pub const fn span(self) -> u32 {
        match self {
            Swizzle::None => 0,
            Swizzle::B32 => 32,
            Swizzle::B64 => 64,
            Swizzle::B128 => 128,
        }
    }

    /// The alignment at which the pattern starts (PTX ISA 9.0 §5.5.7: 256, 512, 1024 bytes).
    pub const fn repeat(self) -> u32 {
        self.span() * 8
    }

    /// Where the 16-byte unit holding the byte at shared address `addr` lands: the ISA tables of
    /// §5.5.7 written as address bits, the 16-byte chunk index (bits 4..) XOR the 128-byte row
    /// index (bits 7..), over `log2(span / 16)` bits. This is CuTe's `Swizzle<B, 4, 3>`, which
    /// PTX ISA 9.0 §9.7.15.5.1.2 / §9.7.16.3.3 name for the same modes of the MMA operand layouts.
    pub const fn apply(self, addr: u32) -> u32 {
        let mask = match self {
            Swizzle::None => 0,
            Swizzle::B32 => 1,
            Swizzle::B64 => 3,
            Swizzle::B128 => 7,
        };
        addr ^ (((addr >> 7) & mask) << 4)
    }

    fn code(self) -> u8 {
        match self {
            Swizzle::None => 0,
            Swizzle::B32 => 1,
            Swizzle::B64 => 2,
            Swizzle::B128 => 3,
        }
    }
}

/// `CUtensorMapInterleave`: only `NONE` is modelled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interleave {
    /// No interleave.
    None,
    /// 16-byte interleave (rejected by the encoder: not modelled).
    B16,
    /// 32-byte interleave (rejected by the encoder: not modelled).
    B32,
}

/// `CUtensorMapFloatOOBfill`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OobFill {
    /// `NONE`: out-of-bounds elements are zero.
    Zero,
    /// `NAN_REQUEST_ZERO_FMA` (rejected by the encoder: not modelled).
    Nan,
}

/// A decoded tensor map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TensorMapDesc {
    /// Element type.
    pub element: ElementType,
    /// Number of dimensions, 1..=5.
    pub rank: usize,
    /// Global address of element 0.
    pub base: u64,
    /// Extents, innermost first (elements).
    pub dims: [u64; 5],
    /// Byte strides of dimensions 1..rank (`strides[k]` is the stride of dimension `k`; `strides[0]`
    /// is unused).
    pub strides: [u64; 5],
    /// Box extents (elements).
    pub box_dims: [u32; 5],
    /// Swizzle.
    pub swizzle: Swizzle,
}

impl TensorMapDesc {
    /// Bytes of one box row (dimension 0) in shared memory.
    pub fn box_row_bytes(&self) -> u32 {
        self.box_dims[0] * self.element.bits() / 8
    }

    /// Bytes of one box (what a copy credits to its mbarrier, out-of-bounds parts included).
    pub fn box_bytes(&self) -> u32 {
        self.box_dims[1..self.rank].iter().product::<u32>() * self.box_row_bytes()
    }
}

const MAGIC: &[u8; 4] = b"NVMT";

/// Encodes a tiled tensor map; the arguments are `cuTensorMapEncodeTiled`'s (`global_strides` has
/// `rank - 1` entries: the byte strides of dimensions 1..rank). Returns why it is invalid or not
/// modelled.
#[allow(clippy::too_many_arguments)]
pub fn encode_tiled(
    element: ElementType,
    rank: usize,
    global_address: u64,
    global_dims: &[u64],
    global_strides: &[u64],
    box_dims: &[u32],
    element_strides: &[u32],
    interleave: Interleave,
    swizzle: Swizzle,
    oob_fill: OobFill,
) -> Result<[u8; 128], String> {
    if !(1..=5).contains(&rank) {
        return Err(format!("rank {rank} outside 1..=5"));
    }
    if global_dims.len() != rank
        || global_strides.len() != rank - 1
        || box_dims.len() != rank
        || element_strides.len() != rank
    {
        return Err("array lengths do not match the rank (strides: rank - 1)".into());
    }
    if interleave != Interleave::None {
        return Err("interleaved layouts are not modelled".into());
    }
    if oob_fill != OobFill::Zero {
        return Err("NaN out-of-bounds fill is not modelled".into());
    }
    if element_strides.iter().any(|&e| e != 1) {
        return Err(format!("element strides {element_strides:?}: only 1 is modelled"));
    }
    if global_address % 16 != 0 {
        return Err(format!("global address {global_address:#x} is not 16-byte aligned"));
    }
    for (i, &d) in global_dims.iter().enumerate() {
        if d == 0 || d > 1 << 32 {
            return Err(format!("globalDim[{i}] = {d} outside 1..=2^32"));
        }
    }
    if element == ElementType::U4x16Align8 && global_dims[0] % 2 != 0 {
        return Err("16U4_ALIGN8B needs an even globalDim[0]".into());
    }
    for (i, &s) in global_strides.iter().enumerate() {
        if s % 16 != 0 || s >= 1 << 40 {
            return Err(format!("globalStrides[{i}] = {s}: must be a multiple of 16 below 2^40"));
        }
    }
    for (i, &b) in box_dims.iter().enumerate() {
        if b == 0 || b > 256 {
            return Err(format!("boxDim[{i}] = {b} outside 1..=256"));
        }
    }
    let row_bits = box_dims[0] as u64 * element.bits() as u64;
    if row_bits % 128 != 0 {
        return Err(format!("boxDim[0] * element size = {} bits is not a multiple of 16 bytes", row_bits));
    }
    let row = (row_bits / 8) as u32;
    if swizzle != Swizzle::None {
        if row > swizzle.span() {
            return Err(format!("a box row of {row} bytes exceeds the {}-byte swizzle span", swizzle.span()));
        }
        if row != swizzle.span() {
            return Err(format!(
                "a box row of {row} bytes narrower than the {}-byte swizzle span is not modelled",
                swizzle.span()
            ));
        }
    }
    let mut m = [0u8; 128];
    m[0..4].copy_from_slice(MAGIC);
    m[4] = 1;
    m[5] = element.code();
    m[6] = rank as u8;
    m[7] = swizzle.code();
    m[16..24].copy_from_slice(&global_address.to_le_bytes());
    for i in 0..rank {
        m[24 + 8 * i..32 + 8 * i].copy_from_slice(&global_dims[i].to_le_bytes());
        m[96 + 2 * i..98 + 2 * i].copy_from_slice(&(box_dims[i] as u16).to_le_bytes());
    }
    for (i, s) in global_strides.iter().enumerate() {
        m[64 + 8 * i..72 + 8 * i].copy_from_slice(&s.to_le_bytes());
    }
    Ok(m)
}

/// Replaces the global address of an encoded map, as `cuTensorMapReplaceAddress` does (the
/// rest of the map unchanged). Returns why it cannot: not a map of this model, or an address not
/// 16-byte aligned.
pub fn replace_address(m: &mut [u8; 128], global_address: u64) -> Result<(), String> {
    if &m[0..4] != MAGIC || m[4] != 1 {
        return Err("not a tensor map encoded by this model".into());
    }
    if global_address % 16 != 0 {
        return Err(format!("global address {global_address:#x} is not 16-byte aligned"));
    }
    m[16..24].copy_from_slice(&global_address.to_le_bytes());
    Ok(())
}

/// Decodes a map written by [`encode_tiled`].
pub fn decode(m: &[u8; 128]) -> Result<TensorMapDesc, String> {
    if &m[0..4] != MAGIC || m[4] != 1 {
        return Err("not a tensor map encoded by nvfp4_gemm_model::tensor_map::encode_tiled (a CUDA driver map \
                    cannot be interpreted by the model)"
            .into());
    }
    let element = ElementType::from_code(m[5]).ok_or("unknown element type code")?;
    let rank = m[6] as usize;
    let swizzle = match m[7] {
        0 => Swizzle::None,
        1 => Swizzle::B32,
        2 => Swizzle::B64,
        3 => Swizzle::B128,
        _ => return Err("unknown swizzle code".into()),
    };
    let u64_at = |o: usize| u64::from_le_bytes(m[o..o + 8].try_into().expect("8 bytes"));
    let mut dims = [1u64; 5];
    let mut strides = [0u64; 5];
    let mut box_dims = [1u32; 5];
    for i in 0..rank {
        dims[i] = u64_at(24 + 8 * i);
        box_dims[i] = u16::from_le_bytes([m[96 + 2 * i], m[97 + 2 * i]]) as u32;
        if i > 0 {
            strides[i] = u64_at(64 + 8 * (i - 1));
        }
    }
    Ok(TensorMapDesc { element, rank, base: u64_at(16), dims, strides, box_dims, swizzle })
}

/// The box at `coords` as it lands in shared memory at address `dst` (already swizzled; byte `i`
/// of the result goes to `dst + i`). Out-of-bounds elements are zero (PTX ISA 9.0 §5.5.3.3).
///
/// # Safety
/// Every in-bounds element of the described tensor must be readable host memory.
pub unsafe fn gather_box(d: &TensorMapDesc, coords: &[i32], dst: u32) -> Result<Vec<u8>, String> {
    if coords.len() != d.rank {
        return Err(format!("{} coordinates for a rank-{} map", coords.len(), d.rank));
    }
    let four_bit = d.element == ElementType::U4x16Align8;
    if four_bit && coords[0] % 2 != 0 {
        return Err(format!("odd innermost coordinate {} of a 4-bit map is not modelled", coords[0]));
    }
    let row = d.box_row_bytes() as usize;
    let total = d.box_bytes() as usize;
    let mut linear = vec![0u8; total];
    let rows = total / row;
    let esize_bits = d.element.bits() as u64;
    for r in 0..rows {
        // Box coordinates of this row, dimensions 1..rank.
        let mut rem = r as u32;
        let mut row_addr = d.base as i128;
        let mut inside = true;
        #[allow(clippy::needless_range_loop)]
        for k in 1..d.rank {
            let i = rem % d.box_dims[k];
            rem /= d.box_dims[k];
            let g = coords[k] as i64 + i as i64;
            if g < 0 || g as u64 >= d.dims[k] {
                inside = false;
                break;
            }
            row_addr += g as i128 * d.strides[k] as i128;
        }
        if !inside {
            continue;
        }
        let out = &mut linear[r * row..(r + 1) * row];
        if four_bit {
            for (b, o) in out.iter_mut().enumerate() {
                let g = coords[0] as i64 + 2 * b as i64;
                if g >= 0 && (g as u64) < d.dims[0] {
                    *o = std::ptr::read((row_addr + (g / 2) as i128) as usize as *const u8);
                }
            }
        } else {
            let es = (esize_bits / 8) as usize;
            for e in 0..d.box_dims[0] as usize {
                let g = coords[0] as i64 + e as i64;
                if g >= 0 && (g as u64) < d.dims[0] {
                    let src = (row_addr + g as i128 * es as i128) as usize as *const u8;
                    std::ptr::copy_nonoverlapping(src, out[e * es..].as_mut_ptr(), es);
                }
            }
        }
    }
    if d.swizzle == Swizzle::None {
        return Ok(linear);
    }
    let rep = d.swizzle.repeat();
    if dst % rep != 0 {
        return Err(format!(
            "a {:?}-swizzled box at {dst:#x}: destinations not aligned to the {rep}-byte pattern repeat are not modelled",
            d.swizzle
        ));
    }
    let mut img = vec![0u8; total];
    for chunk in 0..total / 16 {
        let logical = dst + 16 * chunk as u32;
        let phys = (d.swizzle.apply(logical) - dst) as usize;
        img[phys..phys + 16].copy_from_slice(&linear[16 * chunk..16 * chunk + 16]);
    }
    Ok(img)
}
