//! The batching policy as a plain struct: a FIFO queue of requests with rows and deadlines, the admission rule,
//! and the decision a free executor makes: take a batch now, or wait for company. No threads, no clock of its own:
//! every call takes `now`, so the unit tests drive it with a fake clock. [`super::Batcher`]'s executor threads are
//! the thin loop around it.
//!
//! How many requests a batch takes is a cost question too ([`Policy::first_batch`]): the next request joins when
//! that saves a batch's fixed cost for it and for those queued behind it than it costs the requests already in
//! the batch, so on a CPU requests run one by one until a queue builds up, and on a GPU every request that fits
//! joins.
//!
//! Work-conserving: a free executor takes the queue's oldest requests at once, unless waiting is predicted to pay
//! ([`Policy::decide`]): only when the model's measured batch times say that running a request that may arrive
//! within the wait together with those queued saves more executor time (a batch's fixed cost) than the wait
//! costs, weighed by the chance that one arrives at the recent rate. On a CPU, where a batch costs about the same per row at any size, that is
//! never; on a GPU, whose batches cost about the same whatever their size, it is when requests come often enough.
//! Requests that arrive while every executor is busy wait and share the next batch anyway.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::{Duration, Instant};

use super::arrivals::Arrivals;
use super::estimator::Estimator;
use super::lateness::Lateness;
use crate::error::ServiceError;

/// How long before a batch must start the batcher closes it: covers waking up and handing the batch over.
pub(crate) const DISPATCH_MARGIN: Duration = Duration::from_micros(100);

/// Share of a request's remaining time budget that admission may plan to fill with queueing, execution and the
/// measured lateness of recent answers ([`Lateness`]): the rest is for the time the transport takes before the
/// request reaches admission and after its answer leaves, which the server cannot time.
pub(crate) const ADMISSION_SHARE: f64 = 0.9;

/// Most of a request's remaining budget the lateness margin may take. The margin is learned only from admitted
/// requests: unbounded, one bad spell (a stall, the first second of a sudden overload) could make it refuse
/// everything, after which nothing would teach it otherwise. Bounded, a queue predicted to clear within
/// `ADMISSION_SHARE - MAX_MARGIN_SHARE` of the budget is always admitted, and keeps the margin learning.
pub(crate) const MAX_MARGIN_SHARE: f64 = 0.5;

/// The knobs of one model's batching. Documented with their defaults in `docs/batching.md`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BatchConfig {
    /// `false`: every request (or chunk of `max_batch_rows`) is executed alone, as soon as an executor is free.
    pub(crate) enabled: bool,
    /// A free executor always waits up to `max_queue_delay` for company (`--batch-delay fixed`), instead of only
    /// when that is predicted to pay.
    pub(crate) fixed_delay: bool,
    /// A batch closes when it holds this many rows; larger requests are split into chunks of at most this size.
    pub max_batch_rows: usize,
    /// The longest a free executor waits for company for the oldest request, when waiting is predicted to pay.
    pub(crate) max_queue_delay: Duration,
    /// Batch sizes warmed up and estimated: a batch's execution time is predicted from the smallest bucket that
    /// holds it (and, with `pad`, it is padded up to that bucket). Ascending; the last is `max_batch_rows`.
    pub buckets: Vec<usize>,
    /// Pad each batch up to its bucket. On for executors on a GPU, whose kernels and engines are chosen per shape;
    /// off on the CPU, where ONNX Runtime runs any batch size at the same cost per row, so padding rows would be
    /// computed for nothing.
    pub(crate) pad: bool,
    /// Requests (chunks) that may wait; more are refused at once.
    pub(crate) queue_capacity: usize,
    /// Nice value of the executor threads (0 to 19): above the transport's 0, so that decoding, admission and
    /// refusals keep the CPU they need while inference takes the rest.
    pub(crate) executor_niceness: u8,
}

impl BatchConfig {
    /// Whether requests are batched together (`false`: each runs alone).
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// The longest a free executor waits for company.
    pub fn max_queue_delay(&self) -> Duration {
        self.max_queue_delay
    }

    /// How many rows of one request the queue can ever hold.
    pub(crate) fn fit(&self) -> QueueFit {
        QueueFit {
            max_batch_rows: self.max_batch_rows,
            queue_capacity: self.queue_capacity,
        }
    }

    /// The smallest bucket that holds a batch of `rows` rows: the one its execution time is estimated by.
    pub(crate) fn bucket(&self, rows: usize) -> usize {
        self.buckets
            .iter()
            .copied()
            .find(|&b| b >= rows)
            .unwrap_or(self.max_batch_rows)
    }

    /// The rows a batch of `rows` rows executes at: its bucket when batches are padded, else `rows`.
    pub fn executed_rows(&self, rows: usize) -> usize {
        if self.pad { self.bucket(rows) } else { rows }
    }
}

/// The most rows one request may hold: it is queued in chunks of `max_batch_rows` rows, all at once, and the queue
/// holds `queue_capacity` chunks, so a larger request could never be admitted, however idle the server. The
/// contracts check it while decoding, to name the field; admission refuses what gets past them
/// ([`Refusal::TooLarge`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueFit {
    pub max_batch_rows: usize,
    pub queue_capacity: usize,
}

impl QueueFit {
    /// No bound: for contracts built without a queue (tests, tools).
    pub(crate) const UNBOUNDED: QueueFit = QueueFit {
        max_batch_rows: usize::MAX,
        queue_capacity: 1,
    };

    pub(crate) fn rows(&self) -> usize {
        self.max_batch_rows.saturating_mul(self.queue_capacity)
    }

    /// Checks that a request of `rows` `what` (candidates, users) can be queued.
    pub fn check(&self, rows: usize, what: &str) -> Result<(), String> {
        if rows <= self.rows() {
            return Ok(());
        }
        Err(format!(
            "holds {rows} {what}, more than the model's queue can ever hold for one request: {} chunks \
             (--queue-capacity) of {} rows (max_batch_rows), {} {what}; send at most {} per request",
            self.queue_capacity,
            self.max_batch_rows,
            self.rows(),
            self.rows()
        ))
    }
}

/// Row ranges of the chunks a request of `rows` rows is split into, in order.
pub fn split_rows(rows: usize, max_batch_rows: usize) -> Vec<Range<usize>> {
    let max = max_batch_rows.max(1);
    (0..rows.div_ceil(max))
        .map(|i| i * max..((i + 1) * max).min(rows))
        .collect()
}

/// Why a batch was closed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// It reached `max_batch_rows` (or the next request would not fit).
    Full,
    /// An executor was free and waiting for more requests was not predicted to pay.
    ExecutorFree,
    /// An executor waited for company, and its oldest request had waited `max_queue_delay`.
    Delay,
    /// An executor waited for company, and waiting longer would miss the tightest deadline in it.
    Deadline,
    /// Batching is off: one request per batch.
    Unbatched,
    /// The server is shutting down: whatever is queued goes now.
    Drain,
}

impl CloseReason {
    /// Every reason: the `reason` label values of `recserve_batches_total`.
    pub(crate) const ALL: [CloseReason; 6] = [
        CloseReason::Full,
        CloseReason::ExecutorFree,
        CloseReason::Delay,
        CloseReason::Deadline,
        CloseReason::Unbatched,
        CloseReason::Drain,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CloseReason::Full => "full",
            CloseReason::ExecutorFree => "executor_free",
            CloseReason::Delay => "delay",
            CloseReason::Deadline => "deadline",
            CloseReason::Unbatched => "unbatched",
            CloseReason::Drain => "drain",
        }
    }
}

/// Why a request was refused at admission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// `queue_capacity` requests are already waiting.
    QueueFull { retry_after: Duration },
    /// The work queued ahead of it plus its own execution would end after its deadline.
    PredictedLate {
        /// The predicted wait plus the lateness margin.
        predicted_wait: Duration,
        /// `ADMISSION_SHARE` of the time left to the deadline.
        budget: Duration,
    },
    /// Even with nothing queued or running ahead of it, its own execution would end after its deadline: the same
    /// request would be refused again, however idle the server.
    DeadlineTooShort {
        /// Its predicted execution on an idle queue.
        predicted: Duration,
        /// The time left to its deadline.
        left: Duration,
        /// `ADMISSION_SHARE` of it.
        budget: Duration,
    },
    /// It is split into more chunks than the whole queue holds, so it can never be admitted.
    TooLarge { chunks: usize, capacity: usize },
    /// The server is shutting down.
    ShuttingDown,
}

impl Refusal {
    /// Every value of [`Refusal::reason`], the `reason` label of `recserve_rejected_total`.
    pub(crate) const REASONS: [&'static str; 3] = ["queue_full", "predicted_late", "shutting_down"];

    pub(crate) fn reason(&self) -> &'static str {
        match self {
            Refusal::QueueFull { .. } => "queue_full",
            Refusal::PredictedLate { .. } => "predicted_late",
            Refusal::DeadlineTooShort { .. } => "deadline_too_short",
            Refusal::TooLarge { .. } => "too_large",
            Refusal::ShuttingDown => "shutting_down",
        }
    }

    /// The error the client gets: 429 (with `retry_after`) when overloaded, 400 for a request that would be
    /// refused again however idle the server (a deadline shorter than its own execution, more chunks than the
    /// queue holds), 503 while shutting down.
    pub(crate) fn into_error(self, model: &str) -> ServiceError {
        match self {
            Refusal::ShuttingDown => ServiceError::Unavailable("shutting down"),
            Refusal::QueueFull { .. } | Refusal::PredictedLate { .. } => ServiceError::Overloaded {
                model: model.to_owned(),
                retry_after: self.retry_after(),
            },
            Refusal::DeadlineTooShort {
                predicted,
                left,
                budget,
            } => ServiceError::DeadlineTooShort {
                model: model.to_owned(),
                predicted,
                left,
                budget,
            },
            Refusal::TooLarge { chunks, capacity } => ServiceError::invalid(
                "request",
                format!(
                    "is queued in {chunks} chunks, more than the {capacity} the queue of model {model:?} holds \
                     (--queue-capacity): send fewer rows per request"
                ),
            ),
        }
    }

    /// When retrying has a chance (for the refusals that are answered 429).
    pub(crate) fn retry_after(&self) -> Duration {
        match *self {
            Refusal::QueueFull { retry_after } => retry_after,
            Refusal::PredictedLate {
                predicted_wait,
                budget,
            } => predicted_wait.saturating_sub(budget),
            Refusal::DeadlineTooShort { .. } | Refusal::TooLarge { .. } | Refusal::ShuttingDown => {
                Duration::from_secs(1)
            }
        }
    }
}

/// A queued request (or chunk of one).
#[derive(Debug)]
pub struct Entry<J> {
    pub(crate) job: J,
    pub(crate) rows: usize,
    pub(crate) enqueued: Instant,
    pub(crate) deadline: Instant,
    /// When admission predicted it would be answered; lateness is measured against this.
    pub(crate) promised: Instant,
    /// The request's admission number, shared by its chunks.
    pub(crate) request: u64,
}

/// A closed batch, to hand to an executor.
#[derive(Debug)]
pub struct Batch<J> {
    pub(crate) entries: Vec<Entry<J>>,
    pub(crate) rows: usize,
    /// The rows it executes at: `rows`, or its bucket when batches are padded ([`BatchConfig::executed_rows`]).
    pub(crate) bucket: usize,
    pub(crate) reason: CloseReason,
    /// The execution time predicted for `bucket`, for comparison with the actual one.
    pub(crate) estimate: Duration,
    /// When the batcher closed it. The estimator learns from this to completion, so a batch that waits for its
    /// executor thread to get a core (busy transport threads, other processes) counts that wait too.
    pub(crate) closed_at: Instant,
}

/// The batch a free executor would take now ([`Policy::first_batch`]).
#[derive(Debug)]
struct FirstBatch {
    count: usize,
    rows: usize,
    /// The earliest deadline in it.
    tightest: Option<Instant>,
    /// It stopped because the next request would not fit in `max_batch_rows`.
    next_does_not_fit: bool,
}

/// What a free executor should do now.
#[derive(Debug)]
pub(crate) enum Decision<J> {
    /// Execute this batch.
    Dispatch(Batch<J>),
    /// Wait for company: look again at this instant (or when a request arrives).
    WaitUntil(Instant),
    /// The queue is empty.
    Idle,
}

/// Requests (chunks) dropped from the queue without execution.
#[derive(Debug)]
pub(crate) struct Dropped<J> {
    /// Their deadline has passed, or cannot be met even if executed at once.
    pub(crate) expired: Vec<Entry<J>>,
    /// Their client has gone.
    pub(crate) abandoned: Vec<Entry<J>>,
    /// Requests these chunks belong to, each counted once and only the first time any of its chunks is dropped:
    /// the expired ones and the abandoned ones.
    pub(crate) expired_requests: u64,
    pub(crate) abandoned_requests: u64,
}

impl<J> Default for Dropped<J> {
    fn default() -> Self {
        Dropped {
            expired: Vec::new(),
            abandoned: Vec::new(),
            expired_requests: 0,
            abandoned_requests: 0,
        }
    }
}

/// One model's queue and batching rule.
#[derive(Debug)]
pub(crate) struct Policy<J> {
    config: BatchConfig,
    queue: VecDeque<Entry<J>>,
    queued_rows: usize,
    /// Rows handed to executors and not yet finished, for the admission estimate.
    in_flight_rows: usize,
    executors: usize,
    lateness: Lateness,
    /// Requests admitted lately: whether waiting for company may pay.
    arrivals: Arrivals,
    /// An executor chose to wait for company for the queue's oldest requests (and has not taken them yet).
    waiting: bool,
    /// The admission number the next request gets.
    next_request: u64,
    /// The request of the last chunk dropped: its other chunks, queued right behind it, are the same request.
    last_dropped: Option<u64>,
}

impl<J> Policy<J> {
    pub(crate) fn new(config: BatchConfig, executors: usize) -> Policy<J> {
        Policy {
            config,
            queue: VecDeque::new(),
            queued_rows: 0,
            in_flight_rows: 0,
            executors: executors.max(1),
            lateness: Lateness::default(),
            arrivals: Arrivals::default(),
            waiting: false,
            next_request: 0,
            last_dropped: None,
        }
    }

    /// Requests (chunks) waiting.
    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The wait predicted for a request of `rows` rows arriving now: the running batches and the full batches
    /// queued ahead of its last chunk (its own earlier chunks too), spread over the executors at the speed of
    /// full batches, plus the execution of the batch its last chunk will be in.
    pub(crate) fn predicted_wait(&self, rows: usize, estimator: &Estimator) -> Duration {
        self.wait_behind(self.queued_rows, self.in_flight_rows, rows, estimator)
    }

    /// The wait predicted for a request of `rows` rows with nothing queued or running ahead of it: what its own
    /// execution takes.
    pub(crate) fn predicted_alone(&self, rows: usize, estimator: &Estimator) -> Duration {
        self.wait_behind(0, 0, rows, estimator)
    }

    fn wait_behind(
        &self,
        queued_rows: usize,
        in_flight_rows: usize,
        rows: usize,
        estimator: &Estimator,
    ) -> Duration {
        let full = self.config.max_batch_rows;
        let per_full_batch = estimator.estimate(full);
        // The request's chunks but the last are full (`split_rows`): they go ahead of its last chunk.
        let own_full = rows.saturating_sub(1) / full * full;
        let ahead_rows = queued_rows + own_full;
        // The queue leaves FIFO in full batches; the last chunk rides in the batch after the full ones ahead of
        // it, together with the rows left over before it, so that batch's size, not the chunk's own, is what it
        // waits for (under load, a full batch; on an idle server, its own bucket).
        let full_batches_ahead = ahead_rows / full;
        let last_batch = (ahead_rows % full + (rows - own_full)).min(full);
        let ahead = (in_flight_rows as f64 / full as f64 + full_batches_ahead as f64)
            / self.executors as f64;
        per_full_batch.mul_f64(ahead) + estimator.estimate(self.config.bucket(last_batch))
    }

    /// Refuses a request of `rows` rows whose deadline its own execution would miss even on an idle queue.
    fn check_deadline(
        &self,
        rows: usize,
        deadline: Instant,
        now: Instant,
        estimator: &Estimator,
    ) -> Result<(), Refusal> {
        let left = deadline.saturating_duration_since(now);
        let (budget, _) = self.budget(deadline, now);
        let predicted = self.predicted_alone(rows, estimator);
        if predicted > budget {
            return Err(Refusal::DeadlineTooShort {
                predicted,
                left,
                budget,
            });
        }
        Ok(())
    }

    /// What admission may plan to fill of a request's remaining time (`ADMISSION_SHARE` of it), and the margin it
    /// keeps within that for lateness (bounded by `MAX_MARGIN_SHARE` of it).
    fn budget(&self, deadline: Instant, now: Instant) -> (Duration, Duration) {
        let left = deadline.saturating_duration_since(now);
        (
            left.mul_f64(ADMISSION_SHARE),
            self.lateness.margin().min(left.mul_f64(MAX_MARGIN_SHARE)),
        )
    }

    /// Whether a request with this deadline would be refused whatever its size: a deadline that even the smallest
    /// batch on an idle queue would miss, a full queue, or the work already queued and running ahead of it plus
    /// the smallest batch would end after the deadline. Cheap, so a transport can ask before it decodes the body;
    /// anything refused here, `admit` refuses too.
    pub(crate) fn precheck(
        &self,
        deadline: Instant,
        now: Instant,
        estimator: &Estimator,
    ) -> Result<(), Refusal> {
        self.check_deadline(1, deadline, now, estimator)?;
        if self.queue.len() >= self.config.queue_capacity {
            let retry_after = self
                .predicted_wait(1, estimator)
                .max(Duration::from_millis(1));
            return Err(Refusal::QueueFull { retry_after });
        }
        let (budget, margin) = self.budget(deadline, now);
        let predicted_wait = self.predicted_wait(1, estimator) + margin;
        if predicted_wait > budget {
            return Err(Refusal::PredictedLate {
                predicted_wait,
                budget,
            });
        }
        Ok(())
    }

    /// Admits the chunks of one request (all or none) or refuses it at once. What would be refused however idle
    /// the server is refused as such (more chunks than the queue holds, a deadline shorter than its own
    /// execution), before what waiting could change (a full queue, the work ahead). Admitted, it returns when
    /// the request is predicted to be answered: report the answer's time with [`Self::answered`].
    pub(crate) fn admit(
        &mut self,
        chunks: Vec<(J, usize)>,
        deadline: Instant,
        now: Instant,
        estimator: &Estimator,
    ) -> Result<Instant, (Refusal, Vec<(J, usize)>)> {
        let rows: usize = chunks.iter().map(|(_, r)| r).sum();
        if chunks.len() > self.config.queue_capacity {
            let refusal = Refusal::TooLarge {
                chunks: chunks.len(),
                capacity: self.config.queue_capacity,
            };
            return Err((refusal, chunks));
        }
        if let Err(refusal) = self.check_deadline(rows, deadline, now, estimator) {
            return Err((refusal, chunks));
        }
        if self.queue.len() + chunks.len() > self.config.queue_capacity {
            let retry_after = self
                .predicted_wait(rows, estimator)
                .max(Duration::from_millis(1));
            return Err((Refusal::QueueFull { retry_after }, chunks));
        }
        let (budget, margin) = self.budget(deadline, now);
        // Each chunk after the first waits for the ones before it; the request is late if its last chunk is.
        let predicted_wait = self.predicted_wait(rows, estimator);
        let with_margin = predicted_wait + margin;
        if with_margin > budget {
            return Err((
                Refusal::PredictedLate {
                    predicted_wait: with_margin,
                    budget,
                },
                chunks,
            ));
        }
        let promised = now + predicted_wait;
        let request = self.next_request;
        self.next_request += 1;
        self.arrivals.admitted(now);
        for (job, rows) in chunks {
            self.queued_rows += rows;
            self.queue.push_back(Entry {
                job,
                rows,
                enqueued: now,
                deadline,
                promised,
                request,
            });
        }
        Ok(promised)
    }

    /// A request admitted with the prediction `promised` was answered at `at`: teaches admission's margin.
    pub(crate) fn answered(&mut self, promised: Instant, at: Instant) {
        self.lateness.observe(promised, at);
    }

    /// The margin admission currently adds to predicted waits: the high quantile of recent lateness.
    pub(crate) fn margin(&self) -> Duration {
        self.lateness.margin()
    }

    /// The batch a free executor would take now: the oldest requests, first in first out, as many as fit in
    /// `max_batch_rows` and as taking them together pays (one request when batching is off). The next request
    /// joins the batch when that saves more time than it costs, by the line through the measured batch times
    /// ([`Estimator::line`]): it saves a batch's fixed cost for itself and for every request queued behind it,
    /// which would otherwise wait for one more batch, and it costs each request already in the batch the time its
    /// rows add. On a CPU, where the fixed cost is small, requests join only behind a long queue (under
    /// overload, where throughput is what matters); on a GPU, where it is nearly all of a batch's time, every
    /// request that fits joins. `fixed_delay` (Triton's way) takes every request that fits.
    fn first_batch(&self, estimator: &Estimator) -> FirstBatch {
        let limit = if self.config.enabled {
            self.queue.len()
        } else {
            1
        };
        let (fixed, per_row) = estimator.line();
        let mut batch = FirstBatch {
            count: 0,
            rows: 0,
            tightest: None,
            next_does_not_fit: false,
        };
        for (i, entry) in self.queue.iter().enumerate().take(limit) {
            if batch.count > 0 {
                if batch.rows + entry.rows > self.config.max_batch_rows {
                    batch.next_does_not_fit = true;
                    break;
                }
                let behind = self.queue.len() - i - 1;
                let saves = fixed.mul_f64((1 + behind) as f64);
                let costs = per_row.mul_f64((batch.count * entry.rows) as f64);
                if !self.config.fixed_delay && saves <= costs {
                    break;
                }
            }
            batch.count += 1;
            batch.rows += entry.rows;
            batch.tightest = Some(
                batch
                    .tightest
                    .map_or(entry.deadline, |t: Instant| t.min(entry.deadline)),
            );
        }
        batch
    }

    /// Removes requests that can no longer be served usefully: past (or certain to miss) their deadline, or
    /// abandoned by their client.
    pub(crate) fn drop_dead(
        &mut self,
        now: Instant,
        estimator: &Estimator,
        is_abandoned: impl Fn(&J) -> bool,
    ) -> Dropped<J> {
        let mut dropped = Dropped::default();
        if self.queue.is_empty() {
            return dropped;
        }
        // Every request runs in the batch that would close now or in a later one, so none can end before that
        // batch would (a request larger than it, in its own bucket): judged by its own bucket alone, a request
        // about to ride in a full batch would be executed into a certain timeout.
        let first_batch_rows = self.first_batch(estimator).rows;
        let first_batch_end = now + estimator.estimate(self.config.bucket(first_batch_rows));
        let earliest_end = |rows: usize| {
            if rows <= first_batch_rows {
                first_batch_end
            } else {
                now + estimator.estimate(self.config.bucket(rows))
            }
        };
        // The batcher looks at the queue whenever a request arrives: most looks drop nothing, and must not cost a
        // rebuild of the whole queue.
        if !self
            .queue
            .iter()
            .any(|e| is_abandoned(&e.job) || e.deadline <= earliest_end(e.rows))
        {
            return dropped;
        }
        let mut kept = VecDeque::with_capacity(self.queue.len());
        for entry in std::mem::take(&mut self.queue) {
            let earliest_end = earliest_end(entry.rows);
            if is_abandoned(&entry.job) {
                self.queued_rows -= entry.rows;
                if self.last_dropped.replace(entry.request) != Some(entry.request) {
                    dropped.abandoned_requests += 1;
                }
                dropped.abandoned.push(entry);
            } else if entry.deadline <= earliest_end {
                self.queued_rows -= entry.rows;
                if self.last_dropped.replace(entry.request) != Some(entry.request) {
                    dropped.expired_requests += 1;
                    // It would be answered no earlier than that: as late as admission must learn to expect.
                    self.lateness.observe(entry.promised, earliest_end);
                }
                dropped.expired.push(entry);
            } else {
                kept.push_back(entry);
            }
        }
        self.queue = kept;
        dropped
    }

    /// What a free executor does at `now`: take the batch that would close now (the oldest requests, first in
    /// first out, as many as fit), or wait for company when that is predicted to pay ([`Self::worth_waiting`]),
    /// at most until the oldest request has waited `max_queue_delay` or waiting longer would miss the tightest
    /// deadline in the batch. `draining`: the server is shutting down and everything queued goes now.
    pub(crate) fn decide(
        &mut self,
        now: Instant,
        draining: bool,
        estimator: &Estimator,
    ) -> Decision<J> {
        let Some(oldest) = self.queue.front() else {
            self.waiting = false;
            return Decision::Idle;
        };
        let FirstBatch {
            count,
            rows,
            tightest,
            next_does_not_fit,
        } = self.first_batch(estimator);
        let tightest = tightest.unwrap_or(oldest.deadline);
        let estimate = estimator.estimate(self.config.bucket(rows));
        let latest_start = tightest
            .checked_sub(estimate + DISPATCH_MARGIN)
            .unwrap_or(now);
        let delay_ends = oldest.enqueued + self.config.max_queue_delay;
        let wait_until = delay_ends.min(latest_start);

        let reason = if draining {
            CloseReason::Drain
        } else if !self.config.enabled {
            CloseReason::Unbatched
        } else if rows >= self.config.max_batch_rows || next_does_not_fit {
            CloseReason::Full
        } else if count == self.queue.len()
            && now < wait_until
            && self.worth_waiting(rows, now, wait_until, estimator)
        {
            self.waiting = true;
            return Decision::WaitUntil(wait_until);
        } else if self.waiting && now >= latest_start {
            CloseReason::Deadline
        } else if self.waiting && now >= delay_ends {
            CloseReason::Delay
        } else {
            CloseReason::ExecutorFree
        };
        self.waiting = false;
        let entries: Vec<Entry<J>> = self.queue.drain(..count).collect();
        self.queued_rows -= rows;
        self.in_flight_rows += rows;
        Decision::Dispatch(Batch {
            entries,
            rows,
            bucket: self.config.executed_rows(rows),
            reason,
            estimate,
            closed_at: now,
        })
    }

    /// Whether a free executor holding a batch of `rows` rows should wait until `until` for company: always with
    /// `fixed_delay`; otherwise when what running a request that arrives meanwhile together with them saves (a
    /// batch's fixed cost, [`Estimator::fixed_cost`]: the part of its time that does not grow with its rows),
    /// weighed by the chance that one arrives by then at the recent rate, is more than the wait. The fixed cost
    /// comes from the line through every bucket's time, so one bucket's noisy measurement (a batch that waited for
    /// a core) does not make waiting look worthwhile.
    fn worth_waiting(
        &mut self,
        rows: usize,
        now: Instant,
        until: Instant,
        estimator: &Estimator,
    ) -> bool {
        let wait = until.saturating_duration_since(now);
        if self.config.fixed_delay {
            return !wait.is_zero();
        }
        if rows >= self.config.max_batch_rows {
            return false;
        }
        let Some(chance) = self.arrivals.chance_within(now, wait) else {
            return false;
        };
        estimator.fixed_cost().mul_f64(chance) > wait
    }

    /// An executor finished a batch of `rows` rows.
    pub(crate) fn finished(&mut self, rows: usize) {
        self.in_flight_rows = self.in_flight_rows.saturating_sub(rows);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn config() -> BatchConfig {
        BatchConfig {
            enabled: true,
            fixed_delay: false,
            max_batch_rows: 100,
            max_queue_delay: 2 * MS,
            buckets: vec![10, 50, 100],
            pad: true,
            queue_capacity: 8,
            executor_niceness: 0,
        }
    }

    /// An estimator in proportion to rows: buckets of 10, 50 and 100 rows take 1, 5 and 10 ms.
    fn proportional() -> Estimator {
        let e = Estimator::new(&[10, 50, 100]);
        for b in [10, 50, 100] {
            e.observe(b, MS * b as u32 / 10);
        }
        e
    }

    /// An estimator that predicts 1 ms for every bucket.
    fn one_ms() -> Estimator {
        let e = Estimator::new(&[10, 50, 100]);
        for b in [10, 50, 100] {
            e.observe(b, MS);
        }
        e
    }

    fn admit(
        p: &mut Policy<u32>,
        job: u32,
        rows: usize,
        deadline: Instant,
        now: Instant,
        e: &Estimator,
    ) {
        p.admit(vec![(job, rows)], deadline, now, e)
            .unwrap_or_else(|(refusal, _)| panic!("job {job} refused: {refusal:?}"));
    }

    /// The chunks of a request of `rows` rows as jobs numbered from `first`, in batches of at most 100 rows.
    fn chunks(first: u32, rows: usize) -> Vec<(u32, usize)> {
        split_rows(rows, 100)
            .iter()
            .enumerate()
            .map(|(i, r)| (first + i as u32, r.len()))
            .collect()
    }

    fn dispatched(decision: Decision<u32>) -> (Vec<u32>, usize, usize, CloseReason) {
        match decision {
            Decision::Dispatch(b) => (
                b.entries.iter().map(|e| e.job).collect(),
                b.rows,
                b.bucket,
                b.reason,
            ),
            other => panic!("expected a dispatch, got {other:?}"),
        }
    }

    #[test]
    fn unpadded_batches_execute_their_own_rows_and_are_estimated_by_their_bucket() {
        let (t0, e) = (Instant::now(), proportional());
        // Every request that fits rides along (`fixed_delay`): batches that cost in proportion to their rows would
        // otherwise run the two apart.
        let mut p = Policy::new(
            BatchConfig {
                pad: false,
                fixed_delay: true,
                ..config()
            },
            1,
        );
        admit(&mut p, 0, 30, t0 + 50 * MS, t0, &e);
        admit(&mut p, 1, 7, t0 + 50 * MS, t0, &e);
        match p.decide(t0 + 2 * MS, false, &e) {
            Decision::Dispatch(b) => {
                assert_eq!((b.rows, b.bucket), (37, 37), "no padding rows");
                assert_eq!(b.estimate, 5 * MS, "estimated as its bucket of 50");
            }
            other => panic!("expected a dispatch, got {other:?}"),
        }
    }

    #[test]
    fn closes_when_full() {
        let (t0, e) = (Instant::now(), one_ms());
        let mut p = Policy::new(config(), 1);
        for job in 0..4 {
            admit(&mut p, job, 30, t0 + 50 * MS, t0, &e);
        }
        // 30+30+30 fit in 100, the fourth does not: the batch is as full as it can be.
        let (jobs, rows, bucket, reason) = dispatched(p.decide(t0, false, &e));
        assert_eq!(
            (jobs, rows, bucket, reason),
            (vec![0, 1, 2], 90, 100, CloseReason::Full)
        );
        // The fourth goes at once to the executor free for it: nothing says company is coming.
        let (jobs, rows, _, reason) = dispatched(p.decide(t0, false, &e));
        assert_eq!(
            (jobs, rows, reason),
            (vec![3], 30, CloseReason::ExecutorFree)
        );

        let mut p = Policy::new(config(), 1);
        admit(&mut p, 7, 60, t0 + 50 * MS, t0, &e);
        admit(&mut p, 8, 40, t0 + 50 * MS, t0, &e);
        let (jobs, rows, _, reason) = dispatched(p.decide(t0, false, &e));
        assert_eq!((jobs, rows, reason), (vec![7, 8], 100, CloseReason::Full));
    }

    /// An estimator that predicts `ms` for every bucket: batches cost the same whatever their size, as on a GPU.
    fn flat(ms: u32) -> Estimator {
        let e = Estimator::new(&[10, 50, 100]);
        for b in [10, 50, 100] {
            e.observe(b, MS * ms);
        }
        e
    }

    /// Notes `n` requests admitted (and since executed) in the `n` milliseconds before `now`: a
    /// recent rate of `n` requests per 100 ms.
    fn arrived_lately(p: &mut Policy<u32>, now: Instant, n: u32) {
        for i in (1..=n).rev() {
            p.arrivals.admitted(now - MS * i);
        }
    }

    #[test]
    fn a_free_executor_waits_for_company_only_when_that_is_predicted_to_pay() {
        let t0 = Instant::now() + Duration::from_secs(1);
        // Batches cost 5 ms whatever their size and requests come at 1,000/s: within the 2 ms delay one comes with
        // a chance of 1 - e^-2 = 0.86, and running it with the queued ones saves 5 ms: waiting pays.
        let e = flat(5);
        let mut p = Policy::new(config(), 1);
        arrived_lately(&mut p, t0, 100);
        admit(&mut p, 1, 5, t0 + 50 * MS, t0, &e);
        admit(&mut p, 2, 5, t0 + 50 * MS, t0 + MS, &e);
        match p.decide(t0 + MS, false, &e) {
            Decision::WaitUntil(t) => assert_eq!(t, t0 + 2 * MS),
            other => panic!("{other:?}"),
        }
        let (jobs, rows, bucket, reason) = dispatched(p.decide(t0 + 2 * MS, false, &e));
        assert_eq!(
            (jobs, rows, bucket, reason),
            (vec![1, 2], 10, 10, CloseReason::Delay)
        );
        assert!(p.is_empty());
        assert!(matches!(p.decide(t0 + 3 * MS, false, &e), Decision::Idle));

        // Batches that cost in proportion to their rows, as on a CPU: running more rows together saves nothing,
        // so the executor takes the request at once however often requests come.
        let e = proportional();
        let mut p = Policy::new(config(), 1);
        arrived_lately(&mut p, t0, 100);
        admit(&mut p, 1, 5, t0 + 50 * MS, t0, &e);
        let (jobs, _, _, reason) = dispatched(p.decide(t0, false, &e));
        assert_eq!((jobs, reason), (vec![1], CloseReason::ExecutorFree));

        // Flat batch costs, but no request came lately: nothing to wait for.
        let e = flat(5);
        let mut p = Policy::new(config(), 1);
        admit(&mut p, 1, 5, t0 + 50 * MS, t0, &e);
        let (jobs, _, _, reason) = dispatched(p.decide(t0, false, &e));
        assert_eq!((jobs, reason), (vec![1], CloseReason::ExecutorFree));

        // Flat batch costs and frequent requests, but a delay longer than what a shared batch saves: no wait.
        let mut c = config();
        c.max_queue_delay = 20 * MS;
        let mut p = Policy::new(c, 1);
        arrived_lately(&mut p, t0, 100);
        admit(&mut p, 1, 5, t0 + 50 * MS, t0, &e);
        let (jobs, _, _, reason) = dispatched(p.decide(t0, false, &e));
        assert_eq!((jobs, reason), (vec![1], CloseReason::ExecutorFree));
    }

    /// An estimator of `fixed` ms a batch plus `per_row` ms a row.
    fn linear(fixed: f64, per_row: f64) -> Estimator {
        let e = Estimator::new(&[10, 50, 100]);
        for b in [10, 50, 100] {
            e.observe(
                b,
                Duration::from_secs_f64((fixed + per_row * b as f64) / 1e3),
            );
        }
        e
    }

    #[test]
    fn a_request_joins_the_batch_only_when_that_saves_more_than_it_costs() {
        let t0 = Instant::now();
        // 0.1 ms a batch, 0.01 ms a row: a 10-row request joining a batch of one saves 0.1 ms for itself and for
        // each request queued behind it, and costs the request already in the batch 0.1 ms.
        let e = linear(0.1, 0.01);
        let mut p = Policy::new(config(), 1);
        for job in 0..3 {
            admit(&mut p, job, 10, t0 + 50 * MS, t0, &e);
        }
        // Job 1 saves 0.1 ms for itself and 0.1 for job 2 behind it, against 0.1 ms of cost: it joins. Job 2 saves
        // 0.1 ms (nothing behind it) against 0.2 ms for jobs 0 and 1: it runs next.
        let (jobs, rows, _, reason) = dispatched(p.decide(t0, false, &e));
        assert_eq!(
            (jobs, rows, reason),
            (vec![0, 1], 20, CloseReason::ExecutorFree)
        );
        let (jobs, ..) = dispatched(p.decide(t0, false, &e));
        assert_eq!(jobs, vec![2]);

        // In proportion to rows (a CPU): each runs alone, however long the queue.
        let e = proportional();
        let mut p = Policy::new(config(), 1);
        for job in 0..5 {
            admit(&mut p, job, 10, t0 + 50 * MS, t0, &e);
        }
        for want in 0..5 {
            let (jobs, ..) = dispatched(p.decide(t0, false, &e));
            assert_eq!(jobs, vec![want]);
        }

        // The same time whatever the rows (a GPU): every request that fits joins.
        let e = flat(5);
        let mut p = Policy::new(config(), 1);
        for job in 0..5 {
            admit(&mut p, job, 10, t0 + 50 * MS, t0, &e);
        }
        let (jobs, rows, ..) = dispatched(p.decide(t0, false, &e));
        assert_eq!((jobs, rows), (vec![0, 1, 2, 3, 4], 50));
    }

    #[test]
    fn with_a_fixed_delay_a_free_executor_always_waits_for_company() {
        let (t0, e) = (Instant::now(), proportional());
        let mut p = Policy::new(
            BatchConfig {
                fixed_delay: true,
                ..config()
            },
            1,
        );
        admit(&mut p, 1, 5, t0 + 50 * MS, t0, &e);
        match p.decide(t0, false, &e) {
            Decision::WaitUntil(t) => assert_eq!(t, t0 + 2 * MS),
            other => panic!("{other:?}"),
        }
        let (jobs, _, _, reason) = dispatched(p.decide(t0 + 2 * MS, false, &e));
        assert_eq!((jobs, reason), (vec![1], CloseReason::Delay));
    }

    #[test]
    fn closes_early_when_waiting_would_miss_the_tightest_deadline() {
        let t0 = Instant::now() + Duration::from_secs(1);
        let e = flat(5);
        let mut c = config();
        c.max_queue_delay = 10 * MS;
        let mut p = Policy::new(c, 1);
        arrived_lately(&mut p, t0, 100);
        admit(&mut p, 1, 5, t0 + 20 * MS, t0, &e);
        // A later request with a tighter deadline: 5 ms of execution + the margin must fit before it.
        admit(&mut p, 2, 5, t0 + 8 * MS, t0, &e);
        let latest_start = t0 + 8 * MS - 5 * MS - DISPATCH_MARGIN;
        match p.decide(t0, false, &e) {
            Decision::WaitUntil(t) => assert_eq!(t, latest_start),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            p.decide(latest_start - Duration::from_micros(1), false, &e),
            Decision::WaitUntil(_)
        ));
        let (jobs, _, _, reason) = dispatched(p.decide(latest_start, false, &e));
        assert_eq!((jobs, reason), (vec![1, 2], CloseReason::Deadline));
    }

    #[test]
    fn drops_expired_and_abandoned_requests_before_execution() {
        let (t0, e) = (Instant::now(), one_ms());
        let mut p = Policy::new(config(), 1);
        admit(&mut p, 1, 5, t0 + 10 * MS, t0, &e);
        admit(&mut p, 2, 5, t0 + 4 * MS, t0, &e);
        admit(&mut p, 3, 5, t0 + 10 * MS, t0, &e);
        // At t0 + 3.5 ms, job 2 cannot finish before its deadline (1 ms of execution); job 3's client is gone.
        let dropped = p.drop_dead(t0 + 3 * MS + MS / 2, &e, |job| *job == 3);
        assert_eq!(
            dropped.expired.iter().map(|x| x.job).collect::<Vec<_>>(),
            vec![2]
        );
        assert_eq!(
            dropped.abandoned.iter().map(|x| x.job).collect::<Vec<_>>(),
            vec![3]
        );
        let (jobs, rows, _, _) = dispatched(p.decide(t0 + 4 * MS, false, &e));
        assert_eq!((jobs, rows), (vec![1], 5));
    }

    #[test]
    fn expires_a_request_that_would_miss_its_deadline_in_the_batch_it_rides_in() {
        let (t0, e) = (Instant::now(), proportional());
        // Every request that fits rides along (`fixed_delay`), so job 2 rides with job 1.
        let mut p = Policy::new(
            BatchConfig {
                fixed_delay: true,
                ..config()
            },
            1,
        );
        admit(&mut p, 2, 8, t0 + 20 * MS, t0, &e);
        admit(&mut p, 1, 90, t0 + 50 * MS, t0, &e);
        // At t0 + 12 ms, 8 ms are left to job 2: enough for its own bucket of 10 (1 ms), not for the 98-row
        // batch it rides in with job 1 (bucket 100, 10 ms).
        let now = t0 + 12 * MS;
        let dropped = p.drop_dead(now, &e, |_| false);
        assert_eq!(
            dropped.expired.iter().map(|x| x.job).collect::<Vec<_>>(),
            vec![2]
        );
        let (jobs, rows, _, _) = dispatched(p.decide(now, false, &e));
        assert_eq!((jobs, rows), (vec![1], 90));
    }

    #[test]
    fn refuses_at_admission_when_full_or_predicted_late() {
        let (t0, e) = (Instant::now(), one_ms());
        let mut c = config();
        c.queue_capacity = 3;
        let mut p = Policy::new(c, 1);
        for job in 0..3 {
            admit(&mut p, job, 100, t0 + 50 * MS, t0, &e);
        }
        let (refusal, back) = p
            .admit(vec![(9, 1)], t0 + 50 * MS, t0, &e)
            .expect_err("queue full");
        assert_eq!(refusal.reason(), "queue_full");
        assert_eq!(back, vec![(9, 1)], "a refused request is handed back");

        // Three full batches (1 ms each) are ahead: a request with a 2 ms budget cannot make it.
        let mut p = Policy::new(config(), 1);
        for job in 0..3 {
            admit(&mut p, job, 100, t0 + 50 * MS, t0, &e);
        }
        let (refusal, _) = p
            .admit(vec![(9, 10)], t0 + 2 * MS, t0, &e)
            .expect_err("predicted late");
        assert_eq!(
            refusal,
            Refusal::PredictedLate {
                predicted_wait: 4 * MS,
                budget: (2 * MS).mul_f64(ADMISSION_SHARE)
            }
        );
        assert_eq!(
            refusal.retry_after(),
            4 * MS - (2 * MS).mul_f64(ADMISSION_SHARE)
        );
        // Admission plans to fill only ADMISSION_SHARE of the budget: 4 ms of predicted wait needs a budget of
        // 4.44 ms at a share of 0.9, and 4.4 ms is not enough.
        assert!(p.admit(vec![(9, 10)], t0 + MS * 44 / 10, t0, &e).is_err());
        admit(&mut p, 9, 10, t0 + MS * 45 / 10, t0, &e);
        // With two executors the same backlog drains twice as fast.
        let mut p = Policy::new(config(), 2);
        for job in 0..3 {
            admit(&mut p, job, 100, t0 + 50 * MS, t0, &e);
        }
        assert_eq!(p.predicted_wait(10, &e), MS + MS / 2 + MS);
        // Work handed to executors counts until it finishes.
        let _ = p.decide(t0, false, &e);
        assert_eq!(p.predicted_wait(10, &e), MS + MS / 2 + MS);
        p.finished(100);
        assert_eq!(p.predicted_wait(10, &e), MS + MS);
    }

    #[test]
    fn admission_keeps_a_margin_for_the_lateness_of_recent_answers() {
        let (t0, e) = (Instant::now(), proportional());
        let queued = |p: &mut Policy<u32>| {
            // Four full batches (10 ms each) ahead: a 10-row request is predicted to be answered in 41 ms.
            for job in 0..4 {
                admit(p, job, 100, t0 + 500 * MS, t0, &e);
            }
            assert_eq!(p.predicted_wait(10, &e), 41 * MS);
        };
        let mut p = Policy::new(config(), 1);
        queued(&mut p);
        assert_eq!(p.margin(), Duration::ZERO);
        // Nothing learned yet: 41 ms fits 90% of 48 ms.
        assert!(p.precheck(t0 + 48 * MS, t0, &e).is_ok());
        admit(&mut p, 9, 10, t0 + 48 * MS, t0, &e);

        // Answers came up to 3 ms after their predicted time: 44 ms must fit. 90% of 48 ms does not hold it, 90% of
        // 50 ms does.
        let mut p = Policy::new(config(), 1);
        for i in 0..200u32 {
            p.answered(t0, t0 + MS * (i % 4));
        }
        assert_eq!(p.margin(), 3 * MS);
        queued(&mut p);
        let (refusal, _) = p
            .admit(vec![(9, 10)], t0 + 48 * MS, t0, &e)
            .expect_err("late by the margin");
        assert_eq!(
            refusal,
            Refusal::PredictedLate {
                predicted_wait: 44 * MS,
                budget: (48 * MS).mul_f64(ADMISSION_SHARE)
            }
        );
        assert!(p.precheck(t0 + 48 * MS, t0, &e).is_err());
        admit(&mut p, 9, 10, t0 + 50 * MS, t0, &e);

        // Answers a second late: the margin takes at most MAX_MARGIN_SHARE of the budget, so a short queue is
        // still admitted and the margin keeps learning.
        let mut p = Policy::new(config(), 1);
        for _ in 0..100 {
            p.answered(t0, t0 + 1000 * MS);
        }
        assert_eq!(p.margin(), 1000 * MS);
        // 1 ms predicted + 25 ms of margin fit 45 ms; 2 full batches ahead (21 ms + 25 ms) do not.
        admit(&mut p, 0, 100, t0 + 50 * MS, t0, &e);
        admit(&mut p, 1, 100, t0 + 50 * MS, t0, &e);
        assert_eq!(
            p.admit(vec![(9, 10)], t0 + 50 * MS, t0, &e)
                .expect_err("over the budget")
                .0,
            Refusal::PredictedLate {
                predicted_wait: 21 * MS + 25 * MS,
                budget: (50 * MS).mul_f64(ADMISSION_SHARE)
            }
        );
        // Answers that came early bring it back down.
        for _ in 0..1024 {
            p.answered(t0 + MS, t0);
        }
        assert_eq!(p.margin(), Duration::ZERO);
    }

    #[test]
    fn requests_dropped_as_expired_count_as_late() {
        let (t0, e) = (Instant::now(), proportional());
        let mut p = Policy::new(config(), 1);
        for job in 0..64 {
            // Predicted to be answered 1 ms after admission; still queued 49.5 ms later, when it can no longer
            // end before its deadline: it would have been at least 49.5 ms late.
            admit(&mut p, job, 10, t0 + 50 * MS, t0, &e);
            let dropped = p.drop_dead(t0 + MS * 99 / 2, &e, |_| false);
            assert_eq!(dropped.expired.len(), 1);
        }
        assert_eq!(p.margin(), MS * 99 / 2);
    }

    #[test]
    fn a_request_split_in_chunks_is_dropped_and_counted_once() {
        let (t0, e) = (Instant::now(), proportional());
        let mut p = Policy::new(config(), 1);
        for request in 0..32 {
            // Predicted at 25 ms (its last chunk behind its two full ones); 45 ms later no chunk can end within
            // 50 ms.
            p.admit(chunks(3 * request, 250), t0 + 50 * MS, t0, &e)
                .expect("three chunks fit");
            let dropped = p.drop_dead(t0 + 45 * MS, &e, |_| false);
            assert_eq!((dropped.expired.len(), dropped.expired_requests), (3, 1));
        }
        // One lateness sample per request: 32, fewer than the margin needs (three per chunk would be 96).
        assert_eq!(p.margin(), Duration::ZERO);
        // Requests of one chunk, each 49.5 ms late (as in the test above): the margin appears with the 64th.
        for job in 0..32 {
            assert_eq!(p.margin(), Duration::ZERO, "{} requests", 32 + job);
            admit(&mut p, 100 + job, 10, t0 + 50 * MS, t0, &e);
            let dropped = p.drop_dead(t0 + MS * 99 / 2, &e, |_| false);
            assert_eq!((dropped.expired.len(), dropped.expired_requests), (1, 1));
        }
        assert_eq!(p.margin(), MS * 99 / 2);

        // An abandoned request too is one request, however many chunks (25 ms predicted, 25 ms of margin).
        p.admit(chunks(300, 250), t0 + 100 * MS, t0, &e)
            .expect("three chunks fit");
        let dropped = p.drop_dead(t0 + MS, &e, |_| true);
        assert_eq!(
            (dropped.abandoned.len(), dropped.abandoned_requests),
            (3, 1)
        );
        assert!(p.is_empty());
    }

    #[test]
    fn a_request_of_more_chunks_than_the_queue_holds_is_too_large_even_when_idle() {
        let (t0, e) = (Instant::now(), one_ms());
        let mut c = config();
        c.queue_capacity = 3;
        let mut p = Policy::new(c.clone(), 1);
        let (refusal, back) = p
            .admit(chunks(0, 301), t0 + 50 * MS, t0, &e)
            .expect_err("four chunks never fit in three places");
        assert_eq!(
            refusal,
            Refusal::TooLarge {
                chunks: 4,
                capacity: 3
            }
        );
        assert_eq!(back.len(), 4, "handed back");
        assert_eq!(refusal.reason(), "too_large");
        let error = refusal.into_error("m");
        assert_eq!(error.http_status(), 400);
        assert_eq!(
            error.to_string(),
            "request: is queued in 4 chunks, more than the 3 the queue of model \"m\" holds (--queue-capacity): \
             send fewer rows per request"
        );
        // Three chunks fit an idle queue; behind one queued request they wait for room (429), they are not too
        // large.
        p.admit(chunks(0, 300), t0 + 50 * MS, t0, &e)
            .expect("three chunks fit in three places");
        let mut p = Policy::new(c.clone(), 1);
        admit(&mut p, 9, 1, t0 + 50 * MS, t0, &e);
        let (refusal, _) = p
            .admit(chunks(0, 300), t0 + 50 * MS, t0, &e)
            .expect_err("no room now");
        assert_eq!(refusal.reason(), "queue_full");
        assert_eq!(refusal.into_error("m").http_status(), 429);

        // The contracts' bound is the same: 3 chunks of 100 rows.
        let fit = c.fit();
        assert_eq!(fit.rows(), 300);
        assert_eq!(fit.check(300, "candidates"), Ok(()));
        assert_eq!(
            fit.check(301, "candidates").expect_err("too many"),
            "holds 301 candidates, more than the model's queue can ever hold for one request: 3 chunks \
             (--queue-capacity) of 100 rows (max_batch_rows), 300 candidates; send at most 300 per request"
        );
        assert_eq!(QueueFit::UNBOUNDED.check(usize::MAX, "rows"), Ok(()));
    }

    #[test]
    fn a_deadline_its_own_execution_would_miss_on_an_idle_queue_is_too_short() {
        let (t0, e) = (Instant::now(), proportional());
        let mut p = Policy::new(config(), 1);
        // A full batch takes 10 ms: with 5 ms left nothing queued ahead matters.
        let (refusal, _) = p
            .admit(vec![(1, 100)], t0 + 5 * MS, t0, &e)
            .expect_err("too short");
        assert_eq!(
            refusal,
            Refusal::DeadlineTooShort {
                predicted: 10 * MS,
                left: 5 * MS,
                budget: (5 * MS).mul_f64(ADMISSION_SHARE),
            }
        );
        assert_eq!(refusal.reason(), "deadline_too_short");
        let error = refusal.into_error("m");
        assert_eq!(error.http_status(), 400);
        assert_eq!(
            error.to_string(),
            "model \"m\": the request's deadline is too short: executing it is predicted to take 10.000 ms even \
             with nothing queued ahead, and its deadline leaves 5.000 ms, of which admission plans on at most \
             4.500 ms; retrying the same request will not help: give it a longer deadline or send fewer rows"
        );
        // The smallest batch (1 ms) misses a 1 ms deadline: precheck says so before the body is read, and a
        // deadline already passed is too short as well.
        assert!(matches!(
            p.precheck(t0 + MS, t0, &e),
            Err(Refusal::DeadlineTooShort { .. })
        ));
        assert!(matches!(
            p.precheck(t0, t0 + MS, &e),
            Err(Refusal::DeadlineTooShort { left, .. }) if left.is_zero()
        ));
        // A request of three chunks runs them one after the other: 10 + 10 + 5 ms alone, half that for the full
        // ones with two executors.
        assert_eq!(p.predicted_alone(250, &e), 25 * MS);
        assert!(matches!(
            p.admit(chunks(0, 250), t0 + 25 * MS, t0, &e),
            Err((Refusal::DeadlineTooShort { predicted, .. }, _)) if predicted == 25 * MS
        ));
        assert_eq!(
            Policy::<u32>::new(config(), 2).predicted_alone(250, &e),
            15 * MS
        );

        // Late only because of the work ahead: overloaded (429), with a time to retry.
        for job in 0..3 {
            admit(&mut p, job, 100, t0 + 500 * MS, t0, &e);
        }
        let (refusal, _) = p
            .admit(vec![(9, 10)], t0 + 20 * MS, t0, &e)
            .expect_err("late behind three full batches");
        assert_eq!(
            refusal,
            Refusal::PredictedLate {
                predicted_wait: 31 * MS,
                budget: (20 * MS).mul_f64(ADMISSION_SHARE)
            }
        );
        assert_eq!(refusal.into_error("m").http_status(), 429);
        assert!(matches!(
            p.precheck(t0 + 20 * MS, t0, &e),
            Err(Refusal::PredictedLate { .. })
        ));
    }

    #[test]
    fn a_request_waits_for_the_batch_it_will_ride_in() {
        let (t0, e) = (Instant::now(), proportional());
        let mut p = Policy::new(config(), 1);
        // Idle: a lone request of 8 rows runs in its own bucket of 10.
        assert_eq!(p.predicted_wait(8, &e), MS);
        // 130 rows queued: one full batch ahead, then the request joins the 30 left over: 38 rows, bucket 50.
        admit(&mut p, 0, 100, t0 + 50 * MS, t0, &e);
        admit(&mut p, 1, 30, t0 + 50 * MS, t0, &e);
        assert_eq!(p.predicted_wait(8, &e), 10 * MS + 5 * MS);
        // 80 more would not fit beside those 30: the batch it closes is full.
        assert_eq!(p.predicted_wait(80, &e), 10 * MS + 10 * MS);
    }

    #[test]
    fn precheck_refuses_what_admission_would_refuse_whatever_the_size() {
        let (t0, e) = (Instant::now(), one_ms());
        let mut c = config();
        c.queue_capacity = 3;
        let mut p = Policy::new(c, 1);
        assert_eq!(p.precheck(t0 + 2 * MS, t0, &e), Ok(()));
        for job in 0..2 {
            admit(&mut p, job, 100, t0 + 50 * MS, t0, &e);
        }
        // Two full batches (1 ms each) plus the smallest: 3 ms, over a 2 ms budget; within a 50 ms one.
        assert_eq!(
            p.precheck(t0 + 2 * MS, t0, &e),
            Err(Refusal::PredictedLate {
                predicted_wait: 3 * MS,
                budget: (2 * MS).mul_f64(ADMISSION_SHARE)
            })
        );
        assert!(p.admit(vec![(8, 1)], t0 + 2 * MS, t0, &e).is_err());
        assert_eq!(p.precheck(t0 + 50 * MS, t0, &e), Ok(()));
        admit(&mut p, 2, 100, t0 + 50 * MS, t0, &e);
        let refusal = p.precheck(t0 + 50 * MS, t0, &e).expect_err("queue full");
        assert_eq!(refusal.reason(), "queue_full");
        assert!(p.admit(vec![(9, 1)], t0 + 50 * MS, t0, &e).is_err());
    }

    #[test]
    fn splits_large_requests_and_admits_all_chunks_or_none() {
        assert_eq!(split_rows(250, 100), vec![0..100, 100..200, 200..250]);
        assert_eq!(split_rows(100, 100), vec![0..100]);
        assert_eq!(split_rows(1, 100), vec![0..1]);
        assert_eq!(split_rows(0, 100), Vec::<Range<usize>>::new());

        let (t0, e) = (Instant::now(), one_ms());
        let mut c = config();
        c.queue_capacity = 4;
        let mut p = Policy::new(c, 1);
        admit(&mut p, 0, 10, t0 + 50 * MS, t0, &e);
        p.admit(chunks(10, 250), t0 + 50 * MS, t0, &e)
            .expect("three chunks fit in a queue of four");
        assert_eq!(p.len(), 4);
        let two: Vec<(u32, usize)> = vec![(20, 100), (21, 1)];
        assert!(p.admit(two, t0 + 50 * MS, t0, &e).is_err());
        assert_eq!(p.len(), 4, "a refused request leaves no chunk behind");
        // Chunks run in order, each in its own full batch after the small request.
        let (jobs, ..) = dispatched(p.decide(t0, false, &e));
        assert_eq!(jobs, vec![0]);
        for want in [10, 11, 12] {
            let (jobs, ..) = dispatched(p.decide(t0 + 2 * MS, false, &e));
            assert_eq!(jobs, vec![want]);
        }
    }

    #[test]
    fn batches_one_by_one_when_off_and_everything_when_draining() {
        let (t0, e) = (Instant::now(), one_ms());
        let mut c = config();
        c.enabled = false;
        let mut p = Policy::new(c, 1);
        for job in 0..3 {
            admit(&mut p, job, 5, t0 + 50 * MS, t0, &e);
        }
        for want in 0..3 {
            let (jobs, rows, bucket, reason) = dispatched(p.decide(t0, false, &e));
            assert_eq!(
                (jobs, rows, bucket, reason),
                (vec![want], 5, 10, CloseReason::Unbatched)
            );
        }

        let mut p = Policy::new(config(), 1);
        admit(&mut p, 1, 5, t0 + 50 * MS, t0, &e);
        let (jobs, _, _, reason) = dispatched(p.decide(t0, true, &e));
        assert_eq!((jobs, reason), (vec![1], CloseReason::Drain));
    }
}
