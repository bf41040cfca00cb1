//! The device code's toolchain: the nightly pinned in `kernel/rust-toolchain.toml` (the only place
//! the pin is written), installed with rustup when missing, and named explicitly wherever the
//! kernel build needs it. Everything else in the repository builds on stable.

use crate::util::{repo_root, run, Error, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The toolchain file of the kernel crate, relative to the repository root.
const FILE: &str = "kernel/rust-toolchain.toml";

/// The pinned toolchain: its channel (e.g. `nightly-2026-05-20`) and the components the build
/// needs (`rust-src` for `-Zbuild-std`, `llvm-tools` for the link step).
#[derive(Debug, PartialEq, Eq)]
pub struct Pin {
    pub channel: String,
    pub components: Vec<String>,
}

impl Pin {
    /// Reads `kernel/rust-toolchain.toml`.
    pub fn read() -> Result<Pin> {
        let path = repo_root().join(FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| Error::msg(format!("{}: {e}", path.display())))?;
        Pin::parse(&text).map_err(|e| Error::msg(format!("{}: {e}", path.display())))
    }

    /// The `channel` and `components` keys of a toolchain file (one line each; the file is ours).
    fn parse(text: &str) -> Result<Pin> {
        let value = |key: &str| {
            text.lines().find_map(|l| {
                let (k, v) = l.split_once('=')?;
                (k.trim() == key).then(|| v.trim().to_owned())
            })
        };
        let quoted = |v: &str| -> Vec<String> { v.split('"').skip(1).step_by(2).map(str::to_owned).collect() };
        let channel = value("channel").map(|v| quoted(&v)).and_then(|q| q.into_iter().next());
        let components = value("components").map(|v| quoted(&v)).unwrap_or_default();
        match channel {
            Some(channel) if !channel.is_empty() => Ok(Pin { channel, components }),
            _ => Err(Error::msg("no `channel = \"...\"` line")),
        }
    }

    /// Installs the toolchain with its components unless all are there already (checked offline,
    /// so a machine that has them needs no network).
    pub fn ensure_installed(&self) -> Result<()> {
        let listed = Command::new("rustup")
            .args(["component", "list", "--installed", "--toolchain", &self.channel])
            .env("RUSTUP_AUTO_INSTALL", "0")
            .output()
            .map_err(|e| Error::msg(format!("cannot start rustup ({e}): building the device code needs rustup")))?;
        let installed = String::from_utf8_lossy(&listed.stdout);
        let installed: Vec<&str> = installed.lines().map(str::trim).collect();
        let missing: Vec<&String> = self.components.iter().filter(|c| !is_installed(&installed, c)).collect();
        if listed.status.success() && missing.is_empty() {
            return Ok(());
        }
        eprintln!(
            "xtask: installing the device toolchain {} ({FILE}) with {}",
            self.channel,
            self.components.join(", ")
        );
        let mut install = Command::new("rustup");
        install.args(["toolchain", "install", &self.channel, "--profile", "minimal", "--no-self-update"]);
        for c in &self.components {
            install.args(["-c", c]);
        }
        let status = install.status().map_err(|e| Error::msg(format!("cannot start rustup: {e}")))?;
        if !status.success() {
            return Err(Error::msg(format!("{install:?} failed ({status})")));
        }
        Ok(())
    }

    /// `cargo` of this toolchain (through rustup's `+toolchain`, which also makes it the toolchain
    /// of every rustc and linker that cargo starts).
    pub fn cargo(&self) -> Command {
        let mut cmd = Command::new("cargo");
        cmd.arg(format!("+{}", self.channel));
        cmd
    }

    /// The `bin` folder of the toolchain's llvm-tools component (llvm-link, opt, llc).
    pub fn llvm_bin(&self) -> Result<PathBuf> {
        let rustc = |arg: &str| run(Command::new("rustc").arg(format!("+{}", self.channel)).arg(arg));
        let sysroot = rustc("--print=sysroot")?;
        let host = rustc("-vV")?
            .lines()
            .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
            .ok_or_else(|| Error::msg("rustc -vV printed no host line"))?;
        let bin = Path::new(sysroot.trim()).join("lib/rustlib").join(host).join("bin");
        if !bin.join("llc").exists() {
            return Err(Error::msg(format!(
                "{} has no llc: install the llvm-tools component ({FILE} lists it; `cargo xtask build-ptx` installs it)",
                bin.display()
            )));
        }
        Ok(bin)
    }
}

/// Whether `rustup component list --installed` printed component `c`. Target-specific components
/// carry the host's triple (`llvm-tools-x86_64-unknown-linux-gnu`), which `rustc-<host>` names.
fn is_installed(installed: &[&str], c: &str) -> bool {
    let host = installed.iter().find_map(|l| l.strip_prefix("rustc-"));
    installed.iter().any(|l| *l == c || host.is_some_and(|h| *l == format!("{c}-{h}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_pin() {
        let text =
            "# comment\n[toolchain]\nchannel = \"nightly-2026-05-20\"\ncomponents = [\"rust-src\", \"llvm-tools\"]\n";
        assert_eq!(
            Pin::parse(text).unwrap(),
            Pin { channel: "nightly-2026-05-20".into(), components: vec!["rust-src".into(), "llvm-tools".into()] }
        );
        assert!(Pin::parse("[toolchain]\nprofile = \"minimal\"\n").is_err());
        // The repository's own file parses and names a dated nightly.
        assert!(Pin::read().unwrap().channel.starts_with("nightly-"));
    }

    #[test]
    fn finds_components_with_and_without_the_host_triple() {
        let installed = [
            "llvm-tools-x86_64-unknown-linux-gnu",
            "cargo-x86_64-unknown-linux-gnu",
            "rust-src",
            "rust-std-x86_64-unknown-linux-gnu",
            "rustc-x86_64-unknown-linux-gnu",
        ];
        assert!(is_installed(&installed, "rust-src"));
        assert!(is_installed(&installed, "llvm-tools"));
        assert!(!is_installed(&installed, "rustfmt"));
        assert!(!is_installed(&installed, "rust"));
        assert!(!is_installed(&installed[..4], "llvm-tools"), "no rustc line: the host is unknown");
    }
}
