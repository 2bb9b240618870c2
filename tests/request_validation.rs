//! End to end: requests a hostile client sends, which validation and admission must answer well. A
//! request that can never be admitted is refused with 400 saying why, one that fits is admitted; a deadline
//! shorter than the request's own execution is refused as such, without an invitation to retry; client text in
//! messages is cut; nested tensor data must follow its shape; numbers JSON or 64 bits cannot hold are named at
//! their field; replies are bounded by `--max-reply-items`.

mod common;

use std::path::PathBuf;

use common::{TestServer, config, copy_dir, fixture_dir, fixture_repo};
use recserve::api::kserve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use recserve::api::kserve::grpc::proto::model_infer_request::InferInputTensor;
use recserve::api::kserve::grpc::proto::{self, InferTensorContents};
use serde_json::{Value, json};
use tonic::Code;

/// The candidates of `docs/examples/rank-request.json` (for `deepfm-int8`) as KServe rows.
const ROW: [i64; 26] = [
    352, 508, 1066, 981, 300, 22, 1246, 574, 19, 521, 1521, 1774, 1248, 18, 1333, 249, 19, 1109,
    194, 887, 83, 82, 890, 258, 42, 322,
];
const DENSE: [f32; 13] = [
    42.0, 0.0, 0.0, 4.0, 0.0, 110.0, 2.0, 0.0, 0.0, 12.0, 0.0, 0.0, 13.0,
];

/// `docs/examples/rank-request.json` with `n` candidates (its three, repeated).
fn rank_request(n: usize) -> Value {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("docs/examples/rank-request.json");
    let mut request: Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("rank-request.json"))
            .expect("JSON");
    let three = request["candidates"]
        .as_array()
        .expect("candidates")
        .clone();
    request["candidates"] = (0..n).map(|i| three[i % 3].clone()).collect();
    request.as_object_mut().expect("object").remove("top_k");
    request
}

/// A KServe request of `n` rows for `deepfm-int8`.
fn v2_rank(n: usize, parameters: Value) -> Value {
    json!({
        "inputs": [
            {"name": "categorical", "datatype": "INT64", "shape": [n, 26], "data": ROW.repeat(n)},
            {"name": "dense", "datatype": "FP32", "shape": [n, 13], "data": DENSE.repeat(n)}
        ],
        "parameters": parameters
    })
}

/// A KServe recall request of `n` users (the fixture's user table has 48 rows) and `k` items each.
fn v2_recall(n: usize, k: usize) -> Value {
    let users: Vec<usize> = (0..n).map(|i| i % 48).collect();
    json!({
        "inputs": [{"name": "user_id", "datatype": "INT64", "shape": [n], "data": users}],
        "parameters": {"k": k}
    })
}

/// The fixture repository with its pipeline, and `tweak`.
async fn start(tweak: impl FnOnce(&mut recserve::config::ServeArgs)) -> TestServer {
    TestServer::start(config(&fixture_repo(), |a| {
        a.config = Some(fixture_dir().join("recserve.toml"));
        tweak(a);
    }))
    .await
}

/// Posts a body and returns the status, the `Retry-After` header and the error message (or the whole answer).
async fn post(
    server: &TestServer,
    path: &str,
    headers: &[(&str, &str)],
    body: impl Into<reqwest::Body>,
) -> (u16, Option<String>, Value) {
    let mut request = server.client.post(server.url(path)).body(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.expect("POST");
    let status = response.status().as_u16();
    let retry_after = response
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    let text = response.text().await.expect("body");
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    let answer = match value.get("error") {
        Some(error) => error.clone(),
        None => value,
    };
    (status, retry_after, answer)
}

fn message(answer: &Value) -> &str {
    answer
        .as_str()
        .unwrap_or_else(|| panic!("an error message: {answer}"))
}

fn grpc_rank(rows: usize) -> proto::ModelInferRequest {
    let tensor = |name: &str, datatype: &str, columns: i64, contents| InferInputTensor {
        name: name.to_owned(),
        datatype: datatype.to_owned(),
        shape: vec![rows as i64, columns],
        contents: Some(contents),
        ..Default::default()
    };
    proto::ModelInferRequest {
        model_name: "deepfm-int8".to_owned(),
        inputs: vec![
            tensor(
                "categorical",
                "INT64",
                26,
                InferTensorContents {
                    int64_contents: ROW.repeat(rows),
                    ..Default::default()
                },
            ),
            tensor(
                "dense",
                "FP32",
                13,
                InferTensorContents {
                    fp32_contents: DENSE.repeat(rows),
                    ..Default::default()
                },
            ),
        ],
        ..Default::default()
    }
}

/// Sends `ModelInfer` with `grpc-timeout: timeout` over a bare HTTP/2 connection and returns the status the server
/// answers. Not through tonic's channel: it enforces `grpc-timeout` on the client side, and a 1 µs timer would end
/// the call before the server's answer arrives.
async fn model_infer_with_timeout(
    server: &TestServer,
    request: &proto::ModelInferRequest,
    timeout: &str,
) -> tonic::Status {
    let message = prost::Message::encode_to_vec(request);
    let mut body = vec![0u8];
    body.extend_from_slice(&u32::try_from(message.len()).expect("small").to_be_bytes());
    body.extend_from_slice(&message);
    let tcp = tokio::net::TcpStream::connect(server.grpc_addr)
        .await
        .expect("connect");
    let (mut sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(tcp),
    )
    .await
    .expect("HTTP/2 handshake");
    tokio::spawn(connection);
    let request = hyper::Request::post(format!(
        "{}/inference.GRPCInferenceService/ModelInfer",
        server.grpc_url()
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .header("grpc-timeout", timeout)
    .body(http_body_util::Full::new(axum::body::Bytes::from(body)))
    .expect("request");
    let response = sender.send_request(request).await.expect("HTTP/2 POST");
    // An error before any message is a trailers-only response: the status is in the headers.
    tonic::Status::from_header_map(response.headers())
        .unwrap_or_else(|| panic!("no grpc-status in {:?}", response.headers()))
}

/// A KServe recall request's users queue in chunks of `max_batch_rows`, one queue place per chunk, so a request of
/// more users than the queue has places is still admitted; what could never fit the queue is a 400 saying why
/// (not an "overloaded" a retry can never get past), for recall and ranking alike, and a pipeline whose candidates
/// could never fit stops the start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_that_fit_the_queue_are_admitted_and_ones_that_never_can_are_refused_as_such() {
    let server = start(|_| {}).await;
    let recall = "/v2/models/lightgcn/infer";
    let deadline = [("x-recserve-deadline-ms", "60000")];
    for users in [257, 1000] {
        let (status, _, answer) =
            post(&server, recall, &deadline, v2_recall(users, 5).to_string()).await;
        assert_eq!(status, 200, "{users} users: {answer}");
        assert_eq!(answer["outputs"][0]["shape"], json!([users, 5]));
    }
    let four: Vec<_> = (0..4)
        .map(|_| server.post_in_background(recall, &deadline, &v2_recall(256, 5)))
        .collect();
    for request in four {
        assert_eq!(
            request.await.expect("request"),
            200,
            "four 256-user requests at once on an idle server are all answered"
        );
    }
    server.stop().await.expect("clean shutdown");

    // Chunks of one row and a queue of 20: at most 20 rows (or users) per request, whatever the load.
    let server = start(|a| {
        a.max_batch_rows = Some(1);
        a.queue_capacity = Some(20);
    })
    .await;
    let never = "more than the model's queue can ever hold for one request: 20 chunks (--queue-capacity) of 1 \
                 rows (max_batch_rows), 20";
    let rank = "/v1/models/deepfm-int8/rank";
    let (status, retry_after, answer) =
        post(&server, rank, &[], rank_request(21).to_string()).await;
    assert_eq!((status, retry_after), (400, None), "{answer}");
    assert_eq!(
        message(&answer),
        format!("candidates: holds 21 candidates, {never} candidates; send at most 20 per request")
    );
    let (status, _, answer) = post(&server, rank, &[], rank_request(20).to_string()).await;
    assert_eq!(status, 200, "{answer}");
    let v2 = "/v2/models/deepfm-int8/infer";
    let (status, _, answer) = post(&server, v2, &[], v2_rank(21, json!({})).to_string()).await;
    assert_eq!(status, 400, "{answer}");
    assert!(
        message(&answer)
            .starts_with("categorical: holds 21 candidates, more than the model's queue"),
        "{answer}"
    );
    let (status, _, answer) = post(&server, recall, &[], v2_recall(21, 1).to_string()).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        message(&answer),
        format!("user_id: holds 21 users, {never} users; send at most 20 per request")
    );
    let (status, _, answer) = post(&server, recall, &[], v2_recall(20, 1).to_string()).await;
    assert_eq!(status, 200, "{answer}");
    server.stop().await.expect("clean shutdown");

    // The fixture pipeline ranks 20 candidates: a ranking queue of 10 one-row chunks could never take them.
    let dir = tempfile::tempdir().expect("tempdir");
    for model in ["lightgcn", "deepfm-items"] {
        copy_dir(&fixture_repo().join(model), &dir.path().join(model));
    }
    let pipeline = dir.path().join("recserve.toml");
    std::fs::write(
        &pipeline,
        "[pipelines.fixture]\nrecall_model = \"lightgcn\"\nranking_model = \"deepfm-items\"\ncandidates = 20\nk = 5\n",
    )
    .expect("write config");
    let refused = TestServer::spawn(config(dir.path(), |a| {
        a.config = Some(pipeline.clone());
        a.max_batch_rows = Some(1);
        a.queue_capacity = Some(10);
    }))
    .await
    .finished()
    .await
    .expect_err("the pipeline cannot work")
    .to_string();
    assert!(
        refused.contains(
            "candidates = 20: the ranking model \"deepfm-items\" holds 20 candidates, more than the model's \
             queue can ever hold for one request"
        ),
        "{refused}"
    );
}

/// A deadline the request's own execution would miss even on an idle server is a 400 (gRPC INVALID_ARGUMENT) that
/// gives both times and does not invite a retry: a 429 with `Retry-After` would have the client retry a request
/// that can never succeed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_shorter_than_the_requests_own_execution_is_refused_as_such() {
    let server = start(|_| {}).await;
    let too_short = "model \"deepfm-int8\": the request's deadline is too short: executing it is predicted to take";
    let no_retry =
        "retrying the same request will not help: give it a longer deadline or send fewer rows";
    let (status, retry_after, answer) = post(
        &server,
        "/v1/models/deepfm-int8/rank",
        &[("x-recserve-deadline-ms", "1")],
        rank_request(1000).to_string(),
    )
    .await;
    assert_eq!((status, retry_after), (400, None), "{answer}");
    let text = message(&answer);
    assert!(
        text.starts_with(too_short)
            && text.contains("its deadline leaves 0.")
            && text.ends_with(no_retry),
        "{text}"
    );
    let (status, retry_after, answer) = post(
        &server,
        "/v2/models/deepfm-int8/infer",
        &[],
        v2_rank(1000, json!({"timeout": 1})).to_string(),
    )
    .await;
    assert_eq!((status, retry_after), (400, None), "{answer}");
    assert!(message(&answer).starts_with(too_short), "{answer}");

    for timeout in ["1u", "1n", "0m"] {
        let status = model_infer_with_timeout(&server, &grpc_rank(2), timeout).await;
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "{timeout}: {status:?}"
        );
        assert!(
            status.message().starts_with(too_short) && status.message().ends_with(no_retry),
            "{timeout}: {status:?}"
        );
    }
    let (_, metrics) = server.get("/metrics").await;
    assert_eq!(
        common::metric_sample(
            &metrics,
            "recserve_rejected_total{model=\"deepfm-int8\",reason=\"deadline_too_short\"}"
        ),
        5.0
    );
    // With a deadline it can meet, the same request is answered.
    let (status, _, answer) = post(
        &server,
        "/v1/models/deepfm-int8/rank",
        &[("x-recserve-deadline-ms", "30000")],
        rank_request(1000).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    server.stop().await.expect("clean shutdown");
}

/// Client text echoed in a message (a model name, a field value) is cut to 100 characters, saying so: echoed
/// whole, a long gRPC model name would make a grpc-message beyond what the stock Python client accepts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn echoed_client_text_is_cut_to_100_characters() {
    let server = start(|_| {}).await;
    let name = "m".repeat(2000);
    let (status, _, answer) = post(
        &server,
        &format!("/v1/models/{name}/rank"),
        &[],
        rank_request(1).to_string(),
    )
    .await;
    assert_eq!(status, 404, "{answer}");
    let cut = format!("\"{}\"… (first 100 of 2000 characters)", "m".repeat(100));
    assert!(
        message(&answer).starts_with(&format!("model {cut} is not served")),
        "{answer}"
    );
    let (status, _, answer) = post(&server, &format!("/v1/recommend/{name}"), &[], "{}").await;
    assert_eq!(status, 404, "{answer}");
    assert!(
        message(&answer).starts_with(&format!("pipeline {cut} is not configured")),
        "{answer}"
    );

    // A 10,000-character key, and the same text as a value.
    let key = "k".repeat(10_000);
    let mut as_key = rank_request(1);
    as_key["user"]["fields"][&key] = json!(1);
    let mut as_value = rank_request(1);
    as_value["user"]["fields"]["C1"] = json!(key);
    for (request, needle) in [
        (
            as_key,
            "user.fields.kkkk… (first 100 of 10012 characters): is not a field of this model",
        ),
        (as_value, "… (first 100 of 10000 characters), expected i64"),
    ] {
        let (status, _, answer) = post(
            &server,
            "/v1/models/deepfm-int8/rank",
            &[],
            request.to_string(),
        )
        .await;
        assert_eq!(status, 400, "{answer}");
        let text = message(&answer);
        assert!(text.len() < 400, "{answer}");
        let (head, tail) = needle.split_once('…').expect("a cut");
        assert!(
            text.starts_with(head.trim_end_matches('k')) && text.contains(&format!("…{tail}")),
            "{answer}"
        );
    }

    let mut client = GrpcInferenceServiceClient::connect(server.grpc_url())
        .await
        .expect("connect gRPC");
    let mut request = grpc_rank(1);
    request.model_name = "x".repeat(20_000);
    let status = client.model_infer(request).await.expect_err("not served");
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    assert!(
        status.message().len() < 400,
        "{} characters",
        status.message().len()
    );
    assert!(
        status
            .message()
            .contains("… (first 100 of 20000 characters) is not served"),
        "{status:?}"
    );
    server.stop().await.expect("clean shutdown");
}

/// `/v2` refuses nested `data` whose nesting contradicts its shape, and a request with two
/// `Inference-Header-Content-Length` headers (which of them frames the body would be a guess).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nested_data_must_follow_its_shape_and_the_binary_header_comes_once() {
    let server = start(|_| {}).await;
    let path = "/v2/models/deepfm-int8/infer";
    let flat = ROW.repeat(3);
    let body = |categorical: Value| {
        json!({"inputs": [
            {"name": "categorical", "datatype": "INT64", "shape": [3, 26], "data": categorical},
            {"name": "dense", "datatype": "FP32", "shape": [3, 13], "data": DENSE.repeat(3)}
        ]})
        .to_string()
    };
    let follow = "send data flat, or nested exactly as the shape";
    let mut ragged: Vec<Value> = vec![json!(ROW), json!(ROW)];
    let mut last: Vec<Value> = ROW[..20].iter().map(|&id| json!(id)).collect();
    last.push(json!(ROW[20..]));
    ragged.push(Value::Array(last));
    let cases = [
        (
            json!([flat[..39], flat[39..]]),
            format!(
                "categorical: data holds 2 elements, but dimension 0 of shape [3, 26] is 3: {follow}"
            ),
        ),
        (
            json!([[flat]]),
            format!(
                "categorical: data holds 1 elements, but dimension 0 of shape [3, 26] is 3: {follow}"
            ),
        ),
        (
            Value::Array(ragged),
            format!(
                "categorical: data[2] holds 21 elements, but dimension 1 of shape [3, 26] is 26: {follow}"
            ),
        ),
    ];
    for (data, expected) in cases {
        let (status, _, answer) = post(&server, path, &[], body(data)).await;
        assert_eq!(status, 400, "{answer}");
        assert_eq!(message(&answer), expected);
    }
    for data in [json!(flat), json!([ROW, ROW, ROW])] {
        let (status, _, answer) = post(&server, path, &[], body(data)).await;
        assert_eq!(status, 200, "flat, or nested as the shape: {answer}");
    }

    let json = body(json!(flat));
    let length = json.len().to_string();
    let (status, _, answer) = post(
        &server,
        path,
        &[
            ("inference-header-content-length", &length),
            ("inference-header-content-length", "5"),
        ],
        json,
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        message(&answer),
        "Inference-Header-Content-Length: is given 2 times: send it once"
    );
    server.stop().await.expect("clean shutdown");
}

/// NaN, Infinity, `1e400`, 5000-digit numbers, integers beyond 64 bits and a missing `user` are each refused
/// naming their field and their real problem (not a parser position, not "floating point", not "holds 0
/// values"), over `/v1` rank, recall and recommend and `/v2`, so that a client can tell what to fix.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn numbers_json_or_64_bits_cannot_hold_are_named_at_their_field() {
    let server = start(|_| {}).await;
    let rank = rank_request(3).to_string();
    let in_dense =
        |token: &str| rank.replacen("\"dense\":[42.0", &format!("\"dense\":[{token}"), 1);
    let in_c1 = |token: &str| rank.replacen("\"C1\":352", &format!("\"C1\":{token}"), 1);
    let no_user = {
        let mut request = rank_request(3);
        request.as_object_mut().expect("object").remove("user");
        request.to_string()
    };
    let digits = "1".repeat(5000);
    let nan = "is not a number JSON can carry (JSON has no NaN or Infinity): send a finite number";
    let cases: Vec<(&str, String, String)> = vec![
        ("/v1/models/deepfm-int8/rank", in_dense("NaN"), format!("user.dense[0]: NaN {nan}")),
        ("/v1/models/deepfm-int8/rank", in_dense("Infinity"), format!("user.dense[0]: Infinity {nan}")),
        (
            "/v1/models/deepfm-int8/rank",
            in_dense("1e400"),
            "user.dense[0]: 1e400 is beyond the range of 64-bit floating point (about ±1.8e308)".to_owned(),
        ),
        (
            "/v1/models/deepfm-int8/rank",
            in_dense(&digits),
            format!(
                "user.dense[0]: the integer {}… (first 100 of 5000 characters) is beyond the range of every 64-bit \
                 number, integer or floating point",
                "1".repeat(100)
            ),
        ),
        (
            "/v1/models/deepfm-int8/rank",
            in_c1("-9223372036854775809"),
            "user.fields.C1: the integer -9223372036854775809 does not fit in 64 bits (expected i64)".to_owned(),
        ),
        (
            "/v1/models/deepfm-int8/rank",
            in_c1("18446744073709551616"),
            "user.fields.C1: the integer 18446744073709551616 does not fit in 64 bits (expected i64)".to_owned(),
        ),
        (
            "/v1/models/deepfm-int8/rank",
            no_user,
            "user: is missing: the model takes 19 user-side fields in user.fields and 13 dense features in \
             user.dense"
                .to_owned(),
        ),
        (
            "/v1/models/lightgcn/recall",
            r#"{"user_id": 1, "k": NaN}"#.to_owned(),
            format!("k: NaN {nan}"),
        ),
        (
            "/v1/models/lightgcn/recall",
            r#"{"user_id": 18446744073709551616, "k": 3}"#.to_owned(),
            "user_id: the integer 18446744073709551616 does not fit in 64 bits (expected i64)".to_owned(),
        ),
        (
            "/v1/recommend/fixture",
            r#"{"user_id": 3, "user": {"fields": {"age": 2, "city": 7}, "dense": [-Infinity, 2.0]}}"#.to_owned(),
            format!("user.dense[0]: -Infinity {nan}"),
        ),
        (
            "/v1/recommend/fixture",
            r#"{"user_id": 3}"#.to_owned(),
            "user: is missing: the model takes 2 user-side fields in user.fields and 2 dense features in user.dense"
                .to_owned(),
        ),
        (
            "/v2/models/deepfm-int8/infer",
            v2_rank(1, json!({})).to_string().replacen("42.0", "NaN", 1),
            format!("inputs[1].data[0]: NaN {nan}"),
        ),
        (
            "/v2/models/deepfm-int8/infer",
            v2_rank(1, json!({"timeout": 0})).to_string().replacen("\"timeout\":0", "\"timeout\":1e400", 1),
            "parameters.timeout: 1e400 is beyond the range of 64-bit floating point (about ±1.8e308)".to_owned(),
        ),
        (
            "/v2/models/deepfm-int8/infer",
            v2_rank(1, json!({})).to_string().replacen("352", "-9223372036854775809", 1),
            "categorical: data[0] is -9.223372036854776e+18, an integer beyond the range of INT64 \
             (-9223372036854775808 to 9223372036854775807)"
                .to_owned(),
        ),
    ];
    for (path, body, expected) in cases {
        let (status, _, answer) = post(&server, path, &[], body.clone()).await;
        assert_eq!(
            status,
            400,
            "{path} {}: {answer}",
            &body[..body.len().min(200)]
        );
        assert_eq!(message(&answer), expected, "{path}");
    }
    server.stop().await.expect("clean shutdown");
}

/// A reply holds at most `--max-reply-items` items (users × k), over KServe, `/v1` recall and recommend: without
/// the bound, a small request for many users with `k` = the whole catalogue would make a reply of many
/// megabytes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_hold_at_most_max_reply_items() {
    let server = start(|a| a.max_reply_items = Some(2000)).await;
    let v2 = "/v2/models/lightgcn/infer";
    let (status, _, answer) = post(&server, v2, &[], v2_recall(200, 300).to_string()).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        message(&answer),
        "parameters.k: is 300 for 200 users: 60000 items, more than one reply may hold (2000, --max-reply-items); \
         ask for fewer users or a smaller k"
    );
    let (status, _, answer) = post(&server, v2, &[], v2_recall(1000, 2).to_string()).await;
    assert_eq!(status, 200, "1000 × 2 = 2000 items: {answer}");
    let recall = "/v1/models/lightgcn/recall";
    let (status, _, answer) = post(&server, recall, &[], r#"{"user_id": 1, "k": 2001}"#).await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        message(&answer),
        "k: is 2001, more items than one reply may hold (2000, --max-reply-items)"
    );
    server.stop().await.expect("clean shutdown");

    // The pipeline's default k (5) fits a limit of 10; a request for 11 (of its 20 candidates) does not.
    let server = start(|a| a.max_reply_items = Some(10)).await;
    let recommend = |k: usize| json!({"user_id": 3, "user": {"fields": {"age": 2, "city": 7}, "dense": [13.0, 2.0]}, "k": k});
    let (status, _, answer) = post(
        &server,
        "/v1/recommend/fixture",
        &[],
        recommend(11).to_string(),
    )
    .await;
    assert_eq!(status, 400, "{answer}");
    assert_eq!(
        message(&answer),
        "k: is 11, more items than one reply may hold (10, --max-reply-items)"
    );
    let (status, _, answer) = post(
        &server,
        "/v1/recommend/fixture",
        &[],
        recommend(10).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{answer}");
    server.stop().await.expect("clean shutdown");
}
