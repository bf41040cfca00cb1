//! The README's performance table and the current-state table of the performance page show numbers
//! of one committed bench run: every cell they take from it equals the JSON's median rounded to
//! 0.1 µs (or its ratio to two decimals), so that the pages cannot disagree with each other or
//! with the run.

use serde_json::Value;
use std::path::Path;

/// The run both pages cite.
const RUN: &str = "bench/results/h200-2026-12-02-s19-w4a16.json";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ is inside the repository")
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// A timing field's median (the bench writes `{median, min, ...}` objects).
fn median(v: &Value, what: &str) -> f64 {
    v.get("median").and_then(Value::as_f64).or_else(|| v.as_f64()).unwrap_or_else(|| panic!("{what}: no median"))
}

/// The run's shapes by name.
fn shape<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["shapes"]
        .as_array()
        .expect("shapes")
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("{RUN}: no shape {name}"))
}

/// The cells of the markdown table row of `page` that starts with `| {name} |`, under the first
/// heading line containing `section`.
fn row(page: &str, section: &str, name: &str) -> Vec<String> {
    let start = page.find(section).unwrap_or_else(|| panic!("no section {section:?}"));
    let prefix = format!("| {name} |");
    let line =
        page[start..].lines().find(|l| l.starts_with(&prefix)).unwrap_or_else(|| panic!("{section}: no row {name}"));
    line.trim_matches('|').split('|').map(|c| c.trim().to_string()).collect()
}

fn one_decimal(x: f64) -> String {
    format!("{x:.1}")
}

#[test]
fn readme_performance_table_is_the_cited_run() {
    let run: Value = serde_json::from_str(&read(RUN)).expect("JSON");
    let readme = read("README.md");
    assert!(
        readme.contains("## Performance (H200, 2026-12-02)"),
        "the README's table heading names the run's card and date"
    );
    for name in ["b0", "b1", "b2", "b3", "d0", "d1", "d2"] {
        let s = shape(&run, name);
        let cells = row(&readme, "## Performance (H200", name);
        let kernel = median(&s["kernel_us"], "kernel_us");
        let cublas = median(&s["cublas_us"], "cublas_us");
        let w = |act: &str| {
            let w = s["w4a16"].as_array().expect("w4a16").iter().find(|w| w["activations"] == act).expect(act);
            median(&w["kernel_us"], "w4a16 kernel_us")
        };
        let want = [
            (2, one_decimal(kernel), "kernel µs"),
            (3, one_decimal(median(&s["competition_us"], "competition_us")), "competition-style µs"),
            (4, one_decimal(cublas), "cuBLAS bf16 µs"),
            (5, format!("{:.2}", cublas / kernel), "× cuBLAS"),
            (7, one_decimal(w("f16")), "W4A16 f16 µs"),
            (8, one_decimal(w("bf16")), "W4A16 bf16 µs"),
        ];
        for (column, value, what) in want {
            assert_eq!(cells[column], value, "README {name} {what}: {RUN} says {value}");
        }
    }
}

#[test]
fn perf_current_state_kernel_times_are_the_cited_run() {
    let run: Value = serde_json::from_str(&read(RUN)).expect("JSON");
    let perf = read("PERF.md");
    assert!(perf.contains(RUN), "PERF.md's current state names the run it shows");
    for name in ["b0", "b1", "b2", "b3", "d0", "d1", "d2"] {
        let kernel = median(&shape(&run, name)["kernel_us"], "kernel_us");
        let cells = row(&perf, "## Current state", name);
        assert_eq!(cells[1], one_decimal(kernel), "PERF.md {name} kernel µs: {RUN} says {kernel:.1}");
    }
}
