//! End to end: several versions of one model serve at once (`[models.NAME] versions`), each addressable, and a
//! weighted traffic split, sticky by the request's routing key, shares the requests that name no version between
//! them; the split changes through the repository API without a restart, and a shadow version scores copies of
//! requests without its answers reaching anyone. The fixture's `deepfm-fp32` has two versions with the same
//! contract and different weights, so every answer's scores say which version computed it.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestServer, cases, config, fixture_dir, fixture_repo, metric_sample};
use serde_json::{Value, json};

const TOKEN: &str = "test-admin-token";
const MODEL: &str = "deepfm-fp32";

/// A config file: the fixture's pipelines, both versions of `deepfm-fp32` and `extra` (its traffic).
fn config_file(dir: &Path, extra: &str) -> PathBuf {
    let pipelines =
        std::fs::read_to_string(fixture_dir().join("recserve.toml")).expect("fixture config");
    let path = dir.join("recserve.toml");
    std::fs::write(
        &path,
        format!("{pipelines}\n[models.{MODEL}]\nversions = {{ latest = 2 }}\n{extra}"),
    )
    .expect("write config");
    path
}

async fn start(dir: &Path, extra: &str) -> TestServer {
    let token = dir.join("token");
    std::fs::write(&token, format!("{TOKEN}\n")).expect("write token");
    let file = config_file(dir, extra);
    TestServer::start(config(&fixture_repo(), |a| {
        a.config = Some(file);
        a.admin_token_file = Some(token);
    }))
    .await
}

/// The fixture's one-candidate rank request for version 1 of `deepfm-fp32`, and its expected score.
fn case() -> (Value, f64, f64) {
    let all = cases();
    let case = all["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["model"] == MODEL && c["version"] == 1 && c["what"] == "1 candidate")
        .expect("a one-candidate case of version 1");
    (
        case["request"].clone(),
        case["expected_scores"][0].as_f64().expect("score"),
        case["tolerance"].as_f64().expect("tolerance"),
    )
}

/// Each version's answer to `body`, asked for by version: version 1's checked against the fixture's reference.
/// The two differ, so a routed answer's score says which version computed it.
async fn scores_by_version(server: &TestServer) -> (Value, HashMap<u64, f64>) {
    let (body, want, tolerance) = case();
    let mut scores = HashMap::new();
    for version in [1, 2] {
        let path = format!("/v1/models/{MODEL}/versions/{version}/rank");
        let (answered, score) = rank(server, &path, None, &body).await;
        assert_eq!(answered, version);
        scores.insert(version, score);
    }
    assert!(
        (scores[&1] - want).abs() <= tolerance,
        "{} vs {want}",
        scores[&1]
    );
    assert!(
        (scores[&1] - scores[&2]).abs() > 1e-3,
        "the versions must score differently: {scores:?}"
    );
    (body, scores)
}

/// Sends the rank request for user `key` (routing key header), returns the version that answered and its score.
async fn rank(server: &TestServer, path: &str, key: Option<&str>, body: &Value) -> (u64, f64) {
    let mut post = server
        .client
        .post(server.url(path))
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(key) = key {
        post = post.header("x-recserve-routing-key", key);
    }
    let resp = post.send().await.expect("POST");
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.expect("json");
    (
        answer["version"].as_u64().expect("version"),
        answer["scores"][0]["score"].as_f64().expect("score"),
    )
}

async fn admin(server: &TestServer, method: reqwest::Method, body: Option<Value>) -> (u16, Value) {
    let mut request = server
        .client
        .request(
            method,
            server.url(&format!("/v2/repository/models/{MODEL}/traffic")),
        )
        .header("authorization", format!("Bearer {TOKEN}"));
    if let Some(body) = body {
        request = request.body(body.to_string());
    }
    let resp = request.send().await.expect("traffic call");
    let status = resp.status().as_u16();
    (status, resp.json().await.expect("json"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_90_10_split_lands_within_two_points_and_each_user_stays_on_one_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = Arc::new(
        start(
            dir.path(),
            &format!("[models.{MODEL}.traffic]\n1 = 90\n2 = 10\n"),
        )
        .await,
    );
    let (body, expected) = scores_by_version(&server).await;
    let body = Arc::new(body);

    // 2,000 users, 5 requests each: 10,000 requests, 16 at a time.
    let users = 2_000;
    let mut tasks = tokio::task::JoinSet::new();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    for _ in 0..16 {
        let (server, body, next) = (Arc::clone(&server), Arc::clone(&body), Arc::clone(&next));
        tasks.spawn(async move {
            let mut seen = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= users * 5 {
                    return seen;
                }
                let user = format!("user-{}", i % users);
                let path = format!("/v1/models/{MODEL}/rank");
                let (version, score) = rank(&server, &path, Some(&user), &body).await;
                seen.push((user, version, score));
            }
        });
    }
    let mut by_user: HashMap<String, u64> = HashMap::new();
    let mut on_version: HashMap<u64, usize> = HashMap::new();
    let mut total = 0;
    while let Some(seen) = tasks.join_next().await {
        for (user, version, score) in seen.expect("client task") {
            // Within 1e-6: batches of other sizes may round the last bit differently (docs/api.md).
            assert!(
                (score - expected[&version]).abs() <= 1e-6,
                "version {version} answered {score}; asked by name it answers {}",
                expected[&version]
            );
            let first = *by_user.entry(user.clone()).or_insert(version);
            assert_eq!(
                first, version,
                "{user} moved from version {first} to {version}"
            );
            *on_version.entry(version).or_default() += 1;
            total += 1;
        }
    }
    assert_eq!(total, 10_000);
    let share_2 = on_version.get(&2).copied().unwrap_or(0) as f64 / total as f64;
    println!(
        "10,000 requests at 90/10: version 1 {}, version 2 {} ({:.2}%)",
        on_version[&1],
        on_version[&2],
        share_2 * 100.0
    );
    assert!(
        (0.08..=0.12).contains(&share_2),
        "version 2 took {:.2}% of the requests, not 10 ± 2",
        share_2 * 100.0
    );

    // Each version's requests are counted under its own label (with the one that asked for it by name first).
    let (_, metrics) = server.get("/metrics").await;
    for (version, count) in &on_version {
        let series = format!(
            "recserve_requests_total{{code=\"200\",endpoint=\"rank\",model=\"{MODEL}\",pipeline=\"\",protocol=\"v1\",version=\"{version}\"}}"
        );
        assert_eq!(
            metric_sample(&metrics, &series),
            (count + 1) as f64,
            "{series}"
        );
    }

    // A request that names a version gets it, whatever the split.
    for version in [1, 2] {
        let path = format!("/v1/models/{MODEL}/versions/{version}/rank");
        let (answered, score) = rank(&server, &path, Some("user-1"), &body).await;
        assert_eq!((answered, score), (version, expected[&version]));
    }
    let (status, missing) = server
        .post(&format!("/v1/models/{MODEL}/versions/3/rank"), &body)
        .await;
    assert_eq!(status, 404);
    assert_eq!(
        missing["error"],
        format!("model \"{MODEL}\" version 3 is not served (serving versions 1, 2)")
    );

    // KServe's metadata lists both versions; the repository index has a line for each.
    let (_, metadata) = server.get(&format!("/v2/models/{MODEL}")).await;
    let metadata: Value = serde_json::from_str(&metadata).expect("json");
    assert_eq!(metadata["versions"], json!(["1", "2"]));
    let index: Value = server
        .client
        .post(server.url("/v2/repository/index"))
        .header("authorization", format!("Bearer {TOKEN}"))
        .send()
        .await
        .expect("index")
        .json()
        .await
        .expect("json");
    let ours: Vec<&Value> = index
        .as_array()
        .expect("entries")
        .iter()
        .filter(|e| e["name"] == MODEL)
        .collect();
    assert_eq!(
        ours.iter()
            .map(|e| e["version"].clone())
            .collect::<Vec<_>>(),
        [json!("1"), json!("2")]
    );
    let (_, config) = server.get(&format!("/v2/models/{MODEL}/config")).await;
    let config: Value = serde_json::from_str(&config).expect("json");
    assert_eq!(
        config["version_policy"],
        json!({"latest": {"num_versions": 2}})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_split_changes_through_the_repository_api_and_moves_only_the_users_it_must() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(dir.path(), "").await;
    let (body, _, _) = case();
    let path = format!("/v1/models/{MODEL}/rank");

    let (status, view) = admin(&server, reqwest::Method::GET, None).await;
    assert_eq!(status, 200);
    assert_eq!(
        view,
        json!({"model": MODEL, "versions": [1, 2], "split": {}})
    );
    for user in 0..50 {
        let key = format!("u{user}");
        assert_eq!(
            rank(&server, &path, Some(&key), &body).await.0,
            2,
            "no split: the highest"
        );
    }

    let (status, view) = admin(
        &server,
        reqwest::Method::PUT,
        Some(json!({"split": {"1": 50, "2": 50}})),
    )
    .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["split"], json!({"1": 50, "2": 50}));
    let mut half = HashMap::new();
    for user in 0..400 {
        let key = format!("u{user}");
        half.insert(key.clone(), rank(&server, &path, Some(&key), &body).await.0);
    }
    let on_1 = half.values().filter(|&&v| v == 1).count();
    assert!(
        (150..=250).contains(&on_1),
        "{on_1} of 400 users on version 1 at 50/50"
    );

    // 50/50 → 25/75: users of version 2 stay; about half of version 1's move.
    let (status, _) = admin(
        &server,
        reqwest::Method::PUT,
        Some(json!({"split": {"1": 25, "2": 75}})),
    )
    .await;
    assert_eq!(status, 200);
    let mut moved = 0;
    for (key, before) in &half {
        let now = rank(&server, &path, Some(key), &body).await.0;
        if *before == 2 {
            assert_eq!(now, 2, "{key} was on version 2 and must stay");
        } else if now == 2 {
            moved += 1;
        }
    }
    assert!(
        moved > 0 && moved < on_1,
        "{moved} of {on_1} users of version 1 moved"
    );

    // Bad changes name the field; a change without the token is refused.
    let (status, error) = admin(
        &server,
        reqwest::Method::PUT,
        Some(json!({"split": {"7": 1}})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        error["error"],
        format!("split.7: version 7 of model \"{MODEL}\" is not loaded (loaded: [1, 2])")
    );
    let (status, error) = admin(
        &server,
        reqwest::Method::PUT,
        Some(json!({"split": {"01": 1}})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        error["error"],
        "split.01: \"01\" is not a version (an integer ≥ 1)"
    );
    let (status, error) = admin(
        &server,
        reqwest::Method::PUT,
        Some(json!({"split": {"1": 0}})),
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(
        error["error"],
        "split: every weight is 0: at least one version must take traffic"
    );
    let unauthorized = server
        .client
        .put(server.url(&format!("/v2/repository/models/{MODEL}/traffic")))
        .body("{}")
        .send()
        .await
        .expect("PUT");
    assert_eq!(unauthorized.status(), 401);

    // `{}` clears it: the highest again.
    let (status, view) = admin(&server, reqwest::Method::PUT, Some(json!({}))).await;
    assert_eq!((status, view["split"].clone()), (200, json!({})));
    assert_eq!(rank(&server, &path, Some("u1"), &body).await.0, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shadow_version_scores_copies_that_reach_no_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(
        dir.path(),
        &format!("shadow = {{ version = 1, percent = 100 }}\n[models.{MODEL}.traffic]\n2 = 1\n"),
    )
    .await;
    let (body, expected) = scores_by_version(&server).await;
    let path = format!("/v1/models/{MODEL}/rank");
    let n = 40;
    for user in 0..n {
        let key = format!("u{user}");
        let (version, score) = rank(&server, &path, Some(&key), &body).await;
        assert_eq!(
            (version, score),
            (2, expected[&2]),
            "the answer is the primary's"
        );
    }
    let scored = format!(
        "recserve_shadow_requests_total{{model=\"{MODEL}\",outcome=\"scored\",version=\"1\"}}"
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, metrics) = server.get("/metrics").await;
        if metrics.contains(&scored) && metric_sample(&metrics, &scored) == f64::from(n) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "shadow copies not all scored:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, metrics) = server.get("/metrics").await;
    assert_eq!(
        metric_sample(
            &metrics,
            &format!(
                "recserve_requests_total{{code=\"200\",endpoint=\"rank\",model=\"{MODEL}\",pipeline=\"\",protocol=\"v1\",version=\"2\"}}"
            )
        ),
        f64::from(n + 1),
        "only the primary's answers count as requests (and the one that asked for version 2 by name)"
    );
    let (status, view) = admin(&server, reqwest::Method::GET, None).await;
    assert_eq!(status, 200);
    assert_eq!(view["shadow"], json!({"version": 1, "percent": 100.0}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pipeline_routes_its_ranking_model_by_the_split_and_checks_every_version() {
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("repo");
    common::copy_dir(&fixture_repo(), &repo);
    common::copy_dir(
        &fixture_repo().join("deepfm-items/1"),
        &repo.join("deepfm-items/2"),
    );
    let pipelines =
        std::fs::read_to_string(fixture_dir().join("recserve.toml")).expect("fixture config");
    let file = dir.path().join("recserve.toml");
    std::fs::write(
        &file,
        format!(
            "{pipelines}\n[models.deepfm-items]\nversions = {{ specific = [1, 2] }}\n\
             [models.deepfm-items.traffic]\n1 = 1\n2 = 1\n"
        ),
    )
    .expect("write config");
    let server = TestServer::start(config(&repo, |a| a.config = Some(file))).await;
    let body =
        json!({"user_id": 3, "user": {"fields": {"age": 2, "city": 7}, "dense": [13.0, 2.0]}});
    let mut seen = HashMap::new();
    for user in 0..60 {
        let key = format!("u{user}");
        let resp = server
            .client
            .post(server.url("/v1/recommend/fixture"))
            .header("x-recserve-routing-key", &key)
            .json(&body)
            .send()
            .await
            .expect("POST");
        assert_eq!(resp.status(), 200);
        let answer: Value = resp.json().await.expect("json");
        let version = answer["ranking_model"]["version"]
            .as_u64()
            .expect("version");
        *seen.entry(version).or_insert(0) += 1;
        // The same items either way: both versions are the same model.
        assert_eq!(answer["items"].as_array().map(Vec::len), Some(5));
    }
    assert_eq!(seen.len(), 2, "both ranking versions answer: {seen:?}");

    // A pipeline whose second ranking version would not run is refused at start, naming the version.
    let broken = dir.path().join("broken");
    common::copy_dir(&repo, &broken);
    std::fs::remove_dir_all(broken.join("deepfm-items/2")).expect("rm");
    common::copy_dir(
        &fixture_repo().join("deepfm-fp32/1"),
        &broken.join("deepfm-items/2"),
    );
    let file = dir.path().join("broken.toml");
    std::fs::write(
        &file,
        format!("{pipelines}\n[models.deepfm-items]\nversions = {{ latest = 2 }}\n"),
    )
    .expect("write config");
    let server = TestServer::spawn(config(&broken, |a| a.config = Some(file))).await;
    let error = server.finished().await.expect_err("refused").to_string();
    assert!(
        error.contains("pipeline \"fixture\"") && error.contains("ranking_model version 2"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grpc_requests_are_routed_by_their_metadata_as_http_ones_by_their_header() {
    use recserve::api::kserve::grpc::proto;
    use recserve::api::kserve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;

    let dir = tempfile::tempdir().expect("tempdir");
    let server = start(
        dir.path(),
        &format!("[models.{MODEL}.traffic]\n1 = 1\n2 = 1\n"),
    )
    .await;
    let (body, _, _) = case();
    // The case's one row in graph order (fields C1..C26: the user's, the candidate's id, its other fields).
    let user = &body["user"]["fields"];
    let candidate = &body["candidates"][0];
    let mut ids: Vec<i64> = (1..=19)
        .map(|i| user[format!("C{i}")].as_i64().expect("id"))
        .collect();
    ids.push(candidate["id"].as_i64().expect("id"));
    ids.extend((21..=26).map(|i| candidate["fields"][format!("C{i}")].as_i64().expect("id")));
    let dense: Vec<f32> = body["user"]["dense"]
        .as_array()
        .expect("dense")
        .iter()
        .map(|v| v.as_f64().expect("value") as f32)
        .collect();
    let tensor = |name: &str, datatype: &str, shape: Vec<i64>| {
        proto::model_infer_request::InferInputTensor {
            name: name.to_owned(),
            datatype: datatype.to_owned(),
            shape,
            parameters: HashMap::new(),
            contents: None,
        }
    };
    let mut client = GrpcInferenceServiceClient::connect(server.grpc_url())
        .await
        .expect("connect");
    let mut seen = HashMap::new();
    for user in 0..40 {
        let key = format!("u{user}");
        let mut request = tonic::Request::new(proto::ModelInferRequest {
            model_name: MODEL.to_owned(),
            inputs: vec![
                tensor("categorical", "INT64", vec![1, ids.len() as i64]),
                tensor("dense", "FP32", vec![1, dense.len() as i64]),
            ],
            raw_input_contents: vec![
                ids.iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
                dense
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>()
                    .into(),
            ],
            ..Default::default()
        });
        request
            .metadata_mut()
            .insert("x-recserve-routing-key", key.parse().expect("ascii"));
        let answer = client
            .model_infer(request)
            .await
            .expect("infer")
            .into_inner();
        let version: u64 = answer.model_version.parse().expect("a version");
        let http = rank(
            &server,
            &format!("/v1/models/{MODEL}/rank"),
            Some(&key),
            &body,
        )
        .await
        .0;
        assert_eq!(
            version, http,
            "{key}: gRPC and HTTP route the same key alike"
        );
        *seen.entry(version).or_insert(0) += 1;
    }
    assert_eq!(seen.len(), 2, "both versions answer: {seen:?}");
}
