//! End to end: TLS on both listeners (`--tls-cert`, `--tls-key`), mutual TLS (`--tls-client-ca`), reloading the
//! certificate on SIGHUP, the handshake under the connection's timeout, and the inference calls' bearer tokens
//! (`--inference-tokens-file`) over HTTP and gRPC; then real clients: curl, and tritonclient over HTTPS and gRPC
//! with TLS (tests/tls_client.py). Certificates are made here (rcgen), a CA per test. Nothing is skipped: a
//! missing curl or tritonclient fails the test.

mod common;

use std::path::Path;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::tls::{
    BOTH, Ca, H1, H2, ServerFiles, connector, grpc, handshake, hangup, http, metrics, send,
    wait_ready, write,
};
use common::{TestServer, config, fixture_repo, metric_sample};

const MODEL: &str = "deepfm-int8";

fn rank_body() -> Vec<u8> {
    std::fs::read("docs/examples/rank-request.json").expect("example")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_and_grpc_answer_over_tls_with_their_protocols() {
    let ca = Ca::new("recserve test CA");
    let files = ServerFiles::new(&ca);
    let server = TestServer::spawn(config(&fixture_repo(), |a| files.args(a))).await;
    let trusting = connector(&ca.pem(), None, BOTH);
    wait_ready(server.addr, &trusting).await;

    // HTTP: HTTP/1.1 and HTTP/2 as ALPN chooses; a ranking call answers as over plain TCP.
    for (alpn, http2) in [(H1, false), (H2, true), (BOTH, true)] {
        let stream = handshake(&connector(&ca.pem(), None, alpn), server.addr)
            .await
            .expect("handshake");
        let chosen = stream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        assert_eq!(chosen.as_deref(), Some(alpn[0]), "{alpn:?}");
        let path = format!("/v1/models/{MODEL}/rank");
        let answer = send(
            stream,
            http2,
            http("POST", &path, http2, None, &rank_body()),
        )
        .await
        .expect("rank over TLS");
        assert_eq!(answer.status, 200, "{alpn:?}: {answer:?}");
        assert!(answer.json()["scores"].is_array(), "{answer:?}");
    }

    // gRPC: h2 only.
    let stream = handshake(&connector(&ca.pem(), None, BOTH), server.grpc_addr)
        .await
        .expect("gRPC handshake");
    assert_eq!(stream.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let answer = send(stream, true, grpc("ServerReady", "https", None))
        .await
        .expect("ServerReady over TLS");
    assert_eq!(answer.grpc_status(), Some("0"), "{answer:?}");
    let only_h1 = handshake(&connector(&ca.pem(), None, H1), server.grpc_addr).await;
    assert!(only_h1.is_err(), "gRPC's listener speaks h2 only");

    // A client that does not trust the server's CA, and one that does not speak TLS at all.
    let stranger = Ca::new("another CA");
    let distrusting = handshake(&connector(&stranger.pem(), None, BOTH), server.addr).await;
    assert!(distrusting.is_err(), "the certificate is the test CA's");
    let mut plain = TcpStream::connect(server.addr).await.expect("connect");
    plain
        .write_all(b"GET /health/live HTTP/1.1\r\nhost: localhost\r\n\r\n")
        .await
        .expect("write");
    let mut read = Vec::new();
    let _ = plain.read_to_end(&mut read).await;
    assert!(
        !read.starts_with(b"HTTP/1.1 200"),
        "plain HTTP is not answered on the TLS port"
    );

    let text = metrics(server.addr, &trusting).await;
    assert!(
        metric_sample(
            &text,
            "recserve_tls_handshake_failures_total{listener=\"http\"}"
        ) >= 1.0,
        "{text}"
    );
    assert!(
        metric_sample(
            &text,
            "recserve_tls_handshake_failures_total{listener=\"grpc\"}"
        ) >= 1.0,
        "{text}"
    );
    drop(files);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_answers_only_clients_with_a_certificate_of_the_client_ca() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let other_ca = Ca::new("other CA");
    let files = ServerFiles::new(&server_ca);
    let ca_file = files.put("ca.crt", &client_ca.pem());
    let server = TestServer::spawn(config(&fixture_repo(), |a| {
        files.args(a);
        a.tls_client_ca = Some(ca_file.clone());
    }))
    .await;
    let good = client_ca.issue();
    let with_good = connector(&server_ca.pem(), Some(&good), BOTH);
    wait_ready(server.addr, &with_good).await;

    let stranger = other_ca.issue();
    for (who, client) in [
        ("no certificate", connector(&server_ca.pem(), None, BOTH)),
        (
            "a certificate of another CA",
            connector(&server_ca.pem(), Some(&stranger), BOTH),
        ),
    ] {
        for addr in [server.addr, server.grpc_addr] {
            // TLS 1.3: the client may finish its side before the server refuses; then the request fails.
            let answered = match handshake(&client, addr).await {
                Err(_) => false,
                Ok(stream) => send(stream, true, grpc("ServerLive", "https", None))
                    .await
                    .is_ok(),
            };
            assert!(!answered, "{who} answered on {addr}");
        }
    }
    let stream = handshake(&with_good, server.grpc_addr)
        .await
        .expect("gRPC handshake");
    let answer = send(stream, true, grpc("ServerLive", "https", None))
        .await
        .expect("ServerLive");
    assert_eq!(answer.grpc_status(), Some("0"), "{answer:?}");
    let stream = handshake(&with_good, server.addr).await.expect("handshake");
    let path = format!("/v2/models/{MODEL}");
    let answer = send(stream, true, http("GET", &path, true, None, b""))
        .await
        .expect("metadata");
    assert_eq!(answer.status, 200, "{answer:?}");

    let text = metrics(server.addr, &with_good).await;
    for listener in ["http", "grpc"] {
        let failed = metric_sample(
            &text,
            &format!("recserve_tls_handshake_failures_total{{listener=\"{listener}\"}}"),
        );
        assert!(failed >= 2.0, "{listener}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_the_certificate_and_keeps_it_when_the_new_one_is_broken() {
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let files = ServerFiles::new(&old_ca);
    let server = TestServer::spawn(config(&fixture_repo(), |a| files.args(a))).await;
    let trusts_old = connector(&old_ca.pem(), None, H1);
    let trusts_new = connector(&new_ca.pem(), None, H1);
    wait_ready(server.addr, &trusts_old).await;

    // An HTTP/1.1 connection open across the reload goes on with its certificate.
    let stream = handshake(&trusts_old, server.addr)
        .await
        .expect("handshake");
    let (mut open, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1");
    tokio::spawn(conn);

    let (cert, key) = new_ca.issue();
    write(files.dir.path(), "tls.key", &key);
    write(files.dir.path(), "tls.crt", &cert);
    let mut reloaded = false;
    for _ in 0..100 {
        hangup();
        tokio::time::sleep(Duration::from_millis(100)).await;
        if handshake(&trusts_new, server.addr).await.is_ok() {
            reloaded = true;
            break;
        }
    }
    assert!(reloaded, "SIGHUP did not bring in the new certificate");
    assert!(
        handshake(&connector(&new_ca.pem(), None, H2), server.grpc_addr)
            .await
            .is_ok(),
        "the gRPC listener serves the new certificate"
    );
    assert!(
        handshake(&connector(&old_ca.pem(), None, H2), server.grpc_addr)
            .await
            .is_err(),
        "the gRPC listener still serves the old certificate"
    );
    let answer = open
        .send_request(http("GET", "/health/live", false, None, b""))
        .await
        .expect("the open connection still answers");
    assert_eq!(answer.status(), 200);

    // A broken certificate: the reload fails, is counted, and the last good certificate stays.
    write(files.dir.path(), "tls.crt", "not a certificate\n");
    let mut failed = 0.0;
    for _ in 0..100 {
        hangup();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let text = metrics(server.addr, &trusts_new).await;
        failed = metric_sample(&text, "recserve_tls_reloads_total{result=\"failed\"}");
        if failed >= 1.0 {
            break;
        }
    }
    assert!(failed >= 1.0, "the failed reload was not counted");
    let stream = handshake(&trusts_new, server.addr)
        .await
        .expect("the last good certificate is still served");
    let answer = send(
        stream,
        false,
        http("GET", "/health/ready", false, None, b""),
    )
    .await
    .expect("ready");
    assert_eq!(answer.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_finishes_its_handshake_is_dropped_by_the_header_timeout() {
    let ca = Ca::new("timeout CA");
    let files = ServerFiles::new(&ca);
    let server = TestServer::spawn(config(&fixture_repo(), |a| {
        files.args(a);
        a.header_read_timeout_ms = Some(500);
    }))
    .await;
    let trusting = connector(&ca.pem(), None, BOTH);
    wait_ready(server.addr, &trusting).await;

    for (addr, sent) in [
        (server.addr, &b""[..]),
        // The first bytes of a ClientHello, and nothing more.
        (server.grpc_addr, &[0x16, 0x03, 0x01, 0x02, 0x00][..]),
    ] {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(sent).await.expect("write");
        let started = std::time::Instant::now();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(20), stream.read(&mut buf))
            .await
            .expect("the server closes the connection");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(300),
            "closed too soon: {:?}",
            started.elapsed()
        );
    }
    let text = metrics(server.addr, &trusting).await;
    for listener in ["http", "grpc"] {
        let timed_out = metric_sample(
            &text,
            &format!(
                "recserve_connections_timed_out_total{{listener=\"{listener}\",timeout=\"tls_handshake\"}}"
            ),
        );
        assert!(timed_out >= 1.0, "{listener}: {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inference_calls_need_a_token_of_the_file_and_health_stays_open() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tokens = write(
        dir.path(),
        "tokens",
        "# the feed team\nalpha-token\nbeta-token\n",
    );
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.inference_tokens_file = Some(tokens.clone());
    }))
    .await;
    let rank = format!("/v1/models/{MODEL}/rank");
    let call = |token: Option<&str>, path: &str, body: &[u8]| {
        let (path, body, token) = (path.to_owned(), body.to_vec(), token.map(str::to_owned));
        let addr = server.addr;
        async move {
            let stream = TcpStream::connect(addr).await.expect("connect");
            let method = if body.is_empty() { "GET" } else { "POST" };
            send(
                stream,
                false,
                http(method, &path, false, token.as_deref(), &body),
            )
            .await
            .expect("an answer")
        }
    };

    let missing = call(None, &rank, &rank_body()).await;
    assert_eq!(missing.status, 401, "{missing:?}");
    assert_eq!(missing.header("www-authenticate"), Some("Bearer"));
    let message = missing.json()["error"].as_str().expect("error").to_owned();
    assert!(
        message.contains("Authorization: Bearer <token>"),
        "{message}"
    );
    let wrong = call(Some("gamma-token"), &rank, &rank_body()).await;
    assert_eq!(wrong.status, 403, "{wrong:?}");
    assert!(wrong.json()["error"].as_str().is_some(), "{wrong:?}");
    let right = call(Some("beta-token"), &rank, &rank_body()).await;
    assert_eq!(right.status, 200, "{right:?}");
    for path in [
        "/v2",
        "/v2/models/deepfm-int8",
        "/v2/models/deepfm-int8/ready",
    ] {
        assert_eq!(call(None, path, b"").await.status, 401, "{path}");
        assert_eq!(
            call(Some("alpha-token"), path, b"").await.status,
            200,
            "{path}"
        );
    }
    for path in [
        "/health/live",
        "/health/ready",
        "/v2/health/ready",
        "/metrics",
    ] {
        assert_eq!(call(None, path, b"").await.status, 200, "{path}");
    }

    // gRPC: the `authorization` metadata.
    let grpc_call = |method: &'static str, token: Option<&'static str>| {
        let addr = server.grpc_addr;
        async move {
            let stream = TcpStream::connect(addr).await.expect("connect");
            let answer = send(stream, true, grpc(method, "http", token))
                .await
                .expect("an answer");
            answer.grpc_status().map(str::to_owned)
        }
    };
    assert_eq!(
        grpc_call("ServerMetadata", None).await.as_deref(),
        Some("16")
    );
    assert_eq!(
        grpc_call("ServerMetadata", Some("gamma-token"))
            .await
            .as_deref(),
        Some("7")
    );
    assert_eq!(
        grpc_call("ServerMetadata", Some("alpha-token"))
            .await
            .as_deref(),
        Some("0")
    );
    assert_eq!(grpc_call("ServerLive", None).await.as_deref(), Some("0"));
    assert_eq!(grpc_call("ServerReady", None).await.as_deref(), Some("0"));

    let (_, text) = server.get("/metrics").await;
    for (listener, reason, at_least) in [
        ("http", "missing", 4.0),
        ("http", "wrong", 1.0),
        ("grpc", "missing", 1.0),
        ("grpc", "wrong", 1.0),
    ] {
        let counted = metric_sample(
            &text,
            &format!("recserve_auth_refused_total{{listener=\"{listener}\",reason=\"{reason}\"}}"),
        );
        assert!(counted >= at_least, "{listener} {reason}: {text}");
    }

    // Tokens rotate on SIGHUP.
    write(dir.path(), "tokens", "gamma-token\n");
    let mut rotated = false;
    for _ in 0..100 {
        hangup();
        tokio::time::sleep(Duration::from_millis(100)).await;
        if call(Some("gamma-token"), &rank, &rank_body()).await.status == 200 {
            rotated = true;
            break;
        }
    }
    assert!(rotated, "SIGHUP did not reload the tokens");
    assert_eq!(
        call(Some("alpha-token"), &rank, &rank_body()).await.status,
        403
    );
}

/// Runs curl with `args`; a curl that cannot run fails the test.
async fn curl(args: Vec<String>) -> (bool, String) {
    let output = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args(["--silent", "--show-error", "--max-time", "20"])
            .args(&args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run curl ({e}): the TLS tests need it installed"))
    })
    .await
    .expect("curl task");
    (
        output.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ),
    )
}

fn arg(path: &Path) -> String {
    path.display().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_and_tritonclient_speak_tls_mutual_tls_and_tokens() {
    let server_ca = Ca::new("server CA");
    let client_ca = Ca::new("client CA");
    let files = ServerFiles::new(&server_ca);
    let ca_file = files.put("ca.crt", &server_ca.pem());
    let client_ca_file = files.put("client-ca.crt", &client_ca.pem());
    let (cert, key) = client_ca.issue();
    let client_cert = files.put("client.crt", &cert);
    let client_key = files.put("client.key", &key);
    let tokens = files.put("tokens", "curl-token\n");
    let server = TestServer::spawn(config(&fixture_repo(), |a| {
        files.args(a);
        a.tls_client_ca = Some(client_ca_file.clone());
        a.inference_tokens_file = Some(tokens.clone());
    }))
    .await;
    let identity = (cert.clone(), key.clone());
    wait_ready(
        server.addr,
        &connector(&server_ca.pem(), Some(&identity), BOTH),
    )
    .await;

    let port = server.addr.port();
    let url = |path: &str| format!("https://localhost:{port}{path}");
    let with_cert = || {
        vec![
            "--cacert".to_owned(),
            arg(&ca_file),
            "--cert".to_owned(),
            arg(&client_cert),
            "--key".to_owned(),
            arg(&client_key),
        ]
    };
    // Without a client certificate: refused in the handshake.
    let (ok, said) = curl(vec![
        "--cacert".to_owned(),
        arg(&ca_file),
        url("/health/ready"),
    ])
    .await;
    assert!(!ok, "answered without a client certificate: {said}");
    // With one, over HTTP/1.1 and HTTP/2: health open, inference with the token.
    for version in ["--http1.1", "--http2"] {
        let mut args = with_cert();
        args.extend([
            version.to_owned(),
            "--write-out".to_owned(),
            " %{http_code} %{http_version}".to_owned(),
            url("/health/ready"),
        ]);
        let (ok, said) = curl(args).await;
        let expected = if version == "--http2" {
            " 200 2"
        } else {
            " 200 1.1"
        };
        assert!(ok && said.ends_with(expected), "{version}: {said}");
        for (token, status) in [
            (None, "401"),
            (Some("wrong"), "403"),
            (Some("curl-token"), "200"),
        ] {
            let mut args = with_cert();
            args.extend([
                version.to_owned(),
                "--output".to_owned(),
                "/dev/null".to_owned(),
                "--write-out".to_owned(),
                "%{http_code}".to_owned(),
                "--header".to_owned(),
                "content-type: application/json".to_owned(),
                "--data-binary".to_owned(),
                "@docs/examples/rank-request.json".to_owned(),
            ]);
            if let Some(token) = token {
                args.extend([
                    "--header".to_owned(),
                    format!("authorization: Bearer {token}"),
                ]);
            }
            args.push(url(&format!("/v1/models/{MODEL}/rank")));
            let (ok, said) = curl(args).await;
            assert!(ok && said == status, "{version} token {token:?}: {said}");
        }
    }

    common::run_python(
        "tls_client.py",
        vec![
            "--http".to_owned(),
            format!("localhost:{port}"),
            "--grpc".to_owned(),
            format!("localhost:{}", server.grpc_addr.port()),
            "--ca".to_owned(),
            arg(&ca_file),
            "--cert".to_owned(),
            arg(&client_cert),
            "--key".to_owned(),
            arg(&client_key),
            "--token".to_owned(),
            "curl-token".to_owned(),
            "--model".to_owned(),
            MODEL.to_owned(),
        ],
    )
    .await;
}
