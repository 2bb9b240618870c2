//! The accounts behind the thread counters (exact sums, and never going down whatever threads start, register,
//! move and end between scrapes), and a registered thread's CPU seen to rise through a real registry.

use std::collections::BTreeMap;
use std::sync::Arc;

use proptest::prelude::*;

use super::procfs::{Proc, SchedStat};
use super::*;

fn st(cpu_ns: u64, wait_ns: u64, slices: u64) -> SchedStat {
    SchedStat {
        cpu_ns,
        wait_ns,
        slices,
    }
}

fn key(role: &'static str, model: &str) -> Labels {
    (role, Arc::from(model))
}

/// One scrape in which every listed thread could be read.
fn read(threads: &[(Tid, SchedStat)]) -> Vec<(Tid, Option<SchedStat>)> {
    threads.iter().map(|&(tid, now)| (tid, Some(now))).collect()
}

#[test]
fn registered_threads_sum_by_labels_from_their_registration() {
    let mut a = Accounts::new();
    a.register(1, ThreadRole::Executor, "deepfm", st(100, 10, 1));
    a.register(2, ThreadRole::Executor, "deepfm", st(0, 0, 0));
    a.register(3, ThreadRole::Loader, "deepfm", st(0, 0, 0));
    let sums = a.scrape(&read(&[
        (1, st(1100, 60, 11)),
        (2, st(500, 5, 4)),
        (3, st(70, 7, 7)),
        (4, st(9, 9, 9)),
    ]));
    assert_eq!(sums[&key("executor", "deepfm")], st(1500, 55, 14));
    assert_eq!(sums[&key("loader", "deepfm")], st(70, 7, 7));
    // Thread 1's time before it registered, and thread 4, which never did.
    assert_eq!(sums[&key(UNREGISTERED, "")], st(109, 19, 10));
    assert_eq!(sums.len(), 3);
}

#[test]
fn an_ended_thread_keeps_its_last_reading_in_its_sum() {
    let mut a = Accounts::new();
    a.register(1, ThreadRole::Io, "", st(0, 0, 0));
    a.register(2, ThreadRole::Io, "", st(0, 0, 0));
    assert_eq!(
        a.scrape(&read(&[(1, st(10, 1, 1)), (2, st(20, 2, 2))]))[&key("io", "")],
        st(30, 3, 3)
    );
    // Thread 2 ends having done more since the scrape; its final reading is kept.
    a.unregister(2, Some(st(25, 2, 3)));
    assert_eq!(
        a.scrape(&read(&[(1, st(12, 1, 2))]))[&key("io", "")],
        st(37, 3, 5)
    );
    // A thread that ended unreadable keeps the reading of the last scrape.
    a.unregister(1, None);
    assert_eq!(a.scrape(&read(&[]))[&key("io", "")], st(37, 3, 5));
    assert!(a.registered.is_empty());
}

#[test]
fn a_registered_thread_missing_from_a_scrape_counts_at_its_last_reading() {
    let mut a = Accounts::new();
    a.register(1, ThreadRole::Loader, "", st(0, 0, 0));
    a.scrape(&read(&[(1, st(40, 4, 4))]));
    assert_eq!(a.scrape(&read(&[]))[&key("loader", "")], st(40, 4, 4));
}

#[test]
fn unregistered_threads_never_go_down_when_they_end_register_or_their_id_is_reused() {
    let mut a = Accounts::new();
    let unregistered = |a: &mut Accounts, threads: &[(Tid, SchedStat)]| {
        a.scrape(&read(threads))[&key(UNREGISTERED, "")]
    };
    assert_eq!(
        unregistered(&mut a, &[(5, st(50, 5, 5)), (6, st(60, 6, 6))]),
        st(110, 11, 11)
    );
    // 6 ended; 5 did more.
    assert_eq!(unregistered(&mut a, &[(5, st(55, 5, 6))]), st(115, 11, 12));
    // 5 ended and a new thread got its id: it reads lower than the old one did.
    assert_eq!(unregistered(&mut a, &[(5, st(1, 1, 1))]), st(116, 12, 13));
    // The new 5 registers: its time so far stays unregistered, and its own sum starts there.
    a.register(5, ThreadRole::Other, "model-releaser", st(3, 1, 2));
    let sums = a.scrape(&read(&[(5, st(8, 1, 4))]));
    assert_eq!(sums[&key(UNREGISTERED, "")], st(118, 12, 14));
    assert_eq!(sums[&key("other", "model-releaser")], st(5, 0, 2));
}

#[test]
fn a_listed_thread_that_cannot_be_read_counts_once_at_its_last_reading() {
    let mut a = Accounts::new();
    let unregistered = |a: &mut Accounts, threads: &[(Tid, Option<SchedStat>)]| {
        a.scrape(threads)[&key(UNREGISTERED, "")]
    };
    assert_eq!(
        unregistered(&mut a, &[(5, Some(st(50, 5, 5)))]),
        st(50, 5, 5)
    );
    assert_eq!(unregistered(&mut a, &[(5, None)]), st(50, 5, 5));
    assert_eq!(
        unregistered(&mut a, &[(5, Some(st(60, 5, 6)))]),
        st(60, 5, 6)
    );
    // Listed but never read: nothing to count yet.
    assert_eq!(
        unregistered(&mut a, &[(5, Some(st(60, 5, 6))), (6, None)]),
        st(60, 5, 6)
    );
}

#[test]
fn registering_again_moves_the_thread_to_new_labels_from_then_on() {
    let mut a = Accounts::new();
    a.register(1, ThreadRole::Loader, "", st(0, 0, 0));
    a.scrape(&read(&[(1, st(10, 1, 1))]));
    // The same labels again change nothing.
    a.register(1, ThreadRole::Loader, "", st(12, 1, 2));
    a.register(1, ThreadRole::Executor, "deepfm", st(15, 2, 3));
    let sums = a.scrape(&read(&[(1, st(40, 3, 5))]));
    assert_eq!(sums[&key("loader", "")], st(15, 2, 3));
    assert_eq!(sums[&key("executor", "deepfm")], st(25, 1, 2));
}

/// What happens to threads between two scrapes, for the property below.
#[derive(Debug, Clone)]
enum Event {
    /// A new thread starts, on the smallest free id or reusing the id of an ended one.
    Start { reuse: bool },
    /// Thread number `which` (modulo those running) runs for a while.
    Run { which: usize, ns: u64, waited: u64 },
    /// It registers under one of a few labels.
    Register { which: usize, labels: usize },
    /// It ends.
    End { which: usize },
    /// A scrape that lists thread `missing` (modulo those running), if any, but cannot read it.
    Scrape { missing: Option<usize> },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        any::<bool>().prop_map(|reuse| Event::Start { reuse }),
        (0..8usize, 0..1_000u64, 0..100u64).prop_map(|(which, ns, waited)| Event::Run {
            which,
            ns,
            waited
        }),
        (0..8usize, 0..4usize).prop_map(|(which, labels)| Event::Register { which, labels }),
        (0..8usize).prop_map(|which| Event::End { which }),
        proptest::option::of(0..8usize).prop_map(|missing| Event::Scrape { missing }),
    ]
}

const LABELS: [(ThreadRole, &str); 4] = [
    (ThreadRole::Executor, "a"),
    (ThreadRole::Executor, "b"),
    (ThreadRole::Io, ""),
    (ThreadRole::Other, "x"),
];

proptest! {
    // Nothing is written into the source tree; a failure prints its events, shrunk.
    #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

    /// Whatever happens, no sum ever goes down, no series disappears, and together they never count more time than
    /// the threads ever used.
    #[test]
    fn counters_never_go_down(events in proptest::collection::vec(event(), 1..80)) {
        let mut a = Accounts::new();
        // Running threads: id and cumulative reading.
        let mut running: Vec<(Tid, SchedStat)> = Vec::new();
        let mut ended: Vec<Tid> = Vec::new();
        let mut next_tid: Tid = 1;
        let mut used_ever = SchedStat::default();
        let mut previous: BTreeMap<Labels, SchedStat> = BTreeMap::new();
        for e in events {
            match e {
                Event::Start { reuse } => {
                    let tid = match ended.pop() {
                        Some(tid) if reuse => tid,
                        other => {
                            ended.extend(other);
                            next_tid += 1;
                            next_tid
                        }
                    };
                    running.push((tid, SchedStat::default()));
                }
                Event::Run { which, ns, waited } if !running.is_empty() => {
                    let n = running.len();
                    let (_, reading) = &mut running[which % n];
                    let more = st(ns, waited, 1);
                    reading.add(more);
                    used_ever.add(more);
                }
                Event::Register { which, labels } if !running.is_empty() => {
                    let n = running.len();
                    let (tid, reading) = running[which % n];
                    let (role, model) = LABELS[labels];
                    a.register(tid, role, model, reading);
                }
                Event::End { which } if !running.is_empty() => {
                    let n = running.len();
                    let (tid, reading) = running.remove(which % n);
                    a.unregister(tid, Some(reading));
                    ended.push(tid);
                }
                Event::Scrape { missing } => {
                    let mut listed = read(&running);
                    if let Some(m) = missing && !listed.is_empty() {
                        let n = listed.len();
                        listed[m % n].1 = None;
                    }
                    let sums = a.scrape(&listed);
                    let mut total = SchedStat::default();
                    for (labels, now) in &sums {
                        total.add(*now);
                        if let Some(before) = previous.get(labels) {
                            prop_assert!(now.follows(*before), "{labels:?} went from {before:?} to {now:?}");
                        }
                    }
                    for labels in previous.keys() {
                        prop_assert!(sums.contains_key(labels), "{labels:?} disappeared");
                    }
                    prop_assert!(used_ever.follows(total), "counted {total:?} of {used_ever:?}");
                    previous = sums;
                }
                _ => {}
            }
        }
    }
}

fn cpu_seconds(registry: &prometheus::Registry, role: &str, model: &str) -> Option<f64> {
    registry
        .gather()
        .iter()
        .find(|f| f.name() == "recserve_thread_cpu_seconds_total")?
        .get_metric()
        .iter()
        .find(|m| {
            m.get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .eq([("model", model), ("role", role)])
        })
        .map(|m| m.get_counter().get_value())
}

#[test]
fn a_registered_thread_burning_cpu_is_seen_rising_and_kept_after_it_ends() {
    // A name no other test registers, so the sum is this thread's alone.
    const NAME: &str = "threads-test-burn";
    let registry = prometheus::Registry::new();
    registry
        .register(Box::new(ThreadCollector::new()))
        .expect("register");
    let registry = Arc::new(registry);
    let (before, during, tid) = std::thread::scope(|scope| {
        scope
            .spawn(|| {
                register_current_thread(ThreadRole::Other, NAME);
                let tid = procfs::current_tid();
                let before = cpu_seconds(&registry, "other", NAME).expect("registered series");
                // Burn 20 ms of this thread's CPU, as the kernel counts it (not a wall-clock wait).
                let start = Proc::system().thread(tid).expect("schedstat").cpu_ns;
                let mut x = 1u64;
                while Proc::system().thread(tid).expect("schedstat").cpu_ns < start + 20_000_000 {
                    for i in 0..10_000u64 {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(i),
                        );
                    }
                }
                let during = cpu_seconds(&registry, "other", NAME).expect("series");
                (before, during, tid)
            })
            .join()
            .expect("burner")
    });
    assert!(
        during >= before + 0.02 - 1e-9,
        "cpu seconds went from {before} to {during} over 20 ms of CPU"
    );
    // The thread has ended: forgotten by the registry, its time still counted.
    assert!(!accounts().registered.contains_key(&tid));
    let after = cpu_seconds(&registry, "other", NAME).expect("series kept");
    assert!(after >= during, "went down from {during} to {after}");
}
