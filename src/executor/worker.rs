//! What one executor thread owns: a dense-graph session, the embedding store it gathers from, and scratch
//! buffers. [`Worker::run`] is the compute path of a batch (gather, then inference); the batcher's executor threads
//! call it, and so does the in-process throughput benchmark.

use std::sync::Arc;
use std::time::Instant;

use super::DenseGraph;
use crate::batching::Estimator;
use crate::embedding::{EmbeddingStore, GatherError};
use crate::metrics::ModelMetrics;

/// Why a job failed inside the executor. Never the client's fault: validation happens before queueing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ExecError {
    #[error("gather failed: {0}")]
    Gather(#[from] GatherError),
    #[error("ONNX Runtime failed: {0}")]
    Inference(String),
    #[error("the executor panicked: {0}")]
    Panicked(String),
    /// The job's deadline passed while it waited; it was not executed.
    #[error("deadline passed before execution")]
    DeadlineExceeded,
    /// The server stopped before the job could run.
    #[error("shutting down")]
    ShuttingDown,
}

/// What one executor thread owns: a session, the store it gathers from, and a reusable gather buffer.
#[derive(Debug)]
pub struct Worker {
    graph: DenseGraph,
    store: Arc<dyn EmbeddingStore>,
    /// Table index of each field, in graph order.
    fields: Arc<[usize]>,
    embeddings: Vec<f32>,
    metrics: ModelMetrics,
}

impl Worker {
    pub fn new(
        graph: DenseGraph,
        store: Arc<dyn EmbeddingStore>,
        fields: Arc<[usize]>,
        metrics: ModelMetrics,
    ) -> Worker {
        Worker {
            graph,
            store,
            fields,
            embeddings: Vec::new(),
            metrics,
        }
    }

    /// Gathers and scores `rows` rows, recording gather and inference durations.
    pub fn execute(
        &mut self,
        rows: usize,
        ids: &[i64],
        dense: &[f32],
    ) -> Result<Vec<f32>, ExecError> {
        let mut scores = Vec::with_capacity(rows);
        let (gather, inference) = self.run(rows, ids, dense, &mut scores)?;
        self.metrics.gather_duration.observe(gather);
        self.metrics.inference_duration.observe(inference);
        Ok(scores)
    }

    /// Runs each batch size in `sizes` twice with in-vocabulary ids, so that no request pays for first-run
    /// allocations or shape specialisation, and seeds `estimator` with the second run's time. Not recorded in the
    /// metrics.
    pub fn warm_up(
        &mut self,
        sizes: &[usize],
        estimator: Option<&Estimator>,
    ) -> Result<(), ExecError> {
        let shape = self.graph.shape();
        let mut scores = Vec::new();
        for &rows in sizes {
            let ids = vec![0i64; rows * shape.fields];
            let dense = vec![0f32; rows * shape.dense];
            for round in 0..2 {
                let start = Instant::now();
                self.run(rows, &ids, &dense, &mut scores)?;
                if round == 1
                    && let Some(estimator) = estimator
                {
                    estimator.observe(rows, start.elapsed());
                }
            }
        }
        Ok(())
    }

    /// The graph's input sizes.
    pub fn shape(&self) -> super::GraphShape {
        self.graph.shape()
    }

    /// Gather, then inference, of `rows` rows into `scores`; returns their durations in seconds. Records no
    /// metrics (the in-process benchmark calls this).
    pub fn run(
        &mut self,
        rows: usize,
        ids: &[i64],
        dense: &[f32],
        scores: &mut Vec<f32>,
    ) -> Result<(f64, f64), ExecError> {
        let shape = self.graph.shape();
        self.embeddings.clear();
        self.embeddings.resize(rows * shape.fields * shape.dim, 0.0);
        let start = Instant::now();
        self.store.gather(&self.fields, ids, &mut self.embeddings)?;
        let gathered = Instant::now();
        self.graph
            .run(rows, &self.embeddings, dense, scores)
            .map_err(|e| ExecError::Inference(e.to_string()))?;
        Ok((
            (gathered - start).as_secs_f64(),
            gathered.elapsed().as_secs_f64(),
        ))
    }
}
