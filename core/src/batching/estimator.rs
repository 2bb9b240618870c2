//! An online estimate of how long executing a batch takes, per bucket size, learned from measurements (warm-up
//! runs first, then every executed batch) as an exponentially weighted moving average. Read by the batcher for
//! admission and deadline decisions; written by the executors. Lock-free: one atomic per bucket.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Weight of a new measurement in the moving average.
const ALPHA: f64 = 0.1;

/// What to assume before any batch size has been measured.
const UNMEASURED: Duration = Duration::from_millis(1);

#[derive(Debug)]
pub struct Estimator {
    buckets: Vec<usize>,
    /// Nanoseconds per bucket; 0 = not measured yet.
    nanos: Vec<AtomicU64>,
}

impl Estimator {
    /// `buckets`: the ascending batch sizes that will be executed.
    pub(crate) fn new(buckets: &[usize]) -> Estimator {
        Estimator {
            buckets: buckets.to_vec(),
            nanos: buckets.iter().map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn index(&self, bucket: usize) -> usize {
        self.buckets
            .iter()
            .position(|&b| b >= bucket)
            .unwrap_or(self.buckets.len().saturating_sub(1))
    }

    /// Records that a batch padded to `bucket` rows took `took`.
    pub(crate) fn observe(&self, bucket: usize, took: Duration) {
        let Some(slot) = self.nanos.get(self.index(bucket)) else {
            return;
        };
        let took = took.as_nanos() as f64;
        let old = slot.load(Ordering::Relaxed);
        let new = if old == 0 {
            took
        } else {
            old as f64 * (1.0 - ALPHA) + took * ALPHA
        };
        // Concurrent executors may overwrite each other's update: each is a valid average, so that is harmless.
        slot.store((new as u64).max(1), Ordering::Relaxed);
    }

    /// The part of a batch's time that does not grow with its rows: the intercept of the least-squares line
    /// through the measured buckets' times against their rows (zero when fewer than two buckets are measured, never
    /// negative). Running two batches as one saves about this much: next to nothing on a CPU, where a batch costs
    /// the same per row at any size; about a whole batch's time on a GPU.
    pub(crate) fn fixed_cost(&self) -> Duration {
        self.line().0
    }

    /// The line through the measured buckets' times against their rows: its intercept (at least zero, see
    /// [`Self::fixed_cost`]) and its slope, the time one more row adds (at least zero).
    pub(crate) fn line(&self) -> (Duration, Duration) {
        let points: Vec<(f64, f64)> = self
            .buckets
            .iter()
            .zip(&self.nanos)
            .filter_map(|(&rows, nanos)| match nanos.load(Ordering::Relaxed) {
                0 => None,
                n => Some((rows as f64, n as f64)),
            })
            .collect();
        if points.len() < 2 {
            return (Duration::ZERO, Duration::ZERO);
        }
        let n = points.len() as f64;
        let (mean_x, mean_y) = (
            points.iter().map(|p| p.0).sum::<f64>() / n,
            points.iter().map(|p| p.1).sum::<f64>() / n,
        );
        let sxx: f64 = points.iter().map(|p| (p.0 - mean_x).powi(2)).sum();
        let sxy: f64 = points.iter().map(|p| (p.0 - mean_x) * (p.1 - mean_y)).sum();
        let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
        let intercept = mean_y - slope * mean_x;
        (
            Duration::from_nanos(intercept.max(0.0) as u64),
            Duration::from_secs_f64(slope.max(0.0) / 1e9),
        )
    }

    /// The expected execution time of a batch padded to `bucket` rows. An unmeasured bucket is estimated from the
    /// nearest measured one, in proportion to rows.
    pub(crate) fn estimate(&self, bucket: usize) -> Duration {
        let i = self.index(bucket);
        let measured = |j: usize| match self.nanos[j].load(Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        };
        if self.nanos.is_empty() {
            return UNMEASURED;
        }
        if let Some(n) = measured(i) {
            return Duration::from_nanos(n);
        }
        let nearest = (1..self.buckets.len())
            .flat_map(|d| [i.checked_sub(d), Some(i + d)])
            .flatten()
            .find(|&j| j < self.buckets.len() && measured(j).is_some());
        match nearest {
            Some(j) => {
                let per_row = measured(j).unwrap_or(0) as f64 / self.buckets[j] as f64;
                Duration::from_nanos((per_row * self.buckets[i] as f64) as u64)
            }
            None => UNMEASURED,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fixed_cost_is_the_intercept_of_time_against_rows() {
        let e = Estimator::new(&[10, 100, 1000]);
        assert_eq!(e.fixed_cost(), Duration::ZERO, "nothing measured");
        e.observe(100, Duration::from_micros(1_050));
        assert_eq!(e.fixed_cost(), Duration::ZERO, "one point has no line");
        // 50 us plus 10 us a row.
        e.observe(10, Duration::from_micros(150));
        e.observe(1000, Duration::from_micros(10_050));
        let fixed = e.fixed_cost().as_secs_f64() * 1e6;
        assert!((fixed - 50.0).abs() < 0.01, "{fixed} us");
        let per_row = e.line().1.as_secs_f64() * 1e6;
        assert!((per_row - 10.0).abs() < 0.001, "{per_row} us a row");
        // The same time whatever the rows: all of it is fixed.
        let flat = Estimator::new(&[10, 100, 1000]);
        for b in [10, 100, 1000] {
            flat.observe(b, Duration::from_millis(2));
        }
        assert_eq!(flat.fixed_cost(), Duration::from_millis(2));
        // A line that would cross below zero: nothing is fixed.
        let steep = Estimator::new(&[10, 100]);
        steep.observe(10, Duration::from_micros(10));
        steep.observe(100, Duration::from_micros(1_000));
        assert_eq!(steep.fixed_cost(), Duration::ZERO);
    }

    #[test]
    fn learns_per_bucket_and_interpolates_the_rest() {
        let e = Estimator::new(&[8, 64, 512]);
        assert_eq!(e.estimate(8), UNMEASURED);
        e.observe(64, Duration::from_micros(640));
        assert_eq!(e.estimate(64), Duration::from_micros(640));
        // Unmeasured buckets scale the nearest measured one by rows.
        assert_eq!(e.estimate(8), Duration::from_micros(80));
        assert_eq!(e.estimate(512), Duration::from_micros(5120));
        // Rows between buckets use the bucket they are padded to.
        assert_eq!(e.estimate(30), Duration::from_micros(640));
        // A moving average: one slow batch moves the estimate by ALPHA of the difference.
        e.observe(64, Duration::from_micros(1640));
        assert_eq!(e.estimate(64), Duration::from_micros(740));
    }
}
