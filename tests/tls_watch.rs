//! End to end: the server rereads its TLS files and its inference tokens' file when they change, with no SIGHUP
//! (a Kubernetes Secret mounted as a volume is updated in place). Its own binary, so that the SIGHUPs of
//! tests/tls.rs cannot be what reloads it.

mod common;

use std::time::{Duration, Instant};

use common::tls::{Ca, H1, ServerFiles, connector, handshake, http, send, wait_ready, write};
use common::{TestServer, config, fixture_repo};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_files_are_reread_without_a_signal() {
    let old_ca = Ca::new("old CA");
    let new_ca = Ca::new("new CA");
    let files = ServerFiles::new(&old_ca);
    let tokens = files.put("tokens", "old-token\n");
    let server = TestServer::spawn(config(&fixture_repo(), |a| {
        files.args(a);
        a.inference_tokens_file = Some(tokens.clone());
    }))
    .await;
    let trusts_new = connector(&new_ca.pem(), None, H1);
    wait_ready(server.addr, &connector(&old_ca.pem(), None, H1)).await;

    // The tokens first: a look that sees the new certificate rereads them after it, so finds the new ones too. A
    // look between the key and the certificate fails (they do not match) and keeps the old pair until the next.
    write(files.dir.path(), "tokens", "new-token\n");
    let (cert, key) = new_ca.issue();
    write(files.dir.path(), "tls.key", &key);
    write(files.dir.path(), "tls.crt", &cert);
    // The server looks every 10 s; a file written just after a look is seen at the next one.
    let started = Instant::now();
    let mut answer = None;
    while started.elapsed() < Duration::from_secs(40) && answer.is_none() {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if let Ok(stream) = handshake(&trusts_new, server.addr).await {
            let path = "/v1/models";
            answer = Some(
                send(
                    stream,
                    false,
                    http("GET", path, false, Some("new-token"), b""),
                )
                .await
                .expect("an answer"),
            );
        }
    }
    let answer = answer.expect("the new certificate was not served within 40 s");
    assert_eq!(answer.status, 200, "the new token: {answer:?}");
    let stream = handshake(&trusts_new, server.addr)
        .await
        .expect("handshake");
    let old = send(
        stream,
        false,
        http("GET", "/v1/models", false, Some("old-token"), b""),
    )
    .await
    .expect("an answer");
    assert_eq!(old.status, 403, "the old token is gone: {old:?}");
}
