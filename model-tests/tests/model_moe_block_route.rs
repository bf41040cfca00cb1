//! `moe_route`, the multi-CTA routing (`moe_route_count`, `moe_route_scan`, `moe_route_scatter`)
//! and `moe_combine` (`kernel/src/moe_block.rs`) in the device model, on both architectures, with
//! the parameters the library's own checks return (`route_params`, `route_params_on`,
//! `combine_params`): random router outputs with ids of -1 and of other ranks' experts, repeated
//! ids in one token, experts with no token and one expert taking every token, T = 0 and 1, int32
//! and int64 ids, f32 and bf16 weights, E from 1 to 4096; combines of f16 and bf16 rows with
//! f32, bf16 or no weights on grids small enough that threads grid-stride. The multi-CTA path
//! runs on the chunk count `route_params` picks past 4096 slots and on forced counts over fewer
//! slots, with chunks that end inside a warp, on a warp or tile boundary, empty last chunks and
//! one-slot chunks. Every output (and the scratch) is poisoned first and compared exactly with `nvfp4_gemm_abi::moe_block`'s references (rows of
//! `row_token` / `row_weight` past `offsets[E]` must stay poisoned).

use nvfp4_format::SplitMix64;
use nvfp4_gemm::moe_block::{
    combine_params, route_params, route_params_on, route_scratch_len, CombineViews, IdType, RouteViews, Routing,
    WeightType,
};
use nvfp4_gemm_abi::moe_block::{
    combine_items, combine_launch, combine_sum, half_bits_to_f32, route_chunk_launch, route_launch, route_reference,
    route_scratch_words, RouteParams, NOT_LOCAL, ROUTE_MULTI_CTA_ABOVE,
};
use nvfp4_gemm_kernel::moe_block::{moe_combine, moe_route, moe_route_count, moe_route_scan, moe_route_scatter};
use nvfp4_gemm_model::Arch;
use nvfp4_gemm_model_tests::*;

const POISON: u32 = 0xA5A5_A5A5;

/// How a case draws its ids.
#[derive(Clone, Copy, Debug)]
enum Ids {
    /// Uniform over the local range widened by 3 on each side, a quarter of them -1.
    Mixed,
    /// Every slot to local expert 0 ... or the given one.
    One(u32),
    /// Only the even local experts (the odd ones get no token), none outside.
    Even,
}

#[derive(Clone, Copy, Debug)]
struct Case {
    /// The routing path: `None` as `route_params` picks, `Some(chunks)` forced
    /// (`route_params_on`; 0 the one CTA).
    chunks: Option<u32>,
    tokens: usize,
    top_k: usize,
    experts: u32,
    first: i64,
    ids: Ids,
    i64_ids: bool,
    bf16_weights: bool,
    row_weight: bool,
}

fn draw_ids(rng: &mut SplitMix64, c: &Case) -> Vec<i64> {
    (0..c.tokens * c.top_k)
        .map(|_| match c.ids {
            Ids::Mixed => {
                if rng.below(4) == 0 {
                    -1
                } else {
                    c.first - 3 + rng.below(c.experts as u64 + 6) as i64
                }
            }
            Ids::One(e) => c.first + e as i64,
            Ids::Even => c.first + 2 * rng.below(c.experts.div_ceil(2) as u64) as i64,
        })
        .collect()
}

/// Random finite router weights as f32 values exactly representable in the weights' type, and
/// their bytes.
fn draw_weights(rng: &mut SplitMix64, n: usize, bf16: bool) -> (Vec<f32>, Vec<u8>) {
    let mut values = vec![];
    let mut bytes = vec![];
    for _ in 0..n {
        let v = (rng.next_f64() * 2.0 - 0.25) as f32;
        if bf16 {
            let b = half::bf16::from_f32(v).to_bits();
            values.push(half_bits_to_f32(b, true));
            bytes.extend_from_slice(&b.to_le_bytes());
        } else {
            values.push(v);
            bytes.extend_from_slice(&v.to_le_bytes());
        }
    }
    (values, bytes)
}

fn u32s(b: &DeviceBuf, n: usize) -> Vec<u32> {
    b.bytes()[..4 * n].chunks(4).map(|w| u32::from_le_bytes(w.try_into().unwrap())).collect()
}

fn poisoned(n: usize) -> DeviceBuf {
    DeviceBuf::from_bytes(&POISON.to_le_bytes().repeat(n))
}

/// Runs the routing `params` name in the model: `moe_route`, or the three launches of the
/// multi-CTA path in order.
fn run_route(arch: Arch, params: RouteParams, what: &str) {
    let model = ModelRun::default();
    let run = |name: &str, geometry, kernel: unsafe fn(RouteParams)| {
        let cfg = launch_config(arch, geometry, 1, &model);
        // SAFETY: the library's checks passed for these buffers, which live past the launch;
        // the launches run in order.
        nvfp4_gemm_model::launch(&cfg, || unsafe { kernel(params) })
            .unwrap_or_else(|err| panic!("{what}: {name} failed in the model: {err}"));
    };
    if params.chunks == 0 {
        run("moe_route", route_launch(), moe_route);
    } else {
        run("moe_route_count", route_chunk_launch(params.chunks), moe_route_count);
        run("moe_route_scan", route_launch(), moe_route_scan);
        run("moe_route_scatter", route_chunk_launch(params.chunks), moe_route_scatter);
    }
}

fn route_case(c: Case, arch: Arch, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let slots = c.tokens * c.top_k;
    let ids = draw_ids(&mut rng, &c);
    let (weights, weight_bytes) = draw_weights(&mut rng, slots, c.bf16_weights);
    let id_bytes: Vec<u8> = if c.i64_ids {
        ids.iter().flat_map(|v| v.to_le_bytes()).collect()
    } else {
        ids.iter().flat_map(|&v| (v as i32).to_le_bytes()).collect()
    };
    let (ids_buf, w_buf) = (DeviceBuf::from_bytes(&id_bytes), DeviceBuf::from_bytes(&weight_bytes));
    let e = c.experts as usize;
    let (offsets, slot_row, row_token, row_weight) =
        (poisoned(e + 1), poisoned(slots), poisoned(slots), poisoned(slots));
    let routing = Routing { tokens: c.tokens, top_k: c.top_k, first_expert: c.first, experts: e };
    let scratch_len = match c.chunks {
        None => route_scratch_len(routing),
        Some(chunks) => route_scratch_words(chunks, c.experts) as usize,
    };
    let scratch = poisoned(scratch_len);
    let views = RouteViews {
        ids: ids_buf.view(slots),
        ids_type: if c.i64_ids { IdType::I64 } else { IdType::I32 },
        weights: Some(w_buf.view(slots)),
        weights_type: if c.bf16_weights { WeightType::Bf16 } else { WeightType::F32 },
        offsets: offsets.view(e + 1),
        slot_row: slot_row.view(slots),
        row_token: row_token.view(slots),
        row_weight: c.row_weight.then(|| row_weight.view(slots)),
        scratch: scratch.view(scratch_len),
    };
    let params = match c.chunks {
        None => route_params(routing, views),
        Some(chunks) => route_params_on(routing, views, chunks),
    }
    .expect("valid arguments");
    let what = format!("{c:?} {arch:?} seed {seed} on {} chunks", params.chunks);
    run_route(arch, params, &what);

    let (mut w_off, mut w_sr, mut w_rt) = (vec![0u32; e + 1], vec![0u32; slots], vec![POISON; slots]);
    route_reference(|s| ids[s], slots, c.top_k, c.first, c.experts, &mut w_off, &mut w_sr, &mut w_rt);
    assert_eq!(u32s(&offsets, e + 1), w_off, "{what}: offsets");
    assert_eq!(u32s(&slot_row, slots), w_sr, "{what}: slot_row");
    assert_eq!(u32s(&row_token, slots), w_rt, "{what}: row_token (rows past offsets[E] poisoned)");
    let mut w_rw = vec![POISON; slots];
    if c.row_weight {
        for (s, &r) in w_sr.iter().enumerate() {
            if r != NOT_LOCAL {
                w_rw[r as usize] = weights[s].to_bits();
            }
        }
    }
    assert_eq!(u32s(&row_weight, slots), w_rw, "{what}: row_weight");
    assert_eq!(ids_buf.bytes(), &id_bytes[..], "{what}: ids written");
    assert_eq!(w_buf.bytes(), &weight_bytes[..], "{what}: weights written");
}

#[test]
fn model_moe_route_matches_the_reference() {
    let base = Case {
        chunks: None,
        tokens: 37,
        top_k: 4,
        experts: 8,
        first: 16,
        ids: Ids::Mixed,
        i64_ids: false,
        bf16_weights: false,
        row_weight: true,
    };
    let cases = [
        base,
        Case { i64_ids: true, bf16_weights: true, first: -2, ..base },
        Case { tokens: 0, ..base },
        Case { tokens: 1, top_k: 1, ..base },
        Case { tokens: 1, top_k: 8, experts: 1, first: 0, ..base },
        Case { experts: 1, first: 3, row_weight: false, ..base },
        Case { tokens: 300, top_k: 8, experts: 5, ids: Ids::One(3), ..base },
        Case { tokens: 700, top_k: 4, experts: 64, first: 60, i64_ids: true, ..base },
        Case { tokens: 260, top_k: 6, experts: 40, ids: Ids::Even, i64_ids: true, ..base },
        Case { tokens: 180, top_k: 8, experts: 256, first: 256, bf16_weights: true, ..base },
        Case { tokens: 64, top_k: 2, experts: 4096, first: 1 << 40, i64_ids: true, ..base },
        Case { tokens: 50, top_k: 3, experts: 4096, first: 0, row_weight: false, ..base },
    ];
    for (i, c) in cases.into_iter().enumerate() {
        let arch = if i % 2 == 0 { Arch::Sm90a } else { Arch::Sm100a };
        route_case(c, arch, 100 + i as u64);
    }
}

/// The multi-CTA path against the same reference: on the chunk count `route_params` picks just
/// past [`ROUTE_MULTI_CTA_ABOVE`] slots, and on forced chunk counts over fewer slots (chunks of
/// 1, 31, 32, 33, 256 and 257 slots and sizes that leave the last chunks short or empty; few
/// chunks each: the model's time grows with the CTAs of a grid).
#[test]
fn model_moe_route_multi_cta_matches_the_reference() {
    let base = Case {
        chunks: Some(3),
        tokens: 37,
        top_k: 4,
        experts: 8,
        first: 16,
        ids: Ids::Mixed,
        i64_ids: false,
        bf16_weights: false,
        row_weight: true,
    };
    let auto = ROUTE_MULTI_CTA_ABOVE as usize + 1;
    let cases = [
        // 148 slots: chunks of 50, 50, 48.
        base,
        Case { chunks: Some(1), i64_ids: true, bf16_weights: true, first: -2, ..base },
        Case { chunks: Some(4), tokens: 0, ..base },
        // One slot per chunk, the last two chunks empty.
        Case { chunks: Some(6), tokens: 4, top_k: 1, ..base },
        // Chunks of 31, 32 and 33 slots (the last one short).
        Case { chunks: Some(9), tokens: 31, top_k: 9, experts: 1, first: 0, row_weight: false, ..base },
        Case { chunks: Some(8), tokens: 32, top_k: 8, experts: 5, ids: Ids::One(4), ..base },
        Case { chunks: Some(4), tokens: 33, top_k: 4, experts: 256, first: 256, bf16_weights: true, ..base },
        // Chunks of 256 and 257 slots: whole tiles, and one slot into the next.
        Case { chunks: Some(3), tokens: 96, top_k: 8, experts: 40, ids: Ids::Even, i64_ids: true, ..base },
        Case { chunks: Some(5), tokens: 257, top_k: 5, experts: 4096, first: 1 << 40, i64_ids: true, ..base },
        Case { chunks: Some(2), tokens: 300, top_k: 2, experts: 4096, first: 0, row_weight: false, ..base },
        // As the library picks: 4097 slots over 5 chunks of 820.
        Case { chunks: None, tokens: auto, top_k: 1, experts: 256, first: 0, bf16_weights: true, ..base },
    ];
    for (i, c) in cases.into_iter().enumerate() {
        let arch = if i % 2 == 0 { Arch::Sm90a } else { Arch::Sm100a };
        route_case(c, arch, 400 + i as u64);
    }
}

/// Random finite 16-bit values (either sign, magnitudes 2⁻¹⁰ .. 2⁶, some zeros).
fn draw_half(rng: &mut SplitMix64, bf16: bool) -> u16 {
    let v = if rng.below(16) == 0 { 0.0 } else { (rng.next_f64() - 0.5) * 2f64.powi(rng.below(16) as i32 - 10) };
    if bf16 {
        half::bf16::from_f64(v).to_bits()
    } else {
        half::f16::from_f64(v).to_bits()
    }
}

#[derive(Clone, Copy, Debug)]
struct CombineCase {
    tokens: usize,
    top_k: usize,
    hidden: usize,
    bf16: bool,
    /// None: no weights (every weight 1); Some(bf16 weights).
    weights: Option<bool>,
    max_ctas: u32,
}

fn combine_case(c: CombineCase, arch: Arch, seed: u64) {
    let mut rng = SplitMix64::new(seed);
    let slots = c.tokens * c.top_k;
    let rows = slots + 3;
    // A routing: each slot local with probability 3/4, rows a random permutation (the combine
    // does not care whether they come from a sort).
    let mut perm: Vec<u32> = (0..rows as u32).collect();
    for i in (1..perm.len()).rev() {
        perm.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let slot_row: Vec<u32> = (0..slots).map(|s| if rng.below(4) == 0 { NOT_LOCAL } else { perm[s] }).collect();
    let o: Vec<u16> = (0..rows * c.hidden).map(|_| draw_half(&mut rng, c.bf16)).collect();
    let (weights, weight_bytes) = draw_weights(&mut rng, slots, c.weights == Some(true));
    let o_buf = DeviceBuf::from_bytes(&o.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    let sr_buf = DeviceBuf::from_bytes(&slot_row.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    let w_buf = DeviceBuf::from_bytes(&weight_bytes);
    let y = DeviceBuf::from_bytes(&[0xA5u8].repeat(2 * c.tokens * c.hidden));
    let views = CombineViews {
        o: o_buf.view(rows * c.hidden),
        slot_row: sr_buf.view(slots),
        weights: c.weights.map(|_| w_buf.view(slots)),
        weights_type: if c.weights == Some(true) { WeightType::Bf16 } else { WeightType::F32 },
        y: y.view(c.tokens * c.hidden),
        bf16: c.bf16,
    };
    let params = combine_params(c.tokens, c.top_k, c.hidden, views).expect("valid arguments").expect("tokens");
    let geometry = combine_launch(combine_items(params.tokens, params.hidden), c.max_ctas);
    let cfg = launch_config(arch, geometry, 1, &ModelRun::default());
    // SAFETY: the library's checks passed for these buffers, which live past the launch.
    nvfp4_gemm_model::launch(&cfg, || unsafe { moe_combine(params) })
        .unwrap_or_else(|err| panic!("{c:?} {arch:?}: moe_combine failed in the model: {err}"));

    let got: Vec<u16> = y.bytes().chunks(2).map(|w| u16::from_le_bytes([w[0], w[1]])).collect();
    for t in 0..c.tokens {
        let rows_of = &slot_row[t * c.top_k..(t + 1) * c.top_k];
        for h in 0..c.hidden {
            let w = |k: usize| if c.weights.is_some() { weights[t * c.top_k + k] } else { 1.0 };
            let sum = combine_sum(rows_of, rows as u32, w, |r| o[r as usize * c.hidden + h], c.bf16);
            let want = if c.bf16 { half::bf16::from_f32(sum).to_bits() } else { half::f16::from_f32(sum).to_bits() };
            assert_eq!(
                got[t * c.hidden + h],
                want,
                "{c:?} {arch:?} seed {seed} on {} CTAs: y[{t}, {h}] (sum {sum:e})",
                geometry.grid
            );
        }
    }
}

#[test]
fn model_moe_combine_matches_the_reference() {
    let base = CombineCase { tokens: 9, top_k: 4, hidden: 128, bf16: false, weights: Some(false), max_ctas: 1 };
    let cases = [
        base,
        CombineCase { bf16: true, weights: Some(true), max_ctas: 2, ..base },
        CombineCase { weights: None, hidden: 64, max_ctas: 64, ..base },
        CombineCase { tokens: 1, top_k: 1, hidden: 192, bf16: true, weights: None, ..base },
        CombineCase { tokens: 40, top_k: 8, hidden: 64, max_ctas: 3, ..base },
        CombineCase { tokens: 3, top_k: 2, hidden: 1024, bf16: true, weights: Some(false), max_ctas: 1 },
    ];
    for (i, c) in cases.into_iter().enumerate() {
        let arch = if i % 2 == 0 { Arch::Sm90a } else { Arch::Sm100a };
        combine_case(c, arch, 200 + i as u64);
    }
}

/// Route then combine on one buffer set: a token whose every slot is another rank's gives +0.
#[test]
fn model_moe_route_then_combine_gives_zero_for_tokens_with_no_local_slot() {
    let (tokens, top_k, hidden) = (5usize, 2usize, 64usize);
    let ids: Vec<i32> = vec![0, 1, 9, -1, 1, 1, -1, -1, 0, 9];
    let ids_buf = DeviceBuf::from_bytes(&ids.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>());
    let (offsets, slot_row, row_token) = (poisoned(3), poisoned(10), poisoned(10));
    let views = RouteViews {
        ids: ids_buf.view(10),
        ids_type: IdType::I32,
        weights: None,
        weights_type: WeightType::F32,
        offsets: offsets.view(3),
        slot_row: slot_row.view(10),
        row_token: row_token.view(10),
        row_weight: None,
        scratch: slot_row.view(0),
    };
    let params = route_params(Routing { tokens, top_k, first_expert: 0, experts: 2 }, views).unwrap();
    let cfg = launch_config(Arch::Sm90a, route_launch(), 1, &ModelRun::default());
    // SAFETY: checked buffers, live past the launch.
    nvfp4_gemm_model::launch(&cfg, || unsafe { moe_route(params) }).unwrap();
    assert_eq!(u32s(&offsets, 3), [0, 2, 5]);
    assert_eq!(u32s(&slot_row, 10), [0, 2, NOT_LOCAL, NOT_LOCAL, 3, 4, NOT_LOCAL, NOT_LOCAL, 1, NOT_LOCAL]);
    assert_eq!(u32s(&row_token, 5), [0, 4, 0, 2, 2]);

    // o: row r holds r + 1 everywhere (f16), so y[t] is the sum of its rows' numbers.
    let o: Vec<u8> =
        (0..10 * hidden).flat_map(|i| half::f16::from_f32((i / hidden) as f32 + 1.0).to_bits().to_le_bytes()).collect();
    let o_buf = DeviceBuf::from_bytes(&o);
    let y = DeviceBuf::from_bytes(&[0xFFu8].repeat(2 * tokens * hidden));
    let views = CombineViews {
        o: o_buf.view(10 * hidden),
        slot_row: slot_row.view(10),
        weights: None,
        weights_type: WeightType::F32,
        y: y.view(tokens * hidden),
        bf16: false,
    };
    let params = combine_params(tokens, top_k, hidden, views).unwrap().unwrap();
    let cfg = launch_config(Arch::Sm90a, combine_launch(combine_items(5, 64), 2), 1, &ModelRun::default());
    // SAFETY: checked buffers, live past the launch.
    nvfp4_gemm_model::launch(&cfg, || unsafe { moe_combine(params) }).unwrap();
    let got: Vec<f32> =
        y.bytes().chunks(2).map(|w| half::f16::from_bits(u16::from_le_bytes([w[0], w[1]])).to_f32()).collect();
    for (t, want) in [4.0f32, 0.0, 9.0, 0.0, 2.0].into_iter().enumerate() {
        assert!(got[t * hidden..(t + 1) * hidden].iter().all(|&v| v.to_bits() == want.to_bits()), "token {t}");
    }
}
