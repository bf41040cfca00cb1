//! Block-scale layouts: the plain `[rows, K/16]` row-major layout and the 128x4 blocked
//! ("reordered") layout that tcgen05 block-scaled MMA, cuBLAS and this library's device kernels
//! consume. The offset formula itself lives in [`nvfp4_gemm_abi::scale_layout`] and is only called
//! here:
//!
//! `offset(i, j) = ((i/128)*rest_k + j/4)*512 + (i%32)*16 + ((i%128)/32)*4 + j%4`
//!
//! with `rest_k = ceil(K/16/4)`; rows are padded to a multiple of 128 and scale columns to a
//! multiple of 4, with zero bytes.
//!
//! # The competition generator's "reordered" tensor
//!
//! The competition's `create_reordered_scale_factor_tensor` writes
//! `reordered[mm32, mm4, mm, kk4, kk] = sf[i, j]` (mm = i/128, mm32 = i%32, mm4 = (i%128)/32,
//! kk = j/4, kk4 = j%4) into a tensor of LOGICAL shape `[32, 4, rest_m, 4, rest_k]` (plus a trailing
//! batch dimension `l = 1`). Read in that logical C-contiguous order
//! ([`competition_logical_index`]), the bytes are NOT in the formula's order as soon as
//! `rest_m > 1` or `rest_k > 1`. But that tensor is not contiguous: the generator allocates it
//! contiguous with shape `[l, rest_m, rest_k, 32, 4, 4]` and then `permute(3, 4, 1, 5, 2, 0)`s it to
//! the logical shape, so its element strides are `[16, 4, rest_k*512, 1, 512]` (plus
//! `rest_m*rest_k*512` for `l`), see [`competition_storage_strides`]. Its underlying storage, which
//! is what `data_ptr()` hands to a kernel, is therefore exactly the formula's byte order. This
//! module's tests simulate both the strided write and the reference's cuBLAS `to_blocked`
//! (view / permute / reshape / transpose) and check that both produce [`plain_to_blocked`]'s bytes,
//! and that the logical order differs. Consequences: pass the permuted tensor's storage as is;
//! calling `.contiguous()` or `.reshape(-1)` on it would copy it into the logical order, which is
//! wrong for the kernels. Also note that the generator fills that storage with random 1.0 / 2.0
//! scales before writing the real ones, so its padding rows are not zero (harmless: padded rows
//! and columns only ever meet padded, unwritten outputs), whereas `to_blocked` and this crate pad
//! with zeros.

use nvfp4_gemm_abi::scale_layout;

use crate::error::FormatError;

/// Values of K covered by one e4m3 scale.
pub const SCALE_VEC: usize = scale_layout::SCALE_VEC as usize;
/// Rows per 128x4 scale block.
pub const BLOCK_ROWS: usize = scale_layout::BLOCK_ROWS as usize;
/// Scale columns per 128x4 scale block.
pub const BLOCK_COLS: usize = scale_layout::BLOCK_COLS as usize;
/// Bytes per 128x4 scale block.
pub const BLOCK_BYTES: usize = scale_layout::BLOCK_BYTES as usize;

/// Checks that `k` is a positive multiple of `multiple` and that `rows`, `k` fit the 32-bit layout
/// arithmetic; returns them as `u32`.
pub(crate) fn check_shape(rows: usize, k: usize, multiple: usize) -> Result<(u32, u32), FormatError> {
    if k == 0 || k % multiple != 0 {
        return Err(FormatError::BadK { k, multiple });
    }
    let rows32 = u32::try_from(rows).map_err(|_| FormatError::TooLarge { what: "rows", value: rows })?;
    let k32 = u32::try_from(k).map_err(|_| FormatError::TooLarge { what: "K", value: k })?;
    // The padded row count and the element count must fit too.
    if rows32.checked_next_multiple_of(scale_layout::BLOCK_ROWS).is_none() || rows.checked_mul(k).is_none() {
        return Err(FormatError::TooLarge { what: "rows", value: rows });
    }
    Ok((rows32, k32))
}

/// Scale columns of a row of `k` values: `k / 16`.
pub const fn scale_cols(k: usize) -> usize {
    k / SCALE_VEC
}

/// Length of the plain `[rows, K/16]` scale buffer.
pub fn plain_len(rows: usize, k: usize) -> Result<usize, FormatError> {
    check_shape(rows, k, SCALE_VEC)?;
    Ok(rows * scale_cols(k))
}

/// Length of the 128x4 blocked scale buffer, padding included: `ceil(rows/128) * ceil(K/64) * 512`.
pub fn blocked_len(rows: usize, k: usize) -> Result<usize, FormatError> {
    let (r, k) = check_shape(rows, k, SCALE_VEC)?;
    Ok(scale_layout::blocked_bytes(r, k))
}

/// Byte offset in the blocked layout of the scale of row `i`, scale column `j`, for a matrix with
/// `k` values per row (calls [`scale_layout::blocked_offset`]). No bounds checks.
#[inline]
pub fn blocked_offset(i: usize, j: usize, k: usize) -> usize {
    scale_layout::blocked_offset(i as u32, j as u32, scale_layout::rest_k(k as u32))
}

/// Converts plain `[rows, K/16]` scales to the 128x4 blocked layout (zero padding).
pub fn plain_to_blocked(plain: &[u8], rows: usize, k: usize) -> Result<Vec<u8>, FormatError> {
    let expected = plain_len(rows, k)?;
    if plain.len() != expected {
        return Err(FormatError::BadLength { what: "plain scales", expected, actual: plain.len() });
    }
    let mut blocked = vec![0u8; blocked_len(rows, k)?];
    let cols = scale_cols(k);
    let rk = scale_layout::rest_k(k as u32);
    for (i, row) in plain.chunks_exact(cols.max(1)).enumerate() {
        for (j, &s) in row.iter().enumerate() {
            blocked[scale_layout::blocked_offset(i as u32, j as u32, rk)] = s;
        }
    }
    Ok(blocked)
}

/// Converts 128x4 blocked scales back to the plain `[rows, K/16]` layout (padding dropped).
pub fn blocked_to_plain(blocked: &[u8], rows: usize, k: usize) -> Result<Vec<u8>, FormatError> {
    let expected = blocked_len(rows, k)?;
    if blocked.len() != expected {
        return Err(FormatError::BadLength { what: "blocked scales", expected, actual: blocked.len() });
    }
    let cols = scale_cols(k);
    let rk = scale_layout::rest_k(k as u32);
    let mut plain = Vec::with_capacity(rows * cols);
    for i in 0..rows {
        for j in 0..cols {
            plain.push(blocked[scale_layout::blocked_offset(i as u32, j as u32, rk)]);
        }
    }
    Ok(plain)
}

/// Index, in LOGICAL C-contiguous order, of the scale of row `i`, column `j` in the competition
/// generator's tensor of logical shape `[32, 4, rest_m, 4, rest_k]`. This is not where the byte
/// lives in memory (see the module docs and [`competition_storage_strides`]).
pub const fn competition_logical_index(i: usize, j: usize, rest_m: usize, rest_k: usize) -> usize {
    let (mm, mm32, mm4) = (i / 128, i % 32, (i % 128) / 32);
    let (kk, kk4) = (j / 4, j % 4);
    (((mm32 * 4 + mm4) * rest_m + mm) * 4 + kk4) * rest_k + kk
}

/// Element strides of the competition generator's reordered tensor in its logical dimension
/// order `[32, 4, rest_m, 4, rest_k]` (batch `l = 1` dropped): it is allocated contiguous as
/// `[l, rest_m, rest_k, 32, 4, 4]` and permuted by `(3, 4, 1, 5, 2, 0)`. The storage offset of a
/// logical index is the dot product with these strides, which equals the blocked formula.
pub const fn competition_storage_strides(rest_m: usize, rest_k: usize) -> [usize; 5] {
    let _ = rest_m;
    [16, 4, rest_k * BLOCK_BYTES, 1, BLOCK_BYTES]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Plain scales with a distinct, recognisable value per (row, column): never zero, so padding
    /// is distinguishable.
    fn distinct_plain(rows: usize, cols: usize) -> Vec<u8> {
        (0..rows * cols).map(|x| (x % 251) as u8 + 1).collect()
    }

    /// The formula, written out independently of the abi crate.
    fn formula(i: usize, j: usize, rest_k: usize) -> usize {
        ((i / 128) * rest_k + j / 4) * 512 + (i % 32) * 16 + ((i % 128) / 32) * 4 + j % 4
    }

    const SHAPES: [(usize, usize); 9] =
        [(1, 16), (1, 64), (4, 48), (40, 256), (72, 512), (128, 64), (129, 80), (256, 256), (300, 7168)];

    #[test]
    fn plain_to_blocked_follows_the_formula_and_pads_with_zero() {
        for (rows, k) in SHAPES {
            let cols = k / 16;
            let plain = distinct_plain(rows, cols);
            let blocked = plain_to_blocked(&plain, rows, k).unwrap();
            let rest_k = cols.div_ceil(4);
            assert_eq!(blocked.len(), rows.div_ceil(128) * rest_k * 512);
            let mut expected = vec![0u8; blocked.len()];
            for i in 0..rows {
                for j in 0..cols {
                    expected[formula(i, j, rest_k)] = plain[i * cols + j];
                    assert_eq!(blocked_offset(i, j, k), formula(i, j, rest_k));
                }
            }
            assert_eq!(blocked, expected, "rows {rows} k {k}");
            assert_eq!(blocked_to_plain(&blocked, rows, k).unwrap(), plain);
        }
    }

    #[test]
    fn shapes_are_checked() {
        assert_eq!(plain_to_blocked(&[], 1, 8), Err(FormatError::BadK { k: 8, multiple: 16 }));
        assert_eq!(plain_to_blocked(&[], 0, 0), Err(FormatError::BadK { k: 0, multiple: 16 }));
        assert!(matches!(plain_to_blocked(&[1, 2], 1, 16), Err(FormatError::BadLength { expected: 1, actual: 2, .. })));
        assert!(matches!(blocked_to_plain(&[0; 511], 1, 16), Err(FormatError::BadLength { expected: 512, .. })));
        assert!(matches!(blocked_len(usize::MAX, 16), Err(FormatError::TooLarge { .. })));
        assert_eq!(plain_to_blocked(&[], 0, 64).unwrap(), Vec::<u8>::new());
    }

    /// A strided view over a flat buffer, as torch represents a permuted tensor.
    fn storage_offset(index: &[usize], strides: &[usize]) -> usize {
        index.iter().zip(strides).map(|(i, s)| i * s).sum()
    }

    /// Simulates the competition generator: write `sf[i, j]` at logical index
    /// `[mm32, mm4, mm, kk4, kk]` of the permuted tensor, i.e. at the storage offset given by the
    /// permuted strides. Padding keeps its prior value (`fill`).
    fn competition_storage(plain: &[u8], rows: usize, k: usize, fill: u8) -> Vec<u8> {
        let cols = k / 16;
        let (rest_m, rest_k) = (rows.div_ceil(128), cols.div_ceil(4));
        let mut storage = vec![fill; rest_m * rest_k * 512];
        let strides = competition_storage_strides(rest_m, rest_k);
        for i in 0..rows {
            for j in 0..cols {
                let logical = [i % 32, (i % 128) / 32, i / 128, j % 4, j / 4];
                storage[storage_offset(&logical, &strides)] = plain[i * cols + j];
            }
        }
        storage
    }

    #[test]
    fn competition_storage_order_is_the_formula() {
        for (rows, k) in SHAPES {
            let plain = distinct_plain(rows, k / 16);
            let ours = plain_to_blocked(&plain, rows, k).unwrap();
            assert_eq!(competition_storage(&plain, rows, k, 0), ours, "rows {rows} k {k}");
        }
    }

    #[test]
    fn permuted_strides_are_those_of_the_contiguous_allocation() {
        // Allocation shape [rest_m, rest_k, 32, 4, 4] (l = 1), contiguous strides, then
        // permute(3, 4, 1, 5, 2) (the batch dimension dropped).
        let (rest_m, rest_k) = (3, 5);
        let alloc_shape = [rest_m, rest_k, 32, 4, 4];
        let mut alloc_strides = [0usize; 5];
        let mut s = 1;
        for d in (0..5).rev() {
            alloc_strides[d] = s;
            s *= alloc_shape[d];
        }
        let perm = [2, 3, 0, 4, 1]; // (3, 4, 1, 5, 2) minus the leading batch dimension
        let permuted: Vec<usize> = perm.iter().map(|&d| alloc_strides[d]).collect();
        assert_eq!(permuted, competition_storage_strides(rest_m, rest_k));
    }

    #[test]
    fn logical_order_differs_from_the_formula_once_there_are_several_blocks() {
        // One 128x4 block: the two orders coincide.
        let plain = distinct_plain(128, 4);
        let logical = |rows: usize, k: usize, plain: &[u8]| {
            let cols = k / 16;
            let (rm, rk) = (rows.div_ceil(128), cols.div_ceil(4));
            let mut out = vec![0u8; rm * rk * 512];
            for i in 0..rows {
                for j in 0..cols {
                    out[competition_logical_index(i, j, rm, rk)] = plain[i * cols + j];
                }
            }
            out
        };
        assert_eq!(logical(128, 64, &plain), plain_to_blocked(&plain, 128, 64).unwrap());
        // Two row blocks or two column blocks: they differ.
        for (rows, k) in [(256, 64), (128, 128), (200, 512)] {
            let plain = distinct_plain(rows, k / 16);
            assert_ne!(logical(rows, k, &plain), plain_to_blocked(&plain, rows, k).unwrap(), "rows {rows} k {k}");
        }
    }

    /// Simulates the reference kernel's `to_blocked` (pad, `view(rb, 128, cb, 4)`,
    /// `permute(0, 2, 1, 3)`, `reshape(-1, 4, 32, 4)`, `transpose(1, 2)`, `reshape(-1, 32, 16)`,
    /// `flatten()`): enumerate the final tensor in C order and fetch each element's source.
    fn torch_to_blocked(plain: &[u8], rows: usize, cols: usize) -> Vec<u8> {
        let (rb, cb) = (rows.div_ceil(128), cols.div_ceil(4));
        let padded = |r: usize, c: usize| {
            if r < rows && c < cols {
                plain[r * cols + c]
            } else {
                0
            }
        };
        let mut out = Vec::with_capacity(rb * cb * 512);
        // Final shape [rb*cb, 32, 16]; element [b, r32, x] with x = r4*4 + c came from the
        // transposed [b, r32, r4, c], i.e. from [b, r4, r32, c] before the transpose, i.e. from the
        // permuted [b / cb, b % cb, r4*32 + r32, c], i.e. padded[(b / cb)*128 + r4*32 + r32,
        // (b % cb)*4 + c].
        for b in 0..rb * cb {
            for r32 in 0..32 {
                for x in 0..16 {
                    let (r4, c) = (x / 4, x % 4);
                    out.push(padded((b / cb) * 128 + r4 * 32 + r32, (b % cb) * 4 + c));
                }
            }
        }
        out
    }

    #[test]
    fn cublas_to_blocked_is_the_formula() {
        for (rows, k) in SHAPES {
            let plain = distinct_plain(rows, k / 16);
            assert_eq!(
                torch_to_blocked(&plain, rows, k / 16),
                plain_to_blocked(&plain, rows, k).unwrap(),
                "rows {rows} k {k}"
            );
        }
    }
}
