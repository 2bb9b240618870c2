//! End to end on a benchmark model of realistic shape (`python -m recserve_models synth --preset realistic`, small:
//! `--max-rows` caps its tables; 26 fields × 17 values, MLP 429→400→400→400→1, INT8 and fp32 graphs): the server
//! serves both versions the toolchain wrote and returns the toolchain's offline scores for its requests, and
//! gathering each request's user side once (`--gather-user-once on`, the default) gives exactly the scores of
//! gathering it once per candidate (`off`).
//!
//!
//! With `--split` the toolchain also writes versions whose graph is split into a user part and an item part
//! (`[dense_graph.split]`): served with `--split-graph on` (the user graph once per request) they give the INT8
//! scores of the whole graph (`off`) bit for bit, and the fp32 ones within float rounding; requests sent at once,
//! so that batches hold several requests, get the toolchain's offline scores.
//!
//! `scripts/test.sh` writes the model first (`target/synth-small`, or `RECSERVE_SYNTH_DIR`).

mod common;

use std::path::{Path, PathBuf};

use common::{TestServer, config};
use recserve::config::{BatchDelay, Switch};
use serde_json::Value;

fn synth_dir() -> PathBuf {
    let dir = std::env::var_os("RECSERVE_SYNTH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/synth-small"));
    assert!(
        dir.join("realistic-cases.json").is_file(),
        "no synth model at {}: run scripts/test.sh, which writes it (python -m recserve_models synth --preset \
         realistic --max-rows 5000 --requests 8 --split --out target/synth-small), or set RECSERVE_SYNTH_DIR",
        dir.display()
    );
    dir
}

/// The synth model's cases (`realistic-cases.json`: requests and the toolchain's offline scores) and the tolerance
/// of their scores.
fn cases(dir: &Path) -> (Vec<Value>, f64) {
    let document: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("realistic-cases.json")).expect("read cases"),
    )
    .expect("cases are JSON");
    let cases = document["cases"].as_array().expect("cases").clone();
    assert!(!cases.is_empty());
    (cases, document["tolerance"].as_f64().expect("tolerance"))
}

/// Every case's scores from `server` for `model`, in candidate order.
async fn scores(server: &TestServer, model: &str, cases: &[Value]) -> Vec<Vec<f64>> {
    let mut all = Vec::new();
    for (c, case) in cases.iter().enumerate() {
        let (status, body) = server
            .post(&format!("/v1/models/{model}/rank"), &case["request"])
            .await;
        assert_eq!(status, 200, "case {c} ({model}): {body}");
        let mut scores = vec![
            f64::NAN;
            case["request"]["candidates"]
                .as_array()
                .expect("candidates")
                .len()
        ];
        for s in body["scores"].as_array().expect("scores") {
            scores[s["index"].as_u64().expect("index") as usize] =
                s["score"].as_f64().expect("score");
        }
        all.push(scores);
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_serves_the_synth_model_with_the_toolchain_s_scores_and_gathers_the_user_side_once()
 {
    let dir = synth_dir();
    let (cases, tolerance) = cases(&dir);
    let cases = &cases[..];

    let mut by_switch = Vec::new();
    for switch in [Switch::On, Switch::Off] {
        let server =
            TestServer::start(config(&dir, |args| args.gather_user_once = Some(switch))).await;
        let mut models = Vec::new();
        for model in ["realistic-int8", "realistic-fp32"] {
            let got = scores(&server, model, cases).await;
            for (c, (case, got)) in cases.iter().zip(&got).enumerate() {
                let want = case["expected_scores"][model].as_array().expect("expected");
                for (i, (g, w)) in got.iter().zip(want).enumerate() {
                    let w = w.as_f64().expect("float");
                    assert!(
                        (g - w).abs() <= tolerance,
                        "{model} ({switch:?}) case {c} candidate {i}: {g}, offline {w}"
                    );
                }
            }
            models.push(got);
        }
        server.stop().await.expect("stop");
        by_switch.push(models);
    }
    // The same f32 scores, printed the same: not within a tolerance, equal.
    assert_eq!(
        by_switch[0], by_switch[1],
        "--gather-user-once on and off disagree"
    );
}

fn within(got: &[Vec<f64>], want: &[Vec<f64>], tolerance: f64, what: &str) {
    for (c, (got, want)) in got.iter().zip(want).enumerate() {
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= tolerance,
                "{what} case {c} candidate {i}: {g}, expected {w}"
            );
        }
    }
}

fn offline(cases: &[Value], model: &str) -> Vec<Vec<f64>> {
    cases
        .iter()
        .map(|case| {
            case["expected_scores"][model]
                .as_array()
                .unwrap_or_else(|| {
                    panic!("no offline scores for {model}: write the model with --split")
                })
                .iter()
                .map(|v| v.as_f64().expect("float"))
                .collect()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_graph_gives_the_scores_of_the_whole_graph() {
    let dir = synth_dir();
    let (cases, tolerance) = cases(&dir);
    let cases = &cases[..];
    let models = ["realistic-int8-split", "realistic-fp32-split"];

    let mut by_switch = Vec::new();
    for switch in [Switch::On, Switch::Off] {
        let server = TestServer::start(config(&dir, |args| {
            args.split_graph = Some(switch);
            // Several requests per batch: a free executor waits up to 20 ms for company.
            args.batch_delay = Some(BatchDelay::Fixed);
            args.max_queue_delay_us = Some(20_000);
        }))
        .await;
        let mut got = Vec::new();
        for model in models {
            // One at a time: every batch is one request, the same on both servers.
            let alone = scores(&server, model, cases).await;
            within(&alone, &offline(cases, model), tolerance, model);
            got.push(alone);
            // All at once: batches of several requests, each with its own user side.
            let together = futures_util::future::join_all(
                cases
                    .iter()
                    .map(|case| scores(&server, model, std::slice::from_ref(case))),
            )
            .await
            .into_iter()
            .flatten()
            .collect::<Vec<_>>();
            within(&together, &offline(cases, model), tolerance, model);
        }
        server.stop().await.expect("stop");
        by_switch.push(got);
    }
    let [int8_split, fp32_split] = &by_switch[0][..] else {
        unreachable!()
    };
    let [int8_whole, fp32_whole] = &by_switch[1][..] else {
        unreachable!()
    };
    // INT8: bit for bit (the parts are the graph's own nodes; see models/recserve_models/split_graph.py).
    assert_eq!(
        int8_split, int8_whole,
        "the split INT8 graph and the whole one disagree"
    );
    // fp32: ONNX Runtime's fp32 Gemm rounds a row by the number of rows it runs with, so split and whole differ in
    // the last bits; 1e-6 bounds that rounding with a wide margin.
    within(fp32_split, fp32_whole, 1e-6, "fp32 split against whole");
}

/// A KServe v2 request's rows, unlike a `/v1` request's candidates, may each carry another user: the split graph
/// must give every row its own user side, not the first row's to the whole request (a silently wrong ranking).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_graph_gives_kserve_rows_of_different_users_their_own_user_side() {
    let dir = synth_dir();
    let (cases, tolerance) = cases(&dir);
    assert!(cases.len() >= 2, "needs two cases, two users");
    let server = TestServer::start(config(&dir, |_| {})).await;
    for model in ["realistic-int8-split", "realistic-fp32-split"] {
        let toml = std::fs::read_to_string(dir.join(model).join("1/model.toml")).expect("toml");
        let spec = recserve_core::repository::ModelSpec::parse(&toml).expect("model.toml");
        let id_field = spec
            .ranking
            .as_ref()
            .and_then(|r| r.item_id_field)
            .expect("an item id field");
        // Rows of three candidates of each case, interleaved: the user side changes at every row.
        let (mut categorical, mut dense, mut want) = (Vec::new(), Vec::new(), Vec::new());
        for i in 0..3 {
            for case in &cases {
                let request = &case["request"];
                let candidate = &request["candidates"][i];
                for (f, field) in spec.fields.iter().enumerate() {
                    let id = if f == id_field {
                        &candidate["id"]
                    } else {
                        request["user"]["fields"]
                            .get(&field.name)
                            .unwrap_or(&candidate["fields"][&field.name])
                    };
                    categorical.push(id.as_i64().expect("an id"));
                }
                dense.extend(
                    request["user"]["dense"]
                        .as_array()
                        .expect("dense")
                        .iter()
                        .map(|v| v.as_f64().expect("float")),
                );
                want.push(case["expected_scores"][model][i].as_f64().expect("offline"));
            }
        }
        let rows = want.len();
        let body = serde_json::json!({"inputs": [
            {"name": "categorical", "datatype": "INT64", "shape": [rows, spec.fields.len()], "data": categorical},
            {"name": "dense", "datatype": "FP32", "shape": [rows, dense.len() / rows], "data": dense},
        ]});
        let (status, answer) = server
            .post(&format!("/v2/models/{model}/infer"), &body)
            .await;
        assert_eq!(status, 200, "{model}: {answer}");
        let got: Vec<f64> = answer["outputs"][0]["data"]
            .as_array()
            .expect("scores")
            .iter()
            .map(|v| v.as_f64().expect("float"))
            .collect();
        within(&[got], &[want], tolerance, model);
    }
    server.stop().await.expect("stop");
}
