//! A real OTLP/gRPC trace receiver as a process of its own: the receiver the tracing tests start in their process
//! (`tests/common/otlp.rs`, the official `TraceService` of opentelemetry-proto), for scripts/bench-features.sh,
//! which measures what tracing costs the server with its spans really exported (never to a collector that is down).
//! Prints its URL on stdout once it listens; on SIGTERM or SIGINT writes what it received to `--out` as JSON
//! (`{"spans": N, "traces": N, "services": [...]}`) and exits.
//!
//!     cargo run --release --example otlp_receiver -- [--addr 127.0.0.1:0] [--out received.json]

use std::collections::BTreeSet;
use std::process::ExitCode;

#[path = "../tests/common/otlp.rs"]
#[allow(
    dead_code,
    reason = "the tests' receiver: this process serves on its own listener and never calls `start`"
)]
mod otlp;

fn main() -> ExitCode {
    let mut addr = "127.0.0.1:0".to_owned();
    let mut out = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        match (flag.as_str(), value) {
            ("--addr", Some(v)) => addr = v,
            ("--out", Some(v)) => out = Some(v),
            (flag, _) => {
                eprintln!(
                    "otlp_receiver: unknown flag or missing value: {flag} (--addr HOST:PORT, --out FILE)"
                );
                return ExitCode::from(2);
            }
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("otlp_receiver: cannot start a runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::bind(&addr).await {
            Ok(listener) => listener,
            Err(e) => {
                eprintln!("otlp_receiver: cannot listen on --addr {addr}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let collector = otlp::Collector::default();
        println!("{}", collector.serve(listener));
        let (Ok(mut term), Ok(mut int)) = (
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()),
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()),
        ) else {
            eprintln!("otlp_receiver: cannot listen for signals");
            return ExitCode::FAILURE;
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        let spans = collector.spans();
        let traces: BTreeSet<&[u8]> = spans.iter().map(|(_, s)| s.trace_id.as_slice()).collect();
        let services: BTreeSet<&str> = spans.iter().map(|(service, _)| service.as_str()).collect();
        let received = serde_json::json!({
            "spans": spans.len(),
            "traces": traces.len(),
            "services": services,
        });
        match out {
            None => println!("{received}"),
            Some(path) => {
                if let Err(e) = std::fs::write(&path, format!("{received}\n")) {
                    eprintln!("otlp_receiver: cannot write --out {path}: {e}");
                    return ExitCode::FAILURE;
                }
            }
        }
        ExitCode::SUCCESS
    })
}
