//! The file format's round trips and every error path, and the binary's commands, on the CPU (no
//! GPU needed; `run` is checked for its no-GPU message where there is no driver, and for a typed
//! outcome where there is one).

use half::{bf16, f16};
use nvfp4_format::{random_groups, reference_grouped_gemm, GroupShape, InputDistribution, Tolerance};
use nvfp4_gemm_cli::commands::{check_outputs, compute};
use nvfp4_gemm_cli::file::{
    parse_groups, parse_outputs, serialize_groups, serialize_outputs, GroupsFile, Outputs, ScaleLayout,
};
use nvfp4_gemm_cli::CliError;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::PathBuf;
use std::process::Command;

/// One tensor of a hand-made file.
#[derive(Clone)]
struct T {
    name: String,
    dtype: Dtype,
    shape: Vec<usize>,
    data: Vec<u8>,
}

fn t(name: &str, dtype: Dtype, shape: &[usize], data: Vec<u8>) -> T {
    T { name: name.into(), dtype, shape: shape.to_vec(), data }
}

fn file(tensors: &[T]) -> Vec<u8> {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|x| (x.name.clone(), TensorView::new(x.dtype, x.shape.clone(), &x.data).expect("consistent test tensor")))
        .collect();
    safetensors::serialize(views, None).expect("serialize")
}

/// A valid one-group file (m = 4, n = 8, k = 64, plain scales of 1.0) as a tensor list.
fn valid() -> Vec<T> {
    let (m, n, k) = (4, 8, 64);
    vec![
        t("g0.a", Dtype::U8, &[m, k / 2], vec![0x21; m * k / 2]),
        t("g0.a_scale", Dtype::F8_E4M3, &[m, k / 16], vec![0x38; m * k / 16]),
        t("g0.b", Dtype::U8, &[n, k / 2], vec![0x12; n * k / 2]),
        t("g0.b_scale", Dtype::F8_E4M3, &[n, k / 16], vec![0x40; n * k / 16]),
        t("g0.alpha", Dtype::F32, &[], 0.5f32.to_le_bytes().to_vec()),
    ]
}

fn with(mut ts: Vec<T>, name: &str, replacement: Option<T>) -> Vec<T> {
    let pos = ts.iter().position(|x| x.name == name).expect("tensor in the list");
    match replacement {
        Some(r) => ts[pos] = r,
        None => {
            ts.remove(pos);
        }
    }
    ts
}

fn parse_err(ts: &[T]) -> CliError {
    parse_groups(&file(ts)).expect_err("must be rejected")
}

#[test]
fn a_valid_hand_made_file_parses_to_the_expected_values() {
    let parsed = parse_groups(&file(&valid())).unwrap();
    assert_eq!(parsed.shapes(), vec![GroupShape::new(4, 8, 64)]);
    assert_eq!(parsed.scale_layouts, vec![(ScaleLayout::Plain, ScaleLayout::Plain)]);
    let g = &parsed.groups[0];
    assert_eq!(g.alpha, 0.5);
    // 0x21: element 0 = code 1 (0.5), element 1 = code 2 (1.0); scale 1.0.
    assert_eq!(g.a.value(0, 0), 0.5);
    assert_eq!(g.a.value(0, 1), 1.0);
    // 0x12 with scale 2.0: 2.0 and 1.0.
    assert_eq!(g.b.value(7, 62), 2.0);
    assert_eq!(g.b.value(7, 63), 1.0);
    // Every C element: alpha * 32 * (0.5*2 + 1*1) = 0.5 * 64 = 32.
    let c = reference_grouped_gemm(&parsed.groups).unwrap();
    assert!(c[0].data.iter().all(|x| x.to_f32() == 32.0));
}

#[test]
fn generated_files_round_trip_in_both_scale_layouts() {
    let shapes = GroupShape::zip(&[40, 0, 130], &[64, 128, 8], &[128, 64, 256]).unwrap();
    let mut groups = random_groups(&shapes, InputDistribution::FullRange, 7).unwrap();
    groups[2].alpha = 0.25;
    for layout in [ScaleLayout::Plain, ScaleLayout::Blocked] {
        let bytes = serialize_groups(&groups, layout).unwrap();
        let parsed = parse_groups(&bytes).unwrap();
        assert_eq!(parsed.groups, groups, "{layout:?}");
        assert!(parsed.scale_layouts.iter().all(|&(a, b)| a == layout && b == layout));
    }
}

#[test]
fn f4_values_and_u8_scales_are_accepted() {
    let ts = with(valid(), "g0.a", Some(t("g0.a", Dtype::F4, &[4, 64], vec![0x21; 4 * 32])));
    let ts = with(ts, "g0.b_scale", Some(t("g0.b_scale", Dtype::U8, &[8, 4], vec![0x40; 32])));
    let parsed = parse_groups(&file(&ts)).unwrap();
    assert_eq!(parsed, parse_groups(&file(&valid())).unwrap());
}

#[test]
fn blocked_scales_are_told_by_rank() {
    // 1-D of the blocked length (128 rows x 4 columns = 512 bytes for m = 4, k = 64).
    let mut blocked = vec![0u8; 512];
    for r in 0..4 {
        for j in 0..4 {
            blocked[r * 16 + j] = 0x38;
        }
    }
    let ts = with(valid(), "g0.a_scale", Some(t("g0.a_scale", Dtype::F8_E4M3, &[512], blocked)));
    let parsed = parse_groups(&file(&ts)).unwrap();
    assert_eq!(parsed.scale_layouts[0], (ScaleLayout::Blocked, ScaleLayout::Plain));
    assert_eq!(parsed.groups, parse_groups(&file(&valid())).unwrap().groups);
}

#[test]
fn not_a_safetensors_file() {
    for bytes in [&b""[..], b"hello, world", &[0xFF; 64]] {
        assert!(matches!(parse_groups(bytes), Err(CliError::NotSafetensors(_))));
    }
}

#[test]
fn no_groups() {
    assert!(matches!(parse_groups(&file(&[])), Err(CliError::NoGroups)));
    // g{i}.c alone is ignored on input, so this is no groups either.
    let only_c = [t("g0.c", Dtype::F16, &[1, 8], vec![0; 16])];
    assert!(matches!(parse_groups(&file(&only_c)), Err(CliError::NoGroups)));
}

#[test]
fn missing_tensors_are_named() {
    for name in ["g0.a", "g0.a_scale", "g0.b", "g0.b_scale"] {
        match parse_err(&with(valid(), name, None)) {
            CliError::MissingTensor { name: missing, expected } => {
                assert_eq!(missing, name);
                assert!(!expected.is_empty());
            }
            e => panic!("{name}: {e}"),
        }
    }
    // alpha is optional.
    let parsed = parse_groups(&file(&with(valid(), "g0.alpha", None))).unwrap();
    assert_eq!(parsed.groups[0].alpha, 1.0);
    // A gap in the numbering: g0 and g2 but no g1.
    let mut ts = valid();
    ts.extend(valid().into_iter().map(|mut x| {
        x.name = x.name.replace("g0.", "g2.");
        x
    }));
    let e = parse_err(&ts);
    assert!(matches!(&e, CliError::MissingTensor { name, .. } if name == "g1.a"), "{e}");
}

#[test]
fn wrong_dtypes_are_reported_with_the_accepted_ones() {
    let cases = [
        t("g0.a", Dtype::F16, &[4, 16], vec![0; 128]),
        t("g0.b", Dtype::I8, &[8, 32], vec![0; 256]),
        t("g0.a_scale", Dtype::F32, &[4, 1], vec![0; 16]),
        t("g0.b_scale", Dtype::F8_E5M2, &[8, 4], vec![0; 32]),
        t("g0.alpha", Dtype::F64, &[], vec![0; 8]),
    ];
    for case in cases {
        let name = case.name.clone();
        match parse_err(&with(valid(), &name, Some(case.clone()))) {
            CliError::WrongDtype { name: n, got, expected } => {
                assert_eq!(n, name);
                assert_eq!(got, case.dtype.to_string());
                assert!(!expected.is_empty());
            }
            e => panic!("{name}: {e}"),
        }
    }
    let text =
        parse_err(&with(valid(), "g0.a_scale", Some(t("g0.a_scale", Dtype::F32, &[4, 1], vec![0; 16])))).to_string();
    assert!(text.contains("F8_E4M3") && text.contains("float8_e4m3fn"), "{text}");
}

#[test]
fn wrong_shapes_are_reported_with_the_expected_ones() {
    let cases = [
        t("g0.a", Dtype::U8, &[128], vec![0; 128]),
        t("g0.b", Dtype::U8, &[2, 8, 16], vec![0; 256]),
        t("g0.a_scale", Dtype::F8_E4M3, &[4, 5], vec![0x38; 20]),
        t("g0.a_scale", Dtype::F8_E4M3, &[16], vec![0x38; 16]),
        t("g0.b_scale", Dtype::F8_E4M3, &[4, 8], vec![0x38; 32]),
        t("g0.alpha", Dtype::F32, &[2], vec![0; 8]),
    ];
    for case in cases {
        let name = case.name.clone();
        match parse_err(&with(valid(), &name, Some(case.clone()))) {
            CliError::WrongShape { name: n, got, expected } => {
                assert_eq!(n, name);
                assert_eq!(got, case.shape);
                assert!(!expected.is_empty());
            }
            e => panic!("{name} {:?}: {e}", case.shape),
        }
    }
    let text = parse_err(&with(valid(), "g0.a_scale", Some(t("g0.a_scale", Dtype::F8_E4M3, &[4, 5], vec![0; 20]))))
        .to_string();
    assert!(text.contains("[4, 4] (plain) or [512] (128x4 blocked)"), "{text}");
}

#[test]
fn library_rules_are_checked_before_any_gpu() {
    let invalid = |ts: Vec<T>| match parse_err(&ts) {
        CliError::Invalid { name, reason } => (name, reason),
        e => panic!("{e}"),
    };
    // k = 32: not a multiple of 64.
    let ts = vec![
        t("g0.a", Dtype::U8, &[4, 16], vec![0; 64]),
        t("g0.a_scale", Dtype::F8_E4M3, &[4, 2], vec![0x38; 8]),
        t("g0.b", Dtype::U8, &[8, 16], vec![0; 128]),
        t("g0.b_scale", Dtype::F8_E4M3, &[8, 2], vec![0x38; 16]),
    ];
    let (name, reason) = invalid(ts);
    assert_eq!(name, "g0.a");
    assert!(reason.contains("multiple of 64"), "{reason}");
    // A has k = 64, B has k = 128.
    let (name, reason) = invalid(with(valid(), "g0.b", Some(t("g0.b", Dtype::U8, &[8, 64], vec![0; 512]))));
    assert_eq!(name, "g0.b");
    assert!(reason.contains("k = 128") && reason.contains("k = 64"), "{reason}");
    // n = 12.
    let ts = with(valid(), "g0.b", Some(t("g0.b", Dtype::U8, &[12, 32], vec![0; 384])));
    let (name, reason) = invalid(with(ts, "g0.b_scale", Some(t("g0.b_scale", Dtype::F8_E4M3, &[12, 4], vec![0; 48]))));
    assert_eq!(name, "g0.b");
    assert!(reason.contains("multiple of 8"), "{reason}");
    // alpha NaN.
    let (name, reason) =
        invalid(with(valid(), "g0.alpha", Some(t("g0.alpha", Dtype::F32, &[1], f32::NAN.to_le_bytes().to_vec()))));
    assert_eq!(name, "g0.alpha");
    assert!(reason.contains("not finite"), "{reason}");
}

#[test]
fn unexpected_names_are_rejected() {
    for bad in ["weights", "g0.d", "g01.a", "g.a", "gx.a", "g0a", "G0.a", "g99999.a"] {
        let mut ts = valid();
        ts.push(t(bad, Dtype::U8, &[1], vec![0]));
        match parse_err(&ts) {
            CliError::UnexpectedTensor { name, reason } => {
                assert_eq!(name, bad);
                assert!(!reason.is_empty());
            }
            e => panic!("{bad}: {e}"),
        }
    }
}

fn reference_outputs(groups: &GroupsFile) -> Outputs {
    Outputs::F16(reference_grouped_gemm(&groups.groups).unwrap().into_iter().map(|c| c.data).collect())
}

#[test]
fn output_files_round_trip_and_check() {
    let shapes = GroupShape::zip(&[40, 0, 33], &[64, 128, 8], &[128, 64, 256]).unwrap();
    let groups = random_groups(&shapes, InputDistribution::Competition, 11).unwrap();
    let input = parse_groups(&serialize_groups(&groups, ScaleLayout::Plain).unwrap()).unwrap();
    let out = reference_outputs(&input);
    let bytes = serialize_outputs(&out, &shapes).unwrap();
    assert_eq!(parse_outputs(&bytes, &shapes).unwrap(), out);
    let report = check_outputs(&input.groups, &out, Tolerance::COMPETITION).unwrap();
    assert!(report.passed(), "{report}");
    assert_eq!(report.groups.len(), 3);
    assert!(report.to_string().contains("overall (F16 output): PASS"), "{report}");

    // One wrong element fails, and the report names its group.
    let Outputs::F16(mut c) = out.clone() else { unreachable!() };
    c[2][5] = f16::from_f32(c[2][5].to_f32() + 1.0);
    let report = check_outputs(&input.groups, &Outputs::F16(c), Tolerance::COMPETITION).unwrap();
    assert!(!report.passed());
    assert!(report.groups[0].passed() && !report.groups[2].passed());
    assert_eq!(report.overall.worst.unwrap().group, 2);

    // bf16 output is compared with the bf16-rounded reference.
    let bf: Vec<Vec<bf16>> =
        nvfp4_format::reference_grouped_gemm_bf16(&input.groups).unwrap().into_iter().map(|c| c.data).collect();
    let bf = Outputs::Bf16(bf);
    let parsed = parse_outputs(&serialize_outputs(&bf, &shapes).unwrap(), &shapes).unwrap();
    assert_eq!(parsed, bf);
    assert!(check_outputs(&input.groups, &bf, Tolerance::new(0.0, 0.0)).unwrap().passed());
}

#[test]
fn bad_output_files_are_rejected() {
    let shapes = vec![GroupShape::new(2, 8, 64), GroupShape::new(1, 16, 64)];
    let c0 = t("g0.c", Dtype::F16, &[2, 8], vec![0; 32]);
    let c1 = t("g1.c", Dtype::F16, &[1, 16], vec![0; 32]);
    assert!(parse_outputs(&file(&[c0.clone(), c1.clone()]), &shapes).is_ok());
    let e = parse_outputs(&file(std::slice::from_ref(&c0)), &shapes).unwrap_err();
    assert!(matches!(&e, CliError::MissingTensor { name, .. } if name == "g1.c"), "{e}");
    let e = parse_outputs(&file(&[c0.clone(), t("g1.c", Dtype::F32, &[1, 16], vec![0; 64])]), &shapes).unwrap_err();
    assert!(matches!(&e, CliError::WrongDtype { name, .. } if name == "g1.c"), "{e}");
    let e = parse_outputs(&file(&[c0.clone(), t("g1.c", Dtype::BF16, &[1, 16], vec![0; 32])]), &shapes).unwrap_err();
    assert!(e.to_string().contains("F16, as g0.c"), "{e}");
    let e = parse_outputs(&file(&[c0.clone(), t("g1.c", Dtype::F16, &[16, 1], vec![0; 32])]), &shapes).unwrap_err();
    assert!(matches!(&e, CliError::WrongShape { name, .. } if name == "g1.c"), "{e}");
    let extra = t("g2.c", Dtype::F16, &[1, 8], vec![0; 16]);
    let e = parse_outputs(&file(&[c0, c1, extra]), &shapes).unwrap_err();
    assert!(matches!(&e, CliError::UnexpectedTensor { name, .. } if name == "g2.c"), "{e}");
    assert!(matches!(parse_outputs(b"nope", &shapes), Err(CliError::NotSafetensors(_))));
}

#[test]
fn run_without_a_gpu_says_so() {
    let input = parse_groups(&file(&valid())).unwrap();
    let result = compute(&input, nvfp4_gemm::OutputType::F16);
    if !nvfp4_gemm::driver_present() {
        match result {
            Err(CliError::NoGpu(reason)) => assert!(reason.contains("no NVIDIA driver"), "{reason}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("ran without a driver"),
        }
    } else {
        // With a driver: a result on a supported GPU, else the typed "no usable GPU".
        match result {
            Ok((outputs, _)) => {
                assert!(check_outputs(&input.groups, &outputs, Tolerance::COMPETITION).unwrap().passed())
            }
            Err(CliError::NoGpu(reason)) => assert!(reason.contains("compute capability"), "{reason}"),
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn truncated_files_and_nan_references_are_named() {
    let bytes = file(&valid());
    let e = parse_groups(&bytes[..bytes.len() - 10]).unwrap_err();
    assert!(matches!(e, CliError::Length { declared, actual } if declared == bytes.len() && actual == declared - 10));
    assert!(e.to_string().starts_with("the file is truncated: its header describes"), "{e}");
    let mut longer = bytes.clone();
    longer.extend([0; 3]);
    assert_eq!(
        parse_groups(&longer).unwrap_err().to_string(),
        format!("the file has 3 bytes after the {} its header describes", bytes.len())
    );

    // A NaN scale code (e4m3 0x7F) in A's row 1: that row of the reference is NaN.
    let mut scales = vec![0x38; 4 * 4];
    scales[4] = 0x7F;
    let nan = with(valid(), "g0.a_scale", Some(t("g0.a_scale", Dtype::F8_E4M3, &[4, 4], scales)));
    let input = parse_groups(&file(&nan)).unwrap();
    let out = nvfp4_gemm_cli::commands::reference_outputs(&input.groups, nvfp4_gemm::OutputType::F16).unwrap();
    let report = check_outputs(&input.groups, &out, Tolerance::COMPETITION).unwrap();
    assert!(!report.passed());
    assert_eq!(report.nan_expected, [8]);
    assert!(report.to_string().contains("the reference itself is NaN at 8 elements (first in group 0)"), "{report}");
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nvfp4-gemm-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_nvfp4-gemm")).args(args).output().expect("start nvfp4-gemm");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binary_reports_errors_with_the_file_name_and_exit_status() {
    let input = scratch("in.safetensors");
    let output = scratch("out.safetensors");
    let bad = scratch("bad.safetensors");
    let (i, o, b) = (input.to_str().unwrap(), output.to_str().unwrap(), bad.to_str().unwrap());

    let (code, stdout, _) = cli(&["gen", i, "--shape", "g=2,m=40:72,n=64,k=128", "--seed", "5"]);
    assert_eq!(code, 0, "{stdout}");
    let groups = nvfp4_gemm_cli::file::read_groups(&input).unwrap();
    std::fs::write(&output, serialize_outputs(&reference_outputs(&groups), &groups.shapes()).unwrap()).unwrap();
    let (code, stdout, stderr) = cli(&["check", i, o]);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("overall (F16 output): PASS"), "{stdout}");

    // A different seed's reference does not match: status 1.
    let (code, _, _) = cli(&["gen", b, "--shape", "g=2,m=40:72,n=64,k=128", "--seed", "6"]);
    assert_eq!(code, 0);
    let (code, stdout, _) = cli(&["check", b, o]);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("FAIL"), "{stdout}");

    // A broken file: status 2 and the file's name in the message.
    std::fs::write(&bad, b"not safetensors").unwrap();
    let (code, _, stderr) = cli(&["check", b, o]);
    assert_eq!(code, 2);
    assert!(stderr.contains("bad.safetensors: not a safetensors file"), "{stderr}");
    let (code, _, stderr) = cli(&["check", i, i]);
    assert_eq!(code, 2);
    assert!(stderr.contains("missing tensor `g0.c`"), "{stderr}");

    let (code, _, stderr) = cli(&["check", i]);
    assert_eq!(code, 2);
    assert!(stderr.contains("Usage: nvfp4-gemm check <INPUT> <OUTPUT>"), "{stderr}");
    let (code, stdout, _) = cli(&["--help"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("g{i}.a_scale") && stdout.contains("F8_E4M3"), "{stdout}");
    for command in ["run", "ref", "check", "info", "gen"] {
        let (code, stdout, stderr) = cli(&[command, "--help"]);
        assert_eq!(code, 0, "{command} --help: {stderr}");
        assert!(stdout.contains(&format!("Usage: nvfp4-gemm {command}")), "{stdout}");
    }

    if !nvfp4_gemm::driver_present() {
        let (code, _, stderr) = cli(&["run", i, o]);
        assert_eq!(code, 2);
        assert!(stderr.contains("no usable GPU"), "{stderr}");
    }
    let _ = std::fs::remove_dir_all(input.parent().unwrap());
}

/// gen → ref → check through the binary, and what each prints: the round trip that works on any
/// machine.
#[test]
fn gen_ref_check_round_trip_through_the_binary() {
    let input = scratch("rt-in.safetensors");
    let output = scratch("rt-out.safetensors");
    let (i, o) = (input.to_str().unwrap(), output.to_str().unwrap());
    let (code, stdout, stderr) = cli(&["gen", i, "--shape", "m=40,n=64,k=128", "--scales", "blocked"]);
    assert_eq!((code, stdout.trim()), (0, format!("wrote 1 group to {i}").as_str()), "{stderr}");
    for bf16 in [false, true] {
        let mut args = vec!["ref", i, o];
        if bf16 {
            args.push("--bf16");
        }
        let (code, stdout, stderr) = cli(&args);
        assert_eq!(
            (code, stdout.trim()),
            (0, format!("wrote the CPU reference of 1 group to {o}").as_str()),
            "{stderr}"
        );
        let (code, stdout, stderr) = cli(&["check", i, o, "--atol", "0", "--rtol", "0"]);
        assert_eq!(code, 0, "{stdout}{stderr}");
        let kind = if bf16 { "Bf16" } else { "F16" };
        assert!(stdout.contains(&format!("overall ({kind} output): PASS")), "{stdout}");
    }
    let (code, _, stderr) = cli(&["check", i, o, "--atol", "-1"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("expected a number >= 0"), "{stderr}");
    let _ = std::fs::remove_file(&input);
    let _ = std::fs::remove_file(&output);
}

/// `info` plans without a GPU: for a named architecture, or both when there is no GPU.
#[test]
fn info_shows_the_plan_without_a_gpu() {
    let (code, stdout, stderr) = cli(&["info", "--arch", "sm_90a", "--shape", "b3"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("planner: sm_90a on 132 SMs") && stdout.contains("sm90_grouped_gemm"), "{stdout}");
    let (code, stdout, stderr) = cli(&["info", "--arch", "sm_100a", "--sms", "148", "--shape", "b0"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("planner: sm_100a on 148 SMs") && stdout.contains("sm100_gemm_"), "{stdout}");
    let (code, _, stderr) = cli(&["info", "--sms", "100"]);
    assert_eq!(code, 2, "--sms needs --arch");
    assert!(stderr.contains("--arch"), "{stderr}");
    if !nvfp4_gemm::driver_present() {
        let (code, stdout, stderr) = cli(&["info"]);
        assert_eq!(code, 0, "{stderr}");
        assert!(stdout.starts_with("device: none: no NVIDIA driver"), "{stdout}");
        assert!(stdout.contains("planner: sm_90a on 132 SMs") && stdout.contains("planner: sm_100a on 148 SMs"));
        assert_eq!(stdout.matches("\nb0: ").count(), 2, "{stdout}");
    }
}
