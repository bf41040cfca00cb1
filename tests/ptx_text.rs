//! Reading committed PTX as text: an entry's instructions in order, and what the first of them do
//! (the static tests of `host/kernels/*.ptx`).

/// The instructions of entry `name`, in text order (labels, directives and braces left out).
pub fn body<'a>(ptx: &'a str, name: &str) -> Vec<&'a str> {
    let header = format!(".visible .entry {name}(");
    let start = ptx.find(&header).unwrap_or_else(|| panic!("no .entry {name}"));
    let after = &ptx[start + header.len()..];
    let end = after.find("\n.visible .entry ").unwrap_or(after.len());
    let open = after.find("\n{\n").unwrap_or_else(|| panic!("{name}: no body")) + 3;
    after[open..end]
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('$') && !l.starts_with('.') && !l.starts_with("//"))
        .filter(|l| !matches!(*l, "{" | "}"))
        .collect()
}

/// Where `body` first executes `instruction`, before any branch, return or memory access other
/// than its parameters: `Err` names what came first.
pub fn first_before_any_access(body: &[&str], instruction: &str) -> Result<usize, String> {
    for (i, l) in body.iter().enumerate() {
        if l.starts_with(instruction) {
            return Ok(i);
        }
        // A guarded instruction (`@%p bra ...`, `@!%p ...`) is its instruction after the guard.
        let op = match l.strip_prefix('@') {
            Some(guarded) => guarded.split_once(char::is_whitespace).map_or("", |(_, rest)| rest.trim_start()),
            None => l,
        };
        let access = (op.starts_with("ld.") && !op.starts_with("ld.param"))
            || op.starts_with("st.")
            || op.starts_with("atom.")
            || op.starts_with("red.")
            || op.starts_with("cp.")
            || op.starts_with("bra")
            || op.starts_with("ret");
        if access {
            return Err(format!("`{l}` (instruction {i}) before `{instruction}`"));
        }
    }
    Err(format!("no `{instruction}`"))
}

/// Entry `name` executes `griddepcontrol.wait` before any branch or memory access other than its
/// parameters, and `griddepcontrol.launch_dependents` after it (a kernel that may be launched
/// early, `nvfp4_gemm_abi::moe::STARTS_EARLY`).
pub fn waits_then_releases(ptx: &str, name: &str) -> Result<(), String> {
    let b = body(ptx, name);
    let wait = first_before_any_access(&b, "griddepcontrol.wait;")?;
    if b[wait + 1..].contains(&"griddepcontrol.launch_dependents;") {
        Ok(())
    } else {
        Err("no `griddepcontrol.launch_dependents` after its wait".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_access_finder_sees_what_comes_first() {
        let b =
            ["mov.u32 %r1, %tid.x;", "ld.param.b64 %rd1, [k_param_0];", "@%p1 bra $L__BB0_2;", "griddepcontrol.wait;"];
        assert!(first_before_any_access(&b, "griddepcontrol.wait;").unwrap_err().contains("bra"));
        let b = ["ld.param.b64 %rd1, [k_param_0];", "griddepcontrol.wait;", "ld.global.u32 %r1, [%rd1];"];
        assert_eq!(first_before_any_access(&b, "griddepcontrol.wait;"), Ok(1));
        let b = ["ld.u32 %r1, [%rd1];", "griddepcontrol.wait;"];
        assert!(first_before_any_access(&b, "griddepcontrol.wait;").is_err());
    }
}
