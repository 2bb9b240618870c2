//! In-process benchmark of a recall version's IVF index against exact search, on the calling thread (pin it to
//! one core with `taskset -c N`): opens the version as the server does (`read_spec`, `open_tables`,
//! `recall::open_index`, and `Catalogue::mapped`, the exact catalogue over the same mapped rows), takes user-table
//! rows as queries, computes their exact top `k` with the catalogue, then for every `nprobe` times single queries
//! and batches through `IvfIndex::search` and measures recall@k against the exact answers (the fraction of the exact top-`k` ids returned). Each batch is also searched
//! one query at a time, alternately before and after the batch (answers checked equal): the batch speed-up is
//! the one-at-a-time time over the batched time, summed over the batches, by wall clock and (in brackets) by the
//! thread's CPU time, which other processes' preemptions do not inflate.
//!
//!     cargo run --release --example ivf_bench -- VERSION_DIR [--queries 1000] [--exact-queries 100]
//!         [--nprobe 8,16,32,64,128] [--k 100] [--batch 32] [--json OUT.json] [--truth OUT.u32]
//!
//! Queries are user rows `i · users / queries` for `i` in `0..queries` (scripts/ivf-faiss.py picks the same).
//! `--truth` writes the exact top-`k` ids, little-endian u32 `[queries, k]`, for comparing other indexes against
//! the same answers. Prints a Markdown table; `--json` writes every figure (scripts/ivf-bench.sh reads it).

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use recserve_core::embedding::cpu::decode_row;
use recserve_core::embedding::{Preload, open_tables};
use recserve_core::recall::{
    Catalogue, IvfScratch, Probe, Scored, SearchQuery, SearchScratch, open_index,
};
use recserve_core::repository::read_spec;
use serde_json::json;

struct Options {
    version: PathBuf,
    queries: usize,
    exact_queries: usize,
    nprobes: Vec<usize>,
    k: usize,
    batch: usize,
    json: Option<PathBuf>,
    truth: Option<PathBuf>,
}

fn options() -> Result<Options, String> {
    let mut args = std::env::args().skip(1);
    let mut o = Options {
        version: PathBuf::new(),
        queries: 1000,
        exact_queries: 100,
        nprobes: vec![8, 16, 32, 64, 128],
        k: 100,
        batch: 32,
        json: None,
        truth: None,
    };
    let mut version = None;
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        let count = |v: String, name: &str| -> Result<usize, String> {
            v.parse::<usize>()
                .ok()
                .filter(|&n| n > 0)
                .ok_or_else(|| format!("{name} must be a positive count, not {v:?}"))
        };
        match arg.as_str() {
            "--queries" => o.queries = count(value()?, "--queries")?,
            "--exact-queries" => o.exact_queries = count(value()?, "--exact-queries")?,
            "--k" => o.k = count(value()?, "--k")?,
            "--batch" => o.batch = count(value()?, "--batch")?,
            "--nprobe" => {
                o.nprobes = value()?
                    .split(',')
                    .map(|v| count(v.to_owned(), "--nprobe"))
                    .collect::<Result<_, _>>()?
            }
            "--json" => o.json = Some(value()?.into()),
            "--truth" => o.truth = Some(value()?.into()),
            "--bench" => {} // cargo bench passes it
            _ if !arg.starts_with("--") && version.is_none() => version = Some(PathBuf::from(arg)),
            _ => return Err(format!("unknown argument {arg:?}")),
        }
    }
    o.version = version.ok_or("usage: ivf_bench VERSION_DIR [options] (see the file's docs)")?;
    o.exact_queries = o.exact_queries.min(o.queries);
    Ok(o)
}

/// The `p`-th percentile (0 < p ≤ 100) of `v`, by the nearest-rank method.
fn percentile(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1]
}

fn millis(v: &[f64]) -> serde_json::Value {
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    json!({"mean": mean * 1e3, "p50": percentile(v, 50.0) * 1e3, "p99": percentile(v, 99.0) * 1e3})
}

/// `VmRSS` and `VmHWM` of this process, in bytes (Linux; 0 elsewhere).
fn rss() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// CPU time this thread has run, in seconds (the first field of `/proc/thread-self/schedstat`; 0 elsewhere): time
/// other processes preempt it does not count, so ratios of it hold on a busy machine.
fn cpu_seconds() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 * 1e-9)
}

fn recall(got: &[Scored], want: &[Scored]) -> f64 {
    let want: std::collections::HashSet<u32> = want.iter().map(|s| s.id).collect();
    got.iter().filter(|s| want.contains(&s.id)).count() as f64 / want.len() as f64
}

fn run(o: &Options) -> Result<(), String> {
    let spec = read_spec(&o.version).map_err(|e| e.to_string())?;
    let recall_spec = spec
        .recall
        .as_ref()
        .ok_or("not a recall (lightgcn) version")?;
    let index_spec = recall_spec.index.as_ref().ok_or(
        "model.toml has no [recall.index]: build one with `python -m recserve_models index`",
    )?;
    let item = spec.tables[recall_spec.item_table].clone();
    let user = spec.tables[recall_spec.user_table].clone();
    let started = Instant::now();
    let bytes = open_tables(&o.version, &[item.clone(), user.clone()], Preload::Populate)
        .map_err(|e| e.to_string())?;
    let opened = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let (index, default) = open_index(
        &o.version,
        index_spec,
        &item.spec,
        &bytes[0],
        Preload::Populate,
    )
    .map_err(|e| e.to_string())?;
    let index_opened = started.elapsed().as_secs_f64();
    let started = Instant::now();
    let catalogue = Catalogue::mapped(&item.spec, Arc::new(bytes[0].clone()), 1)?;
    let laid_out = started.elapsed().as_secs_f64();
    let (rss_loaded, _) = rss();

    let users = user.spec.rows as usize;
    let dim = item.spec.dim;
    let row_bytes = user.spec.storage.row_bytes(dim);
    let ids: Vec<usize> = (0..o.queries).map(|i| i * users / o.queries).collect();
    let vectors: Vec<Vec<f32>> = ids
        .iter()
        .map(|&u| {
            let mut v = vec![0.0f32; dim];
            decode_row(
                user.spec.storage,
                &bytes[1].as_slice()[u * row_bytes..(u + 1) * row_bytes],
                &mut v,
            );
            v
        })
        .collect();
    fn top(vector: &[f32], k: usize) -> SearchQuery<'_> {
        SearchQuery {
            vector,
            k,
            exclude: &[],
        }
    }
    let query = |v| top(v, o.k);
    eprintln!(
        "{}: {} items × {dim} ({}), index of {} lists; {} queries",
        o.version.display(),
        index.items(),
        item.spec.storage.as_str(),
        index.nlist(),
        o.queries
    );

    // Exact answers (batches of 64: one pass over the catalogue each, the same answers as single queries).
    let mut exact_scratch = SearchScratch::default();
    let mut truth: Vec<Vec<Scored>> = Vec::with_capacity(o.queries);
    for chunk in vectors.chunks(64) {
        let qs: Vec<SearchQuery<'_>> = chunk.iter().map(|v| query(v)).collect();
        truth.extend(catalogue.search(&qs, &mut exact_scratch).0);
    }
    let mut exact_single = Vec::with_capacity(o.exact_queries);
    for (i, v) in vectors.iter().take(o.exact_queries).enumerate() {
        let started = Instant::now();
        let (found, _) = catalogue.search(&[query(v)], &mut exact_scratch);
        exact_single.push(started.elapsed().as_secs_f64());
        if found[0] != truth[i] {
            return Err(format!(
                "query {i}: a single exact query differs from the batched one"
            ));
        }
    }
    let exact = millis(&exact_single);
    eprintln!("exact: single query {exact}");
    if let Some(path) = &o.truth {
        let mut raw = Vec::with_capacity(o.queries * o.k * 4);
        for t in &truth {
            for s in t {
                raw.extend_from_slice(&s.id.to_le_bytes());
            }
        }
        std::fs::write(path, raw).map_err(|e| format!("{}: {e}", path.display()))?;
    }

    let mut rows = Vec::new();
    let mut scratch = IvfScratch::default();
    println!(
        "| nprobe | recall@{k} mean | single p50 ms | single p99 ms | QPS (1 query) | batch of {b} p50 ms | \
         batch p99 ms | same {b} one at a time p50 ms | batch speed-up, wall (CPU) | codes scored | re-ranked |",
        k = o.k,
        b = o.batch
    );
    println!("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for &nprobe in &o.nprobes {
        if nprobe > index.nlist() {
            return Err(format!(
                "--nprobe {nprobe} is more than the index's {} lists",
                index.nlist()
            ));
        }
        let probe = Probe { nprobe, ..default };
        let (mut single, mut got_recall) = (Vec::new(), 0.0);
        let (mut codes, mut reranked) = (0u64, 0u64);
        for (v, want) in vectors.iter().zip(&truth) {
            let started = Instant::now();
            let (found, stats) = index.search(&[query(v)], probe, &mut scratch);
            single.push(started.elapsed().as_secs_f64());
            got_recall += recall(&found[0], want);
            codes += stats.codes;
            reranked += stats.reranked;
        }
        // Each batch is searched together and, alternately before or after, one query at a time: the same
        // queries, answers checked equal.
        let (mut batches, mut sequential) = (Vec::new(), Vec::new());
        let (mut batches_cpu, mut sequential_cpu) = (0.0, 0.0);
        for (b, chunk) in vectors
            .chunks(o.batch)
            .filter(|c| c.len() == o.batch)
            .enumerate()
        {
            let qs: Vec<SearchQuery<'_>> = chunk.iter().map(|v| query(v)).collect();
            let together = |scratch: &mut IvfScratch| {
                let (started, cpu) = (Instant::now(), cpu_seconds());
                let (found, _) = index.search(&qs, probe, scratch);
                (
                    (started.elapsed().as_secs_f64(), cpu_seconds() - cpu),
                    found,
                )
            };
            let one_by_one = |scratch: &mut IvfScratch| {
                let (started, cpu) = (Instant::now(), cpu_seconds());
                let found: Vec<Vec<Scored>> = qs
                    .iter()
                    .map(|q| {
                        index
                            .search(std::slice::from_ref(q), probe, scratch)
                            .0
                            .remove(0)
                    })
                    .collect();
                (
                    (started.elapsed().as_secs_f64(), cpu_seconds() - cpu),
                    found,
                )
            };
            let ((t, a), (u, b_found)) = if b % 2 == 0 {
                let first = together(&mut scratch);
                (first, one_by_one(&mut scratch))
            } else {
                let second = one_by_one(&mut scratch);
                (together(&mut scratch), second)
            };
            if a != b_found {
                return Err(format!(
                    "nprobe {nprobe}: a batch answered differently from its queries alone"
                ));
            }
            batches.push(t.0);
            sequential.push(u.0);
            batches_cpu += t.1;
            sequential_cpu += u.1;
        }
        let n = o.queries as f64;
        let mean = single.iter().sum::<f64>() / n;
        let row = json!({
            "nprobe": nprobe,
            "recall": got_recall / n,
            "single_ms": millis(&single),
            "qps": 1.0 / mean,
            "batch_ms": if batches.is_empty() { serde_json::Value::Null } else { millis(&batches) },
            "one_at_a_time_ms": if sequential.is_empty() { serde_json::Value::Null } else { millis(&sequential) },
            "batch_speedup": if batches.is_empty() {
                serde_json::Value::Null
            } else {
                json!(sequential.iter().sum::<f64>() / batches.iter().sum::<f64>())
            },
            "batch_speedup_cpu": if batches.is_empty() { serde_json::Value::Null } else {
                json!(sequential_cpu / batches_cpu)
            },
            "codes_per_query": codes as f64 / n,
            "reranked_per_query": reranked as f64 / n,
        });
        let batch_ms = |p: f64| {
            if batches.is_empty() {
                "-".to_owned()
            } else {
                format!("{:.2}", percentile(&batches, p) * 1e3)
            }
        };
        let (one_ms, speedup) = if batches.is_empty() {
            ("-".to_owned(), "-".to_owned())
        } else {
            (
                format!("{:.2}", percentile(&sequential, 50.0) * 1e3),
                format!(
                    "{:.2}× ({:.2}×)",
                    sequential.iter().sum::<f64>() / batches.iter().sum::<f64>(),
                    sequential_cpu / batches_cpu
                ),
            )
        };
        println!(
            "| {nprobe} | {:.4} | {:.3} | {:.3} | {:.0} | {} | {} | {one_ms} | {speedup} | {:.0} | {:.0} |",
            got_recall / n,
            percentile(&single, 50.0) * 1e3,
            percentile(&single, 99.0) * 1e3,
            1.0 / mean,
            batch_ms(50.0),
            batch_ms(99.0),
            codes as f64 / n,
            reranked as f64 / n,
        );
        rows.push(row);
    }
    let (rss_now, rss_peak) = rss();
    let report = json!({
        "version": o.version.display().to_string(),
        "items": index.items(),
        "dim": dim,
        "item_storage": item.spec.storage.as_str(),
        "nlist": index.nlist(),
        "codes": index.codes_name(),
        "default_nprobe": default.nprobe,
        "k": o.k,
        "batch": o.batch,
        "queries": o.queries,
        "query_users": ids,
        "bytes": {
            "item_table": item.spec.bytes(),
            "catalogue": catalogue.bytes(),
            "catalogue_is_a_copy": !catalogue.is_mapped(),
            "index_file": index.bytes(),
        },
        "rss_bytes": {"loaded": rss_loaded, "end": rss_now, "peak": rss_peak},
        "load_seconds": {"map_tables": opened, "catalogue": laid_out, "open_index": index_opened},
        "exact_single_ms": exact,
        "exact_queries_timed": o.exact_queries,
        "ivf": rows,
    });
    eprintln!(
        "memory: item table {} B, exact catalogue {} B ({}), index file {} B; RSS {} B (peak {} B); index opened \
         in {index_opened:.2} s",
        item.spec.bytes(),
        catalogue.bytes(),
        if catalogue.is_mapped() {
            "the mapped table"
        } else {
            "a copy"
        },
        index.bytes(),
        rss_now,
        rss_peak
    );
    if let Some(path) = &o.json {
        std::fs::write(path, report.to_string()).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    match options().and_then(|o| run(&o)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ivf_bench: {e}");
            ExitCode::FAILURE
        }
    }
}
