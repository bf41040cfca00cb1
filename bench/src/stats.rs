//! Summary statistics of timing samples.

use serde::Serialize;

/// Median, spread and count of a set of samples (all in the same unit).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    /// Median (mean of the two middle samples for an even count).
    pub median: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
    /// Number of samples.
    pub n: usize,
}

impl Stats {
    /// Statistics of `samples`; `None` when there are none or one is not finite.
    pub fn of(samples: &[f64]) -> Option<Stats> {
        if samples.is_empty() || samples.iter().any(|x| !x.is_finite()) {
            return None;
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let n = s.len();
        let median = if n % 2 == 1 { s[n / 2] } else { 0.5 * (s[n / 2 - 1] + s[n / 2]) };
        Some(Stats { median, min: s[0], max: s[n - 1], mean: s.iter().sum::<f64>() / n as f64, n })
    }

    /// Every field multiplied by `k` (unit change).
    pub fn scaled(self, k: f64) -> Stats {
        Stats { median: self.median * k, min: self.min * k, max: self.max * k, mean: self.mean * k, n: self.n }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = Stats::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.mean, s.n), (2.0, 1.0, 3.0, 2.0, 3));
        assert_eq!(Stats::of(&[4.0, 1.0, 3.0, 2.0]).unwrap().median, 2.5);
        assert_eq!(Stats::of(&[]), None);
        assert_eq!(Stats::of(&[1.0, f64::NAN]), None);
        assert_eq!(Stats::of(&[2.0]).unwrap().scaled(1e3).median, 2000.0);
    }
}
