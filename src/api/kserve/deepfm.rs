//! The tensor contract of DeepFM ranking models over the Open Inference Protocol. In the row form, every row is
//! one complete candidate: `categorical` INT64 `[B, fields]` (one id per `[[fields]]` entry of `model.toml`, in
//! that order, user and item fields alike), `dense` FP32 `[B, dense_features]` (absent when the model has
//! none) and `candidate_features` FP32 `[B, candidate_features]` (absent when the model has none); the output, named after `dense_graph.output`, is the probability FP32 `[B, 1]`. The grouped form
//! ([`grouped`]) sends each user's fields once and the candidates' item fields beside them; a request sends one
//! form or the other. Decoding applies the same [`RankContract`] checks as `/v1` and builds the same
//! [`RankInput`].

mod grouped;

use super::{
    InputTensor, OutputData, OutputTensor, Outputs, Parameters, TensorContract, TensorSpec,
};
use crate::api::kserve::Datatype;
use crate::service::{ModelCall, ServedModel};
use recserve_core::error::ServiceError;
use recserve_core::ranking::{RankContract, RankInput, RankingModel};

/// The input holding every categorical id.
pub(crate) const CATEGORICAL: &str = "categorical";
/// The input holding the dense features.
pub(crate) const DENSE: &str = "dense";
/// The input holding each row's candidate features (`ranking.candidate_features`), in both forms.
pub(crate) const CANDIDATE_FEATURES: &str = "candidate_features";

/// The DeepFM contract of one served model.
#[derive(Debug)]
pub(crate) struct DeepFm<'a> {
    tensors: Tensors<'a>,
}

impl<'a> DeepFm<'a> {
    pub(crate) fn new(model: &'a ServedModel, ranking: &'a RankingModel) -> DeepFm<'a> {
        DeepFm {
            tensors: Tensors {
                model: &model.name,
                contract: &ranking.contract,
            },
        }
    }
}

/// The tensors of a DeepFM model, from its [`RankContract`] (and so from `model.toml`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Tensors<'a> {
    /// The model's name, for messages.
    pub(crate) model: &'a str,
    pub(crate) contract: &'a RankContract,
}

impl Tensors<'_> {
    fn output_name(&self) -> &str {
        self.contract
            .spec
            .dense_graph
            .as_ref()
            .map_or("probability", |g| g.output.as_str())
    }

    fn dense_names(&self) -> Vec<String> {
        self.contract
            .spec
            .ranking
            .as_ref()
            .map(|r| r.dense_features.clone())
            .unwrap_or_default()
    }

    fn input_list(&self) -> String {
        list(&self.inputs())
    }

    /// The error for an input that neither form has.
    fn not_an_input(&self, name: &str) -> ServiceError {
        ServiceError::invalid(
            name,
            format!(
                "is not an input of model {:?} (inputs: {}; or, grouped by user: {})",
                self.model,
                self.input_list(),
                self.grouped_list()
            ),
        )
    }

    pub(crate) fn inputs(&self) -> Vec<TensorSpec> {
        let mut inputs = vec![TensorSpec {
            name: CATEGORICAL.to_owned(),
            datatype: Datatype::Int64,
            shape: vec![-1, self.contract.fields() as i64],
            columns: self
                .contract
                .spec
                .fields
                .iter()
                .map(|f| f.name.clone())
                .collect(),
        }];
        if self.contract.dense_features > 0 {
            inputs.push(TensorSpec {
                name: DENSE.to_owned(),
                datatype: Datatype::Fp32,
                shape: vec![-1, self.contract.dense_features as i64],
                columns: self.dense_names(),
            });
        }
        inputs.extend(self.candidate_features_input());
        inputs
    }

    /// The `candidate_features` input, when the model takes candidate features.
    fn candidate_features_input(&self) -> Option<TensorSpec> {
        let count = self.contract.candidate_features;
        (count > 0).then(|| TensorSpec {
            name: CANDIDATE_FEATURES.to_owned(),
            datatype: Datatype::Fp32,
            shape: vec![-1, count as i64],
            columns: self.contract.candidate_feature_names().to_vec(),
        })
    }

    /// The values of the `candidate_features` input (`[rows, candidate_features]`, its shape checked, each
    /// finite; `missing` is the error when a model that takes them was not sent it).
    fn candidate_values(
        &self,
        tensor: Option<InputTensor>,
        rows: usize,
        rows_input: &str,
        missing: impl FnOnce(&str) -> ServiceError,
    ) -> Result<Vec<f32>, ServiceError> {
        let count = self.contract.candidate_features;
        if count == 0 {
            return Ok(Vec::new());
        }
        let tensor = tensor.ok_or_else(|| missing(CANDIDATE_FEATURES))?;
        tensor.expect_datatype(Datatype::Fp32)?;
        let given = rows_of(&tensor, "B", count, "candidate features of the model")?;
        if given != rows {
            return Err(ServiceError::invalid(
                CANDIDATE_FEATURES,
                format!("has {given} rows, but {rows_input} has {rows}"),
            ));
        }
        let values = tensor.into_f32()?;
        let names = self.contract.candidate_feature_names();
        for (i, &v) in values.iter().enumerate() {
            RankContract::check_dense(v).map_err(|problem| {
                let column = i % count;
                ServiceError::invalid(
                    format!("{CANDIDATE_FEATURES}[{}, {column}]", i / count),
                    format!("feature {:?}: {problem}", names[column]),
                )
            })?;
        }
        Ok(values)
    }

    /// What each categorical field takes, for a client that knows only the metadata: `field.NAME.min` and
    /// `field.NAME.max` (the ids its table holds) and `field.NAME.oov` (`reject`: other ids are refused with 400;
    /// `default`: they read the table's default row), whichever tensor (row or grouped form) carries the field.
    pub(crate) fn id_properties(&self) -> Vec<(String, String)> {
        let spec = &self.contract.spec;
        spec.fields
            .iter()
            .flat_map(|field| {
                let table = &spec.tables[field.table].spec;
                [
                    ("min", "0".to_owned()),
                    ("max", table.rows.saturating_sub(1).to_string()),
                    ("oov", table.oov.as_str().to_owned()),
                ]
                .map(|(key, value)| (format!("field.{}.{key}", field.name), value))
            })
            .collect()
    }

    pub(crate) fn outputs(&self) -> Vec<TensorSpec> {
        vec![TensorSpec {
            name: self.output_name().to_owned(),
            datatype: Datatype::Fp32,
            shape: vec![-1, 1],
            columns: Vec::new(),
        }]
    }

    /// Checks the inputs (of either form) against the contract and builds the rows to score.
    pub(crate) fn rank_input(&self, inputs: Vec<InputTensor>) -> Result<RankInput, ServiceError> {
        let row_form = |t: &&InputTensor| t.name == CATEGORICAL || t.name == DENSE;
        if let Some(g) = inputs
            .iter()
            .find(|t| grouped::INPUTS.contains(&t.name.as_str()))
        {
            if let Some(r) = inputs.iter().find(row_form) {
                return Err(ServiceError::invalid(
                    &g.name,
                    format!(
                        "is an input of the grouped form, but the request also sends {}, an input of the row form: \
                         send either the row form ({}) or the grouped form ({})",
                        r.name,
                        self.input_list(),
                        self.grouped_list()
                    ),
                ));
            }
            return self.grouped_rank_input(inputs);
        }
        let fields = self.contract.fields();
        let dense_features = self.contract.dense_features;
        let mut categorical = None;
        let mut dense = None;
        let mut candidate = None;
        for input in inputs {
            let slot = match input.name.as_str() {
                CATEGORICAL => &mut categorical,
                DENSE if dense_features > 0 => &mut dense,
                CANDIDATE_FEATURES if self.contract.candidate_features > 0 => &mut candidate,
                _ => return Err(self.not_an_input(&input.name)),
            };
            if slot.is_some() {
                return Err(ServiceError::invalid(&input.name, "is given twice"));
            }
            *slot = Some(input);
        }
        let missing = |name: &str| {
            ServiceError::invalid(
                name,
                format!(
                    "is missing (model {:?} takes {})",
                    self.model,
                    self.input_list()
                ),
            )
        };
        let categorical = categorical.ok_or_else(|| missing(CATEGORICAL))?;
        let dense = match dense {
            Some(d) => Some(d),
            None if dense_features > 0 => return Err(missing(DENSE)),
            None => None,
        };

        categorical.expect_datatype(Datatype::Int64)?;
        let rows = rows_of(
            &categorical,
            "B",
            fields,
            "fields of the model, in model.toml order",
        )?;
        self.contract
            .check_rows(rows)
            .map_err(|problem| ServiceError::invalid(CATEGORICAL, problem))?;
        if let Some(dense) = &dense {
            dense.expect_datatype(Datatype::Fp32)?;
            let dense_rows = rows_of(dense, "B", dense_features, "dense features of the model")?;
            if dense_rows != rows {
                return Err(ServiceError::invalid(
                    DENSE,
                    format!("has {dense_rows} rows, but {CATEGORICAL} has {rows}"),
                ));
            }
        }

        let ids = categorical.into_i64()?;
        check_ids(
            self.contract,
            CATEGORICAL,
            &ids,
            &(0..fields).collect::<Vec<_>>(),
        )?;
        let dense = match dense {
            Some(dense) => self.dense_values(dense, DENSE)?,
            None => Vec::new(),
        };
        let candidate = self.candidate_values(candidate, rows, CATEGORICAL, missing)?;
        let dense = self
            .contract
            .join_dense(&dense, dense_features, &candidate, rows);
        Ok(RankInput { rows, ids, dense })
    }

    /// The values of a dense tensor (`[rows, dense_features]`, its shape checked) named `name`, each finite.
    fn dense_values(&self, dense: InputTensor, name: &str) -> Result<Vec<f32>, ServiceError> {
        let dense_features = self.contract.dense_features;
        let values = dense.into_f32()?;
        let names = self.dense_names();
        for (i, &v) in values.iter().enumerate() {
            RankContract::check_dense(v).map_err(|problem| {
                let column = i % dense_features;
                let feature = names.get(column).map_or("", String::as_str);
                ServiceError::invalid(
                    format!("{name}[{}, {column}]", i / dense_features),
                    format!("feature {feature:?}: {problem}"),
                )
            })?;
        }
        Ok(values)
    }
}

/// Checks each id of `tensor` (`[rows, columns.len()]`, the field of each column in `columns`) against its table.
fn check_ids(
    contract: &RankContract,
    tensor: &str,
    ids: &[i64],
    columns: &[usize],
) -> Result<(), ServiceError> {
    let width = columns.len().max(1);
    for (i, &id) in ids.iter().enumerate() {
        let (row, column) = (i / width, i % width);
        let field = columns[column];
        contract.check_id(field, id).map_err(|problem| {
            ServiceError::invalid(
                format!("{tensor}[{row}, {column}]"),
                format!("field {:?}: {problem}", contract.field_name(field)),
            )
        })?;
    }
    Ok(())
}

/// Tensors for messages: `name DATATYPE [shape]`, comma-separated.
fn list(tensors: &[TensorSpec]) -> String {
    tensors
        .iter()
        .map(|t| format!("{} {} {:?}", t.name, t.datatype.as_str(), t.shape))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The rows of a `[rows, columns]` tensor; `axis` names the rows (`B` for candidates, `U` for users) and `what`
/// says what the columns are.
fn rows_of(
    input: &InputTensor,
    axis: &str,
    columns: usize,
    what: &str,
) -> Result<usize, ServiceError> {
    match input.shape.as_slice() {
        &[rows, c] if usize::try_from(c) == Ok(columns) => usize::try_from(rows).map_err(|_| {
            ServiceError::invalid(
                &input.name,
                format!("shape {:?} has a negative dimension", input.shape),
            )
        }),
        _ => Err(ServiceError::invalid(
            &input.name,
            format!(
                "shape {:?} is not [{axis}, {columns}] ({axis} rows of the {columns} {what})",
                input.shape
            ),
        )),
    }
}

impl TensorContract for DeepFm<'_> {
    fn inputs(&self) -> Vec<TensorSpec> {
        self.tensors.inputs()
    }

    fn outputs(&self) -> Vec<TensorSpec> {
        self.tensors.outputs()
    }

    fn properties(&self) -> Vec<(String, String)> {
        let mut properties = vec![self.tensors.grouped_property()];
        properties.extend(self.tensors.id_properties());
        properties
    }

    fn run<'a>(
        &'a self,
        call: &'a ModelCall,
        inputs: Vec<InputTensor>,
        _parameters: &'a Parameters,
    ) -> Outputs<'a> {
        Box::pin(async move {
            let input = self.tensors.rank_input(inputs)?;
            let rows = input.rows as i64;
            let scores = call.rank(input).await?;
            Ok(vec![OutputTensor {
                name: self.tensors.output_name().to_owned(),
                shape: vec![rows, 1],
                data: OutputData::Fp32(scores),
            }])
        })
    }
}

#[cfg(test)]
mod tests {
    use axum::body::Bytes;
    use serde_json::json;

    use super::*;
    use crate::api::kserve::TensorData;
    use recserve_core::testing::test_contract::contract;

    fn tensor(name: &str, datatype: &str, shape: &[i64], data: TensorData) -> InputTensor {
        InputTensor {
            name: name.to_owned(),
            datatype: datatype.to_owned(),
            shape: shape.to_vec(),
            data,
        }
    }

    fn ids(shape: &[i64], data: serde_json::Value) -> InputTensor {
        tensor(CATEGORICAL, "INT64", shape, TensorData::Json(data))
    }

    fn dense(shape: &[i64], data: serde_json::Value) -> InputTensor {
        tensor(DENSE, "FP32", shape, TensorData::Json(data))
    }

    fn decode(inputs: Vec<InputTensor>) -> Result<RankInput, ServiceError> {
        let contract = contract();
        Tensors {
            model: "m",
            contract: &contract,
        }
        .rank_input(inputs)
    }

    #[test]
    fn metadata_follows_model_toml() {
        let contract = contract();
        let tensors = Tensors {
            model: "m",
            contract: &contract,
        };
        let inputs = tensors.inputs();
        assert_eq!(inputs.len(), 2);
        assert_eq!(
            (
                inputs[0].name.as_str(),
                inputs[0].datatype,
                inputs[0].shape.as_slice()
            ),
            (CATEGORICAL, Datatype::Int64, [-1, 3].as_slice())
        );
        assert_eq!(inputs[0].columns, ["u", "item", "cat"]);
        assert_eq!(
            (
                inputs[1].name.as_str(),
                inputs[1].datatype,
                inputs[1].shape.as_slice()
            ),
            (DENSE, Datatype::Fp32, [-1, 2].as_slice())
        );
        assert_eq!(inputs[1].columns, ["d0", "d1"]);
        let properties: std::collections::BTreeMap<String, String> =
            tensors.id_properties().into_iter().collect();
        let field = |name: &str| {
            ["min", "max", "oov"].map(|key| properties[&format!("field.{name}.{key}")].as_str())
        };
        assert_eq!(properties.len(), 9, "{properties:?}");
        assert_eq!(field("u"), ["0", "9", "reject"]);
        assert_eq!(field("item"), ["0", "99", "default"]);
        assert_eq!(field("cat"), ["0", "4", "reject"]);
        let outputs = tensors.outputs();
        assert_eq!(outputs.len(), 1);
        assert_eq!(
            (
                outputs[0].name.as_str(),
                outputs[0].datatype,
                outputs[0].shape.as_slice()
            ),
            ("ctr", Datatype::Fp32, [-1, 1].as_slice())
        );
    }

    #[test]
    fn rows_decode_like_v1_from_json_and_binary() {
        let expected = RankInput {
            rows: 2,
            ids: vec![7, 42, 1, 7, -5, 4],
            dense: vec![0.5, -1.0, 0.25, 2.0],
        };
        let json = decode(vec![
            dense(&[2, 2], json!([[0.5, -1], [0.25, 2]])),
            ids(&[2, 3], json!([[7, 42, 1], [7, -5, 4]])),
        ])
        .expect("valid JSON tensors");
        assert_eq!(json, expected);
        let raw = |bytes: Vec<u8>| TensorData::Raw(Bytes::from(bytes));
        let binary = decode(vec![
            tensor(
                CATEGORICAL,
                "INT64",
                &[2, 3],
                raw(expected.ids.iter().flat_map(|v| v.to_le_bytes()).collect()),
            ),
            tensor(
                DENSE,
                "FP32",
                &[2, 2],
                raw(expected
                    .dense
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect()),
            ),
        ])
        .expect("valid binary tensors");
        assert_eq!(binary, expected);
    }

    #[test]
    fn names_the_tensor_of_every_problem() {
        let ok_ids = || ids(&[1, 3], json!([[1, 2, 3]]));
        let ok_dense = || dense(&[1, 2], json!([[0, 0]]));
        let cases: Vec<(Vec<InputTensor>, &str)> = vec![
            (
                vec![ok_dense()],
                "categorical: is missing (model \"m\" takes categorical INT64 [-1, 3], dense FP32 [-1, 2])",
            ),
            (vec![ok_ids()], "dense: is missing"),
            (
                vec![ok_ids(), ok_dense(), ok_ids()],
                "categorical: is given twice",
            ),
            (
                vec![
                    ok_ids(),
                    ok_dense(),
                    dense(&[1, 2], json!([0, 0])).renamed("extra"),
                ],
                "extra: is not an input of model \"m\" (inputs: categorical INT64 [-1, 3], dense FP32 [-1, 2]; or, \
                 grouped by user: user_categorical INT64 [-1, 1], user_dense FP32 [-1, 2], item_categorical INT64 \
                 [-1, 2], candidates_per_user INT64 [-1])",
            ),
            (
                vec![
                    tensor(
                        CATEGORICAL,
                        "FP32",
                        &[1, 3],
                        TensorData::Json(json!([1, 2, 3])),
                    ),
                    ok_dense(),
                ],
                "categorical: datatype FP32, but the model takes INT64",
            ),
            (
                vec![
                    ok_ids(),
                    tensor(DENSE, "FP64", &[1, 2], TensorData::Json(json!([0, 0]))),
                ],
                "dense: datatype FP64, but the model takes FP32",
            ),
            (
                vec![ids(&[3], json!([1, 2, 3])), ok_dense()],
                "categorical: shape [3] is not [B, 3] (B rows of the 3 fields of the model, in model.toml order)",
            ),
            (
                vec![ids(&[1, 4], json!([1, 2, 3, 4])), ok_dense()],
                "categorical: shape [1, 4] is not [B, 3]",
            ),
            (
                vec![ids(&[-1, 3], json!([1, 2, 3])), ok_dense()],
                "categorical: shape [-1, 3] has a negative dimension",
            ),
            (
                vec![ids(&[0, 3], json!([])), dense(&[0, 2], json!([]))],
                "categorical: must hold at least one candidate",
            ),
            (
                vec![
                    ids(&[4, 3], json!(vec![0; 12])),
                    dense(&[4, 2], json!(vec![0; 8])),
                ],
                "categorical: holds 4 candidates, more than the limit of 3 (--max-candidates)",
            ),
            (
                vec![ids(&[2, 3], json!([1, 2, 3, 1, 2, 3])), ok_dense()],
                "dense: has 1 rows, but categorical has 2",
            ),
            (
                vec![ids(&[1, 3], json!([1, 2])), ok_dense()],
                "categorical: shape [1, 3] holds 3 elements, but the data holds 2",
            ),
            (
                vec![
                    ids(&[2, 3], json!([1, 2, 3, 1, 2, 5])),
                    dense(&[2, 2], json!([0, 0, 0, 0])),
                ],
                "categorical[1, 2]: field \"cat\": id 5 is outside the vocabulary of table \"cat\" (ids 0 to 4), which rejects unknown ids",
            ),
            (
                vec![ids(&[1, 3], json!([-1, 2, 3])), ok_dense()],
                "categorical[0, 0]: field \"u\": id -1 is outside the vocabulary",
            ),
            (
                vec![ok_ids(), dense(&[1, 2], json!([0, 1e39]))],
                "dense[0, 1]: feature \"d1\": must be a finite number, got inf",
            ),
            (
                vec![ok_ids(), dense(&[1, 2], json!([0, "x"]))],
                "dense: data[1] is \"x\", which is not an FP32 value",
            ),
        ];
        for (inputs, expected) in cases {
            let got = decode(inputs).expect_err(expected).to_string();
            assert!(
                got.starts_with(expected),
                "expected {expected:?}\ngot      {got:?}"
            );
        }
    }

    impl InputTensor {
        fn renamed(mut self, name: &str) -> InputTensor {
            self.name = name.to_owned();
            self
        }
    }
}
