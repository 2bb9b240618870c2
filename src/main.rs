//! The `recserve` binary: parse the configuration, start logging, serve until SIGTERM/SIGINT.

use std::process::ExitCode;

use anyhow::Context;
use clap::Parser;
use recserve::config::{Cli, Command};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let (args, check_only) = match cli.command {
        Command::Serve(args) => (args, false),
        Command::CheckConfig(args) => (args, true),
    };
    let config = match args.resolve() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if check_only {
        print!("{}", config.to_toml());
        return ExitCode::SUCCESS;
    }
    recserve::telemetry::init(config.log_format);
    match serve(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn serve(config: recserve::config::Config) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Runtime::new().context("start the async runtime")?;
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
