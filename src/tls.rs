//! TLS for both listeners (`--tls-cert`, `--tls-key`, `--tls-client-ca`): the PEM files read into one rustls server
//! configuration per listener (ALPN h2 and http/1.1 on HTTP, h2 alone on gRPC), with client certificates required
//! and verified against `--tls-client-ca` when it is given. [`Tls::reload`] rereads the files (on SIGHUP, or a change) and swaps
//! the configurations in for the handshakes that follow; connections already open keep theirs, and a reload that
//! fails keeps the previous configuration. The handshake itself runs in the connection's task
//! (`server/connections.rs`), under its timeout and within the connection cap.
//!
//! Below both `server` (which serves with it) and `check` (`check-config` loads the files exactly as `serve` does).
//! The PEM readers and the crypto provider are public for `recload`, the load generator, whose TLS client reads
//! its CA, certificate and key with the same checks and messages.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;

/// Why a TLS file cannot be used: the flag, its file and the problem.
#[derive(Debug, thiserror::Error)]
#[error("{flag} {}: {problem}", .file.display())]
pub struct TlsError {
    flag: &'static str,
    file: PathBuf,
    problem: String,
}

impl TlsError {
    pub fn new(flag: &'static str, file: &Path, problem: impl Into<String>) -> TlsError {
        TlsError {
            flag,
            file: file.to_path_buf(),
            problem: problem.into(),
        }
    }
}

/// What the HTTP listener speaks over TLS, in the server's order of preference.
const HTTP_ALPN: &[&[u8]] = &[b"h2", b"http/1.1"];
/// gRPC is HTTP/2 only.
const GRPC_ALPN: &[&[u8]] = &[b"h2"];

/// The acceptors of both listeners, swapped whole by a reload.
#[derive(Clone)]
struct Acceptors {
    http: TlsAcceptor,
    grpc: TlsAcceptor,
}

/// The TLS files and the configurations made from them.
pub(crate) struct Tls {
    files: TlsFiles,
    current: RwLock<Acceptors>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads the files; the error names the flag, the file and what is wrong with it.
    pub(crate) fn load(files: &TlsFiles) -> Result<Tls, TlsError> {
        Ok(Tls {
            current: RwLock::new(acceptors(files)?),
            files: files.clone(),
        })
    }

    /// Rereads the files; on an error the configuration in use stays.
    pub(crate) fn reload(&self) -> Result<(), TlsError> {
        let fresh = acceptors(&self.files)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// The files read.
    pub(crate) fn paths(&self) -> Vec<PathBuf> {
        let mut paths = vec![self.files.cert.clone(), self.files.key.clone()];
        paths.extend(self.files.client_ca.clone());
        paths
    }

    /// The acceptor for the next handshake on the HTTP listener.
    pub(crate) fn http_acceptor(&self) -> TlsAcceptor {
        self.current().http
    }

    /// The acceptor for the next handshake on the gRPC listener.
    pub(crate) fn grpc_acceptor(&self) -> TlsAcceptor {
        self.current().grpc
    }

    fn current(&self) -> Acceptors {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

/// rustls' *ring* provider: TLS 1.3 and 1.2 with X25519 and the NIST curves.
#[expect(
    deprecated,
    reason = "rustls 0.23.48 deprecates ring's provider for lacking post-quantum key exchange; aws-lc-rs, which has \
              it, is a long C build (cmake, NASM) on these machines: ring builds with the C compiler alone"
)]
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn acceptors(files: &TlsFiles) -> Result<Acceptors, TlsError> {
    let provider = provider();
    let certs = read_certs("--tls-cert", &files.cert)?;
    let key = read_key("--tls-key", &files.key)?;
    let client_ca = files
        .client_ca
        .as_deref()
        .map(|path| read_certs("--tls-client-ca", path).map(|certs| (path, certs)))
        .transpose()?;
    let config = |alpn: &[&[u8]]| -> Result<ServerConfig, TlsError> {
        let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::new("--tls-cert", &files.cert, e.to_string()))?;
        let builder = match &client_ca {
            None => builder.with_no_client_auth(),
            Some((path, certs)) => builder.with_client_cert_verifier(client_verifier(
                path,
                certs,
                Arc::clone(&provider),
            )?),
        };
        let mut config = builder
            .with_single_cert(certs.clone(), key.clone_key())
            .map_err(|e| key_problem(files, &e, &provider))?;
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    };
    Ok(Acceptors {
        http: TlsAcceptor::from(Arc::new(config(HTTP_ALPN)?)),
        grpc: TlsAcceptor::from(Arc::new(config(GRPC_ALPN)?)),
    })
}

/// Every certificate of a PEM file, at least one; an error names `flag` and the file.
pub fn read_certs(
    flag: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem =
        std::fs::read(path).map_err(|e| TlsError::new(flag, path, format!("cannot read: {e}")))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::new(flag, path, format!("not a PEM certificate file: {e}")))?;
    if certs.is_empty() {
        return Err(TlsError::new(
            flag,
            path,
            "holds no certificate (no -----BEGIN CERTIFICATE----- block)",
        ));
    }
    Ok(certs)
}

/// The private key of a PEM file (PKCS#8, PKCS#1 or SEC1); an error names `flag` and the file.
pub fn read_key(flag: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem =
        std::fs::read(path).map_err(|e| TlsError::new(flag, path, format!("cannot read: {e}")))?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| match e {
        rustls::pki_types::pem::Error::NoItemsFound => TlsError::new(
            flag,
            path,
            "holds no private key (no -----BEGIN PRIVATE KEY-----, RSA PRIVATE KEY or EC PRIVATE KEY block)",
        ),
        e => TlsError::new(flag, path, format!("not a PEM private key file: {e}")),
    })
}

/// The verifier of client certificates: issued by one of `certs`.
fn client_verifier(
    path: &Path,
    certs: &[CertificateDer<'static>],
    provider: Arc<CryptoProvider>,
) -> Result<Arc<dyn rustls::server::danger::ClientCertVerifier>, TlsError> {
    let flag = "--tls-client-ca";
    let mut roots = RootCertStore::empty();
    for cert in certs {
        roots
            .add(cert.clone())
            .map_err(|e| TlsError::new(flag, path, format!("not a usable CA certificate: {e}")))?;
    }
    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| TlsError::new(flag, path, format!("cannot verify clients with it: {e}")))
}

/// What rustls' refusal of the certificate and key means, naming the file at fault.
fn key_problem(files: &TlsFiles, e: &rustls::Error, provider: &CryptoProvider) -> TlsError {
    if let rustls::Error::InconsistentKeys(_) = e {
        return TlsError::new(
            "--tls-key",
            &files.key,
            format!(
                "does not match the certificate of --tls-cert {}: its public key is not the certificate's",
                files.cert.display()
            ),
        );
    }
    // A key the provider cannot load is the key's fault; anything else is the certificate's.
    let key_loads = std::fs::read(&files.key)
        .ok()
        .and_then(|pem| PrivateKeyDer::from_pem_slice(&pem).ok())
        .is_some_and(|key| provider.key_provider.load_private_key(key).is_ok());
    if key_loads {
        TlsError::new("--tls-cert", &files.cert, format!("cannot be used: {e}"))
    } else {
        TlsError::new("--tls-key", &files.key, format!("cannot be used: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(dir: &Path, cert: &str, key: &str) -> TlsFiles {
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write");
            path
        };
        TlsFiles {
            cert: write("cert.pem", cert),
            key: write("key.pem", key),
            client_ca: None,
        }
    }

    fn error(files: &TlsFiles) -> String {
        Tls::load(files).expect_err("refused").to_string()
    }

    #[test]
    fn start_up_errors_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = TlsFiles {
            cert: dir.path().join("nope.pem"),
            key: dir.path().join("nope.key"),
            client_ca: None,
        };
        let message = error(&missing);
        assert!(
            message.starts_with("--tls-cert ") && message.contains("nope.pem: cannot read"),
            "{message}"
        );
        let empty = files(dir.path(), "", "");
        let message = error(&empty);
        assert!(
            message.contains("cert.pem: holds no certificate"),
            "{message}"
        );
        let garbage = files(
            dir.path(),
            "-----BEGIN CERTIFICATE-----\nnot base64 at all!\n-----END CERTIFICATE-----\n",
            "",
        );
        let message = error(&garbage);
        assert!(message.contains("not a PEM certificate file"), "{message}");
    }

    #[test]
    fn a_key_of_another_certificate_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let one = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
        let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
        let good = files(
            dir.path(),
            &one.cert.pem(),
            &one.signing_key.serialize_pem(),
        );
        let tls = Tls::load(&good).expect("a certificate and its key");
        // The same paths, now holding the key of another certificate.
        files(
            dir.path(),
            &one.cert.pem(),
            &other.signing_key.serialize_pem(),
        );
        let message = tls.reload().expect_err("mismatched").to_string();
        assert!(
            message.starts_with("--tls-key ") && message.contains("does not match the certificate"),
            "{message}"
        );
        let no_key = files(dir.path(), &one.cert.pem(), &one.cert.pem());
        let message = error(&no_key);
        assert!(
            message.contains("key.pem: holds no private key"),
            "{message}"
        );
    }
}
