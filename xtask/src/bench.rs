//! `cargo xtask bench`: builds the benchmark (`nvfp4-bench`) and the command-line tool
//! (`nvfp4-gemm`) in release mode, copies them into `bundle/bin/` with `run-bench.sh` and the MoE
//! rows' PyTorch baseline `torch_moe.py`, and prints the commands to run on the GPU machine. Only `bundle/bin/` is touched, so it can follow
//! `cargo xtask bundle` (which rebuilds the whole folder: run it first).

use crate::bundle::{json_str, ARCHIVE};
use crate::util::{repo_root, Error, Result};
use std::process::{Command, Stdio};

/// Runs the bench with CUDA 13's cuBLAS made visible to cudarc. cudarc 0.19 (CUDA 12.9 bindings)
/// dlopens cuBLAS by name and tries libcublas.so, libcublas.so.12, .11, .10, .9, .1 and a few
/// Windows-style names, but not libcublas.so.13: the script links `libcublas.so` to the installed
/// libcublas.so.13 in a folder it puts first on LD_LIBRARY_PATH (with the library's own folder,
/// for libcublasLt.so.13).
const RUN_BENCH: &str = r#"#!/usr/bin/env bash
# Usage: bundle/bin/run-bench.sh [nvfp4-bench options], e.g. --out "$OUT". See nvfp4-bench --help.
# With --moe, nvfp4-bench runs torch_moe.py (beside it) with the LD_LIBRARY_PATH saved here.
here="$(cd "$(dirname "$0")" && pwd)"
export NVFP4_BENCH_ORIG_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}"
find_cublas() {
  local d
  for d in ${CUDA_HOME:+"$CUDA_HOME/lib64"} /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 \
           /usr/local/cuda/targets/x86_64-linux/lib /usr/lib/x86_64-linux-gnu; do
    [ -e "$d/libcublas.so.13" ] && { echo "$d/libcublas.so.13"; return; }
  done
  ldconfig -p 2>/dev/null | awk '/libcublas\.so\.13 /{print $NF; exit}' | grep . && return
  python3 - 2>/dev/null <<'PY'
import glob, site, sys
for d in site.getsitepackages() + [site.getusersitepackages()]:
    for f in sorted(glob.glob(d + "/nvidia/cu*/lib/libcublas.so.13")):
        print(f); sys.exit()
PY
}
lib="$(find_cublas | head -1)"
if [ -n "$lib" ]; then
  links="${TMPDIR:-/tmp}/nvfp4-bench-cublas"
  mkdir -p "$links" && ln -sfn "$lib" "$links/libcublas.so"
  export LD_LIBRARY_PATH="$links:$(dirname "$lib")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  echo "run-bench.sh: cuBLAS for cudarc: $links/libcublas.so -> $lib" >&2
else
  echo "run-bench.sh: no libcublas.so.13 found; cudarc looks for libcublas.so / .so.12 on its own" >&2
fi
exec "$here/nvfp4-bench" "$@"
"#;

pub fn run(args: &[&str]) -> Result<()> {
    if !args.is_empty() {
        return Err(Error::msg("bench takes no options (the benchmark's own options go to run-bench.sh)"));
    }
    let root = repo_root();
    let bin = root.join("bundle/bin");
    std::fs::create_dir_all(&bin)?;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let json = Command::new(&cargo)
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "--bins",
            "--message-format=json",
            "-p",
            "nvfp4-gemm-bench",
            "-p",
            "nvfp4-gemm-cli",
        ])
        .stderr(Stdio::inherit())
        .output()?;
    if !json.status.success() {
        return Err(Error::msg("building nvfp4-bench / nvfp4-gemm in release failed"));
    }
    let mut copied = vec![];
    for line in String::from_utf8_lossy(&json.stdout).lines() {
        let Some(exe) = json_str(line, "\"executable\":\"") else { continue };
        let path = std::path::Path::new(&exe);
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else { continue };
        if name == "nvfp4-bench" || name == "nvfp4-gemm" {
            std::fs::copy(path, bin.join(name))?;
            copied.push(name.to_owned());
        }
    }
    for want in ["nvfp4-bench", "nvfp4-gemm"] {
        if !copied.iter().any(|c| c == want) {
            return Err(Error::msg(format!("cargo reported no executable named {want}")));
        }
    }
    let script = bin.join("run-bench.sh");
    std::fs::write(&script, RUN_BENCH)?;
    let torch_script = bin.join("torch_moe.py");
    std::fs::copy(root.join("bench/torch_moe.py"), &torch_script)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        for s in [&script, &torch_script] {
            std::fs::set_permissions(s, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    println!("bench: copied {}, run-bench.sh and torch_moe.py to {}", copied.join(", "), bin.display());
    crate::bundle::pack(&root)?;
    println!("On the GPU machine (device tool `run`, carry [\"{ARCHIVE}\"], the command starting with `tar xJf {ARCHIVE};`):");
    println!("  set -o pipefail; bundle/bin/run-bench.sh --out \"$OUT\" 2>&1 | tee \"$OUT/bench.log\"");
    println!(
        "MoE rows (quantize + GEMM, graph replay) beside PyTorch's best option (torch_moe.py, run by nvfp4-bench), \
         the decode shapes as MoE rows too (the Python bench's MoE rows take their host budgets from this JSON):"
    );
    println!(
        "  set -o pipefail; bundle/bin/run-bench.sh --moe-shapes m0,m1,m2,m3,d0,d1,d2 --shapes none --out \"$OUT\" 2>&1 | tee \"$OUT/bench-moe.log\""
    );
    println!("W4A16 prepack rows (the GPU prepack of DeepSeek's 256-expert tensors against the copy rate):");
    println!(
        "  set -o pipefail; bundle/bin/run-bench.sh --prepack --shapes none --no-baseline --out \"$OUT\" 2>&1 | tee \"$OUT/bench-prepack.log\""
    );
    println!(
        "Expert-block rows (ExpertBlock on DeepSeek-V3, Qwen3-30B-A3B, Mixtral-8x7B; --block-quick for a subset):"
    );
    println!(
        "  set -o pipefail; bundle/bin/run-bench.sh --block --shapes none --out \"$OUT\" 2>&1 | tee \"$OUT/bench-block.log\""
    );
    Ok(())
}
