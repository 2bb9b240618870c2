//! A recserve started in this process on port 0, for recload's integration tests (tests/recserve.rs, tests/tls.rs):
//! both listeners bound, the server run in a task until [`Server::stop`]. Whether it is ready is each test's to
//! find out, over the protocol it speaks.

use std::net::SocketAddr;
use std::path::PathBuf;

use recserve::server::Listeners;
use tokio::sync::oneshot;

/// The ONNX Runtime library the server loads (`ORT_DYLIB_PATH`, which scripts/env.sh sets).
pub fn ort_library() -> PathBuf {
    std::env::var_os("ORT_DYLIB_PATH")
        .map(PathBuf::from)
        .expect("ORT_DYLIB_PATH must point at libonnxruntime.so: run scripts/test.sh, or source scripts/env.sh")
}

pub struct Server {
    pub addr: SocketAddr,
    pub grpc_addr: SocketAddr,
    stop: oneshot::Sender<()>,
    handle: tokio::task::JoinHandle<Result<(), recserve::service::StartError>>,
}

impl Server {
    /// Binds both listeners on port 0 of 127.0.0.1 and serves `config` on them.
    pub async fn start(config: recserve::config::Config) -> Server {
        let bind = || async {
            tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind port 0")
        };
        let listeners = Listeners {
            http: bind().await,
            grpc: bind().await,
        };
        let addr = listeners.http.local_addr().expect("address");
        let grpc_addr = listeners.grpc.local_addr().expect("address");
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(recserve::server::run(config, listeners, async {
            let _ = stopped.await;
        }));
        Server {
            addr,
            grpc_addr,
            stop,
            handle,
        }
    }

    /// Whether the server still runs (it stops early when its start fails).
    pub fn is_running(&self) -> bool {
        !self.handle.is_finished()
    }

    /// Stops it and waits for a clean shutdown.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.handle
            .await
            .expect("server task")
            .expect("clean shutdown");
    }
}
