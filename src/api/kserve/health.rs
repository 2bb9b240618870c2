//! The standard gRPC health service, `grpc.health.v1.Health`, beside KServe's own inference service: SERVING once
//! the models are ready, NOT_SERVING while loading or draining, for the whole server (`""`) and for
//! `inference.GRPCInferenceService`.

use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, Stream, StreamExt};
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::{Health, HealthServer};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_health::server::{HealthReporter, HealthService};

use crate::service::{Readiness, Service};

/// The full name of the inference service, as health checks name it.
pub(crate) const INFERENCE_SERVICE: &str = "inference.GRPCInferenceService";

/// The health status that readiness maps to.
pub(crate) fn serving_status(readiness: Readiness) -> ServingStatus {
    match readiness {
        Readiness::Ready => ServingStatus::Serving,
        Readiness::Loading | Readiness::ShuttingDown => ServingStatus::NotServing,
    }
}

async fn report(reporter: &HealthReporter, readiness: Readiness) {
    let status = serving_status(readiness);
    // "" is the whole server, as the health checking protocol defines it.
    reporter.set_service_status("", status).await;
    reporter.set_service_status(INFERENCE_SERVICE, status).await;
}

/// How long a health `Watch` stream stays open once the server drains, so that its NOT_SERVING update reaches the
/// watcher before the stream ends.
const WATCH_GRACE: Duration = Duration::from_millis(100);

/// `grpc.health.v1.Health`: tonic's implementation, except that `Watch` streams end when the server starts
/// draining (after NOT_SERVING is sent). Otherwise an open `Watch` keeps its connection busy and holds graceful
/// shutdown until `--shutdown-timeout-s`.
struct DrainingHealth {
    inner: HealthService,
    service: Arc<Service>,
}

type HealthStream =
    std::pin::Pin<Box<dyn Stream<Item = Result<HealthCheckResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl Health for DrainingHealth {
    async fn check(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<HealthCheckResponse>, Status> {
        self.inner.check(request).await
    }

    type WatchStream = HealthStream;

    async fn watch(
        &self,
        request: Request<HealthCheckRequest>,
    ) -> Result<Response<Self::WatchStream>, Status> {
        let updates = self.inner.watch(request).await?.into_inner();
        let mut readiness = self.service.watch_readiness();
        let draining = async move {
            // An error means the service is gone: end the stream then too.
            let _ = readiness.wait_for(|r| *r == Readiness::ShuttingDown).await;
            tokio::time::sleep(WATCH_GRACE).await;
        };
        let stream: HealthStream = Box::pin(updates.take_until(draining.boxed()));
        Ok(Response::new(stream))
    }
}

/// The health service, NOT_SERVING until the models are ready; a task follows the service's readiness from then
/// on (it ends when the service is dropped).
pub(super) async fn server(service: Arc<Service>) -> HealthServer<impl Health> {
    let reporter = HealthReporter::new();
    let health = HealthServer::new(DrainingHealth {
        inner: HealthService::from_health_reporter(reporter.clone()),
        service: Arc::clone(&service),
    });
    let mut readiness = service.watch_readiness();
    let initial = *readiness.borrow_and_update();
    report(&reporter, initial).await;
    tokio::spawn(async move {
        while readiness.changed().await.is_ok() {
            let now = *readiness.borrow_and_update();
            report(&reporter, now).await;
        }
    });
    health
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_follows_readiness() {
        assert_eq!(
            serving_status(Readiness::Loading),
            ServingStatus::NotServing
        );
        assert_eq!(serving_status(Readiness::Ready), ServingStatus::Serving);
        assert_eq!(
            serving_status(Readiness::ShuttingDown),
            ServingStatus::NotServing
        );
    }
}
