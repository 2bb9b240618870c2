//! Shared by the end-to-end tests: the generated test fixture, and a real server on port 0.

#![allow(
    dead_code,
    reason = "each test binary uses a different part of this module"
)]

pub mod otlp;
pub mod raw;
pub mod redis;
pub mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use recserve::config::{Config, ServeArgs};
use recserve::server::Listeners;
use recserve::service::StartError;
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The directory `python -m recserve_models fixture` wrote (`scripts/test.sh` does that).
pub fn fixture_dir() -> PathBuf {
    let dir = std::env::var_os("RECSERVE_TEST_FIXTURE")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/test-fixture"));
    assert!(
        dir.join("repo").is_dir() && dir.join("cases.json").is_file(),
        "no test fixture at {}: run scripts/test.sh, which generates it \
         (python -m recserve_models fixture --out target/test-fixture), or set RECSERVE_TEST_FIXTURE",
        dir.display()
    );
    dir
}

pub fn fixture_repo() -> PathBuf {
    fixture_dir().join("repo")
}

pub fn cases() -> Value {
    let text = std::fs::read_to_string(fixture_dir().join("cases.json")).expect("read cases.json");
    serde_json::from_str(&text).expect("cases.json is JSON")
}

/// Held-out rank requests of the demo's DeepFM models and the toolchain's offline scores
/// (`python -m recserve_models demo-cases`, which `scripts/test.sh` runs; `RECSERVE_DEMO_CASES`).
pub fn demo_cases() -> Value {
    let path = std::env::var_os("RECSERVE_DEMO_CASES")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/demo-cases.json"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run scripts/test.sh, which writes it \
             (python -m recserve_models demo-cases --repository models/demo --out target/demo-cases.json)",
            path.display()
        )
    });
    serde_json::from_str(&text).expect("demo cases are JSON")
}

/// The ONNX Runtime library the tests load (`scripts/env.sh` sets ORT_DYLIB_PATH).
pub fn ort_library() -> PathBuf {
    let path = std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .expect("ORT_DYLIB_PATH must point at libonnxruntime.so: run scripts/test.sh, or source scripts/env.sh");
    assert!(
        path.is_file(),
        "ORT_DYLIB_PATH={} does not exist",
        path.display()
    );
    path
}

/// The configuration for a test server on `repository` with defaults, adjusted by `tweak`.
pub fn config(repository: &Path, tweak: impl FnOnce(&mut ServeArgs)) -> Config {
    let mut args = ServeArgs {
        repository: Some(repository.to_path_buf()),
        ort_library: Some(ort_library()),
        // CI machines are small and busy: requests without a deadline header must not time out there. Tests of
        // deadlines send the header.
        default_deadline_ms: Some(60_000),
        ..ServeArgs::default()
    };
    tweak(&mut args);
    args.resolve().expect("valid test configuration")
}

/// A server running in this process on ephemeral ports.
pub struct TestServer {
    /// HTTP (`/v1`, `/v2`, health, metrics).
    pub addr: SocketAddr,
    /// gRPC (KServe v2, health, reflection).
    pub grpc_addr: SocketAddr,
    pub client: reqwest::Client,
    stop: Option<oneshot::Sender<()>>,
    handle: Option<JoinHandle<Result<(), StartError>>>,
}

impl TestServer {
    /// Starts a server (not waiting for readiness).
    pub async fn spawn(config: Config) -> TestServer {
        let bind = || async {
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind port 0")
        };
        let listeners = Listeners {
            http: bind().await,
            grpc: bind().await,
        };
        let addr = listeners.http.local_addr().expect("local addr");
        let grpc_addr = listeners.grpc.local_addr().expect("local addr");
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(recserve::server::run(config, listeners, async {
            let _ = stopped.await;
        }));
        TestServer {
            addr,
            grpc_addr,
            client: reqwest::Client::new(),
            stop: Some(stop),
            handle: Some(handle),
        }
    }

    /// Starts a server and waits until `/health/ready` says so.
    pub async fn start(config: Config) -> TestServer {
        let mut server = TestServer::spawn(config).await;
        server.wait_ready().await;
        server
    }

    /// Polls `/health/ready`; panics with the start-up error if the server stopped instead.
    pub async fn wait_ready(&mut self) {
        for _ in 0..600 {
            if let Some(handle) = &self.handle
                && handle.is_finished()
            {
                let result = self
                    .handle
                    .take()
                    .expect("handle")
                    .await
                    .expect("server task");
                panic!("server stopped before becoming ready: {result:?}");
            }
            if let Ok(resp) = self.client.get(self.url("/health/ready")).send().await
                && resp.status() == 200
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("server not ready after 60 s");
    }

    /// Waits for the server to stop on its own (e.g. because loading failed) and returns its result.
    pub async fn finished(mut self) -> Result<(), StartError> {
        let handle = self.handle.take().expect("handle");
        tokio::time::timeout(Duration::from_secs(60), handle)
            .await
            .expect("server stops within 60 s")
            .expect("server task")
    }

    /// Asks the server to shut down without waiting for it.
    pub fn request_stop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }

    /// Asks the server to shut down and waits for it.
    pub async fn stop(mut self) -> Result<(), StartError> {
        self.request_stop();
        self.finished().await
    }

    /// The gRPC endpoint, for tonic clients.
    pub fn grpc_url(&self) -> String {
        format!("http://{}", self.grpc_addr)
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let resp = self.client.get(self.url(path)).send().await.expect("GET");
        (resp.status().as_u16(), resp.text().await.expect("body"))
    }

    /// Sends a JSON POST with these headers in the background; the task yields the answer's status.
    pub fn post_in_background(
        &self,
        path: &str,
        headers: &[(&str, &str)],
        body: &Value,
    ) -> JoinHandle<u16> {
        let mut post = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_string());
        for (name, value) in headers {
            post = post.header(*name, *value);
        }
        tokio::spawn(async move { post.send().await.expect("POST").status().as_u16() })
    }

    /// Waits (about a second at most) until `model`'s queue holds `depth` requests, and returns `/metrics` then.
    pub async fn wait_for_queue_depth(&self, model: &str, depth: usize) -> String {
        // Its serving version's queue (the tests serve one version of each model).
        let gauge = format!("recserve_queue_depth{{model=\"{model}\",version=");
        for _ in 0..500 {
            let (_, metrics) = self.get("/metrics").await;
            if metric_sample(&metrics, &gauge) == depth as f64 {
                return metrics;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        panic!("{model}'s queue never held {depth} requests");
    }

    pub async fn post_raw(&self, path: &str, body: impl Into<reqwest::Body>) -> (u16, Value) {
        let resp = self
            .client
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("POST");
        let status = resp.status().as_u16();
        let text = resp.text().await.expect("body");
        let value = match serde_json::from_str(&text) {
            Ok(value) => value,
            Err(_) => Value::String(text),
        };
        (status, value)
    }

    pub async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        self.post_raw(path, body.to_string()).await
    }
}

/// Copies a directory tree (test repositories get broken in copies).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read_dir") {
        let entry = entry.expect("entry");
        let target = to.join(entry.file_name());
        if entry.path().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).expect("copy");
        }
    }
}

/// The value of the first sample line of a `/metrics` text that starts with `prefix` (a metric name and labels).
pub fn metric_sample(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no sample {prefix} in\n{metrics}"))
}

/// Runs the Python script `tests/<script>` with `args` (the test venv's `python`, or `RECSERVE_TEST_PYTHON`),
/// failing loudly when it cannot run or exits non-zero: a missing tritonclient is a failure, never a skip.
pub async fn run_python(script: &str, args: Vec<String>) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(script);
    let python = std::env::var("RECSERVE_TEST_PYTHON").unwrap_or_else(|_| "python".to_owned());
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new(&python)
            .arg(&path)
            .args(&args)
            .output()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run {python:?} ({e}): run scripts/test.sh, or source scripts/env.sh after \
                     scripts/setup.sh (the .venv has tritonclient), or set RECSERVE_TEST_PYTHON"
                )
            })
    })
    .await
    .expect("python task");
    assert!(
        output.status.success(),
        "tests/{script} failed ({}):\n{}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}
