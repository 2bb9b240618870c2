//! recload against a real HTTP server (axum, in this test) that stalls: every request that arrives during the first
//! 200 ms of each second waits until those 200 ms are over. An open-loop run measures latency from each request's
//! scheduled send time, so the stall shows in its p99; a closed-loop run measures from the send, its one worker
//! meets the stall about once a second among thousands of fast requests, and its p99 hides it, although its
//! maximum shows that the stall happened.
//!
//! The assertions are on the ordering and magnitude of the measured percentiles, not on how long the test takes.

use std::net::SocketAddr;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::routing::{get, post};
use clap::Parser;
use recload::cli::{Cli, Command, run_report};
use recload::report::RunReport;
use serde_json::{Value, json};
use tokio::time::Instant;

const STALL: Duration = Duration::from_millis(200);
const PERIOD: Duration = Duration::from_secs(1);

/// A one-field ranking model, as `GET /v1/models` describes it: recload builds its requests from this.
fn models() -> Value {
    json!({"models": [{
        "name": "m", "version": 1, "available_versions": [1], "kind": "deepfm", "precision": "fp32",
        "device": "cpu", "description": "stalling test model",
        "user_fields": ["u"], "item_fields": ["i"], "item_id_field": "i", "dense_features": [],
        "tables": [
            {"name": "u", "rows": 100, "dim": 4, "storage": "fp32", "oov": "reject", "shards": 1, "bytes": 1600},
            {"name": "i", "rows": 100, "dim": 4, "storage": "fp32", "oov": "reject", "shards": 1, "bytes": 1600}
        ]
    }]})
}

async fn rank(State(origin): State<Instant>, body: axum::body::Bytes) -> axum::Json<Value> {
    let phase = origin.elapsed().as_nanos() % PERIOD.as_nanos();
    if phase < STALL.as_nanos() {
        tokio::time::sleep(STALL - Duration::from_nanos(phase as u64)).await;
    }
    let request: Value = serde_json::from_slice(&body).expect("recload sends JSON");
    let n = request["candidates"].as_array().expect("candidates").len();
    let scores: Vec<Value> = (0..n).map(|i| json!({"index": i, "score": 0.5})).collect();
    axum::Json(json!({"model": "m", "version": 1, "scores": scores}))
}

async fn stalling_server() -> SocketAddr {
    let app = Router::new()
        .route("/v1/models", get(|| async { axum::Json(models()) }))
        .route("/v1/models/m/rank", post(rank))
        .with_state(Instant::now());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind port 0");
    let addr = listener.local_addr().expect("address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

async fn recload(args: &[&str]) -> RunReport {
    let cli = Cli::try_parse_from(["recload", "run"].iter().chain(args)).expect("valid flags");
    let Command::Run(run) = cli.command else {
        panic!("parsed as a run")
    };
    run_report(&run).await.expect("the run completes")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn open_loop_p99_shows_a_stall_that_closed_loop_p99_hides() {
    let url = format!("http://{}", stalling_server().await);
    let common = [
        "--url",
        &url,
        "--model",
        "m",
        "--candidates",
        "5",
        "--warmup",
        "500ms",
        "--duration",
        "3s",
        "--timeout",
        "5s",
        "--quiet",
    ];

    let open_args: Vec<&str> = common
        .iter()
        .copied()
        .chain([
            "--rate",
            "400",
            "--arrivals",
            "constant",
            "--connections",
            "32",
        ])
        .collect();
    let open = recload(&open_args).await;
    let closed_args: Vec<&str> = common
        .iter()
        .copied()
        .chain(["--closed", "--concurrency", "1"])
        .collect();
    let closed = recload(&closed_args).await;
    eprintln!("open loop:\n{open}\nclosed loop:\n{closed}");

    for run in [&open, &closed] {
        assert_eq!(run.requests.errors, 0, "{run}");
        assert!(run.requests.ok > 500, "{run}");
    }
    let open_lat = open.latency_ms.expect("open-loop latencies");
    let closed_lat = closed.latency_ms.expect("closed-loop latencies");

    // The stall is in the open loop's p99 and not in the closed loop's: at least half a stall, against less.
    let half_stall = STALL.as_secs_f64() * 1e3 / 2.0;
    // About a fifth of the open loop's requests are due during a stall and wait up to 200 ms for its end (plus,
    // with 32 connections for the 80 requests due per stall, for a free connection).
    assert!(
        open_lat.p99_ms >= half_stall && open_lat.p99_ms <= 5.0 * STALL.as_secs_f64() * 1e3,
        "open-loop p99 {} ms should show the 200 ms stall",
        open_lat.p99_ms
    );
    // The closed loop met the stall too (its maximum) ...
    assert!(
        closed_lat.max_ms >= half_stall,
        "the closed loop never met a stall: max {} ms",
        closed_lat.max_ms
    );
    // ... but counted one slow request per stall among hundreds or thousands: its p99 stays below.
    assert!(
        closed_lat.p99_ms < half_stall,
        "closed-loop p99 {} ms",
        closed_lat.p99_ms
    );
    assert!(
        open_lat.p99_ms > 2.0 * closed_lat.p99_ms,
        "open-loop p99 {} ms vs closed-loop p99 {} ms",
        open_lat.p99_ms,
        closed_lat.p99_ms
    );
    // The open loop kept sending on schedule through the stalls.
    let offered = open.offered_rps.expect("open loop");
    assert!((offered - 400.0).abs() < 1.0, "offered {offered}");
    assert_eq!(open.requests.scheduled, open.requests.sent);
}
