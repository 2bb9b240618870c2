//! Running the server: bind nothing (the caller passes the listener, so tests use port 0), serve HTTP at once so
//! `/health/live` answers while models load on a thread of their own, and drain on the shutdown future.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::api;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::service::{Limits, Service, StartError};

/// Serves until `shutdown` resolves (then stops accepting, finishes the requests in flight within
/// `--shutdown-timeout-s`, and returns `Ok`), or until loading the models fails (then returns the error).
pub async fn run(
    config: Config,
    listener: TcpListener,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), StartError> {
    let service = Arc::new(Service::new(
        Metrics::new(),
        Limits {
            max_body_bytes: config.max_body_bytes,
            max_candidates: config.max_candidates,
        },
    ));
    tracing::info!(addr = %listener.local_addr()?, "HTTP listening; loading models");

    let (failed_tx, failed_rx) = oneshot::channel::<()>();
    let loader = {
        let service = Arc::clone(&service);
        let config = config.clone();
        std::thread::Builder::new()
            .name("model-loader".to_owned())
            .spawn(move || {
                let result = service.load(&config);
                match &result {
                    Ok(()) => tracing::info!("all models loaded; ready"),
                    Err(_) => {
                        let _ = failed_tx.send(());
                    }
                }
                result
            })?
    };

    let (draining_tx, draining_rx) = oneshot::channel::<()>();
    let stop = {
        let service = Arc::clone(&service);
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
            let _ = draining_tx.send(());
        }
    };
    let serve = axum::serve(listener, api::http::router(Arc::clone(&service)))
        .with_graceful_shutdown(stop)
        .into_future();
    let timeout = Duration::from_secs(config.shutdown_timeout_s);
    tokio::select! {
        result = serve => result?,
        () = async {
            if draining_rx.await.is_ok() {
                tokio::time::sleep(timeout).await;
            } else {
                std::future::pending::<()>().await;
            }
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
