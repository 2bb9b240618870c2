//! End to end against a real Redis Cluster (`scripts/redis-cluster.sh`, which `scripts/test.sh` starts and names
//! in `RECSERVE_TEST_REDIS`): the demo DeepFM models published with `python -m recserve_models publish` and served
//! from the Redis tier, with their table files removed from the server's repository, score the demo's held-out
//! requests bit for bit as the same models served from mapped files; a version without its completion marker, or
//! whose row counts differ from `model.toml`, is refused naming the table; rows that cannot be fetched follow
//! their table's `unfetched` policy (the default row, counted; or 503).

mod common;

use std::path::Path;

use common::redis::{
    OwnCluster, cluster, move_to_redis, redis_config, redis_config_on, redis_model, redis_model_on,
    scores,
};
use common::{TestServer, copy_dir, demo_cases, metric_sample};
use recserve::service::StartError;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_tier_scores_like_the_mapped_files_bit_for_bit() {
    let repository = tempfile::tempdir().expect("tempdir");
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for demo in ["deepfm", "deepfm-fp32"] {
        copy_dir(
            &root.join("models/demo").join(demo),
            &repository.path().join(demo),
        );
        redis_model(
            repository.path(),
            demo,
            &format!("{demo}-redis"),
            "unavailable",
            &[],
        );
    }
    let server = TestServer::start(redis_config(repository.path())).await;
    // The warm-up (every batch bucket, twice) is not traffic: a fresh server has looked up and fetched nothing.
    let (_, fresh) = server.get("/metrics").await;
    for model in ["deepfm-redis", "deepfm-fp32-redis"] {
        for series in [
            format!("recserve_embedding_cache_lookups_total{{model=\"{model}\",result=\"hit\"}}"),
            format!("recserve_embedding_cache_lookups_total{{model=\"{model}\",result=\"miss\"}}"),
            format!("recserve_embedding_tier_rows_fetched_total{{model=\"{model}\"}}"),
            format!("recserve_embedding_tier_fetch_duration_seconds_count{{model=\"{model}\"}}"),
        ] {
            assert_eq!(
                metric_sample(&fresh, &series),
                0.0,
                "{series} before any request"
            );
        }
    }
    let all = demo_cases();
    let cases = all["cases"].as_array().expect("cases");
    let mut compared = [0usize; 2];
    // Twice: the first pass fetches rows from the cluster, the second reads most from the cache.
    for (pass, count) in compared.iter_mut().enumerate() {
        for case in cases {
            let model = case["model"].as_str().expect("model");
            let (status, mapped) = server
                .post(&format!("/v1/models/{model}/rank"), &case["request"])
                .await;
            assert_eq!(status, 200, "{model}: {mapped}");
            let (status, tiered) = server
                .post(&format!("/v1/models/{model}-redis/rank"), &case["request"])
                .await;
            assert_eq!(status, 200, "{model}-redis: {tiered}");
            let (a, b) = (scores(&mapped), scores(&tiered));
            assert_eq!(a.len(), b.len());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert_eq!(
                    (*x as f32).to_bits(),
                    (*y as f32).to_bits(),
                    "pass {pass}, {} ({model}), candidate {i}: mapped {x}, redis {y}",
                    case["what"]
                );
            }
            *count += a.len();
        }
    }
    assert!(
        compared[0] >= 400,
        "only {} candidates compared",
        compared[0]
    );
    let (_, metrics) = server.get("/metrics").await;
    for model in ["deepfm-redis", "deepfm-fp32-redis"] {
        let fetched = metric_sample(
            &metrics,
            &format!("recserve_embedding_tier_rows_fetched_total{{model=\"{model}\"}}"),
        );
        let hits = metric_sample(
            &metrics,
            &format!("recserve_embedding_cache_lookups_total{{model=\"{model}\",result=\"hit\"}}"),
        );
        assert!(
            fetched > 0.0 && hits > 0.0,
            "{model}: fetched {fetched}, hits {hits}"
        );
    }
    eprintln!("bit-identical scores: {} candidates per pass", compared[0]);
    server.stop().await.expect("clean shutdown");
}

/// Removes row keys from the cluster, as a half-published or damaged version would lack them.
async fn delete_keys(keys: &[String]) {
    let nodes: Vec<String> = cluster()
        .split(',')
        .map(|n| format!("redis://{n}"))
        .collect();
    let client = redis::cluster::ClusterClient::new(nodes).expect("cluster client");
    let mut connection = client.get_async_connection().await.expect("connect");
    for key in keys {
        let _: i64 = redis::cmd("DEL")
            .arg(key)
            .query_async(&mut connection)
            .await
            .expect("DEL");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_not_fetched_read_the_default_row_or_fail_with_503() {
    let repository = tempfile::tempdir().expect("tempdir");
    redis_model(
        repository.path(),
        "deepfm",
        "policy",
        "default_row",
        &[("C2", "unavailable")],
    );
    // Row 7 of C1 (unfetched = "default_row") and row 9 of C2 (unfetched = "unavailable") are gone.
    use recserve_core::embedding::remote::redis::row_key;
    delete_keys(&[
        row_key("policy", 1, 64, "C1", 7),
        row_key("policy", 1, 64, "C2", 9),
    ])
    .await;
    let server = TestServer::start(redis_config(repository.path())).await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let request: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("models/demo/rank-request.json")).expect("request"),
    )
    .expect("json");
    let with = |table: &str, id: i64| {
        let mut r = request.clone();
        r["user"]["fields"][table] = Value::from(id);
        r
    };
    let (status, missing) = server.post("/v1/models/policy/rank", &with("C1", 7)).await;
    assert_eq!(status, 200, "{missing}");
    let (status, default) = server.post("/v1/models/policy/rank", &with("C1", 0)).await;
    assert_eq!(status, 200, "{default}");
    assert_eq!(
        scores(&missing),
        scores(&default),
        "row 7 of C1 must read the default row 0"
    );
    let (status, other) = server.post("/v1/models/policy/rank", &with("C1", 8)).await;
    assert_eq!(status, 200);
    assert_ne!(
        scores(&other),
        scores(&default),
        "a fetched row differs from the default row"
    );
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        metric_sample(
            &metrics,
            "recserve_embedding_unfetched_default_total{model=\"policy\",table=\"C1\"}"
        ) >= 1.0
    );
    assert!(
        metric_sample(
            &metrics,
            "recserve_embedding_tier_errors_total{kind=\"missing\",model=\"policy\"}"
        ) >= 1.0
    );
    let (status, body) = server.post("/v1/models/policy/rank", &with("C2", 9)).await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body.to_string()
            .contains("could not be fetched from the Redis tier"),
        "{body}"
    );
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_without_its_marker_or_with_other_row_counts_is_refused_naming_the_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Never published.
    let repository = tempfile::tempdir().expect("tempdir");
    let version = repository.path().join("unpublished/1");
    copy_dir(
        &root.join("models/demo/deepfm"),
        &repository.path().join("unpublished"),
    );
    move_to_redis(&version.join("model.toml"), "unavailable", &[]);
    let server = TestServer::spawn(redis_config(repository.path())).await;
    match server.finished().await {
        Err(StartError::Load(e)) => {
            assert_eq!(e.path, version);
            assert!(e.problem.contains("no completion marker"), "{}", e.problem);
            assert!(
                e.problem.contains("rs1:{unpublished/1}:published"),
                "{}",
                e.problem
            );
        }
        other => panic!("expected a load error, got {other:?}"),
    }
    // Published, then model.toml says C6 has another row count.
    let repository = tempfile::tempdir().expect("tempdir");
    redis_model(repository.path(), "deepfm", "recounted", "unavailable", &[]);
    let toml = repository.path().join("recounted/1/model.toml");
    let text = std::fs::read_to_string(&toml).expect("model.toml");
    std::fs::write(
        &toml,
        text.replace(
            "name = \"C6\"\nfile = \"tables.safetensors\"\nrows = 26",
            "name = \"C6\"\nfile = \"tables.safetensors\"\nrows = 25",
        ),
    )
    .expect("write");
    let server = TestServer::spawn(redis_config(repository.path())).await;
    match server.finished().await {
        Err(StartError::Load(e)) => assert!(
            e.problem
                .contains("table \"C6\": the Redis tier holds 26 rows of it, but model.toml declares rows = 25"),
            "{}",
            e.problem
        ),
        other => panic!("expected a load error, got {other:?}"),
    }
}

/// The rank request with every user field moved to ids no request asked for before (`round` apart), so that its
/// rows are not in the cache.
fn fresh(request: &Value, round: i64) -> Value {
    let mut r = request.clone();
    let fields = r["user"]["fields"].as_object_mut().expect("fields");
    for value in fields.values_mut() {
        *value = Value::from(value.as_i64().expect("id") + round);
    }
    r
}

fn sample(metrics: &str, name: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(name) && l.contains("model=\"faults\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A cluster of the test's own, the demo DeepFM published to it as model `faults` with every table
/// `unfetched = "default_row"`, a server of it, and the demo's rank request.
/// A `/v1` rank request to the `faults` model with deadline `deadline_ms`: status, body, and how long it took.
async fn rank_within(
    server: &TestServer,
    body: Value,
    deadline_ms: u64,
) -> (u16, Value, std::time::Duration) {
    let started = std::time::Instant::now();
    let response = server
        .client
        .post(server.url("/v1/models/faults/rank"))
        .header("content-type", "application/json")
        .header("x-recserve-deadline-ms", deadline_ms.to_string())
        .body(body.to_string())
        .send()
        .await
        .expect("send");
    let status = response.status().as_u16();
    let body: Value = response.json().await.expect("json");
    (status, body, started.elapsed())
}

async fn faults() -> (OwnCluster, tempfile::TempDir, TestServer, Value) {
    let own = OwnCluster::start();
    let repository = tempfile::tempdir().expect("tempdir");
    redis_model_on(
        &own.nodes,
        repository.path(),
        "deepfm",
        "faults",
        "default_row",
        &[],
    );
    let server = TestServer::start(redis_config_on(&own.nodes, repository.path())).await;
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let request: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("models/demo/rank-request.json")).expect("request"),
    )
    .expect("json");
    (own, repository, server, request)
}

/// Slow nodes, then a master killed by PID, under a table policy of default rows: every request is answered
/// (cached rows, default rows for the rest) without waiting past its deadline, the replica takes over, and the
/// client fetches from it without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_dead_nodes_are_answered_from_cache_and_default_rows_and_the_client_follows_the_failover()
 {
    let (own, _repository, server, request) = faults().await;
    let rank = |body: Value, deadline_ms: u64| rank_within(&server, body, deadline_ms);
    let (status, cached, _) = rank(request.clone(), 5000).await;
    assert_eq!(status, 200, "{cached}");

    // Slow: every master sleeps 3 s. A request with uncached rows and a 300 ms deadline is answered with default
    // rows within its deadline; its cached twin with the same scores as before.
    let sleepers: Vec<_> = own
        .masters()
        .into_iter()
        .map(|p| {
            std::process::Command::new("redis-cli")
                .args(["-p", &p, "DEBUG", "SLEEP", "3"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("DEBUG SLEEP")
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let (status, slow, took) = rank(fresh(&request, 1), 300).await;
    assert_eq!(status, 200, "{slow}");
    // The fetch gives up after --redis-fetch-timeout-ms (50 ms), well inside the deadline; the bound leaves room
    // for a loaded CI machine's client and HTTP.
    assert!(
        took < std::time::Duration::from_millis(300),
        "answered after {took:?}: past its 300 ms deadline (nodes sleep 3 s)"
    );
    let (status, again, _) = rank(request.clone(), 300).await;
    assert_eq!(status, 200, "{again}");
    assert_eq!(
        scores(&again),
        scores(&cached),
        "cached rows answer while the nodes sleep"
    );
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        sample(
            &metrics,
            "recserve_embedding_tier_errors_total{kind=\"timeout\""
        ) >= 1.0,
        "{metrics}"
    );
    assert!(sample(&metrics, "recserve_embedding_unfetched_default_total") >= 1.0);
    eprintln!(
        "slow nodes: a request with uncached rows and a 300 ms deadline was answered in {took:?}"
    );
    for mut s in sleepers {
        let _ = s.wait();
    }

    // Dead: one master killed by its PID. Requests keep being answered; the replica takes over; fetched rows
    // come back without errors.
    let victim = own.masters().into_iter().next().expect("a master");
    let pid =
        std::fs::read_to_string(own.dir.path().join(format!("{victim}.pid"))).expect("pid file");
    let killed = std::time::Instant::now();
    assert!(
        std::process::Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .expect("kill")
            .success()
    );
    let (mut answered, mut failed, mut round) = (0, 0, 10);
    let mut recovered = None;
    while killed.elapsed() < std::time::Duration::from_secs(30) {
        round += 1;
        let (_, before) = server.get("/metrics").await;
        let errors_before = sample(&before, "recserve_embedding_tier_errors_total");
        let (status, body, _) = rank(fresh(&request, round), 500).await;
        if status == 200 {
            answered += 1;
        } else {
            failed += 1;
            eprintln!("failed: {status} {body}");
        }
        let (_, after) = server.get("/metrics").await;
        if killed.elapsed() > std::time::Duration::from_millis(500)
            && sample(&after, "recserve_embedding_tier_errors_total") == errors_before
        {
            recovered = Some(killed.elapsed());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    let (_, metrics) = server.get("/metrics").await;
    eprintln!(
        "master on port {victim} killed: {answered} requests answered, {failed} failed, {} ids read default rows; \
         rows fetched without error again {recovered:?} after the kill",
        sample(&metrics, "recserve_embedding_unfetched_default_total")
    );
    assert_eq!(failed, 0);
    let recovered =
        recovered.expect("the client never fetched without errors after the failover (30 s)");
    assert!(recovered > std::time::Duration::ZERO);
    server.stop().await.expect("clean shutdown");
}

/// A master stopped by SIGSTOP (its connections stay open, nothing answers): the first batch that misses rows of
/// its hash-tag groups waits `--redis-fetch-timeout-ms` for them and opens those groups' breakers; later batches do
/// not ask for them (`skipped`), so no batch waits for the stopped node again, and every request is answered with
/// default rows for them. When the node continues, the probes close the breakers without a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_master_is_waited_for_once_then_skipped_until_a_probe_finds_it_back() {
    let (own, _repository, server, request) = faults().await;
    let rank = |body: &Value| {
        let answer = rank_within(&server, body.clone(), 2000);
        async move {
            let (status, body, _) = answer.await;
            (status, body)
        }
    };
    let (status, body) = rank(&request).await;
    assert_eq!(status, 200, "{body}");

    // The request asks for row 105 of C1 (not cached yet); its victim is the master that holds that row.
    let fresh_body = fresh(&request, 100);
    use recserve_core::embedding::remote::redis::row_key;
    let key = row_key("faults", 1, 64, "C1", 105);
    let victim = own
        .masters()
        .into_iter()
        .find(|p| own.cli(p, &["EXISTS", &key]).trim() == "1")
        .expect("a master holds the row");
    let pid = std::fs::read_to_string(own.dir.path().join(format!("{victim}.pid")))
        .expect("pid file")
        .trim()
        .to_owned();
    let signal = |name: &str| {
        assert!(
            std::process::Command::new("kill")
                .args([name, &pid])
                .status()
                .expect("kill")
                .success()
        )
    };
    signal("-STOP");
    let (status, body) = rank(&fresh_body).await;
    let (_, first) = server.get("/metrics").await;
    assert_eq!(status, 200, "{body}");
    let timeouts = sample(
        &first,
        "recserve_embedding_tier_errors_total{kind=\"timeout\"",
    );
    let skipped = sample(
        &first,
        "recserve_embedding_tier_errors_total{kind=\"skipped\"",
    );
    let open = sample(&first, "recserve_embedding_tier_open_groups");
    assert!(
        timeouts >= 1.0 && open >= 1.0,
        "the first batch waited for the stopped node: {timeouts} rows timed out, {open} groups open"
    );
    // Quickly, well inside the cluster's 2 s node timeout, so that no failover changes the picture.
    let again = 10;
    for _ in 0..again {
        let (status, body) = rank(&fresh_body).await;
        assert_eq!(status, 200, "{body}");
    }
    let (_, later) = server.get("/metrics").await;
    signal("-CONT");
    assert_eq!(
        sample(
            &later,
            "recserve_embedding_tier_errors_total{kind=\"timeout\""
        ),
        timeouts,
        "a batch after the first waited for the stopped node"
    );
    let skipped_later = sample(
        &later,
        "recserve_embedding_tier_errors_total{kind=\"skipped\"",
    );
    assert!(
        skipped_later >= skipped + f64::from(again),
        "each later batch skips the open groups' rows: {skipped} then {skipped_later}"
    );
    assert!(sample(&later, "recserve_embedding_unfetched_default_total") >= f64::from(again));
    eprintln!(
        "stopped master {victim}: the first batch timed out on {timeouts} rows and opened {open} groups; \
         {again} more batches skipped {} rows without waiting",
        skipped_later - skipped
    );

    // Continued: batches that meet an open group let a probe through once per backoff (at most 1 s), and its
    // answer closes the group.
    let continued = std::time::Instant::now();
    let mut closed = None;
    while continued.elapsed() < std::time::Duration::from_secs(30) {
        let (status, body) = rank(&fresh_body).await;
        assert_eq!(status, 200, "{body}");
        let (_, metrics) = server.get("/metrics").await;
        if sample(&metrics, "recserve_embedding_tier_open_groups") == 0.0 {
            closed = Some(continued.elapsed());
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let closed = closed.expect("the breakers did not close within 30 s of the node continuing");
    let (_, before) = server.get("/metrics").await;
    let (status, body) = rank(&fresh(&request, 200)).await;
    assert_eq!(status, 200, "{body}");
    let (_, after) = server.get("/metrics").await;
    assert_eq!(
        sample(&after, "recserve_embedding_tier_errors_total"),
        sample(&before, "recserve_embedding_tier_errors_total"),
        "rows are fetched without errors once the breakers closed"
    );
    assert!(
        sample(&after, "recserve_embedding_tier_rows_fetched_total")
            > sample(&before, "recserve_embedding_tier_rows_fetched_total")
    );
    eprintln!("the node continued: every breaker closed {closed:?} later");
    server.stop().await.expect("clean shutdown");
}
