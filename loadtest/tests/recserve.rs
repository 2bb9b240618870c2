//! recload against a real recserve, started in this process on port 0 over the generated test repository
//! (`scripts/test.sh` generates it; `RECSERVE_TEST_FIXTURE` points at it): every request recload generates, from
//! `GET /v1/models` or from `model.toml`, with Zipf ids or a dataset file, is accepted and answered; `check` finds
//! a server equal to itself and tells two different models apart; the in-process ceiling runs a fixture model.
//! The recall and recommend workloads run against the demo repository (`models/demo`, its `demo` pipeline).
//! No assertion depends on how fast anything ran.

mod common;
#[path = "common/server.rs"]
mod server;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use common::fixture_repo;
use recload::ceiling::{self, CeilingOptions};
use recload::check::{self, CheckError, ScoresFile};
use recload::cli::{Cli, Command, build_workload, run_command, run_report};
use recload::report::RunReport;
use recload::target::{Envelope, HttpTarget, Target, TensorLayout};
use recload::workload::IdDistribution;
use recserve::config::ServeArgs;
use server::{Server, ort_library};

async fn start_recserve() -> Server {
    start_recserve_with(serve_config(|_| {})).await
}

/// The demo repository as scripts/run-demo.sh serves it (with the `demo` pipeline of its recserve.toml).
async fn start_demo_recserve() -> Server {
    let demo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models/demo");
    start_recserve_with(serve_config(|a| {
        a.config = Some(demo.join("recserve.toml"));
        a.repository = Some(demo);
    }))
    .await
}

async fn start_recserve_with(mut config: recserve::config::Config) -> Server {
    // However slow the machine (a debug build beside other work), every request waits for its answer: deadlines
    // (a minute) and the queue are long enough, so that no assertion depends on how fast anything ran.
    config.batch.default_deadline_ms = Some(60_000);
    config.batch.queue_capacity = 1 << 16;
    let server = Server::start(config).await;
    let probe = HttpTarget::new(&format!("http://{}", server.addr), Envelope::None)
        .await
        .expect("URL");
    for _ in 0..600 {
        assert!(server.is_running(), "recserve stopped before it was ready");
        if let Ok((200, _)) = probe.get("/health/ready").await {
            return server;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("recserve not ready after 60 s");
}

async fn run(args: &[&str]) -> RunReport {
    let cli = Cli::try_parse_from(["recload", "run"].iter().chain(args)).expect("valid flags");
    let Command::Run(run) = cli.command else {
        panic!("parsed as a run")
    };
    run_report(&run).await.expect("the run completes")
}

/// Runs recload against `server` with `case` and `timing` and checks that every request was answered.
async fn every_request_answered(server: &Server, case: &[&str], timing: &[&str]) {
    let url = format!("http://{}", server.addr);
    let args: Vec<&str> = ["--url", url.as_str()]
        .into_iter()
        .chain(case.iter().copied())
        .chain(timing.iter().copied())
        .collect();
    all_answered(&run(&args).await);
}

fn all_answered(report: &RunReport) {
    assert!(report.requests.scheduled > 0, "{report}");
    assert_eq!(report.requests.errors, 0, "{report}\n{:?}", report.errors);
    assert_eq!(report.requests.ok, report.requests.scheduled, "{report}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recserve_answers_every_request_recload_generates() {
    let server = start_recserve().await;
    let repo = fixture_repo();
    let repo = repo.to_str().expect("UTF-8 path");
    let timing = [
        "--warmup",
        "200ms",
        "--duration",
        "1s",
        "--timeout",
        "60s",
        "--quiet",
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let dataset = dir.path().join("users.txt");
    std::fs::write(&dataset, "0 5 6 7\n1 1998\n1459 3\n").expect("write dataset");
    let dataset = dataset.to_str().expect("UTF-8 path");

    let cases: Vec<Vec<&str>> = vec![
        // The model described by GET /v1/models (fields read same-named tables).
        vec!["--model", "deepfm-int8", "--rate", "100"],
        // The model read from model.toml: field C26 reads table C25 (96 rows, rejects unknown ids).
        vec![
            "--model",
            "deepfm-fp16",
            "--repository",
            repo,
            "--rate",
            "100",
            "--ids",
            "uniform",
        ],
        // Users from a dataset file in field C1 (1460 rows); candidate ids from its items.
        vec![
            "--model",
            "deepfm-fp32",
            "--dataset",
            dataset,
            "--user-id-field",
            "C1",
            "--closed",
            "--concurrency",
            "2",
        ],
        // top_k and a small pool.
        vec![
            "--model",
            "deepfm-fp32",
            "--rate",
            "50",
            "--top-k",
            "3",
            "--candidates",
            "7",
            "--pool",
            "3",
        ],
    ];
    for case in cases {
        every_request_answered(&server, &case, &timing).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_draws_its_percentiles_against_the_sla() {
    let server = start_recserve().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let svg = dir.path().join("run.svg");
    let json = dir.path().join("run.json");
    let url = format!("http://{}", server.addr);
    let args = [
        "recload",
        "run",
        "--url",
        &url,
        "--model",
        "deepfm-int8",
        "--rate",
        "50",
        "--warmup",
        "200ms",
        "--duration",
        "1s",
        "--timeout",
        "60s",
        "--quiet",
        "--sla",
        "1h,1ns",
    ];
    let paths = [
        "--svg",
        svg.to_str().expect("UTF-8"),
        "--json",
        json.to_str().expect("UTF-8"),
    ];
    let cli = Cli::try_parse_from(args.iter().chain(&paths)).expect("valid flags");
    let Command::Run(run) = cli.command else {
        panic!("parsed as a run")
    };
    run_command(&run).await.expect("the run completes");
    server.stop().await;
    let report: RunReport =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report")).expect("run JSON");
    all_answered(&report);
    let chart = std::fs::read_to_string(&svg).expect("chart written");
    // Each bar's percentile labels the x axis (plotters writes a text's content on a line of its own).
    for name in ["p50", "p90", "p99", "p99.9", "max"] {
        assert!(
            chart.contains(&format!("\n{name}\n</text>")),
            "{name}: {chart}"
        );
    }
    // The SLAs, each labelled in the SLA red, and the verdicts: no run is answered within a nanosecond, every run
    // within an hour.
    assert!(
        chart.contains("fill=\"#C8102E\">\nSLA 0 ms\n</text>"),
        "{chart}"
    );
    assert!(
        chart.contains("fill=\"#C8102E\">\nSLA 3600000 ms\n</text>"),
        "{chart}"
    );
    assert!(
        chart.contains(": missed, p99 ") && chart.contains(": met (p99 "),
        "{chart}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recall_and_recommend_workloads_are_answered_by_the_demo_repository() {
    let server = start_demo_recserve().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let dataset = dir.path().join("train.txt");
    std::fs::write(
        &dataset,
        "7 2525 1933 991\n1000 468 714 12 40980\n29857 0\n",
    )
    .expect("write dataset");
    let dataset = dataset.to_str().expect("UTF-8 path").to_owned();
    let timing = [
        "--closed",
        "--concurrency",
        "2",
        "--warmup",
        "200ms",
        "--duration",
        "1s",
        "--timeout",
        "60s",
        "--quiet",
    ];
    let cases: Vec<Vec<&str>> = vec![
        // Recall by user id (the demo's 29,858 Gowalla users), and by a history of items.
        vec![
            "--workload",
            "recall",
            "--model",
            "lightgcn",
            "--users",
            "29858",
            "--k",
            "20",
        ],
        // 32 users a call, through the KServe v2 endpoint.
        vec![
            "--workload",
            "recall",
            "--model",
            "lightgcn",
            "--users",
            "29858",
            "--users-per-request",
            "32",
        ],
        vec![
            "--workload",
            "recall",
            "--model",
            "lightgcn",
            "--recall-input",
            "history",
            "--items",
            "40981",
            "--history-len",
            "10",
        ],
        // Recommend: the ranker (deepfm-gowalla) takes the co-occurrence of each candidate with the user's
        // items, so a request by user id sends them in `history` (and `exclude`), from a dataset of Gowalla-like
        // lines; its one user field is the activity bucket.
        vec![
            "--workload",
            "recommend",
            "--pipeline",
            "demo",
            "--dataset",
            dataset.as_str(),
            "--send-history",
            "--exclude-known",
            "--body-extra",
            r#"{"user": {"fields": {"activity": 4}}}"#,
            "--k",
            "10",
        ],
    ];
    for case in cases {
        every_request_answered(&server, &case, &timing).await;
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_agrees_with_itself_and_tells_models_apart() {
    let server = start_recserve().await;
    let url = format!("http://{}", server.addr);
    let target = HttpTarget::new(&url, Envelope::None).await.expect("URL");
    let workload_for = |model: &str| {
        let cli = Cli::try_parse_from([
            "recload", "check", "--url", &url, "--model", model, "--save", "x",
        ])
        .expect("valid flags");
        match cli.command {
            Command::Check(args) => args.workload,
            _ => panic!("parsed as a check"),
        }
    };
    let (int8, _) = build_workload(&workload_for("deepfm-int8"), &target)
        .await
        .expect("workload");
    let requests = int8.pool(8, 1);
    let scores = check::collect(&target, &requests).await.expect("scores");
    assert!(scores.iter().all(|s| s.len() == 100));
    let saved = ScoresFile::new(target.info(), &requests, scores);
    let text = serde_json::to_string(&saved).expect("JSON");
    let saved = ScoresFile::parse(&text).expect("round trip");

    let again = check::collect(&target, &saved.requests())
        .await
        .expect("scores");
    let agreement = saved.compare(&again, 1e-5).expect("the same server agrees");
    assert_eq!((agreement.samples, agreement.scores), (8, 800));
    assert_eq!(agreement.worst, 0.0);

    // deepfm-fp32 has the same fields but its own weights: the same requests get other scores.
    let mut other = saved.clone();
    other.path = "/v1/models/deepfm-fp32/rank".to_owned();
    let different = check::collect(&target, &other.requests())
        .await
        .expect("scores");
    let err = saved.compare(&different, 1e-5).expect_err("other weights");
    assert!(
        matches!(err, CheckError::Mismatch { sample: 0, .. }),
        "{err}"
    );
    server.stop().await;
}

/// The same requests as `/v1` JSON and as the model's KServe v2 tensors in binary data (`--envelope
/// kserve-v2-tensors`) get the same scores; and a run with that envelope is answered throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kserve_v2_tensors_score_as_the_v1_body_they_were_made_from() {
    let server = start_recserve().await;
    let url = format!("http://{}", server.addr);
    let repo = fixture_repo();
    let v1 = HttpTarget::new(&url, Envelope::None).await.expect("URL");
    let found = recserve_core::repository::discover(&repo, &std::collections::HashMap::new())
        .expect("the fixture repository");
    for model in ["deepfm-int8", "deepfm-fp32"] {
        let dir = &found.iter().find(|m| m.name == model).expect(model).dir;
        let spec = recserve_core::repository::read_spec(dir).expect("model.toml");
        let tensors = HttpTarget::new(
            &url,
            Envelope::KserveV2Tensors {
                model: model.to_owned(),
                layout: TensorLayout::from_spec(&spec),
            },
        )
        .await
        .expect("URL");
        let cli = Cli::try_parse_from([
            "recload", "check", "--url", &url, "--model", model, "--save", "x",
        ])
        .expect("valid flags");
        let Command::Check(args) = cli.command else {
            panic!("parsed as a check");
        };
        let (workload, _) = build_workload(&args.workload, &v1).await.expect("workload");
        let requests = workload.pool(6, 3);
        let want = check::collect(&v1, &requests).await.expect("v1 scores");
        let got = check::collect(&tensors, &requests)
            .await
            .expect("tensor scores");
        let saved = ScoresFile::new(v1.info(), &requests, want);
        // The v1 path gathers a request's user rows once, the tensors' path once per row: the same rows, so the
        // same scores up to the fp32 graph's rounding by batch size.
        let agreement = saved.compare(&got, 1e-6).expect("the same scores");
        assert_eq!(agreement.samples, 6, "{model}");
    }
    let repo = repo.display().to_string();
    every_request_answered(
        &server,
        &[
            "--model",
            "deepfm-int8",
            "--repository",
            &repo,
            "--envelope",
            "kserve-v2-tensors",
        ],
        &["--closed", "--concurrency", "4", "--duration", "1s"],
    )
    .await;
    server.stop().await;
}

/// The sum of `recserve_requests_total` over the series whose labels hold every one of `labels`.
async fn requests_total(server: &Server, labels: &[&str]) -> u64 {
    let target = HttpTarget::new(&format!("http://{}", server.addr), Envelope::None)
        .await
        .expect("URL");
    let (status, body) = target.get("/metrics").await.expect("GET /metrics");
    assert_eq!(status, 200);
    let text = String::from_utf8(body.to_vec()).expect("UTF-8 metrics");
    text.lines()
        .filter_map(|line| line.strip_prefix("recserve_requests_total{"))
        .filter(|series| labels.iter().all(|l| series.contains(l)))
        .map(|series| {
            let value = series.rsplit(' ').next().expect("a value");
            value.parse::<f64>().expect("a count") as u64
        })
        .sum()
}

/// `--envelope kserve-v2-grpc`: a run over gRPC is answered throughout, the server counts every request it sent as
/// a gRPC rank request, and a run against a model the server does not have reports only failures, by their gRPC
/// code.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grpc_run_is_answered_and_counted_by_the_server_as_grpc() {
    let server = start_recserve().await;
    let url = format!("http://{}", server.grpc_addr);
    let repo = fixture_repo();
    let repo = repo.to_str().expect("UTF-8 path");
    // No warm-up and no settling: every request sent is one of the report's.
    let flags = |v2_model: &'static str| {
        vec![
            "--url",
            url.as_str(),
            "--envelope",
            "kserve-v2-grpc",
            "--model",
            "deepfm-int8",
            "--v2-model",
            v2_model,
            "--repository",
            repo,
            "--candidates",
            "20",
            "--closed",
            "--concurrency",
            "3",
            "--warmup",
            "0s",
            "--settle-timeout",
            "0s",
            "--duration",
            "1s",
            "--timeout",
            "60s",
            "--quiet",
        ]
    };
    let grpc = ["protocol=\"grpc\""];
    let ok = [
        "code=\"200\"",
        "endpoint=\"rank\"",
        "model=\"deepfm-int8\"",
        "protocol=\"grpc\"",
    ];
    let (before, ok_before) = (
        requests_total(&server, &grpc).await,
        requests_total(&server, &ok).await,
    );
    let report = run(&flags("deepfm-int8")).await;
    all_answered(&report);
    assert_eq!(report.target.protocol, "kserve-v2-grpc");
    assert_eq!(report.target.v2_model.as_deref(), Some("deepfm-int8"));
    assert_eq!(report.requests.sent, report.requests.scheduled, "{report}");
    let (after, ok_after) = (
        requests_total(&server, &grpc).await,
        requests_total(&server, &ok).await,
    );
    assert_eq!(after - before, report.requests.sent, "{report}");
    assert_eq!(ok_after - ok_before, report.requests.ok, "{report}");

    let report = run(&flags("no-such-model")).await;
    assert!(report.requests.sent > 0, "{report}");
    assert_eq!(report.requests.ok, 0, "{report}");
    assert_eq!(
        report.errors.into_iter().collect::<Vec<_>>(),
        [("grpc_not_found".to_owned(), report.requests.sent)]
    );
    assert_eq!(
        requests_total(&server, &grpc).await - after,
        report.requests.sent
    );
    server.stop().await;
}

/// The same requests in the row and the columnar form (`--body columnar`) get the same answers, byte for byte; and
/// a run in the columnar form is answered throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_columnar_body_is_answered_as_the_row_body_of_the_same_seed() {
    let server = start_recserve().await;
    let url = format!("http://{}", server.addr);
    let target = HttpTarget::new(&url, Envelope::None).await.expect("URL");
    let repo = fixture_repo();
    let repo = repo.to_str().expect("UTF-8 path");
    for model in ["deepfm-int8", "deepfm-fp32"] {
        let pool = async |form: &str| {
            let cli = Cli::try_parse_from([
                "recload", "check", "--url", &url, "--model", model, "--save", "x", "--body", form,
            ])
            .expect("valid flags");
            let Command::Check(args) = cli.command else {
                panic!("parsed as a check");
            };
            let (workload, _) = build_workload(&args.workload, &target)
                .await
                .expect("workload");
            workload.pool(6, 5)
        };
        let (rows, columnar) = (pool("rows").await, pool("columnar").await);
        let mut conn = target.connect().await.expect("connect");
        for (r, c) in rows.iter().zip(&columnar) {
            let answer = |request| target.prepare(request);
            let want = target.send(&mut conn, &answer(r)).await.expect("row form");
            let got = target
                .send(&mut conn, &answer(c))
                .await
                .expect("columnar form");
            assert_eq!(want, got, "{model}");
        }
    }
    every_request_answered(
        &server,
        &[
            "--model",
            "deepfm-int8",
            "--repository",
            repo,
            "--body",
            "columnar",
        ],
        &["--closed", "--concurrency", "4", "--duration", "1s"],
    )
    .await;
    server.stop().await;
}

fn serve_config(tweak: impl FnOnce(&mut ServeArgs)) -> recserve::config::Config {
    let mut args = ServeArgs {
        repository: Some(fixture_repo()),
        ort_library: Some(ort_library()),
        ..ServeArgs::default()
    };
    tweak(&mut args);
    args.resolve().expect("valid configuration")
}

fn ceiling_options(model: &str, batch_rows: Vec<usize>) -> CeilingOptions {
    CeilingOptions {
        model: model.to_owned(),
        batch_rows,
        candidates: 100,
        warmup: Duration::from_millis(100),
        duration: Duration::from_millis(300),
        ids: IdDistribution::Zipf,
        zipf_exponent: 1.05,
        pool: 16,
        seed: 1,
    }
}

#[test]
fn the_in_process_ceiling_runs_the_servers_compute_path_at_its_batch_sizes() {
    let config = serve_config(|a| {
        a.shards = Some(2);
        a.batch_buckets = Some(vec![50, 128, 256]);
    });
    let report =
        ceiling::run(&config, &ceiling_options("deepfm-int8", vec![100, 250])).expect("ceiling");
    assert_eq!(report.precision, "int8");
    assert_eq!(report.version, 1);
    assert_eq!(report.device, "cpu");
    assert_eq!(report.shards, 2);
    let rows: Vec<(usize, usize)> = report.batches.iter().map(|b| (b.rows, b.bucket)).collect();
    assert_eq!(
        rows,
        vec![(100, 100), (250, 250)],
        "run unpadded, as the server runs a batch on the CPU"
    );
    assert_eq!(
        report.buckets,
        vec![50, 128, 256, 1024],
        "the server's buckets, up to max_batch_rows"
    );
    for b in &report.batches {
        assert!(b.calls > 0, "{b:?}");
        assert_eq!(b.latency_ms.expect("timed").count, b.calls);
        let expected = b.calls as f64 * b.rows as f64 / report.duration_s;
        assert!((b.rows_per_s - expected).abs() < 1e-6, "{b:?}");
        assert!(
            (b.requests_per_s - b.rows_per_s / 100.0).abs() < 1e-6,
            "{b:?}"
        );
    }

    let err =
        ceiling::run(&config, &ceiling_options("nope", vec![100])).expect_err("unknown model");
    assert!(
        err.to_string().contains("--model \"nope\" is not in"),
        "{err}"
    );
    let err =
        ceiling::run(&config, &ceiling_options("deepfm-int8", vec![2000])).expect_err("too big");
    assert!(err.to_string().contains("which it would split"), "{err}");
}
