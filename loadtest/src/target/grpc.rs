//! The KServe v2 gRPC target: `inference.GRPCInferenceService/ModelInfer` with the request's tensors in
//! `raw_input_contents` (the form tritonclient's gRPC client sends), one HTTP/2 connection (a tonic `Channel`) per
//! worker, so `--connections` is the number of sockets as over HTTP. A rank body becomes the DeepFM model's row
//! tensors ([`super::tensors::row_tensors`], the same construction as `--envelope kserve-v2-tensors`); the client
//! is the one the server crate generates from `proto/grpc_predict_v2.proto`. An answer counts as a success only
//! with the gRPC status OK and one FP32 score per candidate in its first raw output.

use std::error::Error as _;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use hyper::Uri;
use hyper_util::rt::TokioIo;
use recserve::api::kserve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use recserve::api::kserve::grpc::proto::model_infer_request::InferInputTensor;
use recserve::api::kserve::grpc::proto::{ModelInferRequest, ModelInferResponse};
use tonic::metadata::AsciiMetadataValue;
use tonic::transport::{Channel, Endpoint};

use super::http::{TargetError, resolve, secure};
use super::tensors::{TensorLayout, row_tensors};
use super::tls::{self, Access, Handshake};
use super::{Failure, Target, TargetInfo};
use crate::workload::Request;

/// A KServe v2 gRPC server, ranking with one DeepFM model.
#[derive(Debug)]
pub struct GrpcTarget {
    url: String,
    addr: SocketAddr,
    endpoint: Endpoint,
    model: String,
    layout: TensorLayout,
    /// `https://`: the TLS handshake (ALPN `h2`) made under the channel's HTTP/2.
    tls: Option<Handshake>,
    /// `Bearer <token>`, the `authorization` metadata of every call.
    authorization: Option<AsciiMetadataValue>,
}

/// A `ModelInfer` request ready to send, with the number of scores its answer must hold.
#[derive(Debug)]
pub struct GrpcRequest {
    message: ModelInferRequest,
    rows: usize,
}

/// One HTTP/2 connection.
#[derive(Debug)]
pub struct GrpcConn {
    client: GrpcInferenceServiceClient<Channel>,
}

impl GrpcTarget {
    /// Parses `url` (`http://host:port`, the server's gRPC port; no path) and resolves its host once.
    pub async fn new(
        url: &str,
        model: String,
        layout: TensorLayout,
    ) -> Result<GrpcTarget, TargetError> {
        GrpcTarget::with_access(url, model, layout, &Access::default()).await
    }

    /// [`GrpcTarget::new`] for `http://` or `https://` URLs, with `access`'s TLS client (which an `https://` URL
    /// needs) and token.
    pub async fn with_access(
        url: &str,
        model: String,
        layout: TensorLayout,
        access: &Access,
    ) -> Result<GrpcTarget, TargetError> {
        let (uri, addr) = resolve(url).await?;
        let tls = secure(url, &uri, access, b"h2")?;
        let authorization = access
            .authorization()
            .map_err(TargetError::Access)?
            .map(|value| {
                AsciiMetadataValue::try_from(value.as_bytes()).map_err(|_| {
                    TargetError::Access("the token cannot be gRPC metadata".to_owned())
                })
            })
            .transpose()?;
        let bad = |problem: &str| TargetError::Url {
            url: url.to_owned(),
            problem: problem.to_owned(),
        };
        if !matches!(uri.path(), "" | "/") {
            return Err(bad(
                "a gRPC target takes no path: give the server's gRPC address, http://host:port",
            ));
        }
        // The scheme stays http:// over TLS: the handshake is the connector's (`Tls`), below the channel.
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| bad(&format!("not a gRPC endpoint ({e})")))?
            .tcp_nodelay(true);
        Ok(GrpcTarget {
            url: url.trim_end_matches('/').to_owned(),
            addr,
            endpoint,
            model,
            layout,
            tls,
            authorization,
        })
    }
}

/// Opens a channel's connection over TLS: TCP, then the handshake.
#[derive(Clone, Debug)]
struct Tls {
    addr: SocketAddr,
    handshake: Handshake,
}

impl tonic::codegen::Service<Uri> for Tls {
    type Response = TokioIo<tls::Stream>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = std::io::Result<Self::Response>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            tls::open(this.addr, Some(&this.handshake))
                .await
                .map(TokioIo::new)
        })
    }
}

/// `error` and its sources, for a message (tonic's transport error alone says only "transport error").
fn with_sources(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// A failed call: a status the server sent, or (a status with a source error) the connection failing under it.
fn failure_of(status: tonic::Status) -> Failure {
    match status.source() {
        Some(cause) => {
            Failure::Connection(format!("{}: {}", status.message(), with_sources(cause)))
        }
        None => Failure::Grpc {
            code: status.code(),
            message: status.message().to_owned(),
        },
    }
}

/// The first output's raw bytes, if the answer holds one FP32 score per each of `rows` candidates.
fn scores_of(mut response: ModelInferResponse, rows: usize) -> Result<Bytes, String> {
    let output = response
        .outputs
        .first()
        .ok_or_else(|| "the answer has no output".to_owned())?;
    if output.datatype != "FP32" {
        return Err(format!(
            "output {:?} is {}, not FP32",
            output.name, output.datatype
        ));
    }
    // A score per row: [rows] or [rows, 1].
    let elements: i64 = output.shape.iter().product();
    if output.shape.first() != Some(&(rows as i64)) || elements != rows as i64 {
        return Err(format!(
            "output {:?} has shape {:?} for {rows} candidates",
            output.name, output.shape
        ));
    }
    if response.raw_output_contents.is_empty() {
        return Err(format!(
            "output {:?} is not in raw_output_contents",
            output.name
        ));
    }
    let raw = response.raw_output_contents.swap_remove(0);
    if raw.len() != rows * 4 {
        return Err(format!(
            "output {:?} holds {} bytes, not {} (FP32 × {rows})",
            output.name,
            raw.len(),
            rows * 4
        ));
    }
    Ok(raw)
}

impl Target for GrpcTarget {
    type Conn = GrpcConn;
    type Prepared = GrpcRequest;

    fn info(&self) -> TargetInfo {
        TargetInfo {
            url: self.url.clone(),
            protocol: "kserve-v2-grpc".to_owned(),
            v2_model: Some(self.model.clone()),
        }
    }

    fn prepare(&self, request: &Request) -> GrpcRequest {
        // The bodies come from recload's own rank workload, which writes every field the model.toml this layout was
        // read from declares: a body that does not convert is a bug, found before the run.
        let tensors = row_tensors(&self.layout, &request.body)
            .unwrap_or_else(|e| panic!("a rank body recload generated: {e}"));
        let rows = tensors.first().map_or(0, |t| t.shape[0]);
        let inputs = tensors
            .iter()
            .map(|t| InferInputTensor {
                name: t.name.clone(),
                datatype: t.datatype.to_owned(),
                shape: t.shape.iter().map(|&d| d as i64).collect(),
                ..Default::default()
            })
            .collect();
        GrpcRequest {
            message: ModelInferRequest {
                model_name: self.model.clone(),
                inputs,
                raw_input_contents: tensors.into_iter().map(|t| t.data).collect(),
                ..Default::default()
            },
            rows,
        }
    }

    async fn connect(&self) -> Result<GrpcConn, Failure> {
        let channel = match &self.tls {
            None => self.endpoint.connect().await,
            Some(handshake) => {
                self.endpoint
                    .connect_with_connector(Tls {
                        addr: self.addr,
                        handshake: handshake.clone(),
                    })
                    .await
            }
        };
        let channel = channel.map_err(|e| Failure::Connect {
            addr: self.addr.to_string(),
            reason: with_sources(&e),
        })?;
        Ok(GrpcConn {
            client: GrpcInferenceServiceClient::new(channel),
        })
    }

    fn is_open(&self, _conn: &GrpcConn) -> bool {
        // A channel does not say; a call on a closed one fails as `Failure::Connection`, which drops it.
        true
    }

    async fn send(&self, conn: &mut GrpcConn, request: &GrpcRequest) -> Result<Bytes, Failure> {
        let mut call = tonic::Request::new(request.message.clone());
        if let Some(authorization) = &self.authorization {
            call.metadata_mut()
                .insert("authorization", authorization.clone());
        }
        let response = conn
            .client
            .model_infer(call)
            .await
            .map_err(failure_of)?
            .into_inner();
        scores_of(response, request.rows).map_err(Failure::Answer)
    }

    /// The answer `send` returned: the scores as little-endian FP32.
    fn rank_scores(&self, answer: &[u8]) -> Result<Vec<f32>, String> {
        if !answer.len().is_multiple_of(4) {
            return Err(format!("{} bytes are not FP32 scores", answer.len()));
        }
        Ok(answer
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use recserve::api::kserve::grpc::proto::model_infer_response::InferOutputTensor;

    use super::*;
    use crate::stats::ErrorKind;
    use crate::target::http::kserve_v2_tensors;

    fn layout() -> TensorLayout {
        TensorLayout {
            fields: ["u1", "item", "i1"].map(String::from).to_vec(),
            user_fields: vec!["u1".to_owned()],
            item_id_field: Some("item".to_owned()),
            dense: 2,
        }
    }

    const BODY: &[u8] = br#"{"user":{"fields":{"u1":5},"dense":[1.5,-2]},
            "candidates":[{"id":10,"fields":{"i1":100}},{"id":11,"fields":{"i1":101}},{"id":12,"fields":{"i1":102}}]}"#;

    async fn target(url: &str) -> Result<GrpcTarget, TargetError> {
        GrpcTarget::new(url, "m".to_owned(), layout()).await
    }

    #[tokio::test]
    async fn a_rank_body_becomes_the_raw_tensors_the_http_target_sends_as_binary_data() {
        let t = target("http://127.0.0.1:9").await.expect("valid");
        let prepared = t.prepare(&Request {
            path: "/v1/models/m/rank".to_owned(),
            body: Bytes::from_static(BODY),
        });
        assert_eq!(prepared.rows, 3);
        let m = &prepared.message;
        assert_eq!(m.model_name, "m");
        let inputs: Vec<(&str, &str, &[i64])> = m
            .inputs
            .iter()
            .map(|i| (i.name.as_str(), i.datatype.as_str(), i.shape.as_slice()))
            .collect();
        assert_eq!(
            inputs,
            [
                ("categorical", "INT64", &[3, 3][..]),
                ("dense", "FP32", &[3, 2][..])
            ]
        );
        assert!(m.inputs.iter().all(|i| i.contents.is_none()));
        // Byte for byte the binary tensor data of --envelope kserve-v2-tensors.
        let (http, header_len) = kserve_v2_tensors(&layout(), BODY).expect("converted");
        assert_eq!(m.raw_input_contents.concat(), http[header_len..]);
        assert_eq!(m.raw_input_contents[0].len(), 3 * 3 * 8);
        assert_eq!(t.info().protocol, "kserve-v2-grpc");
        assert_eq!(t.info().v2_model.as_deref(), Some("m"));
    }

    fn answer(shape: Vec<i64>, datatype: &str, raw: Vec<Bytes>) -> ModelInferResponse {
        ModelInferResponse {
            outputs: vec![InferOutputTensor {
                name: "probability".to_owned(),
                datatype: datatype.to_owned(),
                shape,
                ..Default::default()
            }],
            raw_output_contents: raw,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn only_one_fp32_score_per_candidate_is_a_successful_answer() {
        let scores: Vec<u8> = [0.5f32, 0.25]
            .iter()
            .flat_map(|s| s.to_le_bytes())
            .collect();
        let scores = Bytes::from(scores);
        let got = scores_of(answer(vec![2, 1], "FP32", vec![scores.clone()]), 2).expect("scores");
        let t = target("http://127.0.0.1:9").await.expect("valid");
        assert_eq!(t.rank_scores(&got).expect("FP32"), [0.5, 0.25]);
        for (response, problem) in [
            (
                answer(vec![3, 1], "FP32", vec![scores.clone()]),
                "shape [3, 1] for 2 candidates",
            ),
            (
                answer(vec![2, 2], "FP32", vec![scores.clone()]),
                "shape [2, 2] for 2 candidates",
            ),
            (
                answer(vec![2, 1], "FP64", vec![scores.clone()]),
                "is FP64, not FP32",
            ),
            (
                answer(vec![2, 1], "FP32", vec![]),
                "not in raw_output_contents",
            ),
            (
                answer(vec![2, 1], "FP32", vec![scores.slice(..4)]),
                "holds 4 bytes, not 8",
            ),
            (ModelInferResponse::default(), "has no output"),
        ] {
            let err = scores_of(response, 2).expect_err(problem);
            assert!(err.contains(problem), "{err}");
            assert_eq!(Failure::Answer(err).kind(), ErrorKind::WrongAnswer);
        }
    }

    #[test]
    fn a_status_from_the_server_is_a_grpc_failure_and_one_from_the_transport_a_connection_failure()
    {
        let failure = failure_of(tonic::Status::not_found("model \"x\" is not served"));
        assert_eq!(failure.kind().label(), "grpc_not_found");
        assert!(!failure.breaks_connection());
        assert_eq!(
            failure.to_string(),
            "gRPC NotFound: model \"x\" is not served"
        );
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset by peer");
        let failure = failure_of(tonic::Status::from_error(Box::new(io)));
        assert_eq!(failure.kind(), ErrorKind::Connection);
        assert!(failure.breaks_connection());
        assert!(failure.to_string().contains("reset by peer"), "{failure}");
    }

    #[tokio::test]
    async fn a_url_with_a_path_is_refused_and_a_closed_port_named() {
        let err = target("http://127.0.0.1:9/v2").await.expect_err("a path");
        assert!(
            err.to_string()
                .starts_with("--url \"http://127.0.0.1:9/v2\": a gRPC target takes no path"),
            "{err}"
        );
        let err = target("https://127.0.0.1:9")
            .await
            .expect_err("TLS without a CA");
        assert!(err.to_string().contains("https:// needs --tls-ca"), "{err}");
        let err = target("ftp://127.0.0.1:9").await.expect_err("not HTTP");
        assert!(err.to_string().contains("not supported"), "{err}");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        drop(listener);
        let t = target(&format!("http://{addr}/")).await.expect("valid");
        let err = t.connect().await.expect_err("nothing listens");
        assert_eq!(err.kind(), ErrorKind::Connect);
        assert!(
            err.to_string()
                .starts_with(&format!("cannot connect to {addr}: ")),
            "{err}"
        );
    }
}
