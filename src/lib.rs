//! recserve: a low-latency inference server for recommendation models.

pub mod api;
pub mod check;
pub mod config;
#[cfg(test)]
mod fuzz;
pub mod server;
pub mod service;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;
