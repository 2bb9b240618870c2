//! `recload ceiling`: recserve's compute path in-process (gather + ONNX Runtime, [`crate::ceiling::run`]) at each
//! batch size, wired from `recserve serve`'s own flags; a line per batch size, and the report to `--json`.

use super::output::{to_json, write_out};
use super::{CeilingArgs, CliError};
use crate::ceiling::{self, CeilingOptions};

pub(super) fn ceiling_command(args: &CeilingArgs) -> Result<(), CliError> {
    let config = args
        .serve
        .resolve()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let report = ceiling::run(
        &config,
        &CeilingOptions {
            model: args.model.clone(),
            batch_rows: args.batch_sizes(),
            candidates: args.candidates,
            warmup: args.warmup,
            duration: args.duration,
            ids: args.ids,
            zipf_exponent: args.zipf_exponent,
            pool: args.pool,
            seed: args.seed,
        },
    )?;
    println!(
        "{} v{} ({}) in-process on {}: gather + ONNX Runtime, {} executor(s), {} intra-op thread(s)",
        report.model,
        report.version,
        report.precision,
        report.device,
        report.executors,
        report.intra_op_threads
    );
    for b in &report.batches {
        println!(
            "  {:>5} rows/batch (runs {} rows): {:>9.1} calls/s · {:>10.0} rows/s · {:>8.1} requests of {}/s · {}",
            b.rows,
            b.bucket,
            b.calls_per_s,
            b.rows_per_s,
            b.requests_per_s,
            report.candidates,
            b.latency_ms.map_or("-".to_owned(), |l| l.to_string())
        );
    }
    if let Some(path) = &args.json {
        write_out(path, &to_json(&report))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testing::ceiling;
    use super::*;

    #[test]
    fn the_servers_settings_are_checked_as_recserve_serve_checks_them() {
        if std::env::var_os("RECSERVE_REPOSITORY").is_some() {
            panic!("unset RECSERVE_REPOSITORY: this test runs the ceiling without a repository");
        }
        let err = ceiling_command(&ceiling(&["--model", "m"])).expect_err("no repository");
        assert!(matches!(err, CliError::Usage(_)), "{err:?}");
        assert!(err.to_string().starts_with("--repository"), "{err}");
    }
}
