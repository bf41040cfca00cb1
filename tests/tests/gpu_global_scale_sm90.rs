//! Quantized operands keep their global scale on the device: `DeviceNvfp4::upload` carries the
//! matrix's, and `GroupArgs::new` multiplies both operands' into alpha, so a GEMM on quantized
//! inputs matches the reference (which a call with alpha 1 does not). Activations quantized on
//! the GPU, with their global scale recorded, give the same bits as uploaded CPU-quantized ones.

use half::{bf16, f16};
use nvfp4_format::{
    global_scale_for_amax, quantize_with_global_scale, reference_grouped_gemm, Group, GroupShape, SplitMix64, Tolerance,
};
use nvfp4_gemm::quantize::Quantizer;
use nvfp4_gemm::{Arch, DeviceNvfp4, GemmPlan, GroupArgs, Output, OutputType, Problem};
use nvfp4_gemm_tests::gpu_or_skip;

#[test]
#[ignore = "needs an sm_90a GPU"]
fn gpu_group_args_new_uses_the_global_scales() {
    let test = "gpu_group_args_new_uses_the_global_scales";
    let Some(gpu) = gpu_or_skip(test, Arch::Sm90a) else { return };
    let stream = gpu.context().default_stream();
    let shapes = vec![GroupShape::new(40, 256, 512), GroupShape::new(130, 136, 256)];
    let mut rng = SplitMix64::new(17);
    let (mut groups, mut xs) = (vec![], vec![]);
    for s in &shapes {
        // Activations around 30 and weights around 0.02: global scales far from 1.
        let x: Vec<bf16> = (0..s.m * s.k).map(|_| bf16::from_f64(rng.normal() * 30.0)).collect();
        let w: Vec<f32> = (0..s.n * s.k).map(|_| rng.normal() as f32 * 0.02).collect();
        let g_x = global_scale_for_amax(x.iter().fold(0.0f32, |m, v| m.max(v.to_f32().abs())));
        let a = quantize_with_global_scale(&x, s.m, s.k, g_x).unwrap();
        let b = nvfp4_format::quantize(&w, s.n, s.k).unwrap();
        assert!(a.global_scale() > 1e-3 && b.global_scale() < 1e-4, "{} {}", a.global_scale(), b.global_scale());
        groups.push(Group::new(a, b, 1.0).unwrap());
        xs.push(x);
    }
    let dev: Vec<(DeviceNvfp4, DeviceNvfp4)> = groups
        .iter()
        .map(|g| (DeviceNvfp4::upload(&stream, &g.a).unwrap(), DeviceNvfp4::upload(&stream, &g.b).unwrap()))
        .collect();
    for ((a, b), g) in dev.iter().zip(&groups) {
        assert_eq!((a.global_scale, b.global_scale), (g.a.global_scale(), g.b.global_scale()));
    }
    let mut plan = GemmPlan::new(&gpu, Problem::new(shapes.clone(), OutputType::F16).unwrap()).unwrap();
    // One call with `GroupArgs::new` (or with alpha forced to `one`) on the given A operands.
    let mut run = |a_side: &[&DeviceNvfp4], one: bool| -> Vec<Vec<f16>> {
        let mut cs: Vec<_> = shapes.iter().map(|s| stream.alloc_zeros::<f16>(s.m * s.n).unwrap()).collect();
        {
            let mut args: Vec<GroupArgs> = a_side
                .iter()
                .zip(&dev)
                .zip(cs.iter_mut())
                .map(|((a, (_, b)), c)| {
                    let args = GroupArgs::new(a, b, Output::F16(c));
                    if one {
                        GroupArgs { alpha: 1.0, ..args }
                    } else {
                        args
                    }
                })
                .collect();
            plan.run(&stream, &mut args).unwrap();
        }
        cs.iter().map(|c| stream.clone_dtoh(c).unwrap()).collect()
    };
    let uploaded: Vec<&DeviceNvfp4> = dev.iter().map(|(a, _)| a).collect();
    let got = run(&uploaded, false);
    let want = reference_grouped_gemm(&groups).unwrap();
    let cmp = nvfp4_format::compare(&got, &want, Tolerance::COMPETITION).unwrap();
    println!("CASE {test} {cmp}");
    assert!(cmp.passed(), "{cmp}");
    let unscaled = nvfp4_format::compare(&run(&uploaded, true), &want, Tolerance::COMPETITION).unwrap();
    assert!(!unscaled.passed(), "alpha 1 matched the reference: the global scales were not exercised");

    // The same activations quantized on the GPU, their scale recorded: the same outputs, bit for bit.
    let q = Quantizer::new(&gpu).unwrap();
    let quantized: Vec<DeviceNvfp4> = xs
        .iter()
        .zip(&shapes)
        .zip(&groups)
        .map(|((x, s), g)| {
            let dev_x = stream.clone_htod(x).unwrap();
            let mut a = DeviceNvfp4::alloc_zeros(&stream, s.m, s.k).unwrap();
            assert_eq!(a.global_scale, 1.0);
            q.quantize::<bf16>(&stream, &dev_x, s.m, s.k, g.a.global_scale(), a.operand_mut()).unwrap();
            a.global_scale = g.a.global_scale();
            a
        })
        .collect();
    let bits =
        |c: &[Vec<f16>]| -> Vec<Vec<u16>> { c.iter().map(|v| v.iter().map(|x| x.to_bits()).collect()).collect() };
    assert_eq!(bits(&run(&quantized.iter().collect::<Vec<_>>(), false)), bits(&got));
}
