//! End to end: a matrix of bad requests (the columnar form's among them), each answered with a 4xx whose message
//! names the field, sent while concurrent good requests keep getting exactly their own correct scores.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use common::{TestServer, cases, config, fixture_repo};
use recserve::testing::rank_reference::to_columnar;
use serde_json::{Value, json};

/// A valid request for `deepfm-fp32` and its expected scores, from the fixture.
fn good_case() -> (Value, Vec<f64>) {
    let all = cases();
    let case = all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| {
            c["model"] == "deepfm-fp32"
                && c["version"] == 2
                && c["request"]["candidates"].as_array().map_or(0, Vec::len) >= 100
                && c["request"].get("top_k").is_none()
        })
        .expect("a 100-candidate case for deepfm-fp32 v2");
    let expected = case["expected_scores"]
        .as_array()
        .expect("scores")
        .iter()
        .map(|v| v.as_f64().expect("float"))
        .collect();
    (case["request"].clone(), expected)
}

fn set(value: &mut Value, pointer: &str, new: Value) {
    *value
        .pointer_mut(pointer)
        .unwrap_or_else(|| panic!("{pointer} exists")) = new;
}

fn remove(value: &mut Value, pointer: &str) {
    let (parent, key) = pointer.rsplit_once('/').expect("pointer has a parent");
    value
        .pointer_mut(parent)
        .and_then(Value::as_object_mut)
        .expect("parent object")
        .remove(key)
        .unwrap_or_else(|| panic!("{pointer} exists"));
}

/// A change that makes a good request bad.
type Fault = fn(&mut Value);

/// The bad requests: (what, path, body, expected status, text the error message must contain).
fn bad_requests(good: &Value) -> Vec<(String, String, String, u16, String)> {
    let rank = "/v1/models/deepfm-fp32/rank".to_owned();
    let mut out = Vec::new();
    let mut push = |what: &str, path: &str, body: String, status: u16, needle: &str| {
        out.push((
            what.to_owned(),
            path.to_owned(),
            body,
            status,
            needle.to_owned(),
        ));
    };
    push(
        "malformed JSON",
        &rank,
        "{\"user\": {".to_owned(),
        400,
        "malformed request body: EOF while parsing",
    );
    push(
        "not an object",
        &rank,
        "[1, 2]".to_owned(),
        400,
        "malformed request body: the body must be a JSON object",
    );
    push(
        "empty body",
        &rank,
        String::new(),
        400,
        "malformed request body: the body is empty",
    );

    let mut v = good.clone();
    set(&mut v, "/user/fields/C1", json!("seven"));
    push(
        "string id",
        &rank,
        v.to_string(),
        400,
        "user.fields.C1: invalid type: string \"seven\", expected i64",
    );
    let mut v = good.clone();
    set(&mut v, "/candidates/3/fields/C21", json!(1.5));
    push(
        "float id",
        &rank,
        v.to_string(),
        400,
        "candidates[3].fields.C21: invalid type: floating point",
    );
    let mut v = good.clone();
    set(&mut v, "/user/dense", json!("0"));
    push(
        "dense not an array",
        &rank,
        v.to_string(),
        400,
        "user.dense: invalid type: string",
    );

    let mut v = good.clone();
    remove(&mut v, "/user/fields/C4");
    push(
        "missing user field",
        &rank,
        v.to_string(),
        400,
        "user.fields.C4: is missing",
    );
    let mut v = good.clone();
    remove(&mut v, "/candidates/7/fields/C26");
    push(
        "missing item field",
        &rank,
        v.to_string(),
        400,
        "candidates[7].fields.C26: is missing",
    );
    let mut v = good.clone();
    remove(&mut v, "/candidates/2/id");
    push(
        "missing item id",
        &rank,
        v.to_string(),
        400,
        "candidates[2].id: is required",
    );
    let mut v = good.clone();
    remove(&mut v, "/candidates");
    push(
        "missing candidates",
        &rank,
        v.to_string(),
        400,
        "candidates: is required",
    );
    let mut v = good.clone();
    v["user"]["fields"]["C99"] = json!(1);
    push(
        "unknown field",
        &rank,
        v.to_string(),
        400,
        "user.fields.C99: is not a field of this model",
    );

    let mut v = good.clone();
    set(&mut v, "/candidates", json!([]));
    push(
        "empty candidate list",
        &rank,
        v.to_string(),
        400,
        "candidates: must hold at least one candidate",
    );
    let mut v = good.clone();
    let one = good["candidates"][0].clone();
    set(&mut v, "/candidates", Value::Array(vec![one; 1001]));
    push(
        "too many candidates",
        &rank,
        v.to_string(),
        400,
        "candidates: holds 1001 candidates, more than the limit of 1000",
    );

    // Reject tables of deepfm-fp32: C2 (user side, 583 rows) and C23 (item side).
    let mut v = good.clone();
    set(&mut v, "/user/fields/C2", json!(583));
    push(
        "OOV id in a reject table (user)",
        &rank,
        v.to_string(),
        400,
        "user.fields.C2: id 583 is outside the vocabulary of table \"C2\"",
    );
    let mut v = good.clone();
    set(&mut v, "/candidates/5/fields/C23", json!(-1));
    push(
        "negative id in a reject table (item)",
        &rank,
        v.to_string(),
        400,
        "candidates[5].fields.C23: id -1 is outside the vocabulary",
    );

    let mut v = good.clone();
    set(&mut v, "/user/dense/2", json!(1e39));
    push(
        "dense value beyond f32",
        &rank,
        v.to_string(),
        400,
        "user.dense[2]: must be a finite number, got inf",
    );
    let nan = good
        .to_string()
        .replacen("\"dense\":[", "\"dense\":[NaN,", 1);
    push(
        "NaN dense value",
        &rank,
        nan,
        400,
        "user.dense[0]: NaN is not a number JSON can carry (JSON has no NaN or Infinity)",
    );
    let inf = good
        .to_string()
        .replacen("\"dense\":[", "\"dense\":[Infinity,", 1);
    push(
        "Infinity dense value",
        &rank,
        inf,
        400,
        "user.dense[0]: Infinity is not a number JSON can carry",
    );
    let mut v = good.clone();
    set(&mut v, "/user/dense", json!([1.0, 2.0]));
    push(
        "too few dense values",
        &rank,
        v.to_string(),
        400,
        "user.dense: holds 2 values, but the model takes 13",
    );

    let mut v = good.clone();
    v["top_k"] = json!(0);
    push(
        "top_k zero",
        &rank,
        v.to_string(),
        400,
        "top_k: must be at least 1",
    );

    // The columnar form of the same request (columns in name order: C21 to C26), with one fault each.
    let columnar = to_columnar(good, None);
    let names: Vec<String> =
        serde_json::from_value(columnar["candidates"]["fields"].clone()).expect("names");
    let c23 = names
        .iter()
        .position(|n| n == "C23")
        .expect("C23 is a column");
    let columnar_faults: [(&str, Fault, String); 13] = [
        (
            "columnar: a user-side column",
            |v| set(v, "/candidates/fields/0", json!("C2")),
            "candidates.fields[0]: \"C2\" is a user-side field: send it in user.fields".to_owned(),
        ),
        (
            "columnar: an unknown column",
            |v| set(v, "/candidates/fields/1", json!("C99")),
            "candidates.fields[1]: \"C99\" is not a field of this model".to_owned(),
        ),
        (
            "columnar: the item id as a column",
            |v| set(v, "/candidates/fields/0", json!("C20")),
            "candidates.fields[0]: \"C20\" is the model's item_id_field: send it in candidates.id".to_owned(),
        ),
        (
            "columnar: a column named twice",
            |v| {
                let first = v["candidates"]["fields"][0].clone();
                set(v, "/candidates/fields/1", first);
            },
            format!("candidates.fields[1]: {:?} is given more than once", names[0]),
        ),
        (
            "columnar: a column left out",
            |v| {
                v["candidates"]["fields"].as_array_mut().expect("fields").pop();
                for row in v["candidates"]["ids"].as_array_mut().expect("ids") {
                    row.as_array_mut().expect("row").pop();
                }
            },
            format!("candidates.fields: {:?} is missing", names[names.len() - 1]),
        ),
        (
            "columnar: a short row",
            |v| {
                v["candidates"]["ids"][3].as_array_mut().expect("row").pop();
            },
            format!("candidates.ids[3]: holds {} ids, but a row holds {}", names.len() - 1, names.len()),
        ),
        (
            "columnar: an id its table rejects",
            |v| {
                let j = v["candidates"]["fields"]
                    .as_array()
                    .expect("fields")
                    .iter()
                    .position(|n| n == "C23")
                    .expect("C23");
                v["candidates"]["ids"][5][j] = json!(-1);
            },
            format!("candidates.ids[5][{c23}] (C23): id -1 is outside the vocabulary"),
        ),
        (
            "columnar: a string id",
            |v| v["candidates"]["ids"][3][2] = json!("seven"),
            format!("candidates.ids[3][2] ({}): invalid type: string \"seven\", expected i64", names[2]),
        ),
        (
            "columnar: no item ids",
            |v| remove(v, "/candidates/id"),
            "candidates.id: is required: it is the value of the model's item_id_field \"C20\"".to_owned(),
        ),
        (
            "columnar: an item id short",
            |v| {
                v["candidates"]["id"].as_array_mut().expect("id").pop();
            },
            "candidates.id: holds 99 ids, but candidates.ids holds 100 rows".to_owned(),
        ),
        (
            "columnar: too many rows",
            |v| {
                let (row, id) = (v["candidates"]["ids"][0].clone(), v["candidates"]["id"][0].clone());
                set(v, "/candidates/ids", Value::Array(vec![row; 1001]));
                set(v, "/candidates/id", Value::Array(vec![id; 1001]));
            },
            "candidates.ids: holds 1001 candidates, more than the limit of 1000".to_owned(),
        ),
        (
            "columnar: an unknown key",
            |v| v["candidates"]["score"] = json!(1),
            "candidates.score: unknown field `score`, expected `fields`, `ids`, `id` or `features`".to_owned(),
        ),
        (
            "columnar: candidates neither rows nor columns",
            |v| set(v, "/candidates", json!("all")),
            "candidates: invalid type: string \"all\", expected an array of candidates, or an object of columns"
                .to_owned(),
        ),
    ];
    for (what, fault, needle) in columnar_faults {
        let mut v = columnar.clone();
        fault(&mut v);
        push(what, &rank, v.to_string(), 400, &needle);
    }

    push(
        "unknown model",
        "/v1/models/nope/rank",
        good.to_string(),
        404,
        "model \"nope\" is not served",
    );
    push(
        "unknown version",
        "/v1/models/deepfm-fp32/versions/7/rank",
        good.to_string(),
        404,
        "model \"deepfm-fp32\" version 7 is not served (serving version 2)",
    );
    push(
        "ranking a model on an unknown route",
        "/v1/models/deepfm-fp32/score",
        good.to_string(),
        404,
        "no route for POST /v1/models/deepfm-fp32/score",
    );
    // 256 KiB limit in this test's server: a body over it.
    let mut v = good.clone();
    set(
        &mut v,
        "/candidates",
        Value::Array(vec![good["candidates"][0].clone(); 4000]),
    );
    push(
        "body over the size limit",
        &rank,
        v.to_string(),
        413,
        "the body is larger than the limit of 262144 bytes",
    );
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_named_4xx_while_good_ones_keep_their_answers() {
    let (good, expected) = good_case();
    let server = Arc::new(
        TestServer::start(config(&fixture_repo(), |a| {
            a.max_body_bytes = Some(256 * 1024);
            a.executors = Some(2);
        }))
        .await,
    );
    assert!(
        good.to_string().len() < 256 * 1024,
        "the good request fits the limit"
    );

    // Good traffic on four connections for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let mut clients = Vec::new();
    for _ in 0..4 {
        let (server, good, expected, stop, answered) = (
            Arc::clone(&server),
            good.clone(),
            expected.clone(),
            Arc::clone(&stop),
            Arc::clone(&answered),
        );
        clients.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let (status, body) = server.post("/v1/models/deepfm-fp32/rank", &good).await;
                assert_eq!(status, 200, "good request failed: {body}");
                let scores = body["scores"].as_array().expect("scores");
                assert_eq!(scores.len(), expected.len());
                for (i, s) in scores.iter().enumerate() {
                    assert_eq!(s["index"], i);
                    assert_eq!(s["id"], good["candidates"][i]["id"]);
                    let diff = (s["score"].as_f64().expect("score") - expected[i]).abs();
                    assert!(
                        diff <= 1e-5,
                        "good request got a wrong score at {i}: |diff| {diff:e}"
                    );
                }
                answered.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    for round in 0..3 {
        for (what, path, body, status, needle) in bad_requests(&good) {
            let (got, answer) = server.post_raw(&path, body).await;
            assert_eq!(got, status, "{what} (round {round}): {answer}");
            let message = answer["error"]
                .as_str()
                .unwrap_or_else(|| panic!("{what}: no error message in {answer}"));
            assert!(
                message.contains(&needle),
                "{what}: expected {needle:?} in {message:?}"
            );
        }
        // A bad deadline header is a 400 naming the header.
        let resp = server
            .client
            .post(server.url("/v1/models/deepfm-fp32/rank"))
            .header("x-recserve-deadline-ms", "soon")
            .body(good.to_string())
            .send()
            .await
            .expect("POST");
        assert_eq!(resp.status(), 400);
        let text = resp.text().await.expect("body");
        assert!(
            text.contains("x-recserve-deadline-ms: must be a whole number of milliseconds"),
            "{text}"
        );
    }

    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("good client never saw a wrong answer");
    }
    assert!(
        answered.load(Ordering::Relaxed) >= 4,
        "good traffic ran during the test"
    );
    let (_, metrics) = server.get("/metrics").await;
    assert!(
        metrics.contains(
            "recserve_requests_total{code=\"400\",endpoint=\"rank\",model=\"deepfm-fp32\""
        ),
        "bad requests are counted"
    );
    assert!(
        metrics.contains("recserve_requests_total{code=\"404\",endpoint=\"rank\",model=\"\""),
        "unknown models count under model=\"\""
    );
    Arc::into_inner(server)
        .expect("clients are done")
        .stop()
        .await
        .expect("clean shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_vocabulary_ids_in_default_tables_read_the_default_row_and_are_counted() {
    let all = cases();
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let (good, expected) = good_case();
    // C3 (user side) has oov = "default" with default_row = 1999 of 2000 rows: an unknown id scores exactly as
    // the default row's id does, for every candidate.
    let default_tables = &all["models"]["deepfm-fp32"]["oov"]["default"];
    let c3 = default_tables
        .as_array()
        .expect("default tables")
        .iter()
        .find(|t| t["table"] == "C3")
        .expect("C3 is a default table");
    let default_row = c3["default_row"].as_i64().expect("default_row");
    let rows = c3["rows"].as_i64().expect("rows");
    let mut with_default_row = good.clone();
    set(&mut with_default_row, "/user/fields/C3", json!(default_row));
    let (status, want) = server
        .post("/v1/models/deepfm-fp32/rank", &with_default_row)
        .await;
    assert_eq!(status, 200, "{want}");
    let metric = "recserve_embedding_oov_total{model=\"deepfm-fp32\",table=\"C3\"}";
    let count = |text: &str| -> u64 {
        text.lines()
            .find(|l| l.starts_with(metric))
            .and_then(|l| l.rsplit(' ').next())
            .map_or(0, |v| v.parse().expect("counter value"))
    };
    let before = count(&server.get("/metrics").await.1);
    for oov in [rows, rows + 12_345, -1, i64::MIN, i64::MAX] {
        let mut v = good.clone();
        set(&mut v, "/user/fields/C3", json!(oov));
        let (status, got) = server.post("/v1/models/deepfm-fp32/rank", &v).await;
        assert_eq!(status, 200, "{got}");
        assert_eq!(
            got["scores"], want["scores"],
            "id {oov} scores as the default row {default_row}"
        );
    }
    let after = count(&server.get("/metrics").await.1);
    // 5 requests, one OOV user-side id each: with the user side gathered once per request (--gather-user-once
    // on, the default), it is read and counted once per request, not once per candidate.
    assert!(expected.len() > 1);
    assert_eq!(after - before, 5);
    server.stop().await.expect("clean shutdown");
}
