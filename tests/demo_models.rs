//! End to end on the trained demo models: the server, started on the demo repository's DeepFM models
//! (`models/demo/deepfm`, INT8, and `models/demo/deepfm-fp32`), returns for held-out rows the same scores as the
//! toolchain's offline inference on the same repository. `python -m recserve_models demo-cases` writes the
//! held-out rank requests and the offline scores (reference gather, then onnxruntime-Python on the version's own
//! graph) to `target/demo-cases.json`; `scripts/test.sh` runs it before the Rust tests.
//!
//! Only the DeepFM models are copied into the test repository: the LightGCN demo is checked against the toolchain's
//! offline Recall@20 by `scripts/recall-check.py` on a running server, which needs the Gowalla split (not in CI).

mod common;

use std::path::{Path, PathBuf};

use common::{TestServer, config, copy_dir};
use serde_json::Value;

/// The bound for FP32, held for INT8 too: the server runs the same ONNX Runtime library at the same
/// optimisation level on the same gathered rows.
const TOLERANCE: f64 = 1e-5;

fn demo_cases() -> Value {
    let path = std::env::var_os("RECSERVE_DEMO_CASES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/demo-cases.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run scripts/test.sh, which writes it \
             (python -m recserve_models demo-cases --repository models/demo --out target/demo-cases.json)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("demo cases are JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_scores_held_out_rows_like_the_toolchain() {
    let all = demo_cases();
    // The repository the offline scores were computed on (`models/demo` when scripts/test.sh wrote them).
    let demo =
        Path::new(env!("CARGO_MANIFEST_DIR")).join(all["repository"].as_str().expect("repository"));
    let repository = tempfile::tempdir().expect("tempdir");
    for model in ["deepfm", "deepfm-fp32"] {
        copy_dir(&demo.join(model), &repository.path().join(model));
    }
    let server = TestServer::start(config(repository.path(), |_| {})).await;
    let cases = all["cases"].as_array().expect("cases");
    let mut candidates = 0;
    let mut worst = [("deepfm", 0.0f64), ("deepfm-fp32", 0.0f64)];
    for case in cases {
        let model = case["model"].as_str().expect("model");
        let (status, body) = server
            .post(&format!("/v1/models/{model}/rank"), &case["request"])
            .await;
        assert_eq!(status, 200, "{} ({model}): {body}", case["what"]);
        assert_eq!(body["model"], case["model"]);
        let expected = case["expected_scores"].as_array().expect("expected_scores");
        let scores = body["scores"].as_array().expect("scores");
        assert_eq!(scores.len(), expected.len(), "{}", case["what"]);
        for s in scores {
            let index = s["index"].as_u64().expect("index") as usize;
            let score = s["score"].as_f64().expect("score");
            let want = expected[index].as_f64().expect("float");
            let diff = (score - want).abs();
            assert!(
                diff <= TOLERANCE,
                "{} ({model}): candidate {index} scored {score}, offline {want} (|diff| {diff:e})",
                case["what"]
            );
            let slot = worst.iter_mut().find(|(m, _)| *m == model).expect("model");
            slot.1 = slot.1.max(diff);
            candidates += 1;
        }
    }
    assert!(
        candidates >= 400,
        "only {candidates} candidates were compared"
    );
    for (model, _) in worst {
        assert!(
            cases.iter().any(|c| c["model"] == model),
            "no case for {model}"
        );
    }
    eprintln!("largest |server − offline| per model over {candidates} candidates: {worst:?}");
    server.stop().await.expect("clean shutdown");
}
