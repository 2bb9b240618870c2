//! recserve: a low-latency inference server for recommendation models.

pub mod api;
pub mod batching;
pub mod config;
pub mod embedding;
pub mod error;
pub mod executor;
#[cfg(test)]
mod fuzz;
pub mod gpu;
pub mod metrics;
pub mod pipeline;
pub mod ranking;
pub mod recall;
pub mod registry;
pub mod repository;
pub mod server;
pub mod service;
pub mod telemetry;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod threads;
pub mod trace;
