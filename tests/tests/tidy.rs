//! Checks of the source tree that no compiler makes, in `cargo test` (CPU only; the GPU bundle
//! leaves this binary out, since the GPU machine has no source tree). Each failure names the file
//! and line.
//!
//! - GPU tests follow the convention of `nvfp4_gemm_tests` (tests/lib.rs): a test that opens a
//!   GPU, directly or through a helper, is `#[ignore = "needs …"]` with one of the known reasons,
//!   and no `#[ignore]` in the bundled crates (tests/, host/) gives another reason: the bundle
//!   runs every ignored test there. Nothing there prints that it skips and passes.
//! - ARCHITECTURE.md's code map names only paths that exist.
//! - Source comments say what and why, not history: no citation of the performance log or its
//!   numbered entries, no sessions (the log keeps those).

use std::path::{Path, PathBuf};

/// The ignore reasons the GPU bundle knows (`xtask/src/bundle.rs`, `ARCH_REASONS`).
const GPU_REASONS: [&str; 4] =
    ["needs an sm_90a GPU", "needs an sm_100a GPU", "needs an sm_90a or sm_100a GPU", "needs a CUDA driver"];

/// The helpers of tests/lib.rs that open a GPU.
const GPU_OPENERS: [&str; 3] = ["gpu_or_skip", "require_gpu", "require_any_gpu"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Every `*.rs` under the repository, outside build outputs and hidden folders.
fn rust_files() -> Vec<PathBuf> {
    files_ending(".rs")
}

/// Every file whose name ends with `suffix` under the repository, outside build outputs and
/// hidden folders.
fn files_ending(suffix: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, suffix: &str, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().unwrap().to_str().unwrap();
            if p.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "bundle") {
                    walk(&p, suffix, out);
                }
            } else if name.ends_with(suffix) {
                out.push(p);
            }
        }
    }
    let mut out = vec![];
    walk(&root(), suffix, &mut out);
    out
}

/// The shell scripts (every `*.sh` and CI's `.ci/run`) parse: most of them run only on the GPU
/// machine, where a syntax error would cost a device call.
#[test]
fn shell_scripts_parse() {
    let mut scripts = files_ending(".sh");
    scripts.push(root().join(".ci").join("run"));
    assert!(scripts.len() > 1, "no shell scripts found under {}", root().display());
    let mut problems = vec![];
    for path in &scripts {
        match std::process::Command::new("bash").arg("-n").arg(path).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => problems.push(format!("{}: {}", relative(path), String::from_utf8_lossy(&o.stderr).trim())),
            Err(e) => problems.push(format!("{}: bash could not run: {e}", relative(path))),
        }
    }
    fail(problems, "shell scripts that bash -n refuses");
}

fn relative(p: &Path) -> String {
    p.strip_prefix(root()).unwrap().display().to_string()
}

/// A function of a source file: its name, the line of `fn`, its body's text and the attribute
/// and doc lines right above it.
struct Function {
    name: String,
    line: usize,
    body: String,
    attributes: Vec<String>,
}

/// The functions of a file, found by `fn name` at the start of a line (after indentation and
/// qualifiers) and brace matching (string literals skipped).
fn functions(text: &str) -> Vec<Function> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = vec![];
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let t = ["pub(crate) ", "pub ", "const ", "unsafe "].iter().fold(t, |t, q| t.strip_prefix(q).unwrap_or(t));
        let Some(rest) = t.strip_prefix("fn ") else { continue };
        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
        let mut attributes = vec![];
        for above in lines[..i].iter().rev() {
            let a = above.trim();
            if a.starts_with("#[") || a.starts_with("///") {
                attributes.push(a.to_owned());
            } else {
                break;
            }
        }
        let tail = lines[i..].join("\n");
        out.push(Function { name, line: i + 1, body: body(&tail), attributes });
    }
    out
}

/// The text from the first `{` to its matching `}` (or up to the first `;` for a declaration).
fn body(from_fn: &str) -> String {
    let (mut depth, mut in_str, mut prev) = (0usize, false, ' ');
    let mut start = None;
    for (i, c) in from_fn.char_indices() {
        match c {
            '"' if prev != '\\' && prev != '\'' => in_str = !in_str,
            ';' if !in_str && start.is_none() => return String::new(),
            '{' if !in_str => {
                start.get_or_insert(i);
                depth += 1;
            }
            '}' if !in_str => {
                depth -= 1;
                if depth == 0 {
                    return from_fn[start.unwrap()..=i].to_owned();
                }
            }
            _ => {}
        }
        prev = if prev == '\\' && c == '\\' { ' ' } else { c };
    }
    String::new()
}

fn calls(body: &str, name: &str) -> bool {
    body.match_indices(name).any(|(i, _)| {
        let before = body[..i].chars().next_back();
        let after = &body[i + name.len()..];
        !before.is_some_and(|c| c.is_alphanumeric() || c == '_') && (after.starts_with('(') || after.starts_with("::<"))
    })
}

fn ignore_reason(attribute: &str) -> Option<&str> {
    let rest = attribute.strip_prefix("#[ignore")?;
    Some(rest.trim_start().strip_prefix('=').map_or("", |r| r.trim().trim_end_matches(']').trim().trim_matches('"')))
}

/// The comment part of a line: after the first `//` outside a string literal (not `://`).
fn comment(line: &str) -> Option<&str> {
    let mut in_str = false;
    let bytes = line.as_bytes();
    for i in 0..bytes.len() {
        match bytes[i] {
            b'"' if i == 0 || bytes[i - 1] != b'\\' => in_str = !in_str,
            b'/' if !in_str && bytes.get(i + 1) == Some(&b'/') && (i == 0 || bytes[i - 1] != b':') => {
                return Some(&line[i + 2..]);
            }
            _ => {}
        }
    }
    None
}

/// Why a comment reads as history, if it does.
fn history(comment: &str) -> Option<&'static str> {
    let lower = comment.to_lowercase();
    if lower.contains("perf.md") || lower.contains("perf-log") {
        return Some("cites the performance log (PERF.md, docs/perf-log.md)");
    }
    let b = comment.as_bytes();
    let numbered = (0..b.len()).any(|i| {
        b[i] == b'#'
            && b.get(i + 1).is_some_and(u8::is_ascii_digit)
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'&'))
    });
    if numbered {
        return Some("cites a numbered entry or issue (#N)");
    }
    let session = ["session ", "sessions "]
        .iter()
        .any(|w| lower.match_indices(w).any(|(i, _)| lower[i + w.len()..].starts_with(|c: char| c.is_ascii_digit())));
    if session {
        return Some("cites a work session");
    }
    None
}

fn fail(problems: Vec<String>, what: &str) {
    assert!(problems.is_empty(), "{what}:\n{}", problems.join("\n"));
}

#[test]
fn gpu_tests_are_ignored_with_a_known_reason() {
    let files: Vec<(PathBuf, String)> =
        rust_files().into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect();
    let mut problems = vec![];
    // The crates whose test binaries the GPU bundle runs with --include-ignored.
    let bundled = [root().join("tests"), root().join("host")];
    for (path, text) in files.iter().filter(|(p, _)| bundled.iter().any(|b| p.starts_with(b))) {
        for (i, line) in text.lines().enumerate() {
            if line.contains(concat!("SKIP", "PED")) {
                problems.push(format!(
                    "{}:{}: a test that prints that it skips passes; without its GPU it must fail \
                     (nvfp4_gemm_tests::require_gpu)",
                    relative(path),
                    i + 1
                ));
            }
            if let Some(reason) = ignore_reason(line.trim()) {
                if !GPU_REASONS.contains(&reason) {
                    problems.push(format!(
                        "{}:{}: #[ignore] with reason {reason:?}; use one of {GPU_REASONS:?}",
                        relative(path),
                        i + 1
                    ));
                }
            }
        }
    }
    // The helper library's functions that open a GPU, directly or through each other.
    let helpers: Vec<Function> = files
        .iter()
        .filter(|(p, _)| p.parent() == Some(&root().join("tests")))
        .flat_map(|(_, t)| functions(t))
        .collect();
    let tests_dir = root().join("tests").join("tests");
    for (path, text) in files.iter().filter(|(p, _)| p.starts_with(&tests_dir)) {
        let local = functions(text);
        let mut openers: Vec<String> = GPU_OPENERS.iter().map(|s| s.to_string()).collect();
        loop {
            let more: Vec<String> = helpers
                .iter()
                .chain(&local)
                .filter(|f| !openers.contains(&f.name) && openers.iter().any(|o| calls(&f.body, o)))
                .map(|f| f.name.clone())
                .collect();
            if more.is_empty() {
                break;
            }
            openers.extend(more);
        }
        for f in local.iter().filter(|f| f.attributes.iter().any(|a| a == "#[test]")) {
            let Some(opener) = openers.iter().find(|o| calls(&f.body, o)) else { continue };
            if !f.attributes.iter().any(|a| ignore_reason(a).is_some_and(|r| GPU_REASONS.contains(&r))) {
                problems.push(format!(
                    "{}:{}: test {} opens a GPU (through {opener}) but has no #[ignore = \"needs …\"]",
                    relative(path),
                    f.line,
                    f.name
                ));
            }
        }
    }
    fail(problems, "GPU tests must be ignored with one of the bundle's reasons (tests/lib.rs)");
}

#[test]
fn source_comments_carry_no_history() {
    let this_file = root().join("tests").join("tests").join("tidy.rs");
    let mut problems = vec![];
    for path in rust_files().into_iter().filter(|p| *p != this_file) {
        let text = std::fs::read_to_string(&path).unwrap();
        for (i, line) in text.lines().enumerate() {
            if let Some(why) = comment(line).and_then(history) {
                problems.push(format!("{}:{}: {why}: {}", relative(&path), i + 1, line.trim()));
            }
        }
    }
    fail(problems, "comments say what and why; history belongs in docs/perf-log.md");
}

#[test]
fn history_patterns() {
    assert_eq!(comment("let x = 1; // see #12"), Some(" see #12"));
    assert_eq!(comment("let url = \"https://x\"; // ok"), Some(" ok"));
    assert_eq!(comment("let s = \"// not a comment\";"), None);
    assert!(history(" measured in PERF.md").is_some());
    // Built at run time: the pattern under test, not a comment of this file.
    assert!(history(&format!(" ({} {} found)", "session", 9)).is_some());
    assert!(history(" issue #12").is_some());
    assert!(history(" the 2nd value; `#[repr(C)]`, &#38;").is_none());
    assert!(history(" one session of work").is_none());
}

fn is_file_name(w: &str) -> bool {
    [".rs", ".md", ".py", ".toml", ".sh"].iter().any(|e| w.len() > e.len() && w.ends_with(e))
}

/// Paths named in ARCHITECTURE.md's code map: each top-level folder (column 0), each entry
/// under it (column 10: a file or folder of its `src/`, or of the folder itself), and the files
/// the descriptions name (`name.rs` somewhere under the entry; `a/b/` or `a/b.md` from the root
/// or the entry).
#[test]
fn the_code_map_names_existing_paths() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let start = text.find("## Code map").expect("ARCHITECTURE.md has a code map");
    let block_start = text[start..].find("```\n").unwrap() + start + 4;
    let block_end = text[block_start..].find("```").unwrap() + block_start;
    let first_line = text[..block_start].lines().count() + 1;
    let exists_under = |dir: &Path, name: &str| -> bool {
        fn walk(dir: &Path, name: &str) -> bool {
            let Ok(entries) = std::fs::read_dir(dir) else { return false };
            entries.flatten().any(|e| {
                let p = e.path();
                p.file_name().is_some_and(|f| f == name) || (p.is_dir() && walk(&p, name))
            })
        }
        walk(dir, name)
    };
    let mut problems = vec![];
    let (mut top, mut entry): (Option<PathBuf>, Option<PathBuf>) = (None, None);
    for (i, line) in text[block_start..block_end].lines().enumerate() {
        let at = format!("ARCHITECTURE.md:{}", first_line + i);
        let indent = line.len() - line.trim_start().len();
        let first = line.split_whitespace().next().unwrap_or("").trim_end_matches(',');
        let mut description = line.trim_start();
        if indent == 0 && first.ends_with('/') {
            let dir = root().join(first);
            if !dir.is_dir() {
                problems.push(format!("{at}: folder {first} does not exist"));
            }
            top = Some(dir.clone());
            entry = Some(dir);
            description = &description[first.len()..];
        } else if indent == 10 && (first.ends_with('/') || is_file_name(first)) {
            let top = top.as_ref().expect("an entry under a top-level folder");
            let path = [top.join("src").join(first), top.join(first)].into_iter().find(|p| p.exists());
            match path {
                Some(p) => entry = Some(p),
                None => problems.push(format!("{at}: {} has no {first}", relative(top))),
            }
            description = &description[first.len()..];
        }
        for word in description.split_whitespace() {
            let w = word.trim_matches(|c: char| "()[],;:`'".contains(c));
            let looks_like_file = is_file_name(w);
            if w.contains('*') || w.is_empty() {
                continue;
            }
            if w.contains('/') && (w.ends_with('/') || looks_like_file) {
                let here = entry.as_ref().filter(|e| e.is_dir()).map(|e| e.join(w));
                if !root().join(w).exists() && !here.is_some_and(|p| p.exists()) {
                    problems.push(format!("{at}: {w} does not exist"));
                }
            } else if w.ends_with(".rs") || (looks_like_file && !w.contains('/')) {
                let dir = entry.as_ref().filter(|e| e.is_dir()).or(top.as_ref()).unwrap();
                if !exists_under(dir, w) {
                    problems.push(format!("{at}: no {w} under {}", relative(dir)));
                }
            }
        }
    }
    fail(problems, "ARCHITECTURE.md's code map names paths that do not exist");
}

/// Every module of `abi/src`, `kernel/src` and `host/src`, and of the diagnostic wing's
/// `diag/abi/src`, `diag/kernel/src` and `diag/host/src` (files and folders, `lib.rs` aside), is
/// an entry of ARCHITECTURE.md's code map under its crate, once (an entry may name several,
/// separated by commas, continued on the next line).
#[test]
fn the_code_map_lists_every_module_once() {
    let text = std::fs::read_to_string(root().join("ARCHITECTURE.md")).unwrap();
    let start = text.find("## Code map").expect("ARCHITECTURE.md has a code map");
    let block_start = text[start..].find("```\n").unwrap() + start + 4;
    let block_end = text[block_start..].find("```").unwrap() + block_start;
    let mut listed: Vec<(String, String)> = vec![];
    let mut top = String::new();
    let mut continues = false;
    for line in text[block_start..block_end].lines() {
        let indent = line.len() - line.trim_start().len();
        let first = line.split_whitespace().next().unwrap_or("");
        if indent == 0 && first.ends_with('/') {
            top = first.to_string();
            continues = false;
        } else if indent == 10 && (continues || first.ends_with('/') || first.trim_end_matches(',').ends_with(".rs")) {
            listed.push((top.clone(), first.trim_end_matches(',').to_string()));
            continues = first.ends_with(',');
        } else {
            continues = false;
        }
    }
    let mut problems = vec![];
    for krate in ["abi/", "kernel/", "host/", "diag/abi/", "diag/kernel/", "diag/host/"] {
        let names: Vec<&str> = listed.iter().filter(|(t, _)| t == krate).map(|(_, n)| n.as_str()).collect();
        let dir = root().join(krate).join("src");
        let mut modules: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if e.path().is_dir() {
                    format!("{name}/")
                } else {
                    name
                }
            })
            .filter(|n| n != "lib.rs" && (n.ends_with(".rs") || n.ends_with('/')))
            .collect();
        modules.sort();
        for m in &modules {
            match names.iter().filter(|n| *n == m).count() {
                1 => {}
                0 => problems.push(format!("{krate}src/{m} is not in the code map")),
                k => problems.push(format!("{krate}src/{m} is listed {k} times")),
            }
        }
    }
    fail(problems, "ARCHITECTURE.md's code map lists each module of abi, kernel and host (and diag's) once");
}
