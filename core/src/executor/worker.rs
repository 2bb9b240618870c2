//! What one executor thread owns: a dense-graph session, its gather lane, and scratch buffers. When the session
//! runs on a GPU the lane gathers straight into the session's device input; otherwise into host memory. [`Worker::run`] is the compute path of a batch (gather, then inference); the batcher's executor threads
//! call it, and so does the in-process throughput benchmark.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{DenseGraph, SplitGraph};
use crate::batching::{Estimator, ExecError};
use crate::embedding::{GatherError, GatherLane, SharedGather};
use crate::metrics::ModelMetrics;

/// How long a warm-up batch may wait for rows of a remote tier (it reads row 0 of every table, once per bucket).
const WARM_UP_BUDGET: Duration = Duration::from_secs(10);

/// A batch's scores and how long its two phases took.
#[derive(Debug)]
pub struct Executed {
    pub(crate) scores: Vec<f32>,
    pub(crate) gather: Duration,
    pub(crate) inference: Duration,
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
    /// Set by [`Worker::with_user_columns`]: host gathers read each request's user columns once.
    shared: Option<SharedGather>,
    /// Set by [`Worker::with_split`]: host batches run the user graph once per run of rows with one user side,
    /// then the item graph.
    split: Option<Split>,
}

/// A split graph and what finding its runs needs.
#[derive(Debug)]
struct Split {
    graph: SplitGraph,
    /// Columns that are user side, in graph order.
    user_columns: Vec<usize>,
    /// Rows of each run of a batch that share a user side.
    runs: Vec<usize>,
}

impl Worker {
    /// `lane` comes from [`crate::embedding::lane`]; a graph on a GPU must be on the lane's GPU.
    pub(crate) fn new(
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
            shared: None,
            split: None,
        }
    }

    /// Host batches are scored by `split` (the user graph on one row per run of rows whose `user_columns` ids and
    /// dense features are equal, the item graph on every row) instead of the whole graph; device batches are
    /// unchanged.
    pub(crate) fn with_split(mut self, split: SplitGraph, user_columns: &[usize]) -> Worker {
        self.split = Some(Split {
            graph: split,
            user_columns: user_columns.to_vec(),
            runs: Vec::new(),
        });
        self
    }

    /// Host gathers read `user_columns` (columns that are one value per request, in graph order) once per run of
    /// rows with equal user ids ([`SharedGather`]; the same values as the plain gather). Device gathers are
    /// unchanged.
    pub(crate) fn with_user_columns(mut self, user_columns: &[usize]) -> Worker {
        self.shared = Some(SharedGather::new(&self.fields, user_columns));
        self
    }

    /// Gathers and scores `rows` rows, recording gather and inference durations: consecutive runs of
    /// `requests[i]` rows that share a user side (a batch's requests, in order), then padding. Rows of a remote
    /// tier are waited for until `deadline` at most (the batch's earliest deadline).
    pub fn execute(
        &mut self,
        rows: usize,
        ids: &[i64],
        dense: &[f32],
        requests: &[usize],
        deadline: Instant,
    ) -> Result<Executed, ExecError> {
        let mut scores = Vec::with_capacity(rows);
        let (gather, inference) = self.run(rows, ids, dense, requests, &mut scores, deadline)?;
        self.metrics.gather_duration.observe(gather);
        self.metrics.inference_duration.observe(inference);
        Ok(Executed {
            scores,
            gather: Duration::from_secs_f64(gather),
            inference: Duration::from_secs_f64(inference),
        })
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
                self.run(
                    rows,
                    &ids,
                    &dense,
                    &[rows],
                    &mut scores,
                    start + WARM_UP_BUDGET,
                )?;
                if round == 1
                    && let Some(estimator) = estimator
                {
                    estimator.observe(rows, start.elapsed());
                }
            }
        }
        Ok(())
    }

    /// Gather, then inference, of `rows` rows (`requests` as for [`Worker::execute`]) into `scores`; returns
    /// their durations in seconds. Records no metrics (the in-process benchmark calls this).
    pub(crate) fn run(
        &mut self,
        rows: usize,
        ids: &[i64],
        dense: &[f32],
        requests: &[usize],
        scores: &mut Vec<f32>,
        deadline: Instant,
    ) -> Result<(f64, f64), ExecError> {
        let inference = |e: ort::Error| ExecError::Failed(format!("ONNX Runtime failed: {e}"));
        let gather = |e: GatherError| match e {
            GatherError::Unfetched { .. } => ExecError::TierUnavailable(e.to_string()),
            _ => ExecError::Failed(format!("gather failed: {e}")),
        };
        if self.graph.cuda_device().is_some() {
            // Gather into the session's device input (allocation included in the gather time).
            let start = Instant::now();
            let input = self.graph.device_input(rows).map_err(inference)?;
            self.lane
                .gather_device(&self.fields, ids, input.output())
                .map_err(gather)?;
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
        // Not cleared first: the gather writes every value, and zeroing the buffer cost a pass over it per batch.
        self.embeddings.resize(rows * shape.fields * shape.dim, 0.0);
        let start = Instant::now();
        match &mut self.shared {
            Some(shared) => shared.gather(
                self.lane.as_mut(),
                ids,
                shape.dim,
                &mut self.embeddings,
                deadline,
            ),
            None => self
                .lane
                .gather_host_until(&self.fields, ids, &mut self.embeddings, deadline),
        }
        .map_err(gather)?;
        let gathered = Instant::now();
        match &mut self.split {
            Some(split) => {
                user_runs(
                    requests,
                    ids,
                    shape.fields,
                    dense,
                    shape.dense,
                    &split.user_columns,
                    &mut split.runs,
                );
                split
                    .graph
                    .run(rows, &self.embeddings, dense, &split.runs, scores)
            }
            None => self.graph.run(rows, &self.embeddings, dense, scores),
        }
        .map_err(inference)?;
        Ok((
            (gathered - start).as_secs_f64(),
            gathered.elapsed().as_secs_f64(),
        ))
    }
}

/// Cuts the rows of `requests` (consecutive entries of a batch, then padding) into runs that share a user side:
/// a run ends with its entry, or where a row's `user_columns` ids or dense features differ from the row before.
/// A `/v1` request is one run; a KServe v2 request may hold a row per user, each with its own dense features.
fn user_runs(
    requests: &[usize],
    ids: &[i64],
    fields: usize,
    dense: &[f32],
    features: usize,
    user_columns: &[usize],
    runs: &mut Vec<usize>,
) {
    runs.clear();
    let mut start = 0;
    for &count in requests {
        let mut run = 0;
        for r in start..start + count {
            let same = run > 0 && {
                let (row, previous) = (&ids[r * fields..], &ids[(r - 1) * fields..]);
                user_columns.iter().all(|&c| row[c] == previous[c])
                    && dense[r * features..(r + 1) * features]
                        .iter()
                        .zip(&dense[(r - 1) * features..r * features])
                        .all(|(a, b)| a.to_bits() == b.to_bits())
            };
            if !same && run > 0 {
                runs.push(run);
                run = 0;
            }
            run += 1;
        }
        if run > 0 {
            runs.push(run);
        }
        start += count;
    }
}

#[cfg(test)]
mod tests {
    use super::user_runs;

    #[test]
    fn runs_end_with_their_request_or_where_the_user_side_changes() {
        // 3 columns (user, item, user), 1 dense feature; two requests of 3 and 2 rows, then a padding row.
        let ids = [
            1, 10, 2, /* */ 1, 11, 2, /* user 5 */ 5, 12, 2, //
            5, 13, 2, /* */ 5, 14, 2, /* padding */ 0, 0, 0,
        ];
        let dense = [0.5, 0.5, 0.5, 0.5, 0.25, 0.0];
        let mut runs = Vec::new();
        user_runs(&[3, 2], &ids, 3, &dense, 1, &[0, 2], &mut runs);
        // Row 2 starts a run (user 5); row 3 starts a request; row 4 has other dense features.
        assert_eq!(runs, vec![2, 1, 1, 1]);
        // Without dense features, and with rows of one user side: one run per request.
        user_runs(&[3, 2], &[7; 18], 3, &[], 0, &[0, 2], &mut runs);
        assert_eq!(runs, vec![3, 2]);
        // The same bits only: 0.0 and -0.0 are different dense values to the graph's input.
        user_runs(
            &[2],
            &[1, 1, 1, 1, 1, 1],
            3,
            &[0.0, -0.0],
            1,
            &[0],
            &mut runs,
        );
        assert_eq!(runs, vec![1, 1]);
    }
}
