//! End to end: recall served through an IVF index built by the toolchain (`python -m recserve_models index`).
//! With `nprobe = nlist` every answer equals the fixture's exact reference (ids, order, float32 score bits), for
//! the fp32 and the int8 catalogue, queries one by one and all at once; the index's metrics count what it did; and
//! a stale or mismatched index is refused at load, naming the index file and the mismatch.

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{TestServer, config, copy_dir, fixture_dir, fixture_repo, metric_sample as sample};
use recserve::service::StartError;
use serde_json::Value;

/// Runs `python -m recserve_models index VERSION ARGS…` (the test venv's python, or `RECSERVE_TEST_PYTHON`).
fn build_index(version: &Path, args: &[&str]) {
    let python = std::env::var("RECSERVE_TEST_PYTHON").unwrap_or_else(|_| "python".to_owned());
    let models = Path::new(env!("CARGO_MANIFEST_DIR")).join("models");
    let path = match std::env::var("PYTHONPATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", models.display()),
        _ => models.display().to_string(),
    };
    let output = std::process::Command::new(&python)
        .args(["-m", "recserve_models", "index"])
        .arg(version)
        .args(args)
        .env("PYTHONPATH", path)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {python:?} ({e}): run scripts/test.sh, or source scripts/env.sh")
        });
    assert!(
        output.status.success(),
        "index failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn recall_cases() -> Vec<Value> {
    let text = std::fs::read_to_string(fixture_dir().join("recall-cases.json"))
        .expect("recall-cases.json: run scripts/test.sh, which writes the fixture");
    let all: Value = serde_json::from_str(&text).expect("JSON");
    all["recall_cases"]
        .as_array()
        .expect("recall_cases")
        .clone()
}

fn items(value: &Value) -> Vec<(u64, u32)> {
    value
        .as_array()
        .expect("items array")
        .iter()
        .map(|item| {
            let score = item["score"].as_f64().expect("score") as f32;
            (item["id"].as_u64().expect("id"), score.to_bits())
        })
        .collect()
}

/// A copy of the fixture repository whose two recall models have an index of `nlist` lists.
fn indexed_repo(dir: &Path, nlist: usize, nprobe: usize) -> PathBuf {
    let repo = dir.join("repo");
    copy_dir(&fixture_repo(), &repo);
    for model in ["lightgcn", "lightgcn-int8"] {
        build_index(
            &repo.join(model).join("1"),
            &[
                "--nlist",
                &nlist.to_string(),
                "--nprobe",
                &nprobe.to_string(),
            ],
        );
    }
    repo
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_every_list_probed_the_index_answers_exactly_what_exact_recall_does() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = indexed_repo(dir.path(), 8, 8);
    let cases = recall_cases();
    assert!(cases.len() >= 12, "{} cases", cases.len());
    let server = Arc::new(
        TestServer::start(config(&repo, |a| {
            a.shards = Some(3);
            a.executors = Some(2);
        }))
        .await,
    );
    let check = |case: &Value, status: u16, body: &Value| {
        assert_eq!(status, 200, "{}: {body}", case["what"]);
        assert_eq!(
            body["history_used"], case["history_used"],
            "{}",
            case["what"]
        );
        assert_eq!(
            items(&body["items"]),
            items(&case["expected"]),
            "{} ({})",
            case["what"],
            case["model"]
        );
    };
    for case in &cases {
        let path = format!(
            "/v1/models/{}/recall",
            case["model"].as_str().expect("model")
        );
        let (status, body) = server.post(&path, &case["request"]).await;
        check(case, status, &body);
    }
    let mut tasks = Vec::new();
    for _ in 0..3 {
        for case in &cases {
            let (server, case) = (Arc::clone(&server), case.clone());
            tasks.push(tokio::spawn(async move {
                let path = format!(
                    "/v1/models/{}/recall",
                    case["model"].as_str().expect("model")
                );
                let (status, body) = server.post(&path, &case["request"]).await;
                (case, status, body)
            }));
        }
    }
    for task in tasks {
        let (case, status, body) = task.await.expect("request task");
        check(&case, status, &body);
    }
    let (_, metrics) = server.get("/metrics").await;
    let index_queries = sample(
        &metrics,
        "recserve_recall_queries_total{model=\"lightgcn\",search=\"index\"}",
    );
    let lists = sample(
        &metrics,
        "recserve_recall_index_lists_scanned_total{model=\"lightgcn\"}",
    );
    let codes = sample(
        &metrics,
        "recserve_recall_index_codes_scored_total{model=\"lightgcn\"}",
    );
    let reranked = sample(
        &metrics,
        "recserve_recall_index_candidates_reranked_total{model=\"lightgcn\"}",
    );
    assert!(index_queries >= 12.0, "{index_queries}");
    // Every query scans all 8 lists, whose 300 items are all scored; candidates are at least k per query.
    assert_eq!(lists, 8.0 * index_queries);
    assert_eq!(codes, 300.0 * index_queries);
    assert!(reranked >= index_queries && reranked <= codes, "{reranked}");
    Arc::into_inner(server)
        .expect("no other reference")
        .stop()
        .await
        .expect("clean shutdown");
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).expect("read");
    assert!(text.contains(from), "{from:?} not in {}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).expect("write");
}

/// Changes one byte of the item table's tensor in the version's `tables.safetensors`.
fn change_item_table(version: &Path) {
    let path = version.join("tables.safetensors");
    let mut bytes = std::fs::read(&path).expect("read tables");
    let at = {
        let tensors = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
        let data = tensors.tensor("item").expect("item tensor").data();
        data.as_ptr() as usize - bytes.as_ptr() as usize + 5
    };
    bytes[at] ^= 0x01;
    std::fs::write(&path, bytes).expect("write tables");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_or_mismatched_index_is_refused_at_load_naming_the_file() {
    type Breaker = fn(&Path);
    let cases: Vec<(&str, Breaker, &str)> = vec![
        (
            "the item table changed after the build",
            change_item_table,
            "the table changed since the index was built",
        ),
        (
            "nprobe beyond nlist",
            |v| edit(&v.join("model.toml"), "nprobe = 4", "nprobe = 9"),
            "recall.index.nprobe = 9 is more than the index's 8 lists",
        ),
        (
            "the index of another model",
            |v| {
                let other = v
                    .parent()
                    .and_then(Path::parent)
                    .expect("repo")
                    .join("lightgcn-int8/1");
                std::fs::copy(other.join("ivf.safetensors"), v.join("ivf.safetensors"))
                    .expect("copy");
            },
            "the index is stale or for another table",
        ),
        (
            "an index file that is not one",
            |v| std::fs::write(v.join("ivf.safetensors"), b"garbage").expect("write"),
            "not a valid safetensors file",
        ),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let built = indexed_repo(dir.path(), 8, 4);
    for (what, breaker, needle) in cases {
        let copy = tempfile::tempdir().expect("tempdir");
        let repo = copy.path().join("repo");
        copy_dir(&built, &repo);
        let version = repo.join("lightgcn/1");
        breaker(&version);
        let server = TestServer::spawn(config(&repo, |_| {})).await;
        match server.finished().await {
            Err(StartError::Load(e)) => {
                assert_eq!(e.path, version.join("ivf.safetensors"), "{what}: {e}");
                assert!(
                    e.problem.contains(needle),
                    "{what}: expected {needle:?} in {:?}",
                    e.problem
                );
            }
            other => panic!("{what}: expected a load error, got {other:?}"),
        }
    }
}

/// The answer's `(id, score bits)` pairs, for a `/v1` recall body.
fn answer(body: &Value) -> Vec<(u64, u32)> {
    items(&body["items"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_may_ask_for_exact_or_its_own_nprobe_on_every_route() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("repo");
    copy_dir(&fixture_repo(), &repo);
    // Only lightgcn gets an index (8 lists, 2 probed by default); lightgcn-int8 stays exact.
    build_index(&repo.join("lightgcn/1"), &["--nlist", "8", "--nprobe", "2"]);
    let server = TestServer::start(config(&repo, |a| {
        a.config = Some(fixture_dir().join("recserve.toml"));
    }))
    .await;
    let cases: Vec<Value> = recall_cases()
        .into_iter()
        .filter(|c| c["model"] == "lightgcn")
        .collect();
    assert!(cases.len() >= 6);
    let path = "/v1/models/lightgcn/recall";
    for case in &cases {
        let want = items(&case["expected"]);
        for extra in [
            serde_json::json!({"exact": true}),
            serde_json::json!({"nprobe": 8}),
        ] {
            let mut request = case["request"].clone();
            for (key, value) in extra.as_object().expect("object") {
                request[key] = value.clone();
            }
            let (status, body) = server.post(path, &request).await;
            assert_eq!(status, 200, "{}: {body}", case["what"]);
            assert_eq!(answer(&body), want, "{} with {extra}", case["what"]);
        }
        // The default (2 of 8 lists) answers as many items, best first.
        let (status, body) = server.post(path, &case["request"]).await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(answer(&body).len(), want.len(), "{}", case["what"]);
    }
    let refused = [
        (
            path,
            serde_json::json!({"user_id": 1, "nprobe": 9}),
            "nprobe: is 9; it must be from 1 to the 8 lists of the model's index",
        ),
        (
            path,
            serde_json::json!({"user_id": 1, "nprobe": 0}),
            "nprobe: is 0",
        ),
        (
            path,
            serde_json::json!({"user_id": 1, "exact": true, "nprobe": 3}),
            "nprobe: cannot be sent together with exact = true",
        ),
        (
            "/v1/models/lightgcn-int8/recall",
            serde_json::json!({"user_id": 1, "nprobe": 2}),
            "nprobe: is for models with an IVF index, and this model has none",
        ),
        (
            "/v1/recommend/fixture",
            serde_json::json!({"user_id": 3, "user": {"fields": {"age": 2, "city": 7}, "dense": [13.0, 2.0]}, "nprobe": 99}),
            "nprobe: is 99",
        ),
        (
            "/v2/models/lightgcn/infer",
            serde_json::json!({"inputs": [{"name": "user_id", "datatype": "INT64", "shape": [1], "data": [1]}],
                               "parameters": {"nprobe": 99}}),
            "parameters.nprobe: is 99",
        ),
    ];
    for (route, body, says) in refused {
        let (status, reply) = server.post(route, &body).await;
        assert_eq!(status, 400, "{route} {body}: {reply}");
        let message = reply["error"].as_str().expect("error message");
        assert!(
            message.contains(says),
            "{route}: expected {says:?} in {message:?}"
        );
    }

    // Recommend and KServe with every list probed answer as exact recall does.
    let user = serde_json::json!({"fields": {"age": 2, "city": 7}, "dense": [13.0, 2.0]});
    let recommend = |search: Value| {
        let mut body = serde_json::json!({"user_id": 3, "user": user.clone()});
        for (key, value) in search.as_object().expect("object") {
            body[key] = value.clone();
        }
        body
    };
    let (s1, exact) = server
        .post(
            "/v1/recommend/fixture",
            &recommend(serde_json::json!({"exact": true})),
        )
        .await;
    let (s2, all_lists) = server
        .post(
            "/v1/recommend/fixture",
            &recommend(serde_json::json!({"nprobe": 8})),
        )
        .await;
    assert_eq!((s1, s2), (200, 200), "{exact} {all_lists}");
    assert_eq!(exact["items"], all_lists["items"]);
    let infer = |parameters: Value| {
        serde_json::json!({
            "inputs": [{"name": "user_id", "datatype": "INT64", "shape": [2], "data": [3, 5]}],
            "parameters": parameters,
        })
    };
    let (s1, exact) = server
        .post(
            "/v2/models/lightgcn/infer",
            &infer(serde_json::json!({"k": 10, "exact": true})),
        )
        .await;
    let (s2, all_lists) = server
        .post(
            "/v2/models/lightgcn/infer",
            &infer(serde_json::json!({"k": 10, "nprobe": 8})),
        )
        .await;
    assert_eq!((s1, s2), (200, 200), "{exact} {all_lists}");
    assert_eq!(exact["outputs"], all_lists["outputs"]);
    // Many users of one request are searched through the index together (2 of 8 lists, shared scans): each user's
    // rows are what that user gets alone.
    let users = [3, 5, 0, 7, 3, 11, 2, 9, 40, 1];
    let ask = |ids: &[i64]| {
        serde_json::json!({
            "inputs": [{"name": "user_id", "datatype": "INT64", "shape": [ids.len()], "data": ids}],
            "parameters": {"k": 7},
        })
    };
    let (status, together) = server.post("/v2/models/lightgcn/infer", &ask(&users)).await;
    assert_eq!(status, 200, "{together}");
    for (i, &user) in users.iter().enumerate() {
        let (status, alone) = server
            .post("/v2/models/lightgcn/infer", &ask(&[user]))
            .await;
        assert_eq!(status, 200, "{alone}");
        for (t, a) in together["outputs"]
            .as_array()
            .expect("outputs")
            .iter()
            .zip(alone["outputs"].as_array().expect("outputs"))
        {
            let rows = t["data"].as_array().expect("data");
            assert_eq!(
                rows[i * 7..(i + 1) * 7],
                a["data"].as_array().expect("data")[..],
                "user {user}, output {}",
                t["name"]
            );
        }
    }
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        sample(
            &metrics,
            "recserve_recall_queries_total{model=\"lightgcn\",search=\"exact\"}"
        ) >= cases.len() as f64
    );
    server.stop().await.expect("clean shutdown");
}
