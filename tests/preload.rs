//! `--preload off` (tables and indexes mapped, each page read in when a request first touches it) answers exactly
//! as `--preload on` (every page read in before ready) does: the demo repository's ranking, recall and recommend
//! answers, compared as JSON values (the scores are the same f32 bits, printed the same).

mod common;

use std::path::Path;

use common::{TestServer, config};
use recserve::config::Switch;
use serde_json::{Value, json};

/// The answers of a server on the demo repository to a fixed set of requests, in order.
async fn answers(preload: Switch) -> Vec<Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let demo = root.join("models/demo");
    let server = TestServer::start(config(&demo, |a| {
        a.config = Some(demo.join("recserve.toml"));
        a.preload = Some(preload);
    }))
    .await;
    let rank: Value = serde_json::from_str(
        &std::fs::read_to_string(demo.join("rank-request.json")).expect("rank-request.json"),
    )
    .expect("rank-request.json is JSON");
    let mut requests = vec![("/v1/models/deepfm/rank".to_owned(), rank)];
    for user in [0, 7, 1000, 29857] {
        requests.push((
            "/v1/models/lightgcn/recall".to_owned(),
            json!({"user_id": user, "k": 50}),
        ));
        requests.push((
            "/v1/recommend/demo".to_owned(),
            // The demo ranker reads the cooccurrence feature: user_id requests send a history.
            json!({"user_id": user, "history": [1, 2, 3, 5, 8], "user": {"fields": {"activity": 4}}, "k": 20}),
        ));
    }
    let mut out = Vec::new();
    for (path, body) in &requests {
        let (status, answer) = server.post(path, body).await;
        assert_eq!(
            status, 200,
            "{path} {body} with --preload {preload:?}: {answer}"
        );
        out.push(answer);
    }
    server.stop().await.expect("stop");
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preload_off_answers_as_preload_on_does() {
    let on = answers(Switch::On).await;
    let off = answers(Switch::Off).await;
    assert_eq!(on.len(), off.len());
    for (i, (a, b)) in on.iter().zip(&off).enumerate() {
        assert_eq!(a, b, "request {i}: --preload on and off disagree");
    }
    // Not vacuous: the recall answers hold items.
    assert_eq!(on[1]["items"].as_array().map(Vec::len), Some(50));
}
