//! Lint: per kernel, the count of warp-collective PTX instructions must equal a checked-in table
//! (`kernel/collectives.txt`, `diag/kernel/collectives.txt`). An LLVM pass that duplicates one of them into divergent code (illegal
//! for `.aligned` instructions, a hang on the GPU) changes a count and fails the build.
//!
//! Counted: any opcode containing `.aligned`, `bar.sync`/`bar.arrive`/`bar.red`, `barrier.*`,
//! `elect.sync`, `tcgen05.*`, `wgmma.*`, and `call.uni` (a call from uniform code). Review the table
//! by hand against the source when it changes (`--bless` rewrites it): an asm site inside a loop
//! with a constant trip count counts once per unrolled iteration.

use std::collections::BTreeMap;

/// (kernel or function name, opcode) → count.
pub type Counts = BTreeMap<(String, String), u32>;

fn is_collective(tok: &str) -> bool {
    tok.contains(".aligned")
        || tok.starts_with("bar.sync")
        || tok.starts_with("bar.arrive")
        || tok.starts_with("bar.red")
        || tok.starts_with("barrier.")
        || tok.starts_with("elect.sync")
        || tok.starts_with("tcgen05.")
        || tok.starts_with("wgmma.")
        || tok == "call.uni"
}

/// Counts collective opcodes per `.entry`/`.func` in a PTX module.
pub fn count(ptx: &str) -> Counts {
    let mut counts = Counts::new();
    let mut current: Option<String> = None;
    for line in ptx.lines() {
        let t = line.trim_start();
        if t.starts_with("//") {
            continue;
        }
        let header = t.trim_start_matches(".visible ").trim_start_matches(".weak ").trim_start_matches(".extern ");
        if let Some(rest) = header.strip_prefix(".entry ").or_else(|| header.strip_prefix(".func ")) {
            // `.func (.param .b32 r) name(` has a return list before the name.
            let rest = if rest.starts_with('(') { rest.split_once(')').map_or("", |x| x.1) } else { rest };
            let name: String = rest.trim_start().chars().take_while(|c| *c != '(' && !c.is_whitespace()).collect();
            current = Some(name);
            continue;
        }
        let Some(kernel) = &current else { continue };
        for tok in t.split(|c: char| c.is_whitespace() || matches!(c, ';' | '{' | '}' | ',')) {
            if is_collective(tok) {
                *counts.entry((kernel.clone(), tok.to_owned())).or_default() += 1;
            }
        }
    }
    counts
}

/// Renders counts as table lines `arch kernel opcode count`.
pub fn render(arch: &str, counts: &Counts) -> String {
    counts.iter().map(|((k, op), n)| format!("{arch} {k} {op} {n}\n")).collect()
}

/// Lines of `table` that belong to `arch`, in the same format as [`render`].
pub fn table_for(table: &str, arch: &str) -> String {
    table
        .lines()
        .filter(|l| l.split_whitespace().next() == Some(arch))
        .map(|l| format!("{}\n", l.split_whitespace().collect::<Vec<_>>().join(" ")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_function() {
        let ptx = ".visible .entry k(\n.param .u64 p)\n{\n\tbar.sync \t0;\n@%p1 bra $L;\n\twgmma.fence.sync.aligned;\n\
                   \tbarrier.cluster.arrive.release.aligned;\n\tbar.sync \t0;\n}\n.func (.param .b32 r) f(\n)\n{\n\telect.sync %r1|%p1, -1;\n}\n";
        let c = count(ptx);
        assert_eq!(c[&("k".into(), "bar.sync".into())], 2);
        assert_eq!(c[&("k".into(), "wgmma.fence.sync.aligned".into())], 1);
        assert_eq!(c[&("k".into(), "barrier.cluster.arrive.release.aligned".into())], 1);
        assert_eq!(c[&("f".into(), "elect.sync".into())], 1);
        assert_eq!(c.len(), 4);
    }
}
