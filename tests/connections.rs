//! End to end: the connection layer (slow clients and the drain of SIGTERM). Slow clients cannot hold the
//! server: silent sockets, heads dripping in, bodies short of their `Content-Length`, idle keep-alive
//! connections, silent or idle HTTP/2 connections and gRPC streams without their message are all closed after the
//! timeouts the test sets, while normal clients keep being served. `--max-connections` holds across both
//! listeners. A drain answers what was sent before it and refuses new connections.
//!
//! Timings: a connection is never closed *before* its timeout (the only lower bounds asserted); upper bounds are
//! the generous 30 s of [`wait_closed`].

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use common::raw::{exchange, grpc_frame, grpc_open, read_response, request, wait_closed};
use common::{TestServer, config, fixture_repo, metric_sample};
use recserve::config::ServeArgs;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tonic::Code;

const RANK: &str = "/v1/models/deepfm-int8/rank";
const SERVER_LIVE: &str = "/inference.GRPCInferenceService/ServerLive";
const LIMIT: Duration = Duration::from_secs(30);

const HEADER: Duration = Duration::from_millis(300);
const BODY: Duration = Duration::from_millis(500);
const IDLE: Duration = Duration::from_millis(1000);

fn short_timeouts(a: &mut ServeArgs) {
    a.header_read_timeout_ms = Some(HEADER.as_millis() as u64);
    a.body_read_timeout_ms = Some(BODY.as_millis() as u64);
    a.idle_timeout_ms = Some(IDLE.as_millis() as u64);
}

fn rank_body() -> Vec<u8> {
    std::fs::read("docs/examples/rank-request.json").expect("example")
}

/// A client that never says anything: closed by the header timeout.
async fn silent(addr: std::net::SocketAddr) -> Duration {
    let start = Instant::now();
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let got = wait_closed(&mut stream, LIMIT).await;
    assert!(got.is_empty(), "{got:?}");
    start.elapsed()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_clients_are_closed_after_their_timeouts_while_others_are_served() {
    let server = TestServer::start(config(&fixture_repo(), short_timeouts)).await;
    let (http, grpc) = (server.addr, server.grpc_addr);

    // Normal clients, all along.
    let done = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let normal = {
        let (done, served) = (Arc::clone(&done), Arc::clone(&served));
        let client = server.client.clone();
        let url = server.url(RANK);
        let body = rank_body();
        tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                let resp = client
                    .post(&url)
                    .body(body.clone())
                    .send()
                    .await
                    .expect("POST");
                assert_eq!(resp.status(), 200, "a normal client was refused");
                served.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    let silent_http: Vec<_> = (0..20).map(|_| tokio::spawn(silent(http))).collect();
    let silent_grpc = tokio::spawn(silent(grpc));
    let dripping = tokio::spawn(async move {
        let start = Instant::now();
        let stream = TcpStream::connect(http).await.expect("connect");
        let (mut reader, mut writer) = stream.into_split();
        writer
            .write_all(format!("POST {RANK} HTTP/1.1\r\nHost: test\r\n").as_bytes())
            .await
            .expect("write");
        // A header line every 50 ms, until the server closes.
        let drip = async move {
            while writer.write_all(b"X-Drip: 1\r\n").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        let closed = async {
            let mut buf = [0u8; 64];
            use tokio::io::AsyncReadExt;
            // A reset (Err) is a close as well.
            if let Ok(n) = reader.read(&mut buf).await {
                assert_eq!(n, 0, "a dripping head was answered");
            }
        };
        tokio::select! {
            () = drip => {}
            () = closed => {}
            () = tokio::time::sleep(LIMIT) => panic!("a dripping head was not cut off"),
        }
        start.elapsed()
    });
    // Content-Length: 1000 and no body; a body 40 bytes short.
    let short_bodies: Vec<_> = [None, Some(40)]
        .into_iter()
        .map(|short| {
            tokio::spawn(async move {
                let body = rank_body();
                let (length, sent) = match short {
                    None => (1000, 0),
                    Some(missing) => (body.len(), body.len() - missing),
                };
                let mut stream = TcpStream::connect(http).await.expect("connect");
                let head = format!(
                    "POST {RANK} HTTP/1.1\r\nHost: test\r\nContent-Length: {length}\r\n\r\n"
                );
                let start = Instant::now();
                stream.write_all(head.as_bytes()).await.expect("head");
                stream.write_all(&body[..sent]).await.expect("body");
                let answer = read_response(&mut stream).await.expect("an answer");
                let elapsed = start.elapsed();
                wait_closed(&mut stream, LIMIT).await;
                (answer, elapsed)
            })
        })
        .collect();
    // Timed from before its request: the server's idle time starts after it.
    let keep_alive = tokio::spawn(async move {
        let mut stream = TcpStream::connect(http).await.expect("connect");
        let start = Instant::now();
        stream
            .write_all(&request("GET", "/health/live", &[], b""))
            .await
            .expect("write");
        let answer = read_response(&mut stream).await.expect("an answer");
        assert_eq!(answer.status, 200);
        wait_closed(&mut stream, LIMIT).await;
        start.elapsed()
    });
    // A gRPC call whose message never comes, and an HTTP/2 connection left idle after a call.
    let waiting_call = grpc_open(grpc, SERVER_LIVE).await;
    let idle_h2 = grpc_open(grpc, SERVER_LIVE).await;
    let idle_since = Instant::now();
    idle_h2
        .body
        .send(Bytes::from(grpc_frame(false, 0, b"")))
        .await
        .expect("send");
    drop(idle_h2.body);
    let idle_call = idle_h2.answer.await.expect("call");
    assert_eq!(idle_call.status.code(), Code::Ok);

    for task in silent_http {
        assert!(task.await.expect("silent client") >= HEADER);
    }
    assert!(silent_grpc.await.expect("silent gRPC client") >= HEADER);
    assert!(dripping.await.expect("dripping client") >= HEADER);
    for task in short_bodies {
        let (answer, elapsed) = task.await.expect("short body");
        assert_eq!(answer.status, 408);
        assert_eq!(
            answer.error(),
            "the request body did not arrive within 500 ms of its head"
        );
        assert_eq!(answer.header("connection"), Some("close"));
        assert!(elapsed >= BODY, "{elapsed:?}");
    }
    assert!(keep_alive.await.expect("keep-alive client") >= IDLE);
    let waited = waiting_call.answer.await.expect("call");
    assert_eq!(
        waited.status.code(),
        Code::DeadlineExceeded,
        "{:?}",
        waited.status
    );
    assert_eq!(
        waited.status.message(),
        "the request body did not arrive within 500 ms of its head"
    );
    drop(waiting_call.body);
    // The client keeps its connection (idle_h2.sender lives on): the server closes it.
    tokio::time::timeout(LIMIT, idle_h2.connection)
        .await
        .expect("the idle HTTP/2 connection is closed")
        .expect("connection task");
    assert!(idle_since.elapsed() >= IDLE);

    done.store(true, Ordering::Relaxed);
    normal.await.expect("normal clients");
    assert!(served.load(Ordering::Relaxed) > 0);
    let (_, metrics) = server.get("/metrics").await;
    let timed_out = |listener: &str, timeout: &str| {
        metric_sample(
            &metrics,
            &format!(
                "recserve_connections_timed_out_total{{listener=\"{listener}\",timeout=\"{timeout}\"}}"
            ),
        )
    };
    // 20 silent sockets and the dripping head; the keep-alive connection; the silent and the idle gRPC ones.
    assert!(timed_out("http", "header") >= 21.0, "{metrics}");
    assert!(timed_out("http", "idle") >= 1.0, "{metrics}");
    assert!(timed_out("grpc", "header") >= 1.0, "{metrics}");
    assert!(timed_out("grpc", "idle") >= 1.0, "{metrics}");
    server.stop().await.expect("clean shutdown");
}

/// Opens a connection and has it answer one request, so that it is known to be held; retries while the server
/// still counts connections that are closing (each retry is a refusal).
/// An HTTP/2 client that grants its streams no flow-control window (SETTINGS_INITIAL_WINDOW_SIZE = 0) and never
/// reads: its responses' heads arrive, their bodies cannot. The server drops the connection, and with it the
/// responses it holds, `--write-timeout-ms` after they last made progress, and counts it; a client that reads is
/// served meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http2_client_that_never_reads_is_dropped_after_the_write_timeout() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    const WRITE: Duration = Duration::from_millis(500);
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.write_timeout_ms = Some(WRITE.as_millis() as u64);
    }))
    .await;
    let stream = TcpStream::connect(server.addr).await.expect("connect");
    let (sender, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(0)
        .handshake::<_, http_body_util::Full<Bytes>>(TokioIo::new(stream))
        .await
        .expect("HTTP/2 handshake");
    let start = Instant::now();
    let connection = tokio::spawn(conn);
    let mut held = Vec::new();
    for user in 0..8 {
        let request =
            axum::http::Request::post(format!("http://{}/v1/models/lightgcn/recall", server.addr))
                .header("content-type", "application/json")
                .body(http_body_util::Full::new(Bytes::from(format!(
                    r#"{{"user_id": {user}, "k": 50}}"#
                ))))
                .expect("request");
        let response = sender
            .clone()
            .send_request(request)
            .await
            .expect("a response head");
        assert_eq!(response.status(), 200);
        held.push(response);
    }
    // Meanwhile, a client that reads is answered.
    let body: serde_json::Value = serde_json::from_slice(&rank_body()).expect("json");
    let (status, answer) = server.post(RANK, &body).await;
    assert_eq!(status, 200, "{answer}");
    let ended = tokio::time::timeout(LIMIT, connection)
        .await
        .expect("the connection is dropped within the limit");
    assert!(ended.is_ok(), "the connection task ended");
    assert!(
        start.elapsed() >= WRITE,
        "not before the write timeout: {:?}",
        start.elapsed()
    );
    let (_, metrics) = server.get("/metrics").await;
    assert_eq!(
        metric_sample(
            &metrics,
            "recserve_connections_timed_out_total{listener=\"http\",timeout=\"write\"}"
        ),
        1.0
    );
    drop(held);
    server.stop().await.expect("clean shutdown");
}

async fn held_connection(addr: std::net::SocketAddr) -> TcpStream {
    for _ in 0..300 {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream
            .write_all(&request("GET", "/health/live", &[], b""))
            .await
            .expect("write");
        if let Some(answer) = read_response(&mut stream).await {
            assert_eq!(answer.status, 200);
            return stream;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no connection was accepted for 30 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_holds_across_both_listeners_and_refusals_are_counted() {
    let mut server =
        TestServer::spawn(config(&fixture_repo(), |a| a.max_connections = Some(2))).await;
    // No idle connection of the test's own client may take a place.
    server.client = reqwest::Client::builder()
        .pool_max_idle_per_host(0)
        .build()
        .expect("client");
    server.wait_ready().await;

    let first = held_connection(server.addr).await;
    let _second = held_connection(server.addr).await;
    // Both places are taken: a third connection is closed at once, unanswered, on either listener.
    let refused = exchange(server.addr, &request("GET", "/health/live", &[], b"")).await;
    assert_eq!(refused, None, "a connection beyond the cap was served");
    let mut grpc = TcpStream::connect(server.grpc_addr).await.expect("connect");
    assert!(wait_closed(&mut grpc, LIMIT).await.is_empty());

    // A place freed is a place for the next connection.
    drop(first);
    let mut third = held_connection(server.addr).await;
    third
        .write_all(&request("GET", "/metrics", &[], b""))
        .await
        .expect("write");
    let metrics =
        String::from_utf8(read_response(&mut third).await.expect("metrics").body).expect("utf-8");
    assert!(
        metric_sample(
            &metrics,
            "recserve_connections_refused_total{listener=\"http\"}"
        ) >= 1.0
    );
    assert_eq!(
        metric_sample(
            &metrics,
            "recserve_connections_refused_total{listener=\"grpc\"}"
        ),
        1.0
    );
    assert_eq!(
        metric_sample(&metrics, "recserve_connections_open{listener=\"http\"}"),
        2.0
    );
    drop(third);
    server.stop().await.expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_answers_what_was_sent_before_it_and_refuses_new_connections() {
    let mut server =
        TestServer::start(config(&fixture_repo(), |a| a.shutdown_timeout_s = Some(30))).await;
    let http = server.addr;
    let body = rank_body();

    // Two idle keep-alive connections: one sends a request once the drain has begun, one never does.
    let mut idle = held_connection(http).await;
    let mut idle_then_asked = held_connection(http).await;
    // A request in flight: its head and half its body.
    let mut in_flight = TcpStream::connect(http).await.expect("connect");
    let head = format!(
        "POST {RANK} HTTP/1.1\r\nHost: test\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    in_flight.write_all(head.as_bytes()).await.expect("head");
    let half = body.len() / 2;
    in_flight
        .write_all(&body[..half])
        .await
        .expect("half a body");
    // A head on its way: the request line only.
    let mut heading = TcpStream::connect(http).await.expect("connect");
    heading
        .write_all(b"GET /health/ready HTTP/1.1\r\n")
        .await
        .expect("request line");
    // A gRPC call in flight, its message not yet sent.
    let call = grpc_open(server.grpc_addr, SERVER_LIVE).await;
    // Let the server see all four before the drain: the gRPC connection is counted once its listener has accepted
    // it, which on a loaded machine can come after the client's connect returned.
    let mut grpc_seen = false;
    for _ in 0..200 {
        let (_, metrics) = server.get("/metrics").await;
        if metric_sample(&metrics, "recserve_connections_open{listener=\"grpc\"}") >= 1.0 {
            grpc_seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(grpc_seen, "the gRPC connection was not counted within 10 s");

    let start = Instant::now();
    server.request_stop();
    // New connections are refused once the drain has begun, on both listeners.
    assert!(
        refused_soon(http).await,
        "new connections were still accepted 30 s into the drain"
    );
    // A request sent on an idle connection just after the drain began (well within DRAIN_IDLE_GRACE, a second)
    // is answered, where closing idle connections at once would have lost it.
    idle_then_asked
        .write_all(&request("GET", "/health/live", &[], b""))
        .await
        .expect("write");
    let live = read_response(&mut idle_then_asked)
        .await
        .expect("a request on its way is answered");
    assert_eq!(live.status, 200);
    assert_eq!(live.header("connection"), Some("close"));
    assert!(
        refused_soon(server.grpc_addr).await,
        "new gRPC connections were still accepted"
    );

    // Readiness is already false; the head that was on its way is answered, and its connection closed.
    heading
        .write_all(b"Host: test\r\n\r\n")
        .await
        .expect("headers");
    let ready = read_response(&mut heading).await.expect("an answer");
    assert_eq!(ready.status, 503);
    assert_eq!(ready.body, br#"{"status":"shutting down"}"#);
    assert_eq!(ready.header("connection"), Some("close"));
    // The request in flight is answered in full.
    in_flight.write_all(&body[half..]).await.expect("the rest");
    let ranked = read_response(&mut in_flight).await.expect("an answer");
    assert_eq!(
        ranked.status,
        200,
        "{:?}",
        String::from_utf8_lossy(&ranked.body)
    );
    assert_eq!(ranked.header("connection"), Some("close"));
    // So is the gRPC call, after the GOAWAY.
    call.body
        .send(Bytes::from(grpc_frame(false, 0, b"")))
        .await
        .expect("send");
    drop(call.body);
    let answer = call.answer.await.expect("call");
    assert_eq!(answer.status.code(), Code::Ok, "{:?}", answer.status);
    // The idle connection is closed.
    wait_closed(&mut idle, LIMIT).await;

    server.finished().await.expect("clean shutdown");
    assert!(
        start.elapsed() < Duration::from_secs(30),
        "the drain waited for --shutdown-timeout-s"
    );
}

/// Polls `addr` until a connection is refused (30 s at most).
async fn refused_soon(addr: std::net::SocketAddr) -> bool {
    for _ in 0..300 {
        match TcpStream::connect(addr).await {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => return true,
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    false
}
