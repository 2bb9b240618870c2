//! The HTTP/1.1 target: one hyper connection per worker (no hidden pool, so `--connections` is exactly the number
//! of sockets), `TCP_NODELAY`, bodies prepared before the run. The envelopes: the body as is (recserve's `/v1`
//! JSON, and any server that accepts it); the same JSON wrapped as one `BYTES` tensor of a KServe v2 inference
//! request with Triton's binary tensor data extension (the JSON bytes follow the request header unchanged), for a
//! Triton Python-backend model that parses the body itself; or the same ranking request rewritten into KServe v2
//! tensors as binary tensor data, the request without any JSON to decode but a short header: a DeepFM model's own
//! row tensors (`categorical` INT64, `dense` FP32, the user's ids repeated on every row), or the compact grouped
//! tensors of one user and its candidates (`user_categorical`, `user_dense`, `item_categorical`) that the Triton
//! peer reads.

use std::net::SocketAddr;

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{SendRequest, handshake};
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Uri};
use hyper_util::rt::TokioIo;
use serde::Deserialize;
use serde_json::json;

use super::tensors::{Tensor, TensorLayout, grouped_batched_tensors, row_tensors};
use super::tls::{self, Access, Handshake};
use super::{Failure, Target, TargetInfo};
use crate::workload::Request;

/// How a workload's JSON body travels.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Envelope {
    /// `POST <url><path>` with the JSON body.
    None,
    /// `POST <url>/v2/models/<model>/infer`: a KServe v2 request whose one input, `input`, is a `BYTES` tensor of
    /// shape `[1, 1]` holding the JSON body, sent as binary tensor data.
    KserveV2Bytes { model: String, input: String },
    /// `POST <url>/v2/models/<model>/infer`: a `/v1` rank body rewritten into the model's tensors, sent as binary
    /// tensor data (docs/api.md, "Tensor contract per model kind").
    KserveV2Tensors { model: String, layout: TensorLayout },
    /// `POST <url>/v2/models/<model>/infer`: a `/v1` rank body rewritten into the user's ids and dense values once
    /// and the candidates' item ids as a matrix ([`kserve_v2_grouped_batched`]), sent as binary tensor data.
    KserveV2GroupedBatched { model: String, layout: TensorLayout },
}

/// A target URL that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("--url {url:?}: {problem}")]
    Url { url: String, problem: String },
    /// A TLS file or the token file that cannot be used.
    #[error("{0}")]
    Access(String),
    #[error("--url {url:?}: cannot resolve {host}: {reason}")]
    Resolve {
        url: String,
        host: String,
        reason: String,
    },
}

/// An HTTP server.
#[derive(Debug)]
pub struct HttpTarget {
    url: String,
    addr: SocketAddr,
    host: HeaderValue,
    /// Path of the URL without its trailing '/', prepended to every request path.
    prefix: String,
    envelope: Envelope,
    /// `https://`: the connector (ALPN `http/1.1`) and the name the server's certificate must carry.
    tls: Option<Handshake>,
    /// `Bearer <token>`, sent with every request.
    authorization: Option<HeaderValue>,
}

/// A request ready to send.
#[derive(Debug)]
pub struct HttpRequest {
    path: Uri,
    body: Bytes,
    content_type: HeaderValue,
    /// `Inference-Header-Content-Length` of a KServe v2 binary request.
    header_length: Option<HeaderValue>,
}

impl HttpRequest {
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    /// The headers it is sent with, besides `host`.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let text = |v: &HeaderValue| v.to_str().unwrap_or_default().to_owned();
        let mut headers = vec![("content-type", text(&self.content_type))];
        if let Some(length) = &self.header_length {
            headers.push(("inference-header-content-length", text(length)));
        }
        headers
    }
}

/// One HTTP/1.1 connection.
#[derive(Debug)]
pub struct HttpConn {
    sender: SendRequest<Full<Bytes>>,
}

/// Longest part of an error answer quoted in messages.
const QUOTED_BYTES: usize = 300;

impl HttpTarget {
    /// Parses `url` (`http://host:port[/prefix]`) and resolves its host once.
    pub async fn new(url: &str, envelope: Envelope) -> Result<HttpTarget, TargetError> {
        HttpTarget::with_access(url, envelope, &Access::default()).await
    }

    /// [`HttpTarget::new`] for `http://` or `https://` URLs, with `access`'s TLS client (which an `https://` URL
    /// needs) and token.
    pub async fn with_access(
        url: &str,
        envelope: Envelope,
        access: &Access,
    ) -> Result<HttpTarget, TargetError> {
        let (uri, addr) = resolve(url).await?;
        let tls = secure(url, &uri, access, b"http/1.1")?;
        let authorization = access.authorization().map_err(TargetError::Access)?;
        let invalid_host = || TargetError::Url {
            url: url.to_owned(),
            problem: "invalid host".to_owned(),
        };
        // `resolve` refused a URL without a host.
        let authority = uri.authority().ok_or_else(invalid_host)?;
        let host = HeaderValue::from_str(authority.as_str()).map_err(|_| invalid_host())?;
        Ok(HttpTarget {
            url: url.trim_end_matches('/').to_owned(),
            addr,
            host,
            prefix: uri.path().trim_end_matches('/').to_owned(),
            envelope,
            tls,
            authorization,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The full URL `request` goes to.
    pub fn url_of(&self, request: &HttpRequest) -> String {
        format!(
            "{}://{}{}",
            if self.tls.is_some() { "https" } else { "http" },
            self.host.to_str().unwrap_or_default(),
            request.path
        )
    }

    /// `GET <url><path>` on a connection of its own: the status and the body.
    pub async fn get(&self, path: &str) -> Result<(u16, Bytes), Failure> {
        let mut conn = self.connect().await?;
        let mut builder = hyper::Request::builder()
            .method(Method::GET)
            .uri(format!("{}{path}", self.prefix))
            .header(HOST, self.host.clone());
        if let Some(authorization) = &self.authorization {
            builder = builder.header(AUTHORIZATION, authorization.clone());
        }
        let request = builder
            .body(Full::new(Bytes::new()))
            .map_err(|e| Failure::Connection(format!("cannot build GET {path}: {e}")))?;
        let (status, body) = exchange(&mut conn, request).await?;
        Ok((status, body))
    }
}

/// The TLS connector (offering `alpn`) and server name an `https://` `uri` needs, `None` for `http://`; `access`
/// must have a TLS client exactly when the URL is `https://`.
pub(super) fn secure(
    url: &str,
    uri: &Uri,
    access: &Access,
    alpn: &[u8],
) -> Result<Option<Handshake>, TargetError> {
    let bad = |problem: String| TargetError::Url {
        url: url.to_owned(),
        problem,
    };
    match (uri.scheme_str() == Some("https"), &access.tls) {
        (false, None) => Ok(None),
        (false, Some(_)) => Err(bad(
            "--tls-ca is given, but the URL is http://: use https:// to speak TLS".to_owned(),
        )),
        (true, None) => Err(bad(
            "https:// needs --tls-ca FILE, the CA certificate (PEM) that signed the server's certificate"
                .to_owned(),
        )),
        (true, Some(client)) => {
            // `resolve` refused a URL without a host.
            let host = uri
                .host()
                .unwrap_or_default()
                .trim_start_matches('[')
                .trim_end_matches(']');
            client.handshake(host, alpn).map(Some).map_err(bad)
        }
    }
}

/// Parses `url` (`http://` or `https://host:port[/path]`, no query) and resolves its host once: the URI and the
/// address.
pub(super) async fn resolve(url: &str) -> Result<(Uri, SocketAddr), TargetError> {
    let bad = |problem: &str| TargetError::Url {
        url: url.to_owned(),
        problem: problem.to_owned(),
    };
    let uri: Uri = url.parse().map_err(|e| bad(&format!("not a URL ({e})")))?;
    let default_port = match uri.scheme_str() {
        Some("http") => 80,
        Some("https") => 443,
        Some(other) => {
            return Err(bad(&format!(
                "scheme {other:?} is not supported; use http:// or https://"
            )));
        }
        None => return Err(bad("needs a scheme: http://host:port or https://host:port")),
    };
    if uri.query().is_some() {
        return Err(bad("must not have a query string"));
    }
    let authority = uri.authority().ok_or_else(|| bad("needs a host"))?;
    let host = authority
        .host()
        .trim_start_matches('[')
        .trim_end_matches(']');
    let port = authority.port_u16().unwrap_or(default_port);
    let addr = tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| TargetError::Resolve {
            url: url.to_owned(),
            host: host.to_owned(),
            reason: e.to_string(),
        })?
        .next()
        .ok_or_else(|| TargetError::Resolve {
            url: url.to_owned(),
            host: host.to_owned(),
            reason: "no address".to_owned(),
        })?;
    Ok((uri, addr))
}

async fn exchange(
    conn: &mut HttpConn,
    request: hyper::Request<Full<Bytes>>,
) -> Result<(u16, Bytes), Failure> {
    conn.sender
        .ready()
        .await
        .map_err(|e| Failure::Connection(e.to_string()))?;
    let response = conn
        .sender
        .send_request(request)
        .await
        .map_err(|e| Failure::Connection(e.to_string()))?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| Failure::Connection(format!("reading the answer: {e}")))?
        .to_bytes();
    Ok((status, body))
}

/// The start of an answer, as text, for a message.
pub fn quote(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(QUOTED_BYTES)]);
    let text = text.trim();
    if body.len() > QUOTED_BYTES {
        format!("{text}…")
    } else {
        text.to_owned()
    }
}

/// A KServe v2 inference request of `inputs` with the binary tensor data extension: a JSON header naming each input
/// with its `binary_data_size`, then the inputs' bytes in order. Returns the body and the length of its header.
fn binary_request(inputs: Vec<Tensor>) -> (Bytes, usize) {
    let header = json!({
        "inputs": inputs.iter().map(|i| json!({
            "name": i.name,
            "shape": i.shape,
            "datatype": i.datatype,
            "parameters": {"binary_data_size": i.data.len()},
        })).collect::<Vec<_>>()
    })
    .to_string();
    let mut body =
        BytesMut::with_capacity(header.len() + inputs.iter().map(|i| i.data.len()).sum::<usize>());
    body.put_slice(header.as_bytes());
    for input in &inputs {
        body.put_slice(&input.data);
    }
    (body.freeze(), header.len())
}

/// A KServe v2 inference request carrying `payload` as the one element of a `BYTES` input: the JSON header, then
/// the element as binary data (a 4-byte little-endian length, then the bytes). Returns the body and the length of
/// its JSON header.
pub fn kserve_v2_bytes(input: &str, payload: &[u8]) -> (Bytes, usize) {
    let element_len = u32::try_from(payload.len()).expect("request bodies are far below 4 GiB");
    let mut data = BytesMut::with_capacity(4 + payload.len());
    data.put_u32_le(element_len);
    data.put_slice(payload);
    binary_request(vec![Tensor {
        name: input.to_owned(),
        datatype: "BYTES",
        shape: vec![1, 1],
        data: data.freeze(),
    }])
}

/// `body`, a `/v1` rank request in either form, as a KServe v2 inference request of `layout`'s row tensors
/// ([`row_tensors`]) in binary tensor data: the body and the length of its JSON header.
pub fn kserve_v2_tensors(layout: &TensorLayout, body: &[u8]) -> Result<(Bytes, usize), String> {
    Ok(binary_request(row_tensors(layout, body)?))
}

/// `body`, a `/v1` rank request in either form, as the compact KServe v2 request of one user and its candidates
/// ([`grouped_batched_tensors`]) in binary tensor data: the body and the length of its JSON header.
pub fn kserve_v2_grouped_batched(
    layout: &TensorLayout,
    body: &[u8],
) -> Result<(Bytes, usize), String> {
    Ok(binary_request(grouped_batched_tensors(layout, body)?))
}

impl Target for HttpTarget {
    type Conn = HttpConn;
    type Prepared = HttpRequest;

    fn info(&self) -> TargetInfo {
        match &self.envelope {
            Envelope::None => TargetInfo {
                url: self.url.clone(),
                protocol: "http-json".to_owned(),
                v2_model: None,
            },
            Envelope::KserveV2Bytes { model, .. } => TargetInfo {
                url: self.url.clone(),
                protocol: "kserve-v2-bytes".to_owned(),
                v2_model: Some(model.clone()),
            },
            Envelope::KserveV2Tensors { model, .. } => TargetInfo {
                url: self.url.clone(),
                protocol: "kserve-v2-tensors".to_owned(),
                v2_model: Some(model.clone()),
            },
            Envelope::KserveV2GroupedBatched { model, .. } => TargetInfo {
                url: self.url.clone(),
                protocol: "kserve-v2-grouped-batched".to_owned(),
                v2_model: Some(model.clone()),
            },
        }
    }

    fn prepare(&self, request: &Request) -> HttpRequest {
        let json = HeaderValue::from_static("application/json");
        let (path, body, content_type, header_length) = match &self.envelope {
            Envelope::None => (
                format!("{}{}", self.prefix, request.path),
                request.body.clone(),
                json,
                None,
            ),
            Envelope::KserveV2Bytes { model, input } => {
                let (body, header) = kserve_v2_bytes(input, &request.body);
                (
                    format!("{}/v2/models/{model}/infer", self.prefix),
                    body,
                    HeaderValue::from_static("application/octet-stream"),
                    Some(HeaderValue::from(header)),
                )
            }
            Envelope::KserveV2Tensors { model, layout }
            | Envelope::KserveV2GroupedBatched { model, layout } => {
                let rewrite = match &self.envelope {
                    Envelope::KserveV2Tensors { .. } => kserve_v2_tensors,
                    _ => kserve_v2_grouped_batched,
                };
                // The bodies come from recload's own rank workload, which writes every field the model.toml
                // this layout was read from declares: a body that does not convert is a bug, found before the run.
                let (body, header) = rewrite(layout, &request.body)
                    .unwrap_or_else(|e| panic!("a rank body recload generated: {e}"));
                (
                    format!("{}/v2/models/{model}/infer", self.prefix),
                    body,
                    HeaderValue::from_static("application/octet-stream"),
                    Some(HeaderValue::from(header)),
                )
            }
        };
        HttpRequest {
            // Paths come from model names, which are `[A-Za-z0-9_-]`; anything else is a bug worth a panic here,
            // before the run, rather than a run of failed requests.
            path: path.parse().expect("request paths are valid URI paths"),
            body,
            content_type,
            header_length,
        }
    }

    async fn connect(&self) -> Result<HttpConn, Failure> {
        let stream =
            tls::open(self.addr, self.tls.as_ref())
                .await
                .map_err(|e| Failure::Connect {
                    addr: self.addr.to_string(),
                    reason: e.to_string(),
                })?;
        let (sender, connection) =
            handshake(TokioIo::new(stream))
                .await
                .map_err(|e| Failure::Connect {
                    addr: self.addr.to_string(),
                    reason: e.to_string(),
                })?;
        // Drives the connection; ends when the sender is dropped or the server closes it.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(HttpConn { sender })
    }

    fn is_open(&self, conn: &HttpConn) -> bool {
        !conn.sender.is_closed()
    }

    async fn send(&self, conn: &mut HttpConn, request: &HttpRequest) -> Result<Bytes, Failure> {
        let mut builder = hyper::Request::builder()
            .method(Method::POST)
            .uri(request.path.clone())
            .header(HOST, self.host.clone())
            .header(CONTENT_TYPE, request.content_type.clone());
        if let Some(authorization) = &self.authorization {
            builder = builder.header(AUTHORIZATION, authorization.clone());
        }
        if let Some(length) = &request.header_length {
            builder = builder.header("inference-header-content-length", length.clone());
        }
        let http_request = builder
            .body(Full::new(request.body.clone()))
            .map_err(|e| Failure::Connection(format!("cannot build the request: {e}")))?;
        let (status, body) = exchange(conn, http_request).await?;
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(Failure::Status {
                status,
                body: quote(&body),
            })
        }
    }

    fn rank_scores(&self, answer: &[u8]) -> Result<Vec<f32>, String> {
        match &self.envelope {
            Envelope::None => v1_scores(answer),
            Envelope::KserveV2Bytes { .. }
            | Envelope::KserveV2Tensors { .. }
            | Envelope::KserveV2GroupedBatched { .. } => v2_scores(answer),
        }
    }
}

/// Scores of a `/v1` rank answer, in candidate order. Every candidate must be present (no `top_k`).
pub fn v1_scores(answer: &[u8]) -> Result<Vec<f32>, String> {
    let response: recserve::api::v1::rank::RankResponse = serde_json::from_slice(answer)
        .map_err(|e| format!("not a /v1 rank answer ({e}): {}", quote(answer)))?;
    let mut scores = vec![f32::NAN; response.scores.len()];
    for s in &response.scores {
        let slot = scores
            .get_mut(s.index)
            .ok_or_else(|| format!("candidate index {} is out of range: the answer holds only {} scores (was top_k set?)", s.index, response.scores.len()))?;
        *slot = s.score;
    }
    Ok(scores)
}

#[derive(Deserialize)]
struct V2Response {
    outputs: Vec<V2Output>,
}

#[derive(Deserialize)]
struct V2Output {
    data: Vec<f32>,
}

/// Scores of a KServe v2 answer: the data of its first output (JSON, not binary).
pub fn v2_scores(answer: &[u8]) -> Result<Vec<f32>, String> {
    let response: V2Response = serde_json::from_slice(answer).map_err(|e| {
        format!(
            "not a KServe v2 answer with JSON output data ({e}): {}",
            quote(answer)
        )
    })?;
    response
        .outputs
        .into_iter()
        .next()
        .map(|o| o.data)
        .ok_or_else(|| "the KServe v2 answer has no output".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kserve_v2_binary_request_carries_the_json_bytes_unchanged() {
        let payload = br#"{"user":{"fields":{}},"candidates":[{"id":1}]}"#;
        let (body, header_len) = kserve_v2_bytes("REQUEST", payload);
        let header: serde_json::Value =
            serde_json::from_slice(&body[..header_len]).expect("the header is JSON");
        assert_eq!(header["inputs"][0]["name"], "REQUEST");
        assert_eq!(header["inputs"][0]["datatype"], "BYTES");
        assert_eq!(header["inputs"][0]["shape"], json!([1, 1]));
        assert_eq!(
            header["inputs"][0]["parameters"]["binary_data_size"],
            payload.len() + 4
        );
        let len = u32::from_le_bytes(
            body[header_len..header_len + 4]
                .try_into()
                .expect("4 bytes"),
        );
        assert_eq!(len as usize, payload.len());
        assert_eq!(&body[header_len + 4..], payload);
    }

    /// Field order interleaves the sides, as model.toml may; the id field is in the middle.
    fn layout() -> TensorLayout {
        TensorLayout {
            fields: ["u1", "item", "i1", "u2"].map(String::from).to_vec(),
            user_fields: ["u1", "u2"].map(String::from).to_vec(),
            item_id_field: Some("item".to_owned()),
            dense: 2,
        }
    }

    /// The ids of an INT64 tensor, the values of an FP32 one.
    fn int64s_of(data: &[u8]) -> Vec<i64> {
        data.chunks(8)
            .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect()
    }

    fn fp32s_of(data: &[u8]) -> Vec<f32> {
        data.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect()
    }

    const ROWS_BODY: &[u8] = br#"{"user":{"fields":{"u1":5,"u2":6},"dense":[1.5,-2]},
            "candidates":[{"id":10,"fields":{"i1":100}},{"id":11,"fields":{"i1":101}}]}"#;
    const COLUMNAR_BODY: &[u8] = br#"{"user":{"fields":{"u1":5,"u2":6},"dense":[1.5,-2]},
            "candidates":{"fields":["i1"],"ids":[[100],[101]],"id":[10,11]}}"#;

    #[test]
    fn a_rank_body_becomes_the_compact_grouped_tensors_with_a_leading_request_dimension() {
        for body in [ROWS_BODY, COLUMNAR_BODY] {
            let (bytes, header_len) =
                kserve_v2_grouped_batched(&layout(), body).expect("converted");
            let header: serde_json::Value =
                serde_json::from_slice(&bytes[..header_len]).expect("the header is JSON");
            let inputs = header["inputs"].as_array().expect("inputs");
            let names: Vec<&str> = inputs
                .iter()
                .map(|i| i["name"].as_str().expect("name"))
                .collect();
            assert_eq!(
                names,
                ["user_categorical", "user_dense", "item_categorical"]
            );
            assert_eq!(inputs[0]["shape"], json!([1, 2]));
            assert_eq!(inputs[0]["datatype"], "INT64");
            assert_eq!(inputs[1]["shape"], json!([1, 2]));
            assert_eq!(inputs[1]["datatype"], "FP32");
            // Item fields in the model's order: the id field, then i1.
            assert_eq!(inputs[2]["shape"], json!([1, 2, 2]));
            let sizes: Vec<u64> = inputs
                .iter()
                .map(|i| i["parameters"]["binary_data_size"].as_u64().expect("size"))
                .collect();
            assert_eq!(sizes, [16, 8, 32]);
            let data = &bytes[header_len..];
            assert_eq!(data.len(), 16 + 8 + 32);
            assert_eq!(int64s_of(&data[..16]), [5, 6]);
            assert_eq!(fp32s_of(&data[16..24]), [1.5, -2.0]);
            assert_eq!(int64s_of(&data[24..]), [10, 100, 11, 101]);
        }
        // No dense features: no user_dense input.
        let no_dense = TensorLayout {
            dense: 0,
            ..layout()
        };
        let (bytes, header_len) = kserve_v2_grouped_batched(
            &no_dense,
            br#"{"user":{"fields":{"u1":5,"u2":6}},"candidates":[{"id":1,"fields":{"i1":2}}]}"#,
        )
        .expect("converted");
        let header: serde_json::Value = serde_json::from_slice(&bytes[..header_len]).expect("JSON");
        assert_eq!(header["inputs"].as_array().map(Vec::len), Some(2));
        for (bad, problem) in [
            (&br#"{"user":{"fields":{"u1":5},"dense":[1,2]},"candidates":[{"id":1,"fields":{"i1":2}}]}"#[..], "user.fields has no integer id for field \"u2\""),
            (br#"{"user":{"fields":{"u1":5,"u2":6},"dense":[1,2]},"candidates":[{"fields":{"i1":2}}]}"#, "candidates[0] has no integer id for field \"item\""),
            (br#"{"user":{"fields":{"u1":5,"u2":6}},"candidates":[{"id":1,"fields":{"i1":2}}]}"#, "no user.dense"),
        ] {
            let err = kserve_v2_grouped_batched(&layout(), bad).expect_err("refused");
            assert!(err.contains(problem), "{err}");
        }
    }

    #[test]
    fn a_rank_body_becomes_the_model_s_tensors_row_by_row_in_field_order() {
        let layout = layout();
        let (bytes, header_len) = kserve_v2_tensors(&layout, ROWS_BODY).expect("converted");
        // The columnar form of the same request gives the same bytes.
        assert_eq!(
            kserve_v2_tensors(&layout, COLUMNAR_BODY).expect("converted"),
            (bytes.clone(), header_len)
        );
        let header: serde_json::Value =
            serde_json::from_slice(&bytes[..header_len]).expect("the header is JSON");
        assert_eq!(header["inputs"][0]["name"], "categorical");
        assert_eq!(header["inputs"][0]["datatype"], "INT64");
        assert_eq!(header["inputs"][0]["shape"], json!([2, 4]));
        assert_eq!(header["inputs"][0]["parameters"]["binary_data_size"], 64);
        assert_eq!(header["inputs"][1]["name"], "dense");
        assert_eq!(header["inputs"][1]["shape"], json!([2, 2]));
        assert_eq!(header["inputs"][1]["parameters"]["binary_data_size"], 16);
        let data = &bytes[header_len..];
        assert_eq!(data.len(), 64 + 16);
        assert_eq!(int64s_of(&data[..64]), [5, 10, 100, 6, 5, 11, 101, 6]);
        assert_eq!(fp32s_of(&data[64..]), [1.5, -2.0, 1.5, -2.0]);

        let no_dense = TensorLayout {
            dense: 0,
            ..layout.clone()
        };
        let (bytes, header_len) = kserve_v2_tensors(
            &no_dense,
            br#"{"user":{"fields":{"u1":5,"u2":6}},"candidates":[{"id":1,"fields":{"i1":2}}]}"#,
        )
        .expect("converted");
        let header: serde_json::Value = serde_json::from_slice(&bytes[..header_len]).expect("JSON");
        assert_eq!(header["inputs"].as_array().map(Vec::len), Some(1));
        for (bad, problem) in [
            (&br#"{"user":{"fields":{"u1":5},"dense":[1,2]},"candidates":[{"id":1,"fields":{"i1":2}}]}"#[..], "field \"u2\""),
            (br#"{"user":{"fields":{"u1":5,"u2":6},"dense":[1]},"candidates":[]}"#, "holds 1 values"),
            (br#"{"user":{"fields":{}}}"#, "no candidates"),
            (b"[", "not a /v1 rank body"),
        ] {
            let err = kserve_v2_tensors(&layout, bad).expect_err("refused");
            assert!(err.contains(problem), "{err}");
        }
    }

    #[test]
    fn scores_are_read_from_both_answer_shapes_in_candidate_order() {
        let v1 = br#"{"model":"m","version":1,"scores":[{"index":1,"id":7,"score":0.25},{"index":0,"score":0.5}]}"#;
        assert_eq!(v1_scores(v1).expect("v1"), vec![0.5, 0.25]);
        let cut = br#"{"model":"m","version":1,"scores":[{"index":3,"score":0.5}]}"#;
        assert!(v1_scores(cut).expect_err("top_k").contains("top_k"));
        let v2 = br#"{"model_name":"m","model_version":"1","outputs":[{"name":"SCORES","datatype":"FP32","shape":[1,2],"data":[0.5,0.25]}]}"#;
        assert_eq!(v2_scores(v2).expect("v2"), vec![0.5, 0.25]);
        assert!(v2_scores(b"{\"error\":\"x\"}").is_err());
    }

    #[tokio::test]
    async fn a_run_against_a_closed_port_fails_before_measuring_and_names_the_address() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("address");
        drop(listener);
        let target = std::sync::Arc::new(
            HttpTarget::new(&format!("http://{addr}"), Envelope::None)
                .await
                .expect("valid"),
        );
        let prepared: std::sync::Arc<[HttpRequest]> = vec![target.prepare(&Request {
            path: "/v1/models/m/rank".to_owned(),
            body: Bytes::from_static(b"{}"),
        })]
        .into();
        let options = crate::engine::RunOptions {
            mode: crate::engine::Mode::Closed { concurrency: 2 },
            warmup: std::time::Duration::ZERO,
            duration: std::time::Duration::from_secs(1),
            timeout: std::time::Duration::from_secs(1),
            seed: 1,
            precise_pacing: false,
            progress: false,
            settle: None,
            log_requests: false,
            on_answer: None,
        };
        let err = crate::engine::run(target, prepared, &options)
            .await
            .expect_err("nothing listens");
        assert!(
            err.to_string()
                .starts_with(&format!("cannot connect to {addr}: ")),
            "{err}"
        );
    }

    #[tokio::test]
    async fn urls_are_checked_before_anything_is_sent() {
        for (url, problem) in [
            ("ftp://localhost:1", "not supported"),
            ("https://localhost:1", "needs --tls-ca"),
            ("localhost:8000", "scheme"),
            ("http://localhost:1/?a=b", "query"),
            ("not a url", "not a URL"),
        ] {
            let err = HttpTarget::new(url, Envelope::None)
                .await
                .expect_err(url)
                .to_string();
            assert!(err.contains(problem), "{url}: {err}");
        }
        let t = HttpTarget::new("http://127.0.0.1:9/prefix/", Envelope::None)
            .await
            .expect("valid");
        assert_eq!(t.prefix, "/prefix");
        let prepared = t.prepare(&Request {
            path: "/v1/models/m/rank".to_owned(),
            body: Bytes::from_static(b"{}"),
        });
        assert_eq!(prepared.path, "/prefix/v1/models/m/rank");
        let v2 = HttpTarget::new(
            "http://127.0.0.1:9",
            Envelope::KserveV2Bytes {
                model: "deepfm".to_owned(),
                input: "REQUEST".to_owned(),
            },
        )
        .await
        .expect("valid");
        let prepared = v2.prepare(&Request {
            path: "/v1/models/m/rank".to_owned(),
            body: Bytes::from_static(b"{}"),
        });
        assert_eq!(prepared.path, "/v2/models/deepfm/infer");
        assert_eq!(v2.info().protocol, "kserve-v2-bytes");
    }
}
