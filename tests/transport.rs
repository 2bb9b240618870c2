//! End to end: what the HTTP and gRPC layers answer before any route or method runs, whatever a client sends:
//! every HTTP error carries the JSON error body (405, 414, 431, 413 before `100 Continue`, 415 for a compressed
//! body on every route), what hyper itself refuses stays refused, and gRPC calls broken in their framing or
//! headers get the client's status codes (never INTERNAL) with a message.

mod common;

use common::raw::{exchange, grpc_call, grpc_frame, request};
use common::{TestServer, config, fixture_repo};
use tonic::Code;

const RANK: &str = "/v1/models/deepfm-int8/rank";

fn rank_body() -> Vec<u8> {
    std::fs::read("docs/examples/rank-request.json").expect("example")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_errors_carry_the_json_error_body() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let addr = server.addr;

    for (method, path) in [
        ("GET", RANK),
        ("DELETE", RANK),
        ("PATCH", RANK),
        ("OPTIONS", RANK),
        ("PUT", "/v1/models/deepfm-int8/versions/1/rank"),
        ("GET", "/v2/models/deepfm-int8/infer"),
        ("POST", "/health/ready"),
    ] {
        let r = exchange(addr, &request(method, path, &[], b""))
            .await
            .expect("an answer");
        assert_eq!(r.status, 405, "{method} {path}");
        assert_eq!(
            r.header("content-type"),
            Some("application/json"),
            "{method} {path}"
        );
        let allow = r.header("allow").expect("Allow").to_owned();
        assert_eq!(
            r.error(),
            format!("{method} is not allowed on {path}: use {allow}")
        );
    }
    // HEAD gets the same head; HTTP forbids the body.
    let r = exchange(addr, &request("HEAD", RANK, &[], b""))
        .await
        .expect("an answer");
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    assert_eq!(r.header("content-type"), Some("application/json"));

    let long = format!("/v1/models/{}", "a".repeat(20_000));
    let r = exchange(addr, &request("GET", &long, &[], b""))
        .await
        .expect("an answer");
    assert_eq!(r.status, 414);
    assert_eq!(
        r.error(),
        "the request target is 20011 bytes long; the limit is 8192"
    );

    let many: Vec<String> = (0..2000).map(|i| format!("X-Header-{i}: v")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    let r = exchange(addr, &request("GET", "/health/live", &many, b""))
        .await
        .expect("an answer");
    assert_eq!(r.status, 431);
    assert_eq!(
        r.error(),
        "the request has 2001 header fields; the limit is 100"
    );

    // What hyper refuses before any of our code runs is still refused (with hyper's empty body, docs/api.md):
    // a target beyond its 64 KiB, a garbage request line, a Content-Length that is not a number or given twice
    // with different values (request smuggling).
    let huge = format!("/v1/models/{}", "a".repeat(200_000));
    for (what, bytes, status) in [
        ("200 KB target", request("GET", &huge, &[], b""), 414),
        ("garbage request line", b"HELLO THERE\r\n\r\n".to_vec(), 400),
        (
            "Content-Length: abc",
            request("POST", RANK, &["Content-Length: abc"], b""),
            400,
        ),
        (
            "two Content-Lengths",
            request(
                "POST",
                RANK,
                &["Content-Length: 5", "Content-Length: 7"],
                b"hello",
            ),
            400,
        ),
    ] {
        let r = exchange(addr, &bytes).await.expect("an answer");
        assert_eq!(r.status, status, "{what}");
        assert_eq!(r.header("connection"), Some("close"), "{what}");
    }
    server.stop().await.expect("clean shutdown");
}

/// A path segment that does not decode (bytes that are not UTF-8 once percent-decoded) is a client error with the
/// JSON body naming the segment, on every route with a segment; an empty `{version}` is refused, not read as "the
/// version serving".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_segments_that_do_not_decode_or_are_empty_are_refused_with_the_json_body() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let body = rank_body();
    for (method, path, segment) in [
        ("POST", "/v1/models/%ff/rank", "model"),
        (
            "POST",
            "/v1/models/deepfm-int8/versions/%ff/rank",
            "version",
        ),
        ("POST", "/v1/models/%ff/recall", "model"),
        ("POST", "/v1/recommend/%ff", "pipeline"),
        ("GET", "/v2/models/%ff", "model"),
        ("GET", "/v2/models/%ff/ready", "model"),
        ("GET", "/v2/models/deepfm-int8/versions/%c3%28", "version"),
        ("POST", "/v2/models/%ff/infer", "model"),
        ("POST", "/v2/repository/models/%ff/load", "model"),
        ("POST", "/v2/repository/models/%ff/unload", "model"),
    ] {
        let r = exchange(server.addr, &request(method, path, &[], b""))
            .await
            .expect("an answer");
        assert_eq!(r.status, 400, "{method} {path}");
        assert_eq!(
            r.header("content-type"),
            Some("application/json"),
            "{method} {path}"
        );
        assert_eq!(
            r.error(),
            format!("{segment}: is not UTF-8 once percent-decoded"),
            "{method} {path}"
        );
    }
    for path in [
        "/v1/models/deepfm-int8/versions//rank",
        "/v2/models/deepfm-int8/versions//infer",
    ] {
        let r = exchange(server.addr, &request("POST", path, &[], &body))
            .await
            .expect("an answer");
        assert_eq!(r.status, 400, "{path}: {}", r.error());
        assert!(
            r.error().starts_with("version: is empty"),
            "{path}: {}",
            r.error()
        );
    }
    server.stop().await.expect("clean shutdown");
}

/// A chunked body that breaks the chunk framing is answered 400 naming the rule it broke, not only that reading
/// failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broken_chunked_body_is_refused_naming_what_is_broken() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    for (what, chunks, named) in [
        (
            "a chunk size that is not hexadecimal",
            &b"zz\r\n{}\r\n0\r\n\r\n"[..],
            "Invalid chunk size line: missing size digit",
        ),
        (
            "a chunk without its CRLF",
            b"2\r\n{}XX0\r\n\r\n",
            "Invalid chunk body CR",
        ),
    ] {
        let mut bytes = request(
            "POST",
            RANK,
            &[
                "Content-Type: application/json",
                "Transfer-Encoding: chunked",
            ],
            b"",
        );
        bytes.extend_from_slice(chunks);
        let r = exchange(server.addr, &bytes).await.expect("an answer");
        assert_eq!(r.status, 400, "{what}: {}", r.error());
        assert_eq!(
            r.error(),
            format!("malformed request body: error reading a body from connection: {named}"),
            "{what}"
        );
    }
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_announced_over_the_limit_is_refused_as_soon_as_the_head_is_read() {
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.max_body_bytes = Some(64 * 1024)
    }))
    .await;
    let big = request(
        "POST",
        RANK,
        &[
            "Content-Length: 100000000",
            "Expect: 100-continue",
            "Content-Type: application/json",
        ],
        b"",
    );
    // The first (and only) answer is the 413: no `100 Continue` invites the 100 MB.
    let r = exchange(server.addr, &big).await.expect("an answer");
    assert_eq!(r.status, 413);
    assert_eq!(
        r.error(),
        "the body is larger than the limit of 65536 bytes"
    );
    assert_eq!(r.header("connection"), Some("close"));

    // Without `Expect`, the same 413 comes as soon as the head is in, not after a body that will not be read
    // (nor after --body-read-timeout-ms waiting for it).
    let mut unasked = request(
        "POST",
        RANK,
        &[
            "Content-Length: 100000000",
            "Content-Type: application/json",
        ],
        b"",
    );
    unasked.extend_from_slice(b"{\"user\": ");
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        exchange(server.addr, &unasked),
    )
    .await
    .expect("answered at once")
    .expect("an answer");
    assert_eq!(r.status, 413);
    assert_eq!(
        r.error(),
        "the body is larger than the limit of 65536 bytes"
    );
    assert_eq!(r.header("connection"), Some("close"));

    // Within the limit, the client is invited and answered.
    let body = rank_body();
    let head = request(
        "POST",
        RANK,
        &[
            &format!("Content-Length: {}", body.len()),
            "Expect: 100-continue",
        ],
        b"",
    );
    let mut stream = tokio::net::TcpStream::connect(server.addr)
        .await
        .expect("connect");
    use tokio::io::AsyncWriteExt;
    stream.write_all(&head).await.expect("head");
    let interim = common::raw::read_response(&mut stream)
        .await
        .expect("100 Continue");
    assert_eq!(interim.status, 100);
    stream.write_all(&body).await.expect("body");
    let r = common::raw::read_response(&mut stream)
        .await
        .expect("an answer");
    assert_eq!(r.status, 200, "{:?}", String::from_utf8_lossy(&r.body));
    server.stop().await.expect("clean shutdown");
}

/// A request the service refuses before it needs the body (an unknown model, an operation the model does not do,
/// an unreadable deadline) is answered before its body is read, on every HTTP route: a client waiting for
/// `100 Continue` is answered instead, and one that sends its body unasked is answered before the body is complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_before_its_body_is_answered_without_reading_it() {
    use tokio::io::AsyncWriteExt;
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let refusals: [(&str, &[&str], u16, &str); 5] = [
        ("/v1/models/nope/rank", &[], 404, "model \"nope\""),
        ("/v1/models/lightgcn/rank", &[], 400, "lightgcn"),
        ("/v1/models/deepfm-int8/recall", &[], 400, "deepfm-int8"),
        ("/v2/models/nope/infer", &[], 404, "model \"nope\""),
        (
            RANK,
            &["x-recserve-deadline-ms: soon"],
            400,
            "x-recserve-deadline-ms",
        ),
    ];
    for (path, extra, status, names) in refusals {
        let mut headers = vec!["Content-Length: 100000", "Content-Type: application/json"];
        headers.extend_from_slice(extra);

        // Waiting for `100 Continue`: the refusal is the first and only answer.
        let mut waiting = headers.clone();
        waiting.push("Expect: 100-continue");
        let r = exchange(server.addr, &request("POST", path, &waiting, b""))
            .await
            .expect("an answer");
        assert_eq!(r.status, status, "{path} {extra:?}: {}", r.error());
        assert!(r.error().contains(names), "{path}: {}", r.error());
        assert_eq!(r.header("connection"), Some("close"), "{path}");

        // Sending the body unasked: the answer comes with 99,990 bytes of it still to send.
        let mut stream = tokio::net::TcpStream::connect(server.addr)
            .await
            .expect("connect");
        let mut bytes = request("POST", path, &headers, b"");
        bytes.extend_from_slice(b"{\"rows\": [");
        stream.write_all(&bytes).await.expect("head");
        let r = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            common::raw::read_response(&mut stream),
        )
        .await
        .expect("answered before the body is complete")
        .expect("an answer");
        assert_eq!(r.status, status, "{path} {extra:?}: {}", r.error());
    }
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compressed_bodies_are_refused_alike_on_every_route() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let v2 = std::fs::read("docs/examples/v2-infer-request.json").expect("example");
    let recall = br#"{"user_id": 1, "k": 5}"#.to_vec();
    let routes: [(&str, Vec<u8>); 3] = [
        (RANK, rank_body()),
        ("/v1/models/lightgcn/recall", recall),
        ("/v2/models/deepfm-int8/infer", v2),
    ];
    for (path, body) in &routes {
        for encoding in ["gzip", "br", "identity, gzip"] {
            let header = format!("Content-Encoding: {encoding}");
            let r = exchange(server.addr, &request("POST", path, &[&header], body))
                .await
                .expect("an answer");
            assert_eq!(r.status, 415, "{path} {encoding}");
            assert_eq!(
                r.error(),
                format!(
                    "Content-Encoding: {encoding:?} is not supported: send the body uncompressed"
                )
            );
        }
        let r = exchange(
            server.addr,
            &request("POST", path, &["Content-Encoding: identity"], body),
        )
        .await
        .expect("an answer");
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    // A client still sending a large body reads its 415, not a connection reset: the server reads what it sends.
    let resp = server
        .client
        .post(server.url(RANK))
        .header("content-encoding", "gzip")
        .body(vec![0u8; 3 << 20])
        .send()
        .await
        .expect("an answer, not a reset");
    assert_eq!(resp.status(), 415);
    server.stop().await.expect("clean shutdown");
}

/// A case: what it is, what is sent (path, content-type, the request stream), and the code and the start of the
/// message it must get.
type GrpcCase = (
    &'static str,
    &'static str,
    &'static str,
    Vec<u8>,
    Code,
    &'static str,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_broken_in_transport_get_the_clients_codes_with_a_message() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let grpc = server.grpc_addr;
    let infer = "/inference.GRPCInferenceService/ModelInfer";
    let g = "application/grpc";
    let cases: [GrpcCase; 7] = [
        (
            "garbage protobuf",
            infer,
            g,
            grpc_frame(false, 6, &[0xff; 6]),
            Code::InvalidArgument,
            "malformed request message: failed to decode Protobuf message",
        ),
        (
            "a compressed flag without grpc-encoding",
            infer,
            g,
            grpc_frame(true, 5, b"\x0a\x03abc"),
            Code::Unimplemented,
            "the request message is compressed (compressed flag 1), but compression is not supported",
        ),
        (
            "a length prefix beyond the data",
            infer,
            g,
            grpc_frame(false, 100, b"\x0a\x03abc"),
            Code::InvalidArgument,
            "malformed request stream: it ends inside a message",
        ),
        (
            "an empty request stream",
            infer,
            g,
            Vec::new(),
            Code::InvalidArgument,
            "malformed request stream: it holds no message",
        ),
        (
            "an unknown method",
            "/inference.GRPCInferenceService/Nope",
            g,
            grpc_frame(false, 0, b""),
            Code::Unimplemented,
            "inference.GRPCInferenceService has no method \"Nope\"",
        ),
        (
            "an unknown service",
            "/no.Such/Method",
            g,
            grpc_frame(false, 0, b""),
            Code::Unimplemented,
            "no service \"no.Such\" here (services: inference.GRPCInferenceService, grpc.health.v1.Health, ",
        ),
        (
            "content-type application/json",
            "/inference.GRPCInferenceService/ServerLive",
            "application/json",
            grpc_frame(false, 0, b""),
            Code::InvalidArgument,
            "content-type: must be application/grpc (or application/grpc+proto), got \"application/json\"",
        ),
    ];
    for (what, path, content_type, body, code, message) in cases {
        let answer = grpc_call(grpc, path, content_type, body).await;
        assert_eq!(answer.status.code(), code, "{what}: {:?}", answer.status);
        assert!(
            answer.status.message().starts_with(message),
            "{what}: {:?}",
            answer.status.message()
        );
        let http = if content_type == g { 200 } else { 415 };
        assert_eq!(answer.http_status, http, "{what}");
    }
    // A well-formed call is untouched: ServerLive with an empty message, as application/grpc+proto too.
    for content_type in [g, "application/grpc+proto"] {
        let answer = grpc_call(
            grpc,
            "/inference.GRPCInferenceService/ServerLive",
            content_type,
            grpc_frame(false, 0, b""),
        )
        .await;
        assert_eq!(
            answer.status.code(),
            Code::Ok,
            "{content_type}: {:?}",
            answer.status
        );
    }
    server.stop().await.expect("clean shutdown");
}
