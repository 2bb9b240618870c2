//! The stage trace of one request: when its first byte arrived and when it passed each later stage (read, decoded,
//! admitted, its batch closed and started, gathered, inferred, answered, encoded, written), from which the
//! server's per-stage histograms (`recserve_request_stage_seconds`) and the slow-request record ([`slow`]) are
//! made. One source for every view of where a request's time went.
//!
//! The connection layer starts a trace for each request at its first byte and makes it the request's current
//! trace (a tokio task-local, [`scope`]) for as long as its future runs, so the stages below it stamp it with
//! [`mark`] and [`record`] without any signature carrying it; code running outside a request (tests calling a
//! model directly, warm-up) finds no current trace and stamps nothing. When the response's last byte has been
//! handed to the connection, the connection layer [`finish`]es it.

pub mod slow;

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// A stage of a request. Each mark ends a stage: the stage's time is from the mark before to this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// From the first byte of the request to the handler holding its whole body (head and body on the wire, HTTP
    /// or gRPC framing, protobuf decoding for gRPC).
    Read,
    /// Decoding and validating the body against the model's contract.
    Decode,
    /// Admission into the model's queue (and, in a pipeline, whatever ran between two models' stages).
    Admit,
    /// Waiting in the queue until the batch it rides in was closed.
    Queue,
    /// From the batch's close to an executor starting it.
    Dispatch,
    /// The embedding gather of its batch.
    Gather,
    /// The dense network's run (recall: the top-K search) of its batch.
    Inference,
    /// From the batch's end to the request's own task holding its answer: answering the batch's jobs and waking
    /// the task on a transport thread.
    Answer,
    /// Building the response.
    Encode,
    /// Handing the response's bytes to the connection.
    Write,
}

impl Stage {
    /// Every stage, in request order; their names are the `stage` label values.
    pub(crate) const ALL: [Stage; 10] = [
        Stage::Read,
        Stage::Decode,
        Stage::Admit,
        Stage::Queue,
        Stage::Dispatch,
        Stage::Gather,
        Stage::Inference,
        Stage::Answer,
        Stage::Encode,
        Stage::Write,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Read => "read",
            Stage::Decode => "decode",
            Stage::Admit => "admit",
            Stage::Queue => "queue",
            Stage::Dispatch => "dispatch",
            Stage::Gather => "gather",
            Stage::Inference => "inference",
            Stage::Answer => "answer",
            Stage::Encode => "encode",
            Stage::Write => "write",
        }
    }
}

/// The batch a request's last model stage rode in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchInfo {
    /// Batches are numbered in the order they close, across the server's models.
    pub id: u64,
    pub rows: usize,
    /// Requests (or chunks of large ones) in it.
    pub requests: usize,
    /// Why it closed (`recserve_batches_total`'s `reason`).
    pub reason: &'static str,
}

/// The most batches of one request whose details a trace keeps, in the order they answered it (a recommend call
/// rides in two, one per model; a request split into chunks in one per chunk): inline, so that noting them
/// allocates nothing.
pub const MAX_BATCHES: usize = 4;

/// What the service knows of a request once its response is ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// The name the request called: a model's, or a pipeline's for recommend (the request metrics' `model` or
    /// `pipeline` label, by `endpoint`).
    pub model: String,
    /// The model version that answered a call of one model (a pipeline's are not named here).
    pub version: Option<u64>,
    pub endpoint: &'static str,
    pub protocol: &'static str,
    /// The HTTP status of the outcome (for gRPC, that of the same outcome).
    pub status: u16,
}

/// The marks of one request so far.
#[derive(Debug)]
pub struct Trace {
    first_byte: Instant,
    marks: Vec<(Stage, Instant)>,
    outcome: Option<Outcome>,
    batch: Option<BatchInfo>,
    batches: [Option<BatchInfo>; MAX_BATCHES],
}

/// A finished trace: its stages' times, in request order (a stage that came more than once, as a pipeline's model
/// stages do, summed into its first place).
#[derive(Clone, Debug, PartialEq)]
pub struct Finished {
    pub outcome: Outcome,
    /// First byte to the last byte handed to the connection.
    pub total: Duration,
    pub stages: Vec<(Stage, Duration)>,
    pub batch: Option<BatchInfo>,
    /// The first [`MAX_BATCHES`] batches the request rode in, in the order they answered it.
    pub batches: [Option<BatchInfo>; MAX_BATCHES],
    /// When the first byte arrived.
    pub first_byte: Instant,
    /// Every mark in the order it was made (each ends a stage at its instant; repeated stages not summed): what
    /// the OpenTelemetry spans of the request are made of.
    pub marks: Vec<(Stage, Instant)>,
    /// When the response was handed over.
    pub at: Instant,
    /// The wall-clock time at `at`.
    pub wall: SystemTime,
}

impl Finished {
    /// The wall-clock time of `t`, an instant of this request (not after [`Finished::at`]).
    pub fn wall_of(&self, t: Instant) -> SystemTime {
        self.wall - self.at.saturating_duration_since(t)
    }
}

impl Trace {
    /// A trace whose first byte arrived at `first_byte`.
    pub(crate) fn new(first_byte: Instant) -> Trace {
        Trace {
            first_byte,
            marks: Vec::with_capacity(16),
            outcome: None,
            batch: None,
            batches: [None; MAX_BATCHES],
        }
    }

    pub(crate) fn first_byte(&self) -> Instant {
        self.first_byte
    }

    /// Ends `stage` at `at`. A mark earlier than the one before it (clocks read on other threads, a stamp from a
    /// batch that closed before this request's previous mark) is moved up to it, so stages never go negative.
    pub fn mark_at(&mut self, stage: Stage, at: Instant) {
        let last = self.marks.last().map_or(self.first_byte, |&(_, t)| t);
        self.marks.push((stage, at.max(last)));
    }

    /// Notes the batch the request's last model stage rode in.
    pub(crate) fn batch(&mut self, batch: BatchInfo) {
        self.batch = Some(batch);
        if let Some(free) = self.batches.iter_mut().find(|b| b.is_none()) {
            *free = Some(batch);
        }
    }

    /// Notes the request's outcome: a trace without one (health checks, `/metrics`, unknown routes) is not kept.
    pub fn outcome(&mut self, outcome: Outcome) {
        self.outcome = Some(outcome);
    }

    /// Ends the trace at `at` (the [`Stage::Write`] mark), or `None` when it has no outcome.
    pub(crate) fn finish(mut self, at: Instant) -> Option<Finished> {
        let outcome = self.outcome.take()?;
        self.mark_at(Stage::Write, at);
        let mut stages: Vec<(Stage, Duration)> = Vec::with_capacity(self.marks.len());
        let mut before = self.first_byte;
        for &(stage, t) in &self.marks {
            let took = t.saturating_duration_since(before);
            before = t;
            match stages.iter_mut().find(|(s, _)| *s == stage) {
                Some((_, sum)) => *sum += took,
                None => stages.push((stage, took)),
            }
        }
        Some(Finished {
            outcome,
            total: before.saturating_duration_since(self.first_byte),
            stages,
            batch: self.batch,
            batches: self.batches,
            first_byte: self.first_byte,
            marks: self.marks,
            at: before,
            wall: SystemTime::now(),
        })
    }
}

/// A trace shared by the request's future and the connection that finishes it.
#[derive(Debug)]
pub struct TraceCell(Mutex<Option<Trace>>);

impl TraceCell {
    pub fn new(first_byte: Instant) -> Arc<TraceCell> {
        Arc::new(TraceCell(Mutex::new(Some(Trace::new(first_byte)))))
    }

    fn with<T>(&self, f: impl FnOnce(&mut Trace) -> T) -> Option<T> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_mut()
            .map(f)
    }

    /// Takes the trace out and finishes it at `at` (once: later calls get `None`).
    pub fn finish(&self, at: Instant) -> Option<Finished> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()?
            .finish(at)
    }
}

tokio::task_local! {
    static CURRENT: Arc<TraceCell>;
}

/// Runs `future` with `trace` as its current trace.
pub fn scope<F: Future>(trace: Arc<TraceCell>, future: F) -> impl Future<Output = F::Output> {
    CURRENT.scope(trace, future)
}

/// Applies `f` to the current trace, if the caller runs inside a request.
pub fn record(f: impl FnOnce(&mut Trace)) {
    let _ = CURRENT.try_with(|cell| cell.with(f));
}

/// Ends `stage` now on the current trace.
pub fn mark(stage: Stage) {
    record(|t| t.mark_at(stage, Instant::now()));
}

/// When the current request's first byte arrived; outside a request (a handler called directly), now.
pub fn arrival() -> Instant {
    CURRENT
        .try_with(|cell| cell.with(|t| t.first_byte()))
        .ok()
        .flatten()
        .unwrap_or_else(Instant::now)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn outcome() -> Outcome {
        Outcome {
            model: "m".to_owned(),
            version: None,
            endpoint: "rank",
            protocol: "v1",
            status: 200,
        }
    }

    #[test]
    fn stages_are_the_times_between_marks_and_sum_to_the_total() {
        let t0 = Instant::now();
        let mut t = Trace::new(t0);
        t.mark_at(Stage::Read, t0 + MS);
        t.mark_at(Stage::Decode, t0 + 3 * MS);
        t.mark_at(Stage::Queue, t0 + 4 * MS);
        t.outcome(outcome());
        let f = t.finish(t0 + 10 * MS).expect("has an outcome");
        assert_eq!(
            f.stages,
            vec![
                (Stage::Read, MS),
                (Stage::Decode, 2 * MS),
                (Stage::Queue, MS),
                (Stage::Write, 6 * MS)
            ]
        );
        assert_eq!(f.total, 10 * MS);
        assert_eq!(f.stages.iter().map(|(_, d)| *d).sum::<Duration>(), f.total);
    }

    #[test]
    fn a_repeated_stage_is_summed_in_its_first_place_and_marks_never_go_back() {
        let t0 = Instant::now();
        let mut t = Trace::new(t0);
        t.mark_at(Stage::Admit, t0 + MS);
        t.mark_at(Stage::Queue, t0 + 2 * MS);
        // A stamp taken before the previous mark (another thread's clock) counts as no time.
        t.mark_at(Stage::Admit, t0 + MS);
        t.mark_at(Stage::Queue, t0 + 5 * MS);
        t.outcome(outcome());
        let f = t.finish(t0 + 5 * MS).expect("has an outcome");
        assert_eq!(
            f.stages,
            vec![
                (Stage::Admit, MS),
                (Stage::Queue, 4 * MS),
                (Stage::Write, Duration::ZERO)
            ]
        );
    }

    #[test]
    fn a_trace_without_an_outcome_is_not_kept() {
        let cell = TraceCell::new(Instant::now());
        assert!(cell.finish(Instant::now()).is_none());
        let cell = TraceCell::new(Instant::now());
        cell.with(|t| t.outcome(outcome()));
        assert!(cell.finish(Instant::now()).is_some());
        assert!(cell.finish(Instant::now()).is_none(), "finished once");
    }

    #[tokio::test]
    async fn marks_reach_the_current_trace_and_nothing_outside_a_request() {
        let t0 = Instant::now() - 5 * MS;
        mark(Stage::Read);
        assert!(
            arrival() >= t0 + 5 * MS,
            "outside a request, arrival is now"
        );
        let cell = TraceCell::new(t0);
        scope(Arc::clone(&cell), async {
            assert_eq!(arrival(), t0);
            mark(Stage::Read);
            record(|t| t.outcome(outcome()));
        })
        .await;
        let f = cell.finish(Instant::now()).expect("has an outcome");
        assert_eq!(f.stages[0].0, Stage::Read);
        assert!(f.stages[0].1 >= 5 * MS);
    }
}
