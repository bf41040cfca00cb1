//! Every sm_100a tensor map the library's plans build (`nvfp4_gemm_diag::probe::sm100::plan_tensor_maps`:
//! 2D and 3D FP4 maps, boxes wider than K, the 256-row boxes of the multicast kernel's B, the
//! MoE plan's token tensor), as the device model reads it. The driver's side of the same list is
//! `tests/tests/gpu_tensor_maps_sm100.rs` (it needs a CUDA driver).

use nvfp4_gemm::layout::Fp4Map;
use nvfp4_gemm_diag::probe::pattern;
use nvfp4_gemm_diag::probe::sm100::{byte_twin, plan_tensor_maps, tensor_bytes};
use nvfp4_gemm_model::tensor_map::gather_box;
use nvfp4_gemm_model_tests::{model_reading, DeviceBuf};

/// The model reads back every field the plan hands the encoder: element type `16U4_ALIGN8B`,
/// rank, dimensions, strides, box, 128-byte swizzle, base (and zero out-of-bounds fill, the only
/// one its format holds).
#[test]
fn model_reads_every_sm100_plan_map_as_planned() {
    let maps = plan_tensor_maps();
    assert!(maps.len() >= 20, "{} maps", maps.len());
    for (name, map) in &maps {
        let buf = DeviceBuf::zeroed(tensor_bytes(map) as usize);
        model_reading(map, buf.addr()).unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let ranks: Vec<u32> = maps.iter().map(|(_, m)| m.rank()).collect();
    assert!(ranks.contains(&2) && ranks.contains(&3), "both map shapes");
}

/// The boxes of every plan map (first and last row tiles, first and last K chunk: rows past the
/// tensor, the K tail and boxes wider than K) land in the model exactly as the boxes of its byte
/// twin (8-bit elements, the same bytes): the model's 4-bit path agrees with its byte path, which
/// the H200 has checked.
#[test]
fn model_fp4_boxes_land_as_their_byte_twins() {
    for (name, map) in plan_tensor_maps() {
        let bytes = tensor_bytes(&map) as usize;
        let buf = DeviceBuf::from_bytes(&pattern(bytes, 7));
        let fp4 = model_reading(&map, buf.addr()).unwrap_or_else(|e| panic!("{name}: {e}"));
        let twin = model_reading(&byte_twin(&map), buf.addr()).unwrap_or_else(|e| panic!("{name} (byte twin): {e}"));
        let rows = fp4.dims[1] as i32;
        let box_rows = fp4.box_dims[1] as i32;
        let last_row = (rows - 1) / box_rows * box_rows;
        let k_chunks: Vec<i32> = match map {
            Fp4Map::Rank2(_) => vec![0, ((fp4.dims[0] as i32 - 1) / 256) * 256],
            Fp4Map::Rank3(_) => vec![0, fp4.dims[2] as i32 - 1],
        };
        for row0 in [0, last_row] {
            for &k in &k_chunks {
                let (a, b) = match map {
                    Fp4Map::Rank2(_) => (vec![k, row0], vec![k / 2, row0]),
                    Fp4Map::Rank3(_) => (vec![0, row0, k], vec![0, row0, k]),
                };
                // SAFETY: both maps describe `buf`.
                let (x, y) = unsafe { (gather_box(&fp4, &a, 0x400), gather_box(&twin, &b, 0x400)) };
                assert_eq!(x, y, "{name}: box at {a:?}");
            }
        }
        drop(buf);
    }
}
