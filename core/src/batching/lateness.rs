//! How much later than admission predicted requests are answered, learned from the recent ones. Admission's
//! predicted wait is a sum of execution-time estimates for the batches ahead; their spread (batches share cores
//! with the transport, the machine stalls), the lag of the moving averages and the hand-back to the transport add
//! up to an error that grows with the queue. Admission keeps a margin of the high quantile of that error, so a
//! request admitted at the edge of its budget still ends inside it, and the queue under overload is only as long
//! as the measured error allows.

use std::time::{Duration, Instant};

/// Answers the quantile is taken over: under overload about half a second of traffic.
const WINDOW: usize = 1024;

/// The quantile of lateness admission keeps as margin.
const QUANTILE: f64 = 0.99;

/// Answers needed before the margin is trusted; until then it is zero.
const MIN_SAMPLES: usize = 64;

/// The margin is recomputed after this many answers (a selection over the window each time).
const RECOMPUTE_EVERY: usize = 32;

/// Lateness of the recent answers and the margin derived from it.
#[derive(Debug)]
pub(crate) struct Lateness {
    /// Answer time minus predicted answer time, in nanoseconds; negative when early. A ring of `WINDOW`.
    samples: Vec<i64>,
    next: usize,
    since_recompute: usize,
    scratch: Vec<i64>,
    margin: Duration,
}

impl Default for Lateness {
    fn default() -> Self {
        Lateness {
            samples: Vec::with_capacity(WINDOW),
            next: 0,
            since_recompute: 0,
            scratch: Vec::with_capacity(WINDOW),
            margin: Duration::ZERO,
        }
    }
}

impl Lateness {
    /// Records one answer, predicted for `promised`, that came at `answered`.
    pub(crate) fn observe(&mut self, promised: Instant, answered: Instant) {
        let nanos = |d: Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
        let sample = nanos(answered.saturating_duration_since(promised))
            .saturating_sub(nanos(promised.saturating_duration_since(answered)));
        if self.samples.len() < WINDOW {
            self.samples.push(sample);
        } else {
            self.samples[self.next] = sample;
        }
        self.next = (self.next + 1) % WINDOW;
        self.since_recompute += 1;
        if self.since_recompute >= RECOMPUTE_EVERY || self.samples.len() == MIN_SAMPLES {
            self.since_recompute = 0;
            self.recompute();
        }
    }

    fn recompute(&mut self) {
        if self.samples.len() < MIN_SAMPLES {
            self.margin = Duration::ZERO;
            return;
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(&self.samples);
        let rank = ((self.scratch.len() as f64 * QUANTILE).ceil() as usize)
            .clamp(1, self.scratch.len())
            - 1;
        let (_, &mut q, _) = self.scratch.select_nth_unstable(rank);
        self.margin = Duration::from_nanos(q.max(0) as u64);
    }

    /// The high quantile of recent lateness (zero when answers come early, or too few have been seen).
    pub(crate) fn margin(&self) -> Duration {
        self.margin
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn margin_is_the_high_quantile_of_recent_lateness() {
        let t0 = Instant::now();
        let mut l = Lateness::default();
        // Too few answers: no margin yet.
        for _ in 0..MIN_SAMPLES - 1 {
            l.observe(t0, t0 + 5 * MS);
        }
        assert_eq!(l.margin(), Duration::ZERO);
        l.observe(t0, t0 + 5 * MS);
        assert_eq!(l.margin(), 5 * MS);

        // A full window: 1..=1024 µs late in shuffled order; the 99th percentile is the 1014th smallest.
        let mut l = Lateness::default();
        for i in 0..WINDOW as u64 {
            let us = (i * 389) % WINDOW as u64 + 1;
            l.observe(t0, t0 + Duration::from_micros(us));
        }
        assert_eq!(l.margin(), Duration::from_micros(1014));

        // Answers that come early leave no margin.
        let mut l = Lateness::default();
        for _ in 0..WINDOW {
            l.observe(t0 + 3 * MS, t0);
        }
        assert_eq!(l.margin(), Duration::ZERO);
    }

    #[test]
    fn old_answers_leave_the_window() {
        let t0 = Instant::now();
        let mut l = Lateness::default();
        for _ in 0..WINDOW {
            l.observe(t0, t0 + 20 * MS);
        }
        assert_eq!(l.margin(), 20 * MS);
        // The load eases: a window of punctual answers replaces the late ones.
        for _ in 0..WINDOW {
            l.observe(t0 + MS, t0);
        }
        assert_eq!(l.margin(), Duration::ZERO);
        // A few very late answers among many punctual ones stay below the 99th percentile…
        for i in 0..WINDOW {
            let late = if i % 200 == 0 { 50 * MS } else { MS };
            l.observe(t0, t0 + late);
        }
        assert_eq!(l.margin(), MS);
        // …but two in a hundred do not.
        for i in 0..WINDOW {
            let late = if i % 50 == 0 { 50 * MS } else { MS };
            l.observe(t0, t0 + late);
        }
        assert_eq!(l.margin(), 50 * MS);
    }
}
