//! `recload run`: one open-loop (or closed-loop) run against the target, its summary printed and its report
//! written where `--json` says; and the run options that run and sweep build from the timing flags.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::output::{io_error, to_json, write_out};
use super::workload::{AnyPrepared, Prepared, prepare};
use super::{CliError, RunArgs, TimingArgs};
use crate::check::{AnswerCheck, ScoresFile};
use crate::engine::{self, Mode, RunOptions};
use crate::report::{RunReport, now_rfc3339};
use crate::target::Target;
use crate::{plot, sweep};

/// The engine's options for one run in `mode`, from the timing flags (a sweep then lengthens each step's window).
pub(super) fn run_options(timing: &TimingArgs, mode: Mode, seed: u64) -> RunOptions {
    RunOptions {
        mode,
        warmup: timing.warmup,
        duration: timing.duration,
        timeout: timing.timeout,
        seed,
        precise_pacing: !timing.coarse_pacing,
        progress: !timing.quiet && std::io::stderr().is_terminal(),
        settle: (!timing.settle_timeout.is_zero()).then_some(engine::Settle {
            latency: timing.settle_latency,
            timeout: timing.settle_timeout,
        }),
        log_requests: false,
        on_answer: None,
    }
}

/// `recload run`: prints the summary and writes the report where `--json` says.
pub async fn run_command(args: &RunArgs) -> Result<(), CliError> {
    let slas_ms = run_slas(args)?;
    let report = run_report(args).await?;
    match &args.json {
        Some(path) if path == Path::new("-") => {
            eprint!("{report}");
            println!("{}", to_json(&report));
        }
        Some(path) => {
            print!("{report}");
            write_out(path, &to_json(&report))?;
        }
        None => print!("{report}"),
    }
    if let Some(path) = &args.svg {
        let title = format!("{} {}", report.workload.kind, report.workload.path);
        let chart = plot::run::svg(&title, &report, &slas_ms, sweep::DEFAULT_MAX_ERROR_RATIO)?;
        write_out(path, &chart)?;
    }
    Ok(())
}

/// The `--sla` bounds of a run in milliseconds (none without the flag), refused before anything is sent.
fn run_slas(args: &RunArgs) -> Result<Vec<f64>, CliError> {
    let Some(text) = &args.sla else {
        return Ok(Vec::new());
    };
    let slas = sweep::parse_slas(text).map_err(CliError::Usage)?;
    Ok(slas.iter().map(|d| d.as_secs_f64() * 1e3).collect())
}

/// Performs the run `args` describe and returns its report, printing nothing but the progress line.
pub async fn run_report(args: &RunArgs) -> Result<RunReport, CliError> {
    match prepare(&args.target, &args.workload).await? {
        AnyPrepared::Http(p) => run_on(args, p).await,
        AnyPrepared::Grpc(p) => run_on(args, p).await,
    }
}

/// The run `args` describe, against `p`'s target with its pool.
async fn run_on<T: Target>(args: &RunArgs, p: Prepared<T>) -> Result<RunReport, CliError> {
    let mode = match (args.closed, args.rate) {
        (true, _) => Mode::Closed {
            concurrency: args.concurrency,
        },
        (false, Some(rate)) => Mode::Open {
            rate,
            arrivals: args.timing.arrivals,
            connections: args.timing.connections,
        },
        (false, None) => {
            return Err(CliError::Usage(
                "give --rate R (open loop) or --closed".to_owned(),
            ));
        }
    };
    let mut options = run_options(&args.timing, mode, args.workload.seed);
    options.log_requests = args.log_requests.is_some();
    let check = answer_check(args, &p.pool)?;
    if let Some(check) = &check {
        let (check, target) = (Arc::clone(check), Arc::clone(&p.target));
        options.on_answer = Some(engine::AnswerHook(Arc::new(move |index, answer| {
            check.check(index, target.rank_scores(answer));
        })));
    }
    let started_at = now_rfc3339();
    let stats = engine::run(Arc::clone(&p.target), Arc::clone(&p.prepared), &options).await?;
    drop(p.pool);
    if let Some(path) = &args.log_requests {
        write_out(path, &requests_csv(&stats))?;
    }
    let mut report = RunReport::new(
        args.timing.label.clone(),
        started_at,
        p.target.info(),
        p.workload,
        &options,
        &stats,
    );
    report.score_check = check.map(|c| c.counts());
    Ok(report)
}

/// The `--check-scores` check of the run's pool, when asked for.
fn answer_check(
    args: &RunArgs,
    pool: &[crate::workload::Request],
) -> Result<Option<Arc<AnswerCheck>>, CliError> {
    if args.check_scores.is_empty() {
        return Ok(None);
    }
    let mut files = Vec::with_capacity(args.check_scores.len());
    for path in &args.check_scores {
        let text = std::fs::read_to_string(path).map_err(io_error(path))?;
        files.push((path.display().to_string(), ScoresFile::parse(&text)?));
    }
    Ok(Some(Arc::new(AnswerCheck::new(
        &files,
        pool,
        args.check_tolerance,
    )?)))
}

/// The `--log-requests` file of a run.
fn requests_csv(stats: &engine::RunStats) -> String {
    let unix_ns = |since_start: Duration| {
        (stats.started + since_start)
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    };
    let mut csv = String::from("scheduled_unix_ns,sent_unix_ns,done_unix_ns,outcome\n");
    for r in &stats.log {
        let sent = r.sent.map(|t| unix_ns(t).to_string()).unwrap_or_default();
        let outcome = match r.outcome {
            Ok(()) => "ok".to_owned(),
            Err(kind) => kind.label(),
        };
        csv.push_str(&format!(
            "{},{sent},{},{outcome}\n",
            unix_ns(r.scheduled),
            unix_ns(r.done)
        ));
    }
    csv
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::run;
    use super::*;
    use crate::arrivals::Arrivals;

    fn options(args: &[&str]) -> RunOptions {
        let a = run(&[&["--rate", "10"], args].concat());
        let mode = Mode::Open {
            rate: 10.0,
            arrivals: a.timing.arrivals,
            connections: a.timing.connections,
        };
        run_options(&a.timing, mode, a.workload.seed)
    }

    #[tokio::test]
    async fn a_bad_sla_is_refused_before_anything_is_sent() {
        // Nothing listens at port 1: the error must come before recload tries to reach it.
        for (sla, message) in [
            ("0ms", "--sla: an SLA must be positive"),
            ("fast", "--sla: \"fast\" is not a duration like 5ms ("),
        ] {
            let a = run(&["--url", "http://127.0.0.1:1", "--rate", "10", "--sla", sla]);
            let err = run_command(&a).await.expect_err("refused");
            assert!(err.to_string().starts_with(message), "{sla}: {err}");
        }
        let a = run(&["--rate", "10", "--sla", "20ms,5ms"]);
        assert_eq!(run_slas(&a).expect("valid"), [5.0, 20.0]);
    }

    #[test]
    fn run_options_follow_the_timing_flags() {
        let o = options(&[
            "--warmup",
            "1s",
            "--duration",
            "3s",
            "--timeout",
            "250ms",
            "--seed",
            "4",
        ]);
        assert_eq!(
            (o.warmup, o.duration, o.timeout),
            (
                Duration::from_secs(1),
                Duration::from_secs(3),
                Duration::from_millis(250)
            )
        );
        assert_eq!(o.seed, 4);
        assert!(o.precise_pacing);
        assert_eq!(
            o.mode,
            Mode::Open {
                rate: 10.0,
                arrivals: Arrivals::Poisson,
                connections: 64
            }
        );
        let settle = o.settle.expect("settles by default");
        assert_eq!(
            (settle.latency, settle.timeout),
            (Duration::from_millis(100), Duration::from_secs(60))
        );

        let o = options(&["--coarse-pacing", "--settle-timeout", "0s", "--quiet"]);
        assert!(!o.precise_pacing);
        assert!(o.settle.is_none(), "0s skips the wait");
        assert!(!o.progress, "--quiet hides the progress line");
    }
}
