//! End to end: start-up and shutdown. Broken repositories fail to load with a message naming the file and the
//! mismatch (never a panic), `/metrics` is valid Prometheus exposition (the binary's too, with its I/O threads'
//! CPU time and the machine's steal), and the binary exits 0 on SIGTERM after finishing what it accepted, or 1
//! with a clear message when ONNX Runtime cannot be loaded.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{TestServer, config, copy_dir, fixture_repo};
use recserve::service::StartError;

/// A repository holding only `deepfm-fp32` version 2 of the fixture, to break in one place.
fn one_model_repo(dir: &Path) -> PathBuf {
    let repo = dir.join("repo");
    copy_dir(&fixture_repo().join("deepfm-fp32/2"), &repo.join("m/2"));
    repo
}

fn edit(path: &Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).expect("read");
    assert!(text.contains(from), "{} holds {from:?}", path.display());
    std::fs::write(path, text.replacen(from, to, 1)).expect("write");
}

const C5_TABLE: &str = "[[tables]]\nname = \"C5\"\nfile = \"tables.safetensors\"\nrows = 305\ndim = 9\nstorage = \"fp32\"\noov = \"reject\"\n";
const C26_FIELD: &str = "[[fields]]\nname = \"C26\"\nside = \"item\"\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_repositories_are_refused_with_the_file_and_the_mismatch() {
    type Breaker = fn(&Path);
    let cases: Vec<(&str, Breaker, &str, &str)> = vec![
        (
            "truncated safetensors",
            |v| {
                let f = v.join("tables.safetensors");
                let len = std::fs::metadata(&f).expect("stat").len();
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&f)
                    .expect("open")
                    .set_len(len / 2)
                    .expect("truncate");
            },
            "tables.safetensors",
            "not a valid safetensors file",
        ),
        (
            "ONNX embeddings input disagrees with the fields of model.toml",
            |v| edit(&v.join("model.toml"), C26_FIELD, ""),
            "dense.onnx",
            "input \"embeddings\" has shape [?, 26, 9], but model.toml implies [batch, 25, 9]",
        ),
        (
            "ONNX dense input disagrees with dense_features",
            |v| edit(&v.join("model.toml"), ", \"I13\"]", "]"),
            "dense.onnx",
            "input \"dense\" has shape [?, 13], but model.toml implies [batch, 12]",
        ),
        (
            "a field reads a table model.toml does not declare",
            |v| edit(&v.join("model.toml"), C5_TABLE, ""),
            "model.toml",
            "field \"C5\" reads table \"C5\", which no [[tables]] entry declares",
        ),
        (
            "a table missing from its file",
            |v| {
                let toml = v.join("model.toml");
                edit(&toml, "name = \"C5\"\nfile", "name = \"C5x\"\nfile");
                edit(
                    &toml,
                    "name = \"C5\"\nside = \"user\"\n",
                    "name = \"C5\"\nside = \"user\"\ntable = \"C5x\"\n",
                );
            },
            "tables.safetensors",
            "has no tensor \"C5x\" for table \"C5x\"",
        ),
        (
            "the table file is missing",
            |v| std::fs::remove_file(v.join("tables.safetensors")).expect("rm"),
            "tables.safetensors",
            "cannot open table file",
        ),
        (
            "storage disagrees with the tensor's dtype",
            |v| {
                edit(
                    &v.join("model.toml"),
                    "rows = 305\ndim = 9\nstorage = \"fp32\"",
                    "rows = 305\ndim = 9\nstorage = \"fp16\"",
                )
            },
            "tables.safetensors",
            "tensor \"C5\" has dtype F32, but model.toml declares storage = \"fp16\"",
        ),
        (
            "rows disagree with the tensor's shape",
            |v| edit(&v.join("model.toml"), "rows = 305", "rows = 300"),
            "tables.safetensors",
            "tensor \"C5\" has shape [305, 9], but model.toml declares rows = 300, dim = 9",
        ),
        (
            "the dense graph is missing",
            |v| std::fs::remove_file(v.join("dense.onnx")).expect("rm"),
            "dense.onnx",
            "dense graph file does not exist",
        ),
        (
            "the dense graph is not ONNX",
            |v| std::fs::write(v.join("dense.onnx"), b"not a protobuf at all").expect("write"),
            "dense.onnx",
            "ONNX Runtime cannot load the graph",
        ),
        (
            "model.toml is not TOML",
            |v| edit(&v.join("model.toml"), "kind = \"deepfm\"", "kind = deepfm"),
            "model.toml",
            "string values must be quoted",
        ),
        (
            "an unknown key in model.toml",
            |v| edit(&v.join("model.toml"), "rows = 305", "rows = 305\nshard = 2"),
            "model.toml",
            "unknown field `shard`",
        ),
    ];
    for (what, breaker, file, needle) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = one_model_repo(dir.path());
        let version_dir = repo.join("m/2");
        breaker(&version_dir);
        let server = TestServer::spawn(config(&repo, |_| {})).await;
        match server.finished().await {
            Err(StartError::Load(e)) => {
                assert_eq!(e.path, version_dir.join(file), "{what}: {e}");
                assert!(
                    e.problem.contains(needle),
                    "{what}: expected {needle:?} in {:?}",
                    e.problem
                );
            }
            other => panic!("{what}: expected a load error, got {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_turns_ready_and_metrics_pass_promtool() {
    let mut server = TestServer::spawn(config(&fixture_repo(), |_| {})).await;
    let (status, body) = server.get("/health/live").await;
    assert_eq!((status, body.as_str()), (200, "{\"status\":\"live\"}"));
    server.wait_ready().await;
    let (status, body) = server.get("/health/ready").await;
    assert_eq!((status, body.as_str()), (200, "{\"status\":\"ready\"}"));

    // Some traffic so that histograms and labelled counters have samples.
    let request = serde_json::from_str(
        &std::fs::read_to_string("docs/examples/rank-request.json").expect("example"),
    )
    .expect("json");
    let (status, _) = server.post("/v1/models/deepfm-int8/rank", &request).await;
    assert_eq!(status, 200);
    let (status, _) = server.post("/v1/models/missing/rank", &request).await;
    assert_eq!(status, 404);

    let (status, metrics) = server.get("/metrics").await;
    assert_eq!(status, 200);
    for family in [
        "recserve_requests_total",
        "recserve_request_duration_seconds",
        "recserve_gather_duration_seconds",
        "recserve_inference_duration_seconds",
        "recserve_request_rows",
        "recserve_model_info",
        "recserve_embedding_table_bytes",
        "recserve_thread_cpu_seconds_total",
        "recserve_thread_run_queue_wait_seconds_total",
        "recserve_thread_time_slices_total",
        "recserve_machine_steal_seconds_total",
        "recserve_machine_cpus",
    ] {
        assert!(
            metrics.contains(&format!("# TYPE {family} ")),
            "{family} missing"
        );
    }
    // The request's candidates are observed once (the dashboard's rows per request).
    let candidates = request["candidates"].as_array().expect("candidates").len();
    assert_eq!(
        common::metric_sample(
            &metrics,
            "recserve_request_rows_count{model=\"deepfm-int8\"}"
        ),
        1.0
    );
    assert_eq!(
        common::metric_sample(&metrics, "recserve_request_rows_sum{model=\"deepfm-int8\"}"),
        candidates as f64
    );
    // The thread that loaded the models registered itself; the test's own runtime threads did not.
    assert!(
        metrics.contains("recserve_thread_cpu_seconds_total{model=\"\",role=\"loader\"} "),
        "{metrics}"
    );
    assert!(
        common::metric_sample(
            &metrics,
            "recserve_thread_cpu_seconds_total{model=\"\",role=\"unregistered\"}"
        ) > 0.0
    );
    promtool_check(&metrics);
    server.stop().await.expect("clean shutdown");
}

/// Fails unless `promtool check metrics` finds `metrics` valid and has nothing to say about it.
fn promtool_check(metrics: &str) {
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect(
            "promtool must be installed (scripts/test.sh installs Debian's `prometheus` package)",
        );
    use std::io::Write;
    promtool
        .stdin
        .take()
        .expect("stdin")
        .write_all(metrics.as_bytes())
        .expect("write");
    let out = promtool.wait_with_output().expect("promtool");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "promtool check metrics reports problems:\n{report}"
    );
}

/// Kills the child process if the test fails before it exits.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The real binary serving the fixture on port 0, once it has logged readiness: the child, its HTTP address, and
/// the rest of its log.
fn start_binary() -> (
    KillOnDrop,
    String,
    std::io::Lines<BufReader<std::process::ChildStderr>>,
) {
    let child = Command::new(env!("CARGO_BIN_EXE_recserve"))
        .args([
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--repository",
        ])
        .arg(fixture_repo())
        .arg("--ort-library")
        .arg(common::ort_library())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start recserve");
    let mut child = KillOnDrop(child);
    let mut lines = BufReader::new(child.0.stderr.take().expect("stderr")).lines();
    let mut addr = None;
    let mut ready = false;
    for line in lines.by_ref() {
        let line = line.expect("log line");
        if let Some(rest) = line.split("addr=").nth(1) {
            addr = rest.split_whitespace().next().map(str::to_owned);
        }
        if line.contains("all models loaded; ready") {
            ready = true;
            break;
        }
    }
    assert!(ready, "the server logged readiness");
    (child, addr.expect("the server logged its address"), lines)
}

/// The real binary's `/metrics`: its tokio threads count as `io` (registered by the runtime it builds), each
/// model's executor threads as `executor`, the machine's steal is there, and promtool finds it all valid.
#[test]
fn the_binary_exports_its_io_threads_and_the_machines_steal() {
    let (_child, addr, lines) = start_binary();
    let _drain = std::thread::spawn(move || lines.map_while(Result::ok).count());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let scrape = || {
        runtime.block_on(async {
            let response = reqwest::get(format!("http://{addr}/metrics"))
                .await
                .expect("GET /metrics");
            assert_eq!(response.status(), 200);
            response.text().await.expect("body")
        })
    };
    let first = scrape();
    let io = "recserve_thread_cpu_seconds_total{model=\"\",role=\"io\"}";
    let io_cpu = common::metric_sample(&first, io);
    assert!(io_cpu > 0.0, "{first}");
    assert!(
        common::metric_sample(
            &first,
            "recserve_thread_time_slices_total{model=\"\",role=\"io\"}"
        ) >= 1.0
    );
    assert!(
        common::metric_sample(
            &first,
            "recserve_thread_cpu_seconds_total{model=\"\",role=\"loader\"}"
        ) > 0.0
    );
    // Every model's executor threads are accounted under their model (they have run little yet: warm-up runs on
    // the loader).
    assert!(
        common::metric_sample(
            &first,
            "recserve_thread_cpu_seconds_total{model=\"deepfm-int8\",role=\"executor\"}"
        ) >= 0.0,
        "{first}"
    );
    assert!(common::metric_sample(&first, "recserve_machine_steal_seconds_total") >= 0.0);
    assert!(common::metric_sample(&first, "recserve_machine_cpus") >= 1.0);
    promtool_check(&first);
    // Answering the first scrape, after its reading, was I/O work: the next scrape counts it.
    let second = scrape();
    assert!(common::metric_sample(&second, io) > io_cpu, "{second}");
}

/// The real binary: SIGTERM after a request is in flight → it finishes it and exits 0.
#[test]
fn the_binary_drains_and_exits_zero_on_sigterm() {
    let (mut child, addr, lines) = start_binary();
    // Drain the rest of stderr in the background so the child never blocks on a full pipe.
    let drain = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let body = std::fs::read_to_string("docs/examples/rank-request.json").expect("example");
    let in_flight = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let client = reqwest::Client::new();
            let mut ok = 0;
            for _ in 0..20 {
                match client
                    .post(format!("http://{addr}/v1/models/deepfm-int8/rank"))
                    .body(body.clone())
                    .send()
                    .await
                {
                    Ok(resp) if resp.status() == 200 => ok += 1,
                    _ => break,
                }
            }
            ok
        })
    });
    std::thread::sleep(Duration::from_millis(50));
    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exit = child.0.wait().expect("wait");
    let log = drain.join().expect("stderr").join("\n");
    assert_eq!(exit.code(), Some(0), "exit status {exit:?}, log:\n{log}");
    assert!(
        log.contains("shutdown requested; finishing requests in flight"),
        "{log}"
    );
    assert!(
        in_flight.join().expect("client") >= 1,
        "requests before the signal were answered"
    );
}

#[test]
fn a_missing_onnx_runtime_is_a_clear_start_up_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_recserve"))
        .args([
            "serve",
            "--http-addr",
            "127.0.0.1:0",
            "--grpc-addr",
            "127.0.0.1:0",
            "--ort-library",
            "/nonexistent/libonnxruntime.so.1.31.1",
            "--repository",
        ])
        .arg(fixture_repo())
        .output()
        .expect("run recserve");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "cannot load the ONNX Runtime library from /nonexistent/libonnxruntime.so.1.31.1"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("Set --ort-library (RECSERVE_ORT_LIBRARY) or ORT_DYLIB_PATH"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn check_config_prints_the_resolved_configuration_or_names_the_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_recserve"))
        .args([
            "check-config",
            "--settings-only",
            "--repository",
            "/models",
            "--ort-library",
            "/o.so",
            "--executors",
            "3",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("repository = \"/models\"") && text.contains("executors = 3"),
        "{text}"
    );

    let out = Command::new(env!("CARGO_BIN_EXE_recserve"))
        .args([
            "check-config",
            "--repository",
            "/models",
            "--executors",
            "0",
        ])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(
        text.contains("--executors (RECSERVE_EXECUTORS) must be between 1 and 64, got 0"),
        "{text}"
    );
}

/// `check-config` without `--settings-only` loads what `serve` loads at start (models not warmed up, pipelines):
/// exit status 0 and a line per model and pipeline when the server would start; 1 naming the problem when the
/// repository does not exist or a pipeline names a model it does not hold.
#[test]
fn check_config_loads_the_repository_and_the_pipelines_as_the_server_would_start() {
    let fixture = common::fixture_dir();
    let check = |args: &[&str], config: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_recserve"))
            .arg("check-config")
            .args(args)
            .arg("--ort-library")
            .arg(common::ort_library())
            .arg("--config")
            .arg(config)
            .output()
            .expect("run");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let repo = fixture_repo();
    let repo = repo.to_str().expect("UTF-8 path");
    let config = fixture.join("recserve.toml");

    let (code, stderr) = check(&["--repository", repo], &config);
    assert_eq!(code, Some(0), "{stderr}");
    for line in [
        "check-config: model \"deepfm-int8\" version 1 (deepfm, int8, cpu) loads",
        "check-config: model \"lightgcn\" version",
        "check-config: pipeline \"fixture\" (recall \"lightgcn\" → rank",
        "check-config: the server would start on",
    ] {
        assert!(stderr.contains(line), "{line}\n{stderr}");
    }

    let (code, stderr) = check(&["--repository", "/nonexistent"], &config);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("check-config: ERROR the server would not start on /nonexistent: cannot load model: /nonexistent"),
        "{stderr}"
    );

    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("recserve.toml");
    std::fs::write(
        &missing,
        "[pipelines.p]\nrecall_model = \"lightgcn\"\nranking_model = \"nope\"\ncandidates = 10\nk = 5\n",
    )
    .expect("write");
    let (code, stderr) = check(&["--repository", repo], &missing);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("pipeline \"p\" (--config [pipelines.p]):") && stderr.contains("nope"),
        "{stderr}"
    );

    // A broken model: with --model-control poll the server would start without it, and the check says so (exit 1).
    let broken = dir.path().join("repo");
    copy_dir(&fixture_repo(), &broken);
    std::fs::write(
        broken.join("deepfm-fp16/1/model.toml"),
        "format_version = 1\n",
    )
    .expect("break");
    let broken = broken.to_str().expect("UTF-8 path");
    let (code, stderr) = check(
        &["--repository", broken, "--model-control", "poll"],
        &config,
    );
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("check-config: ERROR model \"deepfm-fp16\": deepfm-fp16/1/model.toml:")
            && stderr.contains("(with --model-control poll, the server starts without it)")
            && stderr.contains("without 1 model(s) that fail to load"),
        "{stderr}"
    );
    let (code, stderr) = check(&["--repository", broken], &config);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("the server would not start")
            && stderr.contains("deepfm-fp16/1/model.toml"),
        "{stderr}"
    );

    // TLS and the inference tokens: files `serve` would refuse are named with their flag, and the models are
    // still checked (exit 1); good ones get a line each (exit 0).
    let one = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
    let write = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write");
        path.to_str().expect("UTF-8 path").to_owned()
    };
    let cert = write("cert.pem", &one.cert.pem());
    let key = write("key.pem", &one.signing_key.serialize_pem());
    let wrong_key = write("wrong.key", &other.signing_key.serialize_pem());
    let tokens = write("tokens", "t0ken\n");
    let no_tokens = write("no-tokens", "\n# none\n");
    let (code, stderr) = check(
        &[
            "--repository",
            repo,
            "--tls-cert",
            &cert,
            "--tls-key",
            &key,
            "--inference-tokens-file",
            &tokens,
        ],
        &config,
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "check-config: TLS certificate {cert} and key {key} load"
        )) && stderr.contains(&format!(
            "check-config: --inference-tokens-file {tokens} holds 1 token(s)"
        )),
        "{stderr}"
    );
    let (code, stderr) = check(
        &[
            "--repository",
            repo,
            "--tls-cert",
            &cert,
            "--tls-key",
            &wrong_key,
            "--inference-tokens-file",
            &no_tokens,
        ],
        &config,
    );
    assert_eq!(code, Some(1), "{stderr}");
    for line in [
        format!(
            "check-config: ERROR the server would not start: --tls-key {wrong_key}: does not match the certificate of --tls-cert {cert}"
        ),
        format!(
            "check-config: ERROR the server would not start: --inference-tokens-file {no_tokens}: holds no token"
        ),
        "check-config: ERROR the server would not start: 2 TLS or token file(s) cannot be used"
            .to_owned(),
        "check-config: the models would load on".to_owned(),
    ] {
        assert!(stderr.contains(&line), "{line}\n{stderr}");
    }
}

/// Loads at start are counted as loads (`recserve_model_loads_total`, the load duration) with the default
/// `--model-control none`; the warm-up's queries are not traffic: a fresh server's recall counters are zero; the
/// standard `process_*` families are exported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fresh_server_counts_its_loads_not_its_warm_up_and_exports_process_metrics() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let (_, metrics) = server.get("/metrics").await;
    for model in ["deepfm-int8", "lightgcn"] {
        assert_eq!(
            common::metric_sample(
                &metrics,
                &format!("recserve_model_loads_total{{model=\"{model}\",outcome=\"loaded\"}}")
            ),
            1.0,
            "{model}"
        );
        assert_eq!(
            common::metric_sample(
                &metrics,
                &format!("recserve_model_load_duration_seconds_count{{model=\"{model}\"}}")
            ),
            1.0,
            "{model}"
        );
    }
    for series in [
        "recserve_recall_queries_total{model=\"lightgcn\",search=\"exact\"}",
        "recserve_recall_items_scored_total{model=\"lightgcn\"}",
        "recserve_topk_duration_seconds_count{model=\"lightgcn\"}",
    ] {
        assert_eq!(
            common::metric_sample(&metrics, series),
            0.0,
            "{series} before any request"
        );
    }
    for series in [
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_threads ",
    ] {
        assert!(common::metric_sample(&metrics, series) > 0.0, "{series}");
    }
    server.stop().await.expect("clean shutdown");
}
