//! The tensor contract of LightGCN recall models over the Open Inference Protocol: `user_id` INT64 `[B]` (rows of
//! the user table) in, and the number of items per user `k`, which is optional: an INT32 or INT64 input `[1]`, or
//! the request parameter `k`, else the model's `[recall] default_k`; `item_ids` INT64 `[B, k]` and `scores` FP32
//! `[B, k]` out, each row best first (equal scores by lower id), exactly what `/v1` recall answers for each user.
//! The metadata lists `k` among the inputs and says in its `properties` that it is optional and what it defaults
//! to, so a client that builds its request from the metadata alone gets an answer. The `B` queries are queued
//! together, so they share passes over the catalogue. `history` and `exclude`, whose lengths vary per user, are
//! `/v1` only. The request parameters `exact` (BOOL) and `nprobe` (an integer) choose the search as `/v1`'s fields
//! do, for every user of the request.

use super::{
    InputTensor, OutputData, OutputTensor, Outputs, Parameter, Parameters, TensorContract,
    TensorSpec,
};
use crate::api::kserve::Datatype;
use crate::service::{ModelCall, ServedModel};
use recserve_core::error::ServiceError;
use recserve_core::recall::{RecallContract, RecallInput, RecallModel, RecallQuery, SearchRequest};

/// The input holding the user ids.
pub(crate) const USER_ID: &str = "user_id";
/// The output holding the recalled item ids.
pub(crate) const ITEM_IDS: &str = "item_ids";
/// The output holding their scores.
pub(crate) const SCORES: &str = "scores";
/// The optional input (or request parameter) holding the number of items per user.
pub(crate) const K: &str = "k";
/// The request parameters that choose the search: every item (`exact`), or the index's `nprobe` lists.
pub(crate) const EXACT: &str = "exact";
pub(crate) const NPROBE: &str = "nprobe";

/// The LightGCN contract of one served model.
#[derive(Debug)]
pub(crate) struct LightGcn<'a> {
    model: &'a ServedModel,
    contract: &'a RecallContract,
}

impl<'a> LightGcn<'a> {
    pub(crate) fn new(model: &'a ServedModel, recall: &'a RecallModel) -> LightGcn<'a> {
        LightGcn {
            model,
            contract: &recall.contract,
        }
    }

    /// Checks the request and builds one recall input per user.
    pub(crate) fn recall_inputs(
        &self,
        inputs: Vec<InputTensor>,
        parameters: &Parameters,
    ) -> Result<Vec<RecallInput>, ServiceError> {
        decode_inputs(&self.model.name, self.contract, inputs, parameters)
    }
}

/// The metadata `properties` of a recall model: which inputs may be left out, and `k`'s default and range.
fn properties(contract: &RecallContract) -> Vec<(String, String)> {
    vec![
        ("optional_inputs".to_owned(), K.to_owned()),
        (format!("{K}.default"), contract.default_k.to_string()),
        (format!("{K}.min"), "1".to_owned()),
        (format!("{K}.max"), contract.items().to_string()),
    ]
}

/// `k` from the input tensor `k` (INT32 or INT64, one element), or the request parameter `k`, else the model's
/// default; 1 to the catalogue size.
fn k_of(
    contract: &RecallContract,
    tensor: Option<InputTensor>,
    parameters: &Parameters,
) -> Result<usize, ServiceError> {
    let items = contract.items();
    let (what, k) = match (tensor, parameters.get(K)) {
        (Some(_), Some(_)) => {
            return Err(ServiceError::invalid(
                K,
                format!("is given both as an input tensor and as parameters.{K}: send one of them"),
            ));
        }
        (None, None) => return Ok(contract.default_k),
        (None, Some(parameter)) => {
            let k = match parameter {
                Parameter::Int64(k) => Some(*k),
                Parameter::Uint64(k) => i64::try_from(*k).ok().or(Some(i64::MAX)),
                Parameter::Bool(_) | Parameter::Double(_) | Parameter::String(_) => None,
            };
            let k = k.ok_or_else(|| {
                ServiceError::invalid(
                    format!("parameters.{K}"),
                    format!(
                        "must be an integer from 1 to {items} (the catalogue), got {parameter}"
                    ),
                )
            })?;
            (format!("parameters.{K}"), k)
        }
        (Some(tensor), None) => {
            if tensor.shape.iter().product::<i64>() != 1 || tensor.shape.len() > 1 {
                return Err(ServiceError::invalid(
                    K,
                    format!(
                        "shape {:?} is not [1] (one k for every user of the request)",
                        tensor.shape
                    ),
                ));
            }
            let k = match Datatype::parse(&tensor.datatype) {
                Some(Datatype::Int32) => tensor.into_i32()?.first().map(|&k| i64::from(k)),
                _ => {
                    tensor.expect_datatype(Datatype::Int64).map_err(|_| {
                        ServiceError::invalid(
                            K,
                            format!(
                                "datatype {}, but the model takes INT32 or INT64",
                                tensor.datatype
                            ),
                        )
                    })?;
                    tensor.into_i64()?.first().copied()
                }
            };
            (K.to_owned(), k.unwrap_or_default())
        }
    };
    usize::try_from(k)
        .ok()
        .filter(|k| (1..=items).contains(k))
        .ok_or_else(|| {
            ServiceError::invalid(
                what,
                format!("must be an integer from 1 to {items} (the catalogue), got {k}"),
            )
        })
}

/// The parameters `exact` and `nprobe`, checked against the model's index.
fn search_of(
    contract: &RecallContract,
    parameters: &Parameters,
) -> Result<SearchRequest, ServiceError> {
    let exact = match parameters.get(EXACT) {
        None => false,
        Some(Parameter::Bool(b)) => *b,
        Some(other) => {
            return Err(ServiceError::invalid(
                format!("parameters.{EXACT}"),
                format!("must be a boolean, got {other}"),
            ));
        }
    };
    let field = format!("parameters.{NPROBE}");
    let search = match parameters.get(NPROBE) {
        None if exact => SearchRequest::Exact,
        None => SearchRequest::Default,
        Some(_) if exact => {
            return Err(ServiceError::invalid(
                field,
                format!("cannot be sent together with parameters.{EXACT} = true: send one of them"),
            ));
        }
        Some(parameter) => {
            let n = match parameter {
                Parameter::Int64(n) => usize::try_from(*n).ok(),
                Parameter::Uint64(n) => Some(usize::try_from(*n).unwrap_or(usize::MAX)),
                Parameter::Bool(_) | Parameter::Double(_) | Parameter::String(_) => None,
            };
            let n = n.ok_or_else(|| {
                ServiceError::invalid(
                    &field,
                    format!("must be a positive integer, got {parameter}"),
                )
            })?;
            SearchRequest::Nprobe(n)
        }
    };
    contract.search(search, &field)?;
    Ok(search)
}

/// The decoding of [`LightGcn`]: `model` names the model in messages.
pub(crate) fn decode_inputs(
    model: &str,
    contract: &RecallContract,
    inputs: Vec<InputTensor>,
    parameters: &Parameters,
) -> Result<Vec<RecallInput>, ServiceError> {
    let (mut user_ids, mut k_tensor) = (None, None);
    for input in inputs {
        let slot = match input.name.as_str() {
            USER_ID => &mut user_ids,
            K => &mut k_tensor,
            _ => {
                return Err(ServiceError::invalid(
                    &input.name,
                    format!(
                        "is not an input of model {model:?} (inputs: {USER_ID} INT64 [-1], optional {K} INT64 \
                         [1]; history and exclude are /v1 only)"
                    ),
                ));
            }
        };
        if slot.is_some() {
            return Err(ServiceError::invalid(&input.name, "is given twice"));
        }
        *slot = Some(input);
    }
    let k = k_of(contract, k_tensor, parameters)?;
    let search = search_of(contract, parameters)?;
    let user_ids = user_ids.ok_or_else(|| {
        ServiceError::invalid(
            USER_ID,
            format!("is missing (model {model:?} takes {USER_ID} INT64 [-1])"),
        )
    })?;
    user_ids.expect_datatype(Datatype::Int64)?;
    if user_ids.shape.len() != 1 {
        return Err(ServiceError::invalid(
            USER_ID,
            format!(
                "shape {:?} is not [B] (one user id per row)",
                user_ids.shape
            ),
        ));
    }
    let ids = user_ids.into_i64()?;
    let max_rows = contract.limits.max_candidates;
    if ids.is_empty() || ids.len() > max_rows {
        return Err(ServiceError::invalid(
            USER_ID,
            format!(
                "holds {} users; a request holds 1 to {} (--max-candidates)",
                ids.len(),
                max_rows
            ),
        ));
    }
    contract
        .queue
        .check(ids.len(), "users")
        .map_err(|problem| ServiceError::invalid(USER_ID, problem))?;
    contract.check_reply(ids.len(), k, &format!("parameters.{K}"))?;
    ids.iter()
        .enumerate()
        .map(|(i, &id)| {
            contract
                .check_user_id(id)
                .map_err(|problem| ServiceError::invalid(format!("{USER_ID}[{i}]"), problem))?;
            Ok(RecallInput {
                query: RecallQuery::UserId(id),
                k,
                exclude: Vec::new(),
                search,
            })
        })
        .collect()
}

impl TensorContract for LightGcn<'_> {
    fn inputs(&self) -> Vec<TensorSpec> {
        vec![
            TensorSpec {
                name: USER_ID.to_owned(),
                datatype: Datatype::Int64,
                shape: vec![-1],
                columns: Vec::new(),
            },
            TensorSpec {
                name: K.to_owned(),
                datatype: Datatype::Int64,
                shape: vec![1],
                columns: Vec::new(),
            },
        ]
    }

    fn properties(&self) -> Vec<(String, String)> {
        properties(self.contract)
    }

    fn outputs(&self) -> Vec<TensorSpec> {
        [(ITEM_IDS, Datatype::Int64), (SCORES, Datatype::Fp32)]
            .into_iter()
            .map(|(name, datatype)| TensorSpec {
                name: name.to_owned(),
                datatype,
                shape: vec![-1, -1],
                columns: Vec::new(),
            })
            .collect()
    }

    fn run<'a>(
        &'a self,
        call: &'a ModelCall,
        inputs: Vec<InputTensor>,
        parameters: &'a Parameters,
    ) -> Outputs<'a> {
        Box::pin(async move {
            let inputs = self.recall_inputs(inputs, parameters)?;
            let (rows, k) = (inputs.len(), inputs.first().map_or(0, |i| i.k));
            let answers = call.recall(inputs).await?;
            let mut ids = Vec::with_capacity(rows * k);
            let mut scores = Vec::with_capacity(rows * k);
            for answer in answers.iter().map(|a| &a.items) {
                if answer.len() != k {
                    return Err(ServiceError::Internal(format!(
                        "model {:?}: {} items recalled where k = {k} and nothing is excluded",
                        self.model.name,
                        answer.len()
                    )));
                }
                ids.extend(answer.iter().map(|s| i64::from(s.id)));
                scores.extend(answer.iter().map(|s| s.score));
            }
            let shape = vec![rows as i64, k as i64];
            Ok(vec![
                OutputTensor {
                    name: ITEM_IDS.to_owned(),
                    shape: shape.clone(),
                    data: OutputData::Int64(ids),
                },
                OutputTensor {
                    name: SCORES.to_owned(),
                    shape,
                    data: OutputData::Fp32(scores),
                },
            ])
        })
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::kserve::TensorData;
    use recserve_core::batching::QueueFit;
    use recserve_core::registry::RequestLimits;
    use recserve_core::repository::{OovPolicy, Storage, TableSpec};

    fn table(name: &str, rows: u64, oov: OovPolicy) -> TableSpec {
        TableSpec {
            name: name.to_owned(),
            rows,
            dim: 4,
            storage: Storage::Fp32,
            oov,
        }
    }

    fn decode(
        inputs: Vec<InputTensor>,
        parameters: Parameters,
    ) -> Result<Vec<RecallInput>, ServiceError> {
        let contract = RecallContract {
            user_table: table("user", 10, OovPolicy::Reject),
            item_table: table("item", 50, OovPolicy::Reject),
            history_table: None,
            default_k: 20,
            limits: RequestLimits {
                max_history: 5,
                max_exclude: 5,
                max_candidates: 3,
                max_reply_items: 100,
            },
            queue: QueueFit {
                max_batch_rows: 64,
                queue_capacity: 256,
            },
            index: Some(recserve_core::recall::IndexContract {
                nlist: 8,
                default: recserve_core::recall::Probe {
                    nprobe: 2,
                    max_candidates: 100,
                },
            }),
        };
        decode_inputs("m", &contract, inputs, &parameters)
    }

    fn users(shape: &[i64], data: serde_json::Value) -> InputTensor {
        InputTensor {
            name: USER_ID.to_owned(),
            datatype: "INT64".to_owned(),
            shape: shape.to_vec(),
            data: TensorData::Json(data),
        }
    }

    fn k(value: i64) -> Parameters {
        Parameters::from([(K.to_owned(), Parameter::Int64(value))])
    }

    fn k_tensor(datatype: &str, shape: &[i64], data: serde_json::Value) -> InputTensor {
        InputTensor {
            name: K.to_owned(),
            datatype: datatype.to_owned(),
            shape: shape.to_vec(),
            data: TensorData::Json(data),
        }
    }

    fn ks(inputs: Vec<InputTensor>, parameters: Parameters) -> Vec<usize> {
        decode(inputs, parameters)
            .expect("valid")
            .iter()
            .map(|i| i.k)
            .collect()
    }

    #[test]
    fn k_is_an_optional_input_or_parameter_with_the_models_default() {
        let two = || users(&[2], json!([3, 9]));
        assert_eq!(
            ks(vec![two()], Parameters::new()),
            vec![20, 20],
            "default_k"
        );
        assert_eq!(ks(vec![two()], k(7)), vec![7, 7]);
        assert_eq!(
            ks(
                vec![two(), k_tensor("INT64", &[1], json!([5]))],
                Parameters::new()
            ),
            vec![5, 5]
        );
        assert_eq!(
            ks(
                vec![k_tensor("INT32", &[1], json!([50])), two()],
                Parameters::new()
            ),
            vec![50, 50],
            "INT32, in any input order"
        );
        assert_eq!(
            ks(
                vec![two(), k_tensor("INT64", &[], json!(4))],
                Parameters::new()
            ),
            vec![4, 4],
            "a scalar"
        );
        let raw = InputTensor {
            data: TensorData::Raw(axum::body::Bytes::from(9i32.to_le_bytes().to_vec())),
            ..k_tensor("INT32", &[1], json!(null))
        };
        assert_eq!(
            ks(vec![two(), raw], Parameters::new()),
            vec![9, 9],
            "binary INT32"
        );
        let cases: Vec<(Vec<InputTensor>, Parameters, &str)> = vec![
            (
                vec![two(), k_tensor("INT64", &[1], json!([3]))],
                k(3),
                "k: is given both as an input tensor and as parameters.k: send one of them",
            ),
            (
                vec![two(), k_tensor("INT64", &[2], json!([3, 3]))],
                Parameters::new(),
                "k: shape [2] is not [1] (one k for every user of the request)",
            ),
            (
                vec![two(), k_tensor("FP32", &[1], json!([3.0]))],
                Parameters::new(),
                "k: datatype FP32, but the model takes INT32 or INT64",
            ),
            (
                vec![two(), k_tensor("INT32", &[1], json!([0]))],
                Parameters::new(),
                "k: must be an integer from 1 to 50 (the catalogue), got 0",
            ),
            (
                vec![two(), k_tensor("INT64", &[1], json!([51]))],
                Parameters::new(),
                "k: must be an integer from 1 to 50 (the catalogue), got 51",
            ),
            (
                vec![two(), k_tensor("INT32", &[1], json!([1, 2]))],
                Parameters::new(),
                "k: shape [1] holds 1 elements, but the data holds 2",
            ),
            (
                vec![
                    two(),
                    k_tensor("INT64", &[1], json!([1])),
                    k_tensor("INT64", &[1], json!([1])),
                ],
                Parameters::new(),
                "k: is given twice",
            ),
        ];
        for (inputs, parameters, expected) in cases {
            let got = decode(inputs, parameters).expect_err(expected).to_string();
            assert!(got.contains(expected), "expected {expected:?} in {got:?}");
        }
    }

    #[test]
    fn exact_and_nprobe_are_parameters_checked_against_the_index() {
        let one = || vec![users(&[2], json!([1, 2]))];
        let with = |pairs: Vec<(&str, Parameter)>| {
            Parameters::from_iter(pairs.into_iter().map(|(k, v)| (k.to_owned(), v)))
        };
        let search = |parameters| {
            decode(one(), parameters)
                .expect("valid")
                .iter()
                .map(|i| i.search)
                .collect::<Vec<_>>()
        };
        assert_eq!(search(Parameters::new()), vec![SearchRequest::Default; 2]);
        assert_eq!(
            search(with(vec![(EXACT, Parameter::Bool(true))])),
            vec![SearchRequest::Exact; 2]
        );
        assert_eq!(
            search(with(vec![(NPROBE, Parameter::Int64(8))])),
            vec![SearchRequest::Nprobe(8); 2]
        );
        for (parameters, expected) in [
            (
                with(vec![(NPROBE, Parameter::Int64(9))]),
                "parameters.nprobe: is 9; it must be from 1 to the 8 lists",
            ),
            (
                with(vec![(NPROBE, Parameter::Int64(-1))]),
                "parameters.nprobe: must be a positive integer",
            ),
            (
                with(vec![(NPROBE, Parameter::String("4".to_owned()))]),
                "parameters.nprobe: must be a positive integer",
            ),
            (
                with(vec![(EXACT, Parameter::Int64(1))]),
                "parameters.exact: must be a boolean",
            ),
            (
                with(vec![
                    (EXACT, Parameter::Bool(true)),
                    (NPROBE, Parameter::Int64(2)),
                ]),
                "parameters.nprobe: cannot be sent together with parameters.exact = true",
            ),
        ] {
            let got = decode(one(), parameters).expect_err(expected).to_string();
            assert!(got.contains(expected), "expected {expected:?} in {got:?}");
        }
    }

    #[test]
    fn decodes_users_and_k() {
        let got = decode(vec![users(&[2], json!([3, 9]))], k(7)).expect("valid");
        assert_eq!(
            got.iter().map(|i| (&i.query, i.k)).collect::<Vec<_>>(),
            vec![(&RecallQuery::UserId(3), 7), (&RecallQuery::UserId(9), 7)]
        );
        let cases: Vec<(Vec<InputTensor>, Parameters, &str)> = vec![
            (
                vec![users(&[1], json!([1]))],
                k(0),
                "parameters.k: must be an integer from 1 to 50",
            ),
            (
                vec![users(&[1], json!([1]))],
                k(51),
                "parameters.k: must be an integer from 1 to 50",
            ),
            (
                vec![],
                k(1),
                "user_id: is missing (model \"m\" takes user_id INT64 [-1])",
            ),
            (
                vec![users(&[1, 1], json!([[1]]))],
                k(1),
                "user_id: shape [1, 1] is not [B]",
            ),
            (
                vec![users(&[4], json!([1, 2, 3, 4]))],
                k(1),
                "user_id: holds 4 users; a request holds 1 to 3",
            ),
            (
                vec![users(&[2], json!([1, 10]))],
                k(1),
                "user_id[1]: id 10 is outside the user table \"user\"",
            ),
            (
                vec![users(&[2], json!([1]))],
                k(1),
                "user_id: shape [2] holds 2 elements, but the data holds 1",
            ),
            (
                vec![users(&[1], json!([1])), users(&[1], json!([2]))],
                k(1),
                "user_id: is given twice",
            ),
            (
                vec![users(&[3], json!([1, 2, 3]))],
                k(34),
                "parameters.k: is 34 for 3 users: 102 items, more than one reply may hold (100, \
                 --max-reply-items); ask for fewer users or a smaller k",
            ),
        ];
        for (inputs, parameters, expected) in cases {
            let got = decode(inputs, parameters).expect_err(expected).to_string();
            assert!(got.contains(expected), "expected {expected:?} in {got:?}");
        }
    }
}
