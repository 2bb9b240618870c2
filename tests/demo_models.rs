//! End to end on the trained demo models: the server, started on the demo repository's DeepFM models
//! (`models/demo/deepfm`, INT8, and `models/demo/deepfm-fp32`), returns for held-out rows the same scores as the
//! toolchain's offline inference on the same repository. `python -m recserve_models demo-cases` writes the
//! held-out rank requests and the offline scores (reference gather, then onnxruntime-Python on the version's own
//! graph) to `target/demo-cases.json`; `scripts/test.sh` runs it before the Rust tests.
//!
//! The README's quick-start requests are sent to a server on `models/demo` itself, as `scripts/run-demo.sh` serves
//! it, and must answer what the README shows.
//!
//! Only the DeepFM models are copied into the scoring test's repository: the LightGCN demo is checked against the toolchain's
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

/// Floats equal to 1e-6 relative (the README prints what the server printed), everything else exactly.
fn same(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Number(a), Value::Number(b)) if a.is_f64() || b.is_f64() => {
            let (a, b) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            (a - b).abs() <= 1e-6 * b.abs().max(1.0)
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same(v, w)))
        }
        _ => got == want,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_answers_as_shown() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let run_demo = std::fs::read_to_string(root.join("scripts/run-demo.sh")).expect("run-demo.sh");
    assert!(
        run_demo.contains("--repository models/demo"),
        "scripts/run-demo.sh serves models/demo"
    );
    let server = TestServer::start(config(&root.join("models/demo"), |_| {})).await;
    let lines: Vec<&str> = readme.lines().collect();
    let mut checked = 0;
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.strip_prefix("curl -s localhost:8000") else {
            continue;
        };
        let Some((path, data)) = rest.split_once(" -d ") else {
            continue;
        };
        let body: Value = match data.strip_prefix('@') {
            Some(file) => serde_json::from_str(
                &std::fs::read_to_string(root.join(file)).expect("the README's request file"),
            )
            .expect("JSON request file"),
            None => serde_json::from_str(data.trim_matches('\'')).expect("JSON request"),
        };
        let shown: Value = serde_json::from_str(
            lines
                .get(i + 1)
                .and_then(|l| l.strip_prefix("# "))
                .unwrap_or_else(|| panic!("README: no answer shown after {line:?}")),
        )
        .expect("the README's answer is JSON");
        let (status, got) = server.post(path, &body).await;
        assert_eq!(status, 200, "{path}: {got}");
        assert!(
            same(&got, &shown),
            "README shows\n{shown}\nfor {path}, but the server answers\n{got}"
        );
        checked += 1;
    }
    assert!(
        checked >= 2,
        "the README shows the rank and recall examples"
    );
    server.stop().await.expect("clean shutdown");
}
