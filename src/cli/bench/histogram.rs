//! Latency histogram for `drivelet bench`: log-linear buckets over nanoseconds, fixed
//! size, cheap to record into and to merge.
//!
//! Rules:
//! - values below 128 ns are counted exactly; above, every power of two is split into
//!   64 equal buckets, so a bucket is never wider than 1/64 of its lower bound and a
//!   reported percentile is at most 1.6 % above the true one;
//! - a percentile is nearest-rank: the upper bound of the bucket holding the
//!   `ceil(q * n)`-th smallest value, clamped to the smallest and largest values
//!   recorded, so p50 <= p95 <= p99 <= max always holds and no percentile is above a
//!   value that was seen;
//! - histograms merge by adding counts: one histogram per caller, merged at the end,
//!   gives the same answer as one shared histogram.

use std::time::Duration;

/// Bits of a value kept exactly: values below `2^SUB_BITS` have a bucket each.
const SUB_BITS: u32 = 7;
/// Buckets per power of two above the exact range.
const HALF: u64 = 1 << (SUB_BITS - 1);
/// Number of buckets: enough for any `u64`.
const BUCKETS: usize = ((64 - SUB_BITS + 2) as usize) * HALF as usize;

/// The bucket of a value.
fn index(v: u64) -> usize {
    if v < (1 << SUB_BITS) {
        return v as usize;
    }
    let high = 63 - v.leading_zeros();
    let shift = high - SUB_BITS + 1;
    (u64::from(shift) * HALF + (v >> shift)) as usize
}

/// The lowest and highest value (inclusive) a bucket holds.
fn bounds(i: usize) -> (u64, u64) {
    let i = i as u64;
    if i < (1 << SUB_BITS) {
        return (i, i);
    }
    let shift = i / HALF - 1;
    let mantissa = i - shift * HALF;
    let lo = mantissa << shift;
    (lo, lo + ((1u64 << shift) - 1))
}

/// Latencies in nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Histogram {
    counts: Vec<u64>,
    n: u64,
    sum: u128,
    min: u64,
    max: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram { counts: vec![0; BUCKETS], n: 0, sum: 0, min: u64::MAX, max: 0 }
    }
}

impl Histogram {
    /// An empty histogram.
    pub fn new() -> Histogram {
        Histogram::default()
    }

    /// Records one latency.
    pub fn record(&mut self, d: Duration) {
        self.record_ns(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }

    /// Records one latency in nanoseconds.
    pub fn record_ns(&mut self, ns: u64) {
        self.counts[index(ns)] += 1;
        self.n += 1;
        self.sum += u128::from(ns);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
    }

    /// Adds every value of `other`.
    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.n += other.n;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    /// Values recorded.
    pub fn count(&self) -> u64 {
        self.n
    }

    /// Smallest value, ns (`None` when empty).
    pub fn min(&self) -> Option<u64> {
        (self.n > 0).then_some(self.min)
    }

    /// Largest value, ns (`None` when empty).
    pub fn max(&self) -> Option<u64> {
        (self.n > 0).then_some(self.max)
    }

    /// Arithmetic mean, ns (`None` when empty).
    pub fn mean(&self) -> Option<f64> {
        (self.n > 0).then(|| self.sum as f64 / self.n as f64)
    }

    /// The `q`-quantile (0 < q <= 1), ns, by nearest rank (`None` when empty).
    pub fn percentile(&self, q: f64) -> Option<u64> {
        if self.n == 0 {
            return None;
        }
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n);
        let mut seen = 0u64;
        for (i, c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(bounds(i).1.clamp(self.min, self.max));
            }
        }
        Some(self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_cover_every_value_without_gaps_or_overlaps() {
        let mut expect_lo = 0u64;
        for i in 0..BUCKETS {
            let (lo, hi) = bounds(i);
            assert_eq!(lo, expect_lo, "bucket {i} starts where the previous one ended");
            assert!(hi >= lo);
            assert_eq!(index(lo), i);
            assert_eq!(index(hi), i);
            if i + 1 == BUCKETS {
                assert_eq!(hi, u64::MAX, "the last bucket ends at u64::MAX");
            } else {
                expect_lo = hi + 1;
            }
        }
    }

    #[test]
    fn a_bucket_is_never_wider_than_a_sixty_fourth_of_its_values() {
        for v in [128u64, 129, 1_000, 45_678, 1_000_000, 123_456_789, u64::MAX / 3] {
            let (lo, hi) = bounds(index(v));
            assert!(lo <= v && v <= hi);
            assert!((hi - lo) as f64 <= lo as f64 / 64.0, "{v}: [{lo}, {hi}]");
        }
    }

    #[test]
    fn small_values_are_exact_and_percentiles_are_nearest_rank() {
        let mut h = Histogram::new();
        for v in 1..=100u64 {
            h.record_ns(v);
        }
        assert_eq!(h.count(), 100);
        assert_eq!(h.percentile(0.5), Some(50));
        assert_eq!(h.percentile(0.95), Some(95));
        assert_eq!(h.percentile(0.99), Some(99));
        assert_eq!(h.percentile(1.0), Some(100));
        assert_eq!(h.percentile(0.0), Some(1), "rank is at least 1");
        assert_eq!(h.min(), Some(1));
        assert_eq!(h.max(), Some(100));
        assert_eq!(h.mean(), Some(50.5));
    }

    #[test]
    fn large_values_are_within_the_bucket_precision_and_never_above_the_max() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(Duration::from_micros(v));
        }
        for (q, truth) in [(0.5, 500_000f64), (0.95, 950_000.0), (0.99, 990_000.0)] {
            let p = h.percentile(q).unwrap() as f64;
            assert!(p >= truth && p <= truth * (1.0 + 1.0 / 64.0), "q {q}: {p} vs {truth}");
        }
        assert_eq!(h.percentile(1.0), Some(1_000_000), "clamped to the largest value seen");
    }

    #[test]
    fn percentiles_are_ordered_and_within_min_and_max() {
        let mut h = Histogram::new();
        for v in [5_000u64, 5_100, 5_050, 7_000_000, 90_000, 1_000_000_000] {
            h.record_ns(v);
        }
        let p: Vec<u64> = [0.5, 0.95, 0.99, 1.0].iter().map(|q| h.percentile(*q).unwrap()).collect();
        assert!(p.windows(2).all(|w| w[0] <= w[1]), "{p:?}");
        assert!(p[0] >= h.min().unwrap() && p[3] == h.max().unwrap());
        let mut one = Histogram::new();
        one.record_ns(123_456);
        assert_eq!(one.percentile(0.5), Some(123_456), "one value: every percentile is that value");
        assert_eq!(one.percentile(0.99), Some(123_456));
    }

    #[test]
    fn merged_histograms_answer_like_one_histogram() {
        let (mut a, mut b, mut all) = (Histogram::new(), Histogram::new(), Histogram::new());
        for v in 0..500u64 {
            let ns = v * v * 37 + 11;
            if v % 3 == 0 { a.record_ns(ns) } else { b.record_ns(ns) }
            all.record_ns(ns);
        }
        a.merge(&b);
        assert_eq!(a, all);
        let mut empty = Histogram::new();
        empty.merge(&Histogram::new());
        assert_eq!(empty.percentile(0.5), None);
        assert_eq!(empty.min(), None);
        assert_eq!(empty.mean(), None);
    }
}
