//! Online row updates of the Redis tier, end to end against a real Redis Cluster of the test's own
//! (`scripts/redis-cluster.sh`): a writer overwrites every row of table C1 of the demo's fp32 DeepFM again and
//! again, each time with values that encode their version (every element of row `r` at version `v` is
//! [`value`]`(r, v)`), and announces them on the version's update stream in the documented entry format, while
//! threads gather the table through the store the server uses. Every gathered row must be whole (all its elements
//! from one version) and, while the cluster is healthy, no older than the last update the store had applied when
//! the gather began (a fetch that straddles an update must not cache the old row); the master that holds the
//! stream is killed by PID meanwhile and started again after the failover, and the followers and fetches must read
//! on after both; at the end every row, and the served scores, must be those of the last version
//! (the scores bit for bit those of the same model served from a mapped file that holds that version's rows).

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::redis::{OwnCluster, redis_config_on, redis_model_on, scores};
use common::{TestServer, copy_dir, metric_sample};
use recserve_core::embedding::EmbeddingStore;
use recserve_core::embedding::remote::redis::row_key;
use recserve_core::embedding::remote::updates::stream_key;
use serde_json::Value;

const MODEL: &str = "upd";
const TABLE: &str = "C1";
const ROWS: u64 = 1394;
const DIM: usize = 17;
const GROUPS: u64 = 64;
/// Versions written before the kill, and the last one.
const BEFORE_KILL: u32 = 5;
const LAST: u32 = 25;

/// Every element of row `r` at version `v`: distinct for every `v` of one row, and of an embedding's magnitude.
fn value(r: u64, v: u32) -> f32 {
    0.001 * (r % 100) as f32 + 0.01 * v as f32
}

fn row_bytes(r: u64, v: u32) -> Vec<u8> {
    value(r, v).to_le_bytes().repeat(DIM)
}

/// Writes version `v` of every row of C1 (one MSET per hash-tag group), then announces it: one stream entry with
/// `published_us` and `rows:C1`.
async fn write_version(
    connection: &mut redis::cluster_async::ClusterConnection,
    v: u32,
) -> redis::RedisResult<()> {
    for g in 0..GROUPS {
        let mut mset = redis::cmd("MSET");
        for r in (g..ROWS).step_by(GROUPS as usize) {
            mset.arg(row_key(MODEL, 1, GROUPS, TABLE, r))
                .arg(row_bytes(r, v));
        }
        mset.query_async::<()>(connection).await?;
    }
    let ids: Vec<String> = (0..ROWS).map(|r| r.to_string()).collect();
    let now_us = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_micros()
        .to_string();
    redis::cmd("XADD")
        .arg(stream_key(MODEL, 1))
        .arg("MAXLEN")
        .arg("~")
        .arg(1000)
        .arg("*")
        .arg("published_us")
        .arg(now_us)
        .arg(format!("rows:{TABLE}"))
        .arg(ids.join(","))
        .query_async::<String>(connection)
        .await
        .map(|_| ())
}

/// Writes version `v`, retrying while the cluster fails over (30 s at most).
async fn write_until_done(connection: &mut redis::cluster_async::ClusterConnection, v: u32) {
    let started = Instant::now();
    loop {
        match write_version(connection, v).await {
            Ok(()) => return,
            Err(e) if started.elapsed() < Duration::from_secs(30) => {
                eprintln!("writing version {v}: {e}; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("version {v} could not be written in 30 s: {e}"),
        }
    }
}

/// What the gathering threads saw.
#[derive(Default)]
struct Seen {
    /// Rows read whole, and the highest version among them.
    rows: AtomicU64,
    newest: AtomicU32,
    /// Gathers that failed (rows not fetched while a master was down).
    failed: AtomicU64,
    /// Rows whose elements were not all one version's: must stay empty.
    torn: Mutex<Vec<String>>,
    /// Rows older than an update the store had already applied when the gather began: must stay empty.
    stale: Mutex<Vec<String>>,
}

/// While the cluster is healthy every version is one stream entry: once the store has applied `base.0 + k`
/// entries, every row must be at version `base.1 + k` or newer. `None` while a master is down (entries may be
/// lost or doubled by the failover).
type Baseline = Mutex<Option<(u64, u32)>>;

/// The version of every row of one gather of the whole table, or a description of the first row that is not
/// one version's whole.
fn versions(out: &[f32]) -> Result<Vec<u32>, String> {
    out.chunks_exact(DIM)
        .enumerate()
        .map(|(r, row)| {
            let r = r as u64;
            let v = (1..=LAST)
                .find(|&v| value(r, v).to_bits() == row[0].to_bits())
                .ok_or_else(|| format!("row {r}: {row:?} is no version's"))?;
            if row.iter().any(|x| x.to_bits() != row[0].to_bits()) {
                return Err(format!("row {r}: {row:?} mixes versions"));
            }
            Ok(v)
        })
        .collect()
}

/// Gathers the whole table until every row reads version `v` (30 s at most); how long that took.
fn wait_for_version(store: &dyn EmbeddingStore, table: usize, v: u32) -> Duration {
    let started = Instant::now();
    let ids: Vec<i64> = (0..ROWS as i64).collect();
    let mut out = vec![0f32; ROWS as usize * DIM];
    loop {
        let gathered = store.gather(&[table], &ids, &mut out);
        if gathered.is_ok() && versions(&out).is_ok_and(|vs| vs.iter().all(|&x| x == v)) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "rows did not all reach version {v} in 30 s: {gathered:?} {:?}",
            versions(&out).map(|vs| vs.iter().copied().min())
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The demo fp32 DeepFM's table file with C1's rows replaced by version `v`'s.
fn write_reference_tables(from: &Path, to: &Path, v: u32) {
    use safetensors::tensor::TensorView;
    let bytes = std::fs::read(from).expect("read tables");
    let tables = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let c1: Vec<u8> = (0..ROWS).flat_map(|r| row_bytes(r, v)).collect();
    let mut views: Vec<(String, TensorView<'_>)> = Vec::new();
    for (name, view) in tables.tensors() {
        let view = if name == TABLE {
            assert_eq!(view.shape(), [ROWS as usize, DIM]);
            TensorView::new(view.dtype(), view.shape().to_vec(), &c1).expect("view")
        } else {
            view
        };
        views.push((name, view));
    }
    safetensors::tensor::serialize_to_file(views, None, to).expect("write tables");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn updated_rows_are_read_whole_and_reach_the_scores_through_a_failover() {
    let own = OwnCluster::start();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repository = tempfile::tempdir().expect("tempdir");
    redis_model_on(
        &own.nodes,
        repository.path(),
        "deepfm-fp32",
        MODEL,
        "unavailable",
        &[],
    );
    // The reference: the same model from a mapped file that holds the last version's rows of C1.
    let reference = repository.path().join("upd-ref");
    copy_dir(&root.join("models/demo/deepfm-fp32"), &reference);
    write_reference_tables(
        &root.join("models/demo/deepfm-fp32/1/tables.safetensors"),
        &reference.join("1/tables.safetensors"),
        LAST,
    );
    let mut config = redis_config_on(&own.nodes, repository.path());
    // Whole-table gathers of a debug build on a loaded 2-core machine can take longer than the default 50 ms, and
    // this test is about which rows are read, not how fast: a failed gather before the kill fails it.
    config.redis_fetch_timeout_ms = 250;
    let server = TestServer::start(config.clone()).await;
    let request: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("models/demo/rank-request.json")).expect("request"),
    )
    .expect("json");
    let rank = |model: &'static str| {
        let (server, request) = (&server, &request);
        async move {
            let (status, body) = server
                .post(&format!("/v1/models/{model}/rank"), request)
                .await;
            assert_eq!(status, 200, "{model}: {body}");
            scores(&body)
        }
    };
    let (published, expected) = (rank(MODEL).await, rank("upd-ref").await);
    assert_ne!(
        published, expected,
        "the last version's rows must change the scores"
    );

    // The store the server builds for the model, opened here a second time so the test can see gathered rows.
    let ctx = config.load_context(
        recserve_core::executor::Runtime::load(&config.ort_library).expect("ONNX Runtime"),
        recserve_core::metrics::Metrics::new(),
        recserve_core::gpu::select(config.device).expect("placement"),
    );
    let mv = recserve_core::repository::ModelVersion {
        name: MODEL.to_owned(),
        version: 1,
        dir: repository.path().join(MODEL).join("1"),
        available: vec![1],
    };
    let spec = recserve_core::repository::read_spec(&mv.dir).expect("model.toml");
    let table = spec
        .tables
        .iter()
        .position(|t| t.spec.name == TABLE)
        .expect("C1");
    let store = recserve_core::ranking::open_store(&ctx, &mv, &spec).expect("open the store");
    let applied = ctx.metrics.tier(MODEL).updates.entries;
    let baseline: Arc<Baseline> = Arc::default();

    let nodes: Vec<String> = own
        .nodes
        .split(',')
        .map(|n| format!("redis://{n}"))
        .collect();
    let client = redis::cluster::ClusterClient::new(nodes).expect("client");
    let mut writer = client.get_async_connection().await.expect("connect");
    write_until_done(&mut writer, 1).await;
    let first = tokio::task::block_in_place(|| wait_for_version(store.as_ref(), table, 1));
    eprintln!("version 1 visible to the store after {first:?}");
    *baseline.lock().expect("lock") = Some((applied.get(), 1));

    // Two threads gather the whole table over and over while versions are written.
    let seen = Arc::new(Seen::default());
    let stop = Arc::new(AtomicBool::new(false));
    let gatherers: Vec<_> = (0..2)
        .map(|_| {
            let (store, seen, stop) = (Arc::clone(&store), Arc::clone(&seen), Arc::clone(&stop));
            let (applied, baseline) = (applied.clone(), Arc::clone(&baseline));
            std::thread::spawn(move || {
                let ids: Vec<i64> = (0..ROWS as i64).collect();
                let mut out = vec![0f32; ROWS as usize * DIM];
                while !stop.load(Ordering::Relaxed) {
                    let floor = baseline
                        .lock()
                        .expect("lock")
                        .map(|(entries, v)| v + (applied.get() - entries) as u32);
                    if store.gather(&[table], &ids, &mut out).is_err() {
                        seen.failed.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    match versions(&out) {
                        Ok(vs) => {
                            if let Some(floor) = floor
                                && let Some(r) = vs.iter().position(|&v| v < floor)
                            {
                                seen.stale.lock().expect("lock").push(format!(
                                    "row {r} at version {} after version {floor} was applied",
                                    vs[r]
                                ));
                            }
                            seen.rows.fetch_add(vs.len() as u64, Ordering::Relaxed);
                            let newest = vs.iter().copied().max().unwrap_or(0);
                            seen.newest.fetch_max(newest, Ordering::Relaxed);
                        }
                        Err(torn) => seen.torn.lock().expect("lock").push(torn),
                    }
                }
            })
        })
        .collect();
    for v in 2..=BEFORE_KILL {
        write_until_done(&mut writer, v).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let failed_before_kill = seen.failed.load(Ordering::Relaxed);
    *baseline.lock().expect("lock") = None;

    // The master that holds the update stream is killed by PID; the writer waits for its replica to take over.
    let stream = stream_key(MODEL, 1);
    let victim = own
        .masters()
        .into_iter()
        .find(|p| own.cli(p, &["exists", &stream]).trim() == "1")
        .expect("the stream's master");
    own.kill(&victim);
    let killed = Instant::now();
    write_until_done(&mut writer, BEFORE_KILL + 1).await;
    eprintln!(
        "master {victim} (the stream's) killed; version {} written {:?} later",
        BEFORE_KILL + 1,
        killed.elapsed()
    );
    // The killed node is started again and rejoins as a replica. The failover and the restart can leave the cluster
    // connection stuck (its slot-map refresh waits on a request it no longer polls); the client's watchdog
    // (src/embedding/remote/redis.rs) replaces it, so the next version must become visible.
    own.restart(&victim);
    eprintln!(
        "master {victim} started again and rejoined as a replica {:?} after the kill",
        killed.elapsed()
    );
    write_until_done(&mut writer, BEFORE_KILL + 2).await;
    let rejoined =
        tokio::task::block_in_place(|| wait_for_version(store.as_ref(), table, BEFORE_KILL + 2));
    eprintln!(
        "after the failover and the restart, version {} visible to the store {rejoined:?} after it was announced \
         (the store's connection replaced {} times)",
        BEFORE_KILL + 2,
        ctx.metrics.tier_client_replaced().get()
    );
    // Its rows may have been fetched before its entry was applied (they were not cached): give the follower time
    // to apply every entry written so far before counting from here.
    tokio::time::sleep(Duration::from_millis(500)).await;
    *baseline.lock().expect("lock") = Some((applied.get(), BEFORE_KILL + 2));
    // Back to back: fetches sent before an update are still in flight when it is applied.
    for v in BEFORE_KILL + 3..=LAST {
        write_until_done(&mut writer, v).await;
    }
    let last = tokio::task::block_in_place(|| wait_for_version(store.as_ref(), table, LAST));
    stop.store(true, Ordering::Relaxed);
    for g in gatherers {
        g.join().expect("gatherer");
    }
    let torn = seen.torn.lock().expect("lock").clone();
    let stale = seen.stale.lock().expect("lock").clone();
    eprintln!(
        "{} rows gathered whole (newest version seen {}), {} gathers failed while a master was down, {} torn; \
         {} stale; the last version visible to the store {last:?} after it was announced",
        seen.rows.load(Ordering::Relaxed),
        seen.newest.load(Ordering::Relaxed),
        seen.failed.load(Ordering::Relaxed),
        torn.len(),
        stale.len()
    );
    assert!(torn.is_empty(), "torn rows: {torn:?}");
    assert!(stale.is_empty(), "stale rows: {stale:?}");
    assert_eq!(failed_before_kill, 0, "gathers failed before any fault");
    assert!(seen.rows.load(Ordering::Relaxed) >= 10 * ROWS);

    // The server's own follower reached the last version too: its scores are the reference's, bit for bit.
    let started = Instant::now();
    loop {
        let got = rank(MODEL).await;
        let same = got
            .iter()
            .zip(&expected)
            .all(|(a, b)| (*a as f32).to_bits() == (*b as f32).to_bits());
        if same {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the served scores did not reach the last version's: {got:?} vs {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (_, metrics) = server.get("/metrics").await;
    let sample = |name: &str| metric_sample(&metrics, &format!("{name}{{model=\"{MODEL}\"}}"));
    let entries = sample("recserve_embedding_update_entries_total");
    assert!(entries >= f64::from(LAST - 2), "{entries} entries applied");
    assert!(sample("recserve_embedding_updated_rows_total") >= entries * ROWS as f64);
    assert_eq!(
        sample("recserve_embedding_update_visible_seconds_count"),
        entries
    );
    assert!(
        metric_sample(
            &metrics,
            &format!(
                "recserve_embedding_update_errors_total{{kind=\"connection\",model=\"{MODEL}\"}}"
            )
        ) >= 1.0,
        "the stream's master was killed, so reading it must have failed at least once"
    );
    assert_eq!(sample("recserve_embedding_update_following"), 1.0);
    drop(store);
    server.stop().await.expect("clean shutdown");
}
