//! Device-sized (MoE) routings for the GPU tests: offsets of a router's sort, and the contiguous
//! routings every device-sized test runs (random, empty experts, one expert taking everything,
//! unused rows before and after).

use nvfp4_format::SplitMix64;

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
