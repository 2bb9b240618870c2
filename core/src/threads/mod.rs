//! The server's own threads, and where their CPU time went. A thread that does the server's work calls
//! [`register_current_thread`] once, at its start, with its role and model; at each scrape of `/metrics`,
//! [`ThreadCollector`] reads every thread's scheduler statistics from `/proc` and sums them by role and model
//! (threads that never registered under `role="unregistered"`), beside the machine's steal time. Nothing runs
//! between scrapes and the request path never touches it.
//!
//! Registration is a thread-local, not a guard: the call returns nothing to hold, and the thread's end (its
//! thread-local destructors, which run on the thread itself before the kernel forgets it) takes its last reading
//! into the sum of its role and model, so the counters never go down. A guard would have to be kept alive by every
//! caller for exactly the thread's life, which a tokio runtime's `on_thread_start` hook cannot do.
//!
//! This module imports nothing else of the crate, so that every layer may register its threads
//! (`docs/architecture.md`).

mod collector;
mod procfs;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

pub(crate) use collector::ThreadCollector;
use procfs::{Proc, SchedStat, Tid};

/// What a registered thread does for the server: the `role` label. Fixed, so the label stays bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ThreadRole {
    /// Runs batches: gather and inference (`model` is the model it serves).
    Executor,
    /// Reads, decodes and answers requests: the tokio runtime's threads.
    Io,
    /// Loads or unloads models.
    Loader,
    /// Anything else the server runs: `model` then names the thread (`repository-poll`, `model-releaser`, …).
    Other,
}

impl ThreadRole {
    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            ThreadRole::Executor => "executor",
            ThreadRole::Io => "io",
            ThreadRole::Loader => "loader",
            ThreadRole::Other => "other",
        }
    }
}

/// The `role` of the threads that never registered: ONNX Runtime's own pool threads (with more than one
/// intra-op thread), the test harness's, a library's.
pub(crate) const UNREGISTERED: &str = "unregistered";

/// Records the calling thread as one of the server's, with `role` and `model` (`""` when it serves no single
/// model; for [`ThreadRole::Other`] the thread's name). Call it at the thread's start: its CPU time counts under
/// these labels from the call on (before it, under `role="unregistered"`). Calling again moves the thread to the
/// new labels from then on. The thread is forgotten when it ends, its time kept in its labels' sums.
pub fn register_current_thread(role: ThreadRole, model: &str) {
    let tid = procfs::current_tid();
    // The mark first: a thread whose thread-locals are already being destroyed cannot be told when it ends, so it
    // stays unregistered rather than registered for ever.
    let marked = REGISTERED.try_with(|mark| {
        mark.borrow_mut().get_or_insert(Registered(tid));
    });
    if marked.is_err() {
        return;
    }
    let mut accounts = accounts();
    let now = Proc::system().thread(tid).unwrap_or_default();
    accounts.register(tid, role, model, now);
}

/// Dropped with the thread's thread-locals: the thread has ended.
#[derive(Debug)]
struct Registered(Tid);

impl Drop for Registered {
    fn drop(&mut self) {
        let mut accounts = accounts();
        let last = Proc::system().thread(self.0);
        accounts.unregister(self.0, last);
    }
}

thread_local! {
    static REGISTERED: RefCell<Option<Registered>> = const { RefCell::new(None) };
}

/// Every reading of `/proc` that feeds the accounts is taken under this lock, so they arrive in the order they were
/// taken: a reading older than one already counted would look like a new thread. Held for one file read by a
/// thread that starts or ends, and for the reading of every thread by a scrape (well under a millisecond).
static ACCOUNTS: Mutex<Accounts> = Mutex::new(Accounts::new());

fn accounts() -> MutexGuard<'static, Accounts> {
    // Every update under this lock is a few map operations on plain numbers: a panic cannot leave one half done.
    ACCOUNTS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The labels of one sum: a role's name and a model (or, for `other`, a thread's name).
type Labels = (&'static str, Arc<str>);

/// A registered thread that is still running.
#[derive(Debug)]
struct Registration {
    role: ThreadRole,
    model: Arc<str>,
    /// Its reading when it registered: what it did before counts elsewhere.
    baseline: SchedStat,
    /// Its latest reading.
    last: SchedStat,
}

impl Registration {
    fn labels(&self) -> (ThreadRole, Arc<str>) {
        (self.role, Arc::clone(&self.model))
    }

    fn used(&self) -> SchedStat {
        self.last.since(self.baseline)
    }
}

/// The bookkeeping behind the counters: each thread's time is split into stretches, each counted under exactly one
/// set of labels, and a stretch that ended (a thread gone, or moved to other labels) is kept in `retired`.
#[derive(Debug)]
struct Accounts {
    registered: BTreeMap<Tid, Registration>,
    retired: BTreeMap<(ThreadRole, Arc<str>), SchedStat>,
    /// The reading of each unregistered thread at the last scrape.
    unregistered: BTreeMap<Tid, SchedStat>,
    /// Unregistered threads' time that is no longer in `unregistered`: they ended, or registered.
    unregistered_retired: SchedStat,
}

impl Accounts {
    const fn new() -> Accounts {
        Accounts {
            registered: BTreeMap::new(),
            retired: BTreeMap::new(),
            unregistered: BTreeMap::new(),
            unregistered_retired: SchedStat {
                cpu_ns: 0,
                wait_ns: 0,
                slices: 0,
            },
        }
    }

    fn register(&mut self, tid: Tid, role: ThreadRole, model: &str, now: SchedStat) {
        let baseline = match self.registered.remove(&tid) {
            Some(mut was) => {
                was.last = was.last.latest(now);
                if (was.role, &*was.model) == (role, model) {
                    self.registered.insert(tid, was);
                    return;
                }
                self.retire(&was);
                was.last
            }
            None => {
                // Its time so far was unregistered time.
                self.retire_unregistered(tid, now);
                now
            }
        };
        self.registered.insert(
            tid,
            Registration {
                role,
                model: model.into(),
                baseline,
                last: baseline,
            },
        );
    }

    /// The thread has ended; `last` is its final reading if it could still be read.
    fn unregister(&mut self, tid: Tid, last: Option<SchedStat>) {
        if let Some(mut was) = self.registered.remove(&tid) {
            was.last = was.last.latest(last.unwrap_or_default());
            self.retire(&was);
        }
    }

    fn retire(&mut self, thread: &Registration) {
        self.retired
            .entry(thread.labels())
            .or_default()
            .add(thread.used());
    }

    /// Moves an unregistered thread's time to the retired sum, up to `now` (its last reading at a scrape if that
    /// was later; both when `now` belongs to a new thread that reused the id).
    fn retire_unregistered(&mut self, tid: Tid, now: SchedStat) {
        match self.unregistered.remove(&tid) {
            Some(seen) if now.follows(seen) => self.unregistered_retired.add(now),
            Some(seen) => {
                self.unregistered_retired.add(seen);
                self.unregistered_retired.add(now);
            }
            None => self.unregistered_retired.add(now),
        }
    }

    /// Takes one scrape (every thread of the process, with its reading where it could be read) and answers the
    /// sums by labels, `role="unregistered"` included. A thread listed but unreadable counts at its last reading;
    /// an unregistered thread no longer listed has ended, and its last reading stays in the sum.
    fn scrape(&mut self, threads: &[(Tid, Option<SchedStat>)]) -> BTreeMap<Labels, SchedStat> {
        let mut unregistered = BTreeMap::new();
        for &(tid, now) in threads {
            if let Some(thread) = self.registered.get_mut(&tid) {
                thread.last = thread.last.latest(now.unwrap_or_default());
                continue;
            }
            let seen = self.unregistered.get(&tid).copied();
            let now = match (now, seen) {
                (Some(now), Some(seen)) if !now.follows(seen) => {
                    // A new thread with an ended one's id.
                    self.unregistered_retired.add(seen);
                    now
                }
                (Some(now), _) => now,
                (None, Some(seen)) => seen,
                (None, None) => SchedStat::default(),
            };
            unregistered.insert(tid, now);
        }
        // Threads seen last time and no longer listed have ended (or registered, and were retired then).
        for (tid, seen) in std::mem::replace(&mut self.unregistered, unregistered) {
            if !self.unregistered.contains_key(&tid) {
                self.unregistered_retired.add(seen);
            }
        }

        let mut sums: BTreeMap<Labels, SchedStat> = BTreeMap::new();
        for ((role, model), used) in &self.retired {
            sums.entry((role.as_str(), Arc::clone(model)))
                .or_default()
                .add(*used);
        }
        for thread in self.registered.values() {
            sums.entry((thread.role.as_str(), Arc::clone(&thread.model)))
                .or_default()
                .add(thread.used());
        }
        let mut rest = self.unregistered_retired;
        for seen in self.unregistered.values() {
            rest.add(*seen);
        }
        sums.insert((UNREGISTERED, Arc::from("")), rest);
        sums
    }
}

#[cfg(test)]
mod tests;
