//! The device-sized (MoE) GPU tests' shared parts: offsets of a router's sort, the routings every
//! device-sized test runs (random, empty experts, one expert taking everything, unused rows
//! before and after, sizes beyond the bounds), and the checks of a call's C (its guards and the
//! rows of no group untouched; each group's rows against the fp64 reference and bit for bit
//! against a host-sized plan).

use crate::{abs_reference, accumulation_allowance, GUARD, POISON};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaStream};
use half::f16;
use nvfp4_format::{reference_grouped_gemm_f64, Group, SplitMix64, Tolerance};
use nvfp4_gemm::moe::{GroupRows, MoeProblem, SizeStatus};
use nvfp4_gemm::Gpu;
use std::sync::Arc;

/// Most failures a check lists.
const LISTED: usize = 8;

/// The failures of one call, at most [`LISTED`], each prefixed by the call's description.
pub struct Failures {
    what: String,
    /// The failures found.
    pub list: Vec<String>,
}

impl Failures {
    /// No failure yet for the call `what`.
    pub fn new(what: &str) -> Failures {
        Failures { what: what.to_owned(), list: vec![] }
    }

    /// Records one failure.
    pub fn fail(&mut self, s: String) {
        if self.list.len() < LISTED {
            self.list.push(format!("{}: {s}", self.what));
        }
    }
}

/// The token rows of no group.
pub fn unowned_rows(problem: &MoeProblem, rows: &[GroupRows]) -> Vec<usize> {
    let mut owned = vec![false; problem.token_rows()];
    for r in rows {
        owned[r.first as usize..(r.first + r.rows) as usize].iter_mut().for_each(|o| *o = true);
    }
    owned.iter().enumerate().filter(|(_, o)| !**o).map(|(row, _)| row).collect()
}

/// Checks a call's status word against the host's expectation, C's guards (`c`: all of it, with
/// [`GUARD`] elements either side, as bits) and that the rows of no group kept their poison;
/// returns C without its guards.
pub fn check_bounds<'c>(
    f: &mut Failures,
    c: &'c [u16],
    problem: &MoeProblem,
    rows: &[GroupRows],
    status: SizeStatus,
    expected: SizeStatus,
) -> &'c [u16] {
    if status != expected {
        f.fail(format!("status {status} (bits {:#x}), expected {expected}", status.0));
    }
    let guards = c[..GUARD].iter().chain(&c[c.len() - GUARD..]).filter(|&&b| b != POISON).count();
    if guards > 0 {
        f.fail(format!("{guards} guard elements around C changed"));
    }
    let c = &c[GUARD..c.len() - GUARD];
    let n = problem.n();
    for row in unowned_rows(problem, rows) {
        if c[row * n..(row + 1) * n].iter().any(|&b| b != POISON) {
            f.fail(format!("C row {row} belongs to no group but was written"));
        }
    }
    c
}

/// Checks each group's rows of C (f16 bits, `[token_rows, n]`): group `spans[i] = (g, first, m)`
/// against the fp64 reference of `groups[i]` (the competition tolerance plus the fp32
/// accumulation allowance) and bit for bit against `host_sized[i]`, what the host-sized plan
/// `host` wrote for the same group.
pub fn check_groups(
    f: &mut Failures,
    c: &[u16],
    n: usize,
    spans: &[(usize, usize, usize)],
    groups: &[Group],
    host_sized: &[Vec<u16>],
    host: &str,
) {
    if groups.is_empty() {
        return;
    }
    let exact = reference_grouped_gemm_f64(groups).unwrap();
    let abs = abs_reference(groups);
    let tol = Tolerance::COMPETITION;
    for (i, &(g, first, m)) in spans.iter().enumerate() {
        let k = groups[i].k();
        let (mut bad, mut differs) = (0, 0);
        for idx in 0..m * n {
            let bits = c[first * n + idx];
            let got = f16::from_bits(bits).to_f64();
            let r = exact[i].data[idx];
            let allowed = tol.atol + tol.rtol * r.abs() + accumulation_allowance(k, abs[i].data[idx]);
            if !(tol.accepts(got, f16::from_f64(r).to_f64()) || (got - r).abs() <= allowed) {
                if bad == 0 {
                    f.fail(format!("group {g} row {} col {}: got {got} expected {r}", idx / n, idx % n));
                }
                bad += 1;
            }
            differs += (bits != host_sized[i][idx]) as usize;
        }
        if bad > 0 {
            f.fail(format!("group {g}: {bad} of {} elements outside the tolerance", m * n));
        }
        if differs > 0 {
            f.fail(format!("group {g}: {differs} elements differ from the host-sized {host}"));
        }
    }
}

/// Masked routings of `g` experts with `M_max = m`: all full, all empty, random, random of at
/// most 16 rows, only the last expert.
pub fn masked_routings(rng: &mut SplitMix64, g: usize, m: usize) -> Vec<(String, Vec<u32>)> {
    let mut routings = vec![
        ("all full".to_string(), vec![m as u32; g]),
        ("all empty".to_string(), vec![0; g]),
        ("random".to_string(), (0..g).map(|_| rng.below(m as u64 + 1) as u32).collect()),
        ("random, small".to_string(), (0..g).map(|_| rng.below(17.min(m as u64 + 1)) as u32).collect()),
    ];
    let mut one = vec![0u32; g];
    one[g - 1] = m as u32;
    routings.push(("only the last expert".into(), one));
    routings
}

/// Contiguous offsets for a router that sends `total` tokens to experts at random (sorted).
pub fn random_offsets(rng: &mut SplitMix64, groups: usize, total: usize) -> Vec<u32> {
    let mut counts = vec![0u32; groups];
    for _ in 0..total {
        counts[rng.below(groups as u64) as usize] += 1;
    }
    offsets_of(&counts, 0)
}

/// Offsets `start, start + c0, start + c0 + c1, ...`.
pub fn offsets_of(counts: &[u32], start: u32) -> Vec<u32> {
    let mut o = vec![start];
    for c in counts {
        o.push(o.last().unwrap() + c);
    }
    o
}

/// Contiguous routings of `groups` experts over at most `t` tokens: random, empty experts, one
/// expert taking every token (first, middle, last), one token each, rows unused before and after,
/// no tokens at all.
pub fn contiguous_routings(rng: &mut SplitMix64, groups: usize, t: usize) -> Vec<(String, Vec<u32>)> {
    let g = groups;
    let mut v = vec![
        ("random, all tokens".to_string(), random_offsets(rng, g, t)),
        ("random, 2/3 of the tokens".to_string(), random_offsets(rng, g, 2 * t / 3)),
        ("no tokens".to_string(), vec![0; g + 1]),
    ];
    let mut odd_empty = vec![0u32; g];
    for (e, c) in odd_empty.iter_mut().enumerate() {
        if e % 2 == 0 {
            *c = (t / g.div_ceil(2)) as u32;
        }
    }
    v.push(("every other expert empty".into(), offsets_of(&odd_empty, 0)));
    for e in [0, g / 2, g - 1] {
        let mut counts = vec![0u32; g];
        counts[e] = t as u32;
        v.push((format!("expert {e} takes every token"), offsets_of(&counts, 0)));
    }
    if g <= t {
        v.push(("one token each".into(), offsets_of(&vec![1; g], 0)));
    }
    let mut counts = vec![0u32; g];
    let inner = t.saturating_sub(20) as u32;
    for _ in 0..inner {
        counts[rng.below(g as u64) as usize] += 1;
    }
    v.push(("rows unused before and after".into(), offsets_of(&counts, (t as u32 - inner) / 2)));
    v
}

/// Runs `call(round, name, sizes)` for each routing, `rounds` times over, printing each call's
/// outcome (`call` returns its description and failures); panics listing every failure.
pub fn for_routings(
    test: &str,
    routings: &[(String, Vec<u32>)],
    rounds: usize,
    mut call: impl FnMut(usize, &str, &[u32]) -> (String, Vec<String>),
) {
    let mut failures = vec![];
    for round in 0..rounds {
        for (name, sizes) in routings {
            let (what, f) = call(round, name, sizes);
            eprintln!("{test}: {what}: {}", if f.is_empty() { "ok" } else { "FAIL" });
            failures.extend(f);
        }
    }
    assert!(failures.is_empty(), "{test}:\n{}", failures.join("\n"));
}

/// Captures what `body` enqueues on `stream` into a graph (the capture ends whatever `body`
/// returns, which is returned beside the graph).
pub fn capture<R>(stream: &Arc<CudaStream>, body: impl FnOnce() -> R) -> (CudaGraph, R) {
    stream.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL).unwrap();
    let r = body();
    (stream.end_capture(CUgraphInstantiate_flags(0)).unwrap().expect("a captured graph"), r)
}

/// Runs `body` with a stream of its own (the legacy default stream cannot be captured) and
/// cudarc's cross-stream event tracking off (an event recorded outside a capture cannot be waited
/// on inside it), restored after.
pub fn with_capture_stream(gpu: &Gpu, body: impl FnOnce(&Arc<CudaStream>)) {
    // SAFETY: the body uses its buffers on this one stream only (or synchronizes it before using
    // them elsewhere).
    unsafe { gpu.context().disable_event_tracking() };
    let stream = gpu.context().new_stream().unwrap();
    body(&stream);
    // SAFETY: restores the context's default for the other tests of this process.
    unsafe { gpu.context().enable_event_tracking() };
}
