//! The grouped form of the DeepFM tensor contract: each user's fields once, not repeated on every candidate's row.
//! `user_categorical` INT64 `[U, Fu]` (the user-side fields, in `model.toml` order), `user_dense` FP32 `[U, N]`
//! (absent when the model has no dense features), `candidate_features` FP32 `[B, C]` (as in the row form: one row
//! per candidate; absent when the model has none), `item_categorical` INT64 `[B, Fi]` (the item-side fields, the
//! `item_id_field` among them, in `model.toml` order) and, when `U > 1`, `candidates_per_user` INT64 `[U]`
//! (positive, summing to `B`): the first `n0` rows of `item_categorical` are user 0's candidates, the next `n1`
//! user 1's, and so on. The rows to score are those of the row form (`categorical` `[B, F]`, `dense` `[B, N]`) for
//! the same candidates, and so are the output and every check ([`recserve_core::ranking::RankContract`]'s, naming the tensor). Generic
//! clients build the row form from the metadata's `inputs`; the grouped form is described in its `properties`
//! ([`Tensors::grouped_inputs`]).

use super::{Tensors, check_ids, rows_of};
use crate::api::kserve::{Datatype, InputTensor, TensorSpec};
use recserve_core::error::ServiceError;
use recserve_core::ranking::RankInput;
use recserve_core::repository::Side;

/// The user-side ids, one row per user.
pub(crate) const USER_CATEGORICAL: &str = "user_categorical";
/// The dense features, one row per user.
pub(crate) const USER_DENSE: &str = "user_dense";
/// The item-side ids, one row per candidate.
pub(crate) const ITEM_CATEGORICAL: &str = "item_categorical";
/// How many rows of `item_categorical` belong to each user, in order.
pub(crate) const CANDIDATES_PER_USER: &str = "candidates_per_user";

/// Every input of the grouped form.
pub(crate) const INPUTS: [&str; 4] = [
    USER_CATEGORICAL,
    USER_DENSE,
    ITEM_CATEGORICAL,
    CANDIDATES_PER_USER,
];

/// The metadata property that describes the grouped form's inputs.
pub(crate) const PROPERTY: &str = "grouped_inputs";

impl Tensors<'_> {
    /// The item-side fields in `model.toml` order, the `item_id_field` among them: the columns of
    /// `item_categorical`.
    fn item_columns(&self) -> Vec<usize> {
        let fields = &self.contract.spec.fields;
        (0..fields.len())
            .filter(|&f| fields[f].side == Side::Item)
            .collect()
    }

    /// The grouped form's inputs (the metadata lists them in its `properties`, [`PROPERTY`]).
    pub(crate) fn grouped_inputs(&self) -> Vec<TensorSpec> {
        let contract = self.contract;
        let names = |fields: &[usize]| {
            fields
                .iter()
                .map(|&f| contract.field_name(f).to_owned())
                .collect()
        };
        let item_columns = self.item_columns();
        let mut inputs = vec![TensorSpec {
            name: USER_CATEGORICAL.to_owned(),
            datatype: Datatype::Int64,
            shape: vec![-1, contract.user_fields.len() as i64],
            columns: names(&contract.user_fields),
        }];
        if contract.dense_features > 0 {
            inputs.push(TensorSpec {
                name: USER_DENSE.to_owned(),
                datatype: Datatype::Fp32,
                shape: vec![-1, contract.dense_features as i64],
                columns: self.dense_names(),
            });
        }
        inputs.push(TensorSpec {
            name: ITEM_CATEGORICAL.to_owned(),
            datatype: Datatype::Int64,
            shape: vec![-1, item_columns.len() as i64],
            columns: names(&item_columns),
        });
        inputs.extend(self.candidate_features_input());
        inputs.push(TensorSpec {
            name: CANDIDATES_PER_USER.to_owned(),
            datatype: Datatype::Int64,
            shape: vec![-1],
            columns: Vec::new(),
        });
        inputs
    }

    /// The metadata's `properties` entry for the grouped form: its inputs as a JSON array of the objects that
    /// describe the row form's in the HTTP metadata (`name`, `datatype`, `shape`, `columns`), so that a client of
    /// either transport can build a grouped request from the metadata alone.
    pub(crate) fn grouped_property(&self) -> (String, String) {
        /// One input, as the HTTP metadata writes the row form's.
        #[derive(serde::Serialize)]
        struct Described<'a> {
            name: &'a str,
            datatype: &'static str,
            shape: &'a [i64],
            #[serde(skip_serializing_if = "<[String]>::is_empty")]
            columns: &'a [String],
        }
        let inputs = self.grouped_inputs();
        let described: Vec<Described> = inputs
            .iter()
            .map(|t| Described {
                name: &t.name,
                datatype: t.datatype.as_str(),
                shape: &t.shape,
                columns: &t.columns,
            })
            .collect();
        let json = serde_json::to_string(&described).unwrap_or_default();
        (PROPERTY.to_owned(), json)
    }

    /// The grouped form's inputs, for messages.
    pub(super) fn grouped_list(&self) -> String {
        super::list(&self.grouped_inputs())
    }

    /// Checks the grouped form's inputs against the contract and builds the rows to score: each candidate's
    /// item ids beside its user's ids and dense features.
    pub(super) fn grouped_rank_input(
        &self,
        inputs: Vec<InputTensor>,
    ) -> Result<RankInput, ServiceError> {
        let contract = self.contract;
        let dense_features = contract.dense_features;
        let (mut user, mut user_dense, mut item, mut counts) = (None, None, None, None);
        let mut candidate = None;
        for input in inputs {
            let slot = match input.name.as_str() {
                USER_CATEGORICAL => &mut user,
                USER_DENSE if dense_features > 0 => &mut user_dense,
                super::CANDIDATE_FEATURES if contract.candidate_features > 0 => &mut candidate,
                ITEM_CATEGORICAL => &mut item,
                CANDIDATES_PER_USER => &mut counts,
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
                    "is missing (the grouped form of model {:?} takes {})",
                    self.model,
                    self.grouped_list()
                ),
            )
        };
        let user = user.ok_or_else(|| missing(USER_CATEGORICAL))?;
        let item = item.ok_or_else(|| missing(ITEM_CATEGORICAL))?;
        let user_dense = match user_dense {
            None if dense_features > 0 => return Err(missing(USER_DENSE)),
            dense => dense,
        };

        let user_fields = &contract.user_fields;
        let item_columns = self.item_columns();
        user.expect_datatype(Datatype::Int64)?;
        let users = rows_of(
            &user,
            "U",
            user_fields.len(),
            "user-side fields of the model, in model.toml order",
        )?;
        if users == 0 {
            return Err(ServiceError::invalid(
                USER_CATEGORICAL,
                format!(
                    "shape {:?} holds no user: send one row per user",
                    user.shape
                ),
            ));
        }
        item.expect_datatype(Datatype::Int64)?;
        let rows = rows_of(
            &item,
            "B",
            item_columns.len(),
            "item-side fields of the model, the item_id_field among them, in model.toml order",
        )?;
        contract
            .check_rows(rows)
            .map_err(|problem| ServiceError::invalid(ITEM_CATEGORICAL, problem))?;
        if let Some(dense) = &user_dense {
            dense.expect_datatype(Datatype::Fp32)?;
            let dense_users = rows_of(dense, "U", dense_features, "dense features of the model")?;
            if dense_users != users {
                return Err(ServiceError::invalid(
                    USER_DENSE,
                    format!("has {dense_users} rows, but {USER_CATEGORICAL} has {users}"),
                ));
            }
        }
        let counts = candidates_per_user(counts, users, rows)?;

        let user_ids = user.into_i64()?;
        check_ids(contract, USER_CATEGORICAL, &user_ids, user_fields)?;
        let item_ids = item.into_i64()?;
        check_ids(contract, ITEM_CATEGORICAL, &item_ids, &item_columns)?;
        let user_dense = match user_dense {
            Some(dense) => self.dense_values(dense, USER_DENSE)?,
            None => Vec::new(),
        };
        let features = self.candidate_values(candidate, rows, ITEM_CATEGORICAL, missing)?;
        let per_candidate = contract.candidate_features;

        let (fields, user_width, item_width) =
            (contract.fields(), user_fields.len(), item_columns.len());
        let mut ids = vec![0i64; rows * fields];
        let mut dense = Vec::with_capacity(rows * contract.dense_width());
        let mut candidate = 0;
        for (u, &n) in counts.iter().enumerate() {
            let user_row = &user_ids[u * user_width..(u + 1) * user_width];
            let dense_row = &user_dense[u * dense_features..(u + 1) * dense_features];
            for i in candidate..candidate + n {
                let row = &mut ids[i * fields..(i + 1) * fields];
                for (&f, &id) in user_fields.iter().zip(user_row) {
                    row[f] = id;
                }
                let item_row = &item_ids[i * item_width..(i + 1) * item_width];
                for (&f, &id) in item_columns.iter().zip(item_row) {
                    row[f] = id;
                }
                dense.extend_from_slice(dense_row);
                dense.extend_from_slice(&features[i * per_candidate..(i + 1) * per_candidate]);
            }
            candidate += n;
        }
        Ok(RankInput { rows, ids, dense })
    }
}

/// How many rows belong to each of `users` users: `candidates_per_user`, each at least 1, summing to `rows`; when
/// absent, every row belongs to the one user.
fn candidates_per_user(
    tensor: Option<InputTensor>,
    users: usize,
    rows: usize,
) -> Result<Vec<usize>, ServiceError> {
    let Some(tensor) = tensor else {
        if users == 1 {
            return Ok(vec![rows]);
        }
        return Err(ServiceError::invalid(
            CANDIDATES_PER_USER,
            format!(
                "is missing: {USER_CATEGORICAL} holds {users} users, so say how many rows of {ITEM_CATEGORICAL} \
                 belong to each (INT64 [{users}], in order, summing to {rows})"
            ),
        ));
    };
    tensor.expect_datatype(Datatype::Int64)?;
    if tensor.shape != [users as i64] {
        return Err(ServiceError::invalid(
            CANDIDATES_PER_USER,
            format!(
                "shape {:?} is not [{users}] (one count per row of {USER_CATEGORICAL})",
                tensor.shape
            ),
        ));
    }
    let counts = tensor.into_i64()?;
    let mut sum: usize = 0;
    let mut out = Vec::with_capacity(users);
    for (u, &n) in counts.iter().enumerate() {
        let n = usize::try_from(n).ok().filter(|&n| n > 0).ok_or_else(|| {
            ServiceError::invalid(
                format!("{CANDIDATES_PER_USER}[{u}]"),
                format!("is {n}: every user needs at least one row of {ITEM_CATEGORICAL}"),
            )
        })?;
        sum = sum.saturating_add(n);
        out.push(n);
    }
    if sum != rows {
        return Err(ServiceError::invalid(
            CANDIDATES_PER_USER,
            format!("sums to {sum}, but {ITEM_CATEGORICAL} has {rows} rows"),
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use axum::body::Bytes;
    use rand::rngs::StdRng;
    use rand::{RngExt, SeedableRng};
    use serde_json::json;

    use super::super::{CATEGORICAL, DENSE};
    use super::*;
    use crate::api::kserve::{TensorData, Typed};
    use recserve_core::ranking::RankContract;
    use recserve_core::testing::test_contract::{contract, featured_contract, wide_contract};

    fn tensor(name: &str, datatype: &str, shape: &[usize], data: TensorData) -> InputTensor {
        InputTensor {
            name: name.to_owned(),
            datatype: datatype.to_owned(),
            shape: shape.iter().map(|&d| d as i64).collect(),
            data,
        }
    }

    fn json(name: &str, datatype: &str, shape: &[usize], data: serde_json::Value) -> InputTensor {
        tensor(name, datatype, shape, TensorData::Json(data))
    }

    fn decode_with(
        contract: &RankContract,
        inputs: Vec<InputTensor>,
    ) -> Result<RankInput, ServiceError> {
        Tensors {
            model: "m",
            contract,
        }
        .rank_input(inputs)
    }

    /// A grouped request in one of the three forms of tensor data: JSON (0), little-endian bytes (1), typed
    /// contents (2).
    fn grouped(
        form: usize,
        user: &[Vec<i64>],
        dense: &[Vec<f32>],
        item: &[Vec<i64>],
        counts: Option<&[i64]>,
    ) -> Vec<InputTensor> {
        let shape = |rows: &[Vec<i64>]| [rows.len(), rows.first().map_or(0, Vec::len)];
        let ids = |name: &str, rows: &[Vec<i64>], shape: &[usize]| {
            let flat = rows.concat();
            let data = match form {
                0 if shape.len() == 1 => TensorData::Json(json!(flat)),
                0 => TensorData::Json(json!(rows)),
                1 => TensorData::Raw(Bytes::from(
                    flat.iter()
                        .flat_map(|v| v.to_le_bytes())
                        .collect::<Vec<u8>>(),
                )),
                _ => TensorData::Typed(Typed::Int64(flat)),
            };
            tensor(name, "INT64", shape, data)
        };
        let flat = dense.concat();
        let dense_data = match form {
            0 => TensorData::Json(json!(dense)),
            1 => TensorData::Raw(Bytes::from(
                flat.iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<u8>>(),
            )),
            _ => TensorData::Typed(Typed::Fp32(flat)),
        };
        let mut inputs = vec![
            ids(ITEM_CATEGORICAL, item, &shape(item)),
            tensor(
                USER_DENSE,
                "FP32",
                &[dense.len(), dense.first().map_or(0, Vec::len)],
                dense_data,
            ),
            ids(USER_CATEGORICAL, user, &shape(user)),
        ];
        if let Some(counts) = counts {
            inputs.push(ids(
                CANDIDATES_PER_USER,
                &[counts.to_vec()],
                &[counts.len()],
            ));
        }
        inputs
    }

    /// The row form of the same candidates: each item row beside its user's ids, in `columns` (field) order.
    fn rows(
        contract: &RankContract,
        user: &[Vec<i64>],
        dense: &[Vec<f32>],
        item: &[Vec<i64>],
        counts: &[i64],
    ) -> Vec<InputTensor> {
        let fields = contract.fields();
        let item_columns: Vec<usize> = (0..fields)
            .filter(|&f| contract.spec.fields[f].side == Side::Item)
            .collect();
        let (mut categorical, mut dense_rows) = (Vec::new(), Vec::new());
        let mut next = 0;
        for (u, &n) in counts.iter().enumerate() {
            for item_row in &item[next..next + n as usize] {
                let mut row = vec![0i64; fields];
                for (&f, &id) in contract.user_fields.iter().zip(&user[u]) {
                    row[f] = id;
                }
                for (&f, &id) in item_columns.iter().zip(item_row) {
                    row[f] = id;
                }
                categorical.push(row);
                dense_rows.push(dense[u].clone());
            }
            next += n as usize;
        }
        let b = categorical.len();
        vec![
            json(CATEGORICAL, "INT64", &[b, fields], json!(categorical)),
            json(
                DENSE,
                "FP32",
                &[b, contract.dense_features],
                json!(dense_rows),
            ),
        ]
    }

    #[test]
    fn grouped_tensors_decode_to_the_rows_of_the_row_form_in_every_data_form() {
        let contract = contract();
        // Fields: u (user), item, cat (item).
        let user = [vec![7], vec![3]];
        let dense = [vec![0.5, -1.0], vec![0.25, 2.0]];
        let item = [vec![42, 1], vec![-5, 4], vec![9, 0]];
        let expected = RankInput {
            rows: 3,
            ids: vec![7, 42, 1, 7, -5, 4, 3, 9, 0],
            dense: vec![0.5, -1.0, 0.5, -1.0, 0.25, 2.0],
        };
        assert_eq!(
            decode_with(&contract, rows(&contract, &user, &dense, &item, &[2, 1])).expect("rows"),
            expected
        );
        for form in 0..3 {
            let got = decode_with(
                &contract,
                grouped(form, &user, &dense, &item, Some(&[2, 1])),
            )
            .expect("valid grouped tensors");
            assert_eq!(got, expected, "data form {form}");
            // One user: candidates_per_user may be left out, or say all of them.
            let one = |counts| {
                decode_with(
                    &contract,
                    grouped(form, &user[..1], &dense[..1], &item, counts),
                )
            };
            let all = one(None).expect("one user");
            assert_eq!(all.ids, [7, 42, 1, 7, -5, 4, 7, 9, 0]);
            assert_eq!(one(Some(&[3])).expect("one user, counted"), all);
        }
    }

    /// Random users, counts and ids on the wide contract (user and item fields interleaved in model.toml order):
    /// the grouped form gives the rows of the row form.
    #[test]
    fn random_grouped_requests_decode_as_their_rows() {
        let contract = wide_contract();
        let mut rng = StdRng::seed_from_u64(23);
        for round in 0..200 {
            let users = rng.random_range(1..=5);
            let counts: Vec<i64> = (0..users).map(|_| rng.random_range(1..=8)).collect();
            let rows_total: i64 = counts.iter().sum();
            // Ids the rejecting tables (u0's and i1's, 50 rows) take.
            let user: Vec<Vec<i64>> = (0..users)
                .map(|_| (0..3).map(|_| rng.random_range(0..50)).collect())
                .collect();
            let dense: Vec<Vec<f32>> = (0..users)
                .map(|_| (0..3).map(|_| rng.random_range(-5.0..5.0f32)).collect())
                .collect();
            let item: Vec<Vec<i64>> = (0..rows_total)
                .map(|_| (0..5).map(|_| rng.random_range(0..50)).collect())
                .collect();
            let expected = decode_with(&contract, rows(&contract, &user, &dense, &item, &counts))
                .expect("the row form");
            let counts_given = users > 1 || round % 2 == 0;
            let got = decode_with(
                &contract,
                grouped(
                    round % 3,
                    &user,
                    &dense,
                    &item,
                    counts_given.then_some(counts.as_slice()),
                ),
            )
            .expect("the grouped form");
            assert_eq!(got, expected, "round {round}");
        }
    }

    #[test]
    fn the_metadata_describes_the_grouped_inputs_in_its_properties() {
        let contract = contract();
        let tensors = Tensors {
            model: "m",
            contract: &contract,
        };
        let (key, value) = tensors.grouped_property();
        assert_eq!(key, "grouped_inputs");
        let described: serde_json::Value = serde_json::from_str(&value).expect("JSON");
        assert_eq!(
            described,
            json!([
                {"name": "user_categorical", "datatype": "INT64", "shape": [-1, 1], "columns": ["u"]},
                {"name": "user_dense", "datatype": "FP32", "shape": [-1, 2], "columns": ["d0", "d1"]},
                {"name": "item_categorical", "datatype": "INT64", "shape": [-1, 2], "columns": ["item", "cat"]},
                {"name": "candidates_per_user", "datatype": "INT64", "shape": [-1]}
            ])
        );
    }

    #[test]
    fn names_the_tensor_of_every_problem() {
        let contract = contract();
        let user = || json(USER_CATEGORICAL, "INT64", &[2, 1], json!([[1], [2]]));
        let dense = || json(USER_DENSE, "FP32", &[2, 2], json!([[0, 0], [1, 1]]));
        let item = || {
            json(
                ITEM_CATEGORICAL,
                "INT64",
                &[3, 2],
                json!([[1, 2], [3, 4], [5, 0]]),
            )
        };
        let counts = |c: serde_json::Value| json(CANDIDATES_PER_USER, "INT64", &[2], c);
        let ok_counts = || counts(json!([2, 1]));
        let grouped_list = "user_categorical INT64 [-1, 1], user_dense FP32 [-1, 2], item_categorical INT64 \
                            [-1, 2], candidates_per_user INT64 [-1]";
        let cases: Vec<(Vec<InputTensor>, String)> = vec![
            (
                vec![user(), dense(), item(), ok_counts(), json(CATEGORICAL, "INT64", &[1, 3], json!([1, 2, 3]))],
                format!(
                    "user_categorical: is an input of the grouped form, but the request also sends categorical, an \
                     input of the row form: send either the row form (categorical INT64 [-1, 3], dense FP32 [-1, 2]) \
                     or the grouped form ({grouped_list})"
                ),
            ),
            (
                vec![json(DENSE, "FP32", &[1, 2], json!([0, 0])), item()],
                "item_categorical: is an input of the grouped form, but the request also sends dense".to_owned(),
            ),
            (vec![dense(), item(), ok_counts()], format!("user_categorical: is missing (the grouped form of model \"m\" takes {grouped_list})")),
            (vec![user(), dense(), ok_counts()], "item_categorical: is missing".to_owned()),
            (vec![user(), item(), ok_counts()], "user_dense: is missing".to_owned()),
            (vec![user(), dense(), item(), ok_counts(), user()], "user_categorical: is given twice".to_owned()),
            (
                vec![user(), dense(), item(), ok_counts(), json("extra", "INT64", &[1], json!([1]))],
                "extra: is not an input of model \"m\" (inputs: categorical INT64 [-1, 3], dense FP32 [-1, 2]; or, grouped by user: user_categorical".to_owned(),
            ),
            (
                vec![json(USER_CATEGORICAL, "INT32", &[2, 1], json!([[1], [2]])), dense(), item(), ok_counts()],
                "user_categorical: datatype INT32, but the model takes INT64".to_owned(),
            ),
            (
                vec![json(USER_CATEGORICAL, "INT64", &[1, 2], json!([[1, 2]])), dense(), item(), ok_counts()],
                "user_categorical: shape [1, 2] is not [U, 1] (U rows of the 1 user-side fields of the model, in model.toml order)".to_owned(),
            ),
            (
                vec![json(USER_CATEGORICAL, "INT64", &[0, 1], json!([])), json(USER_DENSE, "FP32", &[0, 2], json!([])), item()],
                "user_categorical: shape [0, 1] holds no user: send one row per user".to_owned(),
            ),
            (
                vec![user(), dense(), json(ITEM_CATEGORICAL, "INT64", &[3, 3], json!(vec![0; 9])), ok_counts()],
                "item_categorical: shape [3, 3] is not [B, 2] (B rows of the 2 item-side fields of the model, the item_id_field among them, in model.toml order)".to_owned(),
            ),
            (
                vec![user(), dense(), json(ITEM_CATEGORICAL, "INT64", &[0, 2], json!([])), ok_counts()],
                "item_categorical: must hold at least one candidate".to_owned(),
            ),
            (
                vec![user(), dense(), json(ITEM_CATEGORICAL, "INT64", &[4, 2], json!(vec![0; 8])), counts(json!([2, 2]))],
                "item_categorical: holds 4 candidates, more than the limit of 3 (--max-candidates)".to_owned(),
            ),
            (
                vec![user(), json(USER_DENSE, "FP32", &[1, 2], json!([0, 0])), item(), ok_counts()],
                "user_dense: has 1 rows, but user_categorical has 2".to_owned(),
            ),
            (
                vec![user(), dense(), item()],
                "candidates_per_user: is missing: user_categorical holds 2 users, so say how many rows of item_categorical belong to each (INT64 [2], in order, summing to 3)".to_owned(),
            ),
            (
                vec![user(), dense(), item(), json(CANDIDATES_PER_USER, "INT64", &[3], json!([1, 1, 1]))],
                "candidates_per_user: shape [3] is not [2] (one count per row of user_categorical)".to_owned(),
            ),
            (
                vec![user(), dense(), item(), json(CANDIDATES_PER_USER, "INT32", &[2], json!([2, 1]))],
                "candidates_per_user: datatype INT32, but the model takes INT64".to_owned(),
            ),
            (
                vec![user(), dense(), item(), counts(json!([3, 0]))],
                "candidates_per_user[1]: is 0: every user needs at least one row of item_categorical".to_owned(),
            ),
            (
                vec![user(), dense(), item(), counts(json!([-1, 4]))],
                "candidates_per_user[0]: is -1: every user needs at least one row of item_categorical".to_owned(),
            ),
            (
                vec![user(), dense(), item(), counts(json!([2, 2]))],
                "candidates_per_user: sums to 4, but item_categorical has 3 rows".to_owned(),
            ),
            (
                vec![user(), dense(), item(), counts(json!([i64::MAX, i64::MAX]))],
                format!(
                    "candidates_per_user: sums to {}, but item_categorical has 3 rows",
                    (i64::MAX as usize) * 2
                ),
            ),
            (
                vec![json(USER_CATEGORICAL, "INT64", &[2, 1], json!([[1], [10]])), dense(), item(), ok_counts()],
                "user_categorical[1, 0]: field \"u\": id 10 is outside the vocabulary of table \"u\" (ids 0 to 9), which rejects unknown ids".to_owned(),
            ),
            (
                vec![user(), dense(), json(ITEM_CATEGORICAL, "INT64", &[3, 2], json!([[1, 2], [3, 4], [5, 5]])), ok_counts()],
                "item_categorical[2, 1]: field \"cat\": id 5 is outside the vocabulary of table \"cat\" (ids 0 to 4)".to_owned(),
            ),
            (
                vec![user(), json(USER_DENSE, "FP32", &[2, 2], json!([[0, 0], [1, 1e39]])), item(), ok_counts()],
                "user_dense[1, 1]: feature \"d1\": must be a finite number, got inf".to_owned(),
            ),
            (
                vec![user(), dense(), tensor(ITEM_CATEGORICAL, "INT64", &[3, 2], TensorData::Raw(Bytes::from(vec![0u8; 40]))), ok_counts()],
                "item_categorical: holds 40 bytes of binary data, but shape [3, 2] of INT64 needs 48".to_owned(),
            ),
            (
                vec![user(), dense(), item(), counts(json!([2, "1"]))],
                "candidates_per_user: data[1] is \"1\", which is not an INT64 value".to_owned(),
            ),
        ];
        for (inputs, expected) in cases {
            let got = decode_with(&contract, inputs)
                .expect_err(&expected)
                .to_string();
            assert!(
                got.starts_with(&expected),
                "expected {expected:?}\ngot      {got:?}"
            );
        }
    }

    #[test]
    fn candidate_features_follow_the_dense_features_in_both_forms() {
        let contract = featured_contract();
        let features = || {
            json(
                super::super::CANDIDATE_FEATURES,
                "FP32",
                &[2, 2],
                json!([[3.5, 0], [-2, 1]]),
            )
        };
        let expected = RankInput {
            rows: 2,
            ids: vec![7, 42, 1, 7, 3, 4],
            dense: vec![0.5, -1.0, 3.5, 0.0, 0.5, -1.0, -2.0, 1.0],
        };
        let rows = decode_with(
            &contract,
            vec![
                json(
                    super::super::CATEGORICAL,
                    "INT64",
                    &[2, 3],
                    json!([[7, 42, 1], [7, 3, 4]]),
                ),
                json(
                    super::super::DENSE,
                    "FP32",
                    &[2, 2],
                    json!([[0.5, -1], [0.5, -1]]),
                ),
                features(),
            ],
        )
        .expect("row form");
        assert_eq!(rows, expected);
        let grouped = decode_with(
            &contract,
            vec![
                json(USER_CATEGORICAL, "INT64", &[1, 1], json!([[7]])),
                json(USER_DENSE, "FP32", &[1, 2], json!([[0.5, -1]])),
                json(ITEM_CATEGORICAL, "INT64", &[2, 2], json!([[42, 1], [3, 4]])),
                features(),
            ],
        )
        .expect("grouped form");
        assert_eq!(grouped, expected);
        let inputs = Tensors {
            model: "m",
            contract: &contract,
        }
        .inputs();
        let listed = inputs
            .iter()
            .find(|t| t.name == super::super::CANDIDATE_FEATURES)
            .expect("listed");
        assert_eq!(listed.columns, ["recall_score", "recall_rank"]);

        let refused = |inputs: Vec<InputTensor>| {
            decode_with(&contract, inputs)
                .expect_err("refused")
                .to_string()
        };
        let base = || {
            vec![
                json(USER_CATEGORICAL, "INT64", &[1, 1], json!([[7]])),
                json(USER_DENSE, "FP32", &[1, 2], json!([[0.5, -1]])),
                json(ITEM_CATEGORICAL, "INT64", &[2, 2], json!([[42, 1], [3, 4]])),
            ]
        };
        assert!(refused(base()).contains("candidate_features: is missing"));
        let mut short = base();
        short.push(json(
            super::super::CANDIDATE_FEATURES,
            "FP32",
            &[1, 2],
            json!([[1, 0]]),
        ));
        assert!(
            refused(short).contains("candidate_features: has 1 rows, but item_categorical has 2")
        );
        let mut bad = base();
        bad.push(json(
            super::super::CANDIDATE_FEATURES,
            "FP32",
            &[2, 2],
            json!([[1, 0], [1e39, 1]]),
        ));
        let got = refused(bad);
        assert!(
            got.contains(
                "candidate_features[1, 0]: feature \"recall_score\": must be a finite number"
            ),
            "{got}"
        );
        // A model without candidate features does not take the input.
        let plain = recserve_core::testing::test_contract::contract();
        let got = decode_with(
            &plain,
            vec![
                json(
                    super::super::CATEGORICAL,
                    "INT64",
                    &[1, 3],
                    json!([[7, 42, 1]]),
                ),
                json(super::super::DENSE, "FP32", &[1, 2], json!([[0.5, -1]])),
                json(
                    super::super::CANDIDATE_FEATURES,
                    "FP32",
                    &[1, 1],
                    json!([[1]]),
                ),
            ],
        )
        .expect_err("not an input")
        .to_string();
        assert!(
            got.contains("candidate_features: is not an input of model"),
            "{got}"
        );
    }
}
