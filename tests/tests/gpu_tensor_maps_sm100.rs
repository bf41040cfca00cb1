//! Every sm_100a tensor map the library's plans build (`nvfp4_gemm::probe::sm100::plan_tensor_maps`:
//! FP4 `16U4_ALIGN8B` maps in 2D and 3D, boxes wider than K, the 256-row boxes of the multicast
//! kernel's B, the MoE plan's token tensor) encoded by the real driver (`cuTensorMapEncodeTiled`,
//! `nvfp4_gemm::driver::tensor_map::encode`). It needs a driver and a context, not a Blackwell
//! GPU: run it on the H200.
//!
//! For each map it checks: the driver accepts it (a refusal is a bug of the plan; the 8-bit twin
//! of the same bytes is encoded too, to tell an element-type refusal on this device from a
//! geometry one); the encoding is deterministic; the 128 bytes change when any one parameter
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
use nvfp4_gemm::probe::sm100::{byte_twin, plan_tensor_maps, tensor_bytes};
use nvfp4_gemm::Gpu;
use nvfp4_gemm_abi::tensor_map::{TensorMap, TensorMapL2Promotion, TensorMapSwizzle, TiledMap};
use nvfp4_gemm_model_tests::model_reading;
use std::io::Write;

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

#[test]
#[ignore = "needs a CUDA driver"]
fn gpu_driver_encodes_every_sm100_plan_map_as_the_model_reads_it() {
    let gpu = match Gpu::new(0) {
        Ok(gpu) => gpu,
        Err(e) => {
            // Straight to stderr, past the harness's capture (as `gpu_or_skip` does).
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED gpu_driver_encodes_every_sm100_plan_map_as_the_model_reads_it: needs a CUDA driver and a GPU; {e}"
            );
            return;
        }
    };
    gpu.context().bind_to_thread().expect("binding the context");
    let stream = gpu.context().default_stream();
    println!("device: {} ({})", gpu.name(), gpu.arch().name());
    let mut failures = vec![];
    for (name, map) in plan_tensor_maps() {
        let bytes = tensor_bytes(&map) as usize;
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
            Err(e) => {
                let twin = driver_encode(&byte_twin(&map), base);
                problems.push(format!(
                    "the driver refuses it on this {} ({e}); its 8-bit twin of the same bytes: {}",
                    gpu.arch().name(),
                    match twin {
                        Ok(_) => "accepted (so the refusal is about 16U4_ALIGN8B here, not the geometry)".to_string(),
                        Err(t) => format!("refused too ({t})"),
                    }
                ));
            }
        }
        if let Err(e) = model_reading(&map, base) {
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
