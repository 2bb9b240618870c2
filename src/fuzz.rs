//! Property-based fuzzing (proptest) of what clients and operators hand the server: the `/v1` rank decoder (and its
//! agreement with the plain reference decoder, in [`rank`]), the `/v1` recall decoder, the KServe HTTP decoder (JSON, and JSON
//! followed by binary tensors) with the tensor conversion and the two kinds' tensor contracts behind it,
//! `model.toml` parsing, and the repository API's bodies and model names. Any input must give a value or a clear error (a message of bounded length), never a panic.
//! The recall contract's checks are fuzzed in the core crate (`recall/tests.rs`), with the same harness ([`run`]).
//!
//! Inputs are of two kinds: arbitrary bytes or text, and near-valid ones (a valid request or file in which some
//! values, members or bytes are replaced, dropped or cut), which reach the checks behind the parser. Each target
//! tries [`cases`] inputs (`RECSERVE_FUZZ_CASES`, default [`DEFAULT_CASES`]), so the suite's run stays within
//! seconds; set it higher for a longer search. A failure prints the smallest input proptest shrank it to.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue};
use proptest::collection::vec;
use proptest::prelude::*;
pub(crate) use recserve_core::testing::fuzz::{Outcome, clear, run};

// Test code, as this whole module is; said again so that tests/module_layers.rs counts the file as test code too.
#[cfg(test)]
mod rank;

/// A JSON value that a client could send, as text: every kind of value, numbers JSON has no room for (NaN,
/// 1e400, integers beyond 64 bits), long strings, escapes.
pub(crate) fn json_leaf() -> BoxedStrategy<String> {
    prop_oneof![
        3 => (-20i64..1100).prop_map(|n| n.to_string()),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => any::<u64>().prop_map(|n| n.to_string()),
        1 => any::<f64>().prop_map(|x| format!("{x:?}")),
        1 => prop::sample::select(vec![
            "null", "true", "false", "NaN", "Infinity", "-Infinity", "1e400", "-1e400", "1e39", "-0", "0.5",
            "2.5e-3", "1E5", "18446744073709551616", "-9223372036854775809", "9223372036854775807", "\"\"",
            "\"\\u0075\"", "\"\\ud800\"", "[]", "{}", "01", "1.", "-", "+1", ".5", "nan", "\"7\"",
        ])
        .prop_map(str::to_owned),
        1 => "[a-z0-9_ \"\\\\é]{0,12}".prop_map(|s| serde_json::to_string(&s).unwrap_or_default()),
        1 => (1usize..400).prop_map(|n| "9".repeat(n)),
        1 => (1usize..3000).prop_map(|n| format!("\"{}\"", "k".repeat(n))),
    ]
    .boxed()
}

/// JSON text of any shape, with keys mostly from `keys`.
pub(crate) fn json_text(keys: &'static [&'static str]) -> BoxedStrategy<String> {
    let key = prop_oneof![
        4 => prop::sample::select(keys).prop_map(str::to_owned),
        1 => "[a-zA-Z_]{0,8}",
        1 => (100usize..3000).prop_map(|n| "z".repeat(n)),
    ];
    json_leaf()
        .prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                vec(inner.clone(), 0..6).prop_map(|items| format!("[{}]", items.join(","))),
                vec((key.clone(), inner), 0..6).prop_map(|members| {
                    let members: Vec<String> = members
                        .into_iter()
                        .map(|(k, v)| {
                            format!("{}:{v}", serde_json::to_string(&k).unwrap_or_default())
                        })
                        .collect();
                    format!("{{{}}}", members.join(","))
                }),
            ]
        })
        .boxed()
}

/// `value` mostly, now and then any JSON value: a valid request with a fault here and there.
pub(crate) fn mostly(value: BoxedStrategy<String>) -> BoxedStrategy<String> {
    prop_oneof![40 => value, 1 => json_leaf()].boxed()
}

/// Applies, to a third of the texts, a few byte-level faults: a cut, a byte changed, a byte inserted.
pub(crate) fn damaged(text: BoxedStrategy<String>) -> BoxedStrategy<Vec<u8>> {
    let faults = prop_oneof![
        2 => Just(Vec::new()),
        1 => vec((0usize..3, any::<usize>(), any::<u8>()), 1..3),
    ];
    (text, faults)
        .prop_map(|(text, faults)| {
            let mut bytes = text.into_bytes();
            for (kind, at, byte) in faults {
                let at = if bytes.is_empty() {
                    0
                } else {
                    at % bytes.len()
                };
                match kind {
                    0 => bytes.truncate(at),
                    1 if !bytes.is_empty() => bytes[at] = byte,
                    _ => bytes.insert(at, byte),
                }
            }
            bytes
        })
        .boxed()
}

/// An object of `members` (each a key and a value), some left out.
fn object(members: Vec<(&'static str, BoxedStrategy<String>)>) -> BoxedStrategy<String> {
    let parts: Vec<BoxedStrategy<Option<String>>> = members
        .into_iter()
        .map(|(key, value)| {
            prop_oneof![
                40 => value.prop_map(move |v| Some(format!("\"{key}\":{v}"))),
                1 => Just(None),
            ]
            .boxed()
        })
        .collect();
    parts
        .prop_map(|parts| {
            format!(
                "{{{}}}",
                parts.into_iter().flatten().collect::<Vec<_>>().join(",")
            )
        })
        .boxed()
}

fn array(item: BoxedStrategy<String>, len: std::ops::Range<usize>) -> BoxedStrategy<String> {
    vec(item, len)
        .prop_map(|items| format!("[{}]", items.join(",")))
        .boxed()
}

fn int(range: std::ops::Range<i64>) -> BoxedStrategy<String> {
    mostly(range.prop_map(|n| n.to_string()).boxed())
}

fn float() -> BoxedStrategy<String> {
    mostly((-100.0f32..100.0).prop_map(|x| format!("{x:?}")).boxed())
}

#[test]
fn fuzz_recall_decoder_answers_every_body() {
    use crate::api::envelope::parse_json;
    use crate::api::v1::recall::{RecallRequest, recall_input};
    let ids = || array(int(0..50), 1..5);
    let query = prop_oneof![
        ("user_id", int(0..10)).prop_map(|(key, id)| format!("\"{key}\":{id}")),
        ("history", mostly(ids())).prop_map(|(key, ids)| format!("\"{key}\":{ids}")),
        Just(String::new()),
        Just("\"user_id\":1,\"history\":[1]".to_owned()),
    ];
    let rest = object(vec![("k", int(1..50)), ("exclude", mostly(ids()))]);
    let near_valid = prop_oneof![
        8 => (query.clone(), rest.clone()).prop_map(|(query, rest)| match (query.as_str(), rest.as_str()) {
            ("", _) => rest,
            (_, "{}") => format!("{{{query}}}"),
            _ => format!("{{{query},{}", &rest[1..]),
        }),
        1 => rest,
    ]
    .boxed();
    let keys = &["user_id", "history", "k", "exclude"];
    let bodies = prop_oneof![
        1 => vec(any::<u8>(), 0..100),
        2 => json_text(keys).prop_map(String::into_bytes),
        6 => damaged(near_valid),
    ];
    run("/v1 recall decoder", bodies, |body| {
        match parse_json::<RecallRequest>(&body).and_then(|r| recall_input(r, 10)) {
            Ok(_) => Ok(Outcome::Accepted),
            Err(e) => clear(&e),
        }
    });
}

/// The recall contract the KServe tensors are checked against: 10 users, 50 items, at most 3 users per request.
fn recall_contract() -> recserve_core::recall::RecallContract {
    use recserve_core::registry::RequestLimits;
    use recserve_core::repository::{OovPolicy, Storage, TableSpec};
    let table = |name: &str, rows: u64| TableSpec {
        name: name.to_owned(),
        rows,
        dim: 4,
        storage: Storage::Fp32,
        oov: OovPolicy::Reject,
    };
    recserve_core::recall::RecallContract {
        user_table: table("user", 10),
        item_table: table("item", 50),
        history_table: None,
        default_k: 10,
        limits: RequestLimits {
            max_candidates: 3,
            max_history: 5,
            max_exclude: 5,
            max_reply_items: 100,
        },
        index: None,
        queue: recserve_core::batching::QueueFit {
            max_batch_rows: 2,
            queue_capacity: 2,
        },
    }
}

/// One input tensor of a near-valid request: `rows` rows of `columns` values (no column axis when `None`) drawn
/// from `value`, sent as flat or nested JSON `data` or as binary data after the JSON (`le` encodes a value), with a
/// fault now and then in the shape, the datatype or the binary size.
fn tensor(
    name: &'static str,
    datatype: &'static str,
    rows: usize,
    columns: Option<usize>,
    value: BoxedStrategy<i64>,
    le: fn(i64) -> Vec<u8>,
) -> BoxedStrategy<(String, Vec<u8>)> {
    let count = rows * columns.unwrap_or(1);
    let shape: Vec<i64> = std::iter::once(rows)
        .chain(columns)
        .map(|d| d as i64)
        .collect();
    let shape = prop_oneof![
        20 => Just(format!("{shape:?}")),
        1 => json_leaf(),
        1 => vec(-1i64..6, 0..3).prop_map(|s| format!("{s:?}")),
    ];
    let datatype = prop_oneof![20 => Just(format!("\"{datatype}\"")), 1 => json_leaf()];
    let form = prop_oneof![3 => Just(0u8), 1 => Just(1u8), 2 => Just(2u8)];
    let faulty = prop_oneof![20 => Just(None), 1 => json_leaf().prop_map(Some)];
    (shape, datatype, vec(value, count), form, faulty, -2i64..3)
        .prop_map(move |(shape, datatype, values, form, faulty, size_off)| {
            let head = format!("\"name\":\"{name}\",\"datatype\":{datatype},\"shape\":{shape}");
            let text: Vec<String> = values.iter().map(i64::to_string).collect();
            let mut text = text;
            if let (Some(leaf), Some(first)) = (faulty, text.first_mut()) {
                *first = leaf;
            }
            match form {
                // Flat JSON data.
                0 => (
                    format!("{{{head},\"data\":[{}]}}", text.join(",")),
                    Vec::new(),
                ),
                // Nested as the shape (rows of `columns`).
                1 => {
                    let rows: Vec<String> = match columns {
                        Some(c) if c > 0 => text
                            .chunks(c)
                            .map(|r| format!("[{}]", r.join(",")))
                            .collect(),
                        _ => text,
                    };
                    (
                        format!("{{{head},\"data\":[{}]}}", rows.join(",")),
                        Vec::new(),
                    )
                }
                // Binary, its size now and then a little off.
                _ => {
                    let bytes: Vec<u8> = values.iter().flat_map(|&v| le(v)).collect();
                    let size =
                        (bytes.len() as i64 + size_off * i64::from(size_off.abs() == 2)).max(0);
                    (
                        format!("{{{head},\"parameters\":{{\"binary_data_size\":{size}}}}}"),
                        bytes,
                    )
                }
            }
        })
        .boxed()
}

/// A near-valid request for the DeepFM test contract (`categorical` `[B, 3]`, `dense` `[B, 2]`, or the grouped
/// form's `user_categorical` `[U, 1]`, `user_dense` `[U, 2]`, `item_categorical` `[B, 2]`, `candidates_per_user`
/// `[U]`) or the LightGCN one (`user_id` `[B]` and `k`): its JSON and the binary data after it.
fn near_valid_infer() -> BoxedStrategy<(String, Vec<u8>)> {
    let int64 = |v: i64| v.to_le_bytes().to_vec();
    let fp32 = |v: i64| (v as f32).to_le_bytes().to_vec();
    let rows = || prop_oneof![8 => 1usize..4, 1 => 0usize..6];
    let deepfm = rows().prop_flat_map(move |rows| {
        let id = prop_oneof![10 => 0i64..5, 1 => any::<i64>(), 1 => -5i64..105].boxed();
        (
            tensor("categorical", "INT64", rows, Some(3), id, int64),
            tensor("dense", "FP32", rows, Some(2), (-50i64..50).boxed(), fp32),
            prop_oneof![9 => Just(true), 1 => Just(false)],
        )
            .prop_map(|(a, b, both)| {
                let parameters = "{}".to_owned();
                let mut tensors = vec![a];
                if both {
                    tensors.push(b);
                }
                (tensors, parameters)
            })
    });
    // The grouped form: `users` users of `per` candidates each, now and then without candidates_per_user (valid
    // for one user) or user_dense, or with the row form's categorical beside it.
    let deepfm_grouped = (prop_oneof![8 => 1usize..3, 1 => 0usize..4], 1usize..3).prop_flat_map(
        move |(users, per)| {
            let id = || prop_oneof![10 => 0i64..5, 1 => any::<i64>(), 1 => -5i64..105].boxed();
            let count = prop_oneof![10 => Just(per as i64), 1 => -1i64..4].boxed();
            (
                tensor("user_categorical", "INT64", users, Some(1), id(), int64),
                tensor(
                    "user_dense",
                    "FP32",
                    users,
                    Some(2),
                    (-50i64..50).boxed(),
                    fp32,
                ),
                tensor(
                    "item_categorical",
                    "INT64",
                    users * per,
                    Some(2),
                    id(),
                    int64,
                ),
                tensor("candidates_per_user", "INT64", users, None, count, int64),
                tensor("categorical", "INT64", 1, Some(3), id(), int64),
                prop_oneof![12 => Just(0u8), 1 => Just(1u8), 1 => Just(2u8), 1 => Just(3u8)],
            )
                .prop_map(|(user, dense, item, counts, categorical, variant)| {
                    let mut tensors = vec![user, item];
                    if variant != 1 {
                        tensors.push(counts);
                    }
                    if variant != 2 {
                        tensors.push(dense);
                    }
                    if variant == 3 {
                        tensors.push(categorical);
                    }
                    (tensors, "{}".to_owned())
                })
        },
    );
    let lightgcn = rows().prop_flat_map(move |rows| {
        let id = prop_oneof![10 => 0i64..10, 1 => any::<i64>()].boxed();
        (
            tensor("user_id", "INT64", rows, None, id, int64),
            object(vec![("k", int(1..40)), ("timeout", int(0..100_000))]),
        )
            .prop_map(|(a, parameters)| (vec![a], parameters))
    });
    let output = prop::sample::select(vec!["ctr", "item_ids", "scores", "x"]);
    (
        prop_oneof![deepfm, deepfm_grouped, lightgcn],
        vec(output, 0..2),
        prop_oneof![10 => Just("false"), 2 => Just("true"), 1 => Just("1")],
    )
        .prop_map(|((tensors, parameters), outputs, binary_output)| {
            let inputs: Vec<&str> = tensors.iter().map(|(json, _)| json.as_str()).collect();
            let outputs: Vec<String> = outputs
                .iter()
                .map(|o| format!("{{\"name\":\"{o}\"}}"))
                .collect();
            let parameters = parameters.replacen(
                '{',
                &format!("{{\"binary_data_output\":{binary_output},"),
                1,
            );
            let parameters = parameters.replace(",}", "}");
            let json = format!(
                "{{\"id\":\"r\",\"inputs\":[{}],\"outputs\":[{}],\"parameters\":{parameters}}}",
                inputs.join(","),
                outputs.join(",")
            );
            let binary = tensors.into_iter().flat_map(|(_, bytes)| bytes).collect();
            (json, binary)
        })
        .boxed()
}

/// Request headers, by name and value.
type Headers = Vec<(String, String)>;

/// KServe inference bodies for the test contracts, with the headers they come with: arbitrary bytes, any JSON,
/// and near-valid requests (their binary data after the JSON with a fitting `Inference-Header-Content-Length`,
/// now and then a wrong, malformed or repeated one, or a `Content-Encoding`).
fn infer_requests() -> BoxedStrategy<(Vec<u8>, Headers)> {
    let keys = &[
        "inputs",
        "outputs",
        "parameters",
        "name",
        "datatype",
        "shape",
        "data",
        "binary_data_size",
        "k",
    ];
    let other = prop_oneof![
        1 => vec(any::<u8>(), 0..100),
        2 => json_text(keys).prop_map(String::into_bytes),
    ]
    .prop_map(|body| (body, Vec::new()));
    let length = prop_oneof![
        20 => Just(None),
        1 => any::<u16>().prop_map(|n| Some(n.to_string())),
        1 => Just(Some("ten".to_owned())),
    ];
    let extra = prop_oneof![
        30 => Just(None),
        1 => Just(Some(("inference-header-content-length", "5"))),
        1 => Just(Some(("content-encoding", "gzip"))),
        1 => Just(Some(("content-encoding", "identity"))),
    ];
    let near_valid = (
        damaged(near_valid_infer().prop_map(|(json, _)| json).boxed()),
        near_valid_infer(),
        length,
        extra,
    )
        .prop_map(|(damaged_json, (json, binary), length, extra)| {
            // Half carry their binary data (and the header), half are damaged JSON alone.
            let mut headers = Vec::new();
            let body = if binary.is_empty() && damaged_json.len() % 2 == 0 {
                damaged_json
            } else {
                let header = length.unwrap_or_else(|| json.len().to_string());
                headers.push(("inference-header-content-length".to_owned(), header));
                let mut body = json.into_bytes();
                body.extend_from_slice(&binary);
                body
            };
            if let Some((name, value)) = extra {
                headers.push((name.to_owned(), value.to_owned()));
            }
            (body, headers)
        });
    prop_oneof![1 => other, 4 => near_valid].boxed()
}

#[test]
fn fuzz_kserve_decoder_and_tensor_contracts_answer_every_request() {
    use crate::api::kserve::{deepfm, http, lightgcn, timeout_parameter};
    let rank = recserve_core::testing::test_contract::contract();
    let recall = recall_contract();
    let tensors = deepfm::Tensors {
        model: "m",
        contract: &rank,
    };
    run(
        "KServe HTTP decoder and tensor contracts",
        infer_requests(),
        |(body, pairs)| {
            let mut headers = HeaderMap::new();
            for (name, value) in &pairs {
                if let (Ok(name), Ok(value)) = (
                    axum::http::HeaderName::try_from(name.as_str()),
                    HeaderValue::from_str(value),
                ) {
                    headers.append(name, value);
                }
            }
            let request = match http::decode(&headers, Bytes::from(body)) {
                Ok((request, _)) => request,
                Err(e) => return clear(&e),
            };
            if let Err(e) = timeout_parameter(&request.parameters, Instant::now()) {
                return clear(&e);
            }
            // Accepted when one of the two contracts takes the tensors.
            let mut outcome = Outcome::Refused;
            match tensors.rank_input(request.inputs.clone()) {
                Ok(input) => {
                    prop_assert_eq!(input.ids.len(), input.rows * rank.fields());
                    prop_assert_eq!(input.dense.len(), input.rows * rank.dense_features);
                    outcome = Outcome::Accepted;
                }
                Err(e) => {
                    clear(&e)?;
                }
            }
            match lightgcn::decode_inputs("m", &recall, request.inputs, &request.parameters) {
                Ok(inputs) => {
                    prop_assert!((1..=4).contains(&inputs.len()), "{} users", inputs.len());
                    outcome = Outcome::Accepted;
                }
                Err(e) => {
                    clear(&e)?;
                }
            }
            Ok(outcome)
        },
    );
}

/// Input tensors as any transport could hand them over: any shape, JSON values of any nesting, raw bytes of any
/// length, typed contents of any field; and, as often, data that fits its shape (flat or nested JSON, bytes,
/// typed contents of the shape's element count).
fn input_tensors() -> BoxedStrategy<crate::api::kserve::InputTensor> {
    use crate::api::kserve::{InputTensor, TensorData, Typed};
    let fitting = vec(1i64..4, 0..3).prop_flat_map(|shape| {
        let count: usize = shape.iter().map(|&d| d as usize).product();
        let nested = {
            let shape = shape.clone();
            vec(
                mostly((-3i64..9).prop_map(|n| n.to_string()).boxed()),
                count,
            )
            .prop_map(move |leaves| {
                // Leaves grouped by the shape's dimensions, innermost first.
                let mut level: Vec<String> = leaves;
                for &d in shape.iter().skip(1).rev() {
                    level = level
                        .chunks(d as usize)
                        .map(|c| format!("[{}]", c.join(",")))
                        .collect();
                }
                serde_json::from_str(&format!("[{}]", level.join(",")))
                    .unwrap_or(serde_json::Value::Null)
            })
        };
        let data = prop_oneof![
            nested.prop_map(TensorData::Json),
            prop_oneof![Just(count * 8), Just(count * 4)]
                .prop_flat_map(|len| vec(any::<u8>(), len))
                .prop_map(|b| TensorData::Raw(Bytes::from(b))),
            vec(any::<i64>(), count).prop_map(|v| TensorData::Typed(Typed::Int64(v))),
            vec(any::<f32>(), count).prop_map(|v| TensorData::Typed(Typed::Fp32(v))),
        ];
        (
            prop::sample::select(vec!["INT64", "FP32"]),
            Just(shape),
            data,
        )
    });
    let fitting = fitting.prop_map(|(datatype, shape, data)| InputTensor {
        name: "t".to_owned(),
        datatype: datatype.to_owned(),
        shape,
        data,
    });
    let dim = prop_oneof![8 => 0i64..5, 1 => any::<i64>()];
    let json = json_text(&["a"])
        .prop_map(|text| serde_json::from_str(&text).unwrap_or(serde_json::Value::Null));
    let typed = prop_oneof![
        vec(any::<i64>(), 0..12).prop_map(Typed::Int64),
        vec(any::<f32>(), 0..12).prop_map(Typed::Fp32),
        vec(any::<i32>(), 0..12).prop_map(Typed::Int),
        vec(any::<bool>(), 0..4).prop_map(Typed::Bool),
    ];
    let data = prop_oneof![
        json.prop_map(TensorData::Json),
        vec(any::<u8>(), 0..100).prop_map(|b| TensorData::Raw(Bytes::from(b))),
        typed.prop_map(TensorData::Typed),
    ];
    let any_tensor = (
        prop::sample::select(vec!["INT64", "FP32", "BYTES", "FP16", "nope"]),
        vec(dim, 0..4),
        data,
    )
        .prop_map(|(datatype, shape, data)| InputTensor {
            name: "t".to_owned(),
            datatype: datatype.to_owned(),
            shape,
            data,
        });
    prop_oneof![any_tensor, fitting].boxed()
}

#[test]
fn fuzz_tensor_conversion_gives_the_shapes_elements_or_an_error() {
    use crate::api::kserve::Datatype;
    run("tensor conversion", input_tensors(), |tensor| {
        let count = tensor.element_count();
        let checked = |datatype| tensor.expect_datatype(datatype).is_ok();
        let (int64, fp32) = (checked(Datatype::Int64), checked(Datatype::Fp32));
        let mut outcome = Outcome::Refused;
        for (is, as_i64) in [(int64, true), (fp32, false)] {
            if !is {
                continue;
            }
            let len = if as_i64 {
                tensor.clone().into_i64().map(|v| v.len())
            } else {
                tensor.clone().into_f32().map(|v| v.len())
            };
            match len {
                Ok(len) => {
                    prop_assert_eq!(Some(len), count.as_ref().ok().copied());
                    outcome = Outcome::Accepted;
                }
                Err(e) => {
                    clear(&e)?;
                }
            }
        }
        Ok(outcome)
    });
}

/// `model.toml` texts: arbitrary, and valid ones with lines dropped, repeated, changed or added.
fn model_tomls() -> BoxedStrategy<String> {
    const DEEPFM: &str = recserve_core::testing::test_contract::SPEC;
    const LIGHTGCN: &str = "format_version = 1\nkind = \"lightgcn\"\n[recall]\nuser_table = \"user\"\n\
        item_table = \"item\"\nhistory_table = \"history\"\npopularity = \"item_popularity\"\n[[tables]]\n\
        name = \"user\"\nfile = \"t.safetensors\"\nrows = 48\ndim = 24\nstorage = \"fp32\"\noov = \"reject\"\n\
        [[tables]]\nname = \"item\"\nfile = \"t.safetensors\"\nrows = 300\ndim = 24\nstorage = \"int8\"\n\
        [[tables]]\nname = \"history\"\nfile = \"t.safetensors\"\nrows = 300\ndim = 24\nstorage = \"fp16\"\n\
        oov = \"default\"\ndefault_row = 3\n[batching]\nmax_batch_rows = 64\n";
    let value = prop_oneof![
        3 => (-3i64..70).prop_map(|n| n.to_string()),
        1 => any::<i64>().prop_map(|n| n.to_string()),
        1 => prop::sample::select(vec![
            "\"\"", "\"../t.safetensors\"", "\"/abs\"", "\"user\"", "\"item\"", "\"u\"", "\"cat\"", "\"reject\"",
            "\"default\"", "\"int8\"", "\"fp16\"", "\"bf16\"", "\"deepfm\"", "\"lightgcn\"", "\"side\"", "true",
            "1.5", "[]", "[3, 1]", "[1, 2, 2]", "[\"d0\", \"d0\"]", "{}", "18446744073709551616", "nan", "inf",
        ])
        .prop_map(str::to_owned),
        1 => "\"[a-z0-9_./ -]{0,10}\"",
    ];
    let extra = prop::sample::select(vec![
        "[batching]",
        "max_batch_rows = 0",
        "buckets = [4, 2]",
        "default_deadline_ms = 0",
        "max_queue_delay_us = 9",
        "[[fields]]",
        "name = \"item\"",
        "side = \"item\"",
        "table = \"u\"",
        "[[tables]]",
        "rows = 0",
        "dim = 0",
        "[item_features]",
        "file = \"f.safetensors\"",
        "[recall]",
        "user_table = \"cat\"",
        "[ranking]",
        "dense_features = []",
        "item_id_field = \"cat\"",
        "[dense_graph]",
        "precision = \"int8\"",
        "default_row = 99",
    ]);
    let edit = (0usize..4, any::<usize>(), value, extra);
    let near_valid = (
        prop::sample::select(vec![DEEPFM, LIGHTGCN]),
        vec(edit, 1..5),
    )
        .prop_map(|(text, edits)| {
            let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
            for (kind, at, value, extra) in edits {
                let at = at % lines.len().max(1);
                match kind {
                    0 if !lines.is_empty() => {
                        lines.remove(at);
                    }
                    1 if !lines.is_empty() => lines.insert(at, lines[at].clone()),
                    2 => match lines.get(at).and_then(|l| l.split_once(" = ")) {
                        Some((key, _)) => lines[at] = format!("{key} = {value}"),
                        None => lines.insert(at, extra.to_owned()),
                    },
                    _ => lines.insert(at, extra.to_owned()),
                }
            }
            lines.join("\n")
        });
    prop_oneof![1 => ".{0,200}", 1 => damaged(Just(DEEPFM.to_owned()).boxed()).prop_map(|b| String::from_utf8_lossy(&b).into_owned()), 6 => near_valid].boxed()
}

#[test]
fn fuzz_model_toml_parses_or_names_the_problem() {
    use recserve_core::ranking::RankContract;
    use recserve_core::repository::{ModelKind, ModelSpec};
    run("model.toml", model_tomls(), |text| {
        match ModelSpec::parse(&text) {
            Ok(spec) => {
                // A spec that parses is consistent: what loading and the contracts index is there.
                for field in &spec.fields {
                    prop_assert!(field.table < spec.tables.len());
                }
                let _ = (spec.field_dim(), spec.precision());
                if spec.kind == ModelKind::Deepfm {
                    let contract = RankContract::new(Arc::new(spec), 10);
                    for f in 0..contract.fields() {
                        let _ = (contract.field_name(f), contract.check_id(f, -1));
                    }
                }
                Ok(Outcome::Accepted)
            }
            Err(problem) => {
                prop_assert!(!problem.is_empty(), "an empty problem");
                Ok(Outcome::Refused)
            }
        }
    });
}

/// The repository API's bodies (index, load, unload): empty, near-valid (`{"ready": …}`, `{"parameters": …}`) or
/// any JSON or bytes.
fn repository_bodies() -> BoxedStrategy<Vec<u8>> {
    let near_valid = prop_oneof![
        object(vec![(
            "ready",
            mostly(any::<bool>().prop_map(|b| b.to_string()).boxed())
        )]),
        object(vec![(
            "parameters",
            mostly(
                prop_oneof![
                    Just("{}".to_owned()),
                    json_text(&["unload_dependents", "config", "file:1/model.onnx"]),
                ]
                .boxed()
            ),
        )]),
        Just(String::new()),
        Just(" \n".to_owned()),
    ]
    .boxed();
    prop_oneof![
        1 => json_text(&["ready", "parameters", "unload_dependents"]).prop_map(String::into_bytes),
        1 => vec(any::<u8>(), 0..64),
        6 => damaged(near_valid),
    ]
    .boxed()
}

#[test]
fn fuzz_repository_api_bodies_and_names_give_a_value_or_a_clear_error() {
    use crate::api::kserve::repository::{index_request, load_request, unload_request};
    run("repository API bodies", repository_bodies(), |body| {
        let answers = [
            index_request(&body).map(drop),
            load_request(&body),
            unload_request(&body),
        ];
        let mut outcome = Outcome::Refused;
        for answer in answers {
            match answer {
                Ok(()) => outcome = Outcome::Accepted,
                Err(e) => {
                    clear(&e)?;
                }
            }
        }
        Ok(outcome)
    });

    // Names, as a load or unload carries them in its path: only the repository's own model is found; any other
    // name is refused with a bounded message, and is not one the repository holds (so it leaves no trace).
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join("held/1")).expect("mkdir");
    let names = prop_oneof![
        1 => Just("held".to_owned()),
        4 => "[a-zA-Z0-9_./%-]{0,20}",
        1 => any::<String>(),
        1 => (100usize..9000).prop_map(|n| "n".repeat(n)),
    ];
    run("repository API model names", names.boxed(), |name| {
        use recserve_core::repository::{discover_model, holds};
        let held = holds(dir.path(), &name);
        match discover_model(dir.path(), &name, None) {
            Ok(found) => {
                prop_assert!(held && name == "held", "{name:?} found");
                prop_assert_eq!(found.iter().map(|m| m.version).collect::<Vec<_>>(), vec![1]);
                Ok(Outcome::Accepted)
            }
            Err(e) => {
                prop_assert!(!held, "{name:?} is held but not found: {e}");
                let message = e.to_string();
                prop_assert!(
                    !message.is_empty() && message.len() < 1000,
                    "{} bytes: {}",
                    message.len(),
                    message.chars().take(200).collect::<String>()
                );
                Ok(Outcome::Refused)
            }
        }
    });
}
