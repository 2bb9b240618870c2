//! End to end over the KServe v2 / Open Inference Protocol: a real server on ports 0 (HTTP and gRPC), driven by
//! the real `tritonclient` package (tests/kserve_client.py: HTTP with binary data on and off, and gRPC) and by raw
//! HTTP and tonic clients. The scores of every fixture case equal the `/v1` scores of the same rows bit for bit:
//! the same rows reach the same executor as the same batch through the same service function, and every
//! transport carries the f32 exactly (binary little-endian, or the shortest decimal that round-trips). Malformed
//! tensors get 400 / INVALID_ARGUMENT naming the tensor while concurrent good requests keep their answers.

mod common;

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use common::{TestServer, cases, config, fixture_repo, run_python};
use recserve::api::kserve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use recserve::api::kserve::grpc::proto::model_infer_request::{
    InferInputTensor, InferRequestedOutputTensor,
};
use recserve::api::kserve::grpc::proto::{self, InferTensorContents};
use recserve::config::{BatchDelay, Config};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// Above the fixture's largest case (257 candidates), low enough to test the limit cheaply.
const MAX_CANDIDATES: usize = 300;

fn test_config() -> Config {
    config(&fixture_repo(), |a| a.max_candidates = Some(MAX_CANDIDATES))
}

/// One fixture rank request as KServe rows, with the `/v1` scores of the same request.
#[derive(Debug, Clone)]
struct Job {
    model: String,
    what: String,
    categorical: Vec<Vec<i64>>,
    dense: Vec<Vec<f32>>,
    v1: Vec<f32>,
}

impl Job {
    fn rows(&self) -> usize {
        self.categorical.len()
    }

    fn fields(&self) -> usize {
        self.categorical[0].len()
    }

    fn ids(&self) -> Vec<i64> {
        self.categorical.concat()
    }

    fn dense_values(&self) -> Vec<f32> {
        self.dense.concat()
    }

    fn raw_ids(&self) -> Vec<u8> {
        self.ids().iter().flat_map(|v| v.to_le_bytes()).collect()
    }

    fn raw_dense(&self) -> Vec<u8> {
        self.dense_values()
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    /// The v2 JSON request body.
    fn json_body(&self) -> Value {
        json!({
            "id": "json-1",
            "inputs": [
                {"name": "categorical", "shape": [self.rows(), self.fields()], "datatype": "INT64", "data": self.categorical},
                {"name": "dense", "shape": [self.rows(), self.dense[0].len()], "datatype": "FP32", "data": self.dense},
            ],
        })
    }

    /// A gRPC request with raw contents.
    fn grpc_raw(&self) -> proto::ModelInferRequest {
        proto::ModelInferRequest {
            model_name: self.model.clone(),
            inputs: vec![
                input("categorical", "INT64", &[self.rows(), self.fields()], None),
                input("dense", "FP32", &[self.rows(), self.dense[0].len()], None),
            ],
            raw_input_contents: vec![self.raw_ids().into(), self.raw_dense().into()],
            ..Default::default()
        }
    }
}

fn input(
    name: &str,
    datatype: &str,
    shape: &[usize],
    contents: Option<InferTensorContents>,
) -> InferInputTensor {
    InferInputTensor {
        name: name.to_owned(),
        datatype: datatype.to_owned(),
        shape: shape.iter().map(|&d| d as i64).collect(),
        parameters: HashMap::new(),
        contents,
    }
}

/// Scores of a `/v1` request in request order (`top_k` removed, so every candidate is scored).
async fn v1_scores(server: &TestServer, model: &str, request: &Value) -> Vec<f32> {
    let mut request = request.clone();
    if let Some(object) = request.as_object_mut() {
        object.remove("top_k");
    }
    let (status, body) = server
        .post(&format!("/v1/models/{model}/rank"), &request)
        .await;
    assert_eq!(status, 200, "{body}");
    let entries = body["scores"].as_array().expect("scores");
    let mut scores = vec![f32::NAN; entries.len()];
    for s in entries {
        scores[s["index"].as_u64().expect("index") as usize] =
            s["score"].as_f64().expect("score") as f32;
    }
    scores
}

/// Every fixture case on a served version, as rows in the column order of the model's v2 metadata.
async fn jobs(server: &TestServer) -> Vec<Job> {
    let all = cases();
    let mut jobs = Vec::new();
    for case in all["cases"].as_array().expect("cases") {
        let model = case["model"].as_str().expect("model");
        let info = &all["models"][model];
        if case["version"] != info["served_version"] {
            continue;
        }
        let (status, text) = server.get(&format!("/v2/models/{model}")).await;
        assert_eq!(status, 200, "{text}");
        let metadata: Value = serde_json::from_str(&text).expect("metadata JSON");
        let columns: Vec<String> =
            serde_json::from_value(metadata["inputs"][0]["columns"].clone()).expect("columns");
        let expected_columns: Vec<Value> = [
            info["user_fields"].as_array().expect("user").as_slice(),
            info["item_fields"].as_array().expect("item").as_slice(),
        ]
        .concat();
        assert_eq!(
            json!(columns),
            json!(expected_columns),
            "{model}: fields in model.toml order"
        );
        let item_id_field = info["item_id_field"].as_str();
        let request = &case["request"];
        let user = &request["user"]["fields"];
        let dense: Vec<f32> = request["user"]["dense"]
            .as_array()
            .expect("dense")
            .iter()
            .map(|v| v.as_f64().expect("number") as f32)
            .collect();
        let mut categorical = Vec::new();
        for candidate in request["candidates"].as_array().expect("candidates") {
            let row = columns
                .iter()
                .map(|c| {
                    let v = if Some(c.as_str()) == item_id_field {
                        &candidate["id"]
                    } else if user.get(c).is_some() {
                        &user[c]
                    } else {
                        &candidate["fields"][c]
                    };
                    v.as_i64()
                        .unwrap_or_else(|| panic!("{model}: no id for {c}"))
                })
                .collect::<Vec<i64>>();
            categorical.push(row);
        }
        let rows = categorical.len();
        jobs.push(Job {
            model: model.to_owned(),
            what: case["what"].as_str().expect("what").to_owned(),
            categorical,
            dense: vec![dense; rows],
            v1: v1_scores(server, model, request).await,
        });
    }
    jobs
}

fn assert_bits_equal(what: &str, got: &[f32], expected: &[f32]) {
    assert_eq!(got.len(), expected.len(), "{what}: number of scores");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert_eq!(
            g.to_bits(),
            e.to_bits(),
            "{what}: row {i} scored {g} over KServe v2, {e} over /v1"
        );
    }
}

fn f32s(values: &Value) -> Vec<f32> {
    values
        .as_array()
        .expect("array")
        .iter()
        .map(|v| v.as_f64().expect("number") as f32)
        .collect()
}

/// An int64 that protobuf's JSON mapping may have written as a string.
fn int(v: &Value) -> i64 {
    v.as_i64()
        .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
        .unwrap_or_else(|| panic!("not an integer: {v}"))
}

fn shape(v: &Value) -> Vec<i64> {
    v.as_array().expect("shape").iter().map(int).collect()
}

/// Runs tests/kserve_client.py (the real tritonclient) against the server; fails loudly when Python or
/// tritonclient is missing.
async fn run_tritonclient(server: &TestServer, jobs: &[Job]) -> Value {
    let dir = tempfile::tempdir().expect("tempdir");
    let jobs_file = dir.path().join("jobs.json");
    let out_file = dir.path().join("results.json");
    let spec = json!({
        "model": "deepfm-fp32",
        "jobs": jobs.iter().map(|j| json!({
            "model": j.model,
            "categorical": j.categorical,
            "dense": j.dense,
            "output": "probability",
        })).collect::<Vec<_>>(),
    });
    std::fs::write(&jobs_file, spec.to_string()).expect("write jobs");
    let args = vec![
        "--http".to_owned(),
        server.addr.to_string(),
        "--grpc".to_owned(),
        server.grpc_addr.to_string(),
        "--jobs".to_owned(),
        jobs_file.display().to_string(),
        "--out".to_owned(),
        out_file.display().to_string(),
    ];
    run_python("kserve_client.py", args).await;
    let text = std::fs::read_to_string(&out_file).expect("results");
    serde_json::from_str(&text).expect("results JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tritonclient_scores_equal_v1_over_http_binary_json_and_grpc() {
    let server = TestServer::start(test_config()).await;
    let jobs = jobs(&server).await;
    assert!(jobs.len() >= 20, "only {} fixture cases", jobs.len());
    for model in ["deepfm-fp32", "deepfm-fp16", "deepfm-int8"] {
        assert!(jobs.iter().any(|j| j.model == model), "no case for {model}");
    }
    assert!(jobs.iter().any(|j| j.rows() > 256), "a case above 256 rows");
    let results = run_tritonclient(&server, &jobs).await;

    // Health and metadata, as tritonclient sees them over both protocols.
    for protocol in ["http", "grpc"] {
        let facts = &results["server"][protocol];
        for key in ["live", "ready", "model_ready"] {
            assert_eq!(facts[key], true, "{protocol} {key}");
        }
        assert_eq!(facts["server_metadata"]["name"], "recserve", "{protocol}");
        assert!(
            facts["server_metadata"]["extensions"]
                .as_array()
                .expect("extensions")
                .contains(&json!("binary_tensor_data")),
            "{protocol}"
        );
        let m = &facts["model_metadata"];
        assert_eq!(m["name"], "deepfm-fp32", "{protocol}");
        assert_eq!(m["versions"], json!(["2"]), "{protocol}");
        assert_eq!(m["platform"], "recserve_deepfm", "{protocol}");
        let tensors = |key: &str| -> Vec<(String, String, Vec<i64>)> {
            m[key]
                .as_array()
                .expect("tensors")
                .iter()
                .map(|t| {
                    (
                        t["name"].as_str().expect("name").to_owned(),
                        t["datatype"].as_str().expect("datatype").to_owned(),
                        shape(&t["shape"]),
                    )
                })
                .collect()
        };
        assert_eq!(
            tensors("inputs"),
            [
                ("categorical".to_owned(), "INT64".to_owned(), vec![-1, 26]),
                ("dense".to_owned(), "FP32".to_owned(), vec![-1, 13]),
            ],
            "{protocol}"
        );
        assert_eq!(
            tensors("outputs"),
            [("probability".to_owned(), "FP32".to_owned(), vec![-1, 1])],
            "{protocol}"
        );
    }

    // Every case, every mode: the same scores as /v1, bit for bit.
    let seen = results["jobs"].as_array().expect("jobs");
    assert_eq!(seen.len(), jobs.len());
    for (job, result) in jobs.iter().zip(seen) {
        for mode in ["http_binary", "http_json", "grpc"] {
            let t = &result[mode];
            let what = format!("{} / {} / {mode}", job.model, job.what);
            assert_eq!(t["dtype"], "float32", "{what}");
            assert_eq!(shape(&t["shape"]), [job.rows() as i64, 1], "{what}");
            assert_eq!(job.v1.len(), job.rows(), "{what}");
            assert_bits_equal(&what, &f32s(&t["values"]), &job.v1);
        }
    }

    // Malformed requests through tritonclient: the client raises the server's status and message.
    let first = &jobs[0];
    let b = first.rows();
    let expected: [(&str, &str, &str, String); 8] = [
        ("wrong datatype", "http", "400", "categorical: datatype INT32, but the model takes INT64".to_owned()),
        ("wrong datatype", "grpc", "StatusCode.INVALID_ARGUMENT", "categorical: datatype FP32, but the model takes INT64".to_owned()),
        ("shape disagrees with the data", "http", "400", format!("dense: has {b} rows, but categorical has {}", b + 1)),
        ("shape disagrees with the data", "grpc", "StatusCode.INVALID_ARGUMENT", format!("dense: has {b} rows, but categorical has {}", b + 1)),
        ("missing input", "grpc", "StatusCode.INVALID_ARGUMENT", "categorical: is missing (model \"deepfm-fp32\" takes categorical INT64 [-1, 26], dense FP32 [-1, 13])".to_owned()),
        ("unknown output", "http", "400", "score: is not an output of model \"deepfm-fp32\" (outputs: probability)".to_owned()),
        ("unknown output", "grpc", "StatusCode.INVALID_ARGUMENT", "score: is not an output of model \"deepfm-fp32\" (outputs: probability)".to_owned()),
        ("unknown model", "grpc", "StatusCode.NOT_FOUND", "model \"no-such-model\" is not served".to_owned()),
    ];
    let errors = results["errors"].as_array().expect("errors");
    assert_eq!(errors.len(), expected.len());
    for (e, (what, protocol, status, message)) in errors.iter().zip(&expected) {
        assert_eq!(
            (e["what"].as_str(), e["protocol"].as_str()),
            (Some(*what), Some(*protocol))
        );
        assert_eq!(e["status"], *status, "{what} over {protocol}: {e}");
        let got = e["message"].as_str().expect("message");
        assert!(
            got.starts_with(message.as_str()),
            "{what} over {protocol}: {got:?}"
        );
    }
    // And the server went on serving the same answers.
    for mode in ["http_binary", "http_json", "grpc"] {
        assert_bits_equal(
            &format!("after the errors, {mode}"),
            &f32s(&results["after_errors"][mode]["values"]),
            &first.v1,
        );
    }
    server.stop().await.expect("clean shutdown");
}

async fn post_v2(
    server: &TestServer,
    path: &str,
    headers: &[(&str, String)],
    body: Vec<u8>,
) -> (u16, HeaderMapLite, Vec<u8>) {
    let mut request = server.client.post(server.url(path)).body(body);
    for (k, v) in headers {
        request = request.header(*k, v);
    }
    let resp = request.send().await.expect("POST");
    let status = resp.status().as_u16();
    let headers = HeaderMapLite(
        resp.headers()
            .iter()
            .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap_or("").to_owned()))
            .collect(),
    );
    (status, headers, resp.bytes().await.expect("body").to_vec())
}

/// Request headers of a test request.
type Headers<'a> = Vec<(&'a str, String)>;

struct HeaderMapLite(Vec<(String, String)>);

impl HeaderMapLite {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

fn error_of(body: &[u8]) -> String {
    let v: Value = serde_json::from_slice(body).expect("JSON error body");
    v["error"].as_str().expect("error").to_owned()
}

/// A good request over v2 JSON, to run beside every bad one.
async fn good_v2(server: &TestServer, job: &Job) {
    let (status, _, body) = post_v2(
        server,
        &format!("/v2/models/{}/infer", job.model),
        &[],
        job.json_body().to_string().into_bytes(),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let v: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(v["id"], "json-1");
    assert_eq!(v["model_version"], "2");
    assert_eq!(v["outputs"][0]["name"], "probability");
    assert_bits_equal(
        "v2 JSON beside a bad request",
        &f32s(&v["outputs"][0]["data"]),
        &job.v1,
    );
}

/// A good request over gRPC with raw contents, to run beside every bad one.
async fn good_grpc(client: &mut GrpcInferenceServiceClient<Channel>, job: &Job) {
    let response = client
        .model_infer(job.grpc_raw())
        .await
        .expect("good gRPC request")
        .into_inner();
    assert_eq!(response.outputs.len(), 1);
    let raw = &response.raw_output_contents[0];
    let scores: Vec<f32> = raw
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_bits_equal("gRPC raw beside a bad request", &scores, &job.v1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_tensors_are_refused_naming_the_tensor_while_good_requests_go_on() {
    let server = TestServer::start(test_config()).await;
    let job = jobs(&server)
        .await
        .into_iter()
        .find(|j| j.model == "deepfm-fp32" && j.rows() == 100)
        .expect("the 100-candidate case of deepfm-fp32");
    let path = "/v2/models/deepfm-fp32/infer";
    let (b, f) = (job.rows(), job.fields());

    // HTTP: JSON and binary bodies. Each bad request runs concurrently with a good one.
    let binary_header = |json: &Value| json.to_string().len().to_string();
    let with_binary =
        |json: &Value, binary: &[u8]| [json.to_string().into_bytes(), binary.to_vec()].concat();
    let sized = json!({"inputs": [
        {"name": "categorical", "shape": [b, f], "datatype": "INT64", "parameters": {"binary_data_size": b * f * 8}},
        {"name": "dense", "shape": [b, 13], "datatype": "FP32", "parameters": {"binary_data_size": b * 13 * 4}}]});
    let good_binary = [job.raw_ids(), job.raw_dense()].concat();
    let mut too_many = job.json_body();
    too_many["inputs"][0]["shape"] = json!([MAX_CANDIDATES + 1, f]);
    too_many["inputs"][0]["data"] = json!(vec![0; (MAX_CANDIDATES + 1) * f]);
    too_many["inputs"][1]["shape"] = json!([MAX_CANDIDATES + 1, 13]);
    too_many["inputs"][1]["data"] = json!(vec![0.0; (MAX_CANDIDATES + 1) * 13]);
    let mut wrong_type = job.json_body();
    wrong_type["inputs"][1]["datatype"] = json!("FP64");
    let mut short_data = job.json_body();
    short_data["inputs"][0]["data"] = json!(job.ids()[1..]);
    let mut missing = job.json_body();
    missing["inputs"].as_array_mut().expect("inputs").remove(1);
    let mut unknown_output = job.json_body();
    unknown_output["outputs"] = json!([{"name": "logits"}]);
    let mut oov = job.json_body();
    oov["inputs"][0]["data"][3][1] = json!(583); // C2 has 583 rows and rejects unknown ids
    let http_cases: Vec<(Headers, Vec<u8>, String)> = vec![
        (
            vec![],
            wrong_type.to_string().into_bytes(),
            "dense: datatype FP64, but the model takes FP32".to_owned(),
        ),
        (
            vec![],
            short_data.to_string().into_bytes(),
            format!(
                "categorical: shape [{b}, {f}] holds {} elements, but the data holds {}",
                b * f,
                b * f - 1
            ),
        ),
        (
            vec![],
            missing.to_string().into_bytes(),
            "dense: is missing".to_owned(),
        ),
        (
            vec![],
            unknown_output.to_string().into_bytes(),
            "logits: is not an output of model \"deepfm-fp32\" (outputs: probability)".to_owned(),
        ),
        (
            vec![],
            too_many.to_string().into_bytes(),
            format!(
                "categorical: holds {} candidates, more than the limit of {MAX_CANDIDATES} (--max-candidates)",
                MAX_CANDIDATES + 1
            ),
        ),
        (
            vec![],
            oov.to_string().into_bytes(),
            "categorical[3, 1]: field \"C2\": id 583 is outside the vocabulary of table \"C2\""
                .to_owned(),
        ),
        (
            vec![("Inference-Header-Content-Length", "999999".to_owned())],
            with_binary(&sized, &good_binary),
            format!(
                "Inference-Header-Content-Length: 999999 is beyond the end of the body ({} bytes)",
                sized.to_string().len() + good_binary.len()
            ),
        ),
        (
            vec![("Inference-Header-Content-Length", binary_header(&sized))],
            with_binary(&sized, &good_binary[..good_binary.len() - 4]),
            format!(
                "dense: binary_data_size {} reaches beyond the end of the body",
                b * 13 * 4
            ),
        ),
        (
            vec![("Inference-Header-Content-Length", "12".to_owned())],
            with_binary(&sized, &good_binary),
            "malformed request body".to_owned(),
        ),
    ];
    for (headers, body, expected) in http_cases {
        let (bad, ()) = tokio::join!(
            post_v2(&server, path, &headers, body),
            good_v2(&server, &job)
        );
        assert_eq!(
            bad.0,
            400,
            "{expected}: {}",
            String::from_utf8_lossy(&bad.2)
        );
        let message = error_of(&bad.2);
        assert!(
            message.starts_with(&expected),
            "expected {expected:?}\ngot      {message:?}"
        );
    }

    // Bodies over --max-body-bytes (4 MiB) are refused before decoding.
    // Refused with `Connection: close`: the unread rest of the body leaves the connection unusable, and a client
    // must not send its next request on it.
    let (status, headers, body) = post_v2(&server, path, &[], vec![b' '; 5 << 20]).await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    assert_eq!(headers.get("connection"), Some("close"));

    // The binary extension both ways, with binary_data_output.
    let mut binary_request = sized.clone();
    binary_request["parameters"] = json!({"binary_data_output": true});
    let (status, headers, body) = post_v2(
        &server,
        "/v2/models/deepfm-fp32/versions/2/infer",
        &[(
            "Inference-Header-Content-Length",
            binary_header(&binary_request),
        )],
        with_binary(&binary_request, &good_binary),
    )
    .await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let length: usize = headers
        .get("inference-header-content-length")
        .and_then(|v| v.parse().ok())
        .expect("Inference-Header-Content-Length in the response");
    let header: Value = serde_json::from_slice(&body[..length]).expect("JSON part");
    assert_eq!(
        header["outputs"][0]["parameters"]["binary_data_size"],
        b * 4
    );
    let scores: Vec<f32> = body[length..]
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    assert_bits_equal("binary in, binary out", &scores, &job.v1);

    // Routes around inference.
    for (path, status, needle) in [
        (
            "/v2/models/deepfm-fp32/versions/1",
            404,
            "version 1 is not served (serving version 2)",
        ),
        (
            "/v2/models/nope",
            404,
            "is not served (served models: deepfm-featured, deepfm-fp16, deepfm-fp32, deepfm-int8, deepfm-items, lightgcn, lightgcn-int8)",
        ),
        (
            "/v2/models/deepfm-fp32/versions/x/ready",
            400,
            "is not a version number",
        ),
        ("/v2/models/deepfm-fp32/ready", 200, "\"ready\":true"),
        ("/v2/health/ready", 200, "\"ready\":true"),
        ("/v2/health/live", 200, "\"live\":true"),
        ("/v2", 200, "\"binary_tensor_data\""),
    ] {
        let (got, text) = server.get(path).await;
        assert_eq!(got, status, "{path}: {text}");
        assert!(text.contains(needle), "{path}: {text}");
    }

    // gRPC: raw and typed contents.
    let mut client = GrpcInferenceServiceClient::connect(server.grpc_url())
        .await
        .expect("connect gRPC");
    let typed = proto::ModelInferRequest {
        model_name: "deepfm-fp32".into(),
        model_version: "2".into(),
        id: "typed-1".into(),
        inputs: vec![
            input(
                "categorical",
                "INT64",
                &[b, f],
                Some(InferTensorContents {
                    int64_contents: job.ids(),
                    ..Default::default()
                }),
            ),
            input(
                "dense",
                "FP32",
                &[b, 13],
                Some(InferTensorContents {
                    fp32_contents: job.dense_values(),
                    ..Default::default()
                }),
            ),
        ],
        outputs: vec![InferRequestedOutputTensor {
            name: "probability".into(),
            parameters: HashMap::new(),
        }],
        ..Default::default()
    };
    let response = client
        .model_infer(typed)
        .await
        .expect("typed request")
        .into_inner();
    assert_eq!(response.id, "typed-1");
    assert!(
        response.raw_output_contents.is_empty(),
        "typed in, typed out"
    );
    let contents = response.outputs[0]
        .contents
        .as_ref()
        .expect("typed contents");
    assert_eq!(response.outputs[0].shape, [b as i64, 1]);
    assert_bits_equal("gRPC typed contents", &contents.fp32_contents, &job.v1);

    let mut short_raw = job.grpc_raw();
    short_raw.raw_input_contents[0].truncate(b * f * 8 - 8);
    let mut too_many_raw = job.grpc_raw();
    too_many_raw.inputs[0].shape[0] = (MAX_CANDIDATES + 1) as i64;
    let mut wrong_version = job.grpc_raw();
    wrong_version.model_version = "7".into();
    let mut oversized = job.grpc_raw();
    oversized.raw_input_contents[0] = vec![0u8; 5 << 20].into(); // --max-body-bytes is 4 MiB
    let mut bad_timeout = tonic::Request::new(job.grpc_raw());
    bad_timeout
        .metadata_mut()
        .insert("grpc-timeout", "soon".parse().expect("ascii"));
    let grpc_cases: Vec<(tonic::Request<proto::ModelInferRequest>, Code, String)> = vec![
        (
            tonic::Request::new(short_raw),
            Code::InvalidArgument,
            format!(
                "categorical: holds {} bytes of binary data, but shape [{b}, {f}] of INT64 needs {}",
                b * f * 8 - 8,
                b * f * 8
            ),
        ),
        (
            tonic::Request::new(too_many_raw),
            Code::InvalidArgument,
            format!(
                "categorical: holds {} candidates, more than the limit of {MAX_CANDIDATES}",
                MAX_CANDIDATES + 1
            ),
        ),
        (
            tonic::Request::new(wrong_version),
            Code::NotFound,
            "model \"deepfm-fp32\" version 7 is not served".to_owned(),
        ),
        (
            bad_timeout,
            Code::InvalidArgument,
            "grpc-timeout: must be 1 to 8 digits and a unit".to_owned(),
        ),
    ];
    for (request, code, expected) in grpc_cases {
        let mut bad_client = client.clone();
        let mut good_client = client.clone();
        let (bad, ()) = tokio::join!(
            bad_client.model_infer(request),
            good_grpc(&mut good_client, &job)
        );
        let status = bad.expect_err(&expected);
        assert_eq!(status.code(), code, "{expected}: {status:?}");
        assert!(
            status.message().starts_with(&expected),
            "expected {expected:?}\ngot      {:?}",
            status.message()
        );
    }
    // A generous deadline changes nothing.
    let mut timed = tonic::Request::new(job.grpc_raw());
    timed.set_timeout(Duration::from_secs(30));
    let response = client
        .model_infer(timed)
        .await
        .expect("with grpc-timeout")
        .into_inner();
    assert_eq!(response.raw_output_contents.len(), 1);

    // Every protocol is counted under its own label, successes and client errors alike.
    let (_, metrics) = server.get("/metrics").await;
    for protocol in ["v1", "v2_http", "grpc"] {
        for code in ["200", "400"] {
            if protocol == "v1" && code == "400" {
                continue;
            }
            let series = format!(
                "recserve_requests_total{{code=\"{code}\",endpoint=\"rank\",model=\"deepfm-fp32\",pipeline=\"\",protocol=\"{protocol}\",version=\"2\"}}"
            );
            assert!(metrics.contains(&series), "missing {series}");
        }
    }
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_health_is_serving_when_ready_and_not_serving_when_draining() {
    // A long drain timeout: shutdown must not wait for it because a Watch stream is open.
    let mut server = TestServer::spawn(config(&fixture_repo(), |a| {
        a.shutdown_timeout_s = Some(300)
    }))
    .await;
    let channel = Channel::from_shared(server.grpc_url())
        .expect("url")
        .connect()
        .await
        .expect("connect gRPC");
    let mut health = HealthClient::new(channel.clone());
    // From the first answer on, the whole server goes NOT_SERVING → SERVING (or is SERVING already).
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("watch")
        .into_inner();
    let mut seen = Vec::new();
    while seen.last() != Some(&ServingStatus::Serving) {
        let message = tokio::time::timeout(Duration::from_secs(60), watch.message())
            .await
            .expect("SERVING within 60 s")
            .expect("stream")
            .expect("a status");
        seen.push(message.status());
    }
    assert!(
        seen == [ServingStatus::Serving]
            || seen == [ServingStatus::NotServing, ServingStatus::Serving],
        "{seen:?}"
    );
    server.wait_ready().await;
    for service in ["", "inference.GRPCInferenceService"] {
        let status = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .expect("check")
            .into_inner()
            .status();
        assert_eq!(status, ServingStatus::Serving, "{service:?}");
    }
    let unknown = health
        .check(HealthCheckRequest {
            service: "nope.Service".to_owned(),
        })
        .await
        .expect_err("unknown service");
    assert_eq!(unknown.code(), Code::NotFound);

    // Reflection lists the services.
    use tonic::codegen::tokio_stream;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut reflection = ServerReflectionClient::new(channel);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut answers = reflection
        .server_reflection_info(tokio_stream::iter(vec![request]))
        .await
        .expect("reflection")
        .into_inner();
    let answer = answers.message().await.expect("stream").expect("an answer");
    let Some(MessageResponse::ListServicesResponse(list)) = answer.message_response else {
        panic!("not a service list: {answer:?}");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for name in ["inference.GRPCInferenceService", "grpc.health.v1.Health"] {
        assert!(names.iter().any(|n| n == name), "{name} not in {names:?}");
    }

    // Draining: the open watch sees NOT_SERVING once shutdown begins.
    server.request_stop();
    let message = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("a status within 10 s")
        .expect("stream")
        .expect("a status");
    assert_eq!(message.status(), ServingStatus::NotServing);
    // Then the stream ends, so the open Watch does not hold the drain until the timeout (finished() gives up
    // after 60 s, well before the 300 s timeout).
    let end = tokio::time::timeout(Duration::from_secs(10), watch.message())
        .await
        .expect("the Watch stream ends within 10 s")
        .expect("stream");
    assert!(end.is_none(), "{end:?}");
    server.finished().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_v2_example_scores_like_its_v1_twin() {
    let server = TestServer::start(test_config()).await;
    let docs = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/examples");
    let v2 = std::fs::read(docs.join("v2-infer-request.json")).expect("v2 example");
    let v1: Value =
        serde_json::from_slice(&std::fs::read(docs.join("rank-request.json")).expect("v1 example"))
            .expect("v1 example JSON");
    let (status, _, body) = post_v2(&server, "/v2/models/deepfm-int8/infer", &[], v2).await;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let response: Value = serde_json::from_slice(&body).expect("JSON");
    assert_eq!(response["id"], "example-1");
    assert_eq!(response["model_name"], "deepfm-int8");
    assert_eq!(response["outputs"][0]["shape"], json!([3, 1]));
    assert_bits_equal(
        "docs/examples/v2-infer-request.json",
        &f32s(&response["outputs"][0]["data"]),
        &v1_scores(&server, "deepfm-int8", &v1).await,
    );
    // docs/api.md shows this answer under its curl line.
    let api =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/api.md"))
            .expect("docs/api.md");
    assert!(api.contains(
        "curl -s localhost:8000/v2/models/deepfm-int8/infer -d @docs/examples/v2-infer-request.json"
    ));
    let shown: Value = api
        .lines()
        .find_map(|l| {
            l.strip_prefix("# ")
                .filter(|j| j.contains("\"id\":\"example-1\""))
        })
        .map(|j| serde_json::from_str(j).expect("the documented answer is JSON"))
        .expect("docs/api.md shows the answer to the curl example");
    assert_eq!(response, shown, "docs/api.md shows another answer");
    server.stop().await.expect("clean shutdown");
}

/// What a ranking model's queue would refuse whatever the request holds is refused before the body is decoded,
/// when the transport carries a deadline: a malformed request then gets 429 / RESOURCE_EXHAUSTED, not 400. Without
/// a transport deadline the body's `timeout` parameter could set any deadline, so the request is decoded (400).
/// The queue is held by one `/v1` request that waits 1 s for company in a queue of one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_refuses_before_decoding_when_the_transport_has_a_deadline() {
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.queue_capacity = Some(1);
        // A free executor waits for company, so the first request holds the queue's one place.
        a.batch_delay = Some(BatchDelay::Fixed);
        a.max_queue_delay_us = Some(1_000_000);
    }))
    .await;
    let all = cases();
    let case = all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["model"] == "deepfm-fp32")
        .expect("a deepfm-fp32 case");
    let mut request = case["request"].clone();
    request.as_object_mut().expect("object").remove("top_k");
    request["candidates"] = json!([request["candidates"][0].clone()]);
    // Connected beforehand: the checks below must run within the second the first request is held.
    let mut client = GrpcInferenceServiceClient::connect(server.grpc_url())
        .await
        .expect("connect gRPC");
    let held = server.post_in_background(
        "/v1/models/deepfm-fp32/rank",
        &[("x-recserve-deadline-ms", "30000")],
        &request,
    );
    server.wait_for_queue_depth("deepfm-fp32", 1).await;

    let path = "/v2/models/deepfm-fp32/infer";
    let deadline = vec![("x-recserve-deadline-ms", "30000".to_owned())];
    let (status, headers, body) = post_v2(&server, path, &deadline, b"{not json".to_vec()).await;
    assert_eq!(status, 429, "{}", String::from_utf8_lossy(&body));
    assert!(
        headers.get("retry-after").is_some(),
        "429 carries Retry-After"
    );
    assert!(
        error_of(&body).contains("overloaded"),
        "{}",
        error_of(&body)
    );
    let (status, _, body) = post_v2(&server, path, &[], b"{not json".to_vec()).await;
    assert_eq!(status, 400, "{}", String::from_utf8_lossy(&body));

    let empty = || proto::ModelInferRequest {
        model_name: "deepfm-fp32".into(),
        ..Default::default()
    };
    let mut with_timeout = tonic::Request::new(empty());
    with_timeout
        .metadata_mut()
        .insert("grpc-timeout", "30S".parse().expect("ascii"));
    let status = client.model_infer(with_timeout).await.expect_err("refused");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let status = client.model_infer(empty()).await.expect_err("refused");
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");

    assert_eq!(held.await.expect("first request"), 200);
    server.stop().await.expect("clean shutdown");
}
