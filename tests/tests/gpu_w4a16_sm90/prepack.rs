//! The W4A16 weight prepack on the GPU (`nvfp4_gemm::w4a16::Prepacker`, the kernel
//! `sm90_w4a16_prepack`) against the CPU prepack (`nvfp4_gemm::w4a16::prepack`, run on each
//! expert's matrix), bit for bit, for f16 and bf16 activations: stacks of random experts' weights
//! (random value bytes; scales of every kind: positive, negative, ±0, subnormal, NaN, and random
//! bytes in the scale buffers' padding rows), from one matrix of 8 × 64 to DeepSeek-sized
//! experts, N not a multiple of 128 (padding rows) and random shapes. Every output is poisoned
//! before each of two runs (two different poison bytes, so an unwritten byte cannot pass by luck)
//! and sits between guard bytes that must stay untouched; the inputs must be unchanged. Also: bad
//! arguments are typed errors and nothing is written, an empty stack launches nothing, and on
//! sm_100a the prepacker is `Error::Unsupported`. Ignored unless asked for: they need a GPU. (A
//! module of `gpu_w4a16_sm90`: one test binary less in the GPU bundle.)

use cudarc::driver::{CudaSlice, DevicePtr};
use nvfp4_format::SplitMix64;
use nvfp4_gemm::problem::BufferView;
use nvfp4_gemm::quantize::Nvfp4OperandMut;
use nvfp4_gemm::w4a16::{prepack_stack, Activations, PrepackViews, Prepacker, WeightStack};
use nvfp4_gemm::{Arch, Error, Gpu, Nvfp4Operand};
use nvfp4_gemm_tests::guarded::{Guarded, POISONS};
use nvfp4_gemm_tests::{gpu_or_skip, require_gpu};

/// A random stack's values and scales (padding rows random too).
fn random_stack(stack: WeightStack, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let mut rng = SplitMix64::new(seed);
    let sizes = stack.sizes().unwrap();
    let mut values = vec![0u8; sizes.values];
    rng.fill_bytes(&mut values);
    (values, rng.e4m3_bytes(sizes.scales))
}

/// The first difference of `got` from `want` (matrices of `per` bytes), if any.
fn difference(got: &[u8], want: &[u8], per: usize) -> Option<String> {
    let i = got.iter().zip(want).position(|(g, w)| g != w)?;
    let n = got.iter().zip(want).filter(|(g, w)| g != w).count();
    Some(format!(
        "{n} bytes differ; first: expert {} byte {}: got {:#04x}, want {:#04x}",
        i / per,
        i % per,
        got[i],
        want[i]
    ))
}

/// Prepacks a random stack on the GPU for both activation types, twice each over two poisons, and
/// compares with the CPU prepack; the guards and inputs must be untouched.
fn check(gpu: &Gpu, prepacker: &Prepacker, stack: WeightStack, seed: u64) {
    let stream = gpu.context().default_stream();
    let sizes = stack.sizes().unwrap();
    let (values, scales) = random_stack(stack, seed);
    let (in_v, in_s) = (stream.clone_htod(&values).unwrap(), stream.clone_htod(&scales).unwrap());
    let (mut out_v, mut out_s) = (Guarded::new(&stream, sizes.values), Guarded::new(&stream, sizes.scales));
    for act in [Activations::F16, Activations::Bf16] {
        let (want_v, want_s) = prepack_stack(stack, &values, &scales, act).unwrap();
        for poison in POISONS {
            out_v.poison(&stream, poison);
            out_s.poison(&stream, poison);
            {
                let mut v = out_v.body_mut();
                let mut s = out_s.body_mut();
                let input = Nvfp4Operand { values: &in_v, scales: &in_s };
                let out = Nvfp4OperandMut { values: &mut v, scales: &mut s };
                prepacker.prepack(&stream, input, stack, act, out).unwrap();
            }
            let what = format!("{stack:?} {act:?} (poison {poison:#04x})");
            for (name, out, want, per) in [
                ("values", &out_v, &want_v, sizes.values / stack.experts),
                ("scales", &out_s, &want_s, sizes.scales / stack.experts),
            ] {
                let (got, bad_guards) = out.read(&stream);
                if let Some(d) = difference(&got, want, per) {
                    panic!("{what}: {name}: {d}");
                }
                assert_eq!(bad_guards, 0, "{what}: {name}: guard bytes written");
            }
        }
    }
    assert!(stream.clone_dtoh(&in_v).unwrap() == values, "{stack:?}: the input values were written");
    assert!(stream.clone_dtoh(&in_s).unwrap() == scales, "{stack:?}: the input scales were written");
}

/// Fixed shapes, from one 8 × 64 matrix to DeepSeek's expert shapes, and N with padding rows.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_prepack_matches_the_cpu_prepack() {
    let Some(gpu) = gpu_or_skip("gpu_w4a16_prepack_matches_the_cpu_prepack", Arch::Sm90a) else { return };
    let prepacker = Prepacker::new(&gpu).unwrap();
    let shapes = [
        (1, 8, 64),
        (1, 130, 192), // 126 padding rows of scales
        (3, 72, 128),  // 56 padding rows per expert
        (2, 4000, 320),
        (5, 1000, 2048), // 24 padding rows per expert
        (2, 7168, 2048), // DeepSeek's W2 experts
        (2, 2048, 7168), // and W1/W3 halves
    ];
    for (i, (experts, rows, k)) in shapes.into_iter().enumerate() {
        check(&gpu, &prepacker, WeightStack { experts, rows, k }, 10 + i as u64);
    }
}

/// Random stacks: 1–6 experts, N 1–700, K 64–4096.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_prepack_random_stacks() {
    let Some(gpu) = gpu_or_skip("gpu_w4a16_prepack_random_stacks", Arch::Sm90a) else { return };
    let prepacker = Prepacker::new(&gpu).unwrap();
    let mut rng = SplitMix64::new(0x4A16_9E9A);
    for case in 0..24 {
        let stack = WeightStack {
            experts: 1 + rng.below(6) as usize,
            rows: 1 + rng.below(700) as usize,
            k: 64 * (1 + rng.below(64) as usize),
        };
        check(&gpu, &prepacker, stack, 1000 + case);
    }
}

/// Bad arguments are typed errors naming the argument, and nothing is written; an empty stack
/// launches nothing.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_prepack_bad_arguments_write_nothing() {
    let Some(gpu) = gpu_or_skip("gpu_w4a16_prepack_bad_arguments_write_nothing", Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let prepacker = Prepacker::new(&gpu).unwrap();
    let stack = WeightStack { experts: 2, rows: 130, k: 128 };
    let sizes = stack.sizes().unwrap();
    let (values, scales) = random_stack(stack, 7);
    let in_v = stream.clone_htod(&values).unwrap();
    let in_s = stream.clone_htod(&scales).unwrap();
    let mut out_v = stream.clone_htod(&vec![0xA5u8; sizes.values + 32]).unwrap();
    let mut out_s = stream.clone_htod(&vec![0xA5u8; sizes.scales]).unwrap();
    let field = |e: Error| match e {
        Error::InvalidArgument { field, .. } => field,
        other => panic!("{other:?}"),
    };
    // (stack, output values at, output values length, expected field)
    let cases = [
        (stack, 0, sizes.values + 16, "out_values"),
        (stack, 8, sizes.values, "out_values"),
        (WeightStack { k: 96, ..stack }, 0, sizes.values, "k"),
        (WeightStack { experts: 3, ..stack }, 0, sizes.values, "values"),
        (WeightStack { rows: 129, ..stack }, 0, sizes.values, "values"),
    ];
    for (s, at, len, want) in cases {
        let mut v = out_v.slice_mut(at..at + len);
        let mut sc = out_s.slice_mut(0..sizes.scales);
        let input = Nvfp4Operand { values: &in_v, scales: &in_s };
        let e = prepacker.prepack(
            &stream,
            input,
            s,
            Activations::Bf16,
            Nvfp4OperandMut { values: &mut v, scales: &mut sc },
        );
        assert_eq!(field(e.unwrap_err()), want, "{s:?} out_values at {at}, {len} bytes");
    }
    // Short output scales.
    {
        let mut v = out_v.slice_mut(0..sizes.values);
        let mut sc = out_s.slice_mut(0..sizes.scales - 512);
        let input = Nvfp4Operand { values: &in_v, scales: &in_s };
        let e = prepacker.prepack(
            &stream,
            input,
            stack,
            Activations::F16,
            Nvfp4OperandMut { values: &mut v, scales: &mut sc },
        );
        assert_eq!(field(e.unwrap_err()), "out_scales");
    }
    // Outputs over an input (in place) or over each other: the typed entry on addresses.
    {
        let (iv, _g1) = in_v.device_ptr(&stream);
        let (is, _g2) = in_s.device_ptr(&stream);
        let (ov, _g3) = out_v.device_ptr(&stream);
        let (os, _g4) = out_s.device_ptr(&stream);
        let view = |ptr, len| BufferView { ptr, len };
        let good = PrepackViews {
            values: view(iv, sizes.values),
            scales: view(is, sizes.scales),
            out_values: view(ov, sizes.values),
            out_scales: view(os, sizes.scales),
        };
        let overlaps = [
            (PrepackViews { out_values: view(iv, sizes.values), ..good }, ("out_values", "values")),
            (PrepackViews { out_scales: view(is, sizes.scales), ..good }, ("out_scales", "scales")),
            (PrepackViews { out_scales: view(ov + 16, sizes.scales), ..good }, ("out_scales", "out_values")),
        ];
        for (views, names) in overlaps {
            // SAFETY: live buffers of these lengths; the call refuses before any launch.
            let e = unsafe { prepacker.prepack_views(&stream, stack, Activations::Bf16, views) };
            match e {
                Err(Error::Overlap { output, other, .. }) => assert_eq!((output.field, other.field), names),
                other => panic!("{names:?}: {other:?}"),
            }
        }
    }
    stream.synchronize().unwrap();
    assert!(stream.clone_dtoh(&out_v).unwrap().iter().all(|&b| b == 0xA5), "values written despite the errors");
    assert!(stream.clone_dtoh(&out_s).unwrap().iter().all(|&b| b == 0xA5), "scales written despite the errors");
    assert!(stream.clone_dtoh(&in_v).unwrap() == values && stream.clone_dtoh(&in_s).unwrap() == scales);
    // The empty stack: nothing launched, whatever the buffers.
    let mut v = out_v.slice_mut(8..24);
    let mut sc = out_s.slice_mut(4..20);
    // (Misaligned and of any length: an empty stack's buffers are not checked.)
    let input = Nvfp4Operand { values: &in_v, scales: &in_s };
    let empty = WeightStack { experts: 0, ..stack };
    prepacker
        .prepack(&stream, input, empty, Activations::Bf16, Nvfp4OperandMut { values: &mut v, scales: &mut sc })
        .unwrap();
    stream.synchronize().unwrap();
    assert!(stream.clone_dtoh(&out_v).unwrap().iter().all(|&b| b == 0xA5), "the empty stack wrote");
    assert!(stream.clone_dtoh(&out_s).unwrap().iter().all(|&b| b == 0xA5), "the empty stack wrote");
}

/// On sm_100a the prepacker is `Error::Unsupported` (W4A16 runs on sm_90a).
#[test]
#[ignore = "needs an sm_100a GPU"]
fn gpu_w4a16_prepack_is_unsupported_on_sm100() {
    let gpu = require_gpu(Arch::Sm100a);
    assert!(matches!(Prepacker::new(&gpu), Err(Error::Unsupported(_))));
}

/// The C interface's device prepack (`nvfp4_w4a16_prepack_device`) writes the CPU prepack's bytes
/// too, on the legacy default stream; a bad token type is `NVFP4_INVALID` with nothing written.
#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_w4a16_prepack_through_the_c_interface() {
    use nvfp4_gemm::capi::{
        nvfp4_device_close, nvfp4_device_open, nvfp4_w4a16_prepack_device, RawBuffer, RawOperand, NVFP4_INVALID,
        NVFP4_OK, NVFP4_TOKENS_BF16, NVFP4_TOKENS_NVFP4,
    };
    let Some(gpu) = gpu_or_skip("gpu_w4a16_prepack_through_the_c_interface", Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let stack = WeightStack { experts: 3, rows: 200, k: 448 };
    let sizes = stack.sizes().unwrap();
    let (values, scales) = random_stack(stack, 77);
    let (want_v, want_s) = prepack_stack(stack, &values, &scales, Activations::Bf16).unwrap();
    let (in_v, in_s) = (stream.clone_htod(&values).unwrap(), stream.clone_htod(&scales).unwrap());
    let out_v = stream.clone_htod(&vec![0xA5u8; sizes.values]).unwrap();
    let out_s = stream.clone_htod(&vec![0xA5u8; sizes.scales]).unwrap();
    let raw = |b: &CudaSlice<u8>| RawBuffer { ptr: b.device_ptr(&stream).0, len: b.len() as u64 };
    let input = RawOperand { values: raw(&in_v), scales: raw(&in_s) };
    let out = RawOperand { values: raw(&out_v), scales: raw(&out_s) };
    stream.synchronize().unwrap();
    let mut err = [0 as std::ffi::c_char; 256];
    let mut dev = std::ptr::null_mut();
    let (e, n) = (err.as_mut_ptr(), err.len());
    let (experts, rows, k) = (stack.experts as u64, stack.rows as u64, stack.k as u64);
    // SAFETY: live device buffers of these lengths, the legacy default stream (null), an error
    // buffer of `n` bytes; the handle is closed at the end.
    unsafe {
        assert_eq!(nvfp4_device_open(0, &mut dev, e, n), NVFP4_OK);
        let bad = nvfp4_w4a16_prepack_device(
            dev,
            std::ptr::null_mut(),
            &input,
            experts,
            rows,
            k,
            NVFP4_TOKENS_NVFP4,
            &out,
            e,
            n,
        );
        assert_eq!(bad, NVFP4_INVALID);
        let status = nvfp4_w4a16_prepack_device(
            dev,
            std::ptr::null_mut(),
            &input,
            experts,
            rows,
            k,
            NVFP4_TOKENS_BF16,
            &out,
            e,
            n,
        );
        assert_eq!(status, NVFP4_OK, "{:?}", std::ffi::CStr::from_ptr(err.as_ptr()));
        nvfp4_device_close(dev);
    }
    gpu.context().synchronize().unwrap();
    assert!(stream.clone_dtoh(&out_v).unwrap() == want_v, "values differ from the CPU prepack");
    assert!(stream.clone_dtoh(&out_s).unwrap() == want_s, "scales differ from the CPU prepack");
}
