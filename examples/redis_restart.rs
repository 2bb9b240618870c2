//! Measures what a failover and a restarted master do to the Redis tier's fetches, with the server's own client
//! ([`RedisCluster`]). Each run starts a local 3 + 3 cluster of its own (`scripts/redis-cluster.sh`), writes one
//! row per hash-tag group, and has `--threads` threads (the executors) fetch every group every `--every-ms`, each
//! fetch waiting `--fetch-timeout-ms` as a batch does. It kills the master of group 0 by PID, waits for its
//! replica to take over, and 5 s later starts the killed node again (`scripts/redis-cluster.sh restart`), then
//! watches the fetches for `--after-s` seconds. Per run it prints how many groups of the masters that stayed up went
//! unanswered for longer than `--stall-ms` between the kill and the restart (a stuck client stalls every group, not
//! only the dead node's), how many groups were answered again only later than `--stall-ms` after the takeover, how
//! many went unanswered for longer than `--stall-ms` across the restart (and the longest such spans), the kinds of
//! failures after the restart, and how often the connection's watchdog replaced it; then how many runs had each.
//!
//!     cargo run --example redis_restart -- [--runs 10] [--after-s 20] [--groups 64] [--threads 2]
//!         [--every-ms 20] [--fetch-timeout-ms 50] [--stall-ms 1000] [--json OUT.json]
//!
//! Needs redis-server and redis-cli (Debian's redis-server package). `RUST_LOG=redis=debug` shows the client's own
//! log (slot refreshes, reconnects). docs/model-repository.md ("When the client stalls") has its figures.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, ExitCode};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use recserve_core::embedding::remote::redis::{RedisCluster, row_key};
use serde_json::json;

#[path = "support/cluster.rs"]
mod support;
use support::{Cluster, cli};

struct Options {
    runs: usize,
    after: Duration,
    groups: u64,
    every: Duration,
    fetch_timeout: Duration,
    stall: Duration,
    threads: usize,
    json: Option<PathBuf>,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        runs: 10,
        after: Duration::from_secs(20),
        groups: 64,
        every: Duration::from_millis(20),
        fetch_timeout: Duration::from_millis(50),
        stall: Duration::from_millis(1000),
        threads: 2,
        json: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: {v:?} is not a whole number"))
        };
        match flag.as_str() {
            "--runs" => o.runs = number(value()?)? as usize,
            "--after-s" => o.after = Duration::from_secs(number(value()?)?),
            "--groups" => o.groups = number(value()?)?.max(1),
            "--every-ms" => o.every = Duration::from_millis(number(value()?)?),
            "--fetch-timeout-ms" => o.fetch_timeout = Duration::from_millis(number(value()?)?),
            "--stall-ms" => o.stall = Duration::from_millis(number(value()?)?),
            "--threads" => o.threads = (number(value()?)? as usize).max(1),
            "--json" => o.json = Some(PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(o)
}

fn wait_until(
    what: &str,
    limit: Duration,
    mut done: impl FnMut() -> bool,
) -> Result<Duration, String> {
    let started = Instant::now();
    while started.elapsed() < limit {
        if done() {
            return Ok(started.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(format!("{what}: not within {limit:?}"))
}

/// When each group was answered (a value read back), and the failures, by kind.
#[derive(Default)]
struct Watch {
    answers: Vec<Vec<Instant>>,
    failures: BTreeMap<&'static str, u64>,
}

struct Run {
    takeover: Duration,
    /// Per group of the masters that stayed up, its longest span without an answer between the kill and the restart.
    others_during_failover: Vec<Duration>,
    /// Per group, from the takeover to its first answer after it.
    after_takeover: Vec<Duration>,
    /// Per group, the longest span without an answer that reaches past the restart (to the end, if it never
    /// answered again).
    after_restart: Vec<Duration>,
    failures: BTreeMap<&'static str, u64>,
    /// Times the watchdog replaced the connection.
    replaced: u64,
}

fn run(o: &Options) -> Result<Run, String> {
    let own = Cluster::start()?;
    let nodes = own.nodes.clone();
    let ports = own.ports();
    let keys: Vec<String> = (0..o.groups)
        .map(|g| row_key("restart", 1, o.groups, "T", g))
        .collect();
    // One row per group, written through a node that redirects redis-cli (-c) to the right one.
    for key in &keys {
        let set = cli(&ports[0], &["-c", "SET", key, "row"]);
        if !set.contains("OK") {
            return Err(format!("SET {key}: {set}"));
        }
    }
    let replaced =
        IntCounter::new("replaced", "connections replaced").map_err(|e| e.to_string())?;
    let cluster = Arc::new(RedisCluster::connect(&nodes, replaced.clone())?);
    let watch = Arc::new(Mutex::new(Watch {
        answers: vec![Vec::new(); keys.len()],
        ..Watch::default()
    }));
    let done = Arc::new(AtomicBool::new(false));
    let fetchers: Vec<_> = (0..o.threads)
        .map(|_| {
            let (cluster, watch, done, keys) = (
                Arc::clone(&cluster),
                Arc::clone(&watch),
                Arc::clone(&done),
                keys.clone(),
            );
            let (every, timeout) = (o.every, o.fetch_timeout);
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    let began = Instant::now();
                    let groups = keys.iter().map(|k| vec![k.clone()]).collect();
                    let answers = cluster.fetch(groups, began + timeout);
                    let now = Instant::now();
                    let mut w = watch.lock().expect("watch");
                    for (g, answer) in answers.iter().enumerate() {
                        match answer {
                            Ok(v) if v.first().is_some_and(Option::is_some) => {
                                w.answers[g].push(now)
                            }
                            Ok(_) => *w.failures.entry("missing").or_default() += 1,
                            Err(f) => *w.failures.entry(f.as_str()).or_default() += 1,
                        }
                    }
                    drop(w);
                    std::thread::sleep(every.saturating_sub(began.elapsed()));
                }
            })
        })
        .collect();
    let faults = (|| -> Result<_, String> {
        let answered_since = |since: Instant| {
            let w = watch.lock().expect("watch");
            w.answers
                .iter()
                .all(|a| a.last().is_some_and(|t| *t > since))
        };
        let begun = Instant::now();
        wait_until("first fetches", Duration::from_secs(10), || {
            answered_since(begun)
        })?;
        // The victim: the master of group 0's slot; its replica takes over.
        let victim = ports
            .iter()
            .find(|p| {
                cli(p, &["ROLE"]).starts_with("master")
                    && cli(p, &["EXISTS", &keys[0]]).trim() == "1"
            })
            .cloned()
            .ok_or("no master holds group 0")?;
        // The groups the victim holds; the others are on masters that stay up.
        let on_victim: Vec<bool> = keys
            .iter()
            .map(|k| cli(&victim, &["EXISTS", k]).trim() == "1")
            .collect();
        let id = cli(&victim, &["CLUSTER", "MYID"]).trim().to_owned();
        let replica = cli(&victim, &["CLUSTER", "NODES"])
            .lines()
            .find(|l| l.split(' ').nth(3) == Some(id.as_str()))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|a| a.split(['@', ':']).nth(1))
            .map(str::to_owned)
            .ok_or("the victim has no replica")?;
        let pid = own.pid(&victim)?;
        let killed = Instant::now();
        Command::new("kill")
            .args(["-9", &pid.to_string()])
            .status()
            .map_err(|e| e.to_string())?;
        let takeover = wait_until("takeover", Duration::from_secs(30), || {
            cli(&replica, &["ROLE"]).starts_with("master")
        })?;
        let took_over = killed + takeover;
        // As tests/redis_updates.rs did: the node is started again a few seconds after the takeover.
        std::thread::sleep(Duration::from_secs(5));
        let restarted = Instant::now();
        own.restart(&victim)?;
        let failures_before = watch.lock().expect("watch").failures.clone();
        std::thread::sleep(o.after);
        Ok((
            takeover,
            killed,
            took_over,
            restarted,
            failures_before,
            on_victim,
        ))
    })();
    // The fetching threads stop whatever happened, so that the client is dropped before the cluster is stopped.
    done.store(true, Ordering::Relaxed);
    for fetcher in fetchers {
        fetcher.join().map_err(|_| "a fetching thread panicked")?;
    }
    let (takeover, killed, took_over, restarted, failures_before, on_victim) = faults?;
    let end = Instant::now();
    let w = watch.lock().expect("watch");
    // The longest span without an answer of each group of the masters that stayed up, between the kill and the
    // restart: a stuck client stalls these too.
    let others_during_failover = w
        .answers
        .iter()
        .zip(&on_victim)
        .filter(|(_, on)| !**on)
        .map(|(a, _)| {
            let ends = a.iter().skip(1).copied().chain(std::iter::once(end));
            a.iter()
                .zip(ends)
                .filter(|(from, to)| *to > killed && **from < restarted)
                .map(|(from, to)| to.min(restarted).duration_since(*from.max(&killed)))
                .max()
                .unwrap_or(restarted - killed)
        })
        .collect();
    let after_takeover = w
        .answers
        .iter()
        .map(|a| {
            a.iter()
                .find(|t| **t >= took_over)
                .map_or(end - took_over, |t| t.duration_since(took_over))
        })
        .collect();
    let after_restart = w
        .answers
        .iter()
        .map(|a| {
            // Spans between answers (and from the last answer to the end) that reach past the restart.
            let ends = a.iter().skip(1).copied().chain(std::iter::once(end));
            a.iter()
                .zip(ends)
                .filter(|(_, to)| *to > restarted)
                .map(|(from, to)| to.duration_since(*from))
                .max()
                .unwrap_or(end - restarted)
        })
        .collect();
    let failures = w
        .failures
        .iter()
        .map(|(k, v)| (*k, v - failures_before.get(k).copied().unwrap_or(0)))
        .filter(|(_, v)| *v > 0)
        .collect();
    Ok(Run {
        takeover,
        others_during_failover,
        after_takeover,
        after_restart,
        failures,
        replaced: replaced.get(),
    })
}

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("redis_restart: {e}");
            return ExitCode::from(2);
        }
    };
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let mut runs = Vec::new();
    let over = |spans: &[Duration]| spans.iter().filter(|s| **s > o.stall).count();
    let longest =
        |spans: &[Duration]| spans.iter().max().copied().unwrap_or_default().as_millis() as u64;
    for i in 1..=o.runs {
        match run(&o) {
            Ok(r) => {
                println!(
                    "run {i}: takeover {:.2} s; groups of the other masters stalled > {} ms during the failover: {} of {} \
                     (longest {} ms); groups answered > {} ms after the takeover: {} of {} (slowest {} ms); stalled > {} \
                     ms after the restart: {} (longest {} ms); failures after the restart {:?}; connection replaced {} \
                     times",
                    r.takeover.as_secs_f64(),
                    o.stall.as_millis(),
                    over(&r.others_during_failover),
                    r.others_during_failover.len(),
                    longest(&r.others_during_failover),
                    o.stall.as_millis(),
                    over(&r.after_takeover),
                    o.groups,
                    longest(&r.after_takeover),
                    o.stall.as_millis(),
                    over(&r.after_restart),
                    longest(&r.after_restart),
                    r.failures,
                    r.replaced
                );
                runs.push(json!({
                    "run": i,
                    "takeover_s": r.takeover.as_secs_f64(),
                    "other_groups_stalled_during_failover": over(&r.others_during_failover),
                    "longest_other_stall_during_failover_ms": longest(&r.others_during_failover),
                    "groups_late_after_takeover": over(&r.after_takeover),
                    "slowest_after_takeover_ms": longest(&r.after_takeover),
                    "groups_stalled_after_restart": over(&r.after_restart),
                    "longest_stall_after_restart_ms": longest(&r.after_restart),
                    "failures_after_restart": r.failures,
                    "connection_replaced": r.replaced,
                }));
            }
            Err(e) => {
                eprintln!("redis_restart: run {i}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    let count = |field: &str| {
        runs.iter()
            .filter(|r| r[field].as_u64().unwrap_or(0) > 0)
            .count()
    };
    println!(
        "{} of {} runs had a group of another master stalled > {} ms during the failover; {} had a group answered > {} \
         ms after the takeover; {} had a group stalled > {} ms after the restart",
        count("other_groups_stalled_during_failover"),
        runs.len(),
        o.stall.as_millis(),
        count("groups_late_after_takeover"),
        o.stall.as_millis(),
        count("groups_stalled_after_restart"),
        o.stall.as_millis()
    );
    if let Some(path) = &o.json
        && let Err(e) = std::fs::write(
            path,
            serde_json::to_string_pretty(&json!({ "runs": runs })).unwrap_or_default(),
        )
    {
        eprintln!("redis_restart: cannot write {}: {e}", path.display());
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
