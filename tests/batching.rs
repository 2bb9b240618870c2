//! End to end: dynamic batching under concurrency. Many clients send random subsets of a fixture case's candidates
//! at once (sizes 1..=200, so some are split across batches), some with deadlines too tight to meet; every 200
//! carries exactly its own rows' reference scores, and every other answer is a clean refusal (429 with
//! Retry-After, or 400 for a deadline shorter than the request's own execution) or a deadline miss (504). Nothing is
//! lost, nothing is mixed up.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::{TestServer, cases, config, fixture_repo};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use serde_json::{Value, json};

/// The fixture's largest deepfm-int8 case: its request and reference scores per candidate.
fn big_case() -> (Value, Vec<f64>) {
    let all = cases();
    let case = all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["model"] == "deepfm-int8")
        .max_by_key(|c| c["request"]["candidates"].as_array().map_or(0, Vec::len))
        .expect("a deepfm-int8 case");
    let scores = case["expected_scores"]
        .as_array()
        .expect("scores")
        .iter()
        .map(|v| v.as_f64().expect("float"))
        .collect();
    let mut request = case["request"].clone();
    request.as_object_mut().expect("object").remove("top_k");
    (request, scores)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_get_exactly_their_own_rows_or_a_clean_refusal() {
    let (request, reference) = big_case();
    let candidates = request["candidates"]
        .as_array()
        .expect("candidates")
        .clone();
    assert!(
        candidates.len() >= 200,
        "the fixture's big case has {} candidates",
        candidates.len()
    );
    let server = Arc::new(
        TestServer::start(config(&fixture_repo(), |a| {
            a.max_batch_rows = Some(64);
            a.max_queue_delay_us = Some(3000);
            a.queue_capacity = Some(12);
            a.executors = Some(2);
        }))
        .await,
    );

    let mut clients = Vec::new();
    for client in 0..16u64 {
        let (server, request, candidates, reference) = (
            Arc::clone(&server),
            request.clone(),
            candidates.clone(),
            reference.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(client);
            let mut outcomes: BTreeMap<u16, usize> = BTreeMap::new();
            for round in 0..12 {
                let n = rng.random_range(1..=200);
                let mut picked: Vec<usize> = (0..candidates.len()).collect();
                picked.shuffle(&mut rng);
                picked.truncate(n);
                let mut body = request.clone();
                body["candidates"] = Value::Array(picked.iter().map(|&i| candidates[i].clone()).collect());
                let tight = round % 4 == 3;
                let mut post = server.client.post(server.url("/v1/models/deepfm-int8/rank")).body(body.to_string());
                if tight {
                    post = post.header("x-recserve-deadline-ms", "1");
                }
                let resp = post.send().await.expect("POST");
                let status = resp.status().as_u16();
                let retry_after = resp.headers().get("retry-after").cloned();
                let answer: Value = resp.json().await.expect("JSON answer");
                *outcomes.entry(status).or_default() += 1;
                match status {
                    200 => {
                        let scores = answer["scores"].as_array().expect("scores");
                        assert_eq!(scores.len(), n, "client {client} round {round}: one score per candidate");
                        for (pos, s) in scores.iter().enumerate() {
                            assert_eq!(s["index"], json!(pos), "scores come back in request order");
                            let want = reference[picked[pos]];
                            let got = s["score"].as_f64().expect("score");
                            assert!(
                                (got - want).abs() <= 1e-5,
                                "client {client} round {round}: candidate {pos} (fixture row {}) scored {got}, reference {want}",
                                picked[pos]
                            );
                        }
                    }
                    429 => {
                        assert!(retry_after.is_some(), "429 carries Retry-After");
                        assert!(answer["error"].as_str().expect("error").contains("overloaded"), "{answer}");
                    }
                    // A deadline shorter than the request's own execution: refused as such, with no retry.
                    400 => {
                        assert!(tight, "only requests with a 1 ms deadline may be refused as too short: {answer}");
                        assert!(retry_after.is_none(), "no retry invited: {answer}");
                        assert!(answer["error"].as_str().expect("error").contains("deadline is too short"), "{answer}");
                    }
                    504 => {
                        assert!(tight, "only requests with a 1 ms deadline may miss it: {answer}");
                        assert!(answer["error"].as_str().expect("error").contains("deadline passed"), "{answer}");
                    }
                    other => panic!("client {client} round {round}: unexpected status {other}: {answer}"),
                }
            }
            outcomes
        }));
    }
    let mut total: BTreeMap<u16, usize> = BTreeMap::new();
    for client in clients {
        for (status, n) in client.await.expect("client task") {
            *total.entry(status).or_default() += n;
        }
    }
    eprintln!("outcomes by status: {total:?}");
    assert_eq!(
        total.values().sum::<usize>(),
        16 * 12,
        "every request was answered"
    );
    assert!(
        total.get(&200).copied().unwrap_or(0) >= 16,
        "most requests were served: {total:?}"
    );

    let (_, metrics) = server.get("/metrics").await;
    let value = |prefix: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(prefix))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert!(
        value("recserve_batches_total{model=\"deepfm-int8\"") >= 1.0,
        "batches are counted by reason"
    );
    assert!(
        metrics.lines().any(|l| l.starts_with(
            "recserve_admission_margin_seconds{model=\"deepfm-int8\",version=\"1\"} "
        )),
        "the admission margin gauge is exported per model"
    );
    let rejected = value("recserve_rejected_total{model=\"deepfm-int8\"");
    let expired = value("recserve_expired_total{model=\"deepfm-int8\"");
    assert_eq!(
        rejected as usize,
        total.get(&429).copied().unwrap_or(0) + total.get(&400).copied().unwrap_or(0),
        "every 429, and every deadline refused as too short (400), is counted in recserve_rejected_total"
    );
    assert_eq!(
        expired as usize,
        total.get(&504).copied().unwrap_or(0),
        "every 504 is counted as expired"
    );
    Arc::into_inner(server)
        .expect("clients done")
        .stop()
        .await
        .expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_larger_than_a_batch_is_split_and_reassembled_in_order() {
    let (request, reference) = big_case();
    let server = TestServer::start(config(&fixture_repo(), |a| a.max_batch_rows = Some(16))).await;
    let (status, answer) = server.post("/v1/models/deepfm-int8/rank", &request).await;
    assert_eq!(status, 200, "{answer}");
    let scores = answer["scores"].as_array().expect("scores");
    assert_eq!(scores.len(), reference.len());
    for (i, s) in scores.iter().enumerate() {
        assert_eq!(s["index"], json!(i));
        assert!(
            (s["score"].as_f64().expect("score") - reference[i]).abs() <= 1e-5,
            "candidate {i}"
        );
    }
    let (_, metrics) = server.get("/metrics").await;
    let full = metrics
        .lines()
        .find(|l| l.starts_with("recserve_batches_total{model=\"deepfm-int8\",reason=\"full\"}"))
        .expect("full batches counted");
    let n: usize = full
        .rsplit(' ')
        .next()
        .expect("value")
        .parse()
        .expect("number");
    assert!(
        n >= reference.len() / 16,
        "{} rows in chunks of 16 fill at least {} batches: {full}",
        reference.len(),
        reference.len() / 16
    );
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batching_off_scores_the_same() {
    let (request, reference) = big_case();
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.batching = Some(recserve::config::Switch::Off);
        a.max_batch_rows = Some(100);
    }))
    .await;
    let (status, answer) = server.post("/v1/models/deepfm-int8/rank", &request).await;
    assert_eq!(status, 200, "{answer}");
    for (i, s) in answer["scores"]
        .as_array()
        .expect("scores")
        .iter()
        .enumerate()
    {
        assert!(
            (s["score"].as_f64().expect("score") - reference[i]).abs() <= 1e-5,
            "candidate {i}"
        );
    }
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        metrics.contains("recserve_batches_total{model=\"deepfm-int8\",reason=\"unbatched\"} 3"),
        "257 rows in chunks of 100 run as 3 unbatched batches"
    );
    server.stop().await.expect("clean shutdown");
}
