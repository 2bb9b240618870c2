//! Running dense networks: the ONNX Runtime library and environment ([`Runtime`]), one validated session of a
//! model's dense graph ([`DenseGraph`]), and the executor threads that own those sessions and turn queued jobs
//! into scores ([`pool::ExecutorPool`]).

mod graph;
pub mod pool;
mod runtime;

pub use graph::{DenseGraph, DeviceInput, GraphShape};
pub use runtime::{Runtime, RuntimeError, SessionOptions};
