//! End to end: recommend (recall then rank in one call) through the test fixture's pipeline. Answers equal the
//! fixture's reference (recall by the documented formula, features from the item feature table, DeepFM in
//! float64); timings and stage metrics are reported; bad requests get 4xx naming the field; and a pipeline or
//! item feature table that cannot work stops the server at start-up with a message naming it.

mod common;

use std::path::Path;

use common::{TestServer, config, copy_dir, fixture_dir, fixture_repo, metric_sample as sample};
use recserve::config::BatchDelay;
use serde_json::{Value, json};

fn recall_cases() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("recall-cases.json"))
        .expect("recall-cases.json: run scripts/test.sh, which writes the fixture");
    serde_json::from_str(&text).expect("recall-cases.json is JSON")
}

/// A server on the fixture repository with the fixture's pipeline configuration.
async fn start() -> TestServer {
    TestServer::start(config(&fixture_repo(), |a| {
        a.config = Some(fixture_dir().join("recserve.toml"))
    }))
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_equal_the_reference_with_timings_and_stage_metrics() {
    let all = recall_cases();
    let server = start().await;
    let pipeline = &all["pipeline"];
    let (status, text) = server.get("/v1/pipelines").await;
    assert_eq!(status, 200);
    let listed: Value = serde_json::from_str(&text).expect("json");
    let entry = |p: &Value| {
        json!({
            "name": p["name"],
            "recall_model": {"name": p["recall_model"], "version": 1},
            "ranking_model": {"name": p["ranking_model"], "version": 1},
            "candidates": p["candidates"],
            "k": p["k"],
        })
    };
    // Listed by name.
    assert_eq!(
        listed,
        json!({"pipelines": [entry(&all["featured_pipeline"]), entry(pipeline)]})
    );
    let cases = all["recommend_cases"].as_array().expect("recommend_cases");
    check_cases(&server, pipeline, cases).await;

    // One observation per stage per answered request; ranking is skipped when nothing was recalled.
    let (_, metrics) = server.get("/metrics").await;
    let stage = |s: &str| {
        sample(
            &metrics,
            &format!(
                "recserve_pipeline_stage_duration_seconds_count{{pipeline=\"fixture\",stage=\"{s}\"}}"
            ),
        )
    };
    let n = cases.len() as f64;
    assert_eq!(
        (stage("recall"), stage("features"), stage("rank")),
        (n, n, n)
    );
    assert_eq!(
        sample(
            &metrics,
            "recserve_requests_total{code=\"200\",endpoint=\"recommend\",model=\"\",pipeline=\"fixture\",protocol=\"v1\",version=\"1\"}"
        ),
        n
    );
    server.stop().await.expect("clean shutdown");
}

/// A ranking model with candidate features: the pipeline computes the recall score, the recall position and the
/// co-occurrence with the request's history for every candidate, and the answers equal the fixture's reference
/// (the features computed in numpy, the model's float64 forward pass). A `user_id` request without the history
/// that `cooccurrence` reads is refused naming `history`; the same ranker answers a rank request that sends the
/// features itself with the pipeline's scores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candidate_features_are_computed_as_the_reference_does() {
    let all = recall_cases();
    let server = start().await;
    let pipeline = &all["featured_pipeline"];
    let cases = all["featured_cases"].as_array().expect("featured_cases");
    assert!(cases.len() >= 3);
    check_cases(&server, pipeline, cases).await;

    let path = format!("/v1/recommend/{}", pipeline["name"].as_str().expect("name"));
    let mut request = cases[0]["request"].clone();
    request.as_object_mut().expect("object").remove("history");
    let (status, body) = server.post(&path, &request).await;
    assert_eq!(status, 400, "{body}");
    let message = body["error"].as_str().expect("error");
    assert!(
        message.starts_with("history: is required with user_id: the ranking model of pipeline \"featured\" takes the candidate feature \"cooccurrence\""),
        "{message}"
    );
    // The fixture pipeline's ranker takes no history feature: user_id and history together stay refused there.
    let mut both = cases[0]["request"].clone();
    both["history"] = json!([1, 2]);
    let (status, body) = server.post("/v1/recommend/fixture", &both).await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .expect("error")
            .contains("history: cannot be sent together with user_id"),
        "{body}"
    );

    // The ranker on its own: a rank request that sends the pipeline's items with their features gets the
    // pipeline's scores.
    for case in cases {
        let expected = case["expected"].as_array().expect("expected");
        let candidates: Vec<Value> = expected
            .iter()
            .map(|item| {
                json!({"id": item["id"], "fields": item["fields"], "features": item["features"]})
            })
            .collect();
        let rank = json!({"user": case["request"]["user"], "candidates": candidates});
        let (status, body) = server
            .post(
                &format!(
                    "/v1/models/{}/rank",
                    pipeline["ranking_model"].as_str().expect("name")
                ),
                &rank,
            )
            .await;
        assert_eq!(status, 200, "{}: {body}", case["what"]);
        let scores = body["scores"].as_array().expect("scores");
        for (got, want) in scores.iter().zip(expected) {
            let diff = (got["score"].as_f64().expect("score")
                - want["score"].as_f64().expect("score"))
            .abs();
            assert!(
                diff <= 1e-5,
                "{}: rank alone differs by {diff:e}",
                case["what"]
            );
        }
    }
    server.stop().await.expect("clean shutdown");
}

/// Sends every case to `pipeline` and compares the answer with the expected one: ids and order exactly, ranking
/// scores within the case's tolerance, recall scores bit for bit, timings only when asked.
async fn check_cases(server: &TestServer, pipeline: &Value, cases: &[Value]) {
    let path = format!("/v1/recommend/{}", pipeline["name"].as_str().expect("name"));
    for case in cases {
        let (status, body) = server.post(&path, &case["request"]).await;
        assert_eq!(status, 200, "{}: {body}", case["what"]);
        assert_eq!(body["pipeline"], pipeline["name"]);
        assert_eq!(body["recall_model"]["name"], pipeline["recall_model"]);
        assert_eq!(body["ranking_model"]["name"], pipeline["ranking_model"]);
        let got = body["items"].as_array().expect("items");
        let want = case["expected"].as_array().expect("expected");
        let ids = |v: &[Value]| v.iter().map(|i| i["id"].as_u64()).collect::<Vec<_>>();
        assert_eq!(ids(got), ids(want), "{}: ids and order", case["what"]);
        let tolerance = case["tolerance"].as_f64().expect("tolerance");
        for (g, w) in got.iter().zip(want) {
            let diff =
                (g["score"].as_f64().expect("score") - w["score"].as_f64().expect("score")).abs();
            assert!(diff <= tolerance, "{}: |score diff| {diff:e}", case["what"]);
            let recall = |v: &Value| v["recall_score"].as_f64().expect("recall_score") as f32;
            assert_eq!(
                recall(g).to_bits(),
                recall(w).to_bits(),
                "{}: recall score",
                case["what"]
            );
        }
        let asked = case["request"]["timings"] == json!(true);
        assert_eq!(
            body.get("timings").is_some(),
            asked,
            "{}: timings only when asked",
            case["what"]
        );
        if asked {
            let t = &body["timings"];
            let ms = |key: &str| {
                t[key]
                    .as_f64()
                    .unwrap_or_else(|| panic!("timings.{key}: {t}"))
            };
            let stages = ms("recall_ms") + ms("features_ms") + ms("rank_ms");
            assert!(
                ms("recall_ms") >= 0.0 && ms("features_ms") >= 0.0 && ms("rank_ms") > 0.0,
                "{t}"
            );
            // Each figure is rounded to whole microseconds.
            assert!((ms("total_ms") - stages).abs() <= 0.003, "{t}");
        }
    }
}

/// A history none of whose items had training interactions carries no signal: the candidates are the recall
/// model's most popular items, and the response says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_history_without_signal_ranks_the_most_popular_items_and_says_so() {
    let all = recall_cases();
    let zero = all["recall_cases"]
        .as_array()
        .expect("recall_cases")
        .iter()
        .find(|c| c["fallback"] == "popularity")
        .expect("the fixture has a history without signal");
    let server = start().await;
    let path = format!(
        "/v1/recommend/{}",
        all["pipeline"]["name"].as_str().expect("name")
    );
    let candidates = all["pipeline"]["candidates"].as_u64().expect("candidates") as usize;
    let (status, recalled) = server
        .post(
            "/v1/models/lightgcn/recall",
            &json!({"history": zero["request"]["history"], "k": candidates}),
        )
        .await;
    assert_eq!(status, 200, "{recalled}");
    let popular: Vec<u64> = recalled["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|i| i["id"].as_u64().expect("id"))
        .collect();
    let request = json!({
        "history": zero["request"]["history"],
        "user": {"fields": {"age": 2, "city": 7}, "dense": [13.0, 2.0]},
        "k": 5,
    });
    let (status, body) = server.post(&path, &request).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        (&body["history_used"], &body["fallback"]),
        (&json!(0), &json!("popularity")),
        "{body}"
    );
    let items = body["items"].as_array().expect("items");
    assert_eq!(items.len(), 5, "{body}");
    for item in items {
        assert!(
            popular.contains(&item["id"].as_u64().expect("id")),
            "{item} is not among the {candidates} most popular items {popular:?}"
        );
        assert_eq!(item["recall_score"], json!(0.0));
    }
    let (status, body) = server
        .post(
            &path,
            &json!({"history": [0], "user": {"fields": {"age": 2, "city": 7}, "dense": [13.0, 2.0]}}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.get("fallback").is_none(), "{body}");
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_name_the_field() {
    let server = start().await;
    let good =
        json!({"user_id": 3, "user": {"fields": {"age": 2, "city": 7}, "dense": [13.0, 2.0]}});
    let with = |key: &str, value: Value| {
        let mut v = good.clone();
        v[key] = value;
        v
    };
    let mut no_user = good.clone();
    no_user.as_object_mut().expect("object").remove("user_id");
    let cases: Vec<(&str, &str, Value, u16, &str)> = vec![
        (
            "unknown pipeline",
            "/v1/recommend/nope",
            good.clone(),
            404,
            "pipeline \"nope\" is not configured (pipelines: featured, fixture)",
        ),
        (
            "missing user field",
            "/v1/recommend/fixture",
            with("user", json!({"fields": {"age": 2}, "dense": [1, 2]})),
            400,
            "user.fields.city: is missing",
        ),
        (
            "age outside its reject table",
            "/v1/recommend/fixture",
            with(
                "user",
                json!({"fields": {"age": 8, "city": 1}, "dense": [1, 2]}),
            ),
            400,
            "user.fields.age: id 8 is outside the vocabulary of table \"age\"",
        ),
        (
            "an item field on the user side",
            "/v1/recommend/fixture",
            with(
                "user",
                json!({"fields": {"age": 1, "city": 1, "brand": 3}, "dense": [1, 2]}),
            ),
            400,
            "user.fields.brand: is an item-side field: recommend takes it from the ranking model's item feature table",
        ),
        (
            "wrong dense length",
            "/v1/recommend/fixture",
            with(
                "user",
                json!({"fields": {"age": 1, "city": 1}, "dense": [1]}),
            ),
            400,
            "user.dense: holds 1 values, but the model takes 2 dense features",
        ),
        (
            "user id outside the user table",
            "/v1/recommend/fixture",
            with("user_id", json!(48)),
            400,
            "user_id: id 48 is outside the user table \"user\"",
        ),
        (
            "user id and history",
            "/v1/recommend/fixture",
            with("history", json!([1, 999])),
            400,
            "history: cannot be sent together with user_id",
        ),
        (
            "neither user id nor history",
            "/v1/recommend/fixture",
            no_user.clone(),
            400,
            "user_id: is missing",
        ),
        (
            "history id outside",
            "/v1/recommend/fixture",
            {
                let mut v = no_user.clone();
                v["history"] = json!([1, 999]);
                v
            },
            400,
            "history[1]: id 999 is outside the history table",
        ),
        (
            "excluded id outside",
            "/v1/recommend/fixture",
            with("exclude", json!([-2])),
            400,
            "exclude[0]: id -2 is outside the item table",
        ),
        (
            "k = 0",
            "/v1/recommend/fixture",
            with("k", json!(0)),
            400,
            "k: must be at least 1",
        ),
        (
            "k beyond the candidates",
            "/v1/recommend/fixture",
            with("k", json!(21)),
            400,
            "k: is 21, more than the 20 candidates of pipeline \"fixture\"",
        ),
        (
            "timings not a boolean",
            "/v1/recommend/fixture",
            with("timings", json!("yes")),
            400,
            "timings: invalid type: string",
        ),
        (
            "unknown key",
            "/v1/recommend/fixture",
            with("candidates", json!([])),
            400,
            "unknown field `candidates`",
        ),
    ];
    for (what, path, body, status, needle) in cases {
        let (got, answer) = server.post(path, &body).await;
        assert_eq!(got, status, "{what}: {answer}");
        let message = answer["error"].as_str().unwrap_or_default();
        assert!(
            message.contains(needle),
            "{what}: expected {needle:?} in {message:?}"
        );
    }
    // A user field given twice is refused, not read as the last one (JSON values cannot hold it: raw text).
    let (got, answer) = server
        .post_raw(
            "/v1/recommend/fixture",
            r#"{"user_id": 3, "user": {"fields": {"age": 1, "city": 1, "age": 2}, "dense": [1, 2]}}"#,
        )
        .await;
    assert_eq!(got, 400, "{answer}");
    let message = answer["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("user.fields: `age` is given more than once"),
        "{message:?}"
    );
    server.stop().await.expect("clean shutdown");
}

/// A pipeline whose ranking queue would refuse the request is refused before its recall runs: the ranking model
/// here holds one request for 1 s (a long batching delay, a queue of one), and a second recommend meanwhile gets
/// 429 with the recall model's batch count unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_the_ranking_queue_would_refuse_is_refused_before_recall() {
    let repo = fixture_repo();
    let dir = tempfile::tempdir().expect("tempdir");
    copy_dir(&repo.join("lightgcn"), &dir.path().join("lightgcn"));
    copy_dir(&repo.join("deepfm-items"), &dir.path().join("deepfm-items"));
    copy_dir(
        &repo.join("deepfm-featured"),
        &dir.path().join("deepfm-featured"),
    );
    let model_toml = dir.path().join("deepfm-items/1/model.toml");
    let mut text = std::fs::read_to_string(&model_toml).expect("model.toml");
    text.push_str("\n[batching]\nmax_queue_delay_us = 1000000\ndefault_deadline_ms = 30000\n");
    std::fs::write(&model_toml, text).expect("write model.toml");
    let server = TestServer::start(config(dir.path(), |a| {
        a.config = Some(fixture_dir().join("recserve.toml"));
        a.queue_capacity = Some(1);
        // The ranking model's free executor waits for company (its delay is 1 s), so the first request holds the
        // queue's one place.
        a.batch_delay = Some(BatchDelay::Fixed);
    }))
    .await;
    let request = recall_cases()["recommend_cases"][0]["request"].clone();
    let recall_batches = |metrics: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("recserve_batches_total{model=\"lightgcn\""))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };

    let held = server.post_in_background("/v1/recommend/fixture", &[], &request);
    // Wait until the first request has been recalled and waits in the ranking queue.
    let metrics = server.wait_for_queue_depth("deepfm-items", 1).await;
    let before = recall_batches(&metrics);
    assert!(before >= 1.0, "the first request was recalled");

    let (status, answer) = server.post("/v1/recommend/fixture", &request).await;
    assert_eq!(status, 429, "{answer}");
    let message = answer["error"].as_str().unwrap_or_default();
    assert!(
        message.contains("deepfm-items") && message.contains("overloaded"),
        "{message:?}"
    );
    let (_, metrics) = server.get("/metrics").await;
    assert_eq!(
        recall_batches(&metrics),
        before,
        "the refused request ran no recall"
    );
    assert_eq!(
        sample(
            &metrics,
            "recserve_rejected_total{model=\"deepfm-items\",reason=\"queue_full\"}"
        ),
        1.0
    );
    assert_eq!(held.await.expect("first request"), 200);
    server.stop().await.expect("clean shutdown");
}

/// Starts a server on `repository` with `pipeline` as its config file and returns the start-up error.
async fn refused(repository: &Path, pipeline: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("recserve.toml");
    std::fs::write(&file, pipeline).expect("write config");
    let server = TestServer::spawn(config(repository, |a| a.config = Some(file.clone()))).await;
    let result = server.finished().await;
    result
        .expect_err("the server must refuse to start")
        .to_string()
}

fn pipeline(recall: &str, ranking: &str, candidates: usize) -> String {
    format!(
        "[pipelines.p]\nrecall_model = \"{recall}\"\nranking_model = \"{ranking}\"\ncandidates = {candidates}\nk = 1\n"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelines_that_cannot_work_stop_the_start_with_a_clear_message() {
    let repo = fixture_repo();
    let cases = [
        (
            pipeline("nope", "deepfm-items", 5),
            "pipeline \"p\" (--config [pipelines.p]): recall_model = \"nope\" is not loaded",
        ),
        (
            pipeline("deepfm-fp32", "deepfm-items", 5),
            "recall_model = \"deepfm-fp32\" is a deepfm model, not lightgcn",
        ),
        (
            pipeline("lightgcn", "lightgcn-int8", 5),
            "ranking_model = \"lightgcn-int8\" is a lightgcn model, not deepfm",
        ),
        (
            pipeline("lightgcn", "deepfm-fp32", 5),
            "ranking_model \"deepfm-fp32\" has no [item_features]",
        ),
        (
            pipeline("lightgcn-int8", "deepfm-items", 5),
            "the item feature table of \"deepfm-items\" has 300 rows, but the catalogue of \"lightgcn-int8\" has 257 items",
        ),
        (
            pipeline("lightgcn", "deepfm-items", 301),
            "candidates = 301 is more than the 300 items of \"lightgcn\"",
        ),
    ];
    for (config_text, needle) in cases {
        let message = refused(&repo, &config_text).await;
        assert!(
            message.contains(needle),
            "expected {needle:?} in {message:?}"
        );
    }

    // A broken item feature table stops the ranking model from loading, naming the file.
    let ok = pipeline("lightgcn", "deepfm-items", 5);
    let broken = [
        (
            "a category outside its reject table",
            99i64,
            None,
            "row 0, column \"category\": id 99 is outside table \"category\" (ids 0 to 11)",
        ),
        (
            "a wrong shape",
            0,
            Some([300usize, 3]),
            "tensor \"item_features\" is I64 [300, 3], but [item_features] needs I64 [items, 2]",
        ),
    ];
    for (what, category, shape, needle) in broken {
        let dir = tempfile::tempdir().expect("tempdir");
        copy_dir(&repo.join("lightgcn"), &dir.path().join("lightgcn"));
        copy_dir(&repo.join("deepfm-items"), &dir.path().join("deepfm-items"));
        let file = dir.path().join("deepfm-items/1/item_features.safetensors");
        let shape = shape.unwrap_or([300, 2]);
        let mut values = vec![1i64; shape[0] * shape[1]];
        values[0] = category;
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let view =
            safetensors::tensor::TensorView::new(safetensors::Dtype::I64, shape.to_vec(), &bytes)
                .expect("view");
        safetensors::serialize_to_file([("item_features", view)], None, &file).expect("write");
        let message = refused(dir.path(), &ok).await;
        assert!(
            message.contains("item_features.safetensors") && message.contains(needle),
            "{what}: expected {needle:?} in {message:?}"
        );
    }
}
