//! Checks of the source tree that no compiler makes, in `cargo test` (CPU only; the GPU bundle
//! leaves this binary out, since the GPU machine has no source tree). Each failure names the file
//! and line.
//!
//! - GPU tests follow the convention of `nvfp4_gemm_tests` (tests/lib.rs): a test that opens a
//!   GPU, directly or through a helper, is `#[ignore = "needs …"]` with one of the known reasons,
//!   and no `#[ignore]` in the bundled crates (tests/, host/) gives another reason: the bundle
//!   runs every ignored test there.

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
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect();
        entries.sort();
        for p in entries {
            let name = p.file_name().unwrap().to_str().unwrap();
            if p.is_dir() {
                if !(name.starts_with('.') || name == "target" || name == "bundle") {
                    walk(&p, out);
                }
            } else if name.ends_with(".rs") {
                out.push(p);
            }
        }
    }
    let mut out = vec![];
    walk(&root(), &mut out);
    out
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
