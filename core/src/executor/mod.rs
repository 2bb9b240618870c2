//! Running dense networks: the ONNX Runtime library and environment ([`Runtime`]), one validated session of a
//! model's dense graph ([`DenseGraph`]) or of its user and item parts ([`SplitGraph`]), and the [`Worker`] an executor thread owns (session, store, buffers)
//! that turns a batch of rows into scores. The threads themselves are the batcher's (`crate::batching`).

mod graph;
mod runtime;
mod split;
mod worker;

pub(crate) use graph::{DenseGraph, GraphShape};
pub use runtime::{Runtime, RuntimeError, SessionOptions};
pub use split::SplitGraph;
pub use worker::{Executed, Worker};
