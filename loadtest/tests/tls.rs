//! recload against a real recserve that speaks TLS, asks for client certificates and wants inference tokens,
//! started in this process on port 0 over the generated test repository. Certificates are made here, a CA per test,
//! with the server's own TLS test support (`tests/common/tls.rs`). Over HTTP and gRPC: a run with the CA, a client
//! certificate and a token is answered throughout, its connections opened (handshakes included) before the clock;
//! without the token every request is refused as the server refuses it; without a client certificate, or without
//! the CA, the run does not start and says why. No assertion depends on how fast anything ran.

mod common;
#[path = "common/server.rs"]
mod server;
#[path = "../../tests/common/tls.rs"]
#[allow(
    dead_code,
    reason = "the server's TLS test support: this test uses its certificates and readiness probe, not all of it"
)]
mod server_tls;

use clap::Parser;
use common::fixture_repo;
use recload::cli::{Cli, CliError, Command, run_report};
use recload::report::RunReport;
use recserve::config::ServeArgs;
use server::{Server, ort_library};
use server_tls::{Ca, H1, ServerFiles, connector, wait_ready};

async fn run(args: &[String]) -> Result<RunReport, CliError> {
    let cli = Cli::try_parse_from(
        ["recload", "run"]
            .into_iter()
            .map(str::to_owned)
            .chain(args.iter().cloned()),
    )
    .expect("valid flags");
    let Command::Run(run) = cli.command else {
        panic!("parsed as a run")
    };
    run_report(&run).await
}

fn arg(path: &std::path::Path) -> String {
    path.to_str().expect("UTF-8 path").to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_over_mutual_tls_with_a_token_on_http_and_grpc_and_refusals_are_reported() {
    let ca = Ca::new("recload test CA");
    let files = ServerFiles::new(&ca);
    let client_ca = files.put("clients-ca.crt", &ca.pem());
    let tokens = files.put("tokens", "s3cret\n");
    let ca_file = files.put("ca.crt", &ca.pem());
    let (client_cert, client_key) = ca.issue();
    let client_cert = files.put("client.crt", &client_cert);
    let client_key = files.put("client.key", &client_key);
    let wrong_token = files.put("wrong-token", "# not the server's\nnope\n");

    let mut args = ServeArgs {
        repository: Some(fixture_repo()),
        ort_library: Some(ort_library()),
        tls_client_ca: Some(client_ca),
        inference_tokens_file: Some(tokens.clone()),
        ..ServeArgs::default()
    };
    files.args(&mut args);
    let mut config = args.resolve().expect("valid configuration");
    // However slow the machine, every request waits for its answer.
    config.batch.default_deadline_ms = Some(60_000);
    let server = Server::start(config).await;
    let (http_port, grpc_port) = (server.addr.port(), server.grpc_addr.port());
    let client = (
        std::fs::read_to_string(&client_cert).expect("read"),
        std::fs::read_to_string(&client_key).expect("read"),
    );
    wait_ready(server.addr, &connector(&ca.pem(), Some(&client), H1)).await;
    assert!(server.is_running(), "recserve stopped");

    let repo = fixture_repo();
    let flags = |url: String, grpc: bool, credentials: &[&str]| -> Vec<String> {
        let mut flags: Vec<String> = vec![
            "--url".to_owned(),
            url,
            "--model".to_owned(),
            "deepfm-int8".to_owned(),
            "--repository".to_owned(),
            arg(&repo),
            "--candidates".to_owned(),
            "10".to_owned(),
            "--closed".to_owned(),
            "--concurrency".to_owned(),
            "3".to_owned(),
            "--warmup".to_owned(),
            "0s".to_owned(),
            "--settle-timeout".to_owned(),
            "0s".to_owned(),
            "--duration".to_owned(),
            "1s".to_owned(),
            "--timeout".to_owned(),
            "60s".to_owned(),
            "--quiet".to_owned(),
        ];
        if grpc {
            flags.extend(["--envelope".to_owned(), "kserve-v2-grpc".to_owned()]);
        }
        flags.extend(credentials.iter().map(|s| (*s).to_owned()));
        flags
    };
    let (ca_file, client_cert, client_key) = (arg(&ca_file), arg(&client_cert), arg(&client_key));
    let tls: Vec<&str> = vec![
        "--tls-ca",
        &ca_file,
        "--tls-cert",
        &client_cert,
        "--tls-key",
        &client_key,
    ];
    let token = arg(&tokens);
    let wrong = arg(&wrong_token);
    let targets = [
        (
            format!("https://localhost:{http_port}"),
            false,
            "http_401",
            "http_403",
        ),
        (
            format!("https://localhost:{grpc_port}"),
            true,
            "grpc_unauthenticated",
            "grpc_permission_denied",
        ),
    ];
    for (url, grpc, missing, refused) in targets {
        let with_token = [tls.clone(), vec!["--token-file", &token]].concat();
        let report = run(&flags(url.clone(), grpc, &with_token))
            .await
            .expect("the run completes");
        assert!(report.requests.scheduled > 0, "{report}");
        assert_eq!(report.requests.errors, 0, "{report}\n{:?}", report.errors);
        assert_eq!(report.requests.ok, report.requests.scheduled, "{report}");
        // Three connections, each with its handshake, all before the clock; none opened during the run.
        let setup = report.connections.expect("connection set-up");
        assert_eq!(setup.before_run.map(|s| s.count), Some(3), "{report}");
        assert_eq!(setup.during_run, None, "{report}");
        assert!(
            report
                .to_string()
                .contains("3 opened before the clock with the TLS handshake"),
            "{report}"
        );

        // No token, or one the server does not hold: every request refused, as the server refuses it.
        for (credentials, kind) in [
            (tls.clone(), missing),
            (
                [tls.clone(), vec!["--token-file", &wrong]].concat(),
                refused,
            ),
        ] {
            let report = run(&flags(url.clone(), grpc, &credentials))
                .await
                .expect("the run completes");
            assert!(report.requests.sent > 0, "{report}");
            assert_eq!(report.requests.ok, 0, "{report}");
            assert_eq!(
                report.errors.into_iter().collect::<Vec<_>>(),
                [(kind.to_owned(), report.requests.sent)],
                "{url}"
            );
        }

        // Without a client certificate nothing is answered: the run does not start (the handshake failed), or,
        // TLS 1.3 ending the client's side of the handshake before the server has judged its certificate, every
        // request fails on a connection the server then closes.
        match run(&flags(
            url.clone(),
            grpc,
            &["--tls-ca", &ca_file, "--token-file", &token],
        ))
        .await
        {
            Err(e) => assert!(
                e.to_string().starts_with("cannot connect to 127.0.0.1:"),
                "{e}"
            ),
            Ok(report) => {
                assert!(report.requests.sent > 0, "{report}");
                assert_eq!(report.requests.ok, 0, "{report}");
                assert!(
                    report
                        .errors
                        .keys()
                        .all(|kind| kind == "connection" || kind == "connect"),
                    "{report}\n{:?}",
                    report.errors
                );
            }
        }
        // https:// without the CA, and the CA with http://: refused before anything is sent.
        let err = run(&flags(url.clone(), grpc, &[]))
            .await
            .expect_err("no CA")
            .to_string();
        assert!(err.contains("https:// needs --tls-ca FILE"), "{err}");
        let plain = url.replace("https://", "http://");
        let err = run(&flags(plain, grpc, &tls))
            .await
            .expect_err("TLS flags with http://")
            .to_string();
        assert!(err.contains("use https:// to speak TLS"), "{err}");
    }

    // Files recload cannot use are named with their flag, by the server's own PEM readers.
    let url = format!("https://localhost:{http_port}");
    for (credentials, message) in [
        (
            vec!["--tls-ca".to_owned(), client_key.clone()],
            format!("--tls-ca {client_key}: holds no certificate"),
        ),
        (
            vec![
                "--tls-ca".to_owned(),
                ca_file.clone(),
                "--tls-cert".to_owned(),
                client_cert.clone(),
                "--tls-key".to_owned(),
                client_cert.clone(),
            ],
            format!("--tls-key {client_cert}: holds no private key"),
        ),
        (
            vec![
                "--tls-ca".to_owned(),
                ca_file.clone(),
                "--token-file".to_owned(),
                arg(&files.put("empty", "# none\n")),
            ],
            "holds no token".to_owned(),
        ),
    ] {
        let credentials: Vec<&str> = credentials.iter().map(String::as_str).collect();
        let err = run(&flags(url.clone(), false, &credentials))
            .await
            .expect_err("a bad file")
            .to_string();
        assert!(err.contains(&message), "{message}\n{err}");
    }

    server.stop().await;
}
