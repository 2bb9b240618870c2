//! `recload sweep`: open-loop runs at increasing rates (the search is [`crate::sweep::search`]), the highest rate
//! under each SLA printed, the report written to `--json` and its chart to `--svg`.

use std::sync::Arc;
use std::time::Duration;

use super::output::{to_json, write_out};
use super::run::run_options;
use super::workload::{AnyPrepared, Prepared, prepare};
use super::{CliError, SweepArgs};
use crate::engine::{self, Mode};
use crate::plot;
use crate::report::{RunReport, now_rfc3339};
use crate::sweep::{self, SWEEP_SCHEMA, SweepReport};
use crate::target::Target;

/// `recload sweep`.
pub async fn sweep_command(args: &SweepArgs) -> Result<(), CliError> {
    let report = sweep_report(args).await?;
    print!("{report}");
    if let Some(path) = &args.json {
        write_out(path, &to_json(&report))?;
    }
    if let Some(path) = &args.svg {
        let title = format!("{} {}", report.workload.kind, report.workload.path);
        write_out(path, &plot::svg(&title, std::slice::from_ref(&report))?)?;
    }
    Ok(())
}

/// Performs the sweep `args` describe and returns its report.
pub async fn sweep_report(args: &SweepArgs) -> Result<SweepReport, CliError> {
    let rates = sweep::parse_rates(&args.rates).map_err(CliError::Usage)?;
    let slas = sweep::parse_slas(&args.sla).map_err(CliError::Usage)?;
    if !(0.0..=1.0).contains(&args.max_error_ratio) {
        return Err(CliError::Usage(
            "--max-error-ratio must be between 0 and 1".to_owned(),
        ));
    }
    match prepare(&args.target, &args.workload).await? {
        AnyPrepared::Http(p) => sweep_on(args, &rates, &slas, p).await,
        AnyPrepared::Grpc(p) => sweep_on(args, &rates, &slas, p).await,
    }
}

/// The sweep `args` describe over `rates` and `slas`, against `p`'s target with its pool.
async fn sweep_on<T: Target>(
    args: &SweepArgs,
    rates: &[f64],
    slas: &[Duration],
    p: Prepared<T>,
) -> Result<SweepReport, CliError> {
    let started_at = now_rfc3339();
    let slas_ms: Vec<f64> = slas.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    let quiet = args.timing.quiet;
    let rules = sweep::SearchRules {
        refine: args.refine,
        max_error_ratio: args.max_error_ratio,
        past_knee: args.past_knee,
    };
    let (steps, sla) = sweep::search(rates, &slas_ms, rules, |rate| {
        let mut options = run_options(
            &args.timing,
            Mode::Open {
                rate,
                arrivals: args.timing.arrivals,
                connections: args.timing.connections,
            },
            args.workload.seed,
        );
        options.duration = options
            .duration
            .max(Duration::from_secs_f64(args.min_requests as f64 / rate));
        let target = Arc::clone(&p.target);
        let prepared = Arc::clone(&p.prepared);
        let workload = p.workload.clone();
        let label = args.timing.label.clone();
        async move {
            let started_at = now_rfc3339();
            let stats = engine::run(Arc::clone(&target), prepared, &options).await?;
            let report =
                RunReport::new(label, started_at, target.info(), workload, &options, &stats);
            if !quiet {
                let l = report.latency_ms;
                eprintln!(
                    "  {rate:>8.0}/s offered → {:>8.1}/s achieved · p50 {} · p99 {} · {} failed",
                    report.achieved_rps,
                    l.map_or("-".to_owned(), |l| crate::stats::Ms(l.p50_ms).to_string()),
                    l.map_or("-".to_owned(), |l| crate::stats::Ms(l.p99_ms).to_string()),
                    report.requests.errors
                );
            }
            Ok::<_, CliError>(report)
        }
    })
    .await?;
    Ok(SweepReport {
        schema: SWEEP_SCHEMA.to_owned(),
        recload_version: env!("CARGO_PKG_VERSION").to_owned(),
        label: args.timing.label.clone(),
        started_at,
        target: p.target.info(),
        workload: p.workload,
        arrivals: args.timing.arrivals,
        connections: args.timing.connections,
        warmup_s: args.timing.warmup.as_secs_f64(),
        duration_s: args.timing.duration.as_secs_f64(),
        timeout_s: args.timing.timeout.as_secs_f64(),
        max_error_ratio: args.max_error_ratio,
        min_requests: args.min_requests,
        past_knee: args.past_knee,
        steps,
        sla,
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::sweep;
    use super::*;

    #[tokio::test]
    async fn bad_rates_slas_and_error_ratios_are_refused_before_the_first_run() {
        // Nothing listens at the URL, so a refusal that names a flag came before the first run.
        let ratio = "--max-error-ratio must be between 0 and 1";
        let cases: [(&[&str], &str); 5] = [
            (
                &["--rates", "10:1:x2"],
                "--rates 10:1:x2: the end is below the start",
            ),
            (&["--rates", "fast"], "--rates: \"fast\" is not a number"),
            (&["--sla", "0ms"], "--sla: an SLA must be positive"),
            (&["--max-error-ratio", "1.5"], ratio),
            (&["--max-error-ratio=-0.1"], ratio),
        ];
        for (flags, message) in cases {
            let a = sweep(&[&["--url", "http://127.0.0.1:1"], flags].concat());
            let err = sweep_report(&a).await.expect_err("refused");
            assert_eq!(err.to_string(), message, "{flags:?}");
        }
    }
}
