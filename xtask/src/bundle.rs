//! `cargo xtask bundle`: everything the GPU machine (which has a driver but no Rust) needs to run
//! the GPU tests and the demo, in one ignored folder `bundle/`, packed into the ignored archive
//! `bundle.tar.xz` that travels (the binaries compress about tenfold; the device tool carries at
//! most 64 MiB, which the unpacked folder outgrew):
//! release test executables under `bundle/tests/` (the integration tests and the library's unit
//! tests), other binaries under `bundle/bin/`, `bundle/arch-only.tsv`,
//! `bundle/run-gpu-tests.sh`, which runs them all and ends with a summary, and
//! `bundle/run-b200-probes.sh`, the sm_100a probe suite to run first on a B200.
//! The kernels are embedded in the binaries, so nothing else travels.
//!
//! GPU tests are `#[ignore = "needs …"]` (the convention is in `tests/lib.rs`); the runner passes
//! `--include-ignored`. A test whose reason names one architecture ([`ARCH_REASONS`]) is listed
//! in `arch-only.tsv` (binary, architecture, test), read here from each binary's own test list;
//! on a GPU of another architecture the runner leaves it out with `--skip` and counts it as not
//! run, so an H200 never reports the sm_100a tests as passed.

use crate::util::{repo_root, Error, Result};
use std::path::Path;
use std::process::{Command, Stdio};

/// The ignore reasons a bundled test may carry, with the architecture each one restricts it to.
pub(crate) const ARCH_REASONS: [(&str, Option<&str>); 4] = [
    ("needs an sm_90a GPU", Some("sm_90a")),
    ("needs an sm_100a GPU", Some("sm_100a")),
    ("needs an sm_90a or sm_100a GPU", None),
    ("needs a CUDA driver", None),
];

const RUNNER: &str = r#"#!/usr/bin/env bash
# Runs every bundled test binary with --include-ignored (the GPU tests are #[ignore = "needs ..."])
# and prints a summary last. Tests that need another architecture than GPU 0's (arch-only.tsv) are
# left out with --skip and counted as not run.
# Usage: bundle/run-gpu-tests.sh [test-name filter]
cd "$(dirname "$0")" || exit 2
echo "host: $(uname -srm); $(ldd --version 2>&1 | head -1)"
cc=""
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,driver_version,compute_cap,clocks.sm --format=csv,noheader
  cc=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' ')
fi
case "$cc" in 9.0) here=sm_90a ;; 10.0) here=sm_100a ;; *) here="" ;; esac
echo "GPU 0: ${here:-no sm_90a or sm_100a GPU found: every GPU test runs and fails with its reason}"
num() { sed -nE "s/.* ([0-9]+) $1.*/\1/p" <<<"$2"; }
summary=""; fail=0; tp=0; tf=0; ti=0; tn=0
for t in tests/*; do
  name=$(basename "$t")
  skips=()
  if [ -n "$here" ]; then
    while IFS=$'\t' read -r bin arch test; do
      if [ "$bin" = "$name" ] && [ "$arch" != "$here" ]; then skips+=(--skip "$test"); fi
    done < arch-only.tsv
  fi
  count() { ./"$t" --list --include-ignored "$@" 2>/dev/null | grep -c ': test$'; }
  notrun=$(( $(count "$@") - $(count "${skips[@]}" "$@") ))
  start=$(date +%s%N)
  ./"$t" --include-ignored --test-threads=1 "${skips[@]}" "$@" > "logs/$name.log" 2>&1; rc=$?
  ms=$(( ($(date +%s%N) - start) / 1000000 ))
  line=$(grep -E '^test result:' "logs/$name.log" | tail -1)
  if [ -z "$line" ]; then
    fail=1
    summary+=$(printf '%-24s rc=%-3s no result line (crashed?): see logs/%s.log' "$name" "$rc" "$name")$'\n'
    continue
  fi
  p=$(num passed "$line"); f=$(num failed "$line"); i=$(num ignored "$line")
  [ "$rc" -ne 0 ] && fail=1
  tp=$((tp + p)); tf=$((tf + f)); ti=$((ti + i)); tn=$((tn + notrun))
  summary+=$(printf '%-24s rc=%-3s passed %-4s failed %-4s ignored %-3s not run here %-3s %sms' \
    "$name" "$rc" "$p" "$f" "$i" "$notrun" "$ms")$'\n'
done
echo "== summary"; printf '%s' "$summary"
echo "total: $tp passed, $tf failed, $ti ignored, $tn not run (they need another GPU than ${here:-this one})"
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
        .args(["test", "--release", "--no-run", "--message-format=json", "-p", "nvfp4-gemm-tests", "-p", "nvfp4-gemm"])
        .args(["--lib", "--tests"])
        .stderr(Stdio::inherit())
        .output()?;
    if !json.status.success() {
        return Err(Error::msg("building the release test binaries failed"));
    }
    let mut n = 0;
    let mut arch_only = String::new();
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
        // The helper library's own unit tests need no GPU; tidy reads the source tree, which the
        // GPU machine does not have.
        if name == "nvfp4_gemm_tests" || name == "tidy" {
            continue;
        }
        // libtest prints the ignore reasons only in its JSON listing, an unstable option; the
        // binaries are built by stable Rust, and RUSTC_BOOTSTRAP lets them accept it. Nothing
        // else runs with it.
        let list = ["--list", "--format", "json", "-Z", "unstable-options"];
        let listing = crate::util::run(Command::new(path).args(list).env("RUSTC_BOOTSTRAP", "1"))?;
        let tests = parse_listing(&listing);
        for line in arch_only_lines(name, &tests)? {
            arch_only.push_str(&line);
            arch_only.push('\n');
        }
        std::fs::copy(path, out.join("tests").join(name))?;
        n += 1;
    }
    std::fs::write(out.join("arch-only.tsv"), arch_only)?;
    // The main job's binary (README's `cargo run --release --example demo`) and the example of an
    // application passing its own context and buffers.
    let examples = ["demo", "from_context"];
    let built = Command::new(&cargo)
        .current_dir(&root)
        .args(["build", "--release", "--quiet", "-p", "nvfp4-gemm"])
        .args(examples.iter().flat_map(|e| ["--example", e]))
        .status()?;
    if !built.success() {
        return Err(Error::msg("building the examples failed"));
    }
    for e in examples {
        std::fs::copy(root.join("target/release/examples").join(e), out.join("bin").join(e))?;
    }
    write_script(&out.join("run-gpu-tests.sh"), RUNNER)?;
    write_script(&out.join("run-b200-probes.sh"), B200_PROBES)?;
    let size: u64 = walk_size(&out)?;
    println!("bundle: {n} test binaries, {:.1} MiB in {}", size as f64 / (1 << 20) as f64, out.display());
    pack(&root)
}

/// The packed bundle that travels to the GPU machine, beside `bundle/`.
pub(crate) const ARCHIVE: &str = "bundle.tar.xz";

/// Packs `bundle/` into [`ARCHIVE`] and refuses an archive over 48 MiB (the device tool carries at
/// most 64 MiB with the rest of the working tree). On the GPU machine: `tar xJf bundle.tar.xz`.
pub(crate) fn pack(root: &Path) -> Result<()> {
    let archive = root.join(ARCHIVE);
    let _ = std::fs::remove_file(&archive);
    crate::util::run(Command::new("tar").current_dir(root).args(["cJf", ARCHIVE, "bundle"]).env("XZ_OPT", "-T0"))?;
    let size = std::fs::metadata(&archive)?.len();
    println!("{ARCHIVE}: {:.1} MiB (carry it; unpack with `tar xJf {ARCHIVE}`)", size as f64 / (1 << 20) as f64);
    if size > 48 << 20 {
        return Err(Error::msg(format!("{ARCHIVE} is over 48 MiB; the device tool carries at most 64 MiB")));
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

/// One test of a binary's `--list --format json` output: its name and, when ignored, the reason.
#[derive(Debug, PartialEq)]
pub(crate) struct Listed {
    name: String,
    ignore: Option<String>,
}

/// The tests of a libtest `--list --format json -Z unstable-options` listing (one JSON object a
/// line; names and reasons without escapes).
pub(crate) fn parse_listing(listing: &str) -> Vec<Listed> {
    listing
        .lines()
        .filter(|l| l.contains("\"event\": \"discovered\""))
        .filter_map(|l| {
            let name = json_str(l, "\"name\": \"")?;
            let ignore =
                l.contains("\"ignore\": true").then(|| json_str(l, "\"ignore_message\": \"").unwrap_or_default());
            Some(Listed { name, ignore })
        })
        .collect()
}

/// `binary<TAB>arch<TAB>test` for each test of `binary` restricted to one architecture. Fails on
/// an ignore reason the runner does not know (it would run the test anyway), and when a test to
/// leave out is a substring of one to run on some architecture (libtest's `--skip` matches
/// substrings, so it would leave out both).
pub(crate) fn arch_only_lines(binary: &str, tests: &[Listed]) -> Result<Vec<String>> {
    let mut only = vec![];
    for t in tests {
        let Some(reason) = &t.ignore else { continue };
        match ARCH_REASONS.iter().find(|(r, _)| r == reason) {
            Some((_, Some(arch))) => only.push((arch, &t.name)),
            Some((_, None)) => {}
            None => {
                let known: Vec<_> = ARCH_REASONS.iter().map(|(r, _)| format!("{r:?}")).collect();
                return Err(Error::msg(format!(
                    "{binary}: test {} is #[ignore = {reason:?}]; the GPU bundle knows only {}",
                    t.name,
                    known.join(", ")
                )));
            }
        }
    }
    for (arch, skipped) in &only {
        // Left out wherever `skipped` is: only tests restricted to the same architecture.
        let left_out_too = |t: &Listed| only.iter().any(|(a, n)| *n == &t.name && a == arch);
        let overlap = |t: &&Listed| &&t.name != skipped && t.name.contains(skipped.as_str()) && !left_out_too(t);
        if let Some(t) = tests.iter().find(overlap) {
            return Err(Error::msg(format!(
                "{binary}: leaving out {skipped} with --skip would also leave out {}: rename one of them",
                t.name
            )));
        }
    }
    Ok(only.into_iter().map(|(arch, name)| format!("{binary}\t{arch}\t{name}")).collect())
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

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = r#"{ "type": "suite", "event": "discovery" }
{ "type": "test", "event": "discovered", "name": "on_sm100", "ignore": true, "ignore_message": "needs an sm_100a GPU", "source_path": "t.rs" }
{ "type": "test", "event": "discovered", "name": "on_sm90", "ignore": true, "ignore_message": "needs an sm_90a GPU", "source_path": "t.rs" }
{ "type": "test", "event": "discovered", "name": "m::either", "ignore": true, "ignore_message": "needs an sm_90a or sm_100a GPU", "source_path": "t.rs" }
{ "type": "test", "event": "discovered", "name": "cpu", "ignore": false, "ignore_message": "", "source_path": "t.rs" }
{ "type": "suite", "event": "completed", "tests": 4, "benchmarks": 0, "total": 4, "ignored": 3 }"#;

    fn listed(name: &str, ignore: Option<&str>) -> Listed {
        Listed { name: name.into(), ignore: ignore.map(Into::into) }
    }

    #[test]
    fn listing_gives_names_and_reasons() {
        let tests = parse_listing(LISTING);
        assert_eq!(
            tests,
            [
                listed("on_sm100", Some("needs an sm_100a GPU")),
                listed("on_sm90", Some("needs an sm_90a GPU")),
                listed("m::either", Some("needs an sm_90a or sm_100a GPU")),
                listed("cpu", None),
            ]
        );
        assert_eq!(arch_only_lines("b", &tests).unwrap(), ["b\tsm_100a\ton_sm100", "b\tsm_90a\ton_sm90"]);
    }

    #[test]
    fn unknown_reasons_and_overlapping_names_are_errors() {
        let e = arch_only_lines("b", &[listed("slow", Some("slow"))]).unwrap_err().to_string();
        assert!(e.contains("b: test slow is #[ignore = \"slow\"]"), "{e}");
        let e = arch_only_lines("b", &[listed("shapes", Some("needs an sm_100a GPU")), listed("shapes_bf16", None)])
            .unwrap_err()
            .to_string();
        assert!(e.contains("leaving out shapes with --skip would also leave out shapes_bf16"), "{e}");
        // Both restricted to the same architecture: leaving out one with the other is right.
        let same =
            [listed("shapes", Some("needs an sm_100a GPU")), listed("shapes_bf16", Some("needs an sm_100a GPU"))];
        assert_eq!(arch_only_lines("b", &same).unwrap().len(), 2);
    }
}
