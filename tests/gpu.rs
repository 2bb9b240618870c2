//! End to end with the embedding tables in GPU memory (`--device cuda`): every fixture case scored by a real server
//! equals the reference, and `/metrics` shows the tables on the GPU. Needs a CUDA device and a `--features cuda`
//! build, so the test is `#[ignore]`d; `scripts/gpu-check.sh` runs it on a GPU machine (where a missing device
//! fails it). The dense network runs on whatever execution provider the ONNX Runtime library offers (`auto`): the
//! CPU one with the PyPI `onnxruntime` wheel.

mod common;

use std::collections::HashMap;

use common::{TestServer, cases, config, fixture_repo};

/// The gather is bit-exact on the GPU and the dense network is the same ONNX Runtime CPU session as in
/// tests/rank.rs, so the bound is the same.
const TOLERANCE: f64 = 1e-5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a CUDA device and --features cuda; scripts/gpu-check.sh runs it"]
async fn ranks_with_embedding_tables_in_gpu_memory() {
    let all = cases();
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.device = Some("cuda".parse().expect("device"));
        a.shards = Some(3);
        a.executors = Some(2);
    }))
    .await;
    let mut checked = 0;
    let mut worst: HashMap<String, f64> = HashMap::new();
    for case in all["cases"].as_array().expect("cases") {
        let model = case["model"].as_str().expect("model");
        if case["version"] != all["models"][model]["served_version"] {
            continue;
        }
        let (status, body) = server
            .post(&format!("/v1/models/{model}/rank"), &case["request"])
            .await;
        assert_eq!(status, 200, "{}: {body}", case["what"]);
        let expected = case["expected_scores"].as_array().expect("expected_scores");
        for s in body["scores"].as_array().expect("scores") {
            let i = s["index"].as_u64().expect("index") as usize;
            let got = s["score"].as_f64().expect("score");
            let want = expected[i].as_f64().expect("float");
            let diff = (got - want).abs();
            assert!(
                diff <= TOLERANCE,
                "{} ({model}): candidate {i} scored {got}, reference {want}",
                case["what"]
            );
            let w = worst.entry(model.to_owned()).or_default();
            *w = w.max(diff);
        }
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} cases were checked");
    println!("gpu end to end: {checked} cases, largest |server − reference| per model: {worst:?}");

    let (status, metrics) = server.get("/metrics").await;
    assert_eq!(status, 200);
    for needle in [
        "recserve_gpu_memory_bytes{device=\"cuda:",
        "recserve_gather_duration_seconds_count{device=\"cuda:",
        "recserve_model_info{device=\"cuda:",
    ] {
        assert!(metrics.contains(needle), "no {needle:?} in /metrics");
    }
    server.stop().await.expect("clean shutdown");
}
