//! `cargo xtask bundle`: everything the GPU machine (which has a driver but no Rust) needs to run
//! the GPU tests and the demo, in one ignored folder `bundle/` (kept well under 64 MiB):
//! release test executables under `bundle/tests/`, other binaries under `bundle/bin/`, and
//! `bundle/run-gpu-tests.sh`, which runs them all and ends with a one-line-per-binary summary, and
//! `bundle/run-b200-probes.sh`, the sm_100a probe suite to run first on a B200.
//! The kernels are embedded in the binaries, so nothing else travels.

use crate::util::{repo_root, Error, Result};
use std::path::Path;
use std::process::{Command, Stdio};

const RUNNER: &str = r#"#!/usr/bin/env bash
# Runs every bundled GPU test binary; prints a summary table last. Usage: bundle/run-gpu-tests.sh [filter]
cd "$(dirname "$0")" || exit 2
echo "host: $(uname -srm); $(ldd --version 2>&1 | head -1)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm --format=csv,noheader
summary=""; fail=0
for t in tests/*; do
  name=$(basename "$t")
  start=$(date +%s%N)
  ./"$t" --test-threads=1 "$@" > "logs/$name.log" 2>&1; rc=$?
  secs=$(( ($(date +%s%N) - start) / 1000000 ))
  line=$(grep -E '^test result:' "logs/$name.log" | tail -1)
  skips=$(grep -c 'SKIPPED' "logs/$name.log")
  [ $rc -ne 0 ] && fail=1
  summary+=$(printf '%-24s rc=%-3s %-70s skipped=%s %sms' "$name" "$rc" "${line:-no result line}" "$skips" "$secs")$'\n'
done
echo "== summary"; printf '%s' "$summary"
exit $fail
"#;

pub fn run(args: &[&str]) -> Result<()> {
    if !args.is_empty() {
        return Err(Error::msg("bundle takes no options"));
    }
    let root = repo_root();
    let out = root.join("bundle");
    let _ = std::fs::remove_dir_all(&out);
    for d in ["tests", "bin", "logs"] {
        std::fs::create_dir_all(out.join(d))?;
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let json = Command::new(&cargo)
        .current_dir(&root)
        .args(["test", "--release", "--no-run", "--message-format=json", "-p", "nvfp4-gemm-tests"])
        .stderr(Stdio::inherit())
        .output()?;
    if !json.status.success() {
        return Err(Error::msg("building the release test binaries failed"));
    }
    let mut n = 0;
    for line in String::from_utf8_lossy(&json.stdout).lines() {
        let is_test = line.contains("\"test\":true");
        let Some(exe) = json_str(line, "\"executable\":\"") else {
            continue;
        };
        if !is_test {
            continue;
        }
        let path = Path::new(&exe);
        let stem = path.file_name().and_then(|f| f.to_str()).unwrap_or("test");
        let name = stem.rsplit_once('-').map_or(stem, |x| x.0);
        if name == "nvfp4_gemm_tests" {
            continue; // the helper library's own (empty) unit-test binary
        }
        std::fs::copy(path, out.join("tests").join(name))?;
        n += 1;
    }
    // The main job's binary (README's `cargo run --release --example demo`).
    let demo = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--release", "--quiet", "-p", "nvfp4-gemm", "--example", "demo"])
        .status()?;
    if !demo.success() {
        return Err(Error::msg("building the demo failed"));
    }
    std::fs::copy(root.join("target/release/examples/demo"), out.join("bin/demo"))?;
    write_script(&out.join("run-gpu-tests.sh"), RUNNER)?;
    write_script(&out.join("run-b200-probes.sh"), B200_PROBES)?;
    let size: u64 = walk_size(&out)?;
    println!("bundle: {n} test binaries, {:.1} MiB in {}", size as f64 / (1 << 20) as f64, out.display());
    if size > 60 << 20 {
        return Err(Error::msg("bundle is over 60 MiB; the device tool carries at most 64 MiB"));
    }
    Ok(())
}

/// `bundle/run-b200-probes.sh`: the first thing to run on a B200 (docs/sm100.md): the sm_100a
/// hardware probes against the device model, then the driver's encoding of every sm_100a tensor
/// map, each case's verdict printed.
const B200_PROBES: &str = r#"#!/usr/bin/env bash
# The sm_100a probe suite (docs/sm100.md: run it first on a B200). Usage: bundle/run-b200-probes.sh
cd "$(dirname "$0")" || exit 2
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version,compute_cap --format=csv,noheader
rc=0
for t in gpu_probe_sm100 gpu_tensor_maps_sm100; do
  ./tests/"$t" --include-ignored --test-threads=1 --nocapture 2>&1 | tee "logs/$t.log"
  [ "${PIPESTATUS[0]}" -ne 0 ] && rc=1
done
exit $rc
"#;

/// Writes an executable script.
fn write_script(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755))?;
    }
    Ok(())
}

/// The string value that follows `key` in a JSON line (no escapes expected in paths).
pub(crate) fn json_str(line: &str, key: &str) -> Option<String> {
    let start = line.find(key)? + key.len();
    let end = line[start..].find('"')? + start;
    Some(line[start..end].to_owned())
}

pub(crate) fn walk_size(p: &Path) -> Result<u64> {
    let mut total = 0;
    for e in std::fs::read_dir(p)? {
        let e = e?;
        let m = e.metadata()?;
        total += if m.is_dir() { walk_size(&e.path())? } else { m.len() };
    }
    Ok(total)
}
