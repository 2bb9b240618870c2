//! End to end: the compact forms of a ranking request, on a real server over the generated test repository. `/v1`
//! rank's columnar form (the item fields named once, the candidates' ids as a matrix) answers every fixture case
//! with exactly the bytes the row form answers, whatever the order of its columns and keys.

mod common;

use std::collections::HashMap;

use common::{TestServer, cases, config, fixture_repo};
use recserve::testing::rank_reference::to_columnar;
use serde_json::Value;

/// Every fixture case on a version the server serves: (model, what, row-form request).
fn served_cases() -> Vec<(String, String, Value)> {
    let all = cases();
    all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| {
            c["version"] == all["models"][c["model"].as_str().expect("model")]["served_version"]
        })
        .map(|c| {
            (
                c["model"].as_str().expect("model").to_owned(),
                c["what"].as_str().expect("what").to_owned(),
                c["request"].clone(),
            )
        })
        .collect()
}

/// POSTs `body` and returns the status and the answer's bytes.
async fn post_bytes(server: &TestServer, path: &str, body: String) -> (u16, Vec<u8>) {
    let resp = server
        .client
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .expect("POST");
    let status = resp.status().as_u16();
    (status, resp.bytes().await.expect("body").to_vec())
}

/// The columnar form of `request` with its keys written `ids` first and `fields` last (the order the decoder has
/// to wait on), `candidates` before `user`.
fn ids_first(request: &Value) -> String {
    let columnar = to_columnar(request, None);
    let c = &columnar["candidates"];
    let mut members = vec![format!("\"ids\":{}", c["ids"])];
    if let Some(id) = c.get("id") {
        members.push(format!("\"id\":{id}"));
    }
    members.push(format!("\"fields\":{}", c["fields"]));
    let top_k = match request.get("top_k") {
        Some(k) => format!(",\"top_k\":{k}"),
        None => String::new(),
    };
    format!(
        "{{\"candidates\":{{{}}},\"user\":{}{top_k}}}",
        members.join(","),
        request["user"]
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_columnar_rank_form_answers_every_case_with_the_bytes_of_the_row_form() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let all = cases();
    let mut checked: HashMap<String, usize> = HashMap::new();
    for (model, what, request) in served_cases() {
        let path = format!("/v1/models/{model}/rank");
        let (status, rows) = post_bytes(&server, &path, request.to_string()).await;
        assert_eq!(
            status,
            200,
            "{model} / {what}: {}",
            String::from_utf8_lossy(&rows)
        );
        // Columns in the first candidate's key order (sorted), reversed, and with `fields` after `ids`.
        let sorted = to_columnar(&request, None);
        let mut reversed_names: Vec<String> =
            serde_json::from_value(sorted["candidates"]["fields"].clone()).expect("names");
        reversed_names.reverse();
        let reversed = to_columnar(&request, Some(&reversed_names));
        for (how, body) in [
            ("sorted columns", sorted.to_string()),
            ("reversed columns", reversed.to_string()),
            ("ids before fields", ids_first(&request)),
        ] {
            let (status, columns) = post_bytes(&server, &path, body.clone()).await;
            assert_eq!(
                status,
                200,
                "{model} / {what} / {how}: {}",
                String::from_utf8_lossy(&columns)
            );
            assert_eq!(
                String::from_utf8_lossy(&columns),
                String::from_utf8_lossy(&rows),
                "{model} / {what} / {how}: the columnar form answers otherwise than the row form"
            );
        }
        // The versioned route takes the columnar form too.
        let version = &all["models"][&model]["served_version"];
        let (status, versioned) = post_bytes(
            &server,
            &format!("/v1/models/{model}/versions/{version}/rank"),
            sorted.to_string(),
        )
        .await;
        assert_eq!(
            (status, versioned),
            (200, rows),
            "{model} / {what}: versioned route"
        );
        *checked.entry(model).or_default() += 1;
    }
    for model in ["deepfm-fp32", "deepfm-fp16", "deepfm-int8"] {
        assert!(
            checked.get(model).copied().unwrap_or(0) >= 8,
            "{model}: {checked:?}"
        );
    }
    server.stop().await.expect("clean shutdown");
}
