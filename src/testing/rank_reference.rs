//! The plain decoding of `/v1` rank bodies: serde derive into a map per candidate, then every check, in the
//! documented order. The server decodes with [`crate::api::v1::rank_body::decode_rank`], which reads the same bodies in
//! one pass; this one is what it is tested and benchmarked against, kept simple on purpose. The columnar form of
//! `candidates` is turned into the row form first ([`Columns::into_rows`]), so both forms meet the same checks.

use std::collections::HashMap;
use std::fmt;

use serde::de::value::{MapAccessDeserializer, SeqAccessDeserializer};
use serde::de::{MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::api::envelope::parse_json;
use crate::api::v1::UserSide;
use crate::api::v1::rank_body::RankBody;
use recserve_core::error::ServiceError;
use recserve_core::ranking::{RankContract, RankInput};
use recserve_core::repository::Side;

/// `POST /v1/models/{model}/rank`, as serde derive reads it.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct RankRequest {
    #[serde(default)]
    pub user: Option<UserSide>,
    pub candidates: Candidates,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
}

/// `candidates` in either form: an array (rows) or an object (columns).
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Candidates {
    Rows(Vec<Candidate>),
    Columns(Columns),
}

/// Told apart by the JSON type, so that errors inside either form keep their path (serde's untagged enums would
/// report only that no form matched).
impl<'de> Deserialize<'de> for Candidates {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> Visitor<'de> for Either {
            type Value = Candidates;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an array of candidates, or an object of columns")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Candidates, A::Error> {
                Vec::deserialize(SeqAccessDeserializer::new(seq)).map(Candidates::Rows)
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Candidates, A::Error> {
                Columns::deserialize(MapAccessDeserializer::new(map)).map(Candidates::Columns)
            }
        }
        deserializer.deserialize_any(Either)
    }
}

/// The columnar form: the item fields' names once, a row of ids per candidate, and their item ids.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Columns {
    pub fields: Vec<String>,
    pub ids: Vec<Vec<i64>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<Vec<Option<i64>>>,
}

impl Columns {
    /// The same candidates in the row form, once the matrix is checked: every name once, a row as long as the
    /// names, an id per row. Which names the model takes is for the row form's checks.
    pub fn into_rows(self) -> Result<Vec<Candidate>, ServiceError> {
        for (j, name) in self.fields.iter().enumerate() {
            if self.fields[..j].contains(name) {
                return Err(ServiceError::invalid(
                    format!("candidates.fields[{j}]"),
                    format!("{name:?} is given more than once"),
                ));
            }
        }
        if let Some(id) = &self.id
            && id.len() != self.ids.len()
        {
            return Err(ServiceError::invalid(
                "candidates.id",
                "holds a different number of ids than candidates.ids holds rows",
            ));
        }
        let mut rows = Vec::with_capacity(self.ids.len());
        for (i, row) in self.ids.into_iter().enumerate() {
            if row.len() != self.fields.len() {
                return Err(ServiceError::invalid(
                    format!("candidates.ids[{i}]"),
                    "holds a different number of ids than candidates.fields names",
                ));
            }
            rows.push(Candidate {
                id: self.id.as_ref().and_then(|ids| ids[i]),
                fields: self.fields.iter().cloned().zip(row).collect(),
            });
        }
        Ok(rows)
    }
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Candidate {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<i64>,
    #[serde(default)]
    pub fields: HashMap<String, i64>,
}

/// Expands a rank request (`candidates` in the row form) into rows: the user side repeated for every candidate.
fn rank_input(
    contract: &RankContract,
    req: &RankRequest,
    candidates: &[Candidate],
) -> Result<RankInput, ServiceError> {
    let rows = candidates.len();
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
    for (i, c) in candidates.iter().enumerate() {
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
            let id =
                c.id.ok_or_else(|| contract.item_id_required(format!("candidates[{i}].id"), f))?;
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
    let mut request: RankRequest = parse_json(body)?;
    let candidates = match std::mem::replace(&mut request.candidates, Candidates::Rows(Vec::new()))
    {
        Candidates::Rows(rows) => rows,
        Candidates::Columns(columns) => columns.into_rows()?,
    };
    let input = rank_input(contract, &request, &candidates)?;
    Ok(RankBody {
        input,
        candidate_ids: candidates.iter().map(|c| c.id).collect(),
        top_k: request.top_k,
    })
}

/// The columnar form of a row-form rank request (a JSON value): its columns in the order of `columns` (when
/// `None`, of the first candidate's `fields`), with `id` when any candidate has one (null for those without).
/// What tests and benchmarks send to compare the two forms.
pub fn to_columnar(request: &serde_json::Value, columns: Option<&[String]>) -> serde_json::Value {
    use serde_json::{Value, json};
    let candidates = request["candidates"]
        .as_array()
        .expect("a row-form request");
    let columns: Vec<String> = match columns {
        Some(columns) => columns.to_vec(),
        None => candidates
            .first()
            .and_then(|c| c["fields"].as_object())
            .map(|fields| fields.keys().cloned().collect())
            .unwrap_or_default(),
    };
    let ids: Vec<Value> = candidates
        .iter()
        .map(|c| {
            columns
                .iter()
                .map(|name| c["fields"][name].clone())
                .collect()
        })
        .collect();
    let mut columnar = json!({"fields": columns, "ids": ids});
    if candidates.iter().any(|c| c.get("id").is_some()) {
        columnar["id"] = candidates
            .iter()
            .map(|c| c.get("id").cloned().unwrap_or(Value::Null))
            .collect();
    }
    let mut out = request.clone();
    out["candidates"] = columnar;
    out
}
