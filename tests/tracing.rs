//! End to end: OpenTelemetry spans reach a real OTLP/gRPC receiver (the official `TraceService` from
//! opentelemetry-proto, started here on port 0). A recommend call with a `traceparent` is traced into the caller's
//! trace: the server span's parent is the caller's span, every stage span descends from the server span, the
//! stages of each level fit in their parent, and the response's `traceparent` names the server span. gRPC carries
//! the traceparent in its response metadata. With tracing off, nothing is exported and no header is added. The
//! real binary's access log writes one JSON line per request.

mod common;

use std::collections::HashMap;

use common::otlp::Collector;
use common::{TestServer, config, fixture_dir, fixture_repo};
use opentelemetry_proto::tonic::trace::v1::Span;
use recserve::api::kserve::grpc::proto::ServerLiveRequest;
use recserve::api::kserve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use serde_json::Value;

const CALLER_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN: &str = "00f067aa0ba902b7";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn recommend_request() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("recall-cases.json"))
        .expect("recall-cases.json: run scripts/test.sh, which writes the fixture");
    let all: Value = serde_json::from_str(&text).expect("JSON");
    all["recommend_cases"][0]["request"].clone()
}

async fn start(otlp: Option<String>) -> TestServer {
    TestServer::start(config(&fixture_repo(), |a| {
        a.config = Some(fixture_dir().join("recserve.toml"));
        a.otlp_endpoint = otlp;
        a.trace_sample_ratio = Some(1.0);
    }))
    .await
}

/// The span's interval in nanoseconds.
fn times(span: &Span) -> (u64, u64) {
    (span.start_time_unix_nano, span.end_time_unix_nano)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_traced_recommend_call_continues_the_callers_trace() {
    let collector = Collector::default();
    let endpoint = collector.start().await;
    let server = start(Some(endpoint)).await;

    let response = server
        .client
        .post(server.url("/v1/recommend/fixture"))
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .json(&recommend_request())
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    let answered = response
        .headers()
        .get("traceparent")
        .expect("the response names the server span")
        .to_str()
        .expect("ASCII")
        .to_owned();
    let _ = response.bytes().await;

    // gRPC: response metadata, in the caller's trace.
    let mut grpc = GrpcInferenceServiceClient::connect(server.grpc_url())
        .await
        .expect("connect gRPC");
    let mut live = tonic::Request::new(ServerLiveRequest {});
    live.metadata_mut().insert(
        "traceparent",
        format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01")
            .parse()
            .expect("metadata"),
    );
    let live = grpc.server_live(live).await.expect("ServerLive");
    let grpc_parent = live
        .metadata()
        .get("traceparent")
        .expect("gRPC response metadata names the server span")
        .to_str()
        .expect("ASCII");
    assert!(
        grpc_parent.starts_with(&format!("00-{CALLER_TRACE}-")) && grpc_parent.ends_with("-01"),
        "{grpc_parent}"
    );

    // Stopping the server exports what is queued.
    server.stop().await.expect("clean stop");
    let spans = collector.spans();
    let ours: Vec<&Span> = spans
        .iter()
        .filter(|(_, s)| hex(&s.trace_id) == CALLER_TRACE)
        .map(|(_, s)| s)
        .collect();
    assert!(
        spans.iter().all(|(service, _)| service == "recserve"),
        "service.name"
    );
    let server_span: &Span = ours
        .iter()
        .find(|s| s.name == "v1 recommend")
        .copied()
        .unwrap_or_else(|| panic!("no server span among {:?}", names(&ours)));
    assert_eq!(hex(&server_span.parent_span_id), CALLER_SPAN);
    assert_eq!(
        answered,
        format!("00-{CALLER_TRACE}-{}-01", hex(&server_span.span_id)),
        "the response's traceparent names the server span"
    );
    let by_id: HashMap<Vec<u8>, &Span> = ours.iter().map(|s| (s.span_id.clone(), *s)).collect();
    let children = |parent: &Span| -> Vec<&Span> {
        let mut c: Vec<&Span> = ours
            .iter()
            .filter(|s| s.parent_span_id == parent.span_id)
            .copied()
            .collect();
        c.sort_by_key(|s| s.start_time_unix_nano);
        c
    };
    let top: Vec<&str> = children(server_span)
        .iter()
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(
        top,
        ["read", "decode", "recall", "rank", "encode", "write"],
        "the server span's children"
    );
    for stage in children(server_span)
        .into_iter()
        .filter(|s| ["recall", "rank"].contains(&s.name.as_str()))
    {
        let inner: Vec<&str> = children(stage).iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            inner,
            ["admit", "queue", "batch", "answer"],
            "{} stage",
            stage.name
        );
        let batch = children(stage)
            .into_iter()
            .find(|s| s.name == "batch")
            .expect("batch");
        let executed: Vec<&str> = children(batch).iter().map(|s| s.name.as_str()).collect();
        assert!(
            executed.starts_with(&["dispatch"]) && executed.contains(&"inference"),
            "{executed:?}"
        );
        assert!(
            batch
                .attributes
                .iter()
                .any(|kv| kv.key == "recserve.batch.id"),
            "the batch span names its batch"
        );
    }
    // Every span descends from the server span, and at each level the children lie within their parent, one after
    // another: their durations add up to at most the parent's.
    for span in &ours {
        if span.span_id == server_span.span_id {
            continue;
        }
        let mut at: &Span = span;
        while at.parent_span_id != server_span.span_id {
            at = *by_id
                .get(&at.parent_span_id)
                .unwrap_or_else(|| panic!("{}: parent not exported", span.name));
        }
    }
    for &parent in &ours {
        let kids = children(parent);
        let (start, end) = times(parent);
        let mut last = start;
        for kid in &kids {
            let (s, e) = times(kid);
            assert!(
                s >= last && e <= end && s <= e,
                "{} in {}",
                kid.name,
                parent.name
            );
            last = e;
        }
        let sum: u64 = kids
            .iter()
            .map(|k| k.end_time_unix_nano - k.start_time_unix_nano)
            .sum();
        assert!(
            sum <= end - start,
            "{}'s children take longer than it",
            parent.name
        );
    }
}

fn names(spans: &[&Span]) -> Vec<String> {
    spans.iter().map(|s| s.name.clone()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tracing_off_nothing_is_exported_and_no_header_added() {
    let collector = Collector::default();
    // A receiver is running, but the server is not told of it.
    let _endpoint = collector.start().await;
    let server = start(None).await;
    let response = server
        .client
        .post(server.url("/v1/recommend/fixture"))
        .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
        .json(&recommend_request())
        .send()
        .await
        .expect("send");
    assert_eq!(response.status(), 200);
    assert!(response.headers().get("traceparent").is_none());
    server.stop().await.expect("clean stop");
    assert!(collector.spans().is_empty());
}

/// Kills the child when the test ends, however it ends.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The real binary with `--access-log-sample-ratio 1 --log-format json` (tracing off) writes one JSON line per
/// request to a model through its log, with the caller's trace id.
#[test]
fn the_access_log_has_one_json_line_per_request() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};

    let child = Command::new(env!("CARGO_BIN_EXE_recserve"))
        .args([
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--log-format",
            "json",
            "--access-log-sample-ratio",
            "1",
            "--repository",
        ])
        .arg(fixture_repo())
        .arg("--config")
        .arg(fixture_dir().join("recserve.toml"))
        .arg("--ort-library")
        .arg(common::ort_library())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start recserve");
    let mut child = KillOnDrop(child);
    let mut lines = BufReader::new(child.0.stderr.take().expect("stderr"))
        .lines()
        .map_while(Result::ok)
        .map(|line| serde_json::from_str::<Value>(&line).expect("every log line is JSON"));
    let mut addr = None;
    for line in lines.by_ref() {
        if let Some(a) = line["addr"].as_str() {
            addr = Some(a.to_owned());
        }
        if line["message"] == "all models loaded; ready" {
            break;
        }
    }
    let addr = addr.expect("the server logged its address");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let (status, sent) = runtime.block_on(async {
        let response = reqwest::Client::new()
            .post(format!("http://{addr}/v1/recommend/fixture"))
            .header("traceparent", format!("00-{CALLER_TRACE}-{CALLER_SPAN}-01"))
            .json(&recommend_request())
            .send()
            .await
            .expect("send");
        let status = response.status().as_u16();
        assert!(response.headers().get("traceparent").is_none());
        (status, response.bytes().await.expect("body").len())
    });
    assert_eq!(status, 200);
    let access = lines
        .find(|line| line["target"] == "recserve::access")
        .expect("an access-log line");
    assert_eq!(access["method"], "POST");
    assert_eq!(access["path"], "/v1/recommend/fixture");
    assert_eq!(access["protocol"], "v1");
    assert_eq!(access["endpoint"], "recommend");
    assert_eq!(access["model"], "fixture");
    assert_eq!(access["status"], 200);
    assert_eq!(access["trace_id"], CALLER_TRACE);
    assert_eq!(access["response_bytes"], sent as u64);
    assert!(
        access["request_bytes"].as_u64().is_some_and(|n| n > 0),
        "{access}"
    );
    assert!(
        access["latency_ms"].as_f64().is_some_and(|ms| ms > 0.0),
        "{access}"
    );
}
