//! Small shared helpers: an error type, running commands, repository paths.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A message-carrying error; xtask prints it and exits non-zero.
#[derive(Debug)]
pub struct Error(String);

impl Error {
    pub fn msg(m: impl Into<String>) -> Self {
        Error(m.into())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Self {
        Error(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// The repository root (the parent of `xtask/`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask has a parent").to_path_buf()
}

/// Runs a command, failing with its stderr when it exits non-zero; returns its stdout.
pub fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().map_err(|e| Error(format!("cannot start {cmd:?}: {e}")))?;
    if !out.status.success() {
        return Err(Error(format!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Runs a command with inherited stdout/stderr; fails when it exits non-zero.
pub fn run_inherit(cmd: &mut Command) -> Result<()> {
    let st = cmd.status().map_err(|e| Error(format!("cannot start {cmd:?}: {e}")))?;
    if st.success() {
        Ok(())
    } else {
        Err(Error(format!("{cmd:?} failed ({st})")))
    }
}

/// The `bin` folder of the llvm-tools component of the device code's pinned toolchain.
pub fn llvm_bin() -> Result<PathBuf> {
    crate::toolchain::Pin::read()?.llvm_bin()
}
