//! The slow-request record: the slowest requests of the last minute with their stage breakdown and batch, bounded
//! in memory (at most `--slow-requests`, [`DEFAULT_KEEP`] by default, for each of two one-minute windows), read at
//! `GET /debug/slow-requests`.
//! When a window ends, its slowest request is logged (target `recserve::slow`), so the log holds one line a
//! minute, with its stages, for as long as requests come.
//!
//! Cheap on the hot path: a request no slower than the slowest kept of the current window is turned away by a few
//! atomic loads, without the lock; one that is kept replaces the fastest kept in logarithmic time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Finished;

/// Requests kept per window unless `--slow-requests` says otherwise.
pub const DEFAULT_KEEP: usize = 32;

/// The length of a window, and how far back the record reaches.
pub const WINDOW: Duration = Duration::from_secs(60);

#[derive(Debug)]
struct Windows {
    /// When the current window began.
    began: Instant,
    /// The current window's slowest, at most `keep`, the fastest of them on top.
    current: BinaryHeap<Reverse<ByTotal>>,
    /// The window before it.
    previous: Vec<Finished>,
}

/// The record; one per server.
#[derive(Debug)]
pub struct SlowRequests {
    windows: Mutex<Windows>,
    /// When the record was made: the origin of `window_end_ns`.
    origin: Instant,
    /// The current window's end, in ns after `origin`.
    window_end_ns: AtomicU64,
    /// Once the current window holds `keep` requests, the fastest of them (ns): a request no slower is not kept.
    floor_ns: AtomicU64,
    /// Requests kept per window; 0 keeps none.
    keep: AtomicUsize,
}

impl Default for SlowRequests {
    fn default() -> Self {
        SlowRequests::new(Instant::now())
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl SlowRequests {
    pub(crate) fn new(now: Instant) -> SlowRequests {
        SlowRequests {
            windows: Mutex::new(Windows {
                began: now,
                current: BinaryHeap::new(),
                previous: Vec::new(),
            }),
            origin: now,
            window_end_ns: AtomicU64::new(nanos(WINDOW)),
            floor_ns: AtomicU64::new(0),
            keep: AtomicUsize::new(DEFAULT_KEEP),
        }
    }

    /// Keeps `keep` requests per window from now on (`--slow-requests`).
    pub fn set_keep(&self, keep: usize) {
        self.keep.store(keep, Ordering::Relaxed);
    }

    pub fn keep(&self) -> usize {
        self.keep.load(Ordering::Relaxed)
    }

    /// Keeps `request` if it is among the slowest of the current window (its `at` is its time).
    pub(crate) fn offer(&self, request: Finished) {
        let keep = self.keep();
        if keep == 0 {
            return;
        }
        let at = nanos(request.at.saturating_duration_since(self.origin));
        if at < self.window_end_ns.load(Ordering::Relaxed)
            && nanos(request.total) <= self.floor_ns.load(Ordering::Relaxed)
        {
            return;
        }
        let ended = {
            let mut w = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
            let mut ended = None;
            if request.at >= w.began + WINDOW {
                // Every window that passed without a request counts: after a quiet spell, the previous window is
                // empty.
                let passed =
                    request.at.saturating_duration_since(w.began).as_nanos() / WINDOW.as_nanos();
                let passed = u32::try_from(passed).unwrap_or(u32::MAX);
                let finished: Vec<Finished> = std::mem::take(&mut w.current)
                    .into_iter()
                    .map(|Reverse(ByTotal(f))| f)
                    .collect();
                ended = finished
                    .iter()
                    .max_by_key(|f| f.total)
                    .cloned()
                    .map(|f| (f, finished.len()));
                w.previous = if passed == 1 { finished } else { Vec::new() };
                w.began += WINDOW * passed;
                let end = nanos(w.began.saturating_duration_since(self.origin) + WINDOW);
                self.window_end_ns.store(end, Ordering::Relaxed);
                self.floor_ns.store(0, Ordering::Relaxed);
            }
            w.current.push(Reverse(ByTotal(request)));
            while w.current.len() > keep {
                w.current.pop();
            }
            if w.current.len() == keep
                && let Some(Reverse(ByTotal(fastest))) = w.current.peek()
            {
                self.floor_ns.store(nanos(fastest.total), Ordering::Relaxed);
            }
            ended
        };
        if let Some((slowest, kept)) = ended {
            log_slowest(&slowest, kept);
        }
    }

    /// The slowest requests handed over within `WINDOW` of `now`, slowest first, at most `keep`.
    pub fn slowest(&self, now: Instant) -> Vec<Finished> {
        let w = self.windows.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<Finished> = w
            .current
            .iter()
            .map(|Reverse(ByTotal(f))| f)
            .chain(&w.previous)
            .filter(|f| now.saturating_duration_since(f.at) <= WINDOW)
            .cloned()
            .collect();
        all.sort_by_key(|f| std::cmp::Reverse(f.total));
        all.truncate(self.keep());
        all
    }
}

/// A finished request, ordered by its time alone.
#[derive(Debug)]
struct ByTotal(Finished);

impl PartialEq for ByTotal {
    fn eq(&self, other: &Self) -> bool {
        self.0.total == other.0.total
    }
}

impl Eq for ByTotal {}

impl PartialOrd for ByTotal {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ByTotal {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total.cmp(&other.0.total)
    }
}

/// `read 0.12 decode 0.30 …`, in milliseconds.
pub(crate) fn stages_line(f: &Finished) -> String {
    f.stages
        .iter()
        .map(|(stage, d)| format!("{} {:.3}", stage.as_str(), d.as_secs_f64() * 1e3))
        .collect::<Vec<_>>()
        .join(" ")
}

fn log_slowest(f: &Finished, kept: usize) {
    let batch = f.batch.map_or_else(String::new, |b| {
        format!(
            "batch {} ({} rows, {} requests, closed by {})",
            b.id, b.rows, b.requests, b.reason
        )
    });
    tracing::info!(
        target: "recserve::slow",
        model = %f.outcome.model,
        endpoint = f.outcome.endpoint,
        protocol = f.outcome.protocol,
        status = f.outcome.status,
        total_ms = f.total.as_secs_f64() * 1e3,
        stages_ms = %stages_line(f),
        batch = %batch,
        "slowest request of the last minute (of the {kept} slowest kept)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::{Outcome, Stage};
    use std::time::SystemTime;

    const KEEP: usize = DEFAULT_KEEP;

    const MS: Duration = Duration::from_millis(1);

    fn request(at: Instant, total_ms: u32) -> Finished {
        Finished {
            outcome: Outcome {
                model: "m".to_owned(),
                version: None,
                endpoint: "rank",
                protocol: "v1",
                status: 200,
            },
            total: MS * total_ms,
            stages: vec![(Stage::Queue, MS * total_ms)],
            batch: None,
            batches: [None; crate::trace::MAX_BATCHES],
            first_byte: at,
            marks: Vec::new(),
            at,
            wall: SystemTime::now(),
        }
    }

    fn totals(record: &SlowRequests, now: Instant) -> Vec<u32> {
        record
            .slowest(now)
            .iter()
            .map(|f| (f.total.as_millis()) as u32)
            .collect()
    }

    #[test]
    fn keeps_the_slowest_of_the_window_slowest_first() {
        let t0 = Instant::now();
        let record = SlowRequests::new(t0);
        for ms in 1..=(KEEP as u32 + 10) {
            // Fast and slow interleaved.
            let ms = if ms % 2 == 0 { ms } else { 1000 - ms };
            record.offer(request(t0 + MS, ms));
        }
        let got = totals(&record, t0 + MS);
        assert_eq!(got.len(), KEEP);
        assert!(
            got.windows(2).all(|w| w[0] >= w[1]),
            "slowest first: {got:?}"
        );
        // Every one of the KEEP slowest offered is there.
        let mut offered: Vec<u32> = (1..=(KEEP as u32 + 10))
            .map(|ms| if ms % 2 == 0 { ms } else { 1000 - ms })
            .collect();
        offered.sort_unstable_by(|a, b| b.cmp(a));
        offered.truncate(KEEP);
        assert_eq!(got, offered);
    }

    #[test]
    fn keeps_as_many_as_it_is_told_and_none_at_zero() {
        let t0 = Instant::now();
        let record = SlowRequests::new(t0);
        record.set_keep(2);
        for ms in [5, 9, 1, 7] {
            record.offer(request(t0, ms));
        }
        assert_eq!(totals(&record, t0), vec![9, 7]);
        let record = SlowRequests::new(t0);
        record.set_keep(0);
        record.offer(request(t0, 5));
        assert!(totals(&record, t0).is_empty());
    }

    #[test]
    fn reaches_one_window_back_and_forgets_older_ones() {
        let t0 = Instant::now();
        let record = SlowRequests::new(t0);
        record.offer(request(t0 + MS, 500));
        // The next window: the first one's request is still within the last minute.
        record.offer(request(t0 + WINDOW + MS, 7));
        assert_eq!(totals(&record, t0 + WINDOW + MS), vec![500, 7]);
        // Past a minute after it, it is gone even though its window is still the previous one.
        assert_eq!(totals(&record, t0 + WINDOW + 2 * MS), vec![7]);
        // A quiet spell of several windows leaves nothing from before it.
        record.offer(request(t0 + 5 * WINDOW, 3));
        assert_eq!(totals(&record, t0 + 5 * WINDOW), vec![3]);
    }

    #[test]
    fn a_fast_request_in_a_new_window_is_kept_though_the_old_window_was_full_of_slow_ones() {
        let t0 = Instant::now();
        let record = SlowRequests::new(t0);
        for _ in 0..KEEP {
            record.offer(request(t0, 900));
        }
        record.offer(request(t0 + MS, 1));
        assert_eq!(
            totals(&record, t0 + MS).len(),
            KEEP,
            "too fast for a full window"
        );
        record.offer(request(t0 + WINDOW + MS, 1));
        assert!(totals(&record, t0 + WINDOW + MS).contains(&1));
    }
}
