//! The examples in docs/api.md are true: each request block is sent to a server on the test repository and the
//! response must equal the documented one (scores to 1e-6, the precision printed). The README's quick start, which
//! uses the demo models, is checked by tests/demo_models.rs.

mod common;

use common::{TestServer, config, fixture_dir, fixture_repo};
use serde_json::Value;

/// `(method and path, request body, documented response)` for each example in `text`: a
/// `<!-- example: METHOD PATH -->` comment, then a ```json request block (absent for GET), then an
/// `<!-- example response -->` comment and a ```json block.
fn examples(text: &str) -> Vec<(String, Option<Value>, Value)> {
    let json_after = |from: usize| -> (Value, usize) {
        let start = text[from..]
            .find("```json\n")
            .expect("a ```json block follows")
            + from
            + 8;
        let end = text[start..].find("```").expect("the block ends") + start;
        let value =
            serde_json::from_str(&text[start..end]).unwrap_or_else(|e| panic!("example JSON: {e}"));
        (value, end + 3)
    };
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(found) = text[at..].find("<!-- example: ") {
        let start = at + found + "<!-- example: ".len();
        let end = text[start..].find(" -->").expect("comment ends") + start;
        let route = text[start..end].to_owned();
        let response_marker = text[end..]
            .find("<!-- example response -->")
            .expect("a response follows")
            + end;
        let request = if route.starts_with("POST") {
            let (value, next) = json_after(end);
            assert!(
                next < response_marker,
                "{route}: the request block comes before the response"
            );
            Some(value)
        } else {
            None
        };
        let (response, next) = json_after(response_marker);
        out.push((route, request, response));
        at = next;
    }
    out
}

/// Equal, with numbers compared to 1e-6.
fn same(got: &Value, want: &Value) -> bool {
    match (got, want) {
        (Value::Number(a), Value::Number(b)) => {
            (a.as_f64().unwrap_or(f64::NAN) - b.as_f64().unwrap_or(f64::NAN)).abs() <= 1e-6
        }
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same(x, y))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len() && a.iter().all(|(k, v)| b.get(k).is_some_and(|w| same(v, w)))
        }
        _ => got == want,
    }
}

/// Every key path in `value`, following the first element of arrays.
fn keys(value: &Value) -> Vec<String> {
    fn walk(value: &Value, prefix: &str, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let path = format!("{prefix}.{k}");
                    out.push(path.clone());
                    walk(v, &path, out);
                }
            }
            Value::Array(items) => {
                if let Some(first) = items.first() {
                    walk(first, &format!("{prefix}[]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, "", &mut out);
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documented_examples_answer_as_documented() {
    // With the fixture's pipeline configuration, for the recommend examples.
    let server = TestServer::start(config(&fixture_repo(), |a| {
        a.config = Some(fixture_dir().join("recserve.toml"))
    }))
    .await;
    let api = std::fs::read_to_string("docs/api.md").expect("docs/api.md");
    let found = examples(&api);
    assert!(!found.is_empty(), "docs/api.md has examples");
    for (route, request, documented) in found {
        let (method, path) = route.split_once(' ').expect("METHOD PATH");
        let (status, got) = match method {
            "POST" => {
                server
                    .post(path, request.as_ref().expect("a POST example has a body"))
                    .await
            }
            "GET" => {
                let (status, text) = server.get(path).await;
                (status, serde_json::from_str(&text).expect("JSON response"))
            }
            other => panic!("unsupported method {other}"),
        };
        assert_eq!(status, 200, "{route}: {got}");
        assert!(
            same(&got, &documented),
            "{route}: the server answers\n{got:#}\nbut docs/api.md shows\n{documented:#}"
        );
    }

    // Shortened examples: the keys, at every level of the first element of each array, are the server's.
    let start = api
        .find("<!-- example keys: GET /v1/models -->")
        .expect("the /v1/models example");
    let block = &api[start..];
    let json_start = block.find("```json\n").expect("block") + 8;
    let json_end = block[json_start..].find("```").expect("end") + json_start;
    let documented: Value = serde_json::from_str(&block[json_start..json_end]).expect("JSON");
    let (status, text) = server.get("/v1/models").await;
    assert_eq!(status, 200);
    let got: Value = serde_json::from_str(&text).expect("JSON");
    assert_eq!(
        keys(&got),
        keys(&documented),
        "GET /v1/models: documented keys differ from the server's"
    );
    // Shortened POST examples (a request block, then a response block whose values vary, such as timings).
    let marker = "<!-- example keys: POST ";
    let (mut at, mut shortened) = (0, 0);
    while let Some(found) = api[at..].find(marker) {
        let start = at + found + marker.len();
        let path = &api[start..start + api[start..].find(" -->").expect("comment ends")];
        let mut blocks = api[start..].split("```json\n").skip(1).take(2).map(|b| {
            let end = b.find("```").expect("the block ends");
            serde_json::from_str::<Value>(&b[..end]).expect("example JSON")
        });
        let request = blocks.next().expect("a request block");
        let documented = blocks.next().expect("a response block");
        let (status, got) = server.post(path, &request).await;
        assert_eq!(status, 200, "POST {path}: {got}");
        assert_eq!(
            keys(&got),
            keys(&documented),
            "POST {path}: documented keys differ from the server's"
        );
        at = start;
        shortened += 1;
    }
    assert!(
        shortened >= 1,
        "docs/api.md has the recommend timings example"
    );

    server.stop().await.expect("clean shutdown");
}
