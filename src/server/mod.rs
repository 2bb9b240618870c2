//! Running the server: bind nothing (the caller passes the listeners, so tests use port 0), serve HTTP and gRPC
//! from one process at once so `/health/live` answers while models load on a thread of their own, and drain both
//! on the shutdown future. [`connections`] serves each connection, with its timeouts and the connection cap, over
//! TLS when [`crate::tls`] is configured. SIGHUP, or a change of one of them, rereads the TLS files and the inference
//! tokens' file.

pub(crate) mod connections;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

use connections::{Connections, Listener};

use crate::api;
use crate::api::auth::{Auth, InferenceTokens};
use crate::config::Config;
use crate::service::{Limits, Service, StartError};
use crate::telemetry::requests::RequestTelemetry;
use crate::telemetry::spans::Spans;
use recserve_core::metrics::Metrics;

/// The sockets the server answers on, bound by the caller.
#[derive(Debug)]
pub struct Listeners {
    /// `/v1`, `/v2`, health and `/metrics` (`--http-addr`).
    pub http: TcpListener,
    /// KServe v2 gRPC, `grpc.health.v1` and reflection (`--grpc-addr`).
    pub grpc: TcpListener,
}

/// Serves until `shutdown` resolves (then stops accepting, finishes the requests in flight within
/// `--shutdown-timeout-s`, and returns `Ok`), or until loading the models fails (then returns the error).
pub async fn run(
    config: Config,
    listeners: Listeners,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    // Before anything is served: a certificate or a tokens' file that cannot be used stops the start.
    let tls = config
        .tls
        .as_ref()
        .map(|files| crate::tls::Tls::load(files).map(Arc::new))
        .transpose()
        .map_err(|e| StartError::Credentials(e.into()))?;
    let tokens = config
        .inference_tokens_file
        .as_deref()
        .map(|file| InferenceTokens::load(file).map(Arc::new))
        .transpose()
        .map_err(|e| StartError::Credentials(e.into()))?;
    let metrics = Metrics::new();
    metrics.traces().slow().set_keep(config.slow_requests);
    let service = Arc::new(Service::new(
        metrics,
        Limits {
            max_body_bytes: config.max_body_bytes,
        },
    ));
    tracing::info!(
        addr = %listeners.http.local_addr()?,
        grpc = %listeners.grpc.local_addr()?,
        tls = tls.is_some(),
        client_certificates = config.tls.as_ref().is_some_and(|t| t.client_ca.is_some()),
        inference_tokens = tokens.is_some(),
        "HTTP (addr) and gRPC listening; loading models"
    );
    let reloads = (tls.is_some() || tokens.is_some())
        .then(|| reload_on_hangup(tls.clone(), tokens.clone(), service.metrics.clone()))
        .transpose()?;
    let _stop_reloads = reloads.map(|task| OnDrop(move || task.abort()));
    let auth = |listener| {
        tokens.as_ref().map(|tokens| {
            Auth::new(
                Arc::clone(tokens),
                &service.metrics,
                listener,
                config.max_body_bytes,
            )
        })
    };

    // Before loading starts, so gRPC health reports NOT_SERVING until the models are ready.
    let grpc_routes = api::kserve::grpc::routes(Arc::clone(&service), auth("grpc")).await?;

    let (failed_tx, failed_rx) = oneshot::channel::<()>();
    let loader = {
        let service = Arc::clone(&service);
        let config = config.clone();
        std::thread::Builder::new()
            .name("model-loader".to_owned())
            .spawn(move || {
                recserve_core::threads::register_current_thread(
                    recserve_core::threads::ThreadRole::Loader,
                    "",
                );
                let result = service.load(&config);
                match &result {
                    Ok(()) => {
                        tracing::info!("all models loaded; ready");
                        if let Err(e) = service.start_polling() {
                            tracing::error!("cannot start the repository poll thread: {e}");
                        }
                    }
                    Err(_) => {
                        let _ = failed_tx.send(());
                    }
                }
                result
            })?
    };

    // Tracing and the access log, when either is on; the spans' gRPC channel to the collector lives on this runtime.
    let spans = match &config.telemetry.otlp_endpoint {
        Some(endpoint) => Some(
            Spans::start(endpoint, config.telemetry.trace_sample_ratio)
                .map_err(std::io::Error::other)?,
        ),
        None => None,
    };
    let telemetry = RequestTelemetry::new(spans, config.telemetry.access_log_sample_ratio);
    let connections = Arc::new(
        Connections::new(
            config.max_connections,
            config.timeouts,
            service.metrics.clone(),
            tls,
        )
        .with_telemetry(telemetry.clone()),
    );
    // Readiness turns false first, then both listeners stop accepting and drain their connections.
    let stop = {
        let service = Arc::clone(&service);
        let connections = Arc::clone(&connections);
        async move {
            let load_failed = async {
                // The sender is dropped without a message when loading succeeds: then this never resolves.
                if failed_rx.await.is_err() {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                () = shutdown => tracing::info!("shutdown requested; finishing requests in flight"),
                () = load_failed => {}
            }
            service.begin_shutdown();
            connections.drain();
        }
    };
    let http = connections::serve(
        listeners.http,
        Listener::Http,
        api::router::router(Arc::clone(&service), auth("http")),
        Arc::clone(&connections),
    );
    let grpc = connections::serve(
        listeners.grpc,
        Listener::Grpc,
        grpc_routes,
        Arc::clone(&connections),
    );
    let timeout = Duration::from_secs(config.shutdown_timeout_s);
    tokio::select! {
        result = async { tokio::try_join!(http, grpc) } => { result?; }
        () = async {
            stop.await;
            tokio::time::sleep(timeout).await;
        } => tracing::warn!(seconds = timeout.as_secs(), "shutdown timeout: exiting with requests still in flight"),
    }

    let loaded = tokio::task::spawn_blocking(move || loader.join())
        .await
        .map_err(|e| std::io::Error::other(format!("model loader task: {e}")))?
        .map_err(|_| std::io::Error::other("the model loader panicked"))?;
    if let Some(telemetry) = telemetry {
        // Off the runtime's threads: the export of the last spans runs on them.
        let _ = tokio::task::spawn_blocking(move || telemetry.shutdown()).await;
    }
    // Dropping the last reference to the service closes every model's queue and joins its executor threads.
    drop(service);
    loaded
}

/// Runs `0` when dropped.
struct OnDrop<F: FnMut()>(F);

impl<F: FnMut()> Drop for OnDrop<F> {
    fn drop(&mut self) {
        (self.0)();
    }
}

/// How often the TLS files and the tokens' file are looked at for a change (a Kubernetes Secret mounted as a volume
/// is updated in place, and nobody sends the server a SIGHUP then).
const FILE_CHECK_INTERVAL: Duration = Duration::from_secs(10);

/// Rereads the TLS files and the tokens' file on each SIGHUP, and when one of them has changed (looked at every
/// [`FILE_CHECK_INTERVAL`]), until aborted. What fails to reload is logged and counted, and the previous one
/// stays in use; connections already open keep the certificate they were made with. SIGHUP is listened for
/// before this returns, so a SIGHUP that follows cannot end the process.
fn reload_on_hangup(
    tls: Option<Arc<crate::tls::Tls>>,
    tokens: Option<Arc<InferenceTokens>>,
    metrics: Metrics,
) -> std::io::Result<tokio::task::JoinHandle<()>> {
    let mut hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(|e| {
            std::io::Error::other(format!(
                "cannot listen for SIGHUP (to reload the TLS files and the inference tokens): {e}"
            ))
        })?;
    let mut paths: Vec<std::path::PathBuf> = Vec::new();
    if let Some(tls) = &tls {
        paths.extend(tls.paths());
    }
    if let Some(tokens) = &tokens {
        paths.push(tokens.path().to_path_buf());
    }
    Ok(tokio::spawn(async move {
        let mut seen = fingerprint(&paths);
        let mut checks = tokio::time::interval(FILE_CHECK_INTERVAL);
        checks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let why = tokio::select! {
                hangup = hangups.recv() => match hangup {
                    Some(()) => "SIGHUP",
                    None => return,
                },
                _ = checks.tick() => {
                    let now = fingerprint(&paths);
                    if now == seen {
                        continue;
                    }
                    "a file changed"
                }
            };
            seen = fingerprint(&paths);
            if let Some(tls) = &tls {
                match tls.reload() {
                    Ok(()) => {
                        metrics.tls_reloaded(true);
                        tracing::info!("{why}: TLS certificate, key and client CA reloaded");
                    }
                    Err(e) => {
                        metrics.tls_reloaded(false);
                        tracing::error!(
                            "{why}: TLS not reloaded, the previous certificate stays in use: {e}"
                        );
                    }
                }
            }
            if let Some(tokens) = &tokens {
                match tokens.reload() {
                    Ok(count) => tracing::info!(tokens = count, "{why}: inference tokens reloaded"),
                    Err(e) => tracing::error!(
                        "{why}: inference tokens not reloaded, the previous ones stay in use: {e}"
                    ),
                }
            }
        }
    }))
}

/// What tells a file's new contents from its old: its inode, size and modification time (`None`: unreadable).
type FileStamp = Option<(u64, u64, Option<std::time::SystemTime>)>;

fn fingerprint(paths: &[std::path::PathBuf]) -> Vec<FileStamp> {
    use std::os::unix::fs::MetadataExt;
    paths
        .iter()
        .map(|path| {
            std::fs::metadata(path)
                .ok()
                .map(|m| (m.ino(), m.len(), m.modified().ok()))
        })
        .collect()
}

/// Resolves on SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let interrupt = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for SIGINT: {e}");
            std::future::pending::<()>().await;
        }
    };
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        () = interrupt => {}
        () = terminate => {}
    }
}
