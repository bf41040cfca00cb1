//! The one rule for the buffers of every call: an output shares no byte with any other buffer of
//! the call (an input, or another output of any group); inputs may share memory with each other.
//! Empty buffers (and the buffers of groups that run nothing) overlap nothing.
//!
//! A kernel that writes over what it (or another CTA) still reads, or two outputs written by
//! different CTAs, give silently wrong results; so every call checks this before any launch, in
//! `O(n log n)` for `n` buffers (the outputs sorted by address, a binary search per input), with
//! no allocation when the caller keeps the list ([`check`]), or in `O(n)` for a call with a
//! single output ([`check_one_output`]). Spans carry a number; the caller names them only for an
//! error.

use crate::error::{BufferName, Error, Result};
use crate::problem::BufferView;

/// One buffer of a call as the rule sees it: its bytes `start .. end`, whether the call writes
/// it, and an id the caller names it by if it overlaps (24 bytes, so that sorting thousands is
/// quick).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Span {
    start: u64,
    end: u64,
    /// `id << 1 | output`.
    tag: u32,
}

impl Span {
    /// The bytes of `view` (`len` elements of `element_bytes` each), named `id` (below `2^31`).
    #[inline]
    pub fn new(id: u32, view: BufferView, element_bytes: u64, output: bool) -> Span {
        let end = view.ptr.saturating_add((view.len as u64).saturating_mul(element_bytes));
        Span { start: view.ptr, end, tag: id << 1 | output as u32 }
    }

    /// Whether the call writes it.
    #[inline]
    fn output(&self) -> bool {
        self.tag & 1 != 0
    }

    /// Whether it has no byte.
    #[inline]
    fn is_empty(&self) -> bool {
        self.start >= self.end
    }

    /// Whether both have a byte in common (empty spans have none).
    #[inline]
    fn overlaps(&self, o: &Span) -> bool {
        self.start < o.end && o.start < self.end && !self.is_empty() && !o.is_empty()
    }
}

/// The error for spans that overlap, at least one of them an output: `later` is named as the
/// output when it is one (of two outputs, the one at the higher address).
fn overlap(call: &'static str, earlier: &Span, later: &Span, name: impl Fn(u32) -> BufferName) -> Error {
    let (output, other) = if later.output() { (later, earlier) } else { (earlier, later) };
    Error::Overlap { call, output: name(output.tag >> 1), other: name(other.tag >> 1) }
}

/// Checks the rule over `spans` (reordered in place: the outputs first, sorted by address);
/// `name` names a span's id in the error. Sorted outputs that do not overlap each other have
/// increasing ends too, so the first output ending after an input's start is the only one that
/// can overlap it: one binary search per input. O(n + outputs · log outputs + inputs · log
/// outputs).
pub(crate) fn check(call: &'static str, spans: &mut [Span], name: impl Fn(u32) -> BufferName) -> Result<()> {
    // Non-empty outputs first; empty spans overlap nothing.
    let mut outputs = 0;
    for i in 0..spans.len() {
        if spans[i].output() && !spans[i].is_empty() {
            spans.swap(i, outputs);
            outputs += 1;
        }
    }
    let (outs, ins) = spans.split_at_mut(outputs);
    outs.sort_unstable_by_key(|s| s.start);
    for w in outs.windows(2) {
        if w[1].start < w[0].end {
            return Err(overlap(call, &w[0], &w[1], name));
        }
    }
    for i in ins.iter().filter(|i| !i.is_empty()) {
        // The first output ending after the input starts.
        let j = outs.partition_point(|o| o.end <= i.start);
        if let Some(o) = outs.get(j).filter(|o| o.start < i.end) {
            return Err(overlap(call, o, i, name));
        }
    }
    Ok(())
}

/// [`check`] for a call whose only output is `output`: it overlaps none of `inputs`. O(n).
pub(crate) fn check_one_output(
    call: &'static str,
    output: Span,
    inputs: impl IntoIterator<Item = Span>,
    name: impl Fn(u32) -> BufferName,
) -> Result<()> {
    match inputs.into_iter().find(|i| i.overlaps(&output)) {
        Some(i) => Err(overlap(call, &i, &output, name)),
        None => Ok(()),
    }
}

/// Names for the spans of a call whose buffers are the fields `fields`, `id = index` in it.
pub(crate) fn fields<'a>(fields: &'a [&'static str]) -> impl Fn(u32) -> BufferName + 'a {
    move |id| BufferName { group: None, field: fields[id as usize] }
}

/// Names for the spans of a call with `per_group.len()` buffers per group, `id = per_group.len()
/// · g + i` for field `i` of group `g`.
pub(crate) fn group_fields<'a>(per_group: &'a [&'static str]) -> impl Fn(u32) -> BufferName + 'a {
    let n = per_group.len();
    move |id| BufferName { group: Some(id as usize / n), field: per_group[id as usize % n] }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELDS: [&str; 2] = ["b.values", "c"];

    /// A span of bytes `start .. end` named group `group`, field "c" (outputs) or "b.values".
    fn span(group: u32, start: u64, end: u64, output: bool) -> Span {
        Span { start, end, tag: (2 * group + output as u32) << 1 | output as u32 }
    }

    fn name(id: u32) -> BufferName {
        group_fields(&FIELDS)(id)
    }

    /// Every pair, directly: the rule's definition.
    fn brute(spans: &[Span]) -> bool {
        spans
            .iter()
            .enumerate()
            .all(|(i, a)| spans[i + 1..].iter().all(|b| !(a.output() || b.output()) || !a.overlaps(b)))
    }

    fn names(r: Result<()>) -> (BufferName, BufferName) {
        match r.unwrap_err() {
            Error::Overlap { call: "t", output, other } => (output, other),
            other => panic!("{other:?}"),
        }
    }

    fn n(group: usize, field: &'static str) -> BufferName {
        BufferName { group: Some(group), field }
    }

    fn run(spans: &mut [Span]) -> Result<()> {
        check("t", spans, name)
    }

    #[test]
    fn adversarial_ranges() {
        let a = span(0, 0x1000, 0x2000, false);
        let c = |start, end| span(1, start, end, true);
        // Touching at either end: fine.
        assert!(run(&mut [a, c(0x2000, 0x3000)]).is_ok());
        assert!(run(&mut [c(0x800, 0x1000), a]).is_ok());
        // One byte in from either side, contained, containing, identical.
        for (s, e) in [(0x1fff, 0x3000), (0x800, 0x1001), (0x1100, 0x1200), (0x800, 0x3000), (0x1000, 0x2000)] {
            assert_eq!(names(run(&mut [a, c(s, e)])), (n(1, "c"), n(0, "b.values")), "{s:#x}");
            assert_eq!(names(run(&mut [c(s, e), a])), (n(1, "c"), n(0, "b.values")), "{s:#x}");
        }
        // Inputs may share memory, in any way.
        let b = span(2, 0x1000, 0x2000, false);
        let b2 = span(3, 0x1800, 0x4000, false);
        assert!(run(&mut [a, b, b2, c(0x4000, 0x5000)]).is_ok());
        // Two outputs: an error.
        let c2 = span(4, 0x4ffe, 0x6000, true);
        assert_eq!(names(run(&mut [c(0x4000, 0x5000), c2])), (n(4, "c"), n(1, "c")));
        // Zero-length spans overlap nothing, even inside others, and hide no later overlap.
        let empty = span(5, 0x1800, 0x1800, true);
        assert!(run(&mut [a, empty, c(0x2000, 0x2100)]).is_ok());
        assert!(run(&mut [span(6, 0, 0, false), c(0x0, 0x10)]).is_ok());
        assert_eq!(names(run(&mut [a, empty, c(0x1fff, 0x2100)])), (n(1, "c"), n(0, "b.values")));
        // An output after a long input and a short one: the largest end so far decides.
        let long = span(7, 0x0, 0x9000, false);
        let short = span(8, 0x100, 0x200, false);
        assert_eq!(names(run(&mut [short, long, c(0x8000, 0x8100)])), (n(1, "c"), n(7, "b.values")));
        // An input after a long output that a later, shorter output does not reach.
        let out_long = span(9, 0x0, 0x9000, true);
        let out_short = span(10, 0x100, 0x200, true);
        let input = span(11, 0x8fff, 0x9001, false);
        assert_eq!(names(run(&mut [out_long, input])), (n(9, "c"), n(11, "b.values")));
        assert!(run(&mut [out_long, out_short]).is_err());
        // Addresses at the top of the address space saturate instead of wrapping.
        let top = Span::new(3, BufferView { ptr: u64::MAX - 1, len: 8 }, 2, true);
        assert_eq!(top.end, u64::MAX);
        assert!(run(&mut [top, span(0, 0, 0x10, false)]).is_ok());
    }

    #[test]
    fn one_output_and_names() {
        let c = span(0, 0x1000, 0x2000, true);
        let inputs = [span(1, 0x0, 0x1000, false), span(2, 0x2000, 0x3000, false)];
        assert!(check_one_output("t", c, inputs, name).is_ok());
        let inside = span(3, 0x1ff0, 0x2010, false);
        assert_eq!(names(check_one_output("t", c, [inputs[0], inside], name)), (n(0, "c"), n(3, "b.values")));
        assert!(check_one_output("t", c, [span(3, 0x1800, 0x1800, false)], name).is_ok());
        let f = fields(&["input", "values", "scales"]);
        assert_eq!(f(2), BufferName { group: None, field: "scales" });
        assert_eq!(group_fields(&["a", "b", "c"])(7), n(2, "b"));
    }

    /// Random spans over a small address range (many overlaps, touching ends, duplicates,
    /// zero lengths): the sweep agrees with every pair checked directly, and an error names a
    /// pair that overlaps, an output first.
    #[test]
    fn the_sweep_agrees_with_all_pairs() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = |bound: u64| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (state >> 33) % bound
        };
        let (mut ok, mut bad) = (0, 0);
        for case in 0..20_000 {
            let count = 1 + next(12) as u32;
            let spans: Vec<Span> = (0..count)
                .map(|g| {
                    let start = 16 * next(40);
                    let len = if next(5) == 0 { 0 } else { 16 * next(6) };
                    span(g, start, start + len, next(3) == 0)
                })
                .collect();
            let want = brute(&spans);
            let got = run(&mut spans.clone());
            assert_eq!(got.is_ok(), want, "case {case}: {spans:?}");
            if got.is_err() {
                let (o, other) = names(got);
                let find = |b: BufferName| spans[b.group.unwrap()];
                let (o, other) = (find(o), find(other));
                assert!(o.output() && o.overlaps(&other), "case {case}: {o:?} {other:?}");
                bad += 1;
            } else {
                ok += 1;
            }
            let outputs: Vec<&Span> = spans.iter().filter(|s| s.output()).collect();
            if let [single] = outputs[..] {
                let inputs = spans.iter().filter(|s| !s.output()).copied();
                assert_eq!(check_one_output("t", *single, inputs, name).is_ok(), want, "case {case}");
            }
        }
        assert!(ok > 1000 && bad > 1000, "{ok} valid, {bad} overlapping cases");
    }
}
