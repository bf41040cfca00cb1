//! Every sm_100a tensor map the library's plans build (`nvfp4_gemm_diag::probe::sm100::plan_tensor_maps`:
//! FP4 `16U4_ALIGN8B` maps in 2D and 3D, boxes wider than K, the 256-row boxes of the multicast
//! kernel's B, the MoE plan's token tensor) encoded by the real driver (`cuTensorMapEncodeTiled`,
//! `nvfp4_gemm::driver::tensor_map::encode`). The geometry test needs a driver and a context, not a
//! Blackwell GPU: it runs on the H200.
//!
//! Two tests: the maps' geometry through their 8-bit twins (the same bytes as `u8`) on any GPU —
//! the H200's driver (580.159) refuses the 4-bit element type itself for every map — and
//! the FP4 maps as they are on a B200. For each map it checks: the driver accepts it (a refusal is
//! a bug of the plan); the encoding is deterministic; the 128 bytes change when any one parameter
//! changes (so the driver records every field the host passes); and the device model reads the
//! same parameters back from its own encoding of the same description. The driver's format is
//! opaque, so the model never reads the driver's bytes: it learns every field — geometry, element
//! type, swizzle, out-of-bounds fill — from the [`TiledMap`] the host hands both encoders through
//! one `TiledMapEncoder` call (docs/model.md §5). Whether the hardware reads the driver's bytes as
//! the model reads its own is what `gpu_probe_sm100` checks on a B200 (its TMA boxes are loaded
//! through driver maps and compared with the model's byte for byte).

use cudarc::driver::DevicePtr;
use nvfp4_gemm::driver::tensor_map::encode;
use nvfp4_gemm::layout::Fp4Map;
use nvfp4_gemm_abi::tensor_map::{TensorMap, TensorMapL2Promotion, TensorMapSwizzle, TiledMap};
use nvfp4_gemm_diag::probe::sm100::{byte_twin, plan_tensor_maps, tensor_bytes};
use nvfp4_gemm_model_tests::model_reading;

fn driver_encode(map: &Fp4Map, base: u64) -> Result<TensorMap, String> {
    match map {
        Fp4Map::Rank2(m) => encode(m, base),
        Fp4Map::Rank3(m) => encode(m, base),
    }
    .map_err(|e| e.to_string())
}

/// The map with one parameter changed, for each parameter the host passes (named).
fn one_field_changed<const R: usize>(m: TiledMap<R>) -> Vec<(&'static str, TiledMap<R>)> {
    let mut v = vec![];
    let mut x = m;
    x.dims[0] -= 64;
    v.push(("globalDim[0]", x));
    let mut x = m;
    x.dims[1] += 1;
    v.push(("globalDim[1]", x));
    let mut x = m;
    x.strides_bytes[0] += 128;
    v.push(("globalStrides[0]", x));
    let mut x = m;
    x.box_dims[1] /= 2;
    v.push(("boxDim[1]", x));
    let mut x = m;
    x.swizzle = TensorMapSwizzle::None;
    v.push(("swizzle", x));
    let mut x = m;
    x.l2_promotion = TensorMapL2Promotion::B128;
    v.push(("l2Promotion", x));
    v
}

fn variants(map: &Fp4Map) -> Vec<(&'static str, Fp4Map)> {
    match *map {
        Fp4Map::Rank2(m) => one_field_changed(m).into_iter().map(|(n, x)| (n, Fp4Map::Rank2(x))).collect(),
        Fp4Map::Rank3(m) => one_field_changed(m).into_iter().map(|(n, x)| (n, Fp4Map::Rank3(x))).collect(),
    }
}

/// Encodes `encoded(map)` for every plan map with the driver on `gpu` and checks it as the module
/// docs say; the model reads `map` itself.
fn check_every_plan_map(gpu: &nvfp4_gemm::Gpu, what: &str, encoded: fn(&Fp4Map) -> Fp4Map) {
    gpu.context().bind_to_thread().expect("binding the context");
    let stream = gpu.context().default_stream();
    println!("device: {} ({}); encoding {what}", gpu.name(), gpu.arch().name());
    let mut failures = vec![];
    for (name, fp4) in plan_tensor_maps() {
        let map = encoded(&fp4);
        let bytes = tensor_bytes(&fp4) as usize;
        let buf = stream.alloc_zeros::<u8>(bytes.max(16)).expect("allocating the tensor");
        let (base, _sync) = buf.device_ptr(&stream);
        let mut problems = vec![];
        match driver_encode(&map, base) {
            Ok(first) => {
                if driver_encode(&map, base).ok() != Some(first) {
                    problems.push("two encodings of the same map differ".to_string());
                }
                let other_base = driver_encode(&map, base + 256).map_err(|e| format!("base + 256: {e}"));
                if other_base.as_ref().ok() == Some(&first) {
                    problems.push("the bytes do not depend on the global address".into());
                }
                for (field, changed) in variants(&map) {
                    // A variant the driver refuses (say, a stride below the row) tells nothing here.
                    if let Ok(x) = driver_encode(&changed, base) {
                        if x == first {
                            problems.push(format!("the bytes do not depend on {field}"));
                        }
                    }
                }
            }
            Err(e) => problems.push(format!("the driver refuses it on this {} ({e})", gpu.arch().name())),
        }
        if let Err(e) = model_reading(&fp4, base) {
            problems.push(format!("the model's reading: {e}"));
        }
        if problems.is_empty() {
            println!("{name}: {map:?}: accepted, deterministic, every field recorded; the model reads the same");
        } else {
            println!("FAILED {name}: {map:?}: {}", problems.join("; "));
            failures.push(format!("{name}: {}", problems.join("; ")));
        }
    }
    assert!(failures.is_empty(), "{} map(s):\n{}", failures.len(), failures.join("\n"));
}

/// The geometry of every plan map — dimensions, strides, boxes wider than K, swizzle, L2
/// promotion — through each map's 8-bit twin (the same bytes as `u8`): the H200's driver refuses
/// the 4-bit element type `16U4_ALIGN8B` itself for every map (CUDA_ERROR_INVALID_VALUE, while
/// each twin is accepted), so on sm_90a this is what can be checked. The element type is the
/// sm_100a test's.
#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_driver_encodes_every_sm100_plan_map_geometry() {
    let gpu = nvfp4_gemm_tests::require_any_gpu();
    check_every_plan_map(&gpu, "each map's 8-bit twin", byte_twin);
}

/// Every plan map as the plans encode it, `16U4_ALIGN8B` included.
#[test]
#[ignore = "needs an sm_100a GPU"]
fn gpu_driver_encodes_every_sm100_plan_map_as_the_model_reads_it() {
    let gpu = nvfp4_gemm_tests::require_gpu(nvfp4_gemm::Arch::Sm100a);
    check_every_plan_map(&gpu, "the FP4 maps", |m| *m);
}
