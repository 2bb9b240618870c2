//! The one worker loop every target and mode runs. Each worker owns one connection and repeats: claim the next
//! request, wait for its scheduled send time, send it, record the outcome.
//!
//! Open loop: send times come from a schedule fixed before the run ([`crate::arrivals`]). A worker that is busy
//! does not delay the schedule: the next free worker claims the oldest unsent request, and its latency is measured
//! from its *scheduled* time, so time spent waiting behind a stalled server (for a response, or for a free
//! connection) is counted. This is what closed-loop generators leave out (coordinated omission).
//!
//! Closed loop: each worker sends its next request as soon as the previous one is answered, and latency is
//! measured from the send; reported for comparison, and for the saturation throughput.
//!
//! Requests scheduled during the warm-up are sent but not recorded. The run ends when every scheduled request is
//! answered or has timed out (`timeout` after its scheduled time).

use std::sync::atomic::{AtomicI64, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::arrivals::{self, Arrivals, ScheduleError};
use crate::stats::{Durations, ErrorKind, Recorder};
use crate::target::{Failure, Target};

/// How requests are issued.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Mode {
    /// `rate` requests per second on `connections` connections, whatever the answers do.
    Open {
        rate: f64,
        arrivals: Arrivals,
        connections: usize,
    },
    /// `concurrency` workers, each sending as soon as its previous answer arrived.
    Closed { concurrency: usize },
}

impl Mode {
    fn workers(&self) -> usize {
        match *self {
            Mode::Open { connections, .. } => connections,
            Mode::Closed { concurrency } => concurrency,
        }
    }
}

/// Settings of one run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub mode: Mode,
    /// Sent but not recorded.
    pub warmup: Duration,
    /// The measurement window.
    pub duration: Duration,
    /// A request not answered this long after its scheduled time counts as a timeout.
    pub timeout: Duration,
    /// Seed of the Poisson schedule.
    pub seed: u64,
    /// Wait for each send time by spinning (yielding to other tasks) through its last 2 ms instead of relying on
    /// tokio's millisecond timer alone: microsecond accuracy, at the price of a busy generator core.
    pub precise_pacing: bool,
    /// Print a progress line on stderr every second.
    pub progress: bool,
    /// Before the clock starts, wait until the server answers promptly again (it may still be working off the
    /// backlog of an earlier overloaded run).
    pub settle: Option<Settle>,
    /// Keep every request's times and outcome, warm-up included ([`RunStats::log`]).
    pub log_requests: bool,
    /// Sees every successful answer, warm-up included (`--check-scores`).
    pub on_answer: Option<AnswerHook>,
}

/// What an [`AnswerHook`] calls: the index of the request in the pool, and the answer's body.
pub type AnswerFn = dyn Fn(usize, &[u8]) + Send + Sync;

/// Called for every successful answer, on the worker that received it.
#[derive(Clone)]
pub struct AnswerHook(pub Arc<AnswerFn>);

impl std::fmt::Debug for AnswerHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AnswerHook")
    }
}

/// When a server counts as settled: `CONSECUTIVE` requests in a row, sent one at a time, each answered with a
/// 2xx within `latency`. Waiting stops after `timeout` (the run then starts anyway).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settle {
    pub latency: Duration,
    pub timeout: Duration,
}

impl Settle {
    pub const CONSECUTIVE: u32 = 3;
}

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Schedule(#[from] ScheduleError),
    #[error("{0}")]
    Invalid(String),
    /// The target refused the run's first connections: nothing was measured.
    #[error("{0}")]
    Connect(Failure),
}

/// What a run measured.
#[derive(Clone, Debug)]
pub struct RunStats {
    pub recorder: Recorder,
    /// Requests per second scheduled in the measurement window (open loop only).
    pub offered_rps: Option<f64>,
    /// Successful answers per second that arrived in the measurement window.
    pub achieved_rps: f64,
    /// Most requests in flight at once (sent, not yet answered).
    pub peak_in_flight: u64,
    /// From the first send to the last answer or timeout, warm-up and drain included.
    pub wall: Duration,
    /// recload's own CPU time (user + system, all threads) over `wall`: a generator near a full core measures
    /// itself. `None` where the OS would not say.
    pub cpu: Option<Duration>,
    /// Time spent waiting for the server to settle before the run, and whether it did.
    pub settle_wait: Duration,
    pub settled: bool,
    /// When the clock started (the origin of [`Logged`]'s times), by the wall clock.
    pub started: std::time::SystemTime,
    /// Every request, in the order they finished, with [`RunOptions::log_requests`]; empty otherwise.
    pub log: Vec<Logged>,
    /// How long opening connections took (TCP, and the TLS handshake of an `https://` target).
    pub setup: ConnectionSetup,
}

/// Connection set-up: the connections opened before the clock started (not in any request's latency), and those
/// opened again during the run (in the latency of the request that needed one: the server had closed its
/// connection, or a request timed out on it).
#[derive(Clone, Debug, Default)]
pub struct ConnectionSetup {
    pub before: Durations,
    pub during: Durations,
}

/// One request of a run: times from the clock's start, and how it ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Logged {
    pub scheduled: Duration,
    /// `None`: never sent (its time passed while every connection was busy).
    pub sent: Option<Duration>,
    pub done: Duration,
    pub outcome: Result<(), ErrorKind>,
}

/// Live counters for the progress line.
#[derive(Debug, Default)]
struct Live {
    ok: AtomicU64,
    errors: AtomicU64,
    in_flight: AtomicI64,
    peak_in_flight: AtomicI64,
    /// Latencies since the last progress line (warm-up included).
    recent: Mutex<Durations>,
}

#[derive(Debug)]
enum Plan {
    /// Send times in nanoseconds from the start.
    Open(Vec<u64>),
    Closed,
}

struct Shared<T: Target> {
    target: Arc<T>,
    requests: Arc<[T::Prepared]>,
    plan: Plan,
    next: AtomicUsize,
    start: Instant,
    measure_from: Instant,
    end: Instant,
    timeout: Duration,
    precise: bool,
    recorder: Mutex<Recorder>,
    live: Live,
    log: Option<Mutex<Vec<Logged>>>,
    on_answer: Option<AnswerHook>,
    /// Set-up times of the connections opened during the run.
    reopened: Mutex<Durations>,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    seq: usize,
    /// When the request is due: its scheduled time (open loop) or the time its worker became free (closed loop).
    at: Instant,
}

impl<T: Target> Shared<T> {
    fn claim(&self) -> Option<Slot> {
        match &self.plan {
            Plan::Open(times) => {
                let seq = self.next.fetch_add(1, Ordering::Relaxed);
                times.get(seq).map(|&ns| Slot {
                    seq,
                    at: self.start + Duration::from_nanos(ns),
                })
            }
            Plan::Closed => {
                let now = Instant::now();
                (now < self.end).then(|| Slot {
                    seq: self.next.fetch_add(1, Ordering::Relaxed),
                    at: now,
                })
            }
        }
    }

    fn in_window(&self, t: Instant) -> bool {
        t >= self.measure_from && t < self.end
    }

    fn finish(
        &self,
        slot: Slot,
        sent: Option<Instant>,
        done: Instant,
        outcome: Result<(), ErrorKind>,
    ) {
        if let Some(log) = &self.log {
            log.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(Logged {
                    scheduled: slot.at - self.start,
                    sent: sent.map(|t| t - self.start),
                    done: done - self.start,
                    outcome,
                });
        }
        match outcome {
            Ok(()) => {
                self.live.ok.fetch_add(1, Ordering::Relaxed);
                self.live
                    .recent
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .record(done - slot.at);
            }
            Err(_) => {
                self.live.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        let measured = self.in_window(slot.at);
        let answered_in_window = outcome.is_ok() && self.in_window(done);
        if !measured && !answered_in_window {
            return;
        }
        let mut r = self.recorder.lock().unwrap_or_else(PoisonError::into_inner);
        if answered_in_window {
            r.ok_in_window += 1;
        }
        if !measured {
            return;
        }
        r.scheduled += 1;
        if let Some(sent) = sent {
            r.sent += 1;
            r.send_delay.record(sent - slot.at);
        }
        match outcome {
            Ok(()) => {
                r.ok += 1;
                r.latency.record(done - slot.at);
            }
            Err(kind) => {
                *r.errors.entry(kind).or_default() += 1;
                if let (
                    Some(sent),
                    ErrorKind::Status(_)
                    | ErrorKind::Connection
                    | ErrorKind::Grpc(_)
                    | ErrorKind::WrongAnswer,
                ) = (sent, kind)
                {
                    r.error_response
                        .entry(kind)
                        .or_default()
                        .record(done - sent);
                }
            }
        }
    }
}

/// How close to a send time the pacer stops sleeping and starts spinning: tokio's timer has millisecond
/// granularity and a wake-up can be a little late.
const SPIN_MARGIN: Duration = Duration::from_millis(2);

/// Pause of a closed-loop worker after a connection was refused.
const CONNECT_BACKOFF: Duration = Duration::from_millis(10);

async fn pace_until(at: Instant, precise: bool) {
    if !precise {
        tokio::time::sleep_until(at).await;
        return;
    }
    loop {
        let now = Instant::now();
        if now >= at {
            return;
        }
        if at - now > SPIN_MARGIN {
            tokio::time::sleep_until(at - SPIN_MARGIN).await;
        } else {
            tokio::task::yield_now().await;
        }
    }
}

/// Sends one request on `conn`, opening a connection first when there is none or the server closed it (its set-up
/// time recorded in `reopened`).
async fn attempt<T: Target>(
    target: &T,
    conn: &mut Option<T::Conn>,
    request: &T::Prepared,
    reopened: &Mutex<Durations>,
) -> Result<Bytes, Failure> {
    let c = match conn.take() {
        Some(c) if target.is_open(&c) => conn.insert(c),
        _ => {
            let (fresh, took) = timed_connect(target).await;
            reopened
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .record(took);
            conn.insert(fresh?)
        }
    };
    target.send(c, request).await
}

/// Opens a connection, and how long that took (whether it succeeded or not).
async fn timed_connect<T: Target>(target: &T) -> (Result<T::Conn, Failure>, Duration) {
    let begin = Instant::now();
    let conn = target.connect().await;
    (conn, begin.elapsed())
}

async fn worker<T: Target>(shared: Arc<Shared<T>>, mut conn: Option<T::Conn>) {
    while let Some(slot) = shared.claim() {
        if matches!(shared.plan, Plan::Open(_)) {
            pace_until(slot.at, shared.precise).await;
        }
        let sent = Instant::now();
        let deadline = slot.at + shared.timeout;
        if sent >= deadline {
            // Its time passed while every connection was busy: it would only add to the pile-up.
            shared.finish(slot, None, sent, Err(ErrorKind::Timeout));
            continue;
        }
        let live = &shared.live;
        let in_flight = live.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        live.peak_in_flight.fetch_max(in_flight, Ordering::Relaxed);
        let index = slot.seq % shared.requests.len();
        let request = &shared.requests[index];
        let result = tokio::time::timeout_at(
            deadline,
            attempt(&*shared.target, &mut conn, request, &shared.reopened),
        )
        .await;
        let done = Instant::now();
        live.in_flight.fetch_sub(1, Ordering::Relaxed);
        let outcome = match result {
            Ok(Ok(answer)) => {
                if let Some(hook) = &shared.on_answer {
                    (hook.0)(index, &answer);
                }
                Ok(())
            }
            Ok(Err(failure)) => {
                if failure.breaks_connection() {
                    conn = None;
                }
                Err(failure.kind())
            }
            Err(_elapsed) => {
                // The answer may still arrive on this connection: it cannot be reused.
                conn = None;
                Err(ErrorKind::Timeout)
            }
        };
        shared.finish(slot, Some(sent), done, outcome);
        if outcome == Err(ErrorKind::Connect) && matches!(shared.plan, Plan::Closed) {
            // A closed loop would otherwise retry a refused connection as fast as the CPU allows.
            tokio::time::sleep(CONNECT_BACKOFF).await;
        }
    }
}

/// Runs `options` against `target`, cycling through `requests`.
pub async fn run<T: Target>(
    target: Arc<T>,
    requests: Arc<[T::Prepared]>,
    options: &RunOptions,
) -> Result<RunStats, RunError> {
    let workers = options.mode.workers();
    if workers == 0 {
        return Err(RunError::Invalid(
            "--connections / --concurrency must be at least 1".to_owned(),
        ));
    }
    if options.duration.is_zero() {
        return Err(RunError::Invalid("--duration must be positive".to_owned()));
    }
    if options.timeout.is_zero() {
        return Err(RunError::Invalid("--timeout must be positive".to_owned()));
    }
    if requests.is_empty() {
        return Err(RunError::Invalid("no requests to send".to_owned()));
    }
    let plan = match options.mode {
        Mode::Open { rate, arrivals, .. } => Plan::Open(arrivals::schedule(
            arrivals,
            rate,
            options.warmup + options.duration,
            options.seed,
        )?),
        Mode::Closed { .. } => Plan::Closed,
    };

    // Connections are opened before the clock starts, so connection set-up is not measured; the first failure
    // stops the run, since nothing useful would be measured.
    let mut connecting = tokio::task::JoinSet::new();
    for _ in 0..workers {
        let target = Arc::clone(&target);
        connecting.spawn(async move { timed_connect(&*target).await });
    }
    let mut conns = Vec::with_capacity(workers);
    let mut setup = ConnectionSetup::default();
    while let Some(joined) = connecting.join_next().await {
        match joined {
            Ok((Ok(conn), took)) => {
                setup.before.record(took);
                conns.push(conn);
            }
            Ok((Err(failure), _)) => return Err(RunError::Connect(failure)),
            Err(e) => {
                return Err(RunError::Invalid(format!("a connecting task failed: {e}")));
            }
        }
    }

    let (settle_wait, settled) = match options.settle {
        Some(settle) => {
            let conn = conns
                .first_mut()
                .ok_or_else(|| RunError::Invalid("no connection to settle with".to_owned()))?;
            settle_server(&*target, conn, &requests[0], settle).await
        }
        None => (Duration::ZERO, true),
    };

    let cpu_before = process_cpu();
    let start = Instant::now();
    let started = std::time::SystemTime::now();
    let measure_from = start + options.warmup;
    let shared = Arc::new(Shared {
        target,
        requests,
        plan,
        next: AtomicUsize::new(0),
        start,
        measure_from,
        end: measure_from + options.duration,
        timeout: options.timeout,
        precise: options.precise_pacing,
        recorder: Mutex::new(Recorder::default()),
        live: Live::default(),
        log: options.log_requests.then(|| Mutex::new(Vec::new())),
        on_answer: options.on_answer.clone(),
        reopened: Mutex::new(Durations::new()),
    });
    let progress = options
        .progress
        .then(|| tokio::spawn(progress_line(Arc::clone(&shared), options.clone())));
    let mut running = tokio::task::JoinSet::new();
    for conn in conns {
        running.spawn(worker(Arc::clone(&shared), Some(conn)));
    }
    while let Some(joined) = running.join_next().await {
        if let Err(e) = joined {
            return Err(RunError::Invalid(format!("a worker failed: {e}")));
        }
    }
    let wall = start.elapsed();
    let cpu = process_cpu()
        .zip(cpu_before)
        .map(|(after, before)| after.saturating_sub(before));
    if let Some(progress) = progress {
        progress.abort();
        eprintln!();
    }

    let window = options.duration.as_secs_f64();
    let offered_rps = match &shared.plan {
        Plan::Open(times) => {
            let from = options.warmup.as_nanos() as u64;
            let until = (options.warmup + options.duration).as_nanos() as u64;
            let scheduled = times.iter().filter(|&&t| t >= from && t < until).count();
            Some(scheduled as f64 / window)
        }
        Plan::Closed => None,
    };
    let recorder = shared
        .recorder
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Ok(RunStats {
        achieved_rps: recorder.ok_in_window as f64 / window,
        offered_rps,
        peak_in_flight: shared.live.peak_in_flight.load(Ordering::Relaxed).max(0) as u64,
        recorder,
        wall,
        cpu,
        settle_wait,
        settled,
        started,
        log: shared
            .log
            .as_ref()
            .map(|log| std::mem::take(&mut *log.lock().unwrap_or_else(PoisonError::into_inner)))
            .unwrap_or_default(),
        setup: ConnectionSetup {
            during: shared
                .reopened
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
            ..setup
        },
    })
}

/// The CPU time this process has used so far, user and system, all threads (`getrusage(RUSAGE_SELF)`).
fn process_cpu() -> Option<Duration> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::uninit();
    // SAFETY: getrusage writes a whole `rusage` into the pointer it is given when it returns 0, and nothing else.
    let usage = unsafe {
        if libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) != 0 {
            return None;
        }
        usage.assume_init()
    };
    let time = |t: libc::timeval| {
        Duration::from_secs(t.tv_sec.max(0) as u64) + Duration::from_micros(t.tv_usec.max(0) as u64)
    };
    Some(time(usage.ru_utime) + time(usage.ru_stime))
}

/// Sends `request` one at a time on `conn` until [`Settle::CONSECUTIVE`] answers in a row were 2xx within
/// `settle.latency`, or `settle.timeout` passed. Returns the time waited and whether the server settled.
async fn settle_server<T: Target>(
    target: &T,
    conn: &mut T::Conn,
    request: &T::Prepared,
    settle: Settle,
) -> (Duration, bool) {
    let begin = Instant::now();
    let mut in_a_row = 0;
    while in_a_row < Settle::CONSECUTIVE {
        if begin.elapsed() >= settle.timeout {
            return (begin.elapsed(), false);
        }
        let sent = Instant::now();
        // A probe that takes longer than the bound is abandoned with its connection (its answer may still come).
        match tokio::time::timeout(settle.latency, target.send(conn, request)).await {
            Ok(Ok(_)) if sent.elapsed() <= settle.latency => in_a_row += 1,
            Ok(Err(failure)) if failure.breaks_connection() => {
                in_a_row = 0;
                match target.connect().await {
                    Ok(fresh) => *conn = fresh,
                    Err(_) => tokio::time::sleep(CONNECT_BACKOFF).await,
                }
            }
            Ok(_) => in_a_row = 0,
            Err(_elapsed) => {
                in_a_row = 0;
                if let Ok(fresh) = target.connect().await {
                    *conn = fresh;
                }
            }
        }
    }
    (begin.elapsed(), true)
}

/// Rewrites one stderr line every second: phase, counts, and the last second's rate and p99.
async fn progress_line<T: Target>(shared: Arc<Shared<T>>, options: RunOptions) {
    use std::io::Write;
    let total = options.warmup + options.duration;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    let mut last_ok = 0;
    loop {
        tick.tick().await;
        let elapsed = shared.start.elapsed();
        let phase = if elapsed < options.warmup {
            "warm-up"
        } else if elapsed < total {
            "measuring"
        } else {
            "draining"
        };
        let ok = shared.live.ok.load(Ordering::Relaxed);
        let errors = shared.live.errors.load(Ordering::Relaxed);
        let in_flight = shared.live.in_flight.load(Ordering::Relaxed);
        let p99 = {
            let mut recent = shared
                .live
                .recent
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            let p99 = (recent.count() > 0).then(|| recent.quantile(0.99));
            recent.clear();
            p99
        };
        let p99 = p99.map_or("-".to_owned(), |d| {
            crate::stats::Ms(d.as_secs_f64() * 1e3).to_string()
        });
        let mut err = std::io::stderr().lock();
        let _ = write!(
            err,
            "\r\x1b[2K{:>5.1}/{:.0} s {phase:<9} ok {ok} · errors {errors} · in flight {in_flight} · last second: {} ok/s, p99 {p99}",
            elapsed.as_secs_f64(),
            total.as_secs_f64(),
            ok - last_ok,
        );
        let _ = err.flush();
        last_ok = ok;
    }
}

#[cfg(test)]
mod tests {
    //! The loop against an in-process target on tokio's paused clock: time moves only when every task waits, so
    //! these latencies are exact and independent of the machine's load.

    use std::sync::atomic::AtomicU32;

    use super::*;
    use crate::target::TargetInfo;
    use crate::workload::Request;

    /// A single-threaded server that takes `service` per request, and is frozen for the first `stall` of every
    /// `period` (requests arriving then wait for the stall to end).
    struct FakeServer {
        origin: Instant,
        service: Duration,
        stall: Duration,
        period: Duration,
        /// When the server is next free (it serves one request at a time).
        free_at: Mutex<Instant>,
        connects: AtomicU32,
        fail_with: Option<u16>,
        /// How long opening a connection takes (a TLS handshake, say).
        connect_time: Duration,
        /// Every `n`th check finds the connection closed by the server.
        closes_every: Option<u32>,
        checks: AtomicU32,
    }

    impl FakeServer {
        fn new(service_ms: u64, stall_ms: u64, period_ms: u64) -> FakeServer {
            let now = Instant::now();
            FakeServer {
                origin: now,
                service: Duration::from_millis(service_ms),
                stall: Duration::from_millis(stall_ms),
                period: Duration::from_millis(period_ms),
                free_at: Mutex::new(now),
                connects: AtomicU32::new(0),
                fail_with: None,
                connect_time: Duration::ZERO,
                closes_every: None,
                checks: AtomicU32::new(0),
            }
        }

        /// When a request arriving at `t` is answered.
        fn answer_time(&self, t: Instant) -> Instant {
            let mut free_at = self.free_at.lock().expect("lock");
            let mut begin = t.max(*free_at);
            let phase = (begin - self.origin).as_nanos() % self.period.as_nanos();
            if phase < self.stall.as_nanos() {
                begin += self.stall - Duration::from_nanos(phase as u64);
            }
            *free_at = begin + self.service;
            *free_at
        }
    }

    impl Target for FakeServer {
        type Conn = ();
        type Prepared = ();

        fn info(&self) -> TargetInfo {
            TargetInfo {
                url: "fake".to_owned(),
                protocol: "fake".to_owned(),
                v2_model: None,
            }
        }

        fn prepare(&self, _: &Request) {}

        async fn connect(&self) -> Result<(), Failure> {
            self.connects.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(self.connect_time).await;
            Ok(())
        }

        fn is_open(&self, _: &()) -> bool {
            let checks = self.checks.fetch_add(1, Ordering::Relaxed) + 1;
            self.closes_every.is_none_or(|n| !checks.is_multiple_of(n))
        }

        async fn send(&self, _: &mut (), _: &()) -> Result<Bytes, Failure> {
            let done = self.answer_time(Instant::now());
            tokio::time::sleep_until(done).await;
            match self.fail_with {
                Some(status) => Err(Failure::Status {
                    status,
                    body: "overloaded".to_owned(),
                }),
                None => Ok(Bytes::new()),
            }
        }

        fn rank_scores(&self, _: &[u8]) -> Result<Vec<f32>, String> {
            Err("no scores".to_owned())
        }
    }

    fn options(mode: Mode, warmup_s: u64, duration_s: u64) -> RunOptions {
        RunOptions {
            mode,
            warmup: Duration::from_secs(warmup_s),
            duration: Duration::from_secs(duration_s),
            timeout: Duration::from_secs(10),
            seed: 1,
            precise_pacing: false,
            progress: false,
            settle: None,
            log_requests: false,
            on_answer: None,
        }
    }

    async fn run_against(server: FakeServer, options: &RunOptions) -> RunStats {
        run(Arc::new(server), Arc::from(vec![()]), options)
            .await
            .expect("run")
    }

    #[tokio::test(start_paused = true)]
    async fn connection_set_up_is_outside_latency_unless_a_connection_is_reopened_during_the_run() {
        // Opening a connection takes 5 ms; the server serves in 1 ms and closes every 10th connection check.
        let server = FakeServer {
            connect_time: Duration::from_millis(5),
            closes_every: Some(10),
            ..FakeServer::new(1, 0, 1000)
        };
        let closed = Mode::Closed { concurrency: 1 };
        let stats = run_against(server, &options(closed, 0, 1)).await;
        let setup = &stats.setup;
        assert_eq!(setup.before.count(), 1);
        // The histograms keep 3 significant digits.
        let about_5_ms = |d: Duration| (d.as_secs_f64() * 1e3 - 5.0).abs() < 0.01;
        assert!(about_5_ms(setup.before.quantile(1.0)), "{setup:?}");
        let ok = stats.recorder.ok;
        let reopened = setup.during.count();
        assert!(ok > 200, "{ok} requests");
        // One request in ten opened a connection again, and only those paid for it.
        assert!(
            reopened * 10 >= ok - 10 && reopened * 10 <= ok + 10,
            "{reopened} of {ok}"
        );
        assert!(about_5_ms(setup.during.quantile(0.5)), "{setup:?}");
        let lat = stats.recorder.latency.summary().expect("latencies");
        assert!((lat.p50_ms - 1.0).abs() < 0.01, "{lat:?}");
        assert!((lat.max_ms - 6.0).abs() < 0.01, "{lat:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn open_loop_latency_counts_the_wait_behind_a_stall_and_closed_loop_hides_it() {
        // 1 ms per request, frozen for 200 ms of every second; 100 requests/s, evenly spaced.
        let open = Mode::Open {
            rate: 100.0,
            arrivals: Arrivals::Constant,
            connections: 4,
        };
        let stats = run_against(FakeServer::new(1, 200, 1000), &options(open, 1, 10)).await;
        let r = &stats.recorder;
        assert_eq!(r.scheduled, 1000);
        assert_eq!(r.ok, 1000);
        assert_eq!(stats.offered_rps, Some(100.0));
        let lat = r.latency.summary().expect("latencies");
        // Every second, the 20 requests due during the stall wait for its end and are then served one after the
        // other: latencies 201, 192, 183, …, 30 ms; the 3 after them 21, 12 and 3 ms; the other 77 take 1 ms.
        // So p50 is 1 ms, p90 111 ms (the 11th-highest per second), p99 192 ms (the 2nd-highest), max 201 ms.
        assert!((lat.p50_ms - 1.0).abs() < 0.01, "{lat:?}");
        assert!((lat.p90_ms - 111.0).abs() < 0.2, "{lat:?}");
        assert!((lat.p99_ms - 192.0).abs() < 0.2, "{lat:?}");
        assert!((lat.max_ms - 201.0).abs() < 0.2, "{lat:?}");
        // Only four connections: most of a stall's requests waited for one, and that wait is in their latency.
        let delay = r.send_delay.summary().expect("delays");
        assert!(delay.max_ms > 150.0, "{delay:?}");
        assert_eq!(stats.peak_in_flight, 4);

        // Closed loop, one worker: one request per stall waits, the next thousands take 1 ms each.
        let closed = Mode::Closed { concurrency: 1 };
        let stats = run_against(FakeServer::new(1, 200, 1000), &options(closed, 1, 10)).await;
        let lat = stats.recorder.latency.summary().expect("latencies");
        assert!(
            stats.recorder.ok > 7000,
            "{} requests in 10 s",
            stats.recorder.ok
        );
        assert!((lat.p99_ms - 1.0).abs() < 0.01, "{lat:?}");
        assert!(lat.max_ms > 150.0, "the stall did happen: {lat:?}");
        assert!(stats.offered_rps.is_none());
        // Thousands of requests cost the generator some CPU of its own, and it says how much.
        assert!(
            stats.cpu.is_some_and(|c| c > Duration::ZERO),
            "{:?}",
            stats.cpu
        );
    }

    #[tokio::test(start_paused = true)]
    async fn warm_up_is_sent_but_not_recorded() {
        let open = Mode::Open {
            rate: 50.0,
            arrivals: Arrivals::Constant,
            connections: 2,
        };
        let server = Arc::new(FakeServer::new(1, 0, 1000));
        let mut options = options(open, 2, 2);
        options.log_requests = true;
        let stats = run(Arc::clone(&server), Arc::from(vec![()]), &options)
            .await
            .expect("run");
        assert_eq!(stats.recorder.scheduled, 100, "only the 2 s after warm-up");
        assert_eq!(stats.recorder.ok, 100);
        assert!(
            (stats.achieved_rps - 50.0).abs() <= 0.5,
            "{}",
            stats.achieved_rps
        );
        assert_eq!(
            server.connects.load(Ordering::Relaxed),
            2,
            "connections are reused"
        );
        // The request log has them all, warm-up included.
        assert_eq!(stats.log.len(), 200);
        for r in &stats.log {
            assert_eq!(r.outcome, Ok(()));
            let sent = r.sent.expect("sent");
            assert!(r.scheduled <= sent && sent < r.done, "{r:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn overload_shows_as_growing_latency_then_timeouts_and_a_lower_achieved_rate() {
        // 10 ms per request serves at most 100/s; 200/s are offered.
        let open = Mode::Open {
            rate: 200.0,
            arrivals: Arrivals::Constant,
            connections: 8,
        };
        let mut o = options(open, 0, 5);
        o.timeout = Duration::from_secs(1);
        let stats = run_against(FakeServer::new(10, 0, 1000), &o).await;
        let r = &stats.recorder;
        assert_eq!(r.scheduled, 1000);
        assert!(
            r.errors.get(&ErrorKind::Timeout).copied().unwrap_or(0) > 300,
            "{r:?}"
        );
        assert!(stats.achieved_rps <= 100.5, "{}", stats.achieved_rps);
        let lat = r.latency.summary().expect("some succeeded");
        assert!(lat.p99_ms > 900.0, "{lat:?}");
        assert!(lat.max_ms < 1000.0 + 1.0, "{lat:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn error_answers_are_counted_by_status_and_keep_the_connection() {
        let mut server = FakeServer::new(1, 0, 1000);
        server.fail_with = Some(429);
        let server = Arc::new(server);
        let closed = Mode::Closed { concurrency: 2 };
        let stats = run(
            Arc::clone(&server),
            Arc::from(vec![()]),
            &options(closed, 0, 1),
        )
        .await
        .expect("run");
        let r = &stats.recorder;
        assert_eq!(r.ok, 0);
        assert!(r.errors[&ErrorKind::Status(429)] > 900, "{r:?}");
        assert!(r.latency.summary().is_none());
        // How fast the refusals came: from the send, 1 ms of service plus at most 1 ms waiting for the other
        // connection's request (the fake server serves one at a time).
        let refused = r.error_response[&ErrorKind::Status(429)]
            .summary()
            .expect("refusals timed");
        assert_eq!(refused.count, r.errors[&ErrorKind::Status(429)]);
        assert!(
            (0.99..=2.01).contains(&refused.p50_ms) && refused.max_ms <= 2.01,
            "{refused:?}"
        );
        assert_eq!(server.connects.load(Ordering::Relaxed), 2);
        assert_eq!(stats.achieved_rps, 0.0);
    }
}
