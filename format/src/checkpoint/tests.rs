//! Checkpoints built in memory in both conventions from the same quantized experts, loaded back.

use safetensors::serialize;
use safetensors::tensor::TensorView;

use super::*;
use crate::codec::E4M3_NAN;
use crate::quantize::{global_scale_for_amax, quantize_with_global_scale};
use crate::rng::SplitMix64;

const PREFIX: &str = "model.layers.1.block_sparse_moe";
/// Intermediate (I) and hidden (H) sizes: w1, w3 are `[I, H]`, w2 is `[H, I]`.
const I: usize = 64;
const H: usize = 128;

/// One expert's quantized source matrices and input dequantization scales (w1, w3, w2).
struct Source {
    gate: Nvfp4Matrix,
    up: Nvfp4Matrix,
    down: Nvfp4Matrix,
    inputs: [f32; 3],
}

fn normal(rng: &mut SplitMix64, n: usize, amplitude: f64) -> Vec<f32> {
    (0..n).map(|_| (rng.normal() * amplitude) as f32).collect()
}

fn amax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Random experts; `up_global(g)` picks w3's global scale from w1's (the recipe shares one).
fn experts(n: usize, seed: u64, up_global: impl Fn(f32) -> f32) -> Vec<Source> {
    let mut rng = SplitMix64::new(seed);
    (0..n)
        .map(|e| {
            let amplitude = 0.5 + e as f64;
            let gate = normal(&mut rng, I * H, amplitude);
            let up = normal(&mut rng, I * H, amplitude);
            let down = normal(&mut rng, H * I, amplitude);
            let g13 = global_scale_for_amax(amax(&gate).max(amax(&up)));
            let g2 = global_scale_for_amax(amax(&down));
            Source {
                gate: quantize_with_global_scale(&gate, I, H, g13).unwrap(),
                up: quantize_with_global_scale(&up, I, H, up_global(g13)).unwrap(),
                down: quantize_with_global_scale(&down, H, I, g2).unwrap(),
                inputs: [0.01 * (e + 1) as f32, 0.02 * (e + 1) as f32, 0.03 * (e + 1) as f32],
            }
        })
        .collect()
}

/// Owned tensors: (name, dtype, shape, bytes).
type Tensors = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

fn stored(convention: Convention, dequant: f32) -> f32 {
    match convention {
        Convention::ModelOpt => dequant,
        Convention::CompressedTensors => (1.0 / f64::from(dequant)) as f32,
    }
}

/// The tensors of `sources` as experts `first..`, in `convention`.
fn tensors(sources: &[Source], first: usize, convention: Convention) -> Tensors {
    let mut out = Tensors::new();
    for (e, s) in sources.iter().enumerate() {
        for (proj, m, input) in [("w1", &s.gate, s.inputs[0]), ("w3", &s.up, s.inputs[1]), ("w2", &s.down, s.inputs[2])]
        {
            let base = format!("{PREFIX}.experts.{}.{proj}", first + e);
            let (rows, k) = (m.rows(), m.k());
            let scalar = |x: f32| stored(convention, x).to_le_bytes().to_vec();
            out.push((
                format!("{base}.{}", convention.values_suffix()),
                Dtype::U8,
                vec![rows, k / 2],
                m.values().to_vec(),
            ));
            out.push((format!("{base}.weight_scale"), Dtype::F8_E4M3, vec![rows, k / 16], m.plain_scales()));
            out.push((
                format!("{base}.{}", convention.weight_global_suffix()),
                Dtype::F32,
                vec![],
                scalar(m.global_scale()),
            ));
            out.push((format!("{base}.{}", convention.input_scale_suffix()), Dtype::F32, vec![1], scalar(input)));
        }
    }
    out
}

fn bytes(t: &Tensors) -> Vec<u8> {
    let views = t
        .iter()
        .map(|(name, dtype, shape, data)| (name.clone(), TensorView::new(*dtype, shape.clone(), data).unwrap()));
    serialize(views, None).unwrap()
}

fn load(bytes: &[u8], options: &LoadOptions<'_>) -> Result<LoadedExperts, CheckpointError> {
    Checkpoint::parse(bytes)?.load_experts(options)
}

fn options(convention: Convention, experts: Range<usize>) -> LoadOptions<'static> {
    LoadOptions::new(PREFIX, convention, experts)
}

fn find<'t>(t: &'t mut Tensors, suffix: &str) -> &'t mut (String, Dtype, Vec<usize>, Vec<u8>) {
    t.iter_mut().find(|(name, ..)| name.ends_with(suffix)).unwrap()
}

/// The expected w13 (gate rows then up rows), dequantized in f64.
fn w13_source(s: &Source) -> Vec<f64> {
    let mut v = s.gate.dequantize_f64();
    v.extend(s.up.dequantize_f64());
    v
}

#[test]
fn modelopt_loads_the_source_exactly() {
    let sources = experts(3, 1, |g| g);
    let loaded =
        load(&bytes(&tensors(&sources, 0, Convention::ModelOpt)), &options(Convention::ModelOpt, 0..3)).unwrap();
    assert_eq!(loaded.first_expert, 0);
    assert_eq!(loaded.experts.len(), 3);
    for (e, (got, s)) in loaded.experts.iter().zip(&sources).enumerate() {
        assert_eq!(got.expert, e);
        assert_eq!((got.w13.rows, got.w13.k, got.w2.rows, got.w2.k), (2 * I, H, H, I));
        assert_eq!(got.w13.to_matrix().unwrap().dequantize_f64(), w13_source(s));
        assert_eq!(got.w2.to_matrix().unwrap(), s.down);
        assert_eq!(got.w13_input_scale, s.inputs[0].max(s.inputs[1]));
        assert_eq!(got.w2_input_scale, s.inputs[2]);
    }
    assert_eq!(loaded.w13_alphas()[1], loaded.experts[1].w13.global_scale * loaded.experts[1].w13_input_scale);
}

#[test]
fn both_conventions_give_the_same_weights() {
    let sources = experts(3, 2, |g| g);
    let modelopt =
        load(&bytes(&tensors(&sources, 0, Convention::ModelOpt)), &options(Convention::ModelOpt, 0..3)).unwrap();
    let ct = load(
        &bytes(&tensors(&sources, 0, Convention::CompressedTensors)),
        &options(Convention::CompressedTensors, 0..3),
    )
    .unwrap();
    for (a, b) in modelopt.experts.iter().zip(&ct.experts) {
        // Values and block scales are stored identically; only the fp32 scales are inverted.
        assert_eq!((&a.w13.values, &a.w13.plain_scales), (&b.w13.values, &b.w13.plain_scales));
        assert_eq!((&a.w2.values, &a.w2.plain_scales), (&b.w2.values, &b.w2.plain_scales));
        // Two reciprocals, each rounded once to f32, land within one ulp of the original.
        for (x, y) in [
            (a.w13.global_scale, b.w13.global_scale),
            (a.w2.global_scale, b.w2.global_scale),
            (a.w13_input_scale, b.w13_input_scale),
            (a.w2_input_scale, b.w2_input_scale),
        ] {
            assert!((x - y).abs() <= x * f32::EPSILON, "{x} vs {y}");
        }
    }
}

#[test]
fn power_of_two_scales_load_bit_identically_in_both_conventions() {
    let mut sources = experts(2, 3, |g| g);
    for s in &mut sources {
        s.gate.set_global_scale(2f32.powi(-9));
        s.up.set_global_scale(2f32.powi(-9));
        s.down.set_global_scale(2f32.powi(-7));
        s.inputs = [0.125, 0.0625, 0.25];
    }
    let modelopt =
        load(&bytes(&tensors(&sources, 0, Convention::ModelOpt)), &options(Convention::ModelOpt, 0..2)).unwrap();
    let ct = load(
        &bytes(&tensors(&sources, 0, Convention::CompressedTensors)),
        &options(Convention::CompressedTensors, 0..2),
    )
    .unwrap();
    assert_eq!(modelopt, ct);
    assert_eq!(modelopt.experts[1].w13.to_matrix().unwrap().dequantize_f64(), w13_source(&sources[1]));
}

#[test]
fn a_wrong_convention_is_caught_by_name_and_would_scale_by_the_global_squared() {
    let sources = experts(1, 4, |g| g);
    let ct_tensors = tensors(&sources, 0, Convention::CompressedTensors);
    // The names differ, so reading compressed-tensors as ModelOpt finds no `weight`.
    let err = load(&bytes(&ct_tensors), &options(Convention::ModelOpt, 0..1)).unwrap_err();
    assert_eq!(err, CheckpointError::MissingTensor { name: format!("{PREFIX}.experts.0.w1.weight") });
    // Had the names been ModelOpt's over compressed-tensors' values, every weight would be off
    // by 1/g²: the stored 6·448/amax taken as the multiplier amax/(6·448).
    let mut mislabelled = ct_tensors;
    for (name, ..) in &mut mislabelled {
        *name = name
            .replace("weight_packed", "weight")
            .replace("weight_global_scale", "weight_scale_2")
            .replace("input_global_scale", "input_scale");
    }
    let wrong = load(&bytes(&mislabelled), &options(Convention::ModelOpt, 0..1)).unwrap();
    let g = sources[0].gate.global_scale();
    let ratio = f64::from(wrong.experts[0].w13.global_scale) / f64::from(g);
    let expected = 1.0 / (f64::from(g) * f64::from(g));
    assert!(ratio > 1e5 && (ratio / expected - 1.0).abs() < 1e-6, "ratio {ratio}, expected {expected}");
}

#[test]
fn differing_gate_and_up_scales_are_refused_by_default() {
    let sources = experts(2, 5, |g| g / 2.0);
    let file = bytes(&tensors(&sources, 0, Convention::ModelOpt));
    let err = load(&file, &options(Convention::ModelOpt, 0..2)).unwrap_err();
    let g = sources[0].gate.global_scale();
    assert_eq!(err, CheckpointError::GlobalScalesDiffer { expert: 0, w1: g, w3: g / 2.0 });
    assert!(err.to_string().contains("expert 0"), "{err}");
}

#[test]
fn a_power_of_two_ratio_reconciles_exactly() {
    let sources = experts(2, 6, |g| g / 2.0);
    let [modelopt, ct] = [Convention::ModelOpt, Convention::CompressedTensors].map(|convention| {
        let file = bytes(&tensors(&sources, 0, convention));
        load(&file, &options(convention, 0..2).with_reconcile(Reconcile::Exact)).unwrap()
    });
    for ((got, s), other) in modelopt.experts.iter().zip(&sources).zip(&ct.experts) {
        assert_eq!(got.w13.global_scale, s.gate.global_scale());
        assert_eq!(got.w13.to_matrix().unwrap().dequantize_f64(), w13_source(s));
        // compressed-tensors: the same codes; the shared scale within the reciprocals' ulp.
        assert_eq!((&got.w13.values, &got.w13.plain_scales), (&other.w13.values, &other.w13.plain_scales));
        assert!((got.w13.global_scale - other.w13.global_scale).abs() <= got.w13.global_scale * f32::EPSILON);
    }
}

#[test]
fn other_ratios_are_not_exact_but_round_within_half_an_e4m3_step() {
    let sources = experts(2, 7, |g| g * 0.7);
    let file = bytes(&tensors(&sources, 0, Convention::ModelOpt));
    let err = load(&file, &options(Convention::ModelOpt, 0..2).with_reconcile(Reconcile::Exact)).unwrap_err();
    assert!(matches!(&err, CheckpointError::NotExact { expert: 0, name, .. } if name.ends_with("w3.weight_scale")));

    let loaded = load(&file, &options(Convention::ModelOpt, 0..2).with_reconcile(Reconcile::Round)).unwrap();
    for (got, s) in loaded.experts.iter().zip(&sources) {
        let shared = f64::from(got.w13.global_scale);
        assert_eq!(shared, f64::from(s.gate.global_scale()));
        let m = got.w13.to_matrix().unwrap();
        // The gate half is untouched.
        assert_eq!(m.dequantize_f64()[..I * H], s.gate.dequantize_f64()[..]);
        // Each up block scale s·r moved by at most max(2⁻⁴·s·r, 2⁻¹⁰).
        let r = f64::from(s.up.global_scale()) / shared;
        for i in 0..I {
            for j in 0..H / 16 {
                let want = f64::from(e4m3_to_f32(s.up.scale_code(i, j))) * r;
                let got = f64::from(e4m3_to_f32(m.scale_code(I + i, j)));
                assert!((got - want).abs() <= (want / 16.0).max(2f64.powi(-10)), "({i}, {j}): {got} vs {want}");
            }
        }
    }
}

#[test]
fn expert_parallel_ranks_read_only_their_experts() {
    let sources = experts(4, 8, |g| g);
    let all = load(&bytes(&tensors(&sources, 0, Convention::ModelOpt)), &options(Convention::ModelOpt, 0..4)).unwrap();
    let part = load(&bytes(&tensors(&sources, 0, Convention::ModelOpt)), &options(Convention::ModelOpt, 1..3)).unwrap();
    assert_eq!(part.first_expert, 1);
    assert_eq!(part.experts, all.experts[1..3]);
    assert_eq!(part.w13_input_scales(), all.w13_input_scales()[1..3]);
    assert_eq!(part.w2_input_scales(), all.w2_input_scales()[1..3]);
    // A file holding only experts 2 and 3 serves the rank that owns them, and only that rank.
    let local = bytes(&tensors(&sources[2..], 2, Convention::CompressedTensors));
    let got = load(&local, &options(Convention::CompressedTensors, 2..4)).unwrap();
    assert_eq!(got.experts.iter().map(|e| e.expert).collect::<Vec<_>>(), [2, 3]);
    assert_eq!(got.experts[0].w13.values, all.experts[2].w13.values);
    let err = load(&local, &options(Convention::CompressedTensors, 1..3)).unwrap_err();
    assert!(matches!(err, CheckpointError::MissingTensor { name } if name.contains("experts.1.w1")));
}

#[test]
fn shards_are_searched_and_duplicates_refused() {
    let sources = experts(2, 9, |g| g);
    let t = tensors(&sources, 0, Convention::ModelOpt);
    let (a, b) = t.split_at(t.len() / 2 + 1);
    let (a, b) = (bytes(&a.to_vec()), bytes(&b.to_vec()));
    let whole = load(&bytes(&t), &options(Convention::ModelOpt, 0..2)).unwrap();
    let sharded = Checkpoint::parse_shards(&[&a, &b]).unwrap().load_experts(&options(Convention::ModelOpt, 0..2));
    assert_eq!(sharded.unwrap(), whole);
    let err = Checkpoint::parse_shards(&[&a, &a]).unwrap().load_experts(&options(Convention::ModelOpt, 0..2));
    assert!(matches!(err, Err(CheckpointError::DuplicateTensor { .. })));
}

#[test]
fn projection_names_are_the_callers() {
    let sources = experts(1, 10, |g| g);
    let mut t = tensors(&sources, 0, Convention::ModelOpt);
    for (name, ..) in &mut t {
        *name = name.replace(".w1.", ".gate_proj.").replace(".w3.", ".up_proj.").replace(".w2.", ".down_proj.");
    }
    let opts = options(Convention::ModelOpt, 0..1).with_projections(Projections::GATE_UP_DOWN);
    let got = load(&bytes(&t), &opts).unwrap();
    assert_eq!(got.experts[0].w13.to_matrix().unwrap().dequantize_f64(), w13_source(&sources[0]));
}

/// Loads `t` after `edit`, expecting an error whose message names the tensor it returns.
fn broken(edit: impl FnOnce(&mut Tensors)) -> CheckpointError {
    let mut t = tensors(&experts(1, 11, |g| g), 0, Convention::CompressedTensors);
    edit(&mut t);
    load(&bytes(&t), &options(Convention::CompressedTensors, 0..1)).unwrap_err()
}

#[test]
fn bad_files_give_typed_errors_naming_the_tensor() {
    let base = format!("{PREFIX}.experts.0");
    let name = |s: &str| format!("{base}.{s}");

    let err = broken(|t| t.retain(|(n, ..)| !n.ends_with("w3.weight_scale")));
    assert_eq!(err, CheckpointError::MissingTensor { name: name("w3.weight_scale") });
    assert!(err.to_string().contains(&name("w3.weight_scale")));

    let err = broken(|t| find(t, "w2.weight_scale").1 = Dtype::U8);
    assert_eq!(
        err,
        CheckpointError::WrongDtype { name: name("w2.weight_scale"), expected: "F8_E4M3", found: "U8".to_string() }
    );

    let err = broken(|t| {
        let x = find(t, "w1.weight_global_scale");
        (x.1, x.2) = (Dtype::U8, vec![4]);
    });
    assert!(matches!(&err, CheckpointError::WrongDtype { name: n, .. } if *n == name("w1.weight_global_scale")));

    let err = broken(|t| find(t, "w1.weight_scale").2 = vec![2 * I, H / 32]);
    assert!(matches!(&err, CheckpointError::WrongShape { name: n, .. } if *n == name("w1.weight_scale")), "{err}");
    assert!(err.to_string().contains("[N, K/16] = [64, 8]"), "{err}");

    let err = broken(|t| find(t, "w1.weight_packed").2 = vec![I, 2, H / 4]);
    assert!(matches!(&err, CheckpointError::WrongShape { name: n, .. } if *n == name("w1.weight_packed")));

    let err = broken(|t| {
        let x = find(t, "w2.input_global_scale");
        (x.2, x.3) = (vec![2], [1.0f32.to_le_bytes(), 2.0f32.to_le_bytes()].concat());
    });
    assert!(matches!(&err, CheckpointError::WrongShape { name: n, .. } if *n == name("w2.input_global_scale")));

    // w3 with a different I than w1.
    let err = broken(|t| {
        let x = find(t, "w3.weight_packed");
        (x.2, x.3) = (vec![I / 2, H / 2], x.3[..I * H / 4].to_vec());
        let s = find(t, "w3.weight_scale");
        (s.2, s.3) = (vec![I / 2, H / 16], s.3[..I * H / 32].to_vec());
    });
    assert!(matches!(&err, CheckpointError::WrongShape { name: n, .. } if *n == name("w3.weight_packed")), "{err}");

    // K = 96 is a multiple of 16 but not of 64.
    let err = broken(|t| {
        let x = find(t, "w1.weight_packed");
        (x.2, x.3) = (vec![I, 48], vec![0; I * 48]);
    });
    assert_eq!(err, CheckpointError::BadK { name: name("w1.weight_packed"), k: 96, multiple: 64 });

    for bad in [0.0f32, -1.0, f32::NAN, f32::INFINITY, f32::from_bits(1)] {
        let err = broken(|t| find(t, "w2.weight_global_scale").3 = bad.to_le_bytes().to_vec());
        // The smallest subnormal is finite and positive, but its reciprocal is not.
        assert!(
            matches!(&err, CheckpointError::BadScale { name: n, value } if *n == name("w2.weight_global_scale") && value.to_bits() == bad.to_bits()),
            "{bad}: {err}"
        );
        assert!(err.to_string().contains("w2.weight_global_scale"));
    }

    let err = broken(|t| find(t, "w1.weight_scale").3[8 + 3] = E4M3_NAN);
    assert_eq!(err, CheckpointError::NanBlockScale { name: name("w1.weight_scale"), row: 1, col: 3 });

    let err = Checkpoint::parse(b"not a safetensors file").unwrap_err();
    assert!(matches!(err, CheckpointError::Parse { shard: 0, .. }), "{err}");
}
