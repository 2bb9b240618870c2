//! The raw ceiling: the same model run in-process with no server, through the very code the server's executor
//! threads run for a batch (`recserve_core::executor::Worker::execute`: the embedding gather through the executor's
//! lane, then the ONNX Runtime session), wired from the same configuration as `recserve serve` (the ceiling takes
//! its flags: device, executors, intra-op threads, shards, batching buckets). A batch of `rows` request rows is
//! padded to the server's bucket for that size where the server pads it (executors on a GPU; on the CPU batches
//! run at their own size). Server throughput divided by this is the
//! serving efficiency: what HTTP, JSON, validation, queueing and batching cost.
//!
//! Inputs are ranking requests from the same generator the load runs use, decoded by the server's own `/v1`
//! decoder, so the ids, their distribution and the rows per batch match what the server sees.

use std::sync::Arc;
use std::time::{Duration, Instant};

use recserve::api::v1::rank_body::decode_rank;
use recserve::config::Config;
use recserve_core::error::LoadError;
use recserve_core::executor::{Runtime, RuntimeError, Worker};
use recserve_core::gpu::{self, GpuError};
use recserve_core::metrics::Metrics;
use recserve_core::ranking::{RankContract, RankInput};
use recserve_core::repository::{self, ModelKind};
use serde::{Deserialize, Serialize};

use crate::report::now_rfc3339;
use crate::stats::{Durations, LatencySummary};
use crate::workload::{IdDistribution, RankOptions, RankSchema, RankWorkload, WorkloadError};

/// How long one in-process call may wait for rows (the ceiling serves mapped tables, which never wait).
const CALL_BUDGET: Duration = Duration::from_secs(1);

pub const CEILING_SCHEMA: &str = "recload.ceiling/v1";

/// Settings of `recload ceiling` besides the server configuration.
#[derive(Clone, Debug)]
pub struct CeilingOptions {
    pub model: String,
    /// Request rows per batch; each is measured in turn (padded to the server's bucket for it where the server
    /// pads).
    pub batch_rows: Vec<usize>,
    /// Candidates per generated request (a batch of `rows` holds `rows / candidates` requests).
    pub candidates: usize,
    pub warmup: Duration,
    pub duration: Duration,
    pub ids: IdDistribution,
    pub zipf_exponent: f64,
    pub pool: usize,
    pub seed: u64,
}

/// One batch size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CeilingBatch {
    /// Request rows per batch.
    pub rows: usize,
    /// Rows actually computed: `rows`, padded up to the server's bucket where the server pads (on a GPU).
    pub bucket: usize,
    /// Calls of gather + inference in the measurement window (all executors).
    pub calls: u64,
    pub calls_per_s: f64,
    /// Request rows per second (padding not counted).
    pub rows_per_s: f64,
    /// `rows_per_s / candidates`: requests per second if every batch were made of whole requests.
    pub requests_per_s: f64,
    /// Duration of one call.
    pub latency_ms: Option<LatencySummary>,
}

/// `recload ceiling --json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CeilingReport {
    pub schema: String,
    pub recload_version: String,
    pub started_at: String,
    pub repository: String,
    pub model: String,
    pub version: u64,
    pub precision: String,
    /// Where the tables were gathered: `cpu` or `cuda:N`.
    pub device: String,
    pub executors: usize,
    pub intra_op_threads: usize,
    pub shards: usize,
    /// The server's bucket sizes for this model and configuration: warmed up, and padded to on a GPU.
    pub buckets: Vec<usize>,
    pub candidates: usize,
    pub ids: String,
    pub warmup_s: f64,
    pub duration_s: f64,
    pub batches: Vec<CeilingBatch>,
}

/// Why the ceiling could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum CeilingError {
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("cannot load the model: {0}")]
    Load(#[from] LoadError),
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("{0}")]
    Invalid(String),
    #[error("a gather + inference call failed: {0}")]
    Execute(String),
}

/// Concatenates requests' rows into batches of exactly `rows` rows (the last request of a batch may be cut).
fn batches(inputs: &[RankInput], rows: usize, fields: usize, dense: usize) -> Vec<RankInput> {
    let mut out = Vec::new();
    let mut current = RankInput {
        rows: 0,
        ids: Vec::with_capacity(rows * fields),
        dense: Vec::with_capacity(rows * dense),
    };
    for input in inputs
        .iter()
        .cycle()
        .take(inputs.len().max(1) * rows.max(1))
    {
        let mut row = 0;
        while row < input.rows {
            let take = (rows - current.rows).min(input.rows - row);
            current
                .ids
                .extend_from_slice(&input.ids[row * fields..(row + take) * fields]);
            current
                .dense
                .extend_from_slice(&input.dense[row * dense..(row + take) * dense]);
            current.rows += take;
            row += take;
            if current.rows == rows {
                out.push(std::mem::replace(
                    &mut current,
                    RankInput {
                        rows: 0,
                        ids: Vec::with_capacity(rows * fields),
                        dense: Vec::with_capacity(rows * dense),
                    },
                ));
                if out.len() == inputs.len() {
                    return out;
                }
            }
        }
    }
    out
}

/// The requests of the batch of `rows` rows that starts at row `start` of the requests of `candidates` rows each
/// laid end to end (what `batches` cuts): the rows of each, in order.
fn request_runs(start: usize, rows: usize, candidates: usize) -> Vec<usize> {
    let mut runs = Vec::new();
    let mut at = start;
    while at < start + rows {
        let take = (candidates - at % candidates).min(start + rows - at);
        runs.push(take);
        at += take;
    }
    runs
}

/// Pads a batch to `bucket` rows as the server's executor does: padding rows read row 0 of every table.
fn padded(batch: &RankInput, bucket: usize, fields: usize, dense: usize) -> RankInput {
    let mut ids = batch.ids.clone();
    let mut values = batch.dense.clone();
    ids.resize(bucket * fields, 0);
    values.resize(bucket * dense, 0.0);
    RankInput {
        rows: bucket,
        ids,
        dense: values,
    }
}

/// Measures every batch size of `options` on the model `config` would serve.
pub fn run(config: &Config, options: &CeilingOptions) -> Result<CeilingReport, CeilingError> {
    if options.batch_rows.is_empty() || options.batch_rows.contains(&0) {
        return Err(CeilingError::Invalid(
            "--batch-rows must list batch sizes of at least 1 row".to_owned(),
        ));
    }
    if options.duration.is_zero() || options.candidates == 0 {
        return Err(CeilingError::Invalid(
            "--duration and --candidates must be positive".to_owned(),
        ));
    }
    let started_at = now_rfc3339();
    let found = repository::discover(&config.repository, &config.policies)?;
    // The highest version its policy serves.
    let mv = found
        .iter()
        .rfind(|m| m.name == options.model)
        .ok_or_else(|| {
            CeilingError::Invalid(format!(
                "--model {:?} is not in {} (models: {})",
                options.model,
                config.repository.display(),
                found
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))
        })?;
    let spec = Arc::new(repository::read_spec(&mv.dir)?);
    if spec.kind != ModelKind::Deepfm || spec.dense_graph.is_none() {
        return Err(CeilingError::Invalid(format!(
            "model {:?} is not a deepfm model with a dense graph",
            options.model
        )));
    }

    // The server's own wiring of a ranking model's executors, without its batcher.
    let runtime = Runtime::load(&config.ort_library)?;
    let placement = gpu::select(config.device)?;
    let ctx = config.load_context(runtime, Metrics::new(), placement);
    let (mut batching, _) = ctx.batching.resolve(&spec.batching);
    if let Some(&rows) = options
        .batch_rows
        .iter()
        .find(|&&r| r > batching.max_batch_rows)
    {
        return Err(CeilingError::Invalid(format!(
            "--batch-rows {rows} is above the server's max batch rows ({}), which it would split",
            batching.max_batch_rows
        )));
    }
    let store = recserve_core::ranking::open_store(&ctx, mv, &spec)?;
    let contract = RankContract::new(Arc::clone(&spec), options.candidates);
    let shape = contract.shape();
    let mut workers =
        recserve_core::ranking::open_workers(&ctx, mv, &store, &contract, &mut batching)?;

    let workload = RankWorkload::new(
        RankSchema::from_spec(&mv.name, &spec)?,
        RankOptions {
            candidates: options.candidates,
            ids: options.ids,
            zipf_exponent: options.zipf_exponent,
            top_k: None,
            user_id_field: None,
            body: crate::workload::BodyForm::Rows,
        },
        None,
    )?;
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(options.seed);
    let inputs = (0..options.pool.max(1))
        .map(|_| {
            let body = workload.body(&mut rng);
            decode_rank(&contract, &body)
                .map(|decoded| decoded.input)
                .map_err(|e| CeilingError::Invalid(format!("generated request refused: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let mut results = Vec::with_capacity(options.batch_rows.len());
    for &rows in &options.batch_rows {
        let bucket = batching.executed_rows(rows);
        let batches: Arc<Vec<(RankInput, Vec<usize>)>> = Arc::new(
            batches(&inputs, rows, shape.fields, shape.dense)
                .iter()
                .enumerate()
                .map(|(b, batch)| {
                    let runs = request_runs(b * rows, rows, options.candidates);
                    (padded(batch, bucket, shape.fields, shape.dense), runs)
                })
                .collect(),
        );
        for worker in &mut workers {
            worker
                .warm_up(&[bucket], None)
                .map_err(|e| CeilingError::Execute(e.to_string()))?;
        }
        let measured = std::thread::scope(|scope| {
            let handles: Vec<_> = workers
                .iter_mut()
                .enumerate()
                .map(|(t, worker)| {
                    let batches = Arc::clone(&batches);
                    scope.spawn(move || measure(worker, &batches, t, options))
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().map_err(|_| {
                        CeilingError::Execute("a measuring thread panicked".to_owned())
                    })?
                })
                .collect::<Result<Vec<_>, _>>()
        })?;
        let mut latency = Durations::new();
        let mut calls = 0;
        for (n, d) in &measured {
            calls += n;
            latency.add(d);
        }
        let seconds = options.duration.as_secs_f64();
        let rows_per_s = (calls * rows as u64) as f64 / seconds;
        results.push(CeilingBatch {
            rows,
            bucket,
            calls,
            calls_per_s: calls as f64 / seconds,
            rows_per_s,
            requests_per_s: rows_per_s / options.candidates as f64,
            latency_ms: latency.summary(),
        });
    }
    Ok(CeilingReport {
        schema: CEILING_SCHEMA.to_owned(),
        recload_version: env!("CARGO_PKG_VERSION").to_owned(),
        started_at,
        repository: config.repository.display().to_string(),
        model: mv.name.clone(),
        version: mv.version,
        precision: spec.precision().as_str().to_owned(),
        device: store.device().to_owned(),
        executors: ctx.executors,
        intra_op_threads: ctx.session.intra_op_threads,
        shards: ctx.shards,
        buckets: batching.buckets.clone(),
        candidates: options.candidates,
        ids: match options.ids {
            IdDistribution::Zipf => format!("zipf({})", options.zipf_exponent),
            IdDistribution::Uniform => "uniform".to_owned(),
        },
        warmup_s: options.warmup.as_secs_f64(),
        duration_s: options.duration.as_secs_f64(),
        batches: results,
    })
}

/// One executor thread: warm-up calls, then calls for `duration`, each timed.
fn measure(
    worker: &mut Worker,
    batches: &[(RankInput, Vec<usize>)],
    thread: usize,
    options: &CeilingOptions,
) -> Result<(u64, Durations), CeilingError> {
    let mut latency = Durations::new();
    let mut next = thread * 7919;
    let mut call = |worker: &mut Worker| -> Result<Duration, CeilingError> {
        let (input, requests) = &batches[next % batches.len()];
        next += 1;
        let start = Instant::now();
        let executed = worker
            .execute(
                input.rows,
                &input.ids,
                &input.dense,
                requests,
                start + CALL_BUDGET,
            )
            .map_err(|e| CeilingError::Execute(e.to_string()))?;
        let took = start.elapsed();
        std::hint::black_box(executed);
        Ok(took)
    };
    let warm_until = Instant::now() + options.warmup;
    while Instant::now() < warm_until {
        call(worker)?;
    }
    let until = Instant::now() + options.duration;
    let mut calls = 0;
    while Instant::now() < until {
        latency.record(call(worker)?);
        calls += 1;
    }
    Ok((calls, latency))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(first_id: i64, rows: usize) -> RankInput {
        RankInput {
            rows,
            ids: (0..rows as i64 * 2).map(|i| first_id + i).collect(),
            dense: vec![first_id as f32; rows],
        }
    }

    #[test]
    fn request_runs_follow_the_request_boundaries() {
        assert_eq!(request_runs(0, 4, 3), vec![3, 1]);
        assert_eq!(request_runs(4, 4, 3), vec![2, 2]);
        assert_eq!(request_runs(0, 200, 100), vec![100, 100]);
        assert_eq!(request_runs(150, 100, 100), vec![50, 50]);
        assert_eq!(request_runs(0, 50, 100), vec![50]);
    }

    #[test]
    fn batches_hold_exactly_the_requested_rows_in_request_order() {
        let inputs = vec![input(0, 3), input(100, 3)];
        // Two fields, one dense feature; 4 rows per batch: rows 0-2 of the first request, row 0 of the second.
        let b = batches(&inputs, 4, 2, 1);
        assert_eq!(b.len(), 2);
        assert_eq!(b[0].rows, 4);
        assert_eq!(b[0].ids, vec![0, 1, 2, 3, 4, 5, 100, 101]);
        assert_eq!(b[0].dense, vec![0.0, 0.0, 0.0, 100.0]);
        assert_eq!(b[1].ids, vec![102, 103, 104, 105, 0, 1, 2, 3]);
        // A batch of one request, and of a part of one.
        assert_eq!(batches(&inputs, 3, 2, 1)[1].ids, inputs[1].ids);
        assert_eq!(batches(&inputs, 1, 2, 1)[0].ids, vec![0, 1]);
    }
}
