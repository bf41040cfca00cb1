//! Developer commands for this repository. Run as `cargo xtask <command>`.
//!
//! - `build-ptx [--check] [--bless]`: installs the device toolchain pinned in
//!   `kernel/rust-toolchain.toml` when missing (see [`toolchain`]), builds the device crates with it
//!   (`kernel/`, the product kernels; `diag/kernel/`, the diagnostic kernels) for sm_90a and
//!   sm_100a, links each to PTX (see [`link`]), lints the collective instructions, assembles cubins
//!   with ptxas, prints the resource report and writes `host/kernels/` and `diag/kernels/`.
//!   `--check` compares with the committed files instead of writing them; `--bless` rewrites each
//!   crate's `collectives.txt` from the fresh PTX.
//! - `ptxas-path`: installs ptxas if missing and prints its path.
//! - `bundle`: builds the release test binaries into `bundle/` with a script that runs them on the
//!   GPU machine.
//! - `bench`: builds `nvfp4-bench` and `nvfp4-gemm` in release into `bundle/bin/` with
//!   `run-bench.sh`, and prints the command to run on the GPU machine (run after `bundle`).
//!
//! When the environment variable `NVFP4_XTASK_LINK` is set, this binary acts as the nvptx64 linker
//! that rustc invokes (see [`link`]).

mod bench;
mod build_ptx;
mod bundle;
mod collectives;
mod link;
mod ptxas;
mod toolchain;
mod util;

use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::var_os(link::LINKER_MODE_ENV).is_some() {
        let args: Vec<String> = std::env::args().skip(1).collect();
        return report(link::run_link(&args));
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest: Vec<&str> = args.iter().skip(1).map(String::as_str).collect();
    let result = match args.first().map(String::as_str) {
        Some("build-ptx") => build_ptx::run(&rest),
        Some("ptxas-path") => ptxas::locate_or_install().map(|p| println!("{}", p.display())),
        Some("bundle") => bundle::run(&rest),
        Some("bench") => bench::run(&rest),
        _ => Err(util::Error::msg("usage: cargo xtask <build-ptx [--check] [--bless] | ptxas-path | bundle | bench>")),
    };
    report(result)
}

fn report(result: Result<(), util::Error>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e}");
            ExitCode::FAILURE
        }
    }
}
