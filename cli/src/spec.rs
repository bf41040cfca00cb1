//! The shape language shared by the command-line tools (`nvfp4-gemm gen --shape`, `nvfp4-bench
//! --shape`).
//!
//! A spec is either the name of a benchmark shape (`b0`, `b1`, `b2`, `b3`, docs/measuring.md §1) or a
//! comma-separated list of `key=value` pairs:
//!
//! | key    | value                                                           |
//! |--------|-----------------------------------------------------------------|
//! | `m`    | one integer, or one per group joined by `:` (`128:384`)         |
//! | `n`    | as `m`                                                          |
//! | `k`    | as `m`                                                          |
//! | `g`    | number of groups (optional; otherwise the longest list's length) |
//! | `name` | a label for tables and plots (optional)                         |
//!
//! A single integer is used for every group. Example: `g=2,m=128:384,n=4096,k=1536` is b3;
//! `m=64:0:200,n=512,k=256` is three groups that share n and k, the second one empty.
//! Parsing checks the syntax and the list lengths only; [`nvfp4_gemm::Problem::new`] checks the
//! sizes (k a multiple of 64, n a multiple of 8).

use nvfp4_format::generate::shapes;
use nvfp4_format::GroupShape;
use std::fmt;

/// Shapes with a label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedShapes {
    /// Label for tables and plots (`b0`, or the spec's `name`, or `custom`).
    pub name: String,
    /// The groups, in order.
    pub shapes: Vec<GroupShape>,
}

impl NamedShapes {
    /// The spec that reproduces these shapes (`g=…,m=…,n=…,k=…`).
    pub fn to_spec(&self) -> String {
        let list = |f: fn(&GroupShape) -> usize| {
            let v: Vec<usize> = self.shapes.iter().map(f).collect();
            if v.windows(2).all(|w| w[0] == w[1]) && !v.is_empty() {
                v[0].to_string()
            } else {
                v.iter().map(usize::to_string).collect::<Vec<_>>().join(":")
            }
        };
        format!("g={},m={},n={},k={}", self.shapes.len(), list(|s| s.m), list(|s| s.n), list(|s| s.k))
    }
}

/// Names of the benchmark shapes, in order.
pub const BENCHMARK_NAMES: [&str; 4] = ["b0", "b1", "b2", "b3"];

/// The benchmark shapes of docs/measuring.md §1 by name (`b0`..`b3`).
pub fn benchmark(name: &str) -> Option<NamedShapes> {
    let shapes: Vec<GroupShape> = match name {
        "b0" => shapes::B0.to_vec(),
        "b1" => shapes::B1.to_vec(),
        "b2" => shapes::B2.to_vec(),
        "b3" => shapes::B3.to_vec(),
        _ => return None,
    };
    Some(NamedShapes { name: name.to_owned(), shapes })
}

/// All four benchmark shapes.
pub fn benchmarks() -> Vec<NamedShapes> {
    BENCHMARK_NAMES.iter().filter_map(|n| benchmark(n)).collect()
}

/// Why a spec was rejected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecError {
    /// The spec as given.
    pub spec: String,
    /// What is wrong with it.
    pub reason: String,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "shape spec `{}`: {} (expected b0..b3 or e.g. `g=2,m=128:384,n=4096,k=1536`)", self.spec, self.reason)
    }
}

impl std::error::Error for SpecError {}

/// Parses a spec (module docs).
pub fn parse(spec: &str) -> Result<NamedShapes, SpecError> {
    let err = |reason: String| SpecError { spec: spec.to_owned(), reason };
    let trimmed = spec.trim();
    if let Some(b) = benchmark(trimmed) {
        return Ok(b);
    }
    let mut g: Option<usize> = None;
    let mut name: Option<String> = None;
    let mut lists: [Option<Vec<usize>>; 3] = [None, None, None];
    for part in trimmed.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(err("empty item".into()));
        }
        let Some((key, value)) = part.split_once('=') else {
            return Err(err(format!("`{part}` is not key=value")));
        };
        let (key, value) = (key.trim(), value.trim());
        let slot = match key {
            "m" => 0,
            "n" => 1,
            "k" => 2,
            "g" => {
                if g.is_some() {
                    return Err(err("`g` given twice".into()));
                }
                let v = parse_int(value).map_err(|e| err(format!("g: {e}")))?;
                if v == 0 {
                    return Err(err("g must be at least 1".into()));
                }
                g = Some(v);
                continue;
            }
            "name" => {
                if value.is_empty() || !value.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
                    return Err(err("name must be letters, digits, '-', '_' or '.'".into()));
                }
                name = Some(value.to_owned());
                continue;
            }
            other => return Err(err(format!("unknown key `{other}` (known: g, m, n, k, name)"))),
        };
        if lists[slot].is_some() {
            return Err(err(format!("`{key}` given twice")));
        }
        let values: Result<Vec<usize>, String> = value.split(':').map(parse_int).collect();
        lists[slot] = Some(values.map_err(|e| err(format!("{key}: {e}")))?);
    }
    let [Some(m), Some(n), Some(k)] = lists else {
        let missing: Vec<&str> =
            ["m", "n", "k"].iter().zip(&lists).filter(|(_, l)| l.is_none()).map(|(name, _)| *name).collect();
        return Err(err(format!("missing {}", missing.join(", "))));
    };
    let longest = m.len().max(n.len()).max(k.len());
    let groups = g.unwrap_or(longest);
    for (key, list) in [("m", &m), ("n", &n), ("k", &k)] {
        if list.len() != 1 && list.len() != groups {
            return Err(err(format!(
                "{key} lists {} values for {}",
                list.len(),
                crate::commands::plural(groups, "group")
            )));
        }
    }
    let pick = |list: &[usize], i: usize| if list.len() == 1 { list[0] } else { list[i] };
    let shapes = (0..groups).map(|i| GroupShape::new(pick(&m, i), pick(&n, i), pick(&k, i))).collect();
    Ok(NamedShapes { name: name.unwrap_or_else(|| "custom".into()), shapes })
}

fn parse_int(s: &str) -> Result<usize, String> {
    let s = s.trim();
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("`{s}` is not a non-negative integer"));
    }
    s.parse::<usize>().map_err(|e| format!("`{s}`: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn benchmark_names_and_round_trip() {
        let b3 = parse("b3").unwrap();
        assert_eq!(b3.shapes, shapes::B3.to_vec());
        assert_eq!(b3.to_spec(), "g=2,m=128:384,n=4096,k=1536");
        let again = parse(&b3.to_spec()).unwrap();
        assert_eq!(again.shapes, b3.shapes);
        assert_eq!(again.name, "custom");
        assert_eq!(benchmarks().len(), 4);
        assert_eq!(benchmark("b0").unwrap().shapes.len(), 8);
    }

    #[test]
    fn lists_broadcast_and_infer_g() {
        let s = parse("m=64:0:200, n=512, k=256, name=moe").unwrap();
        assert_eq!(s.name, "moe");
        assert_eq!(
            s.shapes,
            vec![GroupShape::new(64, 512, 256), GroupShape::new(0, 512, 256), GroupShape::new(200, 512, 256)]
        );
        let s = parse("g=3,m=8,n=16,k=64").unwrap();
        assert_eq!(s.shapes, vec![GroupShape::new(8, 16, 64); 3]);
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let reason = |s: &str| parse(s).unwrap_err().reason;
        assert_eq!(reason("g=2,m=1:2:3,n=8,k=64"), "m lists 3 values for 2 groups");
        assert_eq!(reason("m=1,n=8"), "missing k");
        assert_eq!(reason("m=1,n=8,k=64,x=3"), "unknown key `x` (known: g, m, n, k, name)");
        assert_eq!(reason("m=1,m=2,n=8,k=64"), "`m` given twice");
        assert!(reason("m=-1,n=8,k=64").contains("not a non-negative integer"));
        assert!(reason("m=1,n=8,k=6x4").contains("`6x4`"));
        assert_eq!(reason("g=0,m=1,n=8,k=64"), "g must be at least 1");
        assert_eq!(reason("m=1,,n=8,k=64"), "empty item");
        assert_eq!(reason("b9"), "`b9` is not key=value");
        assert!(parse("m=1,n=8,k=64,name=a b").is_err());
        let text = parse("q").unwrap_err().to_string();
        assert!(text.contains("g=2,m=128:384"), "{text}");
    }
}
