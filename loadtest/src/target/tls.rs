//! What recload needs to reach a server that asks for more than a TCP connection: TLS for `https://` targets
//! (`--tls-ca`, the CA that signed the server's certificate; `--tls-cert` and `--tls-key`, recload's own
//! certificate for a server that wants client certificates) and a bearer token on every request (`--token-file`).
//! The PEM files are read by the server's own readers (`recserve::tls`), so a file recload refuses is refused
//! with the message the server gives. The crypto provider is the server's too (rustls with *ring*).
//!
//! The handshake is part of opening a connection: the engine opens every connection before the clock starts, so it
//! is counted in a request's latency only when a connection must be opened again during the run (the server
//! closed it, or a request timed out on it); the report says how long set-up took and how often that happened.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use hyper::header::HeaderValue;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

use recserve::tls::{TlsError, provider, read_certs, read_key};

/// The files of a TLS client.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM: the CA certificate(s) the server's certificate must chain to.
    pub ca: PathBuf,
    /// PEM: recload's certificate and its key, for a server that asks for one (mutual TLS).
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// A TLS client configuration, without ALPN (each target offers its own protocol).
#[derive(Clone)]
pub struct TlsClient {
    config: Arc<ClientConfig>,
}

impl std::fmt::Debug for TlsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsClient").finish_non_exhaustive()
    }
}

impl TlsClient {
    /// Reads the files; an error names the flag, the file and the problem.
    pub fn load(files: &TlsFiles) -> Result<TlsClient, TlsError> {
        let mut roots = RootCertStore::empty();
        for cert in read_certs("--tls-ca", &files.ca)? {
            roots.add(cert).map_err(|e| {
                TlsError::new(
                    "--tls-ca",
                    &files.ca,
                    format!("not a usable CA certificate: {e}"),
                )
            })?;
        }
        let builder = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::new("--tls-ca", &files.ca, e.to_string()))?
            .with_root_certificates(roots);
        let config = match &files.identity {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => builder
                .with_client_auth_cert(read_certs("--tls-cert", cert)?, read_key("--tls-key", key)?)
                .map_err(|e| {
                    TlsError::new(
                        "--tls-key",
                        key,
                        format!("cannot be used with --tls-cert {}: {e}", cert.display()),
                    )
                })?,
        };
        Ok(TlsClient {
            config: Arc::new(config),
        })
    }

    /// The handshake with `host` (a DNS name or an IP address, which the server's certificate must name), offering
    /// `alpn` (`http/1.1` for the HTTP target, `h2` for gRPC).
    pub(super) fn handshake(&self, host: &str, alpn: &[u8]) -> Result<Handshake, String> {
        let name = ServerName::try_from(host.to_owned())
            .map_err(|e| format!("{host:?} cannot name a TLS server: {e}"))?;
        let mut config = (*self.config).clone();
        config.alpn_protocols = vec![alpn.to_vec()];
        Ok(Handshake {
            connector: TlsConnector::from(Arc::new(config)),
            name,
        })
    }
}

/// The client side of a target's TLS handshakes.
#[derive(Clone)]
pub(super) struct Handshake {
    connector: TlsConnector,
    name: ServerName<'static>,
}

impl std::fmt::Debug for Handshake {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handshake")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// How recload reaches a server that asks for TLS or a token. The default: plain TCP, no token.
#[derive(Clone, Debug, Default)]
pub struct Access {
    /// Required by `https://` URLs, refused with `http://` ones.
    pub tls: Option<TlsClient>,
    /// Sent as `Authorization: Bearer <token>` (gRPC: the `authorization` metadata) with every request.
    pub token: Option<String>,
}

impl Access {
    /// The `Authorization` header value, marked sensitive (never logged by hyper).
    pub(super) fn authorization(&self) -> Result<Option<HeaderValue>, String> {
        self.token
            .as_deref()
            .map(|token| {
                let mut value =
                    HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
                        "the token holds characters an HTTP header cannot carry".to_owned()
                    })?;
                value.set_sensitive(true);
                Ok(value)
            })
            .transpose()
    }
}

/// Reads a token file as the server reads `--inference-tokens-file`: the first line that is neither blank nor a
/// `#` comment, trimmed. An error names the flag and the file.
pub fn read_token(path: &Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--token-file {}: cannot read: {e}", path.display()))?;
    let token = text
        .lines()
        .map(str::trim)
        .find(|line| !line.is_empty() && !line.starts_with('#'))
        .ok_or_else(|| {
            format!(
                "--token-file {}: holds no token (blank lines and lines starting with '#' are skipped)",
                path.display()
            )
        })?;
    if token.chars().any(char::is_whitespace) {
        return Err(format!(
            "--token-file {}: the token holds whitespace: a bearer token cannot",
            path.display()
        ));
    }
    Ok(token.to_owned())
}

/// Opens a TCP connection to `addr` (`TCP_NODELAY`) and, with `tls`, makes the TLS handshake over it.
pub(super) async fn open(addr: SocketAddr, tls: Option<&Handshake>) -> std::io::Result<Stream> {
    let tcp = TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    Ok(match tls {
        None => Stream::Plain(tcp),
        Some(h) => Stream::Tls(Box::new(h.connector.connect(h.name.clone(), tcp).await?)),
    })
}

/// A connection, with or without TLS.
#[derive(Debug)]
pub(super) enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl tokio::io::AsyncRead for Stream {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Stream {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}
