//! The plain decoding of `/v1` rank bodies: serde derive into a map per candidate, then every check, in the
//! documented order. The server decodes with [`super::rank_body::decode_rank`], which reads the same bodies in
//! one pass; this one is what it is tested and benchmarked against, kept simple on purpose.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use super::rank_body::{RankBody, misplaced_field};
use super::v1::UserSide;
use crate::error::ServiceError;
use crate::ranking::{RankContract, RankInput};
use crate::repository::Side;

/// `POST /v1/models/{model}/rank`, as serde derive reads it.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RankRequest {
    #[serde(default)]
    pub user: UserSide,
    pub candidates: Vec<Candidate>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    #[serde(default)]
    pub fields: HashMap<String, i64>,
}

/// Checks one `fields` object against the fields it must hold exactly, writing each id into `row`.
fn fill_fields(
    contract: &RankContract,
    path: &str,
    given: &HashMap<String, i64>,
    expected: &[usize],
    side: Side,
    row: &mut [i64],
) -> Result<(), ServiceError> {
    for &f in expected {
        let name = contract.field_name(f);
        let id = *given
            .get(name)
            .ok_or_else(|| ServiceError::invalid(format!("{path}.{name}"), "is missing"))?;
        contract
            .check_id(f, id)
            .map_err(|problem| ServiceError::invalid(format!("{path}.{name}"), problem))?;
        row[f] = id;
    }
    if given.len() != expected.len() {
        let mut unknown: Vec<&String> = given
            .keys()
            .filter(|k| {
                !expected
                    .iter()
                    .any(|&f| contract.field_name(f) == k.as_str())
            })
            .collect();
        unknown.sort_unstable();
        if let Some(name) = unknown.first() {
            let problem = misplaced_field(contract, name, side);
            return Err(ServiceError::invalid(format!("{path}.{name}"), problem));
        }
    }
    Ok(())
}

/// Expands a rank request into rows: the user side repeated for every candidate.
fn rank_input(contract: &RankContract, req: &RankRequest) -> Result<RankInput, ServiceError> {
    let rows = req.candidates.len();
    contract
        .check_rows(rows)
        .map_err(|problem| ServiceError::invalid("candidates", problem))?;
    if req.top_k == Some(0) {
        return Err(ServiceError::invalid("top_k", "must be at least 1"));
    }
    if req.user.dense.len() != contract.dense_features {
        return Err(ServiceError::invalid(
            "user.dense",
            format!(
                "holds {} values, but the model takes {} dense features",
                req.user.dense.len(),
                contract.dense_features
            ),
        ));
    }
    for (i, &v) in req.user.dense.iter().enumerate() {
        RankContract::check_dense(v)
            .map_err(|problem| ServiceError::invalid(format!("user.dense[{i}]"), problem))?;
    }

    let nf = contract.fields();
    let mut user_row = vec![0i64; nf];
    fill_fields(
        contract,
        "user.fields",
        &req.user.fields,
        &contract.user_fields,
        Side::User,
        &mut user_row,
    )?;

    let mut ids = Vec::with_capacity(rows * nf);
    for (i, c) in req.candidates.iter().enumerate() {
        let start = ids.len();
        ids.extend_from_slice(&user_row);
        let row = &mut ids[start..];
        let path = format!("candidates[{i}].fields");
        fill_fields(
            contract,
            &path,
            &c.fields,
            &contract.item_fields,
            Side::Item,
            row,
        )?;
        if let Some(f) = contract.item_id_field {
            let id = c.id.ok_or_else(|| {
                ServiceError::invalid(
                    format!("candidates[{i}].id"),
                    format!(
                        "is required: it is the value of the model's item_id_field {:?}",
                        contract.field_name(f)
                    ),
                )
            })?;
            contract
                .check_id(f, id)
                .map_err(|problem| ServiceError::invalid(format!("candidates[{i}].id"), problem))?;
            row[f] = id;
        }
    }
    let dense = req.user.dense.repeat(rows);
    Ok(RankInput { rows, ids, dense })
}

/// Parses (with [`super::v1::parse_json`]) and checks a rank body.
pub fn decode_rank(contract: &RankContract, body: &[u8]) -> Result<RankBody, ServiceError> {
    let request: RankRequest = super::v1::parse_json(body)?;
    let input = rank_input(contract, &request)?;
    Ok(RankBody {
        input,
        candidate_ids: request.candidates.iter().map(|c| c.id).collect(),
        top_k: request.top_k,
    })
}
