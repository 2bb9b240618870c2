//! End to end: the compact forms of a ranking request, on a real server over the generated test repository. `/v1`
//! rank's columnar form (the item fields named once, the candidates' ids as a matrix) answers every fixture case
//! with exactly the bytes the row form answers, whatever the order of its columns and keys. The KServe v2 grouped
//! form (each user's fields once, `candidates_per_user` rows each) scores the same rows as the row form bit for
//! bit, over HTTP with JSON and with binary tensors and over gRPC with raw and typed contents, one user or several
//! per request; the grouped inputs are found in the model metadata's `properties`; its errors name the tensor.

mod common;

use std::collections::HashMap;

use common::{TestServer, cases, config, fixture_repo};
use recserve::api::kserve::grpc::proto::grpc_inference_service_client::GrpcInferenceServiceClient;
use recserve::api::kserve::grpc::proto::model_infer_request::InferInputTensor;
use recserve::api::kserve::grpc::proto::{self, InferTensorContents, ModelMetadataRequest};
use recserve::testing::rank_reference::to_columnar;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

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

/// One request's candidates for KServe: users (each with its ids by name, its dense features and its
/// candidates), as both forms send them.
struct Users {
    model: String,
    /// Per user: its row-form request (`user` and `candidates`).
    requests: Vec<Value>,
}

/// A model's tensor columns: the row form's (metadata `inputs`) and the grouped form's (metadata `properties`).
struct Columns {
    all: Vec<String>,
    user: Vec<String>,
    item: Vec<String>,
    item_id_field: Option<String>,
    output: String,
}

impl Users {
    /// The id `name` of `candidate` of the user of `request`.
    fn id(columns: &Columns, request: &Value, candidate: &Value, name: &str) -> i64 {
        let v = if Some(name) == columns.item_id_field.as_deref() {
            &candidate["id"]
        } else if let Some(v) = request["user"]["fields"].get(name) {
            v
        } else {
            &candidate["fields"][name]
        };
        v.as_i64().unwrap_or_else(|| panic!("no id for {name}"))
    }

    fn dense(request: &Value) -> Vec<f32> {
        request["user"]["dense"]
            .as_array()
            .expect("dense")
            .iter()
            .map(|v| v.as_f64().expect("number") as f32)
            .collect()
    }

    fn candidates(request: &Value) -> &Vec<Value> {
        request["candidates"].as_array().expect("candidates")
    }

    fn rows(&self) -> usize {
        self.requests
            .iter()
            .map(|r| Self::candidates(r).len())
            .sum()
    }

    /// The row form: `categorical` `[B, F]`, `dense` `[B, N]`.
    fn row_tensors(&self, columns: &Columns) -> Vec<Tensor> {
        let (mut ids, mut dense) = (Vec::new(), Vec::new());
        for r in &self.requests {
            for c in Self::candidates(r) {
                ids.extend(columns.all.iter().map(|n| Self::id(columns, r, c, n)));
                dense.extend(Self::dense(r));
            }
        }
        let b = self.rows();
        vec![
            Tensor::int64("categorical", vec![b, columns.all.len()], ids),
            Tensor::fp32("dense", vec![b, dense.len() / b], dense),
        ]
    }

    /// The grouped form: `user_categorical` `[U, Fu]`, `user_dense` `[U, N]`, `item_categorical` `[B, Fi]` and,
    /// for more than one user, `candidates_per_user` `[U]`.
    fn grouped_tensors(&self, columns: &Columns) -> Vec<Tensor> {
        let (mut user, mut dense, mut item, mut counts) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in &self.requests {
            let first = &Self::candidates(r)[0];
            user.extend(columns.user.iter().map(|n| Self::id(columns, r, first, n)));
            dense.extend(Self::dense(r));
            for c in Self::candidates(r) {
                item.extend(columns.item.iter().map(|n| Self::id(columns, r, c, n)));
            }
            counts.push(Self::candidates(r).len() as i64);
        }
        let users = self.requests.len();
        let mut tensors = vec![
            Tensor::int64("user_categorical", vec![users, columns.user.len()], user),
            Tensor::fp32("user_dense", vec![users, dense.len() / users], dense),
            Tensor::int64(
                "item_categorical",
                vec![self.rows(), columns.item.len()],
                item,
            ),
        ];
        if users > 1 {
            tensors.push(Tensor::int64("candidates_per_user", vec![users], counts));
        }
        tensors
    }
}

/// An input tensor with its values.
#[derive(Clone)]
struct Tensor {
    name: String,
    shape: Vec<usize>,
    data: Data,
}

#[derive(Clone)]
enum Data {
    Int64(Vec<i64>),
    Fp32(Vec<f32>),
}

impl Tensor {
    fn int64(name: &str, shape: Vec<usize>, values: Vec<i64>) -> Tensor {
        Tensor {
            name: name.to_owned(),
            shape,
            data: Data::Int64(values),
        }
    }

    fn fp32(name: &str, shape: Vec<usize>, values: Vec<f32>) -> Tensor {
        Tensor {
            name: name.to_owned(),
            shape,
            data: Data::Fp32(values),
        }
    }

    fn datatype(&self) -> &'static str {
        match self.data {
            Data::Int64(_) => "INT64",
            Data::Fp32(_) => "FP32",
        }
    }

    fn json_data(&self) -> Value {
        match &self.data {
            Data::Int64(v) => json!(v),
            Data::Fp32(v) => json!(v),
        }
    }

    fn le_bytes(&self) -> Vec<u8> {
        match &self.data {
            Data::Int64(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            Data::Fp32(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
        }
    }

    fn grpc(&self, typed: bool) -> InferInputTensor {
        InferInputTensor {
            name: self.name.clone(),
            datatype: self.datatype().to_owned(),
            shape: self.shape.iter().map(|&d| d as i64).collect(),
            parameters: HashMap::new(),
            contents: typed.then(|| match &self.data {
                Data::Int64(v) => InferTensorContents {
                    int64_contents: v.clone(),
                    ..Default::default()
                },
                Data::Fp32(v) => InferTensorContents {
                    fp32_contents: v.clone(),
                    ..Default::default()
                },
            }),
        }
    }
}

fn f32_bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn le_f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// The scores of `tensors` over HTTP with JSON data (`Err`: the status and error message).
async fn http_json(
    server: &TestServer,
    model: &str,
    tensors: &[Tensor],
) -> Result<Vec<f32>, (u16, String)> {
    let inputs: Vec<Value> = tensors
        .iter()
        .map(|t| json!({"name": t.name, "datatype": t.datatype(), "shape": t.shape, "data": t.json_data()}))
        .collect();
    let (status, body) = server
        .post(
            &format!("/v2/models/{model}/infer"),
            &json!({"inputs": inputs}),
        )
        .await;
    if status != 200 {
        return Err((
            status,
            body["error"].as_str().unwrap_or_default().to_owned(),
        ));
    }
    Ok(body["outputs"][0]["data"]
        .as_array()
        .expect("scores")
        .iter()
        .map(|v| v.as_f64().expect("score") as f32)
        .collect())
}

/// The scores of `tensors` over HTTP with binary data both ways.
async fn http_binary(server: &TestServer, model: &str, tensors: &[Tensor]) -> Vec<f32> {
    let inputs: Vec<Value> = tensors
        .iter()
        .map(|t| {
            json!({"name": t.name, "datatype": t.datatype(), "shape": t.shape,
                   "parameters": {"binary_data_size": t.le_bytes().len()}})
        })
        .collect();
    let header = json!({"inputs": inputs, "parameters": {"binary_data_output": true}}).to_string();
    let mut body = header.clone().into_bytes();
    for t in tensors {
        body.extend(t.le_bytes());
    }
    let resp = server
        .client
        .post(server.url(&format!("/v2/models/{model}/infer")))
        .header("Inference-Header-Content-Length", header.len())
        .body(body)
        .send()
        .await
        .expect("POST");
    assert_eq!(resp.status(), 200);
    let length: usize = resp.headers()["inference-header-content-length"]
        .to_str()
        .expect("header")
        .parse()
        .expect("length");
    let bytes = resp.bytes().await.expect("body");
    le_f32s(&bytes[length..])
}

/// The scores of `tensors` over gRPC, with raw or typed contents (`Err`: the status).
async fn grpc(
    client: &mut GrpcInferenceServiceClient<Channel>,
    model: &str,
    tensors: &[Tensor],
    typed: bool,
) -> Result<Vec<f32>, tonic::Status> {
    let request = proto::ModelInferRequest {
        model_name: model.to_owned(),
        inputs: tensors.iter().map(|t| t.grpc(typed)).collect(),
        raw_input_contents: if typed {
            Vec::new()
        } else {
            tensors.iter().map(|t| t.le_bytes().into()).collect()
        },
        ..Default::default()
    };
    let response = client.model_infer(request).await?.into_inner();
    Ok(if typed {
        response.outputs[0]
            .contents
            .as_ref()
            .expect("typed contents")
            .fp32_contents
            .clone()
    } else {
        le_f32s(&response.raw_output_contents[0])
    })
}

/// A model's columns from its metadata, checked against the fixture's description of the model.
async fn columns(server: &TestServer, model: &str) -> Columns {
    let (status, text) = server.get(&format!("/v2/models/{model}")).await;
    assert_eq!(status, 200, "{text}");
    let metadata: Value = serde_json::from_str(&text).expect("metadata");
    let names = |v: &Value| -> Vec<String> { serde_json::from_value(v.clone()).expect("names") };
    // Generic clients read the row form from `inputs`; the grouped form is in `properties`.
    let inputs: Vec<&str> = metadata["inputs"]
        .as_array()
        .expect("inputs")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(inputs, ["categorical", "dense"], "{model}");
    let grouped: Value = serde_json::from_str(
        metadata["properties"]["grouped_inputs"]
            .as_str()
            .expect("grouped_inputs"),
    )
    .expect("grouped_inputs is JSON");
    let grouped_names: Vec<&str> = grouped
        .as_array()
        .expect("array")
        .iter()
        .map(|t| t["name"].as_str().expect("name"))
        .collect();
    assert_eq!(
        grouped_names,
        [
            "user_categorical",
            "user_dense",
            "item_categorical",
            "candidates_per_user"
        ],
        "{model}"
    );
    let info = &cases()["models"][model];
    let (user, item) = (names(&grouped[0]["columns"]), names(&grouped[2]["columns"]));
    assert_eq!(json!(user), info["user_fields"], "{model}: user columns");
    assert_eq!(json!(item), info["item_fields"], "{model}: item columns");
    assert_eq!(grouped[0]["shape"], json!([-1, user.len()]));
    assert_eq!(grouped[2]["shape"], json!([-1, item.len()]));
    assert_eq!(grouped[1]["datatype"], "FP32");
    Columns {
        all: names(&metadata["inputs"][0]["columns"]),
        user,
        item,
        item_id_field: info["item_id_field"].as_str().map(str::to_owned),
        output: metadata["outputs"][0]["name"]
            .as_str()
            .expect("output")
            .to_owned(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grouped_tensors_score_their_rows_bit_for_bit_over_every_encoding() {
    let server = TestServer::start(config(&fixture_repo(), |_| {})).await;
    let mut client = GrpcInferenceServiceClient::connect(server.grpc_url())
        .await
        .expect("gRPC connect");
    // Every case alone (one user), and per model the small cases together (several users in one request).
    let mut jobs: Vec<Users> = Vec::new();
    let mut small: HashMap<String, Vec<Value>> = HashMap::new();
    for (model, _, request) in served_cases() {
        if Users::candidates(&request).len() <= 20 {
            small
                .entry(model.clone())
                .or_default()
                .push(request.clone());
        }
        jobs.push(Users {
            model,
            requests: vec![request],
        });
    }
    let mut several = 0;
    for (model, requests) in small {
        assert!(requests.len() >= 3, "{model}: small cases");
        several += 1;
        jobs.push(Users { model, requests });
    }
    assert_eq!(several, 3);

    let mut models: HashMap<String, Columns> = HashMap::new();
    for job in &jobs {
        if !models.contains_key(&job.model) {
            models.insert(job.model.clone(), columns(&server, &job.model).await);
        }
        let columns = &models[&job.model];
        let what = format!("{} with {} users", job.model, job.requests.len());
        let rows = job.row_tensors(columns);
        let expected = http_json(&server, &job.model, &rows)
            .await
            .expect("the row form");
        assert_eq!(expected.len(), job.rows(), "{what}");
        let grouped = job.grouped_tensors(columns);
        let got = [
            (
                "HTTP JSON",
                http_json(&server, &job.model, &grouped)
                    .await
                    .expect("grouped over HTTP JSON"),
            ),
            (
                "HTTP binary",
                http_binary(&server, &job.model, &grouped).await,
            ),
            (
                "gRPC raw",
                grpc(&mut client, &job.model, &grouped, false)
                    .await
                    .expect("grouped over gRPC raw"),
            ),
            (
                "gRPC typed",
                grpc(&mut client, &job.model, &grouped, true)
                    .await
                    .expect("grouped over gRPC typed"),
            ),
        ];
        for (how, scores) in got {
            assert_eq!(f32_bits(&scores), f32_bits(&expected), "{what} over {how}");
        }
    }

    // The metadata over gRPC says the same; errors name the tensor over both transports.
    let metadata = client
        .model_metadata(ModelMetadataRequest {
            name: "deepfm-fp32".into(),
            version: String::new(),
        })
        .await
        .expect("metadata")
        .into_inner();
    let grouped: Value = serde_json::from_str(&metadata.properties["grouped_inputs"])
        .expect("grouped_inputs is JSON");
    assert_eq!(grouped[2]["name"], "item_categorical");
    let columns = &models["deepfm-fp32"];
    assert_eq!(columns.output, "probability");
    let two = jobs
        .iter()
        .find(|j| j.model == "deepfm-fp32" && j.requests.len() > 1)
        .expect("several users");
    let grouped = two.grouped_tensors(columns);
    let without_counts: Vec<Tensor> = grouped
        .iter()
        .filter(|t| t.name != "candidates_per_user")
        .cloned()
        .collect();
    let mut mixed = grouped.clone();
    mixed.push(two.row_tensors(columns)[0].clone());
    let mut bad_id = grouped.clone();
    let c23 = columns
        .item
        .iter()
        .position(|n| n == "C23")
        .expect("C23, an item field of a reject table");
    if let Data::Int64(ids) = &mut bad_id[2].data {
        ids[columns.item.len() + c23] = -1;
    }
    let users = two.requests.len();
    let cases: [(&str, Vec<Tensor>, String); 3] = [
        (
            "mixed forms",
            mixed,
            "user_categorical: is an input of the grouped form, but the request also sends categorical, an input \
             of the row form"
                .to_owned(),
        ),
        (
            "no candidates_per_user",
            without_counts,
            format!("candidates_per_user: is missing: user_categorical holds {users} users"),
        ),
        (
            "an id its table rejects",
            bad_id,
            format!("item_categorical[1, {c23}]: field \"C23\": id -1 is outside the vocabulary of table \"C23\""),
        ),
    ];
    for (what, tensors, message) in cases {
        let (status, got) = http_json(&server, "deepfm-fp32", &tensors)
            .await
            .expect_err(what);
        assert_eq!(status, 400, "{what}");
        assert!(got.starts_with(&message), "{what} over HTTP: {got:?}");
        let status = grpc(&mut client, "deepfm-fp32", &tensors, false)
            .await
            .expect_err(what);
        assert_eq!(status.code(), Code::InvalidArgument, "{what}");
        assert!(
            status.message().starts_with(&message),
            "{what} over gRPC: {:?}",
            status.message()
        );
    }
    server.stop().await.expect("clean shutdown");
}
