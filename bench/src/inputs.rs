//! The inputs: random operands (the checked set from `nvfp4_format`, the extra timed sets and the
//! tensor-rate GEMM's data from fast parallel generators), their upload, and one library call on
//! an uploaded set.

use crate::measure::{drv, Result};
use cudarc::driver::{CudaSlice, CudaStream};
use half::{bf16, f16};
use nvfp4_format::{Group, GroupShape, SplitMix64};
use nvfp4_gemm::problem::BufferSizes;
use nvfp4_gemm::{GemmPlan, GroupArgs, Nvfp4Operand, Output, Problem, StackedArgs};
use rayon::prelude::*;
use std::sync::Arc;

/// One group's operands on the device.
struct DeviceGroup {
    a_values: CudaSlice<u8>,
    a_scales: CudaSlice<u8>,
    b_values: CudaSlice<u8>,
    b_scales: CudaSlice<u8>,
}

/// One input set on the device with its own C buffers.
pub(crate) struct DeviceSet {
    groups: Vec<DeviceGroup>,
    /// C per group (16 elements for an empty group).
    pub(crate) c: Vec<CudaSlice<f16>>,
    alphas: Vec<f32>,
}

/// Copies `bytes` to the device (an empty slice gets a 16-byte placeholder).
fn upload(stream: &Arc<CudaStream>, bytes: &[u8]) -> Result<CudaSlice<u8>> {
    if bytes.is_empty() {
        return stream.alloc_zeros::<u8>(16).map_err(drv("allocating"));
    }
    stream.clone_htod(bytes).map_err(drv("uploading inputs"))
}

/// Host bytes of one operand: packed values and blocked scales.
pub(crate) struct HostOperand {
    pub(crate) values: Vec<u8>,
    pub(crate) scales: Vec<u8>,
}

/// Fills `len` bytes from 8-byte words of a seeded generator, in parallel (each 64 KiB chunk its
/// own stream), mapping each word with `word`.
fn parallel_bytes(len: usize, seed: u64, word: fn(u64) -> [u8; 8]) -> Vec<u8> {
    const CHUNK: usize = 1 << 16;
    let mut out = vec![0u8; len];
    out.par_chunks_mut(CHUNK).enumerate().for_each(|(i, chunk)| {
        let mut rng = SplitMix64::new(seed ^ (i as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        for bytes in chunk.chunks_mut(8) {
            let w = word(rng.next_u64());
            bytes.copy_from_slice(&w[..bytes.len()]);
        }
    });
    out
}

/// `count` random bf16 values with magnitudes in [0.5, 2) and random signs (never zero: a GEMM on
/// zeros runs faster than on real data).
pub(crate) fn random_bf16(count: usize, seed: u64) -> Vec<bf16> {
    let bytes = parallel_bytes(2 * count, seed, |x| {
        let mut w = [0u8; 8];
        for (i, pair) in w.chunks_exact_mut(2).enumerate() {
            let r = (x >> (16 * i)) as u16;
            // Sign (bit 15) and mantissa (bits 0..7) random; exponent 126 or 127 from bit 7.
            let bits = (r & 0x807F) | if r >> 7 & 1 == 1 { 0x3F80 } else { 0x3F00 };
            pair.copy_from_slice(&bits.to_le_bytes());
        }
        w
    });
    bytes.chunks_exact(2).map(|b| bf16::from_bits(u16::from_le_bytes([b[0], b[1]]))).collect()
}

/// A random operand in the competition's distribution, fast: value codes in {0..3, 8..11} (each
/// byte masked with 0b1011_1011) and every scale byte, padding included (as the competition's
/// generator leaves it), 1.0 or 2.0. Used for the extra input sets, which are timed, not checked.
pub(crate) fn fast_operand(rows: usize, k: usize, seed: u64) -> Result<HostOperand> {
    let scales_len = nvfp4_format::layout::blocked_len(rows, k).map_err(|e| e.to_string())?;
    Ok(HostOperand {
        values: parallel_bytes(rows * k / 2, seed, |x| (x & 0xBBBB_BBBB_BBBB_BBBB).to_le_bytes()),
        scales: parallel_bytes(scales_len, seed ^ 0x5CA1E, |x| {
            std::array::from_fn(|i| if x >> i & 1 == 1 { 0x40 } else { 0x38 })
        }),
    })
}

/// The operands of `groups` (input set 0, the checked one) as host bytes.
pub(crate) fn operands_of(groups: &[Group]) -> Vec<(HostOperand, HostOperand)> {
    groups
        .iter()
        .map(|g| {
            let op = |m: &nvfp4_format::Nvfp4Matrix| HostOperand {
                values: m.values().to_vec(),
                scales: m.scales().to_vec(),
            };
            (op(&g.a), op(&g.b))
        })
        .collect()
}

/// Operands for an extra input set ([`fast_operand`]), group `g`'s A and B from seeds
/// `seed + 2g` and `seed + 2g + 1`.
pub(crate) fn fast_operands(shapes: &[GroupShape], seed: u64) -> Result<Vec<(HostOperand, HostOperand)>> {
    shapes
        .iter()
        .enumerate()
        .map(|(g, sh)| {
            Ok((fast_operand(sh.m, sh.k, seed + 2 * g as u64)?, fast_operand(sh.n, sh.k, seed + 2 * g as u64 + 1)?))
        })
        .collect()
}

/// Uploads one input set's operands (`groups` gives the shapes and alphas) and allocates its C.
pub(crate) fn device_set(
    stream: &Arc<CudaStream>,
    operands: &[(HostOperand, HostOperand)],
    groups: &[Group],
) -> Result<DeviceSet> {
    let mut set = DeviceSet { groups: vec![], c: vec![], alphas: vec![] };
    for ((a, b), g) in operands.iter().zip(groups) {
        set.groups.push(DeviceGroup {
            a_values: upload(stream, &a.values)?,
            a_scales: upload(stream, &a.scales)?,
            b_values: upload(stream, &b.values)?,
            b_scales: upload(stream, &b.scales)?,
        });
        let len = if g.m() == 0 { 16 } else { g.m() * g.n() };
        set.c.push(stream.alloc_zeros::<f16>(len).map_err(drv("allocating C"))?);
        set.alphas.push(g.effective_alpha_f32());
    }
    Ok(set)
}

/// One library call on `set` (fp16 output).
pub(crate) fn run_set(plan: &mut GemmPlan, stream: &Arc<CudaStream>, set: &mut DeviceSet) -> Result<()> {
    let mut args: Vec<GroupArgs> = set
        .groups
        .iter()
        .zip(set.c.iter_mut())
        .zip(&set.alphas)
        .map(|((d, c), &alpha)| GroupArgs {
            a: Nvfp4Operand { values: &d.a_values, scales: &d.a_scales }.into(),
            b: Nvfp4Operand { values: &d.b_values, scales: &d.b_scales },
            c: Output::F16(c),
            alpha,
        })
        .collect();
    plan.run(stream, &mut args).map_err(|e| format!("plan.run: {e}"))
}

/// An input set's operands and C as stacked buffers ([`nvfp4_gemm::StackedArgs`]: one
/// allocation per operand, the groups' parts back to back).
pub(crate) struct StackedSet {
    a_values: CudaSlice<u8>,
    a_scales: CudaSlice<u8>,
    b_values: CudaSlice<u8>,
    b_scales: CudaSlice<u8>,
    pub(crate) c: CudaSlice<f16>,
    alphas: Vec<f32>,
    /// The parts' total sizes (the allocations hold at least 16 bytes each).
    pub(crate) total: BufferSizes,
}

/// `set`'s operands copied on the device into stacked buffers laid out by
/// [`nvfp4_gemm::Problem::stacked_offsets`] (C zeroed).
pub(crate) fn stacked_set(stream: &Arc<CudaStream>, set: &DeviceSet, problem: &Problem) -> Result<StackedSet> {
    let at = problem.stacked_offsets();
    let total = at[problem.groups().len()];
    let alloc = |len: usize| stream.alloc_zeros::<u8>(len.max(16)).map_err(drv("allocating stacked buffers"));
    let mut out = StackedSet {
        a_values: alloc(total.a_values)?,
        a_scales: alloc(total.a_scales)?,
        b_values: alloc(total.b_values)?,
        b_scales: alloc(total.b_scales)?,
        c: stream.alloc_zeros::<f16>(total.c_elements.max(16)).map_err(drv("allocating stacked C"))?,
        alphas: set.alphas.clone(),
        total,
    };
    for (g, d) in set.groups.iter().enumerate() {
        let parts = [
            (&d.a_values, &mut out.a_values, at[g].a_values, at[g + 1].a_values),
            (&d.a_scales, &mut out.a_scales, at[g].a_scales, at[g + 1].a_scales),
            (&d.b_values, &mut out.b_values, at[g].b_values, at[g + 1].b_values),
            (&d.b_scales, &mut out.b_scales, at[g].b_scales, at[g + 1].b_scales),
        ];
        for (src, dst, from, to) in parts {
            if to > from {
                let mut view = dst.slice_mut(from..to);
                stream.memcpy_dtod(&src.slice(..to - from), &mut view).map_err(drv("copying into stacked buffers"))?;
            }
        }
    }
    Ok(out)
}

/// Every set of `sets` copied into stacked buffers ([`stacked_set`]), each checked: one
/// [`GemmPlan::run_stacked`] call on the copy writes C bit for bit as one [`GemmPlan::run`] call
/// on the set (the two calls' tables differ, so each call uploads its own). Each set is dropped
/// once copied and checked: at most one more set than `sets.len()` is alive.
pub(crate) fn stacked_sets(
    plan: &mut GemmPlan,
    stream: &Arc<CudaStream>,
    sets: Vec<DeviceSet>,
) -> Result<Vec<StackedSet>> {
    let mut out = Vec::with_capacity(sets.len());
    for (i, mut set) in sets.into_iter().enumerate() {
        run_set(plan, stream, &mut set)?;
        let mut stacked = stacked_set(stream, &set, plan.problem())?;
        run_stacked_set(plan, stream, &mut stacked)?;
        let got = stream.clone_dtoh(&stacked.c).map_err(drv("downloading stacked C"))?;
        let mut want = Vec::with_capacity(stacked.total.c_elements);
        for (c, s) in set.c.iter().zip(plan.problem().groups()) {
            want.extend(stream.clone_dtoh(c).map_err(drv("downloading C"))?[..s.m * s.n].iter().map(|x| x.to_bits()));
        }
        if got[..want.len()].iter().map(|x| x.to_bits()).ne(want.iter().copied()) {
            return Err(format!("run_stacked wrote other values than run on the same inputs (set {i})"));
        }
        out.push(stacked);
    }
    Ok(out)
}

/// One library call on `set` through [`GemmPlan::run_stacked`] (fp16 output).
pub(crate) fn run_stacked_set(plan: &mut GemmPlan, stream: &Arc<CudaStream>, set: &mut StackedSet) -> Result<()> {
    let total = set.total;
    let (av, a_s) = (set.a_values.slice(..total.a_values), set.a_scales.slice(..total.a_scales));
    let (bv, bs) = (set.b_values.slice(..total.b_values), set.b_scales.slice(..total.b_scales));
    let mut c = set.c.slice_mut(..total.c_elements);
    let mut args = StackedArgs {
        a: Nvfp4Operand { values: &av, scales: &a_s }.into(),
        b: Nvfp4Operand { values: &bv, scales: &bs },
        c: Output::F16(&mut c),
        alphas: &set.alphas,
    };
    plan.run_stacked(stream, &mut args).map_err(|e| format!("plan.run_stacked: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parallel_bytes_fills_any_length_deterministically() {
        for len in [0, 1, 7, 8, 9, (1 << 16) + 3, 3 << 16] {
            let a = parallel_bytes(len, 5, |x| x.to_le_bytes());
            assert_eq!(a.len(), len);
            assert_eq!(a, parallel_bytes(len, 5, |x| x.to_le_bytes()));
        }
        let a = parallel_bytes(1 << 18, 5, |x| x.to_le_bytes());
        let b = parallel_bytes(1 << 18, 6, |x| x.to_le_bytes());
        assert_ne!(a, b);
        // Chunks are independent streams, not copies of one another.
        assert_ne!(a[..1 << 16], a[1 << 16..2 << 16]);
    }

    #[test]
    fn random_bf16_values_are_nonzero_and_bounded() {
        let v = random_bf16(100_003, 1);
        assert_eq!(v.len(), 100_003);
        assert!(v.iter().all(|x| (0.5..2.0).contains(&x.to_f32().abs())));
        let negative = v.iter().filter(|x| x.to_f32() < 0.0).count();
        assert!((40_000..60_000).contains(&negative), "{negative}");
        assert!(v.iter().any(|x| x.to_f32().abs() < 1.0) && v.iter().any(|x| x.to_f32().abs() >= 1.0));
    }

    #[test]
    fn fast_operands_follow_the_competition_distribution() {
        let op = fast_operand(200, 512, 9).unwrap();
        assert_eq!(op.values.len(), 200 * 256);
        assert_eq!(op.scales.len(), nvfp4_format::layout::blocked_len(200, 512).unwrap());
        let mut codes = [0usize; 16];
        for b in &op.values {
            codes[(b & 0xF) as usize] += 1;
            codes[(b >> 4) as usize] += 1;
        }
        for (code, &n) in codes.iter().enumerate() {
            assert_eq!(n > 0, [0, 1, 2, 3, 8, 9, 10, 11].contains(&code), "code {code}: {n}");
        }
        let ones = op.scales.iter().filter(|&&s| s == 0x38).count();
        assert_eq!(ones + op.scales.iter().filter(|&&s| s == 0x40).count(), op.scales.len());
        assert!((ones as f64 / op.scales.len() as f64 - 0.5).abs() < 0.05);
        // A matrix built from them is valid for the reference.
        let m = nvfp4_format::Nvfp4Matrix::new(200, 512, op.values, op.scales, 1.0).unwrap();
        assert!(m.dequantize().iter().all(|x| x.abs() <= 3.0));
    }
}
