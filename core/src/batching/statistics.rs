//! A model version's cumulative statistics, as Triton's statistics extension reports them (`GET
//! /v2/models/{model}/stats`, gRPC `ModelStatistics`): calls that succeeded and failed, and for the requests its
//! executors ran, the time they queued and the time their batches took to gather, infer and finish, in total and
//! per batch size. Plain atomics added to once per call and once per batch: no lock on the request path. The
//! mapping of recserve's stages onto Triton's fields is documented in docs/api.md.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A count and a cumulative duration, read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DurationStat {
    pub count: u64,
    pub ns: u64,
}

/// A count and a cumulative duration in nanoseconds.
#[derive(Debug, Default)]
struct Tally {
    count: AtomicU64,
    ns: AtomicU64,
}

impl Tally {
    fn add(&self, count: u64, each: Duration) {
        let ns = u64::try_from(each.as_nanos()).unwrap_or(u64::MAX);
        self.count.fetch_add(count, Ordering::Relaxed);
        self.ns
            .fetch_add(ns.saturating_mul(count), Ordering::Relaxed);
    }

    fn read(&self) -> DurationStat {
        DurationStat {
            count: self.count.load(Ordering::Relaxed),
            ns: self.ns.load(Ordering::Relaxed),
        }
    }
}

/// The three compute phases of executed batches: Triton's `compute_input`, `compute_infer`, `compute_output`.
#[derive(Debug, Default)]
struct Compute {
    input: Tally,
    infer: Tally,
    output: Tally,
}

impl Compute {
    fn add(&self, count: u64, phases: Phases) {
        self.input.add(count, phases.input);
        self.infer.add(count, phases.infer);
        self.output.add(count, phases.output);
    }
}

/// How long one executed batch took in each phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Phases {
    /// The gather of its embedding rows (recall: the query vectors' lookup).
    pub(crate) input: Duration,
    /// The dense network's run in ONNX Runtime (recall: the top-K search).
    pub(crate) infer: Duration,
    /// The rest of the batch's execution on its executor thread: assembling its rows before the gather, copying
    /// each request's scores out and answering it.
    pub(crate) output: Duration,
}

/// The statistics of one executed batch size, read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchSizeStat {
    /// Rows of the batch (before any padding).
    pub batch_size: u64,
    pub compute_input: DurationStat,
    pub compute_infer: DurationStat,
    pub compute_output: DurationStat,
}

/// Everything [`Statistics`] holds, read at one moment (each value atomically, not all together).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatisticsSnapshot {
    /// Milliseconds since the Unix epoch of the last executed batch; 0 before the first.
    pub last_inference_ms: u64,
    /// Rows of the executed batches (each row is one inference: a candidate scored, a user recalled).
    pub inference_count: u64,
    /// Batches executed.
    pub execution_count: u64,
    pub success: DurationStat,
    pub fail: DurationStat,
    pub queue: DurationStat,
    pub compute_input: DurationStat,
    pub compute_infer: DurationStat,
    pub compute_output: DurationStat,
    /// Batch sizes executed at least once, ascending.
    pub batch_sizes: Vec<BatchSizeStat>,
}

/// The cumulative statistics of one loaded model version.
#[derive(Debug)]
pub struct Statistics {
    last_inference_ms: AtomicU64,
    inference_count: AtomicU64,
    execution_count: AtomicU64,
    success: Tally,
    fail: Tally,
    /// Per queued request (or chunk of a large one).
    queue: Tally,
    /// Per request (or chunk) executed: each is charged its batch's phases, as Triton charges each request.
    compute: Compute,
    /// Per batch, indexed by its rows: every size from 0 to the largest batch the model executes, so that a
    /// batch finds its slot without a lock.
    by_size: Box<[Compute]>,
}

impl Statistics {
    /// Statistics of a model whose batches hold at most `max_batch_rows` rows.
    pub(crate) fn new(max_batch_rows: usize) -> Statistics {
        Statistics {
            last_inference_ms: AtomicU64::new(0),
            inference_count: AtomicU64::new(0),
            execution_count: AtomicU64::new(0),
            success: Tally::default(),
            fail: Tally::default(),
            queue: Tally::default(),
            compute: Compute::default(),
            by_size: (0..=max_batch_rows).map(|_| Compute::default()).collect(),
        }
    }

    /// A call of the model (a request, or a pipeline's stage on it) ended, successfully or not, at `now`; it
    /// arrived at `arrival` (its first byte).
    pub(crate) fn called(&self, ok: bool, arrival: Instant, now: Instant) {
        let took = now.saturating_duration_since(arrival);
        if ok {
            self.success.add(1, took);
        } else {
            self.fail.add(1, took);
        }
    }

    /// One request (or chunk) waited `waited` in the queue.
    pub(crate) fn queued(&self, waited: Duration) {
        self.queue.add(1, waited);
    }

    /// A batch of `rows` rows holding `requests` requests (or chunks) executed, its phases as given.
    pub(crate) fn executed(&self, rows: usize, requests: usize, phases: Phases) {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        self.last_inference_ms.fetch_max(ms, Ordering::Relaxed);
        self.inference_count
            .fetch_add(rows as u64, Ordering::Relaxed);
        self.execution_count.fetch_add(1, Ordering::Relaxed);
        self.compute.add(requests as u64, phases);
        if let Some(size) = self.by_size.get(rows) {
            size.add(1, phases);
        }
    }

    pub fn snapshot(&self) -> StatisticsSnapshot {
        let batch_sizes = self
            .by_size
            .iter()
            .enumerate()
            .filter(|(_, c)| c.infer.count.load(Ordering::Relaxed) > 0)
            .map(|(rows, c)| BatchSizeStat {
                batch_size: rows as u64,
                compute_input: c.input.read(),
                compute_infer: c.infer.read(),
                compute_output: c.output.read(),
            })
            .collect();
        StatisticsSnapshot {
            last_inference_ms: self.last_inference_ms.load(Ordering::Relaxed),
            inference_count: self.inference_count.load(Ordering::Relaxed),
            execution_count: self.execution_count.load(Ordering::Relaxed),
            success: self.success.read(),
            fail: self.fail.read(),
            queue: self.queue.read(),
            compute_input: self.compute.input.read(),
            compute_infer: self.compute.infer.read(),
            compute_output: self.compute.output.read(),
            batch_sizes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn charges_each_request_its_batch_and_each_size_its_executions() {
        let stats = Statistics::new(8);
        let phases = Phases {
            input: 10 * US,
            infer: 30 * US,
            output: 2 * US,
        };
        stats.queued(5 * US);
        stats.queued(7 * US);
        stats.executed(6, 2, phases);
        stats.executed(1, 1, phases);
        stats.executed(6, 1, phases);
        let t0 = Instant::now();
        stats.called(true, t0, t0 + 100 * US);
        stats.called(false, t0, t0 + 40 * US);
        // A call that ended before it arrived (clocks read on two threads) counts as taking no time.
        stats.called(true, t0 + US, t0);

        let s = stats.snapshot();
        assert!(s.last_inference_ms > 0);
        assert_eq!((s.inference_count, s.execution_count), (13, 3));
        assert_eq!(
            s.success,
            DurationStat {
                count: 2,
                ns: 100_000
            }
        );
        assert_eq!(
            s.fail,
            DurationStat {
                count: 1,
                ns: 40_000
            }
        );
        assert_eq!(
            s.queue,
            DurationStat {
                count: 2,
                ns: 12_000
            }
        );
        assert_eq!(
            s.compute_input,
            DurationStat {
                count: 4,
                ns: 40_000
            }
        );
        assert_eq!(
            s.compute_infer,
            DurationStat {
                count: 4,
                ns: 120_000
            }
        );
        assert_eq!(
            s.compute_output,
            DurationStat {
                count: 4,
                ns: 8_000
            }
        );
        let sizes: Vec<(u64, DurationStat)> = s
            .batch_sizes
            .iter()
            .map(|b| (b.batch_size, b.compute_infer))
            .collect();
        assert_eq!(
            sizes,
            vec![
                (
                    1,
                    DurationStat {
                        count: 1,
                        ns: 30_000
                    }
                ),
                (
                    6,
                    DurationStat {
                        count: 2,
                        ns: 60_000
                    }
                ),
            ]
        );
    }

    #[test]
    fn a_batch_larger_than_its_slots_counts_in_the_totals_only() {
        let stats = Statistics::new(4);
        let phases = Phases {
            input: US,
            infer: US,
            output: US,
        };
        stats.executed(5, 1, phases);
        let s = stats.snapshot();
        assert_eq!((s.inference_count, s.execution_count), (5, 1));
        assert!(s.batch_sizes.is_empty());
    }
}
