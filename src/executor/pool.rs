//! Executor threads: each owns one [`Worker`] (a dense-graph session, its gather lane, and scratch buffers) and
//! takes jobs from the model's queue: gather the rows' embeddings, run the graph, reply with one score per row.
//! Plain OS threads, so the tokio workers never block on inference. When the session runs on a GPU the lane
//! gathers straight into the session's device input; otherwise into host memory.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};
use tokio::sync::oneshot;

use super::DenseGraph;
use crate::embedding::{GatherError, GatherLane};
use crate::metrics::ModelMetrics;

/// Why a job failed inside the executor. Never the client's fault: validation happens before queueing.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("gather failed: {0}")]
    Gather(#[from] GatherError),
    #[error("ONNX Runtime failed: {0}")]
    Inference(String),
    #[error("the executor panicked: {0}")]
    Panicked(String),
}

/// Rows to score: `ids` is `[rows, fields]`, `dense` is `[rows, dense_features]`.
#[derive(Debug)]
pub struct RankJob {
    pub rows: usize,
    pub ids: Vec<i64>,
    pub dense: Vec<f32>,
    pub reply: oneshot::Sender<Result<Vec<f32>, ExecError>>,
}

/// What one executor thread owns: a session, the lane it gathers through, and a reusable gather buffer.
#[derive(Debug)]
pub struct Worker {
    graph: DenseGraph,
    lane: Box<dyn GatherLane>,
    /// Table index of each field, in graph order.
    fields: Arc<[usize]>,
    embeddings: Vec<f32>,
    metrics: ModelMetrics,
}

impl Worker {
    /// `lane` comes from [`crate::embedding::lane`]; a graph on a GPU must be on the lane's GPU.
    pub fn new(
        graph: DenseGraph,
        lane: Box<dyn GatherLane>,
        fields: Arc<[usize]>,
        metrics: ModelMetrics,
    ) -> Worker {
        Worker {
            graph,
            lane,
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
    /// allocations or shape specialisation. Not recorded in the metrics.
    pub fn warm_up(&mut self, sizes: &[usize]) -> Result<(), ExecError> {
        let shape = self.graph.shape();
        let mut scores = Vec::new();
        for &rows in sizes {
            let ids = vec![0i64; rows * shape.fields];
            let dense = vec![0f32; rows * shape.dense];
            for _ in 0..2 {
                self.run(rows, &ids, &dense, &mut scores)?;
            }
        }
        Ok(())
    }

    /// Gather, then inference; returns their durations in seconds.
    fn run(
        &mut self,
        rows: usize,
        ids: &[i64],
        dense: &[f32],
        scores: &mut Vec<f32>,
    ) -> Result<(f64, f64), ExecError> {
        let inference = |e: ort::Error| ExecError::Inference(e.to_string());
        if self.graph.cuda_device().is_some() {
            // Gather into the session's device input (allocation included in the gather time).
            let start = Instant::now();
            let input = self.graph.device_input(rows).map_err(inference)?;
            self.lane.gather_device(&self.fields, ids, input.output())?;
            let gathered = Instant::now();
            self.graph
                .run_device(input, dense, scores)
                .map_err(inference)?;
            return Ok((
                (gathered - start).as_secs_f64(),
                gathered.elapsed().as_secs_f64(),
            ));
        }
        let shape = self.graph.shape();
        self.embeddings.clear();
        self.embeddings.resize(rows * shape.fields * shape.dim, 0.0);
        let start = Instant::now();
        self.lane
            .gather_host(&self.fields, ids, &mut self.embeddings)?;
        let gathered = Instant::now();
        self.graph
            .run(rows, &self.embeddings, dense, scores)
            .map_err(inference)?;
        Ok((
            (gathered - start).as_secs_f64(),
            gathered.elapsed().as_secs_f64(),
        ))
    }
}

/// The executor threads of one model and the bounded queue in front of them.
#[derive(Debug)]
pub struct ExecutorPool {
    /// `None` only while dropping: closing the queue is what stops the threads.
    sender: Option<Sender<RankJob>>,
    threads: Vec<JoinHandle<()>>,
}

/// A job the queue did not take, handed back.
#[derive(Debug)]
pub enum Refused {
    Full(RankJob),
    Closed(RankJob),
}

impl ExecutorPool {
    /// Starts one thread per worker behind a queue of `queue_capacity` jobs.
    pub fn start(
        model: &str,
        workers: Vec<Worker>,
        queue_capacity: usize,
    ) -> std::io::Result<ExecutorPool> {
        let (sender, receiver) = bounded(queue_capacity);
        let mut threads = Vec::with_capacity(workers.len());
        for (i, worker) in workers.into_iter().enumerate() {
            let receiver = receiver.clone();
            let handle = std::thread::Builder::new()
                .name(format!("exec-{model}-{i}"))
                .spawn(move || run_worker(worker, receiver))?;
            threads.push(handle);
        }
        Ok(ExecutorPool {
            sender: Some(sender),
            threads,
        })
    }

    /// Queues `job`, or hands it back at once when the queue is full.
    pub fn try_submit(&self, job: RankJob) -> Result<(), Refused> {
        let Some(sender) = &self.sender else {
            return Err(Refused::Closed(job));
        };
        sender.try_send(job).map_err(|e| match e {
            TrySendError::Full(job) => Refused::Full(job),
            TrySendError::Disconnected(job) => Refused::Closed(job),
        })
    }
}

impl Drop for ExecutorPool {
    /// Closes the queue, lets the threads finish the jobs already in it, and joins them.
    fn drop(&mut self) {
        self.sender.take();
        for thread in self.threads.drain(..) {
            if thread.join().is_err() {
                tracing::error!("an executor thread panicked");
            }
        }
    }
}

fn run_worker(mut worker: Worker, jobs: Receiver<RankJob>) {
    while let Ok(job) = jobs.recv() {
        if job.reply.is_closed() {
            worker.metrics.abandoned.inc();
            continue;
        }
        let result = catch_unwind(AssertUnwindSafe(|| {
            worker.execute(job.rows, &job.ids, &job.dense)
        }))
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            Err(ExecError::Panicked(what))
        });
        // The client may have gone while the job ran; nothing to do then.
        let _ = job.reply.send(result);
    }
}
