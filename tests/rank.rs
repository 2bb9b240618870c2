//! End to end: a real server on port 0 over the generated test repository. Scores equal the numpy reference
//! (fp32, fp16 tables) and onnxruntime-Python on the same INT8 graph and gathered inputs; bad input gets a 4xx that
//! names the field while concurrent good requests keep getting their own correct answers.

mod common;

use std::collections::HashMap;

use common::{TestServer, cases, config, fixture_repo};
use serde_json::{Value, json};

/// The parity bound against the Python side's scores, for every precision: the server's gather is exact, and it runs the same ONNX Runtime
/// library with the same optimisation level as the Python side.
const TOLERANCE: f64 = 1e-5;

fn rank_path(model: &str) -> String {
    format!("/v1/models/{model}/rank")
}

/// Scores in request order from a rank response (which may be sorted and cut by `top_k`).
fn scores_by_index(response: &Value) -> HashMap<usize, f64> {
    response["scores"]
        .as_array()
        .expect("scores array")
        .iter()
        .map(|s| {
            (
                s["index"].as_u64().expect("index") as usize,
                s["score"].as_f64().expect("score"),
            )
        })
        .collect()
}

/// Checks one fixture case against a running server; returns the largest absolute difference.
async fn check_case(server: &TestServer, case: &Value) -> f64 {
    let model = case["model"].as_str().expect("model");
    let (status, body) = server.post(&rank_path(model), &case["request"]).await;
    assert_eq!(status, 200, "{}: {body}", case["what"]);
    assert_eq!(body["model"], case["model"]);
    assert_eq!(body["version"], case["version"]);
    let expected: Vec<f64> = case["expected_scores"]
        .as_array()
        .expect("expected_scores")
        .iter()
        .map(|v| v.as_f64().expect("float"))
        .collect();
    let got = scores_by_index(&body);
    let top_k = case["request"]["top_k"].as_u64();
    assert_eq!(
        got.len(),
        top_k.map_or(expected.len(), |k| (k as usize).min(expected.len()))
    );
    let mut worst: f64 = 0.0;
    for (&i, &score) in &got {
        let diff = (score - expected[i]).abs();
        assert!(
            diff <= TOLERANCE,
            "{} ({model}): candidate {i} scored {score}, reference {} (|diff| {diff:e} > {TOLERANCE:e})",
            case["what"],
            expected[i]
        );
        worst = worst.max(diff);
    }
    if top_k.is_some() {
        // The returned candidates are the k best, best first, ties by request order.
        let mut order: Vec<usize> = (0..expected.len()).collect();
        order.sort_by(|&a, &b| expected[b].total_cmp(&expected[a]).then(a.cmp(&b)));
        let returned: Vec<usize> = body["scores"]
            .as_array()
            .expect("scores")
            .iter()
            .map(|s| s["index"].as_u64().expect("index") as usize)
            .collect();
        assert_eq!(returned, order[..returned.len()], "{}", case["what"]);
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scores_equal_the_reference_for_every_fixture_case() {
    let all = cases();
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let served: HashMap<String, u64> = all["models"]
        .as_object()
        .expect("models")
        .iter()
        .map(|(name, m)| {
            (
                name.clone(),
                m["served_version"].as_u64().expect("served_version"),
            )
        })
        .collect();
    let mut checked = 0;
    let mut worst: HashMap<String, f64> = HashMap::new();
    for case in all["cases"].as_array().expect("cases") {
        let model = case["model"].as_str().expect("model");
        if case["version"].as_u64() != served.get(model).copied() {
            continue;
        }
        let diff = check_case(&server, case).await;
        let w = worst.entry(model.to_owned()).or_default();
        *w = w.max(diff);
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} cases were checked");
    for model in ["deepfm-fp32", "deepfm-fp16", "deepfm-int8"] {
        assert!(worst.contains_key(model), "no case checked {model}");
    }
    eprintln!("largest |server − reference| per model: {worst:?}");
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pinned_version_is_served_and_other_versions_are_404() {
    let all = cases();
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.pin = vec![recserve::config::Pin {
            model: "deepfm-fp32".into(),
            version: 1,
        }]
    }))
    .await;
    let v1_cases: Vec<&Value> = all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["model"] == "deepfm-fp32" && c["version"] == 1)
        .collect();
    assert!(
        !v1_cases.is_empty(),
        "the fixture has cases for deepfm-fp32 version 1"
    );
    for case in &v1_cases {
        check_case(&server, case).await;
    }
    let request = &v1_cases[0]["request"];
    let (status, body) = server
        .post("/v1/models/deepfm-fp32/versions/1/rank", request)
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server
        .post("/v1/models/deepfm-fp32/versions/2/rank", request)
        .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        body["error"],
        "model \"deepfm-fp32\" version 2 is not served (serving version 1)"
    );
    let (status, body) = server
        .post("/v1/models/deepfm-fp32/versions/two/rank", request)
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]
            .as_str()
            .expect("error")
            .starts_with("version: \"two\""),
        "{body}"
    );

    let (status, text) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    let list: Value = serde_json::from_str(&text).expect("json");
    let fp32 = list["models"]
        .as_array()
        .expect("models")
        .iter()
        .find(|m| m["name"] == "deepfm-fp32")
        .expect("deepfm-fp32 listed");
    assert_eq!(fp32["version"], 1);
    assert_eq!(fp32["available_versions"], json!([1, 2]));
    assert_eq!(fp32["kind"], "deepfm");
    assert_eq!(fp32["precision"], "fp32");
    assert_eq!(fp32["item_id_field"], "C20");
    assert_eq!(fp32["dense_features"].as_array().expect("dense").len(), 13);
    assert_eq!(fp32["tables"].as_array().expect("tables").len(), 26);
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fixture_error_cases_name_the_input() {
    let all = cases();
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let error_cases = all["error_cases"].as_array().expect("error_cases");
    assert!(!error_cases.is_empty());
    for case in error_cases {
        let model = case["model"].as_str().expect("model");
        let (status, body) = server.post(&rank_path(model), &case["request"]).await;
        assert_eq!(
            Some(u64::from(status)),
            case["status"].as_u64(),
            "{}: {body}",
            case["what"]
        );
        let message = body["error"].as_str().expect("error message");
        let input = case["input"].as_str().expect("input");
        assert!(
            message.starts_with(&format!("{input}: ")),
            "{}: {message:?} does not name {input}",
            case["what"]
        );
        assert!(message.contains("outside the vocabulary"), "{message}");
    }
    server.stop().await.expect("clean shutdown");
}
