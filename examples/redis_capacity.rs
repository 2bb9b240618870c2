//! What one Redis node answers to the tier's own fetches: starts a local 3 + 3 cluster of its own
//! (`scripts/redis-cluster.sh`), writes `--rows` rows of `--row-bytes` bytes under the tier's key scheme
//! (`rs1:{M/V/g}:T:id`, 64 hash-tag groups), then for each batch shape in `--batch-rows` has `--threads` threads
//! (the executors) fetch batches of that many distinct uniformly random rows through the server's own client
//! ([`RedisCluster::fetch`]: one MGET per hash-tag group, all in flight together) for `--seconds`, and reads each
//! master's CPU time (`/proc/PID/stat`) before and after. A node runs commands on one thread, so the rows it serves
//! per second of its CPU is what it answers at full load on one core: the figure printed per shape, beside the
//! rows/s reached here, each master's CPU share, the client's CPU and the batches' fetch latency.
//!
//!     cargo run --release --example redis_capacity -- [--rows 1000000] [--row-bytes 72] [--batch-rows 64,256,1024]
//!         [--threads 2] [--seconds 10] [--json OUT.json]
//!
//! Needs redis-server and redis-cli (Debian's redis-server package). docs/deploy.md uses its figures.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use recserve_core::embedding::remote::redis::{RedisCluster, row_key};
use serde_json::json;

#[path = "support/cluster.rs"]
mod support;
use support::{Cluster, cli};

const GROUPS: u64 = 64;

struct Options {
    rows: u64,
    row_bytes: usize,
    batch_rows: Vec<usize>,
    threads: usize,
    seconds: u64,
    json: Option<PathBuf>,
}

fn options() -> Result<Options, String> {
    let mut o = Options {
        rows: 1_000_000,
        row_bytes: 72,
        batch_rows: vec![64, 256, 1024],
        threads: 2,
        seconds: 10,
        json: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{flag}: {v:?} is not a whole number"))
        };
        match flag.as_str() {
            "--rows" => o.rows = number(&value)?.max(1),
            "--row-bytes" => o.row_bytes = number(&value)?.max(1) as usize,
            "--batch-rows" => {
                o.batch_rows = value
                    .split(',')
                    .map(|v| number(v).map(|n| n.max(1) as usize))
                    .collect::<Result<_, _>>()?
            }
            "--threads" => o.threads = number(&value)?.max(1) as usize,
            "--seconds" => o.seconds = number(&value)?.max(1),
            "--json" => o.json = Some(PathBuf::from(value)),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.batch_rows.iter().any(|&b| b as u64 > o.rows) {
        return Err("--batch-rows must not exceed --rows".to_owned());
    }
    Ok(o)
}

/// User plus system CPU time of process `pid`, in seconds.
fn cpu_seconds(pid: u32) -> Result<f64, String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).map_err(|e| e.to_string())?;
    // Fields after the command name (which may hold spaces) start after the last ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat (12 and 13 after the state field), in USER_HZ ticks, 100 a second
    // on Linux whatever the kernel's own tick.
    let hz = 100.0;
    Ok((ticks(11) + ticks(12)) / hz)
}

fn own_cpu_seconds() -> f64 {
    cpu_seconds(std::process::id()).unwrap_or(0.0)
}

fn write_rows(nodes: &[String], o: &Options) -> Result<(), String> {
    let urls: Vec<String> = nodes.iter().map(|n| format!("redis://{n}")).collect();
    let client = redis::cluster::ClusterClient::new(urls).map_err(|e| e.to_string())?;
    let mut conn = client.get_connection().map_err(|e| e.to_string())?;
    let value = vec![7u8; o.row_bytes];
    // One MSET per group and chunk: the keys of one group share a slot.
    for g in 0..GROUPS {
        let ids: Vec<u64> = (g..o.rows).step_by(GROUPS as usize).collect();
        for chunk in ids.chunks(4096) {
            let mut mset = redis::cmd("MSET");
            for &id in chunk {
                mset.arg(row_key("cap", 1, GROUPS, "T", id)).arg(&value);
            }
            mset.query::<()>(&mut conn)
                .map_err(|e| format!("MSET: {e}"))?;
        }
    }
    Ok(())
}

struct Shape {
    batch_rows: usize,
    batches: u64,
    rows: u64,
    failed_rows: u64,
    seconds: f64,
    master_cpu: Vec<f64>,
    client_cpu: f64,
    latency_ms: (f64, f64),
}

fn measure(
    cluster: &Arc<RedisCluster>,
    o: &Options,
    batch_rows: usize,
    masters: &[u32],
) -> Result<Shape, String> {
    let stop = Arc::new(AtomicBool::new(false));
    let (batches, rows, failed) = (
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let before: Vec<f64> = masters
        .iter()
        .map(|&p| cpu_seconds(p))
        .collect::<Result<_, _>>()?;
    let client_before = own_cpu_seconds();
    let started = Instant::now();
    let threads: Vec<_> = (0..o.threads)
        .map(|t| {
            let (cluster, stop) = (Arc::clone(cluster), Arc::clone(&stop));
            let (batches, rows, failed) =
                (Arc::clone(&batches), Arc::clone(&rows), Arc::clone(&failed));
            let total = o.rows;
            std::thread::spawn(move || {
                let mut rng = StdRng::seed_from_u64(t as u64 + 1);
                let mut latencies = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    // A batch's misses: distinct rows, grouped by hash-tag group into one MGET each.
                    let mut ids = std::collections::HashSet::with_capacity(batch_rows);
                    while ids.len() < batch_rows {
                        ids.insert(rng.random_range(0..total));
                    }
                    let mut groups = vec![Vec::new(); GROUPS as usize];
                    for id in ids {
                        groups[(id % GROUPS) as usize].push(row_key("cap", 1, GROUPS, "T", id));
                    }
                    let groups: Vec<Vec<String>> =
                        groups.into_iter().filter(|g| !g.is_empty()).collect();
                    let began = Instant::now();
                    let answers = cluster.fetch(groups, began + Duration::from_secs(1));
                    latencies.push(began.elapsed().as_secs_f64() * 1e3);
                    let mut got = 0u64;
                    let mut lost = 0u64;
                    for answer in answers {
                        match answer {
                            Ok(values) => {
                                for v in values {
                                    if v.is_some() {
                                        got += 1;
                                    } else {
                                        lost += 1;
                                    }
                                }
                            }
                            Err(_) => lost += 1,
                        }
                    }
                    batches.fetch_add(1, Ordering::Relaxed);
                    rows.fetch_add(got, Ordering::Relaxed);
                    failed.fetch_add(lost, Ordering::Relaxed);
                }
                latencies
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(o.seconds));
    stop.store(true, Ordering::Relaxed);
    let mut latencies: Vec<f64> = Vec::new();
    for t in threads {
        latencies.extend(t.join().map_err(|_| "a fetching thread panicked")?);
    }
    let seconds = started.elapsed().as_secs_f64();
    let client_cpu = own_cpu_seconds() - client_before;
    let after: Vec<f64> = masters
        .iter()
        .map(|&p| cpu_seconds(p))
        .collect::<Result<_, _>>()?;
    latencies.sort_by(f64::total_cmp);
    let quantile = |q: f64| {
        latencies
            .get(((latencies.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    Ok(Shape {
        batch_rows,
        batches: batches.load(Ordering::Relaxed),
        rows: rows.load(Ordering::Relaxed),
        failed_rows: failed.load(Ordering::Relaxed),
        seconds,
        master_cpu: after.iter().zip(&before).map(|(a, b)| a - b).collect(),
        client_cpu,
        latency_ms: (quantile(0.5), quantile(0.99)),
    })
}

fn main() -> ExitCode {
    let o = match options() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("redis_capacity: {e}");
            return ExitCode::from(2);
        }
    };
    let result = Cluster::start().and_then(|cluster| run(&o, &cluster));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("redis_capacity: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(o: &Options, cluster: &Cluster) -> Result<(), String> {
    let nodes = cluster.nodes.clone();
    let masters: Vec<(String, u32)> = cluster
        .ports()
        .into_iter()
        .filter(|p| cli(p, &["ROLE"]).starts_with("master"))
        .map(|p| cluster.pid(&p).map(|pid| (p, pid)))
        .collect::<Result<_, String>>()?;

    eprintln!(
        "redis_capacity: writing {} rows of {} bytes",
        o.rows, o.row_bytes
    );
    write_rows(&nodes, o)?;
    let used: u64 = masters
        .iter()
        .map(|(p, _)| {
            cli(p, &["INFO", "memory"])
                .lines()
                .find_map(|l| l.strip_prefix("used_memory:"))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum();
    let replaced =
        IntCounter::new("replaced", "connections replaced").map_err(|e| e.to_string())?;
    let client = Arc::new(RedisCluster::connect(&nodes, replaced)?);
    let pids: Vec<u32> = masters.iter().map(|(_, pid)| *pid).collect();
    // Warm up the client's connections.
    measure(
        &client,
        &Options {
            seconds: 1,
            ..clone_options(o)
        },
        o.batch_rows[0],
        &pids,
    )?;
    let mut shapes = Vec::new();
    println!(
        "{} rows of {} B on 3 masters (used_memory {:.1} B a row); {} fetching threads, {} s per shape",
        o.rows,
        o.row_bytes,
        used as f64 / o.rows as f64,
        o.threads,
        o.seconds
    );
    println!(
        "| rows a batch | keys an MGET | batches/s | rows/s | rows per master CPU-second | masters' CPU | client CPU | fetch p50 / p99 |"
    );
    println!("| ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |");
    for &batch_rows in &o.batch_rows {
        let s = measure(&client, o, batch_rows, &pids)?;
        let master_cpu: f64 = s.master_cpu.iter().sum();
        let per_cpu_second = s.rows as f64 / master_cpu.max(1e-9);
        let shares: Vec<String> = s
            .master_cpu
            .iter()
            .map(|c| format!("{:.0}%", 100.0 * c / s.seconds))
            .collect();
        println!(
            "| {} | {:.1} | {:.0} | {:.0} | {:.0} | {} | {:.0}% | {:.2} / {:.2} ms |",
            s.batch_rows,
            s.batch_rows as f64 / GROUPS.min(s.batch_rows as u64) as f64,
            s.batches as f64 / s.seconds,
            s.rows as f64 / s.seconds,
            per_cpu_second,
            shares.join(" "),
            100.0 * s.client_cpu / s.seconds,
            s.latency_ms.0,
            s.latency_ms.1
        );
        if s.failed_rows > 0 {
            println!("  ({} rows not fetched)", s.failed_rows);
        }
        shapes.push(json!({
            "batch_rows": s.batch_rows,
            "batches_per_s": s.batches as f64 / s.seconds,
            "rows_per_s": s.rows as f64 / s.seconds,
            "rows_not_fetched": s.failed_rows,
            "rows_per_master_cpu_second": per_cpu_second,
            "master_cpu_share": s.master_cpu.iter().map(|c| c / s.seconds).collect::<Vec<_>>(),
            "client_cpu_share": s.client_cpu / s.seconds,
            "fetch_p50_ms": s.latency_ms.0,
            "fetch_p99_ms": s.latency_ms.1,
        }));
    }
    if let Some(path) = &o.json {
        let doc = json!({
            "rows": o.rows,
            "row_bytes": o.row_bytes,
            "threads": o.threads,
            "seconds": o.seconds,
            "used_memory_per_row": used as f64 / o.rows as f64,
            "shapes": shapes,
        });
        std::fs::write(path, serde_json::to_string_pretty(&doc).unwrap_or_default())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn clone_options(o: &Options) -> Options {
    Options {
        rows: o.rows,
        row_bytes: o.row_bytes,
        batch_rows: o.batch_rows.clone(),
        threads: o.threads,
        seconds: o.seconds,
        json: o.json.clone(),
    }
}
