//! Transports, laid out by protocol: recserve's own JSON API ([`v1`]) and the KServe v2 / Open Inference Protocol
//! over HTTP and gRPC ([`kserve`]), mounted on one HTTP router ([`router`]) and one gRPC server. Each decodes its
//! protocol into the typed inputs of the service's envelope ([`crate::service::Service::model_call`]) and encodes
//! the results; no logic is written twice per protocol. [`envelope`] is what the HTTP routes share.

pub(crate) mod auth;
pub(crate) mod envelope;
pub mod guard;
pub mod kserve;
pub(crate) mod router;
pub mod timed_body;
pub mod v1;
