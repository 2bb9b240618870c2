//! Logging: `tracing` to stderr, text or JSON, level from `RUST_LOG` (default `info`); and what the server tells
//! of each request beyond its metrics: OpenTelemetry spans ([`spans`]), W3C `traceparent` in and out
//! ([`traceparent`]) and the access log ([`requests`]). docs/tracing.md describes them.

pub mod requests;
pub mod spans;
pub mod traceparent;

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::LogFormat;

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only on a terminal: log files and collectors get plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal());
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
