//! ptxas: where it comes from and what its `-v` report says.
//!
//! The committed cubins are built with ptxas 12.9 from the PyPI wheel
//! `nvidia-cuda-nvcc-cu12==12.9.86`, which this module installs with pip into `.tools/pypi/`
//! (ignored by git) when it is missing. `PTXAS=/path/to/ptxas` overrides it (then `--check` may
//! report the cubins as different if that ptxas is another version).

use crate::util::{repo_root, run, Error, Result};
use std::path::PathBuf;
use std::process::Command;

const WHEEL: &str = "nvidia-cuda-nvcc-cu12==12.9.86";

/// Returns the ptxas to use, installing the pinned wheel first when needed.
pub fn locate_or_install() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("PTXAS") {
        return Ok(PathBuf::from(p));
    }
    let target = repo_root().join(".tools/pypi");
    let ptxas = target.join("nvidia/cuda_nvcc/bin/ptxas");
    if !ptxas.exists() {
        eprintln!("xtask: installing ptxas ({WHEEL}) into {}", target.display());
        let pip = |python: &str| {
            Command::new(python)
                .args(["-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check", "--target"])
                .arg(&target)
                .arg(WHEEL)
                .status()
        };
        let ok =
            pip("python3").map(|s| s.success()).unwrap_or(false) || pip("python").map(|s| s.success()).unwrap_or(false);
        if !ok || !ptxas.exists() {
            return Err(Error::msg(format!(
                "could not install ptxas: `python3 -m pip install --no-deps --target {} {WHEEL}` failed; \
                 install it by hand or set PTXAS",
                target.display()
            )));
        }
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mut perm = std::fs::metadata(&ptxas)?.permissions();
        if perm.mode() & 0o111 == 0 {
            perm.set_mode(0o755);
            std::fs::set_permissions(&ptxas, perm)?;
        }
    }
    Ok(ptxas)
}

/// ptxas's version line, e.g. "Cuda compilation tools, release 12.9, V12.9.86".
pub fn version(ptxas: &PathBuf) -> Result<String> {
    let v = run(Command::new(ptxas).arg("--version"))?;
    Ok(v.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").to_owned())
}

/// Resources of one function as ptxas `-v` reports them.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Resources {
    pub name: String,
    pub registers: u32,
    pub stack_frame: u32,
    pub spill_stores: u32,
    pub spill_loads: u32,
    pub smem: u32,
}

/// Assembles `ptx` for `arch` into `cubin`, returning the per-function report and ptxas's text.
pub fn assemble(
    ptxas: &PathBuf,
    arch: &str,
    flags: &[&str],
    ptx: &PathBuf,
    cubin: &PathBuf,
) -> Result<(Vec<Resources>, String)> {
    let out = Command::new(ptxas)
        .arg(format!("-arch={arch}"))
        .args(["-O3", "-v", "--warn-on-spills"])
        .args(flags)
        .arg(ptx)
        .arg("-o")
        .arg(cubin)
        .output()?;
    let text = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Error::msg(format!("ptxas -arch={arch} failed on {}:\n{text}", ptx.display())));
    }
    if let Some(line) = serialized_wgmma(&text) {
        return Err(Error::msg(format!("ptxas -arch={arch} serialized wgmma on {}: {line}", ptx.display())));
    }
    Ok((parse_report(&text), text))
}

/// ptxas's note that it serialized a kernel's `wgmma`s (C7510..C7515: "Potential Performance
/// Loss: wgmma.mma_async instructions are serialized due to ..."): every MMA then waits for the
/// previous one, which costs the sm_90a GEMM most of its speed while the build still succeeds.
/// Treated as an error, like spills.
pub fn serialized_wgmma(text: &str) -> Option<&str> {
    text.lines().find(|l| l.contains("wgmma.mma_async instructions are serialized"))
}

#[cfg(test)]
#[test]
fn finds_wgmma_serialization() {
    let note = "ptxas info    : (C7512) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the function 'k'";
    assert_eq!(serialized_wgmma(&format!("ptxas info : Used 3 registers\n{note}\n")), Some(note));
    assert_eq!(serialized_wgmma("ptxas info : Used 3 registers"), None);
}

/// Parses `ptxas -v` output into one [`Resources`] per function.
pub fn parse_report(text: &str) -> Vec<Resources> {
    let mut all: Vec<Resources> = vec![];
    let num_before = |line: &str, key: &str| -> Option<u32> {
        let at = line.find(key)?;
        line[..at].split_whitespace().last()?.parse().ok()
    };
    for line in text.lines() {
        if let Some(rest) = line.split("Function properties for ").nth(1) {
            all.push(Resources { name: rest.trim().to_owned(), ..Default::default() });
        } else if let Some(r) = all.last_mut() {
            if let Some(v) = num_before(line, "bytes stack frame") {
                r.stack_frame = v;
            }
            if let Some(v) = num_before(line, "bytes spill stores") {
                r.spill_stores = v;
            }
            if let Some(v) = num_before(line, "bytes spill loads") {
                r.spill_loads = v;
            }
            if line.contains("Used ") {
                if let Some(v) = line.split("Used ").nth(1).and_then(|s| s.split_whitespace().next()) {
                    r.registers = v.parse().unwrap_or(0);
                }
                if let Some(v) = num_before(line, "bytes smem") {
                    r.smem = v;
                }
            }
        }
    }
    all
}

#[cfg(test)]
mod tests {
    use super::parse_report;

    #[test]
    fn parses_a_ptxas_report() {
        let text = "ptxas info    : Compiling entry function 'k' for 'sm_90a'\n\
                    ptxas info    : Function properties for k\n\
                    \x20   8 bytes stack frame, 4 bytes spill stores, 4 bytes spill loads\n\
                    ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 384 bytes cmem[0]\n";
        let r = &parse_report(text)[0];
        assert_eq!(
            (r.name.as_str(), r.registers, r.stack_frame, r.spill_stores, r.spill_loads, r.smem),
            ("k", 40, 8, 4, 4, 1024)
        );
    }
}
