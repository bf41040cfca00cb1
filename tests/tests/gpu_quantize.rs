//! The device NVFP4 quantizer and dequantizer (`nvfp4_gemm::quantize::Quantizer`) against the CPU
//! ones in `nvfp4_format`, bit for bit: random shapes (rows 1..600, any; K 64..8192), both input
//! types, special values (zeros, signed zeros, subnormals, the largest finite values, NaN, ±inf),
//! global scales from tiny (every block saturates) to huge (every block scale is zero). Every
//! output is poisoned before each of two runs (two different poison bytes, so an unwritten byte
//! cannot pass by luck) and sits between guard bytes that must stay untouched. Also: the GEMM
//! on GPU-quantized activations equals the GEMM on CPU-quantized ones, bit for bit.
//! The MoE block's kernels the same way: routing and combine (`moe_block_route`), gather and
//! activation (`moe_block_tokens`).
//! Ignored unless asked for: they need a Hopper or Blackwell GPU (the GEMM check an sm_90a one).

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr, ValidAsZeroBits};
use half::{bf16, f16};
use nvfp4_format::codec::{f64_to_bf16, f64_to_f16};
use nvfp4_format::{global_scale_for_amax, quantize_with_global_scale, Nvfp4Matrix, SplitMix64};
use nvfp4_gemm::quantize::{DenseFloat, Nvfp4OperandMut, Nvfp4Sizes, Quantizer};
use nvfp4_gemm::{Arch, Error, Nvfp4Operand};
use nvfp4_gemm_tests::{gpu_or_skip, require_any_gpu};
use std::sync::Arc;

#[path = "gpu_quantize/moe_block_route.rs"]
mod moe_block_route;
#[path = "gpu_quantize/moe_block_tokens.rs"]
mod moe_block_tokens;

/// Guard bytes before and after every output (a multiple of 16, so the output stays aligned).
const GUARD: usize = 256;
const GUARD_BYTE: u8 = 0xE7;
/// The two poisons written over the outputs before the two runs.
const POISONS: [u8; 2] = [0xA5, 0x5A];

/// A device buffer of `len` elements between `GUARD`-byte guards, filled with `fill` (the guards
/// with `GUARD_BYTE`).
struct Guarded<T> {
    buf: CudaSlice<T>,
    len: usize,
    guard: usize,
}

impl<T: DeviceRepr + ValidAsZeroBits + Copy + Default> Guarded<T> {
    fn new(stream: &Arc<CudaStream>, len: usize) -> Self {
        let guard = GUARD / std::mem::size_of::<T>();
        Guarded { buf: stream.alloc_zeros::<T>(len + 2 * guard).unwrap(), len, guard }
    }

    fn fill(&mut self, stream: &Arc<CudaStream>, guard: T, body: T) {
        let mut host = vec![guard; self.len + 2 * self.guard];
        host[self.guard..self.guard + self.len].fill(body);
        stream.memcpy_htod(&host, &mut self.buf).unwrap();
    }

    /// The body, and the number of guard elements that changed.
    fn read(&self, stream: &Arc<CudaStream>, guard: T) -> (Vec<T>, usize)
    where
        T: PartialEq,
    {
        let host = stream.clone_dtoh(&self.buf).unwrap();
        let (g, n) = (self.guard, self.len);
        let bad = host[..g].iter().chain(&host[g + n..]).filter(|&&x| x != guard).count();
        (host[g..g + n].to_vec(), bad)
    }
}

/// Random 16-bit float bit patterns: Gaussian values with per-row magnitudes spread over many
/// octaves, exact e2m1 grid points (ties), whole zero blocks and, with `specials`, subnormals,
/// the largest finite values, NaN and infinities.
fn random_bits(rng: &mut SplitMix64, rows: usize, k: usize, bf16: bool, specials: bool) -> Vec<u16> {
    let to_bits = |v: f64| if bf16 { f64_to_bf16(v).to_bits() } else { f64_to_f16(v).to_bits() };
    let (inf, max, sub_max) = if bf16 { (0x7F80u16, 0x7F7Fu16, 0x007Fu16) } else { (0x7C00, 0x7BFF, 0x03FF) };
    let span = if bf16 { 60 } else { 24 };
    let mut out = Vec::with_capacity(rows * k);
    for _ in 0..rows {
        let row_exp = rng.below(span) as i32 - span as i32 / 2;
        for _ in 0..k / 16 {
            let kind = rng.below(if specials { 12 } else { 8 });
            for _ in 0..16 {
                let sign = if rng.below(2) == 0 { 0 } else { 0x8000u16 };
                let b = match kind {
                    0 => sign, // a zero block (signed zeros)
                    1 => {
                        let v = nvfp4_format::codec::E2M1_VALUES[rng.below(16) as usize] as f64;
                        to_bits(v * 2f64.powi(row_exp.clamp(-12, 12)))
                    }
                    8 => sign | (rng.below(u64::from(sub_max) + 1) as u16), // subnormals
                    9 => sign | if rng.below(4) == 0 { max } else { max - rng.below(64) as u16 },
                    10 => match rng.below(24) {
                        0 => (inf + 1 + rng.below(0x3F) as u16) | sign, // NaN
                        1 => inf | sign,
                        _ => to_bits(rng.normal()),
                    },
                    11 => rng.next_u64() as u16, // any pattern, NaNs included
                    _ => to_bits(rng.normal() * 2f64.powi(row_exp + rng.below(5) as i32 - 2)),
                };
                out.push(b);
            }
        }
    }
    out
}

fn finite_amax(bits: &[u16], bf16: bool) -> f32 {
    let v = |b: u16| if bf16 { bf16::from_bits(b).to_f32() } else { f16::from_bits(b).to_f32() };
    bits.iter().map(|&b| v(b)).filter(|x| x.is_finite()).fold(0.0f32, |m, x| m.max(x.abs()))
}

fn cpu_quantize(bits: &[u16], rows: usize, k: usize, g: f32, bf16: bool) -> Nvfp4Matrix {
    if bf16 {
        let x: Vec<half::bf16> = bits.iter().map(|&b| half::bf16::from_bits(b)).collect();
        quantize_with_global_scale(&x, rows, k, g).unwrap()
    } else {
        let x: Vec<f16> = bits.iter().map(|&b| f16::from_bits(b)).collect();
        quantize_with_global_scale(&x, rows, k, g).unwrap()
    }
}

/// Quantizes on the GPU twice (outputs poisoned differently each time) and compares both with the
/// CPU quantizer; returns a description of the first difference.
fn check_quantize<T: DenseFloat + ToBits + ValidAsZeroBits + Default>(
    q: &Quantizer,
    stream: &Arc<CudaStream>,
    bits: &[u16],
    rows: usize,
    k: usize,
    g: f32,
) -> Result<(), String> {
    let want = cpu_quantize(bits, rows, k, g, T::BF16);
    let input: Vec<T> = bits.iter().map(|&b| T::from_bits_(b)).collect();
    let dev_in = stream.clone_htod(&input).unwrap();
    let sizes = Nvfp4Sizes::of(rows, k).unwrap();
    let mut values = Guarded::<u8>::new(stream, sizes.values);
    let mut scales = Guarded::<u8>::new(stream, sizes.scales);
    for poison in POISONS {
        values.fill(stream, GUARD_BYTE, poison);
        scales.fill(stream, GUARD_BYTE, poison);
        {
            let (vg, sg) = (values.guard, scales.guard);
            let mut v = values.buf.slice_mut(vg..vg + sizes.values);
            let mut s = scales.buf.slice_mut(sg..sg + sizes.scales);
            q.quantize::<T>(stream, &dev_in, rows, k, g, Nvfp4OperandMut { values: &mut v, scales: &mut s })
                .map_err(|e| e.to_string())?;
        }
        stream.synchronize().unwrap();
        let (got_v, bad_v) = values.read(stream, GUARD_BYTE);
        let (got_s, bad_s) = scales.read(stream, GUARD_BYTE);
        if bad_v + bad_s > 0 {
            return Err(format!("guards changed: {bad_v} around the values, {bad_s} around the scales"));
        }
        if let Some(i) = got_v.iter().zip(want.values()).position(|(a, b)| a != b) {
            let (row, col) = (i / (k / 2), 2 * (i % (k / 2)));
            return Err(format!(
                "poison {poison:#x}: value byte {i} (row {row}, cols {col}..{}) is {:#04x}, CPU {:#04x}; inputs {:04x?}",
                col + 2,
                got_v[i],
                want.values()[i],
                &bits[row * k + col / 16 * 16..row * k + col / 16 * 16 + 16]
            ));
        }
        if let Some(i) = got_s.iter().zip(want.scales()).position(|(a, b)| a != b) {
            return Err(format!(
                "poison {poison:#x}: blocked scale byte {i} is {:#04x}, CPU {:#04x}",
                got_s[i],
                want.scales()[i]
            ));
        }
    }
    Ok(())
}

fn run_quantize_cases(test: &str, cases: &[(usize, usize, bool, bool, u32)], seed: u64) {
    let gpu = require_any_gpu();
    let stream = gpu.context().default_stream();
    let q = Quantizer::new(&gpu).unwrap();
    let mut rng = SplitMix64::new(seed);
    let mut failures = vec![];
    for (i, &(rows, k, bf16, specials, g_kind)) in cases.iter().enumerate() {
        let bits = random_bits(&mut rng, rows, k, bf16, specials);
        let amax_g = global_scale_for_amax(finite_amax(&bits, bf16));
        let g = match g_kind {
            0 => amax_g,
            1 => 1.0,
            2 => amax_g * 2f32.powi(rng.below(24) as i32 - 12),
            3 => f32::from_bits(1 + rng.below(64) as u32), // subnormal: scales saturate
            _ => 1e30,                                     // every block scale rounds to zero
        };
        let r = if bf16 {
            check_quantize::<bf16>(&q, &stream, &bits, rows, k, g)
        } else {
            check_quantize::<f16>(&q, &stream, &bits, rows, k, g)
        };
        let line = format!(
            "CASE {test}[{i}] rows={rows} k={k} {} specials={specials} g={g:e}: {}",
            if bf16 { "bf16" } else { "f16" },
            r.as_ref().map_or_else(|e| format!("FAILED {e}"), |_| "ok".into())
        );
        println!("{line}");
        if r.is_err() {
            failures.push(line);
        }
    }
    assert!(failures.is_empty(), "{} failing cases:\n{}", failures.len(), failures.join("\n"));
}

/// 120 random shapes: rows 1..=600 (mostly not multiples of 128), K a multiple of 64 up to 8192,
/// both input types, global scales from the tensor's amax (and scaled by up to 2^±12).
#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_quantize_random_shapes_match_cpu() {
    let mut rng = SplitMix64::new(0x0007_1234);
    let cases: Vec<_> = (0..120)
        .map(|i| {
            let rows = 1 + rng.below(600) as usize;
            let k = 64 * (1 + rng.below(128) as usize);
            (rows, k, i % 2 == 1, false, if i % 3 == 2 { 2 } else { 0 })
        })
        .collect();
    run_quantize_cases("gpu_quantize_random_shapes_match_cpu", &cases, 11);
}

/// Special values in every case, every global-scale regime, edge shapes (1 row, 128, 129, K = 64).
#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_quantize_special_values_match_cpu() {
    let mut cases = vec![];
    for (i, (rows, k)) in [(1, 64), (127, 64), (128, 128), (129, 192), (1, 8192), (300, 704), (255, 1024), (513, 64)]
        .into_iter()
        .enumerate()
    {
        for bf16 in [false, true] {
            for g_kind in 0..5 {
                cases.push((rows, k, bf16, true, (g_kind + i as u32) % 5));
            }
        }
    }
    run_quantize_cases("gpu_quantize_special_values_match_cpu", &cases, 22);
}

/// Every f16 and every bf16 bit pattern (NaNs included) quantized once, in blocks mixing
/// neighbouring patterns, with a few global scales.
#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_quantize_every_half_pattern_matches_cpu() {
    let gpu = require_any_gpu();
    let stream = gpu.context().default_stream();
    let q = Quantizer::new(&gpu).unwrap();
    let (rows, k) = (1024, 64);
    let mut failures = vec![];
    for bf16 in [false, true] {
        // Pattern p at index (p * 7919) mod 2^16: each block mixes far-apart magnitudes.
        let mut bits = vec![0u16; rows * k];
        for p in 0..=u16::MAX as usize {
            bits[(p * 7919) % 65536] = p as u16;
        }
        for g in [1.0f32, 1e-3, 3.0e-8, 2.5e5] {
            let r = if bf16 {
                check_quantize::<half::bf16>(&q, &stream, &bits, rows, k, g)
            } else {
                check_quantize::<f16>(&q, &stream, &bits, rows, k, g)
            };
            println!("CASE every_pattern bf16={bf16} g={g:e}: {r:?}");
            if let Err(e) = r {
                failures.push(e);
            }
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

/// Dequantizes random NVFP4 tensors (random value bytes, random scale codes including NaN and
/// subnormals, several global scales) to f16 and bf16 and compares with the CPU's exact values
/// rounded once; also dequantize(quantize(x)) against the CPU.
#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_dequantize_matches_cpu() {
    let gpu = require_any_gpu();
    let stream = gpu.context().default_stream();
    let q = Quantizer::new(&gpu).unwrap();
    let mut rng = SplitMix64::new(33);
    let mut failures = vec![];
    for case in 0..40 {
        let rows = 1 + rng.below(400) as usize;
        let k = 64 * (1 + rng.below(64) as usize);
        let g = [1.0f32, 0.013, 3e-9, 7.5e4, 1e30][case % 5];
        let m = if case % 2 == 0 {
            let values: Vec<u8> = (0..rows * k / 2).map(|_| rng.next_u64() as u8).collect();
            let plain: Vec<u8> = (0..rows * k / 16).map(|_| rng.next_u64() as u8).collect();
            Nvfp4Matrix::from_plain_scales(rows, k, values, &plain, g).unwrap()
        } else {
            let bits = random_bits(&mut rng, rows, k, case % 4 == 1, true);
            cpu_quantize(&bits, rows, k, g, case % 4 == 1)
        };
        let exact = m.dequantize_f64();
        let dev = nvfp4_gemm::DeviceNvfp4::upload(&stream, &m).unwrap();
        let r16 = dequantize_and_compare::<f16>(&q, &stream, &dev, rows, k, g, &exact, |x| f64_to_f16(x).to_bits());
        let r = r16.and_then(|_| {
            dequantize_and_compare::<bf16>(&q, &stream, &dev, rows, k, g, &exact, |x| f64_to_bf16(x).to_bits())
        });
        println!("CASE gpu_dequantize[{case}] rows={rows} k={k} g={g:e}: {r:?}");
        if let Err(e) = r {
            failures.push(format!("case {case}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[allow(clippy::too_many_arguments)]
fn dequantize_and_compare<T: DenseFloat + ValidAsZeroBits + Default + PartialEq + Copy + ToBits>(
    q: &Quantizer,
    stream: &Arc<CudaStream>,
    dev: &nvfp4_gemm::DeviceNvfp4,
    rows: usize,
    k: usize,
    g: f32,
    exact: &[f64],
    round: impl Fn(f64) -> u16,
) -> Result<(), String> {
    let mut out = Guarded::<T>::new(stream, rows * k);
    // Two poisons (a NaN, then a number), so that an unwritten element cannot pass by luck.
    for poison in [0x7FFF, 0x1234] {
        out.fill(stream, T::from_bits_(0xE7E7), T::from_bits_(poison));
        {
            let gd = out.guard;
            let mut view = out.buf.slice_mut(gd..gd + rows * k);
            q.dequantize::<T>(stream, dev.operand(), rows, k, g, &mut view).map_err(|e| e.to_string())?;
        }
        stream.synchronize().unwrap();
        let (got, bad) = out.read(stream, T::from_bits_(0xE7E7));
        if bad > 0 {
            return Err(format!("{bad} guard elements changed"));
        }
        for (i, (x, &e)) in got.iter().zip(exact).enumerate() {
            let want = round(e);
            let ok = if e.is_nan() { x.is_nan_() } else { x.bits() == want };
            if !ok {
                return Err(format!("{}: element {i} is {:#06x}, CPU {want:#06x} ({e:e})", T::NAME, x.bits()));
            }
        }
    }
    Ok(())
}

/// Bit access for the two output types.
trait ToBits {
    const NAME: &'static str;
    fn bits(&self) -> u16;
    fn from_bits_(b: u16) -> Self;
    fn is_nan_(&self) -> bool;
}

impl ToBits for f16 {
    const NAME: &'static str = "f16";
    fn bits(&self) -> u16 {
        self.to_bits()
    }
    fn from_bits_(b: u16) -> Self {
        f16::from_bits(b)
    }
    fn is_nan_(&self) -> bool {
        self.is_nan()
    }
}

impl ToBits for bf16 {
    const NAME: &'static str = "bf16";
    fn bits(&self) -> u16 {
        self.to_bits()
    }
    fn from_bits_(b: u16) -> Self {
        bf16::from_bits(b)
    }
    fn is_nan_(&self) -> bool {
        self.is_nan()
    }
}

/// Bad arguments are typed errors and nothing is written; rows = 0 writes nothing.
#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_quantize_bad_arguments_write_nothing() {
    let gpu = require_any_gpu();
    let stream = gpu.context().default_stream();
    let q = Quantizer::new(&gpu).unwrap();
    let (rows, k) = (130, 128);
    let input = stream.clone_htod(&vec![f16::from_f32(1.5); rows * k]).unwrap();
    let sizes = Nvfp4Sizes::of(rows, k).unwrap();
    let mut values = stream.clone_htod(&vec![0xA5u8; sizes.values + 16]).unwrap();
    let mut scales = stream.clone_htod(&vec![0xA5u8; sizes.scales]).unwrap();
    let mut call = |rows: usize, k: usize, g: f32, values_len: usize| {
        let mut v = values.slice_mut(0..values_len);
        q.quantize::<f16>(&stream, &input, rows, k, g, Nvfp4OperandMut { values: &mut v, scales: &mut scales })
    };
    let field = |e: Error| match e {
        Error::InvalidArgument { field, .. } => field,
        other => panic!("{other:?}"),
    };
    assert_eq!(field(call(rows, k, 1.0, sizes.values + 16).unwrap_err()), "values");
    assert_eq!(field(call(rows, 96, 1.0, sizes.values).unwrap_err()), "k");
    assert_eq!(field(call(rows, k, f32::NAN, sizes.values).unwrap_err()), "global_scale");
    assert_eq!(field(call(rows, k, 0.0, sizes.values).unwrap_err()), "global_scale");
    assert_eq!(field(call(rows - 1, k, 1.0, sizes.values).unwrap_err()), "input");
    call(0, k, 1.0, sizes.values).unwrap();
    stream.synchronize().unwrap();
    assert!(stream.clone_dtoh(&values).unwrap().iter().all(|&b| b == 0xA5), "values written despite the errors");
    assert!(stream.clone_dtoh(&scales).unwrap().iter().all(|&b| b == 0xA5), "scales written despite the errors");
    // A misaligned output view.
    let mut v = values.slice_mut(8..8 + sizes.values);
    let e = q.quantize::<f16>(&stream, &input, rows, k, 1.0, Nvfp4OperandMut { values: &mut v, scales: &mut scales });
    assert_eq!(field(e.unwrap_err()), "values");
    let mut out = stream.alloc_zeros::<f16>(rows * k - 64).unwrap();
    let nv = stream.alloc_zeros::<u8>(sizes.values).unwrap();
    let e = q.dequantize::<f16>(&stream, Nvfp4Operand { values: &nv, scales: &scales }, rows, k, 1.0, &mut out);
    assert_eq!(field(e.unwrap_err()), "output");
}

/// The grouped GEMM on activations quantized on the GPU equals, bit for bit, the GEMM on the same
/// activations quantized on the CPU (and the quantized bytes are equal).
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_quantize_then_gemm_equals_cpu_quantize_then_gemm() {
    use nvfp4_format::{GroupShape, Nvfp4Matrix as M};
    use nvfp4_gemm::{DeviceNvfp4, GemmPlan, GroupArgs, Output, OutputType, Problem};
    let Some(gpu) = gpu_or_skip("gpu_quantize_then_gemm_equals_cpu_quantize_then_gemm", Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let q = Quantizer::new(&gpu).unwrap();
    let mut rng = SplitMix64::new(44);
    for shapes in [
        vec![GroupShape::new(200, 256, 512), GroupShape::new(40, 128, 1024)],
        vec![GroupShape::new(1, 4096, 7168), GroupShape::new(129, 7168, 2048), GroupShape::new(16, 512, 64)],
    ] {
        let mut outputs: Vec<Vec<Vec<u16>>> = vec![];
        let mut a_cpu: Vec<M> = vec![];
        let mut a_gpu: Vec<DeviceNvfp4> = vec![];
        let mut bs: Vec<(DeviceNvfp4, f32)> = vec![];
        for s in &shapes {
            // Activations with per-row magnitudes over 2^-4..2^4 (outputs well inside f16).
            let x: Vec<bf16> = (0..s.m)
                .flat_map(|_| {
                    let row = 2f64.powi(rng.below(9) as i32 - 4);
                    (0..s.k).map(|_| f64_to_bf16(rng.normal() * row)).collect::<Vec<_>>()
                })
                .collect();
            let g = global_scale_for_amax(x.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs())));
            a_cpu.push(quantize_with_global_scale(&x, s.m, s.k, g).unwrap());
            let dev_x = stream.clone_htod(&x).unwrap();
            let mut a = DeviceNvfp4::alloc_zeros(&stream, s.m, s.k).unwrap();
            q.quantize::<bf16>(&stream, &dev_x, s.m, s.k, g, a.operand_mut()).unwrap();
            a_gpu.push(a);
            let w: Vec<f32> = (0..s.n * s.k).map(|_| rng.normal() as f32 * 0.05).collect();
            let b = nvfp4_format::quantize(&w, s.n, s.k).unwrap();
            bs.push((DeviceNvfp4::upload(&stream, &b).unwrap(), g * b.global_scale()));
        }
        let a_up: Vec<DeviceNvfp4> = a_cpu.iter().map(|m| DeviceNvfp4::upload(&stream, m).unwrap()).collect();
        stream.synchronize().unwrap();
        for (a, m) in a_gpu.iter().zip(&a_cpu) {
            assert_eq!(stream.clone_dtoh(&a.values).unwrap(), m.values(), "quantized values");
            assert_eq!(stream.clone_dtoh(&a.scales).unwrap(), m.scales(), "quantized scales");
        }
        let mut plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::F16).unwrap()).unwrap();
        for a_side in [&a_gpu, &a_up] {
            let mut cs: Vec<CudaSlice<f16>> =
                shapes.iter().map(|s| stream.clone_htod(&vec![f16::from_bits(0x7FFF); s.m * s.n]).unwrap()).collect();
            {
                let mut args: Vec<GroupArgs> = a_side
                    .iter()
                    .zip(&bs)
                    .zip(cs.iter_mut())
                    .map(|((a, (b, alpha)), c)| GroupArgs {
                        a: a.operand().into(),
                        b: b.operand(),
                        c: Output::F16(c),
                        alpha: *alpha,
                    })
                    .collect();
                plan.run(&stream, &mut args).unwrap();
            }
            stream.synchronize().unwrap();
            outputs
                .push(cs.iter().map(|c| stream.clone_dtoh(c).unwrap().iter().map(|x| x.to_bits()).collect()).collect());
        }
        let nonfinite = outputs[0].iter().flatten().filter(|&&b| !f16::from_bits(b).is_finite()).count();
        println!("CASE gemm {:?}: equal={} non_finite_outputs={nonfinite}", shapes, outputs[0] == outputs[1]);
        assert_eq!(nonfinite, 0, "unwritten (poisoned) or overflowing outputs");
        assert!(outputs[0] == outputs[1], "GEMM outputs differ between GPU- and CPU-quantized activations");
    }
}
