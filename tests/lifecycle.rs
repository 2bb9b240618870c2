//! End to end: model versions change while the server serves. With `--model-control explicit` the repository API
//! (Triton's, behind the admin token) loads, reloads and unloads; with `poll` the server follows the repository.
//! A swap under concurrent requests fails none of them, and every answer is the one of the version that gave it
//! (the response names it); a broken new version is refused naming its file while the old one goes on; the
//! replaced version is released once its last request ends.

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    TestServer, cases, config, copy_dir, fixture_dir, fixture_repo, metric_sample, run_python,
};
use recserve::config::ModelControl;
use serde_json::{Value, json};

const TOKEN: &str = "test-admin-token";

/// A repository with model `swap` in two versions (1: the fixture's fp32 DeepFM, 2: its int8 one, the same
/// contract) beside the fixture's other models, and the token file. Returns the repository and the token file.
fn repository(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let repo = dir.join("repo");
    copy_dir(&fixture_repo(), &repo);
    copy_dir(&fixture_repo().join("deepfm-fp32/1"), &repo.join("swap/1"));
    copy_dir(&fixture_repo().join("deepfm-int8/1"), &repo.join("swap/2"));
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("write token");
    (repo, token)
}

async fn start(repo: &Path, token: Option<&Path>, control: ModelControl) -> TestServer {
    let token = token.map(Path::to_path_buf);
    TestServer::start(config(repo, |a| {
        a.model_control = Some(control);
        a.admin_token_file = token;
        a.repository_poll_s = Some(1);
        a.config = Some(fixture_dir().join("recserve.toml"));
    }))
    .await
}

/// A repository call with the token (or another `authorization`).
async fn admin(server: &TestServer, path: &str, authorization: Option<&str>) -> (u16, Value) {
    let mut post = server.client.post(server.url(path)).body("{}");
    if let Some(value) = authorization {
        post = post.header("authorization", value);
    }
    let resp = post.send().await.expect("POST");
    let status = resp.status().as_u16();
    let text = resp.text().await.expect("body");
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

/// The first rank case of the fixture's fp32 DeepFM (its contract is the one of both versions of `swap`).
fn rank_request() -> Value {
    cases()["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["model"] == "deepfm-fp32" && c["what"] == "100 candidates")
        .expect("a 100-candidate case")["request"]
        .clone()
}

fn scores(body: &Value) -> Vec<f64> {
    body["scores"]
        .as_array()
        .expect("scores")
        .iter()
        .map(|s| s["score"].as_f64().expect("score"))
        .collect()
}

fn index_of(index: &Value, name: &str) -> Value {
    index
        .as_array()
        .expect("index array")
        .iter()
        .find(|e| e["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("{name} not in the index {index}"))
}

/// Waits (up to 30 s) until `/metrics` says no replaced version of `model` is draining.
async fn wait_drained(server: &TestServer, model: &str) -> String {
    let gauge = format!("recserve_model_versions_draining{{model=\"{model}\"}}");
    for _ in 0..300 {
        let (_, metrics) = server.get("/metrics").await;
        if metrics.contains(&gauge) && metric_sample(&metrics, &gauge) == 0.0 {
            return metrics;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("a replaced version of {model} was never released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn versions_swap_under_load_without_a_failure_and_each_answer_comes_from_its_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, token) = repository(dir.path());
    let server = Arc::new(start(&repo, Some(&token), ModelControl::Explicit).await);
    let request = rank_request();
    let path = "/v1/models/swap/rank";

    // Each version's answer, asked while it serves alone.
    let mut answers = std::collections::HashMap::new();
    let (status, body) = server.post(path, &request).await;
    assert_eq!((status, &body["version"]), (200, &json!(2)), "{body}");
    answers.insert(2, scores(&body));
    std::fs::rename(repo.join("swap/2"), repo.join("swap/.2-aside")).expect("hide version 2");
    let (status, body) = admin(&server, "/v2/repository/models/swap/load", Some(&bearer())).await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server.post(path, &request).await;
    assert_eq!((status, &body["version"]), (200, &json!(1)), "{body}");
    answers.insert(1, scores(&body));
    assert_ne!(
        answers[&1], answers[&2],
        "the two versions answer differently"
    );

    // Clients send without pause while the versions are swapped back and forth.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (server, request, stop) = (Arc::clone(&server), request.clone(), Arc::clone(&stop));
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (status, body) = server.post(path, &request).await;
                    seen.push((status, body));
                }
                seen
            })
        })
        .collect();
    let swaps = 6;
    for swap in 0..swaps {
        let (from, to) = if swap % 2 == 0 {
            ("swap/.2-aside", "swap/2")
        } else {
            ("swap/2", "swap/.2-aside")
        };
        std::fs::rename(repo.join(from), repo.join(to)).expect("move version 2");
        let (status, body) =
            admin(&server, "/v2/repository/models/swap/load", Some(&bearer())).await;
        assert_eq!(status, 200, "swap {swap}: {body}");
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut by_version = std::collections::HashMap::<u64, usize>::new();
    for client in clients {
        for (status, body) in client.await.expect("client") {
            assert_eq!(status, 200, "no request fails during a swap: {body}");
            let version = body["version"].as_u64().expect("version");
            let want = &answers[&version];
            let got = scores(&body);
            assert!(
                got.len() == want.len() && got.iter().zip(want).all(|(g, w)| (g - w).abs() <= 1e-5),
                "an answer of version {version} differs from that version's"
            );
            *by_version.entry(version).or_default() += 1;
        }
    }
    assert!(
        by_version.len() == 2,
        "both versions answered under load: {by_version:?}"
    );
    let metrics = wait_drained(&server, "swap").await;
    assert_eq!(
        metric_sample(
            &metrics,
            "recserve_model_loads_total{model=\"swap\",outcome=\"loaded\"}"
        ),
        // The load at start, the first explicit load, then the swaps.
        f64::from(swaps + 2)
    );
    assert!(
        metrics.contains("recserve_model_info{device=\"cpu\",kind=\"deepfm\",model=\"swap\",precision=\"fp32\",version=\"1\"} 1")
            && !metrics.contains("model=\"swap\",precision=\"int8\",version=\"2\"}"),
        "model_info names only the version serving"
    );
    Arc::into_inner(server)
        .expect("no client holds the server")
        .stop()
        .await
        .expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_version_is_refused_naming_its_file_and_the_serving_one_goes_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, token) = repository(dir.path());
    let server = start(&repo, Some(&token), ModelControl::Explicit).await;
    let request = rank_request();
    let version3 = repo.join("swap/3");
    /// What is broken, how to break a copy of version 1, and the file the refusal must name.
    type Breakage = (&'static str, Box<dyn Fn(&Path)>, &'static str);
    let breakages: [Breakage; 3] = [
        (
            "truncated tables",
            Box::new(|dir: &Path| {
                let file = dir.join("tables.safetensors");
                let bytes = std::fs::read(&file).expect("read");
                std::fs::write(&file, &bytes[..bytes.len() / 2]).expect("truncate");
            }),
            "tables.safetensors",
        ),
        (
            "a model.toml that does not parse",
            Box::new(|dir: &Path| {
                std::fs::write(
                    dir.join("model.toml"),
                    "format_version = 1\nkind = \"xgboost\"\n",
                )
                .expect("write");
            }),
            "model.toml",
        ),
        (
            "a graph whose dense input does not fit model.toml",
            Box::new(|dir: &Path| {
                let toml = dir.join("model.toml");
                // One dense feature more in model.toml than the graph's dense input takes.
                let text = std::fs::read_to_string(&toml).expect("read");
                let fewer = text.replacen("dense_features = [", "dense_features = [\"extra\", ", 1);
                assert_ne!(fewer, text, "model.toml lists dense features");
                std::fs::write(&toml, fewer).expect("write");
            }),
            "dense.onnx",
        ),
    ];
    for (what, breaking, file) in breakages {
        let _ = std::fs::remove_dir_all(&version3);
        copy_dir(&repo.join("swap/1"), &version3);
        breaking(&version3);
        let (status, body) =
            admin(&server, "/v2/repository/models/swap/load", Some(&bearer())).await;
        let error = body["error"].as_str().unwrap_or_default().to_owned();
        assert_eq!(status, 400, "{what}: {body}");
        assert!(
            error.starts_with("model \"swap\" was not loaded:")
                && error.contains(&format!("swap/3/{file}")),
            "{what}: the error names the file: {error}"
        );
        let (status, body) = server.post("/v1/models/swap/rank", &request).await;
        assert_eq!(
            (status, &body["version"]),
            (200, &json!(2)),
            "{what}: version 2 goes on: {body}"
        );
        let (_, index) = admin(&server, "/v2/repository/index", Some(&bearer())).await;
        let entry = index_of(&index, "swap");
        assert_eq!(
            (&entry["state"], &entry["version"]),
            (&json!("READY"), &json!("2")),
            "{entry}"
        );
        assert!(
            entry["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("version 3 failed to load")),
            "{entry}"
        );
        let (_, models) = server.get("/v1/models").await;
        let models: Value = serde_json::from_str(&models).expect("json");
        let swap = models["models"]
            .as_array()
            .expect("models")
            .iter()
            .find(|m| m["name"] == "swap")
            .expect("swap listed");
        assert_eq!(
            (&swap["state"], &swap["load"]["version"]),
            (&json!("failed"), &json!(3)),
            "{swap}"
        );
    }
    let (_, metrics) = server.get("/metrics").await;
    assert_eq!(
        metric_sample(
            &metrics,
            "recserve_model_loads_total{model=\"swap\",outcome=\"invalid_model\"}"
        ),
        3.0
    );
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_repository_api_needs_the_token_and_explicit_control() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, token) = repository(dir.path());
    let server = start(&repo, Some(&token), ModelControl::Explicit).await;
    for path in [
        "/v2/repository/index",
        "/v2/repository/models/swap/load",
        "/v2/repository/models/swap/unload",
    ] {
        let (status, body) = admin(&server, path, None).await;
        assert_eq!(status, 401, "{path} without a token: {body}");
        let (status, body) = admin(&server, path, Some("Bearer wrong")).await;
        assert_eq!(status, 403, "{path} with a wrong token: {body}");
        let (status, body) = admin(&server, path, Some(TOKEN)).await;
        assert_eq!(status, 401, "{path} without the Bearer scheme: {body}");
    }
    let resp = server
        .client
        .post(server.url("/v2/repository/index"))
        .send()
        .await
        .expect("POST");
    assert_eq!(
        resp.headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer")
    );
    // Inference never needs the token.
    let (status, _) = server.post("/v1/models/swap/rank", &rank_request()).await;
    assert_eq!(status, 200);

    // A model a pipeline needs cannot be unloaded; another can, and comes back with a load.
    let (status, body) = admin(
        &server,
        "/v2/repository/models/lightgcn/unload",
        Some(&bearer()),
    )
    .await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        body["error"],
        "model \"lightgcn\" cannot be unloaded: pipeline \"featured\" uses it as its recall_model; load \
         another version of it instead, or remove the pipeline from the config file and restart"
    );
    let (status, body) = admin(
        &server,
        "/v2/repository/models/swap/unload",
        Some(&bearer()),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = server.post("/v1/models/swap/rank", &rank_request()).await;
    assert_eq!(status, 404, "an unloaded model is not served");
    let (_, index) = admin(&server, "/v2/repository/index", Some(&bearer())).await;
    assert_eq!(index_of(&index, "swap")["state"], "UNAVAILABLE", "{index}");
    let (_, ready) = admin(&server, "/v2/repository/index", Some(&bearer())).await;
    assert!(
        ready
            .as_array()
            .is_some_and(|a| a.iter().any(|e| e["state"] == "READY"))
    );
    let (status, body) = admin(&server, "/v2/repository/models/swap/load", Some(&bearer())).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = server.post("/v1/models/swap/rank", &rank_request()).await;
    assert_eq!(status, 200, "loaded again");
    let (status, body) = admin(&server, "/v2/repository/models/nope/load", Some(&bearer())).await;
    assert_eq!(status, 400, "{body}");
    server.stop().await.expect("clean shutdown");

    // Without a token file the API is disabled; without explicit control, load and unload are refused.
    let server = start(&repo, None, ModelControl::Explicit).await;
    let (status, body) = admin(&server, "/v2/repository/index", Some(&bearer())).await;
    assert_eq!(status, 403, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("--admin-token-file")),
        "{body}"
    );
    server.stop().await.expect("clean shutdown");
    let server = start(&repo, Some(&token), ModelControl::None).await;
    let (status, body) = admin(&server, "/v2/repository/models/swap/load", Some(&bearer())).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("--model-control explicit")),
        "{body}"
    );
    let (status, _) = admin(&server, "/v2/repository/index", Some(&bearer())).await;
    assert_eq!(status, 200, "the index works in every mode");
    server.stop().await.expect("clean shutdown");
}

/// Loads of names the repository does not hold (invalid, made up, very long) are refused and leave no trace: no
/// entry in the index or `/v1/models`, no `/metrics` series, whatever their number. Their errors cut the name
/// and never show where the repository lies on the server's disk; nor does a version that fails to load.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn loads_of_names_the_repository_does_not_hold_leave_no_trace() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, token) = repository(dir.path());
    let server = start(&repo, Some(&token), ModelControl::Explicit).await;
    let (_, metrics_before) = server.get("/metrics").await;
    let long = "x".repeat(5000);
    let names = [
        "..%2F..%2F..%2Fetc",
        "nope",
        "made-up-0",
        "made-up-1",
        long.as_str(),
    ];
    let repo_text = repo.display().to_string();
    for name in names {
        let (status, body) = admin(
            &server,
            &format!("/v2/repository/models/{name}/load"),
            Some(&bearer()),
        )
        .await;
        let error = body["error"].as_str().unwrap_or_default();
        assert_eq!(status, 400, "{body}");
        assert!(error.len() < 600, "the name is cut: {} bytes", error.len());
        assert!(!error.contains(&repo_text), "no server path: {error}");
    }
    let (_, body) = admin(&server, "/v2/repository/models/nope/load", Some(&bearer())).await;
    assert_eq!(
        body["error"],
        "model \"nope\" was not loaded: the repository has no model \"nope\" (expected \
         <repository>/nope/<version>/model.toml)"
    );
    let (_, index) = admin(&server, "/v2/repository/index", Some(&bearer())).await;
    let listed: Vec<&str> = index
        .as_array()
        .expect("index")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    let (_, models) = server.get("/v1/models").await;
    let (_, metrics) = server.get("/metrics").await;
    for name in ["etc", "nope", "made-up", "xxxxxxxxxx"] {
        assert!(
            !listed.iter().any(|l| l.contains(name)),
            "{name} in the index: {listed:?}"
        );
        assert!(!models.contains(name), "{name} in /v1/models");
        assert!(!metrics.contains(name), "{name} in /metrics");
    }
    assert!(
        metrics.len() < metrics_before.len() + 2048,
        "/metrics grew from {} to {} bytes",
        metrics_before.len(),
        metrics.len()
    );

    // A version that fails to load names its file relative to the repository, in the answer and the index.
    copy_dir(&repo.join("swap/1"), &repo.join("swap/3"));
    std::fs::write(
        repo.join("swap/3/model.toml"),
        "format_version = 1\nkind = \"x\"\n",
    )
    .expect("write");
    let (status, body) = admin(&server, "/v2/repository/models/swap/load", Some(&bearer())).await;
    assert_eq!(status, 400, "{body}");
    let error = body["error"].as_str().unwrap_or_default();
    assert!(
        error.starts_with("model \"swap\" was not loaded: swap/3/model.toml: "),
        "{error}"
    );
    let (_, index) = admin(&server, "/v2/repository/index", Some(&bearer())).await;
    let reason = index_of(&index, "swap")["reason"].to_string();
    assert!(
        reason.contains("swap/3/model.toml") && !reason.contains(&repo_text),
        "{reason}"
    );

    server.stop().await.expect("clean shutdown");
}

/// Writes `value` over every value of row `row` of the fp32 table `table` in the safetensors file `file`.
fn set_row(file: &Path, table: &str, row: usize, value: f32) {
    let mut bytes = std::fs::read(file).expect("read tables");
    let header_len = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + header_len]).expect("header");
    let tensor = &header[table];
    assert_eq!(tensor["dtype"], "F32", "{tensor}");
    let dim = tensor["shape"][1].as_u64().expect("dim") as usize;
    let start = 8 + header_len + tensor["data_offsets"][0].as_u64().expect("offset") as usize;
    for column in 0..dim {
        let at = start + (row * dim + column) * 4;
        bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
    }
    std::fs::write(file, bytes).expect("write tables");
}

/// A version whose table holds a NaN is refused naming the table and the row, and the serving version goes on; a
/// row of finite values so large that the score overflows is served as a 500 naming the problem (and counted),
/// never as a 200 with a null score.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_finite_tables_are_refused_at_load_and_non_finite_scores_are_not_served() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, token) = repository(dir.path());
    let server = start(&repo, Some(&token), ModelControl::Explicit).await;
    let request = rank_request();
    let user_field = request["user"]["fields"]
        .as_object()
        .expect("user fields")
        .iter()
        .next()
        .map(|(name, id)| (name.clone(), id.as_u64().expect("id") as usize))
        .expect("a user field");

    copy_dir(&repo.join("swap/1"), &repo.join("swap/3"));
    set_row(&repo.join("swap/3/tables.safetensors"), "C2", 7, f32::NAN);
    let (status, body) = admin(&server, "/v2/repository/models/swap/load", Some(&bearer())).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        body["error"],
        "model \"swap\" was not loaded: swap/3/tables.safetensors: table \"C2\" row 7: column 0 is not a \
         finite number (NaN): every score that row enters would be too; write the table again without it"
    );
    let (status, body) = server.post("/v1/models/swap/rank", &request).await;
    assert_eq!((status, &body["version"]), (200, &json!(2)), "{body}");

    // Finite, but too large for the model's sums: the scores overflow.
    std::fs::remove_dir_all(repo.join("swap/3")).expect("remove");
    copy_dir(&repo.join("swap/1"), &repo.join("swap/3"));
    set_row(
        &repo.join("swap/3/tables.safetensors"),
        &user_field.0,
        user_field.1,
        3e38,
    );
    let (status, body) = admin(&server, "/v2/repository/models/swap/load", Some(&bearer())).await;
    assert_eq!(status, 200, "finite values load: {body}");
    let (status, body) = server.post("/v1/models/swap/rank", &request).await;
    assert_eq!(status, 500, "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.starts_with(
            "model \"swap\" computed a non-finite score (NaN) for row 0 of the request"
        )),
        "{body}"
    );
    let (_, metrics) = server.get("/metrics").await;
    assert_eq!(
        metric_sample(&metrics, "recserve_non_finite_scores_total{model=\"swap\"}"),
        1.0
    );
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn polling_swaps_in_a_complete_new_version_and_unloads_a_removed_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, token) = repository(dir.path());
    std::fs::rename(repo.join("swap/2"), dir.path().join("swap-2")).expect("version 2 aside");
    let server = start(&repo, Some(&token), ModelControl::Poll).await;
    let version = |body: &Value| body["version"].as_u64();
    let (_, body) = server.post("/v1/models/swap/rank", &rank_request()).await;
    assert_eq!(version(&body), Some(1));
    let (status, _) = admin(&server, "/v2/repository/models/swap/load", Some(&bearer())).await;
    assert_eq!(status, 409, "polling servers refuse explicit loads");

    // A writer prepares the version under a name that is not a version, then renames it: complete at once.
    copy_dir(&dir.path().join("swap-2"), &repo.join("swap/.incoming"));
    std::fs::rename(repo.join("swap/.incoming"), repo.join("swap/2")).expect("publish version 2");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = server.post("/v1/models/swap/rank", &rank_request()).await;
        assert_eq!(status, 200, "{body}");
        if version(&body) == Some(2) {
            break;
        }
        assert!(Instant::now() < deadline, "version 2 never served");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    std::fs::remove_dir_all(repo.join("deepfm-fp16")).expect("remove a model");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = server
            .post("/v1/models/deepfm-fp16/rank", &rank_request())
            .await;
        if status == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the removed model was never unloaded"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A model the pipeline uses stays served when its directory goes, and the log says so once, not every poll.
    capture_log();
    std::fs::remove_dir_all(repo.join("lightgcn")).expect("remove the pipeline's recall model");
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let (status, body) = server
        .post("/v1/models/lightgcn/recall", &json!({"user_id": 1, "k": 5}))
        .await;
    assert_eq!(status, 200, "{body}");
    let said = captured_log()
        .lines()
        .filter(|l| l.contains("the model's directory is gone") && l.contains("lightgcn"))
        .count();
    assert_eq!(said, 1, "said once over 4 polls:\n{}", captured_log());
    server.stop().await.expect("clean shutdown");
}

/// The log of this test binary from the first [`capture_log`] on (a global subscriber: the server's poll thread
/// logs outside the test's tasks).
static LOG: std::sync::Mutex<Vec<u8>> = std::sync::Mutex::new(Vec::new());

struct Captured;

impl std::io::Write for Captured {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        LOG.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_log() {
    let _ = tracing_subscriber::fmt()
        .with_writer(|| Captured)
        .with_ansi(false)
        .try_init();
}

fn captured_log() -> String {
    String::from_utf8_lossy(
        &LOG.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
    .into_owned()
}

/// With models that change while the server runs (`poll`, `explicit`), a model that fails to load at start does not
/// stop the server: it is left out, its status says why and its load counts as failed, the others serve; polling
/// loads it once its directory is fixed. (With `none` a failed model still stops the start: `tests/startup.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_fails_at_start_is_left_out_while_the_others_serve_and_loaded_once_fixed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, token) = repository(dir.path());
    let toml = repo.join("swap/2/model.toml");
    let good = std::fs::read_to_string(&toml).expect("read");
    std::fs::write(&toml, format!("{good}\ngarbage = \n")).expect("break swap/2");
    let server = start(&repo, Some(&token), ModelControl::Poll).await;

    let (status, body) = server
        .post("/v1/models/deepfm-int8/rank", &rank_request())
        .await;
    assert_eq!(status, 200, "the other models serve: {body}");
    let (status, body) = server.post("/v1/models/swap/rank", &rank_request()).await;
    assert_eq!(status, 404, "{body}");
    let (_, index) = admin(&server, "/v2/repository/index", Some(&bearer())).await;
    let entry = index_of(&index, "swap");
    assert_eq!(entry["state"], json!("UNAVAILABLE"), "{entry}");
    assert!(
        entry["reason"]
            .as_str()
            .is_some_and(|r| r.contains("swap/2/model.toml") && r.contains("TOML parse error")),
        "{entry}"
    );
    let (_, metrics) = server.get("/metrics").await;
    assert_eq!(
        metric_sample(
            &metrics,
            "recserve_model_loads_total{model=\"swap\",outcome=\"invalid_model\"}"
        ),
        1.0
    );

    std::fs::write(&toml, good).expect("fix swap/2");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = server.post("/v1/models/swap/rank", &rank_request()).await;
        if status == 200 {
            assert_eq!(body["version"], json!(2), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the fixed model was never loaded: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.stop().await.expect("clean shutdown");
}

/// Runs tests/repository_client.py (the real tritonclient's repository calls) against the server.
async fn run_repository_client(server: &TestServer, model: &str) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("results.json");
    let args = [
        "--http",
        &server.addr.to_string(),
        "--grpc",
        &server.grpc_addr.to_string(),
        "--token",
        TOKEN,
        "--model",
        model,
        "--out",
        &out.display().to_string(),
    ]
    .map(str::to_owned)
    .to_vec();
    run_python("repository_client.py", args).await;
    serde_json::from_str(&std::fs::read_to_string(&out).expect("results")).expect("results JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_indexes_unloads_and_loads_over_http_and_grpc_with_the_token_only() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (repo, token) = repository(dir.path());
    let server = start(&repo, Some(&token), ModelControl::Explicit).await;
    let results = run_repository_client(&server, "swap").await;
    for protocol in ["http", "grpc"] {
        let refused = &results[format!("{protocol}_without_token")];
        for call in ["index", "unload", "load"] {
            assert_eq!(
                refused[call]["ok"], false,
                "{protocol} {call} without the token: {refused}"
            );
            let status = refused[call]["status"].as_str().unwrap_or_default();
            assert!(
                status == "401" || status == "StatusCode.UNAUTHENTICATED",
                "{protocol} {call}: {refused}"
            );
        }
        assert_eq!(
            refused["ready_after_unload"]["value"], true,
            "nothing was unloaded: {refused}"
        );

        let allowed = &results[protocol];
        assert_eq!(allowed["index"]["ok"], true, "{protocol}: {allowed}");
        let index = allowed["index"]["value"].as_array().expect("index");
        let swap = index
            .iter()
            .find(|e| e["name"] == "swap")
            .expect("swap in the index");
        assert_eq!(
            (&swap["state"], &swap["version"]),
            (&json!("READY"), &json!("2")),
            "{swap}"
        );
        assert_eq!(allowed["unload"]["ok"], true, "{protocol}: {allowed}");
        let unloaded = &allowed["ready_after_unload"];
        assert!(
            unloaded["ok"] == false || unloaded["value"] == false,
            "{protocol}: unloaded, not ready: {allowed}"
        );
        assert_eq!(allowed["load"]["ok"], true, "{protocol}: {allowed}");
        assert_eq!(
            allowed["ready_after_load"]["value"], true,
            "{protocol}: loaded again: {allowed}"
        );
    }
    server.stop().await.expect("clean shutdown");
}
