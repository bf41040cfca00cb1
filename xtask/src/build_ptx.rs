//! `cargo xtask build-ptx [--check] [--bless]`: device crate → PTX → cubin, for every device crate
//! (the product kernels and the diagnostic kernels, [`CRATES`]) and every architecture.

use crate::toolchain::Pin;
use crate::util::{repo_root, run_inherit, Error, Result};
use crate::{collectives, link, ptxas};
use std::path::{Path, PathBuf};

/// One build of a device crate.
pub struct Arch {
    /// ptxas / LLVM cpu name, also the file stem under each crate's output folder.
    pub name: &'static str,
    /// `--cfg` that selects the architecture's modules in the kernel crate.
    pub cfg: &'static str,
    /// Extra LLVM target features (PTX ISA version).
    pub features: &'static str,
    /// Per-kernel register caps of the product kernels, written into the PTX as `.maxnreg` (each
    /// kernel is sized for a number of resident CTAs; the caps live in the abi beside the launch
    /// geometry).
    pub register_caps: &'static [&'static [(&'static str, u32)]],
}

/// sm_90a (Hopper; `fence.proxy.tensormap` needs PTX ISA 8.3) and sm_100a (Blackwell;
/// `kind::mxf4nvf4` needs PTX ISA 8.7).
pub const ARCHES: [Arch; 2] = [
    Arch {
        name: "sm_90a",
        cfg: "arch_sm90",
        features: "+ptx83",
        register_caps: &[
            &nvfp4_gemm_abi::sm90::REGISTER_CAPS,
            &nvfp4_gemm_abi::sm90::prepack::REGISTER_CAPS,
            &nvfp4_gemm_abi::quantize::REGISTER_CAPS,
            &nvfp4_gemm_abi::moe_block::REGISTER_CAPS,
            &nvfp4_gemm_abi::moe::schedule::REGISTER_CAPS_SM90,
        ],
    },
    Arch {
        name: "sm_100a",
        cfg: "arch_sm100",
        features: "+ptx87",
        register_caps: &[
            &nvfp4_gemm_abi::quantize::REGISTER_CAPS,
            &nvfp4_gemm_abi::moe_block::REGISTER_CAPS,
            &nvfp4_gemm_abi::moe::schedule::REGISTER_CAPS_SM100,
        ],
    },
];

/// A device crate: its own cargo workspace, built for every architecture into one PTX module and
/// cubin each, with its own table of collective instructions.
pub struct DeviceCrate {
    /// Its folder (relative to the repository root), which holds its `Cargo.toml`, its
    /// `target/` and its collective table `collectives.txt`.
    pub dir: &'static str,
    /// The library's name (the linked PTX's file stem).
    pub lib: &'static str,
    /// Where its PTX and cubins go (relative to the root), `<arch>.ptx` and `<arch>.cubin`.
    pub out: &'static str,
    /// Whether the architecture's register caps apply (they name product kernels only).
    pub capped: bool,
}

/// The product kernels, which the library embeds, and the diagnostic kernels (probes, smoke, TMA
/// bandwidth), which only the diagnostic crate (`diag/host/`) loads.
pub const CRATES: [DeviceCrate; 2] = [
    DeviceCrate { dir: "kernel", lib: "nvfp4_gemm_kernel", out: "host/kernels", capped: true },
    DeviceCrate { dir: "diag/kernel", lib: "nvfp4_gemm_diag_kernel", out: "diag/kernels", capped: false },
];

pub fn run(args: &[&str]) -> Result<()> {
    let check = args.contains(&"--check");
    let bless = args.contains(&"--bless");
    // `--arch sm_90a` builds one architecture only (for quick iterations; CI builds both).
    let only = args.iter().position(|a| *a == "--arch").and_then(|i| args.get(i + 1)).copied();
    if let Some(bad) = args
        .iter()
        .enumerate()
        .find(|(i, a)| !(matches!(**a, "--check" | "--bless" | "--arch") || *i > 0 && args[i - 1] == "--arch"))
    {
        return Err(Error::msg(format!("build-ptx: unknown option {}", bad.1)));
    }
    if only.is_some_and(|o| !ARCHES.iter().any(|a| a.name == o)) {
        return Err(Error::msg("build-ptx: --arch takes sm_90a or sm_100a"));
    }
    let root = repo_root();
    let pin = Pin::read()?;
    pin.ensure_installed()?;
    let ptxas = ptxas::locate_or_install()?;
    println!("ptxas: {} ({})", ptxas.display(), ptxas::version(&ptxas)?);
    let mut stale = vec![];
    let mut problems = vec![];
    let mut report = String::new();
    let mut blessed_tables = vec![];
    for krate in &CRATES {
        let table_path = root.join(krate.dir).join("collectives.txt");
        let table = std::fs::read_to_string(&table_path).unwrap_or_default();
        let mut blessed = String::from(
            "# Warp-collective PTX instructions per kernel: arch kernel opcode count.\n\
             # Checked by `cargo xtask build-ptx`; regenerate with `--bless` and review against the source.\n",
        );
        for arch in &ARCHES {
            if only.is_some_and(|o| o != arch.name) {
                // Keep the other architecture's table lines as they are.
                blessed.push_str(&collectives::table_for(&table, arch.name));
                continue;
            }
            // The link step's output stays as it is (cargo may not relink next time); the capped
            // PTX is a file of its own, so the caps are inserted exactly once.
            let linked = build_arch(&root, &pin, krate, arch)?;
            let caps: &[&[(&str, u32)]] = if krate.capped { arch.register_caps } else { &[] };
            let ptx_text = with_register_caps(&std::fs::read_to_string(&linked)?, caps.iter().copied().flatten())?;
            let ptx = linked.with_extension("capped.ptx");
            std::fs::write(&ptx, &ptx_text)?;

            let counts = collectives::count(&ptx_text);
            let fresh = collectives::render(arch.name, &counts);
            blessed.push_str(&fresh);
            if !bless && fresh != collectives::table_for(&table, arch.name) {
                problems.push(format!(
                    "{} {}: collective instruction counts differ from {}/collectives.txt:\n--- table\n{}--- ptx\n{}\
                     (an LLVM duplication into divergent code, or a source change: review, then `cargo xtask build-ptx --bless`)",
                    krate.dir,
                    arch.name,
                    krate.dir,
                    collectives::table_for(&table, arch.name),
                    fresh
                ));
            }

            let cubin = ptx.with_extension("cubin");
            let (resources, _) = ptxas::assemble(&ptxas, arch.name, &[], &ptx, &cubin)?;
            for r in &resources {
                report.push_str(&format!(
                    "{:<8} {:<28} {:>5} {:>7} {:>6} {:>6} {:>6}\n",
                    arch.name, r.name, r.registers, r.smem, r.stack_frame, r.spill_stores, r.spill_loads
                ));
                // No kernel may spill: a spill is local memory traffic on the critical path.
                let spilled = r.spill_stores + r.spill_loads;
                if spilled > 0 {
                    problems.push(format!("{} {}: {} bytes of register spills", arch.name, r.name, spilled));
                }
            }

            let dest = root.join(krate.out);
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
        blessed_tables.push((table_path, blessed));
    }
    println!(
        "{:<8} {:<28} {:>5} {:>7} {:>6} {:>6} {:>6}",
        "arch", "kernel", "regs", "smem", "stack", "spillS", "spillL"
    );
    print!("{report}");
    if bless {
        for (table_path, blessed) in &blessed_tables {
            std::fs::write(table_path, blessed)?;
            println!("wrote {}", table_path.display());
        }
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

/// `ptx` with a `.maxnreg` directive after the parameter list of each named kernel (PTX ISA
/// "Performance-Tuning Directives": the directive sits between an entry's parameters and its
/// body). A name that is not a kernel of the module is an error, so a renamed kernel cannot
/// silently lose its cap.
fn with_register_caps<'a>(ptx: &str, caps: impl Iterator<Item = &'a (&'a str, u32)>) -> Result<String> {
    let mut out = ptx.to_owned();
    for (kernel, registers) in caps {
        let entry = format!(".entry {kernel}(");
        let Some(at) = out.find(&entry) else {
            return Err(Error::msg(format!("register cap for `{kernel}`, which is not a kernel of this module")));
        };
        let Some(close) = out[at..].find("\n)\n") else {
            return Err(Error::msg(format!("no parameter list end after `{entry}`")));
        };
        let insert = at + close + 3;
        out.insert_str(insert, &format!(".maxnreg {registers}\n"));
    }
    Ok(out)
}

#[cfg(test)]
#[test]
fn register_caps_go_after_the_parameters() {
    let ptx = ".visible .entry k(\n\t.param .u64 p\n)\n{\n\tret;\n}\n";
    let capped = with_register_caps(ptx, [("k", 80)].iter()).unwrap();
    assert_eq!(capped, ".visible .entry k(\n\t.param .u64 p\n)\n.maxnreg 80\n{\n\tret;\n}\n");
    assert!(with_register_caps(ptx, [("gone", 80)].iter()).is_err());
}

/// Builds a device crate for one architecture with the pinned toolchain and returns the path of
/// the linked PTX.
fn build_arch(root: &Path, pin: &Pin, krate: &DeviceCrate, arch: &Arch) -> Result<PathBuf> {
    let target_dir = root.join(krate.dir).join("target").join(arch.name);
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
    let exe = std::env::current_exe()?;
    println!("building {} for {} with {} ...", krate.dir, arch.name, pin.channel);
    run_inherit(
        pin.cargo()
            .current_dir(root)
            .args(["build", "--release", "--quiet", "--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
            .arg("--manifest-path")
            .arg(root.join(krate.dir).join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&target_dir)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .env("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_RUSTFLAGS", rustflags)
            .env("CARGO_TARGET_NVPTX64_NVIDIA_CUDA_LINKER", exe)
            .env(link::LINKER_MODE_ENV, "1"),
    )?;
    let ptx = target_dir.join("nvptx64-nvidia-cuda/release").join(format!("{}.ptx", krate.lib));
    if !ptx.exists() {
        return Err(Error::msg(format!("the {} build produced no {}", krate.dir, ptx.display())));
    }
    Ok(ptx)
}
