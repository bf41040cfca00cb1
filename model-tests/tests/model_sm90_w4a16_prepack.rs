//! `sm90_w4a16_prepack` (`kernel/src/sm90/prepack.rs`) in the device model: stacks of experts'
//! random NVFP4 weights (random value bytes; scales of every kind: positive, negative, ±0,
//! subnormal, NaN; the scale buffers' padding rows random too) prepacked for f16 and bf16
//! activations, with the parameters the library's own checks return (`prepack_params`) and its
//! launch geometry, on grids small enough that every thread grid-strides over several items. The
//! outputs are poisoned before the run and lie between guard bytes; each must equal, byte for
//! byte, the CPU prepack (`nvfp4_gemm::w4a16::prepack`) of each expert's matrix, the guards and
//! the inputs untouched.

use nvfp4_format::SplitMix64;
use nvfp4_gemm::w4a16::{prepack_params, prepack_stack, Activations, PrepackViews, WeightStack};
use nvfp4_gemm_abi::sm90::prepack::{items, prepack_launch, PREPACK_CTAS_PER_SM};
use nvfp4_gemm_kernel::sm90::prepack::sm90_w4a16_prepack;
use nvfp4_gemm_model_tests::*;

/// Guard bytes on each side of an output (a multiple of 16: the output stays aligned).
const GUARD_BYTES: usize = 64;
const GUARD_BYTE: u8 = 0xE7;
const POISON_BYTE: u8 = 0xA5;

/// An output of `len` bytes between guards, poisoned.
fn guarded(len: usize) -> DeviceBuf {
    let mut all = vec![GUARD_BYTE; len + 2 * GUARD_BYTES];
    all[GUARD_BYTES..GUARD_BYTES + len].fill(POISON_BYTE);
    DeviceBuf::from_bytes(&all)
}

/// The first differing byte of `got` against `want`, described for a stack whose matrices are
/// `per` bytes each.
fn first_difference(got: &[u8], want: &[u8], per: usize) -> Option<String> {
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

/// Prepacks a random stack in the model on `sm_count` SMs and compares with the CPU prepack.
fn check(stack: WeightStack, act: Activations, sm_count: u32, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let sizes = stack.sizes().unwrap();
    let mut values = vec![0u8; sizes.values];
    rng.fill_bytes(&mut values);
    let scale_bytes = rng.e4m3_bytes(sizes.scales);
    let (want_v, want_s) = prepack_stack(stack, &values, &scale_bytes, act).unwrap();
    let (in_v, in_s) = (DeviceBuf::from_bytes(&values), DeviceBuf::from_bytes(&scale_bytes));
    let (out_v, out_s) = (guarded(sizes.values), guarded(sizes.scales));
    let view = |b: &DeviceBuf, len| nvfp4_gemm::problem::BufferView { ptr: b.addr() + GUARD_BYTES as u64, len };
    let views = PrepackViews {
        values: in_v.view(sizes.values),
        scales: in_s.view(sizes.scales),
        out_values: view(&out_v, sizes.values),
        out_scales: view(&out_s, sizes.scales),
    };
    let params = prepack_params(stack, act, views).expect("valid arguments").expect("a non-empty stack");
    let geometry = prepack_launch(items(params.experts, params.rows, params.k), sm_count);
    let cfg = launch_config(Arch::Sm90a, geometry, PREPACK_CTAS_PER_SM, &ModelRun::default());
    // SAFETY: the library's checks passed for these buffers, which live past the launch.
    nvfp4_gemm_model::launch(&cfg, || unsafe { sm90_w4a16_prepack(params) })
        .unwrap_or_else(|e| panic!("{stack:?} {act:?}: sm90_w4a16_prepack failed in the model: {e}"));

    let what = format!("{stack:?} {act:?} on {} CTAs", geometry.grid);
    for (name, out, want, per) in [
        ("values", &out_v, &want_v, sizes.values / stack.experts),
        ("scales", &out_s, &want_s, sizes.scales / stack.experts),
    ] {
        let all = out.bytes();
        let body = &all[GUARD_BYTES..all.len() - GUARD_BYTES];
        if let Some(d) = first_difference(body, want, per) {
            panic!("{what}: {name}: {d}");
        }
        let guards = all[..GUARD_BYTES].iter().chain(&all[all.len() - GUARD_BYTES..]);
        assert!(guards.into_iter().all(|&b| b == GUARD_BYTE), "{what}: {name}: a guard byte was written");
    }
    assert!(in_v.bytes() == values && in_s.bytes() == scale_bytes, "{what}: an input was written");
}

#[test]
fn model_sm90_w4a16_prepack_matches_the_cpu_prepack() {
    let shapes = [
        (1, 8, 64),    // one chunk row per row, one 128-row scale block (120 padding rows)
        (1, 130, 192), // a second scale block of 126 padding rows
        (3, 72, 128),  // experts whose scale buffers hold 56 padding rows each
        (2, 256, 320), // no padding, K % 128 = 64
        (5, 40, 64),
    ];
    for (i, (experts, rows, k)) in shapes.into_iter().enumerate() {
        for act in [Activations::F16, Activations::Bf16] {
            check(WeightStack { experts, rows, k }, act, 1, 40 + i as u64);
        }
    }
}

#[test]
fn model_sm90_w4a16_prepack_random_stacks() {
    let mut rng = SplitMix64::new(0x9E9A);
    for case in 0..8 {
        let stack = WeightStack {
            experts: 1 + rng.below(4) as usize,
            rows: 1 + rng.below(300) as usize,
            k: 64 * (1 + rng.below(6) as usize),
        };
        let act = if case % 2 == 0 { Activations::Bf16 } else { Activations::F16 };
        check(stack, act, 1 + rng.below(2) as u32, 100 + case);
    }
}
