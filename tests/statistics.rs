//! End to end: Triton's statistics and model configuration extensions over HTTP and gRPC, on the fixture
//! repository. After a known set of requests the statistics agree with `/metrics` (the same stage timings feed
//! both): successes with the request counters, queue time with the queue histogram, the per-batch-size compute
//! phases with the batch execution, gather and inference histograms, inference count with the batch rows; a call
//! the queue refuses once admitted is a failure, as `recserve_rejected_total` counts it. Models
//! and versions not served answer 404 / NOT_FOUND. The configuration carries the batcher's settings and the
//! metadata's tensors, and the version policy follows `--pin`.

mod common;

use std::collections::BTreeMap;

use common::{TestServer, cases, config, fixture_repo};
use recserve::api::kserve::grpc::proto;
use recserve::api::kserve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use recserve::config::Pin;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

const RANKING: &str = "deepfm-fp32";
const RECALL: &str = "lightgcn";

/// A count and nanoseconds, as both transports carry them.
type Duration2 = (u64, u64);

/// The numbers of one model version's statistics, read from either transport.
#[derive(Debug, PartialEq, Eq)]
struct Stats {
    name: String,
    version: String,
    last_inference: u64,
    inference_count: u64,
    execution_count: u64,
    /// success, fail, queue, compute_input, compute_infer, compute_output.
    inference: [Duration2; 6],
    /// batch size → compute_input, compute_infer, compute_output.
    batches: BTreeMap<u64, [Duration2; 3]>,
}

const FIELDS: [&str; 6] = [
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
];

fn from_json(m: &Value) -> Stats {
    let n = |v: &Value| v.as_u64().unwrap_or_else(|| panic!("a number, got {v}"));
    let d = |v: &Value| (n(&v["count"]), n(&v["ns"]));
    let phases = |b: &Value| {
        [
            d(&b["compute_input"]),
            d(&b["compute_infer"]),
            d(&b["compute_output"]),
        ]
    };
    Stats {
        name: m["name"].as_str().expect("name").to_owned(),
        version: m["version"].as_str().expect("version").to_owned(),
        last_inference: n(&m["last_inference"]),
        inference_count: n(&m["inference_count"]),
        execution_count: n(&m["execution_count"]),
        inference: FIELDS.map(|f| d(&m["inference_stats"][f])),
        batches: m["batch_stats"]
            .as_array()
            .expect("batch_stats")
            .iter()
            .map(|b| (n(&b["batch_size"]), phases(b)))
            .collect(),
    }
}

fn from_proto(m: &proto::ModelStatistics) -> Stats {
    let d = |s: &Option<proto::StatisticDuration>| {
        let s = s.as_ref().expect("a duration statistic");
        (s.count, s.ns)
    };
    let i = m.inference_stats.as_ref().expect("inference_stats");
    Stats {
        name: m.name.clone(),
        version: m.version.clone(),
        last_inference: m.last_inference,
        inference_count: m.inference_count,
        execution_count: m.execution_count,
        inference: [
            d(&i.success),
            d(&i.fail),
            d(&i.queue),
            d(&i.compute_input),
            d(&i.compute_infer),
            d(&i.compute_output),
        ],
        batches: m
            .batch_stats
            .iter()
            .map(|b| {
                (
                    b.batch_size,
                    [
                        d(&b.compute_input),
                        d(&b.compute_infer),
                        d(&b.compute_output),
                    ],
                )
            })
            .collect(),
    }
}

async fn get_json(server: &TestServer, path: &str) -> (u16, Value) {
    let (status, text) = server.get(path).await;
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}: {text}")),
    )
}

async fn http_stats(server: &TestServer, model: &str) -> Stats {
    let (status, body) = get_json(server, &format!("/v2/models/{model}/stats")).await;
    assert_eq!(status, 200, "{body}");
    let list = body["model_stats"].as_array().expect("model_stats");
    assert_eq!(list.len(), 1, "{body}");
    from_json(&list[0])
}

/// `model`'s statistics once HTTP and gRPC (read HTTP, gRPC, HTTP) give the same numbers: a batch is added when its
/// executor has finished it, which may be just after its requests were answered, so a read right after the last
/// answer can miss it (as in Triton). Panics, with both, when they still differ after 5 s.
async fn settled_stats(
    server: &TestServer,
    client: &mut GrpcInferenceServiceClient<Channel>,
    model: &str,
) -> Stats {
    let mut last = None;
    for _ in 0..100 {
        let first = http_stats(server, model).await;
        let grpc = grpc_stats(client, model).await;
        if first == grpc && http_stats(server, model).await == grpc {
            return grpc;
        }
        last = Some((first, grpc));
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!("{model}: HTTP and gRPC statistics still differ after 5 s: {last:?}");
}

async fn grpc_stats(client: &mut GrpcInferenceServiceClient<Channel>, model: &str) -> Stats {
    let response = client
        .model_statistics(proto::ModelStatisticsRequest {
            name: model.to_owned(),
            version: String::new(),
        })
        .await
        .expect("ModelStatistics")
        .into_inner();
    assert_eq!(response.model_stats.len(), 1);
    from_proto(&response.model_stats[0])
}

/// The sum of every sample of `/metrics` whose line starts with `name{` and holds every one of `labels`.
fn metric_total(metrics: &str, name: &str, labels: &[&str]) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(&format!("{name}{{")))
        .filter(|l| labels.iter().all(|label| l.contains(label)))
        .map(|l| {
            l.rsplit(' ')
                .next()
                .and_then(|v| v.parse::<f64>().ok())
                .expect("a sample value")
        })
        .sum()
}

/// Nanoseconds equal to a histogram's sum of seconds, within rounding: 1 ns per observation and 1e-9 relative.
fn assert_ns(what: &str, ns: u64, seconds: f64, observations: u64) {
    let want = seconds * 1e9;
    let slack = observations as f64 + want * 1e-9 + 1.0;
    assert!(
        (ns as f64 - want).abs() <= slack,
        "{what}: {ns} ns, but the histogram sums {want} ns"
    );
}

/// The fixture's rank requests for the served version of [`RANKING`].
fn rank_requests() -> Vec<Value> {
    let all = cases();
    let served = &all["models"][RANKING]["served_version"];
    all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["model"] == RANKING && &c["version"] == served)
        .map(|c| c["request"].clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_agree_with_the_metrics_over_http_and_grpc() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let mut client = GrpcInferenceServiceClient::connect(server.grpc_url())
        .await
        .expect("connect");

    let (status, meta) = get_json(&server, "/v2").await;
    assert_eq!(status, 200);
    for extension in ["statistics", "model_configuration"] {
        assert!(
            meta["extensions"]
                .as_array()
                .expect("extensions")
                .contains(&json!(extension)),
            "{meta}"
        );
    }

    // Warm-up batches ran at load, but no call has been made: nothing is counted.
    let before = http_stats(&server, RANKING).await;
    assert_eq!(before.inference, [(0, 0); 6], "{before:?}");
    assert_eq!((before.execution_count, before.last_inference), (0, 0));
    assert!(before.batches.is_empty());

    // One request at a time: each is a batch of its own rows.
    let requests = rank_requests();
    assert!(requests.len() >= 3, "fixture cases of {RANKING}");
    let mut rows = Vec::new();
    for request in &requests {
        let (status, body) = server
            .post(&format!("/v1/models/{RANKING}/rank"), request)
            .await;
        assert_eq!(status, 200, "{body}");
        rows.push(request["candidates"].as_array().expect("candidates").len() as u64);
    }
    for user in [1, 2, 3] {
        let (status, body) = server
            .post(
                &format!("/v1/models/{RECALL}/recall"),
                &json!({"user_id": user, "k": 5}),
            )
            .await;
        assert_eq!(status, 200, "{body}");
    }

    // A call refused by the queue once admitted: its deadline (a KServe `timeout` of 1 µs, read from the body)
    // is shorter than its own execution. A failure, not a success.
    let (status, metadata) = get_json(&server, &format!("/v2/models/{RANKING}")).await;
    assert_eq!(status, 200);
    let inputs: Vec<Value> = metadata["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .map(|t| {
            let width = t["shape"][1].as_u64().expect("width") as usize;
            // Row 0 of every table is in its vocabulary.
            json!({"name": t["name"], "datatype": t["datatype"], "shape": [200, width],
                   "data": vec![0; 200 * width]})
        })
        .collect();
    let (status, body) = server
        .post(
            &format!("/v2/models/{RANKING}/infer"),
            &json!({"inputs": inputs, "parameters": {"timeout": 1}}),
        )
        .await;
    assert_eq!(status, 400, "{body}");

    // Both transports report the same numbers (once the last batch is counted), which /metrics then agrees with.
    let http = settled_stats(&server, &mut client, RANKING).await;
    let (status, metrics) = server.get("/metrics").await;
    assert_eq!(status, 200);
    let (status, listed) = get_json(&server, &format!("/v2/models/{RANKING}")).await;
    assert_eq!(status, 200);
    assert_eq!(
        (http.name.as_str(), json!(http.version)),
        (RANKING, listed["versions"][0].clone())
    );

    let model = format!("model=\"{RANKING}\"");
    let m = [model.as_str()];
    let answered = metric_total(
        &metrics,
        "recserve_requests_total",
        &[&model, "code=\"200\""],
    ) as u64;
    let [success, fail, queue, input, infer, output] = http.inference;
    assert_eq!(success.0, requests.len() as u64);
    assert_eq!(success.0, answered, "successes = the answered requests");
    assert_eq!(fail.0, 1, "the refused call");
    assert_eq!(
        fail.0,
        metric_total(&metrics, "recserve_rejected_total", &m) as u64
    );
    assert!(
        success.1 as f64
            <= metric_total(&metrics, "recserve_request_duration_seconds_sum", &m) * 1e9 + 1.0,
        "a call's time is within its request's"
    );
    assert!(success.1 > 0);

    let queued = metric_total(&metrics, "recserve_queue_duration_seconds_count", &m) as u64;
    assert_eq!(queue.0, queued);
    assert_ns(
        "queue",
        queue.1,
        metric_total(&metrics, "recserve_queue_duration_seconds_sum", &m),
        queued,
    );
    // Each request rode alone, so each is charged its own batch.
    for phase in [input, infer, output] {
        assert_eq!(phase.0, success.0);
    }

    let executions = metric_total(&metrics, "recserve_batch_execution_seconds_count", &m) as u64;
    assert_eq!(http.execution_count, executions);
    assert_eq!(http.execution_count, requests.len() as u64);
    assert_eq!(
        http.inference_count,
        metric_total(&metrics, "recserve_batch_rows_sum", &m) as u64
    );
    assert_eq!(http.inference_count, rows.iter().sum::<u64>());
    let mut sizes: Vec<u64> = rows.clone();
    sizes.sort_unstable();
    sizes.dedup();
    assert_eq!(
        http.batches.keys().copied().collect::<Vec<_>>(),
        sizes,
        "one entry per executed batch size"
    );
    let sum = |i: usize| -> Duration2 {
        http.batches
            .values()
            .fold((0, 0), |(c, n), p| (c + p[i].0, n + p[i].1))
    };
    let (batch_input, batch_infer, batch_output) = (sum(0), sum(1), sum(2));
    for (count, _) in [batch_input, batch_infer, batch_output] {
        assert_eq!(count, executions);
    }
    // One request per batch: the model's totals are the batches'.
    assert_eq!(
        (input, infer, output),
        (batch_input, batch_infer, batch_output)
    );
    assert_ns(
        "compute_input = the gather",
        batch_input.1,
        metric_total(&metrics, "recserve_gather_duration_seconds_sum", &m),
        executions,
    );
    assert_ns(
        "compute_infer = ONNX Runtime",
        batch_infer.1,
        metric_total(&metrics, "recserve_inference_duration_seconds_sum", &m),
        executions,
    );
    assert_ns(
        "the three phases = the batch's execution",
        batch_input.1 + batch_infer.1 + batch_output.1,
        metric_total(&metrics, "recserve_batch_execution_seconds_sum", &m),
        3 * executions,
    );
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis() as u64;
    assert!(http.last_inference <= now_ms && http.last_inference + 600_000 > now_ms);

    // Recall models count too: three single-user batches.
    let recall = settled_stats(&server, &mut client, RECALL).await;
    assert_eq!(recall.inference[0].0, 3);
    assert_eq!(
        recall.inference[0].0,
        metric_total(
            &metrics,
            "recserve_requests_total",
            &[&format!("model=\"{RECALL}\""), "code=\"200\""]
        ) as u64
    );
    assert_eq!((recall.execution_count, recall.inference_count), (3, 3));
    assert_eq!(recall.batches.keys().copied().collect::<Vec<_>>(), vec![1]);

    // Every served model, over both transports.
    let (status, every) = get_json(&server, "/v2/models/stats").await;
    assert_eq!(status, 200);
    let names: Vec<&str> = every["model_stats"]
        .as_array()
        .expect("model_stats")
        .iter()
        .map(|m| m["name"].as_str().expect("name"))
        .collect();
    let all = client
        .model_statistics(proto::ModelStatisticsRequest::default())
        .await
        .expect("ModelStatistics")
        .into_inner();
    assert_eq!(
        all.model_stats
            .iter()
            .map(|m| m.name.as_str())
            .collect::<Vec<_>>(),
        names
    );
    for name in [RANKING, RECALL] {
        assert!(names.contains(&name), "{names:?}");
    }

    // What is not served.
    let version = &http.version;
    let (status, body) = get_json(
        &server,
        &format!("/v2/models/{RANKING}/versions/{version}/stats"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    for (path, message) in [
        (
            format!("/v2/models/{RANKING}/versions/999/stats"),
            format!("model \"{RANKING}\" version 999 is not served (serving version {version})"),
        ),
        (
            "/v2/models/no-such-model/stats".to_owned(),
            "model \"no-such-model\" is not served".to_owned(),
        ),
        (
            format!("/v2/models/{RANKING}/versions/999/config"),
            format!("model \"{RANKING}\" version 999 is not served (serving version {version})"),
        ),
        (
            "/v2/models/no-such-model/config".to_owned(),
            "model \"no-such-model\" is not served".to_owned(),
        ),
    ] {
        let (status, body) = get_json(&server, &path).await;
        assert_eq!(status, 404, "{path}: {body}");
        let error = body["error"].as_str().expect("error");
        assert!(error.starts_with(&message), "{path}: {error}");
    }
    for (name, version) in [(RANKING, "999"), ("no-such-model", "")] {
        let stats = client
            .model_statistics(proto::ModelStatisticsRequest {
                name: name.to_owned(),
                version: version.to_owned(),
            })
            .await
            .expect_err("not served");
        assert_eq!(stats.code(), Code::NotFound, "{stats:?}");
        let config = client
            .model_config(proto::ModelConfigRequest {
                name: name.to_owned(),
                version: version.to_owned(),
            })
            .await
            .expect_err("not served");
        assert_eq!(config.code(), Code::NotFound, "{config:?}");
    }
    server.stop().await.expect("clean shutdown");
}

async fn http_config(server: &TestServer, model: &str) -> Value {
    let (status, body) = get_json(server, &format!("/v2/models/{model}/config")).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn grpc_config(
    client: &mut GrpcInferenceServiceClient<Channel>,
    model: &str,
) -> proto::ModelConfig {
    client
        .model_config(proto::ModelConfigRequest {
            name: model.to_owned(),
            version: String::new(),
        })
        .await
        .expect("ModelConfig")
        .into_inner()
        .config
        .expect("config")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_configuration_is_the_batchers_and_the_metadatas() {
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.max_batch_rows = Some(512);
        a.max_queue_delay_us = Some(300);
        a.pin = vec![Pin {
            model: RANKING.to_owned(),
            version: 1,
        }];
    }))
    .await;
    let mut client = GrpcInferenceServiceClient::connect(server.grpc_url())
        .await
        .expect("connect");

    let (_, metadata) = get_json(&server, &format!("/v2/models/{RANKING}")).await;
    assert_eq!(metadata["versions"], json!(["1"]), "pinned");
    let http = http_config(&server, RANKING).await;
    assert_eq!(http["name"], RANKING);
    assert_eq!(http["platform"], metadata["platform"]);
    assert_eq!(http["backend"], "onnxruntime");
    assert_eq!(http["max_batch_size"], 512);
    assert_eq!(
        http["version_policy"],
        json!({"specific": {"versions": [1]}})
    );
    let inputs = metadata["inputs"].as_array().expect("inputs");
    assert_eq!(http["input"].as_array().expect("input").len(), inputs.len());
    for (config, meta) in http["input"].as_array().expect("input").iter().zip(inputs) {
        assert_eq!(config["name"], meta["name"]);
        assert_eq!(
            config["data_type"],
            format!("TYPE_{}", meta["datatype"].as_str().expect("datatype"))
        );
        let shape = meta["shape"].as_array().expect("shape");
        assert_eq!(shape[0], -1, "the batch axis");
        assert_eq!(config["dims"].as_array().expect("dims"), &shape[1..]);
    }
    assert_eq!(http["output"][0]["name"], metadata["outputs"][0]["name"]);
    let preferred = http["dynamic_batching"]["preferred_batch_size"]
        .as_array()
        .expect("preferred_batch_size");
    assert_eq!(
        preferred.last(),
        Some(&json!(512)),
        "the buckets end at max"
    );
    assert_eq!(
        http["dynamic_batching"]["max_queue_delay_microseconds"],
        300
    );
    assert_eq!(http["instance_group"][0]["kind"], "KIND_CPU");
    assert!(http["instance_group"][0]["count"].as_u64().expect("count") >= 1);

    // gRPC says the same.
    let grpc = grpc_config(&mut client, RANKING).await;
    assert_eq!(
        (grpc.name.as_str(), grpc.backend.as_str()),
        (RANKING, "onnxruntime")
    );
    assert_eq!(grpc.max_batch_size, 512);
    assert_eq!(
        grpc.input.iter().map(|i| json!(i.dims)).collect::<Vec<_>>(),
        http["input"]
            .as_array()
            .expect("input")
            .iter()
            .map(|i| i["dims"].clone())
            .collect::<Vec<_>>()
    );
    let batching = grpc.dynamic_batching.as_ref().expect("dynamic_batching");
    assert_eq!(json!(batching.preferred_batch_size), json!(preferred));
    assert_eq!(batching.max_queue_delay_microseconds, 300);
    assert_eq!(
        grpc.instance_group[0].kind,
        proto::model_instance_group::Kind::Cpu as i32
    );
    assert_eq!(
        json!(grpc.instance_group[0].count),
        http["instance_group"][0]["count"]
    );

    // The pinned version is the one served: its statistics exist, the highest's do not.
    let (status, _) = get_json(&server, &format!("/v2/models/{RANKING}/versions/1/stats")).await;
    assert_eq!(status, 200);
    let (status, body) = get_json(&server, &format!("/v2/models/{RANKING}/versions/2/stats")).await;
    assert_eq!(status, 404, "{body}");

    // A recall model: `k` is one value per request, so no batch axis leads every tensor.
    let recall = http_config(&server, RECALL).await;
    assert_eq!(recall["backend"], "recserve");
    assert_eq!(recall["max_batch_size"], 0);
    assert_eq!(
        recall["version_policy"],
        json!({"latest": {"num_versions": 1}})
    );
    assert_eq!(
        recall["parameters"]["max_batch_rows"]["string_value"],
        "512"
    );
    let (_, recall_metadata) = get_json(&server, &format!("/v2/models/{RECALL}")).await;
    for (config, meta) in recall["input"]
        .as_array()
        .expect("input")
        .iter()
        .zip(recall_metadata["inputs"].as_array().expect("inputs"))
    {
        assert_eq!(config["dims"], meta["shape"], "whole shapes");
    }
    let k = recall["input"]
        .as_array()
        .expect("input")
        .iter()
        .find(|i| i["name"] == "k")
        .expect("k");
    assert_eq!(k["optional"], true);
    let grpc = grpc_config(&mut client, RECALL).await;
    assert_eq!(
        (grpc.max_batch_size, grpc.backend.as_str()),
        (0, "recserve")
    );
    server.stop().await.expect("clean shutdown");
}
