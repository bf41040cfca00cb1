//! The nvptx64 link step, in place of rustc's `llvm-bitcode-linker` (which rustup cannot install
//! here). rustc invokes this binary as its linker (`NVFP4_XTASK_LINK` set, linker flavour `llbc`)
//! with the crate's bitcode objects, rlibs and the exported kernel symbols, and expects a `.ptx`.
//!
//! Steps, all with the llvm-tools of the pinned toolchain:
//! 1. `llvm-link` the objects (rlib members with `--only-needed`);
//! 2. `opt -passes=internalize,globaldce` keeping only the exported kernels;
//! 3. mark inline-asm call sites `convergent` (see [`mark_convergent`]): rustc never does, and LLVM
//!    would otherwise duplicate warp-collective instructions into divergent branches (a GPU hang);
//! 4. `opt -O3`, then `llc -O3 -mcpu=<sm> -mattr=<features>` writes the PTX.
//!
//! This only works when rustc ran no LLVM passes of its own: the kernel build passes
//! `-C no-prepopulate-passes` (otherwise SimplifyCFG has already duplicated the asm).

use crate::util::{llvm_bin, run, Error, Result};
use std::path::PathBuf;
use std::process::Command;

/// Kernels index register arrays (accumulators, fragments) in loops with constant trip counts;
/// those loops must unroll fully or the arrays go to local memory. LLVM's default full-unroll
/// threshold counts each inline-asm call as expensive and gives up on them.
const UNROLL_THRESHOLD: &str = "-unroll-threshold=2000";

/// A hash of this file, passed to the kernel build as a link argument: cargo does not know that the
/// linker changed when this file does, but it rebuilds when the flags change.
pub const LINK_STEP_HASH: u64 = {
    let bytes = include_str!("link.rs").as_bytes();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut i = 0;
    while i < bytes.len() {
        h = (h ^ bytes[i] as u64).wrapping_mul(0x0000_0100_0000_01b3);
        i += 1;
    }
    h
};

/// The link argument that carries [`LINK_STEP_HASH`].
pub const LINK_STEP_ARG: &str = "--nvfp4-link-step=";

/// Set (to anything) in the environment of the cargo build that uses this binary as linker.
pub const LINKER_MODE_ENV: &str = "NVFP4_XTASK_LINK";

/// Substrings that identify warp-collective PTX in an asm template. `options(pure)` asm is marked
/// convergent only when its template contains one, so special-register reads and conversions stay
/// movable; every side-effecting asm is marked.
const COLLECTIVE: &[&str] = &[
    ".sync",
    ".aligned",
    "bar.",
    "barrier.",
    "activemask",
    "vote.",
    "shfl.",
    "match.",
    "redux.",
    "elect.",
    "wgmma.",
    "tcgen05.",
    "mma.",
    "ldmatrix",
    "stmatrix",
    "movmatrix",
];

struct LinkArgs {
    exports: Vec<String>,
    inputs: Vec<PathBuf>,
    cpu: String,
    features: String,
    out: PathBuf,
}

fn parse(args: &[String]) -> Result<LinkArgs> {
    let mut a =
        LinkArgs { exports: vec![], inputs: vec![], cpu: String::new(), features: String::new(), out: PathBuf::new() };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().cloned().ok_or_else(|| Error::msg(format!("{arg} needs a value")));
        match arg.as_str() {
            "--export-symbol" => a.exports.push(value()?),
            "--target-cpu" => a.cpu = value()?,
            "-o" => a.out = PathBuf::from(value()?),
            "--target" | "-L" => {
                value()?;
            }
            "--debug" => {}
            s if s.starts_with("--target-feature=") => a.features = s["--target-feature=".len()..].to_owned(),
            s if s.starts_with("-O") || s.starts_with(LINK_STEP_ARG) => {}
            s if s.starts_with('-') => return Err(Error::msg(format!("nvptx link: unexpected argument {s}"))),
            s => a.inputs.push(PathBuf::from(s)),
        }
    }
    if a.out.as_os_str().is_empty() || a.cpu.is_empty() {
        return Err(Error::msg("nvptx link: missing -o or --target-cpu"));
    }
    Ok(a)
}

/// Entry point of linker mode.
pub fn run_link(args: &[String]) -> Result<()> {
    let a = parse(args)?;
    let bin = llvm_bin()?;
    let tool = |name: &str| Command::new(bin.join(name));
    let tmp = std::env::temp_dir().join(format!("nvfp4-link-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let result = (|| -> Result<()> {
        let mut link = tool("llvm-link");
        for (n, input) in a.inputs.iter().enumerate() {
            if input.extension().is_some_and(|e| e == "rlib") {
                let dir = tmp.join(format!("rlib{n}"));
                std::fs::create_dir_all(&dir)?;
                run(tool("llvm-ar").arg("x").arg(std::path::absolute(input)?).current_dir(&dir))?;
                let mut members: Vec<PathBuf> = std::fs::read_dir(&dir)?
                    .filter_map(|e| e.ok().map(|e| e.path()))
                    .filter(|p| p.extension().is_some_and(|e| e == "o"))
                    .collect();
                members.sort();
                for m in members {
                    link.arg("--only-needed").arg(m);
                }
            } else {
                link.arg(input);
            }
        }
        let linked = tmp.join("linked.bc");
        run(link.arg("-o").arg(&linked))?;
        let internal = tmp.join("internal.bc");
        run(tool("opt")
            .arg("-passes=internalize,globaldce")
            .arg(format!("-internalize-public-api-list={}", a.exports.join(",")))
            .arg(&linked)
            .arg("-o")
            .arg(&internal))?;
        let ll = tmp.join("internal.ll");
        run(tool("llvm-dis").arg(&internal).arg("-o").arg(&ll))?;
        let marked = mark_convergent(&std::fs::read_to_string(&ll)?)?;
        let marked_ll = tmp.join("convergent.ll");
        std::fs::write(&marked_ll, marked)?;
        let marked_bc = tmp.join("convergent.bc");
        run(tool("llvm-as").arg(&marked_ll).arg("-o").arg(&marked_bc))?;
        let optimized = tmp.join("optimized.bc");
        run(tool("opt").arg("-O3").arg(UNROLL_THRESHOLD).arg(&marked_bc).arg("-o").arg(&optimized))?;
        let mut llc = tool("llc");
        llc.arg("-O3").arg(format!("-mcpu={}", a.cpu));
        if !a.features.is_empty() {
            llc.arg(format!("-mattr={}", a.features));
        }
        run(llc.arg(&optimized).arg("-o").arg(&a.out))?;
        let ptx = std::fs::read_to_string(&a.out)?;
        std::fs::write(&a.out, stable_anonymous_names(&strip_comments(&ptx)))?;
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&tmp);
    result
}

/// Removes `//` comments from PTX. llc's comments name basic blocks after mangled Rust symbols,
/// whose hash depends on where the crate was built; without them the PTX is the same from any
/// checkout, which `build-ptx --check` relies on. PTX has no string literals, so `//` always starts
/// a comment.
pub fn strip_comments(ptx: &str) -> String {
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.lines() {
        match line.find("//") {
            Some(0) => continue,
            Some(at) => {
                let code = line[..at].trim_end();
                if code.is_empty() {
                    continue;
                }
                out.push_str(code);
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// Renames LLVM's anonymous globals (`anon_$_<32 hex digits>_$_<n>`: constant arrays the code
/// indexes at run time) to `anon_const_<i>`, numbered in order of first appearance. The hex part
/// is the crate's hash, which depends on where the crate was built (a path dependency's source
/// id), so without the renaming the PTX would differ between checkouts, as with the comments.
pub fn stable_anonymous_names(ptx: &str) -> String {
    const PREFIX: &str = "anon_$_";
    let mut names: Vec<String> = vec![];
    let mut out = String::with_capacity(ptx.len());
    let mut rest = ptx;
    while let Some(at) = rest.find(PREFIX) {
        out.push_str(&rest[..at]);
        let tail = &rest[at + PREFIX.len()..];
        let hex = tail.bytes().take_while(u8::is_ascii_hexdigit).count();
        let digits = tail.get(hex + 3..).map_or(0, |t| t.bytes().take_while(u8::is_ascii_digit).count());
        if hex == 32 && tail[hex..].starts_with("_$_") && digits > 0 {
            let name = &rest[at..at + PREFIX.len() + hex + 3 + digits];
            let i = names.iter().position(|n| n == name).unwrap_or_else(|| {
                names.push(name.to_owned());
                names.len() - 1
            });
            out.push_str(&format!("anon_const_{i}"));
            rest = &rest[at + name.len()..];
        } else {
            out.push_str(PREFIX);
            rest = tail;
        }
    }
    out.push_str(rest);
    out
}

/// Adds the `convergent` call-site attribute to inline-asm calls in textual LLVM IR: every
/// `asm sideeffect` call, and pure asm whose template holds a collective opcode. rustc attaches
/// `!srcloc` to every asm call right after the call's attributes, so the word goes in front of it.
/// Fails if a side-effecting asm call is left unmarked.
pub fn mark_convergent(ir: &str) -> Result<String> {
    let mut out = String::with_capacity(ir.len() + 4096);
    for line in ir.lines() {
        let is_asm = line.contains(" asm ");
        let side_effect = line.contains(" asm sideeffect ");
        let collective = is_asm && COLLECTIVE.iter().any(|c| line.contains(c));
        if (side_effect || collective) && !line.contains(" convergent, !srcloc ") {
            match line.find(", !srcloc ") {
                Some(at) => {
                    out.push_str(&line[..at]);
                    out.push_str(" convergent");
                    out.push_str(&line[at..]);
                }
                None if side_effect => {
                    return Err(Error::msg(format!("inline asm without !srcloc, cannot mark convergent: {line}")))
                }
                None => out.push_str(line),
            }
        } else {
            out.push_str(line);
        }
        out.push('\n');
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::{mark_convergent, stable_anonymous_names, strip_comments};

    #[test]
    fn comments_go_code_stays() {
        let ptx = "//\n// Generated by LLVM\n.version 8.0\n$L__BB0_1:   // %bb.3 _RNvCs1234_x\n\tbar.sync 0; // c\n\n";
        assert_eq!(strip_comments(ptx), ".version 8.0\n$L__BB0_1:\n\tbar.sync 0;\n\n");
    }

    #[test]
    fn anonymous_globals_get_names_without_the_crate_hash() {
        let h1 = "c3a6f1384c2db835b26f4995372f7fdc";
        let h2 = "1390d199b4c52ad098bffae54c4a0c6e";
        let ptx = format!(
            ".global .b8 anon_$_{h1}_$_53[12];\n.global .b8 anon_$_{h2}_$_7[4];\n\tld.global.nc.b32 %r1, [anon_$_{h1}_$_53+8];\n\tld.global.nc.b32 %r2, [anon_$_{h2}_$_7];\nanon_$_short_$_1\n"
        );
        assert_eq!(
            stable_anonymous_names(&ptx),
            ".global .b8 anon_const_0[12];\n.global .b8 anon_const_1[4];\n\tld.global.nc.b32 %r1, [anon_const_0+8];\n\tld.global.nc.b32 %r2, [anon_const_1];\nanon_$_short_$_1\n"
        );
        // Another checkout's hashes give the same text.
        let other = ptx.replace(h1, "0123456789abcdef0123456789abcdef").replace(h2, "fedcba9876543210fedcba9876543210");
        assert_eq!(stable_anonymous_names(&other), stable_anonymous_names(&ptx));
    }

    #[test]
    fn marks_side_effecting_and_collective_asm_only() {
        let ir = concat!(
            "  call void asm sideeffect \"bar.sync 0;\", \"\"() #3, !srcloc !5\n",
            "  %1 = call i32 asm \"mov.u32 $0, %tid.x;\", \"=r\"() #4, !srcloc !6\n",
            "  %2 = call i32 asm \"shfl.sync.idx.b32 $0, $1, 0, 0x1f, 0xffffffff;\", \"=r,r\"(i32 %1) #4, !srcloc !7\n",
        );
        let out = mark_convergent(ir).unwrap();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].ends_with("#3 convergent, !srcloc !5"));
        assert!(!lines[1].contains("convergent"));
        assert!(lines[2].ends_with("#4 convergent, !srcloc !7"));
    }
}
