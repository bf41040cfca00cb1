//! The TMA bandwidth kernel of the bench's ceilings (`diag/kernel/src/ceiling.rs`) in the device
//! model, on tiny buffers: it completes (no deadlock in its ring), every CTA receives the boxes
//! of its loads (walking past the end of the tensor wraps to its start), each box is the one the
//! walk names (the first word of each box, summed per CTA), and the model counts one TMA per box.

use nvfp4_gemm::driver::tensor_map::TiledMapEncoder;
use nvfp4_gemm_diag_abi::ceiling::*;
use nvfp4_gemm_diag_kernel::ceiling::xfer_tma_bandwidth;
use nvfp4_gemm_model_tests::*;

fn word_at(buf: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(buf[at..at + 4].try_into().unwrap())
}

fn run(case: TmaBandwidthCase, grid: u32, model: &ModelRun) {
    case.check().unwrap();
    let n = case.tensor_bytes() as usize;
    let data: Vec<u8> = (0..n).map(|i| ((i ^ (i >> 8) ^ (i >> 16)).wrapping_mul(37) % 251) as u8).collect();
    let src = DeviceBuf::from_bytes(&data);
    let maps = [ModelEncoder.encode(&case.map(), src.addr()).expect("map")];
    let out = DeviceBuf::from_bytes(&vec![0xEE; (4 * grid * TMA_BW_OUT_WORDS) as usize]);
    let p = case.params(maps.as_ptr() as u64, out.addr());
    let geometry = tma_bandwidth_launch(grid);
    let cfg = launch_config(Arch::Sm90a, geometry, 1, model);
    // SAFETY: a checked case's parameters; the map describes `src`, `out` holds the CTAs' words.
    let stats =
        nvfp4_gemm_model::launch(&cfg, || unsafe { xfer_tma_bandwidth(p) }).unwrap_or_else(|e| panic!("{case:?}: {e}"));

    let esize = case.shape.element_bytes() as usize;
    let row = case.shape.row_bytes() as usize;
    let mut total = 0u64;
    for cta in 0..grid {
        let (mut boxes, mut sum) = (0u32, 0u32);
        let mut load = cta;
        while load < p.loads {
            for b in 0..p.boxes_per_stage {
                let [x, y] = p.box_coords(load, b);
                sum = sum.wrapping_add(word_at(&data, y as usize * row + x as usize * esize));
                boxes += 1;
            }
            load += grid;
        }
        assert_eq!(boxes, p.loads_of_cta(cta, grid) * p.boxes_per_stage);
        let w = (cta * TMA_BW_OUT_WORDS) as usize * 4;
        let got = out.bytes();
        assert_eq!(word_at(got, w + 4 * TMA_BW_OUT_BOXES as usize), boxes, "{case:?}: CTA {cta} boxes");
        assert_eq!(word_at(got, w + 4 * TMA_BW_OUT_WORD_SUM as usize), sum, "{case:?}: CTA {cta} word sum");
        total += boxes as u64;
    }
    assert_eq!(total * case.shape.box_bytes() as u64, p.bytes(), "{case:?}: bytes");
    assert_eq!(stats.async_completed, total, "{case:?}: one TMA per box");
    assert!(
        stats.max_in_flight as u32 <= grid * TMA_BW_STAGES * p.boxes_per_stage,
        "{case:?}: {} copies in flight",
        stats.max_in_flight
    );
}

#[test]
fn model_ceiling_tma_bandwidth_token_boxes_wrap_and_count() {
    // 1 MiB: 64 boxes of 16 KiB; 40 loads of 2 boxes on 3 CTAs (14, 13, 13) wrap past the end.
    let case = TmaBandwidthCase { shape: TmaBox::TokenF16, boxes_per_stage: 2, buffer_bytes: 1 << 20, loads: 40 };
    run(case, 3, &ModelRun::default());
    run(case, 3, &ModelRun::ordered(Completion::Reversed, 1));
}

#[test]
fn model_ceiling_tma_bandwidth_weight_boxes_wrap_and_count() {
    // 512 KiB: 64 boxes of 8 KiB; 21 loads of 4 boxes on 2 CTAs (11, 10).
    let case = TmaBandwidthCase { shape: TmaBox::WeightU8, boxes_per_stage: 4, buffer_bytes: 512 << 10, loads: 21 };
    run(case, 2, &ModelRun::default());
    run(case, 2, &ModelRun::ordered(Completion::Random, 2));
}
