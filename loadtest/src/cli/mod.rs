//! The `recload` command line: the top-level parser ([`Cli`], one [`Command`] per subcommand), why a command
//! fails ([`CliError`]), and [`execute`], which runs a parsed command. The flags are in `args`, the body of each
//! `recload <command>` in the module of its name (`run`, `sweep`, `plot`, `check`, `bodies`, `ceiling`), what
//! run, sweep and check send in `workload` (the ranking model's fields from `schema`), and where results go in
//! `output`. `main.rs` only parses and reports errors; tests call [`execute`] or a command's function with parsed
//! flags.

mod args;
mod bodies;
mod ceiling;
mod check;
mod output;
mod plot;
mod run;
mod schema;
mod sweep;
mod workload;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use crate::target::http::TargetError;

pub use args::{
    BodiesArgs, CeilingArgs, CheckArgs, EnvelopeKind, PlotArgs, RunArgs, SweepArgs, TargetArgs,
    TimingArgs, WorkloadArgs, WorkloadKind,
};
pub use run::{run_command, run_report};
pub use sweep::{sweep_command, sweep_report};
pub use workload::build_workload;

/// recload: an open-loop load generator and benchmark driver for recserve (and any server that accepts the same
/// requests). Latency is measured from each request's scheduled send time, so a stalled server shows in the
/// percentiles (no coordinated omission). Reports: docs/recload.md.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One run: open loop at --rate (or closed loop with --closed), then a summary and optionally JSON.
    Run(RunArgs),
    /// Open-loop runs at increasing rates: the highest rate whose p99 stays under each --sla.
    Sweep(SweepArgs),
    /// Latency-vs-throughput chart (SVG) of one or more sweep reports.
    Plot(PlotArgs),
    /// Send sample ranking requests one by one and save their scores, or compare them with saved ones.
    Check(CheckArgs),
    /// Write the request bodies a run would send, in their wire form, for another load generator (oha), and print
    /// how to send them (URL, headers) as JSON.
    Bodies(BodiesArgs),
    /// The raw ceiling: gather + ONNX Runtime in-process through recserve's library, no server.
    // Boxed: it embeds the server's settings, which make it far larger than the other variants.
    Ceiling(Box<CeilingArgs>),
}

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Workload(#[from] crate::workload::WorkloadError),
    #[error(transparent)]
    Run(#[from] crate::engine::RunError),
    #[error(transparent)]
    Check(#[from] crate::check::CheckError),
    #[error(transparent)]
    Ceiling(#[from] crate::ceiling::CeilingError),
    #[error(transparent)]
    Plot(#[from] crate::plot::PlotError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {problem}")]
    Describe { what: String, problem: String },
}

/// Runs a parsed command line.
pub fn execute(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Ceiling(args) => ceiling::ceiling_command(&args),
        Command::Plot(args) => plot::plot_command(&args),
        Command::Run(args) => runtime(args.timing.threads)?.block_on(run_command(&args)),
        Command::Sweep(args) => runtime(args.timing.threads)?.block_on(sweep_command(&args)),
        Command::Check(args) => runtime(Some(1))?.block_on(check::check_command(&args)),
        Command::Bodies(args) => runtime(Some(1))?.block_on(bodies::bodies_command(&args)),
    }
}

fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime, CliError> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        if n == 0 {
            return Err(CliError::Usage("--threads must be at least 1".to_owned()));
        }
        builder.worker_threads(n);
    }
    builder.enable_all().build().map_err(|source| CliError::Io {
        path: PathBuf::from("(tokio runtime)"),
        source,
    })
}

#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::testing::run;
    use super::*;

    #[test]
    fn clap_accepts_the_command_definitions() {
        Cli::command().debug_assert();
    }

    #[test]
    fn zero_runtime_threads_are_refused_before_anything_is_sent() {
        // Nothing listens at port 1: the error must come before recload tries to reach it.
        let args = run(&[
            "--url",
            "http://127.0.0.1:1",
            "--rate",
            "10",
            "--threads",
            "0",
        ]);
        let err = execute(Cli {
            command: Command::Run(args),
        })
        .expect_err("0 threads");
        assert_eq!(err.to_string(), "--threads must be at least 1");
    }
}
