//! The MoE block's routing and combine kernels on the GPU (`nvfp4_gemm::moe_block::BlockKernels`,
//! the kernels `moe_route`, `moe_route_count` / `moe_route_scan` / `moe_route_scatter` and
//! `moe_combine`) against `nvfp4_gemm_abi::moe_block`'s references, exactly: random router outputs
//! (ids of -1 and of other ranks, repeated ids, empty experts, one expert taking everything;
//! int32 and int64 ids; f32 and bf16 weights; T = 0, 1 and the decode and prefill sizes of a
//! 256-expert model at top-8), each routing on both paths (the one CTA, and the multi-CTA path
//! on the chunk count `route_chunks` picks and on forced counts of 1, 3 and 128), and combines of f16 and bf16 rows with f32,
//! bf16 or no weights. Every output is poisoned before each of two runs (two poisons) and sits
//! between guards that must stay untouched. (A module of `gpu_quantize`: one test binary less in
//! the GPU bundle.)

use cudarc::driver::CudaStream;
use nvfp4_format::SplitMix64;
use nvfp4_gemm::moe_block::{route_chunks, BlockKernels, CombineViews, IdType, RouteViews, Routing, WeightType};
use nvfp4_gemm_abi::moe_block::{combine_sum, half_bits_to_f32, route_reference, NOT_LOCAL, ROUTE_MAX_CHUNKS};
use nvfp4_gemm_tests::guarded::{Guarded, POISONS};
use nvfp4_gemm_tests::require_any_gpu;
use std::sync::Arc;

/// The body of `g` as little-endian u32s; panics if a guard changed.
fn u32s(g: &Guarded, stream: &Arc<CudaStream>, what: &str) -> Vec<u32> {
    g.body(stream, what).chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect()
}

/// Router weights exactly representable in their type, as f32, and their bytes.
fn weights(rng: &mut SplitMix64, n: usize, bf16: bool) -> (Vec<f32>, Vec<u8>) {
    let (mut v, mut b) = (vec![], vec![]);
    for _ in 0..n {
        let x = (rng.next_f64() * 2.0 - 0.25) as f32;
        if bf16 {
            let h = half::bf16::from_f32(x).to_bits();
            v.push(half_bits_to_f32(h, true));
            b.extend_from_slice(&h.to_le_bytes());
        } else {
            v.push(x);
            b.extend_from_slice(&x.to_le_bytes());
        }
    }
    (v, b)
}

/// (tokens, top_k, experts, first expert, int64 ids, bf16 weights, mode: 0 mixed, 1 one expert,
/// 2 even experts only)
type RouteCase = (usize, usize, usize, i64, bool, bool, u32);

fn route_case(k: &BlockKernels, stream: &Arc<CudaStream>, c: RouteCase, seed: u64) {
    let (tokens, top_k, experts, first, i64_ids, bf16_w, mode) = c;
    let mut rng = SplitMix64::new(seed);
    let slots = tokens * top_k;
    let ids: Vec<i64> = (0..slots)
        .map(|_| match mode {
            0 if rng.below(4) == 0 => -1,
            0 => first - 3 + rng.below(experts as u64 + 6) as i64,
            1 => first + experts as i64 - 1,
            _ => first + 2 * rng.below(experts.div_ceil(2) as u64) as i64,
        })
        .collect();
    let id_bytes: Vec<u8> = if i64_ids {
        ids.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        ids.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
    };
    let (w, w_bytes) = weights(&mut rng, slots, bf16_w);
    let (ids_d, w_d) = (Guarded::input(stream, &id_bytes), Guarded::input(stream, &w_bytes));
    let mut outs = [
        Guarded::new(stream, 4 * (experts + 1)),
        Guarded::new(stream, 4 * slots),
        Guarded::new(stream, 4 * slots),
        Guarded::new(stream, 4 * slots),
    ];
    let (mut off, mut sr, mut rt) = (vec![0u32; experts + 1], vec![0u32; slots], vec![0u32; slots]);
    route_reference(|s| ids[s], slots, top_k, first, experts as u32, &mut off, &mut sr, &mut rt);
    let rows = off[experts] as usize;
    let routing = Routing { tokens, top_k, first_expert: first, experts };
    let mut paths = vec![0, 1, 3, ROUTE_MAX_CHUNKS, route_chunks(routing)];
    paths.sort_unstable();
    paths.dedup();
    for (chunks, poison) in paths.into_iter().flat_map(|c| POISONS.map(|p| (c, p))) {
        let mut scratch = Guarded::new(stream, 4 * chunks as usize * experts);
        scratch.poison(stream, poison);
        for o in &mut outs {
            o.poison(stream, poison);
        }
        let views = RouteViews {
            ids: ids_d.view(stream, slots),
            ids_type: if i64_ids { IdType::I64 } else { IdType::I32 },
            weights: Some(w_d.view(stream, slots)),
            weights_type: if bf16_w { WeightType::Bf16 } else { WeightType::F32 },
            offsets: outs[0].view(stream, experts + 1),
            slot_row: outs[1].view(stream, slots),
            row_token: outs[2].view(stream, slots),
            row_weight: Some(outs[3].view(stream, slots)),
            scratch: scratch.view(stream, chunks as usize * experts),
        };
        // SAFETY: live buffers of these lengths, kept until the synchronizing reads below.
        unsafe {
            if chunks == route_chunks(routing) {
                k.route(stream, routing, views).unwrap();
            } else {
                k.route_on(stream, routing, views, chunks).unwrap();
            }
        }
        let what = format!("route {c:?} on {chunks} chunks, seed {seed} poison {poison:#x}");
        assert_eq!(u32s(&outs[0], stream, &what), off, "{what}: offsets");
        assert_eq!(u32s(&outs[1], stream, &what), sr, "{what}: slot_row");
        assert_eq!(u32s(&outs[2], stream, &what)[..rows], rt[..rows], "{what}: row_token");
        let rw = u32s(&outs[3], stream, &what);
        for (s, &r) in sr.iter().enumerate() {
            if r != NOT_LOCAL {
                assert_eq!(rw[r as usize], w[s].to_bits(), "{what}: row_weight of slot {s}");
            }
        }
        assert!(ids_d.body(stream, &what) == id_bytes && w_d.body(stream, &what) == w_bytes, "{what}: inputs");
        scratch.body(stream, &what);
    }
}

#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_moe_route_matches_the_reference() {
    let gpu = require_any_gpu();
    let k = BlockKernels::new(&gpu).unwrap();
    let stream = gpu.context().default_stream();
    let cases: [RouteCase; 11] = [
        (0, 8, 256, 0, false, false, 0),
        (1, 8, 256, 0, true, true, 0),
        (37, 4, 8, 16, false, false, 0),
        (300, 8, 5, 3, false, true, 1),
        (260, 6, 40, -2, true, false, 2),
        (64, 8, 1, 7, false, false, 0),
        (64, 8, 256, 256, true, false, 0),
        (4096, 8, 256, 0, false, true, 0),
        (3000, 2, 4096, 1 << 40, true, false, 0),
        (4097, 1, 8, 0, false, false, 0),
        (16384, 8, 32, 0, true, true, 1),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        route_case(&k, &stream, c, 300 + i as u64);
    }
}

/// (tokens, top_k, hidden, bf16 rows, weights: None, Some(bf16))
type CombineCase = (usize, usize, usize, bool, Option<bool>);

fn combine_case(k: &BlockKernels, stream: &Arc<CudaStream>, c: CombineCase, seed: u64) {
    let (tokens, top_k, hidden, bf16, wt) = c;
    let mut rng = SplitMix64::new(seed);
    let slots = tokens * top_k;
    let rows = slots + 5;
    let mut perm: Vec<u32> = (0..rows as u32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let slot_row: Vec<u32> = (0..slots).map(|s| if rng.below(4) == 0 { NOT_LOCAL } else { perm[s] }).collect();
    let o: Vec<u16> = (0..rows * hidden)
        .map(|_| {
            let v = (rng.next_f64() - 0.5) * 2f64.powi(rng.below(16) as i32 - 10);
            if bf16 {
                half::bf16::from_f64(v).to_bits()
            } else {
                half::f16::from_f64(v).to_bits()
            }
        })
        .collect();
    let (w, w_bytes) = weights(&mut rng, slots, wt == Some(true));
    let o_d = Guarded::input(stream, &o.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    let sr_d = Guarded::input(stream, &slot_row.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    let w_d = Guarded::input(stream, &w_bytes);
    let mut y = Guarded::new(stream, 2 * tokens * hidden);
    let mut want = vec![0u16; tokens * hidden];
    for t in 0..tokens {
        for h in 0..hidden {
            let weight = |kk: usize| if wt.is_some() { w[t * top_k + kk] } else { 1.0 };
            let s = combine_sum(
                &slot_row[t * top_k..(t + 1) * top_k],
                rows as u32,
                weight,
                |r| o[r as usize * hidden + h],
                bf16,
            );
            want[t * hidden + h] =
                if bf16 { half::bf16::from_f32(s).to_bits() } else { half::f16::from_f32(s).to_bits() };
        }
    }
    for poison in POISONS {
        y.poison(stream, poison);
        let views = CombineViews {
            o: o_d.view(stream, rows * hidden),
            slot_row: sr_d.view(stream, slots),
            weights: wt.map(|_| w_d.view(stream, slots)),
            weights_type: if wt == Some(true) { WeightType::Bf16 } else { WeightType::F32 },
            y: y.view(stream, tokens * hidden),
            bf16,
        };
        // SAFETY: live buffers of these lengths, kept until the synchronizing read below.
        unsafe { k.combine(stream, tokens, top_k, hidden, views).unwrap() };
        let what = format!("combine {c:?} seed {seed} poison {poison:#x}");
        let got: Vec<u16> = y.body(stream, &what).chunks(2).map(|b| u16::from_le_bytes([b[0], b[1]])).collect();
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            panic!("{what}: y[{}, {}] = {:#06x}, want {:#06x}", i / hidden, i % hidden, got[i], want[i]);
        }
    }
}

#[test]
#[ignore = "needs an sm_90a or sm_100a GPU"]
fn gpu_moe_combine_matches_the_reference() {
    let gpu = require_any_gpu();
    let k = BlockKernels::new(&gpu).unwrap();
    let stream = gpu.context().default_stream();
    let cases: [CombineCase; 6] = [
        (1, 1, 64, false, None),
        (9, 4, 128, false, Some(false)),
        (33, 8, 2048, true, Some(true)),
        (64, 8, 7168, true, Some(false)),
        (500, 2, 4096, false, None),
        (4096, 8, 1024, true, Some(true)),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        combine_case(&k, &stream, c, 400 + i as u64);
    }
}
