//! The recent arrival rate of one model's requests, for the batching policy's one question about the future: if
//! a free executor waits, will a request come to share its batch? Requests admitted over the last [`WINDOW`] (at
//! most [`KEEP`] of them) give the rate. A plain struct: every call takes `now`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How far back the rate looks.
pub(crate) const WINDOW: Duration = Duration::from_millis(100);

/// Most admissions remembered: at higher rates the rate is measured over the last `KEEP` of them.
pub(crate) const KEEP: usize = 256;

/// When requests were admitted lately.
#[derive(Debug, Default)]
pub(crate) struct Arrivals {
    recent: VecDeque<Instant>,
}

impl Arrivals {
    /// Notes a request admitted at `now`.
    pub(crate) fn admitted(&mut self, now: Instant) {
        self.forget(now);
        if self.recent.len() == KEEP {
            self.recent.pop_front();
        }
        self.recent.push_back(now);
    }

    fn forget(&mut self, now: Instant) {
        while let Some(&at) = self.recent.front() {
            if now.saturating_duration_since(at) <= WINDOW {
                break;
            }
            self.recent.pop_front();
        }
    }

    /// Requests per second over the last [`WINDOW`], or `None` when none came.
    pub(crate) fn rate(&mut self, now: Instant) -> Option<f64> {
        self.forget(now);
        let (&oldest, count) = (self.recent.front()?, self.recent.len());
        // A full memory spans less than the window: measure over what it spans (at least a microsecond).
        let span = if count == KEEP {
            now.saturating_duration_since(oldest)
                .max(Duration::from_micros(1))
        } else {
            WINDOW
        };
        Some(count as f64 / span.as_secs_f64())
    }

    /// The chance that at least one request arrives within `wait`, for Poisson arrivals at the recent rate.
    pub(crate) fn chance_within(&mut self, now: Instant, wait: Duration) -> Option<f64> {
        let rate = self.rate(now)?;
        Some(1.0 - (-rate * wait.as_secs_f64()).exp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_rate_is_over_the_last_window_and_forgets_older_arrivals() {
        let t0 = Instant::now();
        let mut a = Arrivals::default();
        assert_eq!(a.rate(t0), None);
        // 10 requests over 50 ms: 100 requests/s over the 100 ms window.
        for i in 0..10 {
            a.admitted(t0 + 5 * MS * i);
        }
        let rate = a.rate(t0 + 50 * MS).expect("a rate");
        assert!((rate - 100.0).abs() < 1e-9, "{rate}");
        // 200 ms later every one of them is out of the window.
        assert_eq!(a.rate(t0 + 250 * MS), None);
    }

    #[test]
    fn at_high_rates_the_rate_is_over_the_remembered_span() {
        let t0 = Instant::now();
        let mut a = Arrivals::default();
        // 10,000 requests/s for 50 ms: more than KEEP arrivals within the window.
        for i in 0..500u32 {
            a.admitted(t0 + Duration::from_micros(100) * i);
        }
        let now = t0 + Duration::from_micros(100) * 499;
        let rate = a.rate(now).expect("a rate");
        // KEEP arrivals over (KEEP - 1) intervals of 100 us.
        let expected = KEEP as f64 / ((KEEP - 1) as f64 * 1e-4);
        assert!(
            (rate - expected).abs() / expected < 1e-9,
            "{rate} vs {expected}"
        );
    }

    #[test]
    fn the_chance_of_an_arrival_grows_with_the_wait_and_the_rate() {
        let t0 = Instant::now();
        let mut a = Arrivals::default();
        for i in 0..10 {
            a.admitted(t0 + MS * i);
        }
        // 100 requests/s: within 1 ms, 1 - e^-0.1; within 10 ms, 1 - e^-1.
        let p1 = a.chance_within(t0 + 10 * MS, MS).expect("a rate");
        let p10 = a.chance_within(t0 + 10 * MS, 10 * MS).expect("a rate");
        assert!((p1 - (1.0 - (-0.1f64).exp())).abs() < 1e-9, "{p1}");
        assert!((p10 - (1.0 - (-1.0f64).exp())).abs() < 1e-9, "{p10}");
    }
}
