//! End to end: recall on a real server over the generated test repository. Every answer equals the fixture's
//! numpy evaluation of the documented formula (the same ids in the same order, float32 scores bit for bit), with
//! one shard or several, queries sent one by one or all at once (batched); a user's full training history gives
//! the user's own vector minus its layer-0 part, as docs/model-repository.md says; bad input gets a 400 naming
//! the field while concurrent good requests keep their exact answers.

mod common;

use std::collections::HashMap;
use std::sync::Arc;

use common::{TestServer, config, fixture_dir, fixture_repo, metric_sample as sample};
use serde_json::{Value, json};

fn recall_cases() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("recall-cases.json"))
        .expect("recall-cases.json: run scripts/test.sh, which writes the fixture");
    serde_json::from_str(&text).expect("recall-cases.json is JSON")
}

fn recall_path(model: &str) -> String {
    format!("/v1/models/{model}/recall")
}

/// `(id, score)` pairs of a recall response or of a case's `expected`.
fn items(value: &Value) -> Vec<(u64, f32)> {
    value
        .as_array()
        .expect("items array")
        .iter()
        .map(|item| {
            (
                item["id"].as_u64().expect("id"),
                item["score"].as_f64().expect("score") as f32,
            )
        })
        .collect()
}

/// The server's answer equals the expected one: same ids, same order, float32 scores bit for bit; and for a
/// `history` the same count of items with a history vector, and the same fallback when none has one.
fn assert_same(case: &Value, status: u16, body: &Value) {
    assert_eq!(status, 200, "{}: {body}", case["what"]);
    assert_eq!(body["model"], case["model"], "{}", case["what"]);
    assert_eq!(
        body["history_used"], case["history_used"],
        "{}: {body}",
        case["what"]
    );
    assert_eq!(
        body["fallback"], case["fallback"],
        "{}: {body}",
        case["what"]
    );
    let (got, want) = (items(&body["items"]), items(&case["expected"]));
    let same = got.len() == want.len()
        && got
            .iter()
            .zip(&want)
            .all(|(a, b)| a.0 == b.0 && a.1.to_bits() == b.1.to_bits());
    assert!(
        same,
        "{} ({}): the server answers\n{:?}\nbut the reference is\n{:?}",
        case["what"],
        case["model"],
        &got[..got.len().min(12)],
        &want[..want.len().min(12)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_equal_the_reference_in_every_layout_one_by_one_and_batched() {
    let all = recall_cases();
    let cases = all["recall_cases"]
        .as_array()
        .expect("recall_cases")
        .clone();
    assert!(cases.len() >= 12, "{} cases", cases.len());
    for shards in [1usize, 3, 64] {
        let server = Arc::new(
            TestServer::start(config(&fixture_repo(), |a| {
                a.shards = Some(shards);
                a.executors = Some(2);
            }))
            .await,
        );
        for case in &cases {
            let model = case["model"].as_str().expect("model");
            let (status, body) = server.post(&recall_path(model), &case["request"]).await;
            assert_same(case, status, &body);
        }
        // Every case at once, several times over: the batcher scores many queries per pass, and each must get
        // exactly its own answer.
        let mut tasks = Vec::new();
        for round in 0..4 {
            for case in &cases {
                let (server, case) = (Arc::clone(&server), case.clone());
                tasks.push(tokio::spawn(async move {
                    let model = case["model"].as_str().expect("model");
                    let path = if round % 2 == 0 {
                        recall_path(model)
                    } else {
                        format!("/v1/models/{model}/versions/1/recall")
                    };
                    let (status, body) = server.post(&path, &case["request"]).await;
                    assert_same(&case, status, &body);
                }));
            }
        }
        for task in tasks {
            task.await.expect("request task");
        }
        let (_, metrics) = server.get("/metrics").await;
        let rows = sample(&metrics, "recserve_batch_rows_sum{model=\"lightgcn\"}");
        let batches = sample(&metrics, "recserve_batch_rows_count{model=\"lightgcn\"}");
        eprintln!(
            "{shards} shards: lightgcn ran {rows} queries in {batches} batches (warm-up included)"
        );
        Arc::into_inner(server)
            .expect("no other reference")
            .stop()
            .await
            .expect("clean shutdown");
    }
}

/// Reads an f32 tensor `[rows, dim]` from a safetensors file of the fixture repository.
fn read_table(path: &std::path::Path, name: &str) -> (Vec<f32>, usize) {
    let bytes = std::fs::read(path).expect("read table file");
    let tensors = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let view = tensors.tensor(name).expect("tensor");
    let dim = view.shape()[1];
    let values = view
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    (values, dim)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_training_history_gives_the_user_vector_without_its_layer_zero_part() {
    let all = recall_cases();
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let (items_table, dim) = read_table(
        &fixture_repo().join("lightgcn/1/tables.safetensors"),
        "item",
    );
    let catalogue = items_table.len() / dim;
    for case in all["history_identity"]
        .as_array()
        .expect("history_identity")
    {
        let user = case["user"].as_u64().expect("user");
        let layers = case["layers"].as_f64().expect("layers");
        let layer0: Vec<f64> = case["layer0"]
            .as_array()
            .expect("layer0")
            .iter()
            .map(|v| v.as_f64().expect("float"))
            .collect();
        let by_id = |body: &Value| -> HashMap<u64, f64> {
            body["items"]
                .as_array()
                .expect("items")
                .iter()
                .map(|i| {
                    (
                        i["id"].as_u64().expect("id"),
                        i["score"].as_f64().expect("score"),
                    )
                })
                .collect()
        };
        let (status, by_user) = server
            .post(
                "/v1/models/lightgcn/recall",
                &json!({"user_id": user, "k": catalogue}),
            )
            .await;
        assert_eq!(status, 200, "{by_user}");
        let (status, by_history) = server
            .post(
                "/v1/models/lightgcn/recall",
                &json!({"history": case["history"], "k": catalogue}),
            )
            .await;
        assert_eq!(status, 200, "{by_history}");
        let (by_user, by_history) = (by_id(&by_user), by_id(&by_history));
        assert_eq!(by_user.len(), catalogue);
        let mut worst: f64 = 0.0;
        for (item, row) in items_table.chunks_exact(dim).enumerate() {
            let layer0_score: f64 = layer0.iter().zip(row).map(|(a, &b)| a * f64::from(b)).sum();
            let predicted = by_user[&(item as u64)] - layer0_score / (layers + 1.0);
            let diff = (by_history[&(item as u64)] - predicted).abs();
            worst = worst.max(diff);
        }
        // Float32 tables and sums of a few dozen terms of magnitude < 1: rounding stays far below 1e-5.
        assert!(
            worst <= 1e-5,
            "user {user}: history score − (user score − <e_u^(0), e_i> / (K + 1)) is up to {worst:e}"
        );
    }
    server.stop().await.expect("clean shutdown");
}

/// (what, path, body, status, text the error must contain).
fn bad_requests() -> Vec<(&'static str, String, String, u16, &'static str)> {
    let lightgcn = recall_path("lightgcn");
    let int8 = recall_path("lightgcn-int8");
    let body = |v: Value| v.to_string();
    vec![
        (
            "user id = users (reject table)",
            lightgcn.clone(),
            body(json!({"user_id": 48, "k": 3})),
            400,
            "user_id: id 48 is outside the user table \"user\" (ids 0 to 47), which rejects unknown ids",
        ),
        (
            "negative user id",
            lightgcn.clone(),
            body(json!({"user_id": -1, "k": 3})),
            400,
            "user_id: id -1 is outside",
        ),
        (
            "history id = items",
            lightgcn.clone(),
            body(json!({"history": [1, 300], "k": 3})),
            400,
            "history[1]: id 300 is outside the history table \"history\" (ids 0 to 299)",
        ),
        (
            "excluded id outside a reject item table",
            lightgcn.clone(),
            body(json!({"user_id": 1, "k": 3, "exclude": [2, -1]})),
            400,
            "exclude[1]: id -1 is outside the item table \"item\"",
        ),
        (
            "k = 0",
            lightgcn.clone(),
            body(json!({"user_id": 1, "k": 0})),
            400,
            "k: must be at least 1",
        ),
        (
            "k beyond the catalogue",
            lightgcn.clone(),
            body(json!({"user_id": 1, "k": 301})),
            400,
            "k: is 301, more than the 300 items of the catalogue",
        ),
        (
            "negative k",
            lightgcn.clone(),
            body(json!({"user_id": 1, "k": -3})),
            400,
            "k: invalid value: integer `-3`",
        ),
        (
            "user id and history",
            lightgcn.clone(),
            body(json!({"user_id": 1, "history": [2], "k": 3})),
            400,
            "history: cannot be sent together with user_id",
        ),
        (
            "neither user id nor history",
            lightgcn.clone(),
            body(json!({"k": 3})),
            400,
            "user_id: is missing",
        ),
        (
            "empty history",
            lightgcn.clone(),
            body(json!({"history": [], "k": 3})),
            400,
            "history: must hold at least one item id",
        ),
        (
            "history longer than --max-history",
            lightgcn.clone(),
            body(json!({"history": [1, 2, 3, 4, 5, 6], "k": 3})),
            400,
            "history: holds 6 ids, more than the limit of 5 (--max-history)",
        ),
        (
            "exclude longer than --max-exclude",
            lightgcn.clone(),
            body(json!({"user_id": 1, "k": 3, "exclude": [1, 2, 3, 4, 5, 6, 7, 8]})),
            400,
            "exclude: holds 8 ids, more than the limit of 7 (--max-exclude)",
        ),
        (
            "history id of the wrong type",
            lightgcn.clone(),
            r#"{"history": [1, "2"], "k": 3}"#.to_owned(),
            400,
            "history[1]: invalid type: string \"2\", expected i64",
        ),
        (
            "unknown key",
            lightgcn.clone(),
            body(json!({"user_id": 1, "k": 3, "top_k": 3})),
            400,
            "unknown field `top_k`",
        ),
        (
            "malformed JSON",
            lightgcn.clone(),
            "{\"user_id\": ".to_owned(),
            400,
            "malformed request body",
        ),
        (
            "history on a model without a history table",
            int8.clone(),
            body(json!({"history": [1], "k": 3})),
            400,
            "history: is not supported by this model (its model.toml has no recall.history_table)",
        ),
        (
            "recall on a ranking model",
            recall_path("deepfm-fp32"),
            body(json!({"user_id": 1, "k": 3})),
            400,
            "model \"deepfm-fp32\" is a deepfm model and does not support recall",
        ),
        (
            "rank on a recall model",
            "/v1/models/lightgcn/rank".to_owned(),
            body(json!({"candidates": [{"id": 1}]})),
            400,
            "model \"lightgcn\" is a lightgcn model and does not support rank",
        ),
        (
            "unknown model",
            recall_path("nope"),
            body(json!({"user_id": 1, "k": 3})),
            404,
            "model \"nope\" is not served",
        ),
        (
            "unknown version",
            "/v1/models/lightgcn/versions/2/recall".to_owned(),
            body(json!({"user_id": 1, "k": 3})),
            404,
            "model \"lightgcn\" version 2 is not served (serving version 1)",
        ),
        (
            "version not a number",
            "/v1/models/lightgcn/versions/x/recall".to_owned(),
            body(json!({"user_id": 1, "k": 3})),
            400,
            "version: \"x\" is not a version number",
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_400s_naming_the_field_while_good_ones_keep_their_answers() {
    let all = recall_cases();
    let good: Vec<Value> = all["recall_cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| {
            c["request"]["history"]
                .as_array()
                .is_none_or(|h| h.len() <= 5)
                && c["request"]["exclude"]
                    .as_array()
                    .is_none_or(|e| e.len() <= 7)
        })
        .cloned()
        .collect();
    assert!(good.len() >= 6, "{} small cases", good.len());
    let server = Arc::new(
        TestServer::start(config(&fixture_repo(), |a| {
            a.max_history = Some(5);
            a.max_exclude = Some(7);
        }))
        .await,
    );
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..3 {
        let (server, good, stop) = (Arc::clone(&server), good.clone(), Arc::clone(&stop));
        clients.push(tokio::spawn(async move {
            let mut answered = 0usize;
            let mut i = c;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) || answered == 0 {
                let case = &good[i % good.len()];
                let model = case["model"].as_str().expect("model");
                let (status, body) = server.post(&recall_path(model), &case["request"]).await;
                assert_same(case, status, &body);
                answered += 1;
                i += 1;
            }
            answered
        }));
    }
    for _ in 0..2 {
        for (what, path, body, status, needle) in bad_requests() {
            let (got, answer) = server.post_raw(&path, body).await;
            assert_eq!(got, status, "{what}: {answer}");
            let message = answer["error"].as_str().unwrap_or_default();
            assert!(
                message.contains(needle),
                "{what}: expected {needle:?} in {message:?}"
            );
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut answered = 0;
    for client in clients {
        answered += client.await.expect("client");
    }
    assert!(answered >= 3, "good traffic ran alongside: {answered}");
    Arc::into_inner(server)
        .expect("no other reference")
        .stop()
        .await
        .expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_scored_items_top_k_runs_and_default_rows() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let (_, before) = server.get("/metrics").await;
    let scored_before = sample(
        &before,
        "recserve_recall_items_scored_total{model=\"lightgcn-int8\"}",
    );
    let runs_before = sample(
        &before,
        "recserve_topk_duration_seconds_count{model=\"lightgcn-int8\"}",
    );
    for user in [-1, 3, 1_000_000] {
        let (status, body) = server
            .post(
                "/v1/models/lightgcn-int8/recall",
                &json!({"user_id": user, "k": 2}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }
    let (_, after) = server.get("/metrics").await;
    let runs = sample(
        &after,
        "recserve_topk_duration_seconds_count{model=\"lightgcn-int8\"}",
    ) - runs_before;
    assert!(
        (1.0..=3.0).contains(&runs),
        "{runs} top-K runs for 3 queries"
    );
    assert_eq!(
        sample(
            &after,
            "recserve_recall_items_scored_total{model=\"lightgcn-int8\"}"
        ) - scored_before,
        3.0 * 257.0,
        "3 queries × 257 items"
    );
    assert_eq!(
        sample(
            &after,
            "recserve_embedding_oov_total{model=\"lightgcn-int8\",table=\"user\"}"
        ),
        2.0,
        "ids -1 and 1000000 read the default row"
    );
    assert_eq!(
        sample(
            &after,
            "recserve_requests_total{code=\"200\",endpoint=\"recall\",model=\"lightgcn-int8\",pipeline=\"\",protocol=\"v1\",version=\"1\"}"
        ),
        3.0
    );
    // GET /v1/models describes the recall models and their shards.
    let (status, text) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    let models: Value = serde_json::from_str(&text).expect("json");
    let lightgcn = models["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["name"] == "lightgcn-int8")
        .expect("lightgcn-int8 is listed");
    assert_eq!(lightgcn["kind"], "lightgcn");
    assert_eq!(lightgcn["precision"], "int8");
    assert_eq!(lightgcn["device"], "cpu");
    let tables: Vec<(&str, &str)> = lightgcn["tables"]
        .as_array()
        .expect("tables")
        .iter()
        .map(|t| {
            (
                t["name"].as_str().expect("name"),
                t["storage"].as_str().expect("storage"),
            )
        })
        .collect();
    assert_eq!(tables, vec![("user", "fp16"), ("item", "int8")]);
    server.stop().await.expect("clean shutdown");
}
