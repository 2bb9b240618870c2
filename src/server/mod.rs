//! Running the server: bind nothing (the caller passes the listeners, so tests use port 0), serve HTTP and gRPC
//! from one process at once so `/health/live` answers while models load on a thread of their own, and drain both
//! on the shutdown future. [`connections`] serves each connection, with its timeouts and the connection cap.

pub(crate) mod connections;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

use connections::{Connections, Listener};

use crate::api;
use crate::config::Config;
use crate::service::{Limits, Service, StartError};
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
        "HTTP (addr) and gRPC listening; loading models"
    );

    // Before loading starts, so gRPC health reports NOT_SERVING until the models are ready.
    let grpc_routes = api::kserve::grpc::routes(Arc::clone(&service)).await?;

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

    let connections = Arc::new(Connections::new(
        config.max_connections,
        config.timeouts,
        service.metrics.clone(),
    ));
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
        api::router::router(Arc::clone(&service)),
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
    // Dropping the last reference to the service closes every model's queue and joins its executor threads.
    drop(service);
    loaded
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
