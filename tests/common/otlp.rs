//! A real OTLP/gRPC receiver: the official `TraceService` from opentelemetry-proto, keeping every span it is sent
//! with its resource's service name. The tracing tests (tests/tracing.rs) start it on port 0 in their process;
//! `examples/otlp_receiver.rs` serves it as a process of its own for the benchmark of tracing's cost
//! (scripts/bench-features.sh).

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;

/// The spans received, with their resource's service name.
#[derive(Clone, Debug, Default)]
pub struct Collector(Arc<Mutex<Vec<(String, Span)>>>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.0.lock().expect("lock");
        for resource in request.into_inner().resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|kv| kv.key == "service.name")
                .and_then(|kv| kv.value.as_ref()?.value.clone())
                .map(|v| match v {
                    Any::StringValue(s) => s,
                    other => format!("{other:?}"),
                })
                .unwrap_or_default();
            for scope in resource.scope_spans {
                spans.extend(scope.spans.into_iter().map(|s| (service.clone(), s)));
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

impl Collector {
    /// Starts the receiver on port 0: its `http://` URL.
    pub async fn start(&self) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind port 0");
        self.serve(listener)
    }

    /// Serves on `listener` in a task of its own: its `http://` URL.
    pub fn serve(&self, listener: tokio::net::TcpListener) -> String {
        let addr = listener.local_addr().expect("addr");
        let router =
            tonic::service::Routes::new(TraceServiceServer::new(self.clone())).into_axum_router();
        tokio::spawn(async move { axum::serve(listener, router).await });
        format!("http://{addr}")
    }

    pub fn spans(&self) -> Vec<(String, Span)> {
        self.0.lock().expect("lock").clone()
    }
}
