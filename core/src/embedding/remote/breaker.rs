//! Failing fast on a part of the cluster known to be down: one breaker per hash-tag group (the unit of a fetch,
//! one MGET, which needs no knowledge of which node holds it). A group whose MGET timed out after the whole
//! `--redis-fetch-timeout-ms`, or failed for want of a connection or with an error reply, is *open* for a backoff:
//! batches do not ask for its rows, which follow their table's `unfetched` policy at once instead of making every
//! batch wait the fetch timeout (one executor waiting 50 ms per batch runs 20 batches a second, and admission then
//! refuses requests). Once per backoff one batch sends the group's MGET as a *probe* that no batch waits for: its
//! answer closes the breaker (and its rows are cached), its failure reopens it with the backoff doubled, up to
//! [`MAX_BACKOFF`]. The probes are also what keeps the Redis client's reconnects and slot-map refreshes going while
//! a node is down or failing over.
//!
//! Lock-light for the executors' hot path: a closed group costs one atomic load; only a batch that meets an open
//! group takes that group's own mutex. The clock is the caller's (`now`), so the state machine is tested without
//! sleeping.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus::IntGauge;

/// The first backoff of a group that opens.
pub(crate) const MIN_BACKOFF: Duration = Duration::from_millis(50);
/// The longest backoff: a group that came back is used again at most this long after.
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// What a batch does with one group's missing rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Admit {
    /// Closed: fetch them and wait for them.
    Fetch,
    /// Open, and its backoff is over: send the MGET without waiting for it, report its outcome with
    /// [`Breakers::probed`]; the batch's rows follow the `unfetched` policy.
    Probe,
    /// Open: do not ask; the rows follow the `unfetched` policy.
    Skip,
}

/// How a group's MGET went, as the breaker sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The node answered (whatever the values: a missing key is the key's problem, not the node's).
    Answered,
    /// The node did not answer: no connection, an error reply, or no answer within the whole fetch timeout.
    Failed,
    /// Says nothing about the node: it timed out within a budget that a request's deadline cut short.
    Unknown,
}

#[derive(Debug, Default)]
struct Open {
    /// Since the group opened or last probed; zero while closed.
    backoff: Duration,
    /// When the next probe may go.
    until: Option<Instant>,
    /// A probe is out: no other goes until it is answered.
    probing: bool,
}

#[derive(Debug, Default)]
struct Group {
    /// Read without the lock on every fetch: `false` is the common case, and then nothing else is touched.
    open: AtomicBool,
    state: Mutex<Open>,
}

/// The breakers of one model version's groups.
#[derive(Debug)]
pub(crate) struct Breakers {
    groups: Vec<Group>,
    /// Groups open now.
    open: AtomicI64,
    /// `recserve_embedding_tier_open_groups` of the model, which every loaded version of it adds its own to.
    gauge: IntGauge,
}

impl Breakers {
    pub(crate) fn new(groups: usize, gauge: IntGauge) -> Breakers {
        Breakers {
            groups: (0..groups).map(|_| Group::default()).collect(),
            open: AtomicI64::new(0),
            gauge,
        }
    }

    fn opened(&self, by: i64) {
        self.open.fetch_add(by, Ordering::Relaxed);
        self.gauge.add(by);
    }

    /// Groups open now.
    pub(crate) fn open_groups(&self) -> i64 {
        self.open.load(Ordering::Relaxed)
    }

    fn lock(&self, group: usize) -> std::sync::MutexGuard<'_, Open> {
        self.groups[group]
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a batch at `now` fetches `group`'s rows, probes it, or skips it.
    pub(crate) fn admit(&self, group: usize, now: Instant) -> Admit {
        if !self.groups[group].open.load(Ordering::Acquire) {
            return Admit::Fetch;
        }
        let mut state = self.lock(group);
        if !self.groups[group].open.load(Ordering::Acquire) {
            return Admit::Fetch;
        }
        match state.until {
            Some(until) if now < until => Admit::Skip,
            _ if state.probing => Admit::Skip,
            _ => {
                state.probing = true;
                Admit::Probe
            }
        }
    }

    /// The outcome of a fetch that a batch waited for (after [`Admit::Fetch`]) at `now`: a failure opens a
    /// closed group for [`MIN_BACKOFF`]; it leaves an open one (opened meanwhile by another batch) as it is.
    pub(crate) fn fetched(&self, group: usize, outcome: Outcome, now: Instant) {
        match outcome {
            Outcome::Answered | Outcome::Unknown => {}
            Outcome::Failed => {
                if self.groups[group].open.load(Ordering::Acquire) {
                    return;
                }
                let mut state = self.lock(group);
                if !self.groups[group].open.load(Ordering::Acquire) {
                    *state = Open {
                        backoff: MIN_BACKOFF,
                        until: Some(now + MIN_BACKOFF),
                        probing: false,
                    };
                    self.groups[group].open.store(true, Ordering::Release);
                    self.opened(1);
                }
            }
        }
    }

    /// The outcome of a probe (after [`Admit::Probe`]) at `now`: answered closes the group; failed (or unknown)
    /// keeps it open with the backoff doubled, up to [`MAX_BACKOFF`].
    pub(crate) fn probed(&self, group: usize, outcome: Outcome, now: Instant) {
        let mut state = self.lock(group);
        state.probing = false;
        if !self.groups[group].open.load(Ordering::Acquire) {
            return;
        }
        match outcome {
            Outcome::Answered => {
                *state = Open::default();
                self.groups[group].open.store(false, Ordering::Release);
                self.opened(-1);
            }
            Outcome::Failed | Outcome::Unknown => {
                state.backoff = (state.backoff * 2).clamp(MIN_BACKOFF, MAX_BACKOFF);
                state.until = Some(now + state.backoff);
            }
        }
    }
}

impl Drop for Breakers {
    /// A version unloaded with groups open takes them off the model's gauge.
    fn drop(&mut self) {
        self.gauge.sub(self.open_groups());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breakers(groups: usize) -> Breakers {
        Breakers::new(
            groups,
            IntGauge::new("open_groups", "groups open").expect("gauge"),
        )
    }

    fn ms(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn a_closed_group_is_fetched_and_an_answer_or_an_unknown_keeps_it_closed() {
        let b = breakers(4);
        let t0 = Instant::now();
        assert_eq!(b.admit(2, t0), Admit::Fetch);
        b.fetched(2, Outcome::Answered, t0);
        b.fetched(2, Outcome::Unknown, t0);
        assert_eq!(b.admit(2, ms(t0, 1)), Admit::Fetch);
        assert_eq!(b.open_groups(), 0);
    }

    #[test]
    fn a_failure_opens_only_its_group_which_is_skipped_until_its_backoff_is_over() {
        let b = breakers(4);
        let t0 = Instant::now();
        b.fetched(1, Outcome::Failed, t0);
        assert_eq!(b.open_groups(), 1);
        assert_eq!(b.admit(0, ms(t0, 1)), Admit::Fetch);
        assert_eq!(b.admit(1, ms(t0, 1)), Admit::Skip);
        assert_eq!(b.admit(1, ms(t0, 49)), Admit::Skip);
        assert_eq!(b.admit(1, ms(t0, 50)), Admit::Probe);
        // One probe at a time: until it is answered, every other batch skips.
        assert_eq!(b.admit(1, ms(t0, 51)), Admit::Skip);
        assert_eq!(b.admit(1, ms(t0, 500)), Admit::Skip);
    }

    #[test]
    fn failed_probes_double_the_backoff_up_to_the_cap_and_an_answered_probe_closes_the_group() {
        let b = breakers(1);
        let t0 = Instant::now();
        b.fetched(0, Outcome::Failed, t0);
        let mut now = t0;
        let mut backoffs = Vec::new();
        for _ in 0..8 {
            // The first moment a probe is let through, found by stepping the clock 1 ms at a time.
            let mut waited = 0;
            while b.admit(0, now) != Admit::Probe {
                now += Duration::from_millis(1);
                waited += 1;
                assert!(waited <= 2000, "no probe within 2 s of the clock");
            }
            backoffs.push(waited);
            b.probed(0, Outcome::Failed, now);
        }
        assert_eq!(backoffs, [50, 100, 200, 400, 800, 1000, 1000, 1000]);
        now += MAX_BACKOFF;
        assert_eq!(b.admit(0, now), Admit::Probe);
        b.probed(0, Outcome::Answered, now);
        assert_eq!(b.open_groups(), 0);
        assert_eq!(b.admit(0, now), Admit::Fetch);
        // Opened again, it starts over from the shortest backoff.
        b.fetched(0, Outcome::Failed, now);
        assert_eq!(b.admit(0, now + MIN_BACKOFF), Admit::Probe);
    }

    #[test]
    fn a_failed_fetch_that_raced_with_the_opening_does_not_extend_the_backoff() {
        let b = breakers(1);
        let t0 = Instant::now();
        b.fetched(0, Outcome::Failed, t0);
        // Another batch's fetch, sent while the group was still closed, fails later.
        b.fetched(0, Outcome::Failed, ms(t0, 40));
        assert_eq!(b.open_groups(), 1);
        assert_eq!(b.admit(0, ms(t0, 50)), Admit::Probe);
    }

    #[test]
    fn a_probe_answered_after_the_group_closed_changes_nothing() {
        let b = breakers(1);
        let t0 = Instant::now();
        b.fetched(0, Outcome::Failed, t0);
        assert_eq!(b.admit(0, ms(t0, 50)), Admit::Probe);
        b.probed(0, Outcome::Answered, ms(t0, 52));
        // A late second report (there is none in practice) neither reopens nor miscounts.
        b.probed(0, Outcome::Failed, ms(t0, 53));
        assert_eq!(b.open_groups(), 0);
        assert_eq!(b.admit(0, ms(t0, 54)), Admit::Fetch);
    }
}
