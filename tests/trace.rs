//! End to end: every request is traced from its first byte. The slow-request record (`/debug/slow-requests`) lists
//! answered requests of every kind with their stages in order, summing to their total, and the batch they rode
//! in; `recserve_request_stage_seconds` counts each stage; a body that takes its time to arrive is charged to the
//! `read` stage and to the request's duration, and its deadline counts from the first byte (one that has passed
//! by the time the body is in leaves the request no time: refused as too short).

mod common;

use std::time::Duration;

use common::raw::{read_response, request};
use common::{TestServer, cases, config, fixture_dir, fixture_repo, metric_sample};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

/// The first case of `model` in the fixture, its request as JSON.
fn rank_request(model: &str) -> Value {
    cases()["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| {
            c["model"] == model && c["request"]["candidates"].as_array().map_or(0, Vec::len) > 1
        })
        .map(|c| c["request"].clone())
        .expect("a case of the model")
}

fn slow_requests(text: &str) -> Vec<Value> {
    let record: Value = serde_json::from_str(text).expect("the record is JSON");
    assert_eq!(record["window_seconds"], 60);
    record["requests"].as_array().expect("requests").clone()
}

const MODEL_STAGES: [&str; 10] = [
    "read",
    "decode",
    "admit",
    "queue",
    "dispatch",
    "gather",
    "inference",
    "answer",
    "encode",
    "write",
];

/// Checks one record entry's stages: the names in `order`, each at least 0, summing to its total.
fn check_stages(entry: &Value, order: &[&str]) {
    let stages = entry["stages"].as_array().expect("stages");
    let names: Vec<&str> = stages
        .iter()
        .map(|s| s["stage"].as_str().expect("name"))
        .collect();
    assert_eq!(names, order, "{entry}");
    let sum: f64 = stages.iter().map(|s| s["ms"].as_f64().expect("ms")).sum();
    let total = entry["total_ms"].as_f64().expect("total");
    // Each figure is rounded to the microsecond.
    assert!(
        (sum - total).abs() <= 0.001 * (stages.len() as f64 + 1.0),
        "stages sum to {sum} ms, total {total} ms: {entry}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_every_kind_are_traced_from_their_first_byte_to_their_last() {
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.config = Some(fixture_dir().join("recserve.toml"));
    }))
    .await;

    let (status, body) = server
        .post("/v1/models/deepfm-int8/rank", &rank_request("deepfm-int8"))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server
        .post("/v1/models/lightgcn/recall", &json!({"user_id": 3, "k": 5}))
        .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = server
        .post(
            "/v1/recommend/fixture",
            &json!({"user_id": 3, "user": {"fields": {"age": 1, "city": 1}, "dense": [1, 2]}, "k": 5}),
        )
        .await;
    assert_eq!(status, 200, "{body}");
    // Refused before it was queued: in the record (it reached a model), not in the stage histograms.
    let (status, _) = server
        .post("/v1/models/deepfm-int8/rank", &json!({"user": {}}))
        .await;
    assert_eq!(status, 400);
    // Not about a model: not traced.
    let _ = server.get("/health/ready").await;

    // The response is handed to the connection after the client may have read it: wait for the record.
    let mut entries = Vec::new();
    for _ in 0..100 {
        let (status, text) = server.get("/debug/slow-requests").await;
        assert_eq!(status, 200, "{text}");
        entries = slow_requests(&text);
        if entries.len() == 4 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(entries.len(), 4, "{entries:?}");
    let totals: Vec<f64> = entries
        .iter()
        .map(|e| e["total_ms"].as_f64().expect("total"))
        .collect();
    assert!(
        totals.windows(2).all(|w| w[0] >= w[1]),
        "slowest first: {totals:?}"
    );
    let find = |model: &str, status: u64| {
        entries
            .iter()
            .find(|e| e["model"] == model && e["status"] == status)
            .unwrap_or_else(|| panic!("no {model} {status} in {entries:?}"))
    };

    let rank = find("deepfm-int8", 200);
    assert_eq!(rank["endpoint"], "rank");
    assert_eq!(rank["protocol"], "v1");
    check_stages(rank, &MODEL_STAGES);
    let batch = &rank["batch"];
    assert!(batch["id"].as_u64().expect("batch id") >= 1, "{rank}");
    assert!(batch["rows"].as_u64().expect("rows") >= 2, "{rank}");
    assert!(batch["requests"].as_u64().expect("requests") >= 1, "{rank}");

    let recall = find("lightgcn", 200);
    check_stages(recall, &MODEL_STAGES);

    // Recall, then rank: each model stage appears once, its two visits summed.
    let recommend = find("fixture", 200);
    assert_eq!(recommend["endpoint"], "recommend");
    check_stages(recommend, &MODEL_STAGES);

    let refused = find("deepfm-int8", 400);
    check_stages(refused, &["read", "encode", "write"]);
    assert!(refused["batch"].is_null());

    let (_, metrics) = server.get("/metrics").await;
    for stage in MODEL_STAGES {
        let count = metric_sample(
            &metrics,
            &format!(
                "recserve_request_stage_seconds_count{{model=\"deepfm-int8\",pipeline=\"\",stage=\"{stage}\"}}"
            ),
        );
        assert_eq!(count, 1.0, "{stage}: the 400 is not counted");
    }
    server.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upload_is_read_time_and_its_deadline_counts_from_the_first_byte() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let body = rank_request("deepfm-int8").to_string();
    let pause = Duration::from_millis(400);

    // The head and half the body, a pause, the rest: the pause is the read stage's.
    let send_slowly = |headers: Vec<String>| {
        let addr = server.addr;
        let body = body.clone();
        async move {
            let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
            let bytes = request(
                "POST",
                "/v1/models/deepfm-int8/rank",
                &[&["Content-Type: application/json"], headers.as_slice()].concat(),
                body.as_bytes(),
            );
            let split = bytes.len() - body.len() / 2;
            let mut stream = TcpStream::connect(addr).await.expect("connect");
            stream.write_all(&bytes[..split]).await.expect("write");
            tokio::time::sleep(pause).await;
            stream.write_all(&bytes[split..]).await.expect("write");
            tokio::time::timeout(Duration::from_secs(30), read_response(&mut stream))
                .await
                .expect("an answer")
                .expect("not closed")
        }
    };

    let answered = send_slowly(Vec::new()).await;
    assert_eq!(answered.status, 200, "{:?}", answered.error());
    let mut entry = None;
    for _ in 0..100 {
        let (_, text) = server.get("/debug/slow-requests").await;
        entry = slow_requests(&text).first().cloned();
        if entry.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let entry = entry.expect("the request is in the record");
    check_stages(&entry, &MODEL_STAGES);
    let read = entry["stages"][0]["ms"].as_f64().expect("read ms");
    assert!(
        read >= pause.as_secs_f64() * 1e3,
        "the read stage ({read} ms) holds the pause: {entry}"
    );
    let (_, metrics) = server.get("/metrics").await;
    let duration = metric_sample(
        &metrics,
        "recserve_request_duration_seconds_sum{endpoint=\"rank\",model=\"deepfm-int8\",pipeline=\"\",protocol=\"v1\",version=\"1\"}",
    );
    assert!(
        duration >= pause.as_secs_f64(),
        "the request's duration ({duration} s) counts from its first byte"
    );

    // A deadline shorter than the upload has passed by the time the body is in: it leaves no time at all.
    let late = send_slowly(vec!["x-recserve-deadline-ms: 200".to_owned()]).await;
    assert_eq!(late.status, 400, "{}", late.error());
    assert!(
        late.error().contains("the request's deadline is too short")
            && late.error().contains("its deadline leaves 0.000 ms"),
        "{}",
        late.error()
    );
    server.stop().await.expect("clean stop");
}
