//! Transports. Each decodes its protocol into the typed inputs of [`crate::service::Service`] and encodes the
//! results; no logic is written twice per protocol.

pub mod http;
pub mod v1;
