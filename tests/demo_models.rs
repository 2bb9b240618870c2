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
//!
//! Every demo model is also called by the real `tritonclient` from its metadata alone, over HTTP (JSON and binary
//! tensors) and gRPC (tests/kserve_client.py `--generic`), as generic Open Inference Protocol tooling would; then
//! its statistics and configuration (Triton's extensions) are read through both clients and checked.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use common::{TestServer, config, copy_dir, demo_cases};
use recserve::config::Config;
use serde_json::{Value, json};

/// The parity bound against the toolchain's scores, for FP32 and INT8 alike: the server runs the same ONNX Runtime
/// library at the same optimisation level on the same gathered rows.
const TOLERANCE: f64 = 1e-5;

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

/// The server as scripts/run-demo.sh starts it: `--repository models/demo --config models/demo/recserve.toml`.
fn demo_config() -> Config {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let run_demo = std::fs::read_to_string(root.join("scripts/run-demo.sh")).expect("run-demo.sh");
    let line = run_demo
        .lines()
        .find(|l| l.contains("recserve -- serve"))
        .expect("scripts/run-demo.sh runs recserve serve");
    let flag = |name: &str| {
        let rest = &line[line
            .find(name)
            .unwrap_or_else(|| panic!("run-demo.sh passes {name}"))
            + name.len()..];
        root.join(rest.split_whitespace().next().expect("a value"))
    };
    let (repository, file) = (flag("--repository "), flag("--config "));
    assert_eq!(
        repository,
        root.join("models/demo"),
        "scripts/run-demo.sh serves models/demo"
    );
    config(&repository, |a| a.config = Some(file))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_quick_start_answers_as_shown() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).expect("README.md");
    let server = TestServer::start(demo_config()).await;
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
        checked >= 3,
        "the README shows the rank, recall and recommend examples"
    );
    assert!(
        readme.contains("curl -s localhost:8000/v1/recommend/demo -d "),
        "the README shows the demo pipeline"
    );
    server.stop().await.expect("clean shutdown");
}

/// A number as tritonclient hands it over: a JSON number (HTTP), a string (gRPC's `as_json`: protobuf's JSON
/// writes 64-bit integers as strings), or absent (protobuf's JSON leaves zeros out).
fn number(v: &Value) -> u64 {
    match v {
        Value::Null => 0,
        Value::String(s) => s.parse().unwrap_or_else(|_| panic!("a number, got {s:?}")),
        other => other
            .as_u64()
            .unwrap_or_else(|| panic!("a number, got {other}")),
    }
}

/// The numbers of one `$model_stat` (either transport): version, inference and execution counts, each inference
/// statistic's count and ns, and each batch size's.
fn statistic_numbers(stat: &Value) -> Value {
    let duration = |d: &Value| json!([number(&d["count"]), number(&d["ns"])]);
    let stats = &stat["inference_stats"];
    let batches: Vec<Value> = stat["batch_stats"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|b| {
            json!([
                number(&b["batch_size"]),
                duration(&b["compute_input"]),
                duration(&b["compute_infer"]),
                duration(&b["compute_output"]),
            ])
        })
        .collect();
    let inference = [
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
    ]
    .map(|f| duration(&stats[f]));
    json!({
        "version": stat["version"],
        "last_inference": number(&stat["last_inference"]),
        "inference_count": number(&stat["inference_count"]),
        "execution_count": number(&stat["execution_count"]),
        "inference_stats": inference,
        "batch_stats": batches,
    })
}

/// What tritonclient read of a demo model's statistics and configuration after its nine generic calls: both
/// transports agree, the nine calls are the successes, and the configuration's tensors are the metadata's.
fn check_extensions(model: &str, kind: &str, results: &Value) {
    let metadata = &results["metadata"]["http"];
    let stats = |transport: &str| {
        let list = results["statistics"][transport]["model_stats"]
            .as_array()
            .unwrap_or_else(|| panic!("{model}: {transport} model_stats in {results}"));
        assert_eq!(list.len(), 1, "{model} {transport}: {list:?}");
        assert_eq!(list[0]["name"], model, "{model} {transport}");
        statistic_numbers(&list[0])
    };
    let (http, grpc) = (stats("http"), stats("grpc"));
    assert_eq!(http, grpc, "{model}: statistics over HTTP and gRPC");
    assert_eq!(http["version"], metadata["versions"][0], "{model}");
    let [success, fail] = [0, 1].map(|i| http["inference_stats"][i].clone());
    assert_eq!(success[0], 9, "{model}: the nine generic calls succeeded");
    assert!(success[1].as_u64().expect("ns") > 0, "{model}: {success}");
    assert_eq!(fail, json!([0, 0]), "{model}");
    let executions = http["execution_count"].as_u64().expect("count");
    assert!(
        (1..=9).contains(&executions),
        "{model}: {executions} batches for 9 calls"
    );
    let batches = http["batch_stats"].as_array().expect("batch_stats");
    let counted: u64 = batches
        .iter()
        .map(|b| b[2][0].as_u64().expect("count"))
        .sum();
    assert_eq!(counted, executions, "{model}: every batch in one size");
    assert!(http["last_inference"].as_u64().expect("ms") > 0);

    let config = &results["config"]["http"];
    let grpc_config = &results["config"]["grpc"]["config"];
    assert_eq!(config["name"], model);
    assert_eq!(grpc_config["name"], model);
    let names = |tensors: &Value| -> Vec<Value> {
        tensors
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default()
            .iter()
            .map(|t| t["name"].clone())
            .collect()
    };
    for (what, config_key, metadata_key) in [
        ("inputs", "input", "inputs"),
        ("outputs", "output", "outputs"),
    ] {
        assert_eq!(
            names(&config[config_key]),
            names(&metadata[metadata_key]),
            "{model}: the configuration's {what} are the metadata's"
        );
        assert_eq!(
            names(&grpc_config[config_key]),
            names(&metadata[metadata_key]),
            "{model}: gRPC"
        );
    }
    let max_batch_size = number(&config["max_batch_size"]);
    assert_eq!(
        max_batch_size,
        number(&grpc_config["max_batch_size"]),
        "{model}"
    );
    if kind == "lightgcn" {
        assert_eq!(max_batch_size, 0, "{model}: k has no batch axis");
        assert_eq!(config["backend"], "recserve");
    } else {
        assert!(max_batch_size > 0, "{model}");
        assert_eq!(config["backend"], "onnxruntime");
        for (tensor, meta) in config["input"]
            .as_array()
            .expect("input")
            .iter()
            .zip(metadata["inputs"].as_array().expect("inputs"))
        {
            let shape = meta["shape"].as_array().expect("shape");
            assert_eq!(
                tensor["dims"].as_array().expect("dims"),
                &shape[1..],
                "{model}: dims without the batch axis"
            );
        }
    }
    let preferred = |c: &Value| -> Vec<u64> {
        c["dynamic_batching"]["preferred_batch_size"]
            .as_array()
            .expect("preferred_batch_size")
            .iter()
            .map(number)
            .collect()
    };
    assert_eq!(preferred(config), preferred(grpc_config), "{model}");
    assert!(!preferred(config).is_empty(), "{model}");
    assert_eq!(
        config["instance_group"][0]["kind"],
        grpc_config["instance_group"][0]["kind"]
    );

    let unknown = results["unknown"].as_array().expect("unknown");
    assert_eq!(unknown.len(), 4, "{model}");
    for error in unknown {
        let want = if error["protocol"] == "http" {
            "404"
        } else {
            "StatusCode.NOT_FOUND"
        };
        assert_eq!(error["status"], want, "{model}: {error}");
        let message = error["message"].as_str().expect("message");
        assert!(
            message.contains("version 999 is not served"),
            "{model}: {message}"
        );
    }
    eprintln!(
        "{model}: statistics {} calls in {executions} batches, max_batch_size {max_batch_size}",
        success[0]
    );
}

/// Runs tests/kserve_client.py `--generic` (the real tritonclient) on `models`.
async fn generic_tritonclient(server: &TestServer, models: &[String]) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("generic.json");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/kserve_client.py");
    let python = std::env::var("RECSERVE_TEST_PYTHON").unwrap_or_else(|_| "python".to_owned());
    let mut command = std::process::Command::new(&python);
    command
        .arg(script)
        .args(["--http", &server.addr.to_string()])
        .args(["--grpc", &server.grpc_addr.to_string()])
        .args(["--generic", &models.join(",")])
        .arg("--out")
        .arg(&out);
    let output = tokio::task::spawn_blocking(move || command.output())
        .await
        .expect("python task")
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {python:?} ({e}): source scripts/env.sh (the .venv has tritonclient)"
            )
        });
    assert!(
        output.status.success(),
        "tests/kserve_client.py --generic failed ({}):\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(&out).expect("results")).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_calls_every_demo_model_from_its_metadata_alone() {
    let server = TestServer::start(demo_config()).await;
    let (status, listing) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    let listing: Value = serde_json::from_str(&listing).expect("JSON");
    let models: Vec<String> = listing["models"]
        .as_array()
        .expect("models")
        .iter()
        .map(|m| m["name"].as_str().expect("name").to_owned())
        .collect();
    assert!(models.len() >= 4, "the demo serves {models:?}");
    let results = generic_tritonclient(&server, &models).await;
    for model in &models {
        let kind = listing["models"]
            .as_array()
            .and_then(|all| all.iter().find(|m| m["name"] == model.as_str()))
            .map(|m| m["kind"].as_str().expect("kind").to_owned())
            .expect("listed");
        check_extensions(model, &kind, &results["generic"][model]);
        let calls = results["generic"][model]["calls"]
            .as_array()
            .expect("calls");
        assert_eq!(calls.len(), 9, "{model}: 3 requests over 3 transports");
        // Calls with the same inputs answer the same over every transport.
        let mut by_inputs: BTreeMap<String, Vec<&Value>> = BTreeMap::new();
        for call in calls {
            by_inputs
                .entry(call["inputs"].to_string())
                .or_default()
                .push(call);
        }
        for same in by_inputs.values() {
            for call in same {
                assert_eq!(
                    call["outputs"], same[0]["outputs"],
                    "{model}: {} vs {}",
                    call["transport"], same[0]["transport"]
                );
            }
        }
        for call in calls {
            let what = format!("{model} {} {}", call["transport"], call["variant"]);
            let inputs = call["inputs"].as_object().expect("inputs");
            let names: Vec<&String> = inputs.keys().collect();
            if kind == "lightgcn" {
                let users = &inputs["user_id"]["values"];
                let k = match inputs.get("k") {
                    Some(k) => k["values"][0].as_u64().expect("k") as usize,
                    None => {
                        let properties =
                            &results["generic"][model]["metadata"]["http"]["properties"];
                        properties["k.default"]
                            .as_str()
                            .expect("k.default")
                            .parse()
                            .expect("k")
                    }
                };
                let ids = &call["outputs"]["item_ids"];
                assert_eq!(ids["shape"], json!([2, k]), "{what}");
                for (row, user) in users.as_array().expect("users").iter().enumerate() {
                    let (status, v1) = server
                        .post(
                            &format!("/v1/models/{model}/recall"),
                            &json!({"user_id": user, "k": k}),
                        )
                        .await;
                    assert_eq!(status, 200, "{what}: {v1}");
                    let expected: Vec<&Value> = v1["items"]
                        .as_array()
                        .expect("items")
                        .iter()
                        .map(|i| &i["id"])
                        .collect();
                    let got: Vec<&Value> = ids["values"].as_array().expect("ids")
                        [row * k..(row + 1) * k]
                        .iter()
                        .collect();
                    assert_eq!(got, expected, "{what}: user {user} as /v1 answers");
                }
                eprintln!(
                    "{what}: inputs {names:?}, item_ids {} = /v1 recall",
                    ids["shape"]
                );
            } else {
                let scores = &call["outputs"]["probability"];
                assert_eq!(scores["shape"], json!([2, 1]), "{what}");
                let values: Vec<f64> = scores["values"]
                    .as_array()
                    .expect("values")
                    .iter()
                    .map(|v| v.as_f64().expect("f"))
                    .collect();
                assert!(
                    values.iter().all(|p| *p > 0.0 && *p < 1.0),
                    "{what}: {values:?}"
                );
                eprintln!("{what}: inputs {names:?}, probability {values:?}");
            }
        }
    }
    server.stop().await.expect("clean shutdown");
}
