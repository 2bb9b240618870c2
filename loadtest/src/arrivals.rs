//! Open-loop arrivals: the send time of every request of a run, fixed before the run starts, so that a slow
//! answer never delays the requests after it (it only delays their answers, which is what is measured).
//! Constant spacing, or a Poisson process (exponential gaps), drawn from a seeded generator.

use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};
use serde::{Deserialize, Serialize};

/// How requests arrive at a given mean rate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Arrivals {
    /// Evenly spaced, `1 / rate` apart.
    Constant,
    /// A Poisson process: independent exponential gaps with mean `1 / rate`, as independent users produce.
    Poisson,
}

/// Most requests one run may schedule (8 bytes each): a guard against a rate typed with extra zeros.
pub const MAX_SCHEDULED: u64 = 50_000_000;

/// A schedule that cannot be built.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ScheduleError {
    #[error("the rate must be a positive number of requests per second, got {0}")]
    Rate(f64),
    #[error(
        "{rate} requests/s for {seconds} s would schedule {count} requests, more than the limit of {MAX_SCHEDULED}"
    )]
    TooMany { rate: f64, seconds: f64, count: u64 },
}

/// Send times, in nanoseconds from the start of the run, of every request scheduled in `[0, span)`, ascending.
pub fn schedule(
    arrivals: Arrivals,
    rate: f64,
    span: Duration,
    seed: u64,
) -> Result<Vec<u64>, ScheduleError> {
    if !(rate.is_finite() && rate > 0.0) {
        return Err(ScheduleError::Rate(rate));
    }
    let seconds = span.as_secs_f64();
    let expected = (rate * seconds).ceil() as u64;
    if expected > MAX_SCHEDULED {
        return Err(ScheduleError::TooMany {
            rate,
            seconds,
            count: expected,
        });
    }
    let end = span.as_nanos() as f64;
    let gap_ns = 1e9 / rate;
    let mut times = Vec::with_capacity(expected as usize + expected as usize / 16 + 16);
    match arrivals {
        Arrivals::Constant => {
            let mut i = 0u64;
            loop {
                let t = i as f64 * gap_ns;
                if t >= end {
                    break;
                }
                times.push(t as u64);
                i += 1;
            }
        }
        Arrivals::Poisson => {
            let gaps = Exp::new(rate).map_err(|_| ScheduleError::Rate(rate))?;
            let mut rng = StdRng::seed_from_u64(seed);
            // The first arrival is at 0, as in the constant schedule, so a run starts at once.
            let mut t = 0.0f64;
            while t < end && (times.len() as u64) < MAX_SCHEDULED {
                times.push(t as u64);
                let gap: f64 = gaps.sample(&mut rng);
                t += gap * 1e9;
            }
        }
    }
    Ok(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_arrivals_are_evenly_spaced() {
        let t = schedule(Arrivals::Constant, 4.0, Duration::from_secs(1), 0).expect("valid");
        assert_eq!(t, vec![0, 250_000_000, 500_000_000, 750_000_000]);
    }

    #[test]
    fn poisson_arrivals_have_the_requested_mean_rate_and_exponential_gaps() {
        let rate = 2_000.0;
        let t = schedule(Arrivals::Poisson, rate, Duration::from_secs(20), 7).expect("valid");
        // 40,000 expected; the count of a Poisson process has standard deviation sqrt(40,000) = 200.
        let n = t.len() as f64;
        assert!((n - 40_000.0).abs() < 5.0 * 200.0, "{n} arrivals");
        assert!(t.windows(2).all(|w| w[0] <= w[1]), "ascending");
        assert!(*t.last().expect("some") < 20_000_000_000);
        // Exponential gaps: the coefficient of variation is 1 (it is 0 for the constant schedule).
        let gaps: Vec<f64> = t.windows(2).map(|w| (w[1] - w[0]) as f64).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        let cv = var.sqrt() / mean;
        assert!((cv - 1.0).abs() < 0.05, "coefficient of variation {cv}");
        // Same seed, same schedule.
        assert_eq!(
            t,
            schedule(Arrivals::Poisson, rate, Duration::from_secs(20), 7).expect("valid")
        );
    }

    #[test]
    fn refuses_rates_that_are_not_positive_or_far_too_large() {
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let err = schedule(Arrivals::Constant, rate, Duration::from_secs(1), 0)
                .expect_err("invalid rate");
            assert!(matches!(err, ScheduleError::Rate(_)), "{err}");
        }
        let err = schedule(Arrivals::Poisson, 1e9, Duration::from_secs(60), 0).expect_err("huge");
        assert!(err.to_string().contains("more than the limit"), "{err}");
    }
}
