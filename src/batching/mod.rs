//! Dynamic batching: one batcher thread per model forms batches under each request's deadline
//! ([`policy::Policy`] decides; this module is the thin thread around it), and hands them to executor threads
//! through a rendezvous channel, so a batch keeps growing until an executor is actually free. Plain OS threads:
//! tokio timers have millisecond granularity, the batcher wakes within tens of microseconds (park with a
//! timeout, then a short spin).

pub mod estimator;
mod job;
pub mod lateness;
pub mod policy;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, bounded};
use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge};

use crate::error::ServiceError;
use crate::trace::{self, BatchInfo, Stage};
pub use estimator::Estimator;
pub use job::{Answer, Answered, BatchTrace, ExecError, Job, Work, catch_panic};
pub use policy::{Batch, BatchConfig, CloseReason, Entry, QueueFit, Refusal, split_rows};
use policy::{Decision, Policy};

/// Closer than this to a wake-up time, the batcher spins instead of parking (parking overshoots by tens of µs).
const SPIN: Duration = Duration::from_micros(80);

/// Built-in defaults (documented in docs/batching.md).
pub const DEFAULT_MAX_BATCH_ROWS: usize = 1024;
pub const DEFAULT_MAX_QUEUE_DELAY_US: u64 = 500;
pub const DEFAULT_DEADLINE_MS: u64 = 1000;

/// Batch sizes about 25% apart up to `max` (1, 2, 4, …, 64, 80, 96, 112, 128, 160, …), so padding wastes at most
/// about a fifth of a batch.
pub fn default_buckets(max: usize) -> Vec<usize> {
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
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchSettings {
    pub enabled: bool,
    pub max_batch_rows: Option<usize>,
    pub max_queue_delay_us: Option<u64>,
    pub buckets: Option<Vec<usize>>,
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
pub trait BatchExecutor: Send + 'static {
    type Work: Work;
    fn execute(&mut self, batch: Batch<Job<Self::Work>>, trace: &BatchTrace);
}

/// The number the next batch gets (across models): a slow request's record names its batch by it.
static NEXT_BATCH: AtomicU64 = AtomicU64::new(1);

/// The batching metrics of one model.
#[derive(Debug, Clone)]
pub struct BatchMetrics {
    pub queue_duration: Histogram,
    pub batch_rows: Histogram,
    pub padding_rows: IntCounter,
    /// By close reason, in [`CloseReason`] order.
    pub batches: [IntCounter; 5],
    pub queue_depth: IntGauge,
    pub execution: Histogram,
    pub estimate_ratio: Histogram,
    pub expired: IntCounter,
    pub abandoned: IntCounter,
    pub admission_margin: Gauge,
    /// `recserve_rejected_total` by model and reason.
    pub rejected: IntCounterVec,
}

impl BatchMetrics {
    fn closed(&self, reason: CloseReason) -> &IntCounter {
        let i = match reason {
            CloseReason::Full => 0,
            CloseReason::Delay => 1,
            CloseReason::Deadline => 2,
            CloseReason::Unbatched => 3,
            CloseReason::Drain => 4,
        };
        &self.batches[i]
    }
}

struct State<J> {
    policy: Policy<J>,
    closing: bool,
}

struct Shared<J> {
    state: Mutex<State<J>>,
    estimator: Estimator,
    /// Executors blocked (or about to block) on the batch channel: a batch sent now starts at once.
    idle_executors: AtomicUsize,
    batcher: OnceLock<Thread>,
    metrics: BatchMetrics,
}

impl<J> Shared<J> {
    fn lock(&self) -> MutexGuard<'_, State<J>> {
        // A panic while holding the lock leaves the queue consistent (every update is a single push or drain).
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn wake_batcher(&self) {
        if let Some(thread) = self.batcher.get() {
            thread.unpark();
        }
    }
}

/// The batcher of one model: its queue, its batcher thread and its executor threads.
pub struct Batcher<W: Work> {
    /// The model's name, for the errors clients get and the refusal counts.
    model: String,
    shared: Arc<Shared<Job<W>>>,
    batcher: Option<JoinHandle<()>>,
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
    /// Starts the batcher thread and one thread per executor. `estimator` should already hold warm-up
    /// measurements of every bucket.
    pub fn start<E: BatchExecutor<Work = W>>(
        model: &str,
        config: BatchConfig,
        estimator: Estimator,
        executors: Vec<E>,
        metrics: BatchMetrics,
    ) -> std::io::Result<Batcher<W>> {
        let niceness = config.executor_niceness;
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                policy: Policy::new(config, executors.len()),
                closing: false,
            }),
            estimator,
            idle_executors: AtomicUsize::new(0),
            batcher: OnceLock::new(),
            metrics,
        });
        // Rendezvous: a send completes only when an executor takes the batch.
        let (sender, receiver) = bounded::<Batch<Job<W>>>(0);
        let mut threads = Vec::with_capacity(executors.len());
        for (i, executor) in executors.into_iter().enumerate() {
            let (shared, receiver) = (Arc::clone(&shared), receiver.clone());
            threads.push(
                std::thread::Builder::new()
                    .name(format!("exec-{model}-{i}"))
                    .spawn(move || {
                        lower_priority(niceness);
                        run_executor(executor, &shared, &receiver);
                    })?,
            );
        }
        let batcher = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name(format!("batch-{model}"))
                .spawn(move || run_batcher(&shared, sender))?
        };
        let _ = shared.batcher.set(batcher.thread().clone());
        Ok(Batcher {
            model: model.to_owned(),
            shared,
            batcher: Some(batcher),
            executors: threads,
        })
    }

    /// Queues the chunks of one request, all or none, or refuses them at once (handing them back). Returns when
    /// the request is predicted to be answered: pass it to [`Self::answered`] once the answer is in hand.
    fn submit(&self, chunks: Vec<(Job<W>, usize)>, deadline: Instant) -> Result<Instant, Refusal> {
        let now = Instant::now();
        let promised = {
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
            promised
        };
        // With every executor busy the batcher can dispatch nothing: an executor that frees up wakes it. Waking it
        // for every arrival under load only had it scan the queue for nothing.
        if self.shared.idle_executors.load(Ordering::Acquire) > 0 {
            self.shared.wake_batcher();
        }
        Ok(promised)
    }

    /// Queues the chunks of one request (all or none), waits for their answers and returns them in chunk order.
    /// A refusal is counted and answered at once (429 when overloaded, 400 when no wait would help, 503 while
    /// shutting down, [`Refusal::into_error`]); a failed chunk
    /// fails the request. Once every answer is in hand, how late it is against admission's prediction teaches
    /// admission its margin.
    pub async fn run(
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
    pub fn precheck(&self, deadline: Instant) -> Result<(), ServiceError> {
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

    /// The execution-time estimate, for tests and the admission of callers.
    pub fn estimator(&self) -> &Estimator {
        &self.shared.estimator
    }
}

impl<W: Work> Drop for Batcher<W> {
    /// Stops admitting, executes everything already queued, then joins every thread.
    fn drop(&mut self) {
        self.shared.lock().closing = true;
        self.shared.wake_batcher();
        if let Some(batcher) = self.batcher.take()
            && batcher.join().is_err()
        {
            tracing::error!("a batcher thread panicked");
        }
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

/// Sleeps until `until`, or until unparked: parks while far, spins when close.
fn wait_until(until: Instant) {
    let now = Instant::now();
    if until <= now {
        return;
    }
    let left = until - now;
    if left > SPIN {
        std::thread::park_timeout(left - SPIN);
        return;
    }
    while Instant::now() < until {
        std::hint::spin_loop();
    }
}

fn run_batcher<W: Work>(shared: &Shared<Job<W>>, sender: Sender<Batch<Job<W>>>) {
    let metrics = &shared.metrics;
    loop {
        let now = Instant::now();
        let (decision, dropped, closing) = {
            let mut state = shared.lock();
            let dropped = state
                .policy
                .drop_dead(now, &shared.estimator, Job::is_abandoned);
            let free = shared.idle_executors.load(Ordering::Acquire) > 0;
            let closing = state.closing;
            let decision = state.policy.decide(now, free, closing, &shared.estimator);
            metrics.queue_depth.set(state.policy.len() as i64);
            if dropped.expired_requests > 0 {
                // Expired requests teach the margin too.
                metrics
                    .admission_margin
                    .set(state.policy.margin().as_secs_f64());
            }
            (decision, dropped, closing)
        };
        metrics.expired.inc_by(dropped.expired_requests);
        metrics.abandoned.inc_by(dropped.abandoned_requests);
        for entry in dropped.expired {
            entry.job.answer(Err(ExecError::DeadlineExceeded));
        }
        match decision {
            Decision::Dispatch(batch) => {
                metrics.closed(batch.reason).inc();
                metrics.batch_rows.observe(batch.rows as f64);
                metrics
                    .padding_rows
                    .inc_by((batch.bucket - batch.rows) as u64);
                for entry in &batch.entries {
                    metrics
                        .queue_duration
                        .observe(now.saturating_duration_since(entry.enqueued).as_secs_f64());
                }
                shared.idle_executors.fetch_sub(1, Ordering::AcqRel);
                // An idle executor is committed to receiving, so this completes at once.
                if let Err(unsent) = sender.send(batch) {
                    for entry in unsent.0.entries {
                        entry.job.answer(Err(ExecError::ShuttingDown));
                    }
                }
            }
            Decision::Idle if closing => break,
            Decision::Idle | Decision::WaitForExecutor => std::thread::park(),
            Decision::WaitUntil(until) => wait_until(until),
        }
    }
}

/// Gives the calling thread the nice value `niceness` (Linux: nice values are per thread). Raising one's own
/// nice value needs no privilege; a failure only costs the priority, so it is logged, not fatal.
pub fn lower_priority(niceness: u8) {
    if niceness == 0 {
        return;
    }
    // SAFETY: gettid and setpriority take plain integers and touch no memory of ours.
    let result = unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, i32::from(niceness))
    };
    if result != 0 {
        tracing::warn!(
            niceness,
            error = %std::io::Error::last_os_error(),
            "could not lower a thread's priority"
        );
    }
}

fn run_executor<E: BatchExecutor>(
    mut executor: E,
    shared: &Shared<Job<E::Work>>,
    batches: &Receiver<Batch<Job<E::Work>>>,
) {
    let metrics = &shared.metrics;
    loop {
        shared.idle_executors.fetch_add(1, Ordering::AcqRel);
        shared.wake_batcher();
        let Ok(batch) = batches.recv() else {
            break;
        };
        let (rows, bucket, estimate) = (batch.rows, batch.bucket, batch.estimate);
        let closed_at = batch.closed_at;
        let start = Instant::now();
        let mut batch = batch;
        let trace = Arc::new(BatchTrace::new(
            BatchInfo {
                id: NEXT_BATCH.fetch_add(1, Ordering::Relaxed),
                rows,
                requests: batch.entries.len(),
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
        metrics.execution.observe((done - start).as_secs_f64());
        // What admission and deadline closes must predict: from the close to the answer, including the time the
        // executor thread waited for a core, which a CPU-bound server under overload makes large.
        let took = done.saturating_duration_since(closed_at);
        shared.estimator.observe(bucket, took);
        if !estimate.is_zero() {
            metrics
                .estimate_ratio
                .observe(took.as_secs_f64() / estimate.as_secs_f64());
        }
        shared.lock().policy.finished(rows);
    }
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
