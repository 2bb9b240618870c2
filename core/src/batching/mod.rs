//! Dynamic batching: each model's executor threads take their batches straight from the model's queue. A free
//! executor asks the policy ([`policy::Policy`], a plain struct tested with a fake clock) what to do: take the
//! queue's oldest requests now (work-conserving: a request that finds an executor free is not delayed), or wait
//! for company when the policy predicts that pays, or sleep until a request arrives. Requests that arrive while
//! every executor is busy wait and ride in the next batch together. This module is the thin loop around the
//! policy: admission on the transport's side ([`Batcher::run`]), and the executors' loop ([`run_executor`]). One
//! hand-off per request each way (transport → executor, executor → transport), no thread between them. Plain OS
//! threads: tokio timers have millisecond granularity; an executor waiting for company wakes within tens of
//! microseconds (a condition variable with a timeout, then a short spin).

mod arrivals;
pub(crate) mod estimator;
mod job;
pub(crate) mod lateness;
pub(crate) mod policy;
pub mod statistics;

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge};

use crate::error::ServiceError;
use crate::threads::ThreadRole;
use crate::trace::{self, BatchInfo, Stage};
pub use estimator::Estimator;
pub use job::{Answer, Answered, BatchTrace, ExecError, Job, Work, catch_panic};
pub use policy::{Batch, BatchConfig, CloseReason, Entry, QueueFit, Refusal, split_rows};
use policy::{Decision, Dropped, Policy};
use statistics::Phases;
pub use statistics::{BatchSizeStat, DurationStat, Statistics, StatisticsSnapshot};

/// Closer than this to a wake-up time, an executor waiting for company spins instead of sleeping (a timed wait
/// overshoots by tens of µs).
const SPIN: Duration = Duration::from_micros(80);

/// Built-in defaults (documented in docs/batching.md).
pub const DEFAULT_MAX_BATCH_ROWS: usize = 1024;
pub const DEFAULT_MAX_QUEUE_DELAY_US: u64 = 500;
pub const DEFAULT_DEADLINE_MS: u64 = 1000;

/// Batch sizes about 25% apart up to `max` (1, 2, 4, …, 64, 80, 96, 112, 128, 160, …), so padding wastes at most
/// about a fifth of a batch.
pub(crate) fn default_buckets(max: usize) -> Vec<usize> {
    let mut out = vec![1, 2, 4, 8, 16, 32, 48];
    let mut base = 64;
    while base < max {
        out.extend([base, base + base / 4, base + base / 2, base + 3 * base / 4]);
        base *= 2;
    }
    out.retain(|&b| b < max);
    out.push(max);
    out
}

/// Batching settings of the server (flags, environment, config file): each one that is set overrides the
/// model's `[batching]` section.
/// A [`BatchSettings::enabled`] as the config file spells it (`--batching on|off`).
fn serialize_on_off<S: serde::Serializer>(on: &bool, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(if *on { "on" } else { "off" })
}

/// A [`BatchSettings::fixed_delay`] as the config file spells it (`--batch-delay fixed|adaptive`).
fn serialize_fixed_or_adaptive<S: serde::Serializer>(
    fixed: &bool,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.serialize_str(if *fixed { "fixed" } else { "adaptive" })
}

/// Serialized with the keys of the config file (`check-config` prints it).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct BatchSettings {
    /// `--batching on`.
    #[serde(rename = "batching", serialize_with = "serialize_on_off")]
    pub enabled: bool,
    /// `--batch-delay fixed`: a free executor always waits for company.
    #[serde(rename = "batch_delay", serialize_with = "serialize_fixed_or_adaptive")]
    pub fixed_delay: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_batch_rows: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_queue_delay_us: Option<u64>,
    #[serde(rename = "batch_buckets", skip_serializing_if = "Option::is_none")]
    pub buckets: Option<Vec<usize>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub default_deadline_ms: Option<u64>,
    pub queue_capacity: usize,
    pub executor_niceness: u8,
}

impl BatchSettings {
    /// The batching of a model whose `model.toml` says `model`: server setting, else model setting, else default.
    /// Returns the configuration and the default deadline.
    pub fn resolve(&self, model: &crate::repository::BatchingSpec) -> (BatchConfig, Duration) {
        let max_batch_rows = self
            .max_batch_rows
            .or(model.max_batch_rows)
            .unwrap_or(DEFAULT_MAX_BATCH_ROWS);
        let mut buckets = self
            .buckets
            .clone()
            .or_else(|| model.buckets.clone())
            .unwrap_or_else(|| default_buckets(max_batch_rows));
        buckets.retain(|&b| b < max_batch_rows);
        buckets.push(max_batch_rows);
        let delay = self
            .max_queue_delay_us
            .or(model.max_queue_delay_us)
            .unwrap_or(DEFAULT_MAX_QUEUE_DELAY_US);
        let deadline = self
            .default_deadline_ms
            .or(model.default_deadline_ms)
            .unwrap_or(DEFAULT_DEADLINE_MS);
        (
            BatchConfig {
                enabled: self.enabled,
                fixed_delay: self.fixed_delay,
                max_batch_rows,
                max_queue_delay: Duration::from_micros(delay),
                buckets,
                // The model pads batches if its executors run on a GPU.
                pad: false,
                queue_capacity: self.queue_capacity,
                executor_niceness: self.executor_niceness,
            },
            Duration::from_millis(deadline),
        )
    }
}

/// Executes batches on an executor thread. Must answer every job of the batch, after noting its gather and
/// inference times in `trace` ([`BatchTrace::set_phases`]).
pub(crate) trait BatchExecutor: Send + 'static {
    type Work: Work;
    fn execute(&mut self, batch: Batch<Job<Self::Work>>, trace: &BatchTrace);
}

/// The number the next batch gets (across models): a slow request's record names its batch by it.
static NEXT_BATCH: AtomicU64 = AtomicU64::new(1);

/// The batching metrics of one model.
#[derive(Debug, Clone)]
pub(crate) struct BatchMetrics {
    pub(crate) queue_duration: Histogram,
    pub(crate) batch_rows: Histogram,
    pub(crate) padding_rows: IntCounter,
    /// By close reason, in [`CloseReason::ALL`] order.
    pub(crate) batches: [IntCounter; CloseReason::ALL.len()],
    pub(crate) queue_depth: IntGauge,
    pub(crate) execution: Histogram,
    pub(crate) estimate_ratio: Histogram,
    pub(crate) expired: IntCounter,
    pub(crate) abandoned: IntCounter,
    pub(crate) admission_margin: Gauge,
    /// `recserve_batch_cost_seconds`: the estimator's line, which taking and waiting decide by.
    pub(crate) fixed_cost: Gauge,
    pub(crate) row_cost: Gauge,
    /// `recserve_rejected_total` by model and reason.
    pub(crate) rejected: IntCounterVec,
}

impl BatchMetrics {
    fn closed(&self, reason: CloseReason) -> &IntCounter {
        let i = CloseReason::ALL
            .iter()
            .position(|&r| r == reason)
            .unwrap_or(0);
        &self.batches[i]
    }
}

struct State<J> {
    policy: Policy<J>,
    closing: bool,
    /// Executors waiting for a request (or for company): an admission wakes one.
    waiting: usize,
}

struct Shared<J> {
    state: Mutex<State<J>>,
    /// Where free executors wait.
    work: Condvar,
    estimator: Estimator,
    metrics: BatchMetrics,
    /// What the statistics extension reports of the model version.
    statistics: Statistics,
    /// The nice value the executors should run at: `executor_niceness`, or [`SHADOW_NICENESS`] while the version
    /// is a shadow. Each executor applies a change before its next batch.
    niceness: AtomicU8,
    /// `executor_niceness`, for when the version stops being a shadow.
    base_niceness: u8,
}

/// The nice value of a shadow version's executors, which also run under `SCHED_IDLE` ([`set_scheduling`]): the
/// lowest priority, so that on a busy core the version that answers runs first and the shadow's queue, not the
/// primary's, fills up.
pub const SHADOW_NICENESS: u8 = 19;

/// Moves the calling executor thread to its version's scheduling: a shadow's ([`SHADOW_NICENESS`]) under
/// `SCHED_IDLE`, which runs only when no other thread wants the core and is preempted at once when one wakes;
/// otherwise `SCHED_OTHER` at `niceness`. Leaving `SCHED_IDLE` needs the same right as raising priority
/// ([`set_niceness`]); without it the thread stays idle-class, and says so once.
fn set_scheduling(niceness: u8) {
    let policy = if niceness == SHADOW_NICENESS {
        libc::SCHED_IDLE
    } else {
        libc::SCHED_OTHER
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: gettid takes nothing; sched_setscheduler reads `param`, which lives across the call.
    let result = unsafe { libc::sched_setscheduler(libc::gettid(), policy, &param) };
    if result != 0 {
        tracing::warn!(
            niceness,
            error = %std::io::Error::last_os_error(),
            "could not change an executor thread's scheduling class"
        );
    }
    set_niceness(niceness);
}

impl<J> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        // A panic while holding the lock leaves the queue consistent (every update is a single push or drain).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The batcher of one model: its queue and its executor threads.
pub(crate) struct Batcher<W: Work> {
    /// The model's name, for the errors clients get and the refusal counts.
    model: String,
    shared: Arc<Shared<Job<W>>>,
    executors: Vec<JoinHandle<()>>,
}

impl<W: Work> std::fmt::Debug for Batcher<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("executors", &self.executors.len())
            .finish_non_exhaustive()
    }
}

impl<W: Work> Batcher<W> {
    /// Starts one thread per executor. `estimator` should already hold warm-up measurements of every bucket.
    pub(crate) fn start<E: BatchExecutor<Work = W>>(
        model: &str,
        config: BatchConfig,
        estimator: Estimator,
        executors: Vec<E>,
        metrics: BatchMetrics,
    ) -> std::io::Result<Batcher<W>> {
        let niceness = config.executor_niceness;
        let (fixed, per_row) = estimator.line();
        metrics.fixed_cost.set(fixed.as_secs_f64());
        metrics.row_cost.set(per_row.as_secs_f64());
        let statistics = Statistics::new(config.max_batch_rows);
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                policy: Policy::new(config, executors.len()),
                closing: false,
                waiting: 0,
            }),
            work: Condvar::new(),
            estimator,
            metrics,
            statistics,
            niceness: AtomicU8::new(niceness),
            base_niceness: niceness,
        });
        let mut threads = Vec::with_capacity(executors.len());
        for (i, executor) in executors.into_iter().enumerate() {
            let theirs = Arc::clone(&shared);
            let name = model.to_owned();
            let spawned = std::thread::Builder::new()
                .name(format!("exec-{model}-{i}"))
                .spawn(move || {
                    crate::threads::register_current_thread(ThreadRole::Executor, &name);
                    lower_priority(niceness);
                    run_executor(executor, &theirs);
                });
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(e) => {
                    // The threads already running stop with the batcher.
                    drop(Batcher {
                        model: model.to_owned(),
                        shared,
                        executors: threads,
                    });
                    return Err(e);
                }
            }
        }
        Ok(Batcher {
            model: model.to_owned(),
            shared,
            executors: threads,
        })
    }

    /// How many executor threads run the model's batches.
    pub(crate) fn executors(&self) -> usize {
        self.executors.len()
    }

    /// The model version's statistics so far.
    pub(crate) fn statistics(&self) -> StatisticsSnapshot {
        self.shared.statistics.snapshot()
    }

    /// Runs the executors at the lowest priority while the version is a shadow (`true`), at `executor_niceness`
    /// otherwise. Takes effect at each executor's next batch.
    pub fn set_shadow(&self, shadow: bool) {
        let niceness = if shadow {
            SHADOW_NICENESS
        } else {
            self.shared.base_niceness
        };
        self.shared.niceness.store(niceness, Ordering::Relaxed);
    }

    /// Counts a call of the model (a request, or a pipeline's stage on it) that ended now, from the current
    /// request's first byte: a success, or a failure after admission (refused by the queue, expired, failed).
    pub(crate) fn called<T>(&self, result: &Result<T, ServiceError>) {
        self.shared
            .statistics
            .called(result.is_ok(), trace::arrival(), Instant::now());
    }

    /// Queues the chunks of one request, all or none, or refuses them at once (handing them back). Returns when
    /// the request is predicted to be answered: pass it to [`Self::answered`] once the answer is in hand.
    fn submit(&self, chunks: Vec<(Job<W>, usize)>, deadline: Instant) -> Result<Instant, Refusal> {
        let now = Instant::now();
        let (promised, wake) = {
            let mut state = self.shared.lock();
            if state.closing {
                return Err(Refusal::ShuttingDown);
            }
            let promised = state
                .policy
                .admit(chunks, deadline, now, &self.shared.estimator)
                .map_err(|(refusal, _)| refusal)?;
            self.shared
                .metrics
                .queue_depth
                .set(state.policy.len() as i64);
            (promised, state.waiting > 0)
        };
        // With every executor busy, the one that frees up first takes the request: nobody to wake.
        if wake {
            self.shared.work.notify_one();
        }
        Ok(promised)
    }

    /// Queues the chunks of one request (all or none), waits for their answers and returns them in chunk order.
    /// A refusal is counted and answered at once (429 when overloaded, 400 when no wait would help, 503 while
    /// shutting down, [`Refusal::into_error`]); a failed chunk
    /// fails the request. Once every answer is in hand, how late it is against admission's prediction teaches
    /// admission its margin.
    pub(crate) async fn run(
        &self,
        chunks: Vec<(W, usize)>,
        deadline: Instant,
    ) -> Result<Vec<W::Output>, ServiceError> {
        let mut answers = Vec::with_capacity(chunks.len());
        let jobs = chunks
            .into_iter()
            .map(|(work, rows)| {
                let (job, answer) = Job::new(work);
                answers.push(answer);
                (job, rows)
            })
            .collect();
        let promised = self
            .submit(jobs, deadline)
            .map_err(|refusal| self.refused(refusal))?;
        trace::mark(Stage::Admit);
        let mut outputs = Vec::with_capacity(answers.len());
        for answer in answers {
            let answered = answer.await.unwrap_or(Answered {
                result: Err(ExecError::Dropped),
                batch: None,
            });
            if let Some(batch) = &answered.batch {
                trace_batch(batch, Instant::now());
            }
            let output = answered
                .result
                .map_err(|e| e.into_service_error(&self.model))?;
            outputs.push(output);
        }
        self.answered(promised);
        Ok(outputs)
    }

    /// Counts a refusal and turns it into the error the client gets.
    fn refused(&self, refusal: Refusal) -> ServiceError {
        self.shared
            .metrics
            .rejected
            .with_label_values(&[self.model.as_str(), refusal.reason()])
            .inc();
        refusal.into_error(&self.model)
    }

    /// A request that [`Self::submit`] predicted to be answered at `promised` has its answer now, back on the
    /// transport's side: how late that is sets admission's margin.
    fn answered(&self, promised: Instant) {
        let now = Instant::now();
        let mut state = self.shared.lock();
        state.policy.answered(promised, now);
        self.shared
            .metrics
            .admission_margin
            .set(state.policy.margin().as_secs_f64());
    }

    /// Refuses at once, before the request is even decoded, when it would be refused whatever its size
    /// ([`Policy::precheck`]): under overload, refusals then cost the transport almost nothing.
    pub(crate) fn precheck(&self, deadline: Instant) -> Result<(), ServiceError> {
        let checked = {
            let state = self.shared.lock();
            if state.closing {
                Err(Refusal::ShuttingDown)
            } else {
                state
                    .policy
                    .precheck(deadline, Instant::now(), &self.shared.estimator)
            }
        };
        checked.map_err(|refusal| self.refused(refusal))
    }
}

impl<W: Work> Drop for Batcher<W> {
    /// Stops admitting, executes everything already queued, then joins every executor thread.
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.work.notify_all();
        for executor in self.executors.drain(..) {
            if executor.join().is_err() {
                tracing::error!("an executor thread panicked");
            }
        }
    }
}

/// Marks the current request's trace with the batch one of its jobs was executed in, answered at `answered`.
fn trace_batch(batch: &BatchTrace, answered: Instant) {
    trace::record(|t| {
        t.mark_at(Stage::Queue, batch.closed);
        t.mark_at(Stage::Dispatch, batch.started);
        if let Some((gather, inference)) = batch.phases() {
            t.mark_at(Stage::Gather, batch.started + gather);
            t.mark_at(Stage::Inference, batch.started + gather + inference);
        }
        t.mark_at(Stage::Answer, answered);
        t.batch(batch.info);
    });
}

/// Waits on `work` until `until` or a notification: sleeps while far, then lets go of the lock and spins when
/// close.
fn wait_until<'a, J>(
    shared: &'a Shared<J>,
    state: MutexGuard<'a, State<J>>,
    until: Instant,
) -> MutexGuard<'a, State<J>> {
    let left = until.saturating_duration_since(Instant::now());
    if left > SPIN {
        return shared
            .work
            .wait_timeout(state, left - SPIN)
            .unwrap_or_else(PoisonError::into_inner)
            .0;
    }
    drop(state);
    while Instant::now() < until {
        std::hint::spin_loop();
    }
    shared.lock()
}

/// Gives the calling thread the nice value `niceness` (Linux: nice values are per thread). Raising one's own
/// nice value needs no privilege; a failure only costs the priority, so it is logged, not fatal.
pub fn lower_priority(niceness: u8) {
    if niceness == 0 {
        return;
    }
    set_niceness(niceness);
}

/// Sets the calling thread's nice value, lower or higher than it is. Going back down (a shadow version that
/// takes traffic again) needs `CAP_SYS_NICE` or a `RLIMIT_NICE` that allows it: without either the thread keeps
/// running at the lower priority, and says so once.
fn set_niceness(niceness: u8) {
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    let result = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, i32::from(niceness))
    };
    if result != 0 {
        tracing::warn!(
            niceness,
            error = %std::io::Error::last_os_error(),
            "could not set a thread's priority"
        );
    }
}

/// An executor thread: takes its batches from the model's queue as the policy decides, executes them, and
/// stops once the batcher is closing and the queue is empty.
fn run_executor<E: BatchExecutor>(mut executor: E, shared: &Shared<Job<E::Work>>) {
    let metrics = &shared.metrics;
    let mut applied = shared.niceness.load(Ordering::Relaxed);
    let mut state = shared.lock();
    loop {
        let wanted = shared.niceness.load(Ordering::Relaxed);
        if wanted != applied {
            set_scheduling(wanted);
            applied = wanted;
        }
        let now = Instant::now();
        let dropped = state
            .policy
            .drop_dead(now, &shared.estimator, Job::is_abandoned);
        if dropped.expired_requests > 0 {
            // Expired requests teach the margin too.
            metrics
                .admission_margin
                .set(state.policy.margin().as_secs_f64());
        }
        let closing = state.closing;
        let decision = state.policy.decide(now, closing, &shared.estimator);
        metrics.queue_depth.set(state.policy.len() as i64);
        if !dropped.expired.is_empty() || !dropped.abandoned.is_empty() {
            // Answered (and dropped) without the lock, then look again: time has passed.
            drop(state);
            answer_dropped(dropped, metrics);
            if let Decision::Dispatch(batch) = decision {
                execute(&mut executor, batch, shared);
            }
            state = shared.lock();
            continue;
        }
        state = match decision {
            Decision::Dispatch(batch) => {
                drop(state);
                execute(&mut executor, batch, shared);
                shared.lock()
            }
            Decision::Idle if closing => break,
            Decision::Idle => {
                state.waiting += 1;
                let mut state = shared
                    .work
                    .wait(state)
                    .unwrap_or_else(PoisonError::into_inner);
                state.waiting -= 1;
                state
            }
            Decision::WaitUntil(until) => {
                state.waiting += 1;
                let mut state = wait_until(shared, state, until);
                state.waiting -= 1;
                state
            }
        };
    }
}

/// Answers the requests dropped as expired (504) and counts both kinds.
fn answer_dropped<J: Work>(dropped: Dropped<Job<J>>, metrics: &BatchMetrics) {
    metrics.expired.inc_by(dropped.expired_requests);
    metrics.abandoned.inc_by(dropped.abandoned_requests);
    for entry in dropped.expired {
        entry.job.answer(Err(ExecError::DeadlineExceeded));
    }
}

/// Executes one batch on this executor thread, records it, and tells the policy it is done.
fn execute<E: BatchExecutor>(
    executor: &mut E,
    batch: Batch<Job<E::Work>>,
    shared: &Shared<Job<E::Work>>,
) {
    let metrics = &shared.metrics;
    let (rows, bucket, estimate, closed_at) =
        (batch.rows, batch.bucket, batch.estimate, batch.closed_at);
    metrics.closed(batch.reason).inc();
    metrics.batch_rows.observe(rows as f64);
    metrics.padding_rows.inc_by((bucket - rows) as u64);
    for entry in &batch.entries {
        let waited = closed_at.saturating_duration_since(entry.enqueued);
        metrics.queue_duration.observe(waited.as_secs_f64());
        shared.statistics.queued(waited);
    }
    let requests = batch.entries.len();
    let start = Instant::now();
    let mut batch = batch;
    let trace = Arc::new(BatchTrace::new(
        BatchInfo {
            id: NEXT_BATCH.fetch_add(1, Ordering::Relaxed),
            rows,
            requests,
            reason: batch.reason.as_str(),
        },
        closed_at,
        start,
    ));
    for entry in &mut batch.entries {
        entry.job.executed_in(&trace);
    }
    executor.execute(batch, &trace);
    let done = Instant::now();
    let execution = done - start;
    metrics.execution.observe(execution.as_secs_f64());
    // A batch whose executor timed its gather and inference ran; the rest of its execution is the output phase.
    if let Some((gather, inference)) = trace.phases() {
        let phases = Phases {
            input: gather,
            infer: inference,
            output: execution.saturating_sub(gather + inference),
        };
        shared.statistics.executed(rows, requests, phases);
    }
    // What admission and deadline closes must predict: from the close to the answer, including any time the
    // executor thread waited for a core, which a CPU-bound server under overload makes large.
    let took = done.saturating_duration_since(closed_at);
    shared.estimator.observe(bucket, took);
    let (fixed, per_row) = shared.estimator.line();
    metrics.fixed_cost.set(fixed.as_secs_f64());
    metrics.row_cost.set(per_row.as_secs_f64());
    if !estimate.is_zero() {
        metrics
            .estimate_ratio
            .observe(took.as_secs_f64() / estimate.as_secs_f64());
    }
    shared.lock().policy.finished(rows);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::repository::BatchingSpec;

    #[test]
    fn default_buckets_are_about_a_quarter_apart_and_end_at_max() {
        assert_eq!(
            default_buckets(1024),
            vec![
                1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384, 448,
                512, 640, 768, 896, 1024
            ]
        );
        assert_eq!(
            default_buckets(100),
            vec![1, 2, 4, 8, 16, 32, 48, 64, 80, 96, 100]
        );
        assert_eq!(default_buckets(1), vec![1]);
        for max in [1, 7, 100, 1000, 4096] {
            let b = default_buckets(max);
            assert!(
                crate::repository::check_buckets(&b).is_ok() && b.last() == Some(&max),
                "{max}: {b:?}"
            );
        }
    }

    #[test]
    fn server_settings_override_the_model_which_overrides_defaults() {
        let server = BatchSettings {
            enabled: true,
            fixed_delay: false,
            max_batch_rows: None,
            max_queue_delay_us: Some(250),
            buckets: None,
            default_deadline_ms: None,
            queue_capacity: 64,
            executor_niceness: 5,
        };
        let (config, deadline) = server.resolve(&BatchingSpec::default());
        assert_eq!(config.max_batch_rows, DEFAULT_MAX_BATCH_ROWS);
        assert_eq!(config.max_queue_delay, Duration::from_micros(250));
        assert_eq!(config.buckets, default_buckets(DEFAULT_MAX_BATCH_ROWS));
        assert_eq!(deadline, Duration::from_millis(DEFAULT_DEADLINE_MS));

        let model = BatchingSpec {
            max_batch_rows: Some(300),
            max_queue_delay_us: Some(900),
            buckets: Some(vec![10, 100, 500]),
            default_deadline_ms: Some(20),
        };
        let (config, deadline) = server.resolve(&model);
        assert_eq!(config.max_batch_rows, 300);
        assert_eq!(
            config.max_queue_delay,
            Duration::from_micros(250),
            "the server's setting wins"
        );
        assert_eq!(
            config.buckets,
            vec![10, 100, 300],
            "buckets beyond max_batch_rows give way to it"
        );
        assert_eq!(deadline, Duration::from_millis(20));
        assert_eq!(config.queue_capacity, 64);
    }
}
