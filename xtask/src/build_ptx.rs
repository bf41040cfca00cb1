//! `cargo xtask build-ptx [--check] [--bless]`: device crate → PTX → cubin, for every architecture.

use crate::util::{repo_root, run_inherit, Error, Result};
use crate::{collectives, link, ptxas};
use std::path::{Path, PathBuf};
use std::process::Command;

/// One build of the device crate.
pub struct Arch {
    /// ptxas / LLVM cpu name, also the file stem under `host/kernels/`.
    pub name: &'static str,
    /// `--cfg` that selects the architecture's modules in the kernel crate.
    pub cfg: &'static str,
    /// Extra LLVM target features (PTX ISA version).
    pub features: &'static str,
    /// The ptxas register cap (`-maxrregcount`) the architecture's kernels are sized for, if any.
    pub max_registers: Option<u32>,
}

/// sm_90a (Hopper; PTX ISA 8.0 is rustc's default there) and sm_100a (Blackwell; `kind::mxf4nvf4`
/// needs PTX ISA 8.7).
pub const ARCHES: [Arch; 2] = [
    Arch {
        name: "sm_90a",
        cfg: "arch_sm90",
        features: "",
        // 384 threads per CTA (one producer and two consumer warpgroups).
        max_registers: Some(nvfp4_gemm_abi::sm90::MAX_REGISTERS),
    },
    Arch { name: "sm_100a", cfg: "arch_sm100", features: "+ptx87", max_registers: None },
];

const KERNEL_LIB: &str = "nvfp4_gemm_kernel";

pub fn run(args: &[&str]) -> Result<()> {
    let check = args.contains(&"--check");
    let bless = args.contains(&"--bless");
    // `--arch sm_90a` builds one architecture only (for quick iterations; CI builds both).
    let only = args.iter().position(|a| *a == "--arch").and_then(|i| args.get(i + 1)).copied();
    if let Some(bad) = args
        .iter()
        .enumerate()
        .find(|(i, a)| !matches!(**a, "--check" | "--bless" | "--arch") && !(*i > 0 && args[i - 1] == "--arch"))
    {
        return Err(Error::msg(format!("build-ptx: unknown option {}", bad.1)));
    }
    if only.is_some_and(|o| !ARCHES.iter().any(|a| a.name == o)) {
        return Err(Error::msg("build-ptx: --arch takes sm_90a or sm_100a"));
    }
    let root = repo_root();
    let ptxas = ptxas::locate_or_install()?;
    println!("ptxas: {} ({})", ptxas.display(), ptxas::version(&ptxas)?);
    let table_path = root.join("kernel/collectives.txt");
    let table = std::fs::read_to_string(&table_path).unwrap_or_default();
    let mut blessed = String::from(
        "# Warp-collective PTX instructions per kernel: arch kernel opcode count.\n\
         # Checked by `cargo xtask build-ptx`; regenerate with `--bless` and review against the source.\n",
    );
    let mut stale = vec![];
    let mut problems = vec![];
    let mut report = String::new();
    for arch in &ARCHES {
        if only.is_some_and(|o| o != arch.name) {
            // Keep the other architecture's table lines as they are.
            blessed.push_str(&collectives::table_for(&table, arch.name));
            continue;
        }
        let ptx = build_arch(&root, arch)?;
        let ptx_text = std::fs::read_to_string(&ptx)?;

        let counts = collectives::count(&ptx_text);
        let fresh = collectives::render(arch.name, &counts);
        blessed.push_str(&fresh);
        if !bless && fresh != collectives::table_for(&table, arch.name) {
            problems.push(format!(
                "{}: collective instruction counts differ from kernel/collectives.txt:\n--- table\n{}--- ptx\n{}\
                 (an LLVM duplication into divergent code, or a source change: review, then `cargo xtask build-ptx --bless`)",
                arch.name,
                collectives::table_for(&table, arch.name),
                fresh
            ));
        }

        let cubin = ptx.with_extension("cubin");
        let flags: Vec<String> = arch.max_registers.map(|r| format!("-maxrregcount={r}")).into_iter().collect();
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let (resources, _) = ptxas::assemble(&ptxas, arch.name, &flags, &ptx, &cubin)?;
        for r in &resources {
            report.push_str(&format!(
                "{:<8} {:<28} {:>5} {:>7} {:>6} {:>6} {:>6}\n",
                arch.name, r.name, r.registers, r.smem, r.stack_frame, r.spill_stores, r.spill_loads
            ));
            if r.spill_stores + r.spill_loads > 0 {
                problems.push(format!(
                    "{} {}: {} bytes of register spills",
                    arch.name,
                    r.name,
                    r.spill_stores + r.spill_loads
                ));
            }
        }

        let dest = root.join("host/kernels");
        for (src, ext) in [(&ptx, "ptx"), (&cubin, "cubin")] {
            let target = dest.join(format!("{}.{ext}", arch.name));
            let new = std::fs::read(src)?;
            if check {
                if std::fs::read(&target).ok().as_deref() != Some(&new[..]) {
                    stale.push(target.strip_prefix(&root).unwrap_or(&target).display().to_string());
                }
            } else {
                std::fs::create_dir_all(&dest)?;
                std::fs::write(&target, &new)?;
            }
        }
    }
    println!(
        "{:<8} {:<28} {:>5} {:>7} {:>6} {:>6} {:>6}",
        "arch", "kernel", "regs", "smem", "stack", "spillS", "spillL"
    );
    print!("{report}");
    if bless {
        std::fs::write(&table_path, &blessed)?;
        println!("wrote {}", table_path.display());
    }
    if !stale.is_empty() {
        problems
            .push(format!("stale generated files: {} (run `cargo xtask build-ptx` and commit them)", stale.join(", ")));
    }
    if problems.is_empty() {
        println!("build-ptx: ok{}", if check { " (committed PTX/cubins are up to date)" } else { "" });
        Ok(())
    } else {
        Err(Error::msg(problems.join("\n")))
    }
}

/// Builds the kernel crate for one architecture and returns the path of the linked PTX.
fn build_arch(root: &Path, arch: &Arch) -> Result<PathBuf> {
    let target_dir = root.join("kernel/target").join(arch.name);
    let mut rustflags = format!(
        "-C target-cpu={} -C no-prepopulate-passes --cfg {} -C link-arg={}{:016x}",
        arch.name,
        arch.cfg,
        link::LINK_STEP_ARG,
        link::LINK_STEP_HASH
    );
    if !arch.features.is_empty() {
        rustflags.push_str(&format!(" -C target-feature={}", arch.features));
    }
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let exe = std::env::current_exe()?;
    println!("building kernel crate for {} ...", arch.name);
    run_inherit(
        Command::new(cargo)
            .current_dir(root)
            .args(["build", "--release", "--quiet", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
            .arg("--manifest-path")
            .arg(root.join("kernel/Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_RUSTFLAGS", rustflags)
            .env("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER", exe)
            .env(link::LINKER_MODE_ENV, "1"),
    )?;
    let ptx = target_dir.join("nvptx64-nvidia-cuda/release").join(format!("{KERNEL_LIB}.ptx"));
    if !ptx.exists() {
        return Err(Error::msg(format!("the kernel build produced no {}", ptx.display())));
    }
    Ok(ptx)
}
