//! The plain decoding of `/v1` rank bodies: serde derive into a map per candidate, then every check, in the
//! documented order. The server decodes with [`crate::api::v1::rank_body::decode_rank`], which reads the same bodies in
//! one pass; this one is what it is tested and benchmarked against, kept simple on purpose.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::api::envelope::parse_json;
use crate::api::v1::UserSide;
use crate::api::v1::rank_body::RankBody;
use crate::error::ServiceError;
use crate::ranking::{RankContract, RankInput};
use crate::repository::Side;

/// `POST /v1/models/{model}/rank`, as serde derive reads it.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RankRequest {
    #[serde(default)]
    pub user: Option<UserSide>,
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

/// Expands a rank request into rows: the user side repeated for every candidate.
fn rank_input(contract: &RankContract, req: &RankRequest) -> Result<RankInput, ServiceError> {
    let rows = req.candidates.len();
    contract
        .check_rows(rows)
        .map_err(|problem| ServiceError::invalid("candidates", problem))?;
    if req.top_k == Some(0) {
        return Err(ServiceError::invalid("top_k", "must be at least 1"));
    }
    contract.check_user_given(req.user.is_some())?;
    let user = req
        .user
        .as_ref()
        .map_or_else(UserSide::default, |u| UserSide {
            fields: u.fields.clone(),
            dense: u.dense.clone(),
        });
    contract.check_dense_values(&user.dense)?;

    let nf = contract.fields();
    let mut user_row = vec![0i64; nf];
    contract.fill_fields(
        "user.fields",
        &user.fields,
        &contract.user_fields,
        |name| contract.misplaced_field(name, Side::User),
        &mut user_row,
    )?;

    let mut ids = Vec::with_capacity(rows * nf);
    for (i, c) in req.candidates.iter().enumerate() {
        let start = ids.len();
        ids.extend_from_slice(&user_row);
        let row = &mut ids[start..];
        let path = format!("candidates[{i}].fields");
        contract.fill_fields(
            &path,
            &c.fields,
            &contract.item_fields,
            |name| contract.misplaced_field(name, Side::Item),
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
    let dense = user.dense.repeat(rows);
    Ok(RankInput { rows, ids, dense })
}

/// Parses (with [`parse_json`]) and checks a rank body.
pub fn decode_rank(contract: &RankContract, body: &[u8]) -> Result<RankBody, ServiceError> {
    let request: RankRequest = parse_json(body)?;
    let input = rank_input(contract, &request)?;
    Ok(RankBody {
        input,
        candidate_ids: request.candidates.iter().map(|c| c.id).collect(),
        top_k: request.top_k,
    })
}
