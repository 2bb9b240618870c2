//! Raw clients for what well-behaved clients never send: HTTP/1 bytes on a socket (malformed, slow or cut
//! short), and gRPC calls whose framing or headers are broken, over a bare HTTP/2 connection.

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One HTTP/1 response as read off the socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawResponse {
    pub status: u16,
    /// Names in lower case.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    /// The `error` of a JSON error body.
    pub fn error(&self) -> String {
        let value: serde_json::Value = serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "{} with a body that is not JSON ({e}): {:?}",
                self.status,
                String::from_utf8_lossy(&self.body)
            )
        });
        value["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error in {value}"))
            .to_owned()
    }
}

/// Reads one response (head, then `Content-Length` bytes of body; none for a 1xx) from `stream`, or `None` if the
/// connection closes first.
pub async fn read_response(stream: &mut TcpStream) -> Option<RawResponse> {
    read(stream, true).await
}

/// [`read_response`], of the response to `HEAD` when `body` is false.
async fn read(stream: &mut TcpStream, body: bool) -> Option<RawResponse> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let mut chunk = [0u8; 8192];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {head:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let has_body = body;
    let mut body = buf[head_end..].to_vec();
    if status >= 200 && has_body {
        while body.len() < length {
            let mut chunk = [0u8; 8192];
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => body.extend_from_slice(&chunk[..n]),
            }
        }
        body.truncate(length);
    } else {
        body.clear();
    }
    Some(RawResponse {
        status,
        headers,
        body,
    })
}

/// Sends `request` on a new connection and reads the response (`None`: the connection closed first).
pub async fn exchange(addr: SocketAddr, request: &[u8]) -> Option<RawResponse> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let body = !request.starts_with(b"HEAD ");
    tokio::time::timeout(Duration::from_secs(30), read(&mut stream, body))
        .await
        .expect("an answer or a close within 30 s")
}

/// A request with these header lines and body; `Content-Length` is added for a non-empty body.
pub fn request(method: &str, path: &str, headers: &[&str], body: &[u8]) -> Vec<u8> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: test\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    if !body.is_empty() {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    head.push_str("\r\n");
    let mut bytes = head.into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

/// Waits until the server closes `stream` (reading and discarding what it sends); panics after `limit`.
pub async fn wait_closed(stream: &mut TcpStream, limit: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let read_all = async {
        let mut chunk = [0u8; 8192];
        loop {
            match stream.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(limit, read_all)
        .await
        .unwrap_or_else(|_| panic!("the server kept the connection open for {limit:?}"));
    got
}

/// A gRPC message: the 5-byte prefix (compressed flag, big-endian length) and `payload`.
pub fn grpc_frame(compressed: bool, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut frame = vec![u8::from(compressed)];
    frame.extend_from_slice(&length.to_be_bytes());
    frame.extend_from_slice(payload);
    frame
}

/// What a gRPC call was answered: the HTTP status, and the gRPC status from the headers or the trailers.
#[derive(Debug)]
pub struct GrpcAnswer {
    pub http_status: u16,
    pub status: tonic::Status,
}

/// A gRPC call whose request stream stays open: send on `body`, and drop it to end the stream.
pub struct OpenCall {
    pub body: tokio::sync::mpsc::Sender<Bytes>,
    pub answer: tokio::task::JoinHandle<GrpcAnswer>,
    /// Resolves when the HTTP/2 connection ends; the client keeps it open while `sender` lives.
    pub connection: tokio::task::JoinHandle<()>,
    pub sender: hyper::client::conn::http2::SendRequest<CallBody>,
}

/// The request body of an [`OpenCall`].
pub type CallBody = http_body_util::combinators::BoxBody<Bytes, std::convert::Infallible>;

/// Starts a call to `path` on a new HTTP/2 connection: its headers are sent, its messages are up to the caller.
pub async fn grpc_open(addr: SocketAddr, path: &str) -> OpenCall {
    use futures_util::StreamExt;
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("HTTP/2 handshake");
    let connection = tokio::spawn(async move {
        let _ = conn.await;
    });
    let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let frames =
        tokio_stream_of(rx).map(|b| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(b)));
    let request = axum::http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(BodyExt::boxed(http_body_util::StreamBody::new(frames)))
        .expect("request");
    let mut call = sender.clone();
    let answer = tokio::spawn(async move {
        let response = call.send_request(request).await.expect("a response");
        answer_of(response).await
    });
    OpenCall {
        body: tx,
        answer,
        connection,
        sender,
    }
}

fn tokio_stream_of(
    mut rx: tokio::sync::mpsc::Receiver<Bytes>,
) -> impl futures_util::Stream<Item = Bytes> + Send + 'static {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}

async fn answer_of(response: hyper::Response<hyper::body::Incoming>) -> GrpcAnswer {
    let http_status = response.status().as_u16();
    let (parts, body) = response.into_parts();
    let trailers = body.collect().await.expect("body").trailers().cloned();
    let status = tonic::Status::from_header_map(&parts.headers)
        .or_else(|| trailers.as_ref().and_then(tonic::Status::from_header_map))
        .expect("a gRPC status in the headers or the trailers");
    GrpcAnswer {
        http_status,
        status,
    }
}

/// Calls `path` with `body` as the whole request stream, on a new HTTP/2 connection.
pub async fn grpc_call(
    addr: SocketAddr,
    path: &str,
    content_type: &str,
    body: Vec<u8>,
) -> GrpcAnswer {
    let stream = TcpStream::connect(addr).await.expect("connect");
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .expect("HTTP/2 handshake");
    tokio::spawn(conn);
    let request = axum::http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", content_type)
        .header("te", "trailers")
        .body(Full::new(Bytes::from(body)))
        .expect("request");
    let response = sender.send_request(request).await.expect("a response");
    answer_of(response).await
}
