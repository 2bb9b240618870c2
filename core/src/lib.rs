//! The serving core of recserve: the model repository on disk, embedding stores (CPU, GPU, the Redis tier),
//! ONNX Runtime executors, dynamic batching, and the model kinds built from them (DeepFM ranking, two-tower recall,
//! the recall-then-rank pipeline), with their metrics. The server crate (`recserve`) puts transports, the request
//! lifecycle and configuration on top; nothing here knows of HTTP, gRPC or flags.

pub mod batching;
pub mod embedding;
pub mod error;
pub mod executor;
pub mod gpu;
pub mod metrics;
pub mod models;
pub mod pipeline;
pub mod ranking;
pub mod recall;
pub mod registry;
pub mod repository;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod threads;
pub mod trace;
