//! The PyTorch baseline of the MoE rows (`--torch`): runs `torch_moe.py` (copied beside
//! `nvfp4-bench` by `cargo xtask bench`) on the same routings before the bench opens the GPU, or
//! reads a `torch-moe.json` it wrote earlier. The script's own documentation (its `--help`) and
//! bench/README.md describe what it times.

use crate::moe::{RoutingFile, TorchBaseline};
use crate::options::{Options, Torch};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The script's file name, beside the executable.
pub const SCRIPT: &str = "torch_moe.py";
/// The JSON the script writes into the output folder.
pub const JSON: &str = "torch-moe.json";
/// The routing file the bench writes into the output folder for the script.
pub const ROUTING: &str = "moe-routing.json";

/// The baseline `o.torch` asks for (never an error: an unavailable baseline says why).
pub fn baseline(o: &Options) -> TorchBaseline {
    match &o.torch {
        Torch::Off => TorchBaseline::unavailable("disabled (--torch off)"),
        Torch::File(path) => read(path),
        Torch::Auto => {
            let script = std::env::current_exe().ok().and_then(|e| e.parent().map(|d| d.join(SCRIPT)));
            let Some(script) = script.filter(|s| s.is_file()) else {
                return TorchBaseline::unavailable(format!(
                    "{SCRIPT} is not beside nvfp4-bench (`cargo xtask bench` puts both in bundle/bin/)"
                ));
            };
            let python = std::env::var_os("NVFP4_BENCH_PYTHON").unwrap_or_else(|| "python3".into());
            run_script(&python, &script, o)
        }
    }
}

fn read(path: &Path) -> TorchBaseline {
    match std::fs::read_to_string(path) {
        Ok(text) => TorchBaseline::parse(&text, &path.display().to_string()),
        Err(e) => TorchBaseline::unavailable(format!("{}: {e}", path.display())),
    }
}

/// Writes the routings to `OUT/moe-routing.json`, runs `python script --routing FILE --out OUT
/// --iters N --flush-mib M --seed S` (its stdout goes to our stderr, so that stdout keeps only the
/// tables) and reads `OUT/torch-moe.json`. `run-bench.sh` changes LD_LIBRARY_PATH for cuBLAS; the
/// script gets the caller's original one back (`NVFP4_BENCH_ORIG_LD_LIBRARY_PATH`).
fn run_script(python: &OsString, script: &Path, o: &Options) -> TorchBaseline {
    let routing = o.out.join(ROUTING);
    if let Err(e) = RoutingFile::new(&o.moe, o.seed).write(&routing) {
        return TorchBaseline::unavailable(e);
    }
    let json: PathBuf = o.out.join(JSON);
    let _ = std::fs::remove_file(&json);
    let mut cmd = Command::new(python);
    cmd.arg(script)
        .arg("--routing")
        .arg(&routing)
        .arg("--out")
        .arg(&o.out)
        .args(["--iters", &o.iters.to_string(), "--flush-mib", &(o.flush_bytes >> 20).to_string()])
        .args(["--flush", o.flush.name()])
        .args(["--seed", &o.seed.to_string()])
        .stdout(std::io::stderr());
    if let Some(orig) = std::env::var_os("NVFP4_BENCH_ORIG_LD_LIBRARY_PATH") {
        if orig.is_empty() {
            cmd.env_remove("LD_LIBRARY_PATH");
        } else {
            cmd.env("LD_LIBRARY_PATH", orig);
        }
    }
    eprintln!("nvfp4-bench: PyTorch baseline: {} {} (its output follows)", python.to_string_lossy(), script.display());
    match cmd.status() {
        Err(e) => TorchBaseline::unavailable(format!("could not run {}: {e}", python.to_string_lossy())),
        Ok(_) if json.is_file() => read(&json),
        Ok(status) => TorchBaseline::unavailable(format!("{SCRIPT} exited with {status} and wrote no {JSON}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::moe::{MoeShape, Routing};

    fn options(dir: &Path) -> Options {
        Options {
            out: dir.to_path_buf(),
            moe: vec![MoeShape::parse("e=2,t=1-3,n=8,k=64,name=tiny").unwrap()],
            ..Options::default()
        }
    }

    fn temp_dir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("nvfp4-bench-torch-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn off_and_file() {
        let dir = temp_dir("file");
        let mut o = options(&dir);
        o.torch = Torch::Off;
        assert_eq!(baseline(&o).note, "unavailable: disabled (--torch off)");
        o.torch = Torch::File(dir.join("missing.json"));
        assert!(baseline(&o).note.starts_with("unavailable: ") && baseline(&o).note.contains("missing.json"));
        std::fs::write(dir.join("t.json"), r#"{"shapes": []}"#).unwrap();
        o.torch = Torch::File(dir.join("t.json"));
        assert!(baseline(&o).note.starts_with("loaded from ") && baseline(&o).json.is_some());
        let _ = std::fs::remove_dir_all(dir);
    }

    /// The runner with `sh` in place of python: the "script" sees the documented arguments,
    /// reads the routing file and writes the JSON.
    #[test]
    fn runs_the_script_with_the_routing() {
        let dir = temp_dir("run");
        let o = options(&dir);
        let script = dir.join("fake.sh");
        std::fs::write(
            &script,
            r#"[ "$1" = --routing ] && [ "$3" = --out ] && [ "$5" = --iters ] && [ "$7" = --flush-mib ] || exit 9
counts=$(tr -d ' \n' < "$2" | sed 's/.*"counts":\[\([0-9,]*\)\].*/\1/')
printf '{"shapes":[{"name":"tiny","experts":2,"n":8,"k":64,"counts":[%s],"best":"loop","best_us":3.5}]}' "$counts" > "$4/torch-moe.json"
"#,
        )
        .unwrap();
        let t = run_script(&"sh".into(), &script, &o);
        assert!(t.note.starts_with("loaded from"), "{}", t.note);
        let routing: Routing = crate::moe::RoutingFile::new(&o.moe, o.seed).shapes.remove(0);
        assert_eq!(t.row(&routing).unwrap().us, 3.5);
        // A script that writes nothing.
        std::fs::write(&script, "exit 3\n").unwrap();
        let t = run_script(&"sh".into(), &script, &o);
        assert!(t.note.contains("wrote no torch-moe.json"), "{}", t.note);
        let t = run_script(&"/nonexistent/python".into(), &script, &o);
        assert!(t.note.contains("could not run /nonexistent/python"), "{}", t.note);
        let _ = std::fs::remove_dir_all(dir);
    }
}
