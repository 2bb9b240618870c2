//! The latency-bounded throughput search: open-loop runs at increasing offered rates until a rate exceeds the
//! largest SLA (its p99 over the bound, or too many failed requests) and a few rates past it (so the chart shows
//! the knee; they do not change the answer), then bisection between the last passing and
//! the first failing rate of each SLA, one run per rate. The answer for an SLA is the highest rate such that it and
//! every lower rate tried passed. One sweep is one sample: a rate is never run again to give it another chance
//! (on a machine whose p99 swings between identical runs, that picks the lucky run); a benchmark repeats whole
//! sweeps in interleaved rounds and reports their median and worst (scripts/bench-peers-tail.sh).

use std::fmt;
use std::future::Future;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::arrivals::Arrivals;
use crate::report::RunReport;
use crate::stats::Ms;
use crate::target::TargetInfo;
use crate::workload::WorkloadInfo;

pub const SWEEP_SCHEMA: &str = "recload.sweep/v1";

/// Most rates one `--rates` expression may expand to.
const MAX_STEPS: usize = 1000;

/// Parses `--rates`: `100,200,400` (a list), `100:1600:x2` (geometric: ×2 up to 1600) or `100:1000:+100`
/// (linear). The result is ascending.
pub fn parse_rates(text: &str) -> Result<Vec<f64>, String> {
    let number = |s: &str| -> Result<f64, String> {
        let v: f64 = s
            .trim()
            .parse()
            .map_err(|_| format!("--rates: {s:?} is not a number"))?;
        if v.is_finite() && v > 0.0 {
            Ok(v)
        } else {
            Err(format!("--rates: {s:?} must be a positive rate"))
        }
    };
    let mut rates: Vec<f64> = if let [start, end, step] = text.split(':').collect::<Vec<_>>()[..] {
        let (start, end) = (number(start)?, number(end)?);
        if end < start {
            return Err(format!("--rates {text}: the end is below the start"));
        }
        let step = step.trim();
        let mut rates = Vec::new();
        let mut rate = start;
        if let Some(factor) = step.strip_prefix('x') {
            let factor = number(factor)?;
            if factor <= 1.0 {
                return Err(format!("--rates {text}: the factor must be above 1"));
            }
            while rate <= end * (1.0 + 1e-9) && rates.len() <= MAX_STEPS {
                rates.push(rate);
                rate *= factor;
            }
        } else {
            let increment = number(step.strip_prefix('+').unwrap_or(step))?;
            let mut i = 0.0;
            while rate <= end * (1.0 + 1e-9) && rates.len() <= MAX_STEPS {
                rates.push(rate);
                i += 1.0;
                rate = start + i * increment;
            }
        }
        rates
    } else {
        text.split(',').map(number).collect::<Result<_, _>>()?
    };
    if rates.len() > MAX_STEPS {
        return Err(format!("--rates {text}: more than {MAX_STEPS} rates"));
    }
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    Ok(rates)
}

/// Parses `--sla`: a comma-separated list of durations (`5ms,20ms`).
pub fn parse_slas(text: &str) -> Result<Vec<Duration>, String> {
    let mut slas = text
        .split(',')
        .map(|s| {
            humantime::parse_duration(s.trim())
                .map_err(|e| format!("--sla: {s:?} is not a duration like 5ms ({e})"))
                .and_then(|d| {
                    if d.is_zero() {
                        Err("--sla: an SLA must be positive".to_owned())
                    } else {
                        Ok(d)
                    }
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    slas.sort();
    slas.dedup();
    Ok(slas)
}

/// The answer for one SLA.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SlaResult {
    /// The SLA: p99 latency at most this many milliseconds.
    pub p99_ms: f64,
    /// Highest offered rate that met it (with every lower rate tried); `null` when the lowest rate failed.
    pub max_rps: Option<f64>,
    /// Achieved rate, p50 and p99 of the run at `max_rps`.
    pub achieved_rps: Option<f64>,
    pub p50_at_max_ms: Option<f64>,
    pub p99_at_max_ms: Option<f64>,
    /// Lowest offered rate that failed it; `null` when every rate tried met it (the answer is then a lower
    /// bound: try higher rates).
    pub first_failing_rps: Option<f64>,
    /// Why that rate failed.
    pub failure: Option<String>,
    /// Index in `steps` of the run at `first_failing_rps` (the first to miss this SLA); `null` when none missed
    /// it, and in reports older than the field.
    #[serde(default)]
    pub first_failing_step: Option<usize>,
}

/// A sweep, as `recload sweep --json` writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    pub schema: String,
    pub recload_version: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub started_at: String,
    pub target: TargetInfo,
    pub workload: WorkloadInfo,
    pub arrivals: Arrivals,
    pub connections: usize,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub timeout_s: f64,
    /// Most failed requests (as a fraction of the window's) a passing run may have.
    pub max_error_ratio: f64,
    /// Steps measure for at least this many requests (`duration_s` is the shortest window).
    #[serde(default)]
    pub min_requests: u64,
    /// Rates run past the first that missed the largest SLA, so the chart shows the knee (`0` in reports older
    /// than the field, which stopped there).
    #[serde(default)]
    pub past_knee: u32,
    /// Every run, by ascending offered rate.
    pub steps: Vec<RunReport>,
    /// One per `--sla`, ascending.
    pub sla: Vec<SlaResult>,
}

/// Why `report` fails an SLA of `sla_ms`, or `None` when it meets it.
pub fn failure(report: &RunReport, sla_ms: f64, max_error_ratio: f64) -> Option<String> {
    let ratio = report.error_ratio();
    if ratio > max_error_ratio {
        return Some(format!(
            "{:.2}% of requests failed (more than {:.2}%)",
            ratio * 100.0,
            max_error_ratio * 100.0
        ));
    }
    match report.p99_ms() {
        None => Some("no request succeeded".to_owned()),
        Some(p99) if p99 > sla_ms => Some(format!("p99 {} > {sla_ms} ms", Ms(p99))),
        Some(_) => None,
    }
}

/// The rate a run was asked for (its offered rate may differ slightly under Poisson arrivals).
fn rate_of(report: &RunReport) -> f64 {
    match report.mode {
        crate::engine::Mode::Open { rate, .. } => rate,
        crate::engine::Mode::Closed { .. } => report.achieved_rps,
    }
}

/// How the search decides.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SearchRules {
    /// Bisection runs per SLA between its last passing and first failing rate.
    pub refine: u32,
    /// Most failed requests (a fraction of the window's) a passing run may have.
    pub max_error_ratio: f64,
    /// Rates of the list still run after the first that missed the largest SLA.
    pub past_knee: u32,
}

/// The `--max-error-ratio` of a sweep, and the rule `recload run --sla` judges a run by.
pub const DEFAULT_MAX_ERROR_RATIO: f64 = 0.001;

/// Whether the stepping through the rate list goes on: until the first rate that misses the largest SLA, then
/// for `past_knee` more rates, so the chart shows how latency grows past the knee. A rate at which no request
/// succeeded ends it early: every higher rate would add nothing to draw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stepping {
    past_knee: u32,
    /// Rates run since the first miss; `None` before it.
    since_miss: Option<u32>,
}

impl Stepping {
    pub fn new(past_knee: u32) -> Stepping {
        Stepping {
            past_knee,
            since_miss: None,
        }
    }

    /// After a run that `missed` the largest SLA (or not), and that had a `latency` (some request succeeded):
    /// whether to run the next rate.
    pub fn next(&mut self, missed: bool, latency: bool) -> bool {
        self.since_miss = match self.since_miss {
            Some(n) => Some(n + 1),
            None if missed => Some(0),
            None => None,
        };
        match self.since_miss {
            None => true,
            Some(n) => latency && n < self.past_knee,
        }
    }
}

/// A rate's verdict for one SLA: its run that met it, or why it failed.
type Verdict<'a> = Result<&'a RunReport, String>;

/// The verdicts of a set of runs for one SLA, by ascending rate. A rate the runs hold more than once (a report
/// written by an older recload, which ran failing rates again) passes only if every run at it passed.
fn verdicts(runs: &[RunReport], sla_ms: f64, max_error_ratio: f64) -> Vec<(f64, Verdict<'_>)> {
    let mut rates: Vec<f64> = runs.iter().map(rate_of).collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    rates
        .into_iter()
        .map(|rate| {
            let mut at = runs.iter().filter(|r| rate_of(r) == rate);
            let verdict = match at.clone().find_map(|r| failure(r, sla_ms, max_error_ratio)) {
                Some(why) => Err(why),
                None => Ok(at.next_back().expect("a rate of the runs")),
            };
            (rate, verdict)
        })
        .collect()
}

/// The last rate of the passing prefix and the first failing rate, for one SLA.
fn bounds(runs: &[RunReport], sla_ms: f64, max_error_ratio: f64) -> (Option<f64>, Option<f64>) {
    let v = verdicts(runs, sla_ms, max_error_ratio);
    let first_fail = v.iter().position(|(_, verdict)| verdict.is_err());
    let passing = first_fail.unwrap_or(v.len());
    (
        passing.checked_sub(1).map(|i| v[i].0),
        first_fail.map(|i| v[i].0),
    )
}

/// The index in `runs` (by ascending rate) of the first run that missed `sla_ms`: the run at the SLA's
/// `first_failing_rps`.
pub fn first_failing_step(runs: &[RunReport], sla_ms: f64, max_error_ratio: f64) -> Option<usize> {
    runs.iter()
        .position(|r| failure(r, sla_ms, max_error_ratio).is_some())
}

/// Runs the search: `probe(rate)` performs one open-loop run. Returns every run (ascending rate) and one result
/// per SLA (`slas_ms` ascending).
pub async fn search<F, Fut, E>(
    rates: &[f64],
    slas_ms: &[f64],
    rules: SearchRules,
    mut probe: F,
) -> Result<(Vec<RunReport>, Vec<SlaResult>), E>
where
    F: FnMut(f64) -> Fut,
    Fut: Future<Output = Result<RunReport, E>>,
{
    let SearchRules {
        refine,
        max_error_ratio,
        past_knee,
    } = rules;
    let largest = slas_ms.iter().copied().fold(0.0, f64::max);
    let mut runs: Vec<RunReport> = Vec::new();
    let mut stepping = Stepping::new(past_knee);
    for &rate in rates {
        let report = probe(rate).await?;
        let missed = failure(&report, largest, max_error_ratio).is_some();
        let latency = report.latency_ms.is_some();
        runs.push(report);
        if !stepping.next(missed, latency) {
            break;
        }
    }
    let mut results = Vec::with_capacity(slas_ms.len());
    for &sla in slas_ms {
        for _ in 0..refine {
            let (Some(lo), Some(hi)) = bounds(&runs, sla, max_error_ratio) else {
                break;
            };
            let mid = ((lo + hi) / 2.0).round();
            // Closer than 2% is within the run-to-run noise of any real server; and a rate is run once.
            if (hi - lo) / lo < 0.02 || mid <= lo || mid >= hi {
                break;
            }
            runs.push(probe(mid).await?);
        }
        let v = verdicts(&runs, sla, max_error_ratio);
        let (lo, hi) = bounds(&runs, sla, max_error_ratio);
        let pass = lo.and_then(|rate| v.iter().find(|(r, _)| *r == rate)?.1.as_ref().ok().copied());
        let fail = hi.and_then(|rate| {
            v.iter()
                .find(|(r, _)| *r == rate)?
                .1
                .as_ref()
                .err()
                .cloned()
        });
        results.push(SlaResult {
            p99_ms: sla,
            max_rps: lo,
            achieved_rps: pass.map(|r| r.achieved_rps),
            p50_at_max_ms: pass.and_then(|r| r.latency_ms.map(|l| l.p50_ms)),
            p99_at_max_ms: pass.and_then(RunReport::p99_ms),
            first_failing_rps: hi,
            failure: fail,
            first_failing_step: None,
        });
    }
    // Stable: runs at the same rate stay in the order they ran.
    runs.sort_by(|a, b| rate_of(a).total_cmp(&rate_of(b)));
    for result in &mut results {
        result.first_failing_step = first_failing_step(&runs, result.p99_ms, max_error_ratio);
    }
    Ok((runs, results))
}

impl fmt::Display for SweepReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} {} · {} {} · {} arrivals · {} connections · warm-up {} s · {} s per rate",
            self.label.as_deref().unwrap_or("sweep of"),
            self.target.url,
            self.workload.kind,
            self.workload.path,
            match self.arrivals {
                Arrivals::Constant => "constant",
                Arrivals::Poisson => "Poisson",
            },
            self.connections,
            self.warmup_s,
            self.duration_s
        )?;
        writeln!(
            f,
            "  {:>10} {:>10} {:>11} {:>11} {:>11} {:>11}  errors",
            "offered/s", "achieved/s", "p50", "p99", "p99.9", "max"
        )?;
        for step in &self.steps {
            let cell = |v: Option<f64>| v.map_or("-".to_owned(), |v| Ms(v).to_string());
            let l = step.latency_ms;
            writeln!(
                f,
                "  {:>10.1} {:>10.1} {:>11} {:>11} {:>11} {:>11}  {}",
                step.offered_rps.unwrap_or(0.0),
                step.achieved_rps,
                cell(l.map(|l| l.p50_ms)),
                cell(l.map(|l| l.p99_ms)),
                cell(l.map(|l| l.p999_ms)),
                cell(l.map(|l| l.max_ms)),
                step.requests.errors
            )?;
        }
        for s in &self.sla {
            match s.max_rps {
                Some(rate) => write!(
                    f,
                    "  p99 ≤ {} ms: {rate:.0} requests/s (achieved {:.1}/s, p99 {})",
                    s.p99_ms,
                    s.achieved_rps.unwrap_or(0.0),
                    Ms(s.p99_at_max_ms.unwrap_or(0.0))
                )?,
                None => write!(f, "  p99 ≤ {} ms: not met at the lowest rate", s.p99_ms)?,
            }
            match (&s.first_failing_rps, &s.failure) {
                (Some(rate), Some(why)) => match s.first_failing_step {
                    Some(step) => write!(f, "; {rate:.0}/s (step {}) failed: {why}", step + 1)?,
                    None => write!(f, "; {rate:.0}/s failed: {why}")?,
                },
                _ => write!(f, "; never failed: a lower bound, try higher --rates")?,
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::convert::Infallible;

    use super::*;
    use crate::engine::Mode;
    use crate::report::{RUN_SCHEMA, RequestCounts};
    use crate::stats::LatencySummary;

    #[test]
    fn rates_parse_as_lists_geometric_and_linear_ranges() {
        assert_eq!(
            parse_rates("400, 100,200").expect("list"),
            vec![100.0, 200.0, 400.0]
        );
        assert_eq!(
            parse_rates("100:1600:x2").expect("geometric"),
            vec![100.0, 200.0, 400.0, 800.0, 1600.0]
        );
        assert_eq!(
            parse_rates("100:400:+100").expect("linear"),
            vec![100.0, 200.0, 300.0, 400.0]
        );
        assert_eq!(
            parse_rates("100:400:150").expect("linear"),
            vec![100.0, 250.0, 400.0]
        );
        for bad in [
            "",
            "0",
            "-5",
            "a,b",
            "100:50:x2",
            "100:200:x1",
            "1:1000000:+1",
        ] {
            assert!(parse_rates(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn slas_parse_as_durations() {
        assert_eq!(
            parse_slas("20ms, 5ms").expect("valid"),
            vec![Duration::from_millis(5), Duration::from_millis(20)]
        );
        assert!(parse_slas("5").is_err());
        assert!(parse_slas("0ms").is_err());
    }

    fn rules(refine: u32, max_error_ratio: f64) -> SearchRules {
        SearchRules {
            refine,
            max_error_ratio,
            past_knee: 0,
        }
    }

    /// A run at `rate` whose p99 is `p99_ms` and whose failed requests are `errors` of 1000.
    fn report(rate: f64, p99_ms: f64, errors: u64) -> RunReport {
        RunReport {
            schema: RUN_SCHEMA.to_owned(),
            recload_version: "test".to_owned(),
            label: None,
            started_at: "2026-11-30T00:00:00Z".to_owned(),
            target: TargetInfo {
                url: "http://test".to_owned(),
                protocol: "http-json".to_owned(),
                v2_model: None,
            },
            workload: WorkloadInfo {
                kind: "rank".to_owned(),
                path: "/".to_owned(),
                candidates: Some(1),
                k: None,
                users_per_request: None,
                ids: "zipf(1.05)".to_owned(),
                pool: 1,
                seed: 0,
                mean_body_bytes: 1.0,
                body: None,
            },
            mode: Mode::Open {
                rate,
                arrivals: Arrivals::Poisson,
                connections: 1,
            },
            warmup_s: 0.0,
            duration_s: 1.0,
            timeout_s: 1.0,
            offered_rps: Some(rate),
            achieved_rps: rate,
            requests: RequestCounts {
                scheduled: 1000,
                sent: 1000,
                ok: 1000 - errors,
                errors,
            },
            errors: BTreeMap::new(),
            error_response_ms: BTreeMap::new(),
            latency_ms: Some(LatencySummary {
                count: 1000 - errors,
                min_ms: 0.1,
                mean_ms: p99_ms / 2.0,
                p50_ms: p99_ms / 2.0,
                p90_ms: p99_ms,
                p99_ms,
                p999_ms: p99_ms,
                max_ms: p99_ms,
            }),
            send_delay_ms: None,
            peak_in_flight: 1,
            wall_s: 1.0,
            cpu_s: Some(0.1),
            connections: None,
            settle_s: 0.0,
            settled: true,
            score_check: None,
        }
    }

    /// A server whose p99 is 1 ms up to 1000 requests/s and then grows by 1 ms per 100 requests/s.
    fn server(rate: f64) -> f64 {
        if rate <= 1000.0 {
            1.0
        } else {
            1.0 + (rate - 1000.0) / 100.0
        }
    }

    #[tokio::test]
    async fn finds_the_highest_rate_under_each_sla_by_stepping_then_bisecting() {
        let mut probed = Vec::new();
        let (steps, results) = search(
            &parse_rates("250:16000:x2").expect("rates"),
            &[5.0, 20.0],
            rules(6, 0.001),
            |rate| {
                probed.push(rate);
                async move { Ok::<_, Infallible>(report(rate, server(rate), 0)) }
            },
        )
        .await
        .expect("search");
        // Stepping stops at the first rate over 20 ms: 4000/s (p99 31 ms).
        assert_eq!(&probed[..5], &[250.0, 500.0, 1000.0, 2000.0, 4000.0]);
        // p99 ≤ 5 ms holds up to 1400/s; ≤ 20 ms up to 2900/s. Six bisections get within 2%.
        let five = &results[0];
        let max = five.max_rps.expect("met");
        assert!((1370.0..=1400.0).contains(&max), "{five:?}");
        assert!(
            five.first_failing_rps.expect("failed") <= 1430.0,
            "{five:?}"
        );
        assert!(
            five.failure.as_deref().expect("why").starts_with("p99"),
            "{five:?}"
        );
        let twenty = &results[1];
        let max = twenty.max_rps.expect("met");
        assert!((2850.0..=2900.0).contains(&max), "{twenty:?}");
        assert!(
            steps.windows(2).all(|w| rate_of(&w[0]) < rate_of(&w[1])),
            "ascending"
        );
        assert_eq!(steps.len(), probed.len());
    }

    #[test]
    fn stepping_goes_past_the_first_miss_by_past_knee_rates() {
        // (missed, had a latency) of successive runs → whether the next rate runs.
        let steps = |past_knee: u32, runs: &[(bool, bool)]| -> Vec<bool> {
            let mut s = Stepping::new(past_knee);
            runs.iter().map(|&(m, l)| s.next(m, l)).collect()
        };
        let ok = (false, true);
        let miss = (true, true);
        assert_eq!(steps(0, &[ok, ok, miss]), [true, true, false]);
        assert_eq!(steps(2, &[ok, miss, ok, miss]), [true, true, true, false]);
        // A rate past the first miss that passes again does not restart the count.
        assert_eq!(steps(1, &[miss, ok]), [true, false]);
        // No request succeeded: nothing more to draw, whatever is left of past_knee.
        assert_eq!(steps(3, &[ok, miss, (true, false)]), [true, true, false]);
        // Before the first miss a run without latency is a miss like any other.
        assert_eq!(steps(1, &[(true, false)]), [false]);
    }

    #[tokio::test]
    async fn the_sweep_runs_past_the_knee_without_changing_the_answer() {
        let search_with = |past_knee: u32| async move {
            let mut probed = Vec::new();
            let (steps, results) = search(
                &parse_rates("250:16000:x2").expect("rates"),
                &[5.0, 20.0],
                SearchRules {
                    past_knee,
                    ..rules(0, 0.001)
                },
                |rate| {
                    probed.push(rate);
                    async move { Ok::<_, Infallible>(report(rate, server(rate), 0)) }
                },
            )
            .await
            .expect("search");
            (probed, steps, results)
        };
        let (probed, _, before) = search_with(0).await;
        assert_eq!(probed, [250.0, 500.0, 1000.0, 2000.0, 4000.0]);
        let (probed, steps, after) = search_with(2).await;
        // 4000/s is the first over 20 ms; two more rates follow.
        assert_eq!(
            probed,
            [250.0, 500.0, 1000.0, 2000.0, 4000.0, 8000.0, 16000.0]
        );
        assert_eq!(steps.len(), 7);
        // The answer is the same; which step first missed each SLA is reported: 2000/s (p99 11 ms) for 5 ms,
        // 4000/s for 20 ms.
        let answer = |r: &[SlaResult]| -> Vec<(Option<f64>, Option<f64>)> {
            r.iter().map(|r| (r.max_rps, r.first_failing_rps)).collect()
        };
        assert_eq!(answer(&after), answer(&before));
        assert_eq!(after[0].first_failing_step, Some(3));
        assert_eq!(after[1].first_failing_step, Some(4));
        assert_eq!(rate_of(&steps[3]), 2000.0);
        assert_eq!(before[1].first_failing_step, Some(4));
    }

    #[tokio::test]
    async fn the_first_failing_step_counts_bisection_runs_below_it() {
        // Bisection adds runs between passing and failing rates; the index is into the sorted steps.
        let (steps, results) = search(
            &[1000.0, 2000.0],
            &[20.0],
            rules(1, 0.001),
            |rate| async move {
                let p99 = if rate > 1400.0 { 50.0 } else { 5.0 };
                Ok::<_, Infallible>(report(rate, p99, 0))
            },
        )
        .await
        .expect("search");
        let rates: Vec<f64> = steps.iter().map(rate_of).collect();
        assert_eq!(rates, [1000.0, 1500.0, 2000.0]);
        assert_eq!(results[0].first_failing_rps, Some(1500.0));
        assert_eq!(results[0].first_failing_step, Some(1));
    }

    #[tokio::test]
    async fn every_rate_is_run_once_and_one_bad_run_fails_it() {
        // The run at 2000/s hits a hiccup (p99 50 ms): the search stops there and does not try it again, and the
        // bisection below it never lands on a rate already run.
        let mut probed = Vec::new();
        let (steps, results) = search(
            &[1000.0, 2000.0, 4000.0],
            &[20.0],
            rules(8, 0.001),
            |rate| {
                probed.push(rate);
                let p99 = if rate == 2000.0 { 50.0 } else { 5.0 };
                async move { Ok::<_, Infallible>(report(rate, p99, 0)) }
            },
        )
        .await
        .expect("search");
        assert_eq!(probed[..2], [1000.0, 2000.0]);
        let mut distinct = probed.clone();
        distinct.sort_by(f64::total_cmp);
        distinct.dedup();
        assert_eq!(distinct.len(), probed.len(), "{probed:?}");
        assert_eq!(steps.len(), probed.len());
        assert_eq!(results[0].first_failing_rps, Some(2000.0));
        assert_eq!(results[0].failure.as_deref(), Some("p99 50.00 ms > 20 ms"));
        assert!(
            results[0].max_rps.expect("met") >= 1960.0,
            "{:?}",
            results[0]
        );
    }

    #[test]
    fn a_rate_run_more_than_once_in_an_older_report_passes_only_if_every_run_did() {
        // Older reports hold failing rates run again; the first run at 2000/s failed, the second passed.
        let runs = [
            report(1000.0, 5.0, 0),
            report(2000.0, 50.0, 0),
            report(2000.0, 5.0, 0),
            report(4000.0, 5.0, 0),
        ];
        assert_eq!(bounds(&runs, 20.0, 0.001), (Some(1000.0), Some(2000.0)));
        let v = verdicts(&runs, 20.0, 0.001);
        assert_eq!(v[1].1, Err("p99 50.00 ms > 20 ms".to_owned()));
    }

    #[tokio::test]
    async fn errors_fail_a_rate_and_every_lower_rate_must_pass() {
        // 2000/s fails on errors although its p99 is fine; 4000/s would pass but is never reached.
        let (_, results) = search(
            &[1000.0, 2000.0, 4000.0],
            &[5.0],
            rules(0, 0.001),
            |rate| async move {
                let errors = if rate == 2000.0 { 5 } else { 0 };
                Ok::<_, Infallible>(report(rate, 1.0, errors))
            },
        )
        .await
        .expect("search");
        assert_eq!(results[0].max_rps, Some(1000.0));
        assert_eq!(results[0].first_failing_rps, Some(2000.0));
        assert_eq!(
            results[0].failure.as_deref(),
            Some("0.50% of requests failed (more than 0.10%)")
        );
    }

    #[tokio::test]
    async fn reports_when_even_the_lowest_rate_fails_or_no_rate_fails() {
        let (_, results) = search(
            &[100.0, 200.0],
            &[1.0, 1000.0],
            rules(3, 0.0),
            |rate| async move { Ok::<_, Infallible>(report(rate, 50.0, 0)) },
        )
        .await
        .expect("search");
        assert_eq!(results[0].max_rps, None);
        assert_eq!(results[0].first_failing_rps, Some(100.0));
        assert_eq!(results[1].max_rps, Some(200.0));
        assert_eq!(results[1].first_failing_rps, None);
    }
}
