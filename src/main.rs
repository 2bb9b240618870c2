//! The `recserve` binary: parse the configuration, start logging, serve until SIGTERM/SIGINT.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use recserve::config::{Cli, Command};
use recserve_core::threads::{ThreadRole, register_current_thread};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (args, check) = match cli.command {
        Command::Serve(args) => (args, None),
        Command::CheckConfig(args) => (args.serve, Some(args.settings_only)),
        Command::CheckRepository(args) => return recserve::check::run(&args),
    };
    let config = match args.resolve() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(settings_only) = check {
        print!("{}", config.to_toml());
        return if settings_only {
            ExitCode::SUCCESS
        } else {
            recserve::check::start(&config)
        };
    }
    recserve::telemetry::init(config.log_format);
    match serve(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Once, in the log (on stderr, as text or JSON as --log-format says).
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(config: recserve::config::Config) -> anyhow::Result<()> {
    // `Runtime::new()`'s runtime (one worker per CPU), with each of its threads counted as the server's I/O in
    // `recserve_thread_*`; so is this thread, which drives the listeners' accept loops inside `block_on`.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .on_thread_start(|| register_current_thread(ThreadRole::Io, ""))
        .build()
        .context("start the async runtime")?;
    register_current_thread(ThreadRole::Io, "");
    runtime.block_on(async {
        let http = tokio::net::TcpListener::bind(config.http_addr)
            .await
            .with_context(|| format!("bind --http-addr {}", config.http_addr))?;
        let grpc = tokio::net::TcpListener::bind(config.grpc_addr)
            .await
            .with_context(|| format!("bind --grpc-addr {}", config.grpc_addr))?;
        let listeners = recserve::server::Listeners { http, grpc };
        recserve::server::run(config, listeners, recserve::server::shutdown_signal()).await?;
        Ok(())
    })
}
