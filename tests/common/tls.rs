//! TLS clients and certificates for the end-to-end tests of TLS (tests/tls.rs, tests/tls_watch.rs): a CA made
//! with rcgen, the server's files, rustls clients with or without a certificate and ALPN, one request over HTTP/1.1
//! or HTTP/2, SIGHUP to this process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::http::{HeaderMap, Request};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use recserve::config::ServeArgs;

/// A certificate authority made for one test.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    pub fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().expect("CA key");
        Ca {
            issuer: CertifiedIssuer::self_signed(params, key).expect("CA certificate"),
        }
    }

    pub fn pem(&self) -> String {
        self.issuer.pem()
    }

    /// A certificate for `localhost` and 127.0.0.1 (a server's, or a client's), and its key, in PEM.
    pub fn issue(&self) -> (String, String) {
        let key = KeyPair::generate().expect("key");
        let names = vec!["localhost".to_owned(), "127.0.0.1".to_owned()];
        let cert = CertificateParams::new(names)
            .expect("params")
            .signed_by(&key, &*self.issuer)
            .expect("certificate");
        (cert.pem(), key.serialize_pem())
    }
}

/// Writes `text` to `dir/name` whole (a rename), so that a reload never reads half a file.
pub fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    let partial = dir.join(format!(".{name}.partial"));
    std::fs::write(&partial, text).expect("write");
    std::fs::rename(&partial, &path).expect("rename");
    path
}

/// The server's TLS files in a temporary directory.
pub struct ServerFiles {
    pub dir: tempfile::TempDir,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServerFiles {
    pub fn new(ca: &Ca) -> ServerFiles {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = ca.issue();
        let cert = write(dir.path(), "tls.crt", &cert);
        let key = write(dir.path(), "tls.key", &key);
        ServerFiles { dir, cert, key }
    }

    /// A file beside the certificate.
    pub fn put(&self, name: &str, text: &str) -> PathBuf {
        write(self.dir.path(), name, text)
    }

    pub fn args(&self, args: &mut ServeArgs) {
        args.tls_cert = Some(self.cert.clone());
        args.tls_key = Some(self.key.clone());
    }
}

/// A client trusting `ca`, with `identity` (certificate and key PEM) as its certificate, offering `alpn`.
#[expect(
    deprecated,
    reason = "rustls 0.23.48 deprecates ring's provider (no post-quantum key exchange); the server uses it too"
)]
pub fn connector(ca: &str, identity: Option<&(String, String)>, alpn: &[&[u8]]) -> TlsConnector {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("a CA certificate");
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(cert.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("client certificate"),
                PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("client key"),
            )
            .expect("client identity"),
    };
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    TlsConnector::from(Arc::new(config))
}

pub const H1: &[&[u8]] = &[b"http/1.1"];
pub const H2: &[&[u8]] = &[b"h2"];
pub const BOTH: &[&[u8]] = &[b"h2", b"http/1.1"];

pub type Tls = tokio_rustls::client::TlsStream<TcpStream>;

pub async fn handshake(connector: &TlsConnector, addr: SocketAddr) -> std::io::Result<Tls> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from("localhost").expect("name").to_owned();
    connector.connect(name, tcp).await
}

/// What came back.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: HeaderMap,
    pub body: Bytes,
    pub trailers: Option<HeaderMap>,
}

impl Answer {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A gRPC call's status code (trailers-only answers carry it in the headers).
    pub fn grpc_status(&self) -> Option<&str> {
        self.header("grpc-status").or_else(|| {
            self.trailers
                .as_ref()?
                .get("grpc-status")
                .and_then(|v| v.to_str().ok())
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }
}

/// One request over `stream`, in HTTP/2 or HTTP/1.1.
pub async fn send<S>(
    stream: S,
    http2: bool,
    request: Request<Full<Bytes>>,
) -> Result<Answer, String>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let io = TokioIo::new(stream);
    let response = if http2 {
        let (mut sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await
    } else {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| e.to_string())?;
        tokio::spawn(conn);
        sender.send_request(request).await
    }
    .map_err(|e| e.to_string())?;
    let (parts, body) = response.into_parts();
    let collected = body.collect().await.map_err(|e| e.to_string())?;
    let trailers = collected.trailers().cloned();
    Ok(Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: collected.to_bytes(),
        trailers,
    })
}

/// An HTTP request (`http2`: with the scheme and authority HTTP/2 wants), with `Bearer token` if given.
pub fn http(
    method: &str,
    path: &str,
    http2: bool,
    token: Option<&str>,
    body: &[u8],
) -> Request<Full<Bytes>> {
    let uri = if http2 {
        format!("https://localhost{path}")
    } else {
        path.to_owned()
    };
    let mut request = Request::builder()
        .method(method)
        .uri(uri)
        .header("content-type", "application/json");
    if !http2 {
        request = request.header("host", "localhost");
    }
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request
        .body(Full::new(Bytes::copy_from_slice(body)))
        .expect("request")
}

/// A unary gRPC call of `inference.GRPCInferenceService` with an empty request message (ServerLive,
/// ServerReady, ServerMetadata take one).
pub fn grpc(method: &str, scheme: &str, token: Option<&str>) -> Request<Full<Bytes>> {
    let mut request = Request::builder()
        .method("POST")
        .uri(format!(
            "{scheme}://localhost/inference.GRPCInferenceService/{method}"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    if let Some(token) = token {
        request = request.header("authorization", format!("Bearer {token}"));
    }
    request
        .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
        .expect("request")
}

/// Polls `/health/ready` over TLS until the server says so.
pub async fn wait_ready(addr: SocketAddr, connector: &TlsConnector) {
    for _ in 0..600 {
        if let Ok(stream) = handshake(connector, addr).await
            && let Ok(answer) = send(
                stream,
                false,
                http("GET", "/health/ready", false, None, b""),
            )
            .await
            && answer.status == 200
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the TLS server at {addr} did not become ready within 60 s");
}

pub async fn metrics(addr: SocketAddr, connector: &TlsConnector) -> String {
    let stream = handshake(connector, addr).await.expect("handshake");
    let answer = send(stream, false, http("GET", "/metrics", false, None, b""))
        .await
        .expect("metrics");
    String::from_utf8(answer.body.to_vec()).expect("text")
}

/// Sends SIGHUP to this process (the servers of this test binary listen for it).
pub fn hangup() {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &std::process::id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -HUP failed");
}
