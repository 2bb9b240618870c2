//! The two JSON forms of a `/v1` rank request (docs/api.md) and the one value both stand for. The row form names
//! every field of every candidate (`"candidates": [{"id": 7, "fields": {"C14": 3, ...}}, ...]`); the columnar form
//! names the item fields once and sends the candidates as an id matrix (`"candidates": {"fields": ["C14", ...],
//! "ids": [[3, ...], ...], "id": [7, ...]}`). A [`RankBody`] is written in either form, so the ranking workload
//! generates a request once and sends it in the form asked for (the same seed gives the same rows in both), and
//! it is read from either form, so a saved request can be sent in the other form or rewritten into tensors.

use std::collections::BTreeMap;

use clap::ValueEnum;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// How a ranking request's candidates are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BodyForm {
    /// `candidates` is an array of `{"id", "fields": {name: id}}`.
    #[default]
    Rows,
    /// `candidates` is an object: `fields` (the item fields' names, once), `ids` (one row of ids per candidate, in
    /// the order of `fields`), `id` (one per candidate).
    Columnar,
}

impl BodyForm {
    pub fn as_str(self) -> &'static str {
        match self {
            BodyForm::Rows => "rows",
            BodyForm::Columnar => "columnar",
        }
    }
}

/// One ranking request, whichever form it is written in.
#[derive(Clone, Debug, PartialEq)]
pub struct RankBody {
    /// `user.fields`.
    pub user_fields: BTreeMap<String, i64>,
    /// `user.dense`; `None` when the request has no `dense` key.
    pub dense: Option<Vec<f32>>,
    /// The item fields each candidate carries, by name (ascending): the columns of `ids`.
    pub item_fields: Vec<String>,
    /// Row-major `[candidates, item_fields]`.
    pub ids: Vec<i64>,
    /// Each candidate's `id`, when the request gives them (all or none).
    pub candidate_ids: Option<Vec<i64>>,
    /// Candidates (rows of `ids`).
    pub candidates: usize,
    pub top_k: Option<usize>,
}

#[derive(Serialize)]
struct User<'a> {
    fields: &'a BTreeMap<String, i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    dense: Option<&'a [f32]>,
}

#[derive(Serialize)]
struct RowsBody<'a> {
    user: User<'a>,
    candidates: Vec<Row<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<usize>,
}

#[derive(Serialize)]
struct Row<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<i64>,
    fields: BTreeMap<&'a str, i64>,
}

#[derive(Serialize)]
struct ColumnarBody<'a> {
    user: User<'a>,
    candidates: Columns<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<usize>,
}

/// `fields` first: a decoder that meets the names before the ids places each id as it reads it.
#[derive(Serialize)]
struct Columns<'a> {
    fields: &'a [String],
    ids: Vec<&'a [i64]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<&'a [i64]>,
}

impl RankBody {
    /// Row `i` of the id matrix.
    pub fn row(&self, i: usize) -> &[i64] {
        let width = self.item_fields.len();
        &self.ids[i * width..(i + 1) * width]
    }

    /// The request as JSON in `form`.
    pub fn to_json(&self, form: BodyForm) -> Vec<u8> {
        let user = User {
            fields: &self.user_fields,
            dense: self.dense.as_deref(),
        };
        let written = match form {
            BodyForm::Rows => serde_json::to_vec(&RowsBody {
                user,
                candidates: (0..self.candidates)
                    .map(|i| Row {
                        id: self.candidate_ids.as_ref().map(|ids| ids[i]),
                        fields: self
                            .item_fields
                            .iter()
                            .map(String::as_str)
                            .zip(self.row(i).iter().copied())
                            .collect(),
                    })
                    .collect(),
                top_k: self.top_k,
            }),
            BodyForm::Columnar => serde_json::to_vec(&ColumnarBody {
                user,
                candidates: Columns {
                    fields: &self.item_fields,
                    ids: (0..self.candidates).map(|i| self.row(i)).collect(),
                    id: self.candidate_ids.as_deref(),
                },
                top_k: self.top_k,
            }),
        };
        written.expect("plain data serializes")
    }

    /// Reads a request in either form. The message names the part of the body that is not a ranking request.
    pub fn parse(body: &[u8]) -> Result<RankBody, String> {
        let value: Value =
            serde_json::from_slice(body).map_err(|e| format!("not a /v1 rank body: {e}"))?;
        let root = value
            .as_object()
            .ok_or("not a /v1 rank body: not an object")?;
        let empty = Map::new();
        let user = match root.get("user") {
            None => &empty,
            Some(u) => u.as_object().ok_or("user: not an object")?,
        };
        let user_fields = match user.get("fields") {
            None => BTreeMap::new(),
            Some(f) => f
                .as_object()
                .ok_or("user.fields: not an object")?
                .iter()
                .map(|(name, id)| Ok((name.clone(), integer(id, &format!("user.fields.{name}"))?)))
                .collect::<Result<_, String>>()?,
        };
        let dense = match user.get("dense") {
            None => None,
            Some(d) => Some(
                d.as_array()
                    .ok_or("user.dense: not an array")?
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        v.as_f64()
                            .map(|x| x as f32)
                            .ok_or_else(|| format!("user.dense[{i}]: not a number"))
                    })
                    .collect::<Result<_, _>>()?,
            ),
        };
        let top_k = match root.get("top_k") {
            None | Some(Value::Null) => None,
            Some(k) => Some(
                k.as_u64()
                    .and_then(|k| usize::try_from(k).ok())
                    .ok_or("top_k: not a count")?,
            ),
        };
        let mut body = match root.get("candidates") {
            Some(Value::Array(rows)) => from_rows(rows)?,
            Some(Value::Object(columns)) => from_columns(columns)?,
            Some(_) => return Err("candidates: neither an array nor an object".to_owned()),
            None => return Err("the body has no candidates".to_owned()),
        };
        body.user_fields = user_fields;
        body.dense = dense;
        body.top_k = top_k;
        Ok(body)
    }
}

fn integer(v: &Value, path: &str) -> Result<i64, String> {
    v.as_i64()
        .ok_or_else(|| format!("{path}: not an integer id"))
}

/// The candidates of the row form; the item fields are the first candidate's, and every candidate must carry the
/// same ones.
fn from_rows(rows: &[Value]) -> Result<RankBody, String> {
    let mut item_fields: Vec<String> = Vec::new();
    let mut ids = Vec::new();
    let mut candidate_ids = Vec::new();
    let mut with_ids = false;
    let empty = Map::new();
    for (i, row) in rows.iter().enumerate() {
        let row = row
            .as_object()
            .ok_or_else(|| format!("candidates[{i}]: not an object"))?;
        let fields = match row.get("fields") {
            None => &empty,
            Some(f) => f
                .as_object()
                .ok_or_else(|| format!("candidates[{i}].fields: not an object"))?,
        };
        let mut names: Vec<&String> = fields.keys().collect();
        names.sort();
        if i == 0 {
            item_fields = names.iter().map(|n| (*n).clone()).collect();
        } else if !names.iter().copied().eq(item_fields.iter()) {
            return Err(format!(
                "candidates[{i}].fields: names other fields than candidates[0] ({})",
                item_fields.join(", ")
            ));
        }
        for name in names {
            ids.push(integer(
                &fields[name],
                &format!("candidates[{i}].fields.{name}"),
            )?);
        }
        let id = row.get("id").filter(|v| !v.is_null());
        if i == 0 {
            with_ids = id.is_some();
        }
        match (id, with_ids) {
            (Some(id), true) => candidate_ids.push(integer(id, &format!("candidates[{i}].id"))?),
            (None, false) => {}
            (None, true) => {
                return Err(format!(
                    "candidates[{i}].id: missing, where candidates[0] has one"
                ));
            }
            (Some(_), false) => {
                return Err(format!(
                    "candidates[{i}].id: present, where candidates[0] has none"
                ));
            }
        }
    }
    Ok(RankBody {
        user_fields: BTreeMap::new(),
        dense: None,
        item_fields,
        ids,
        candidate_ids: with_ids.then_some(candidate_ids),
        candidates: rows.len(),
        top_k: None,
    })
}

/// The candidates of the columnar form, columns sorted by name as the row form's are.
fn from_columns(columns: &Map<String, Value>) -> Result<RankBody, String> {
    let names: Vec<String> = columns
        .get("fields")
        .and_then(Value::as_array)
        .ok_or("candidates.fields: not an array")?
        .iter()
        .enumerate()
        .map(|(j, n)| {
            n.as_str()
                .map(str::to_owned)
                .ok_or_else(|| format!("candidates.fields[{j}]: not a name"))
        })
        .collect::<Result<_, _>>()?;
    let mut order: Vec<usize> = (0..names.len()).collect();
    order.sort_by(|&a, &b| names[a].cmp(&names[b]));
    if let Some(w) = order.windows(2).find(|w| names[w[0]] == names[w[1]]) {
        return Err(format!(
            "candidates.fields: {:?} appears twice",
            names[w[0]]
        ));
    }
    let rows = columns
        .get("ids")
        .and_then(Value::as_array)
        .ok_or("candidates.ids: not an array")?;
    let mut ids = Vec::with_capacity(rows.len() * names.len());
    for (i, row) in rows.iter().enumerate() {
        let row = row
            .as_array()
            .filter(|r| r.len() == names.len())
            .ok_or_else(|| format!("candidates.ids[{i}]: not an array of {} ids", names.len()))?;
        for &j in &order {
            ids.push(integer(&row[j], &format!("candidates.ids[{i}][{j}]"))?);
        }
    }
    let candidate_ids = match columns.get("id").filter(|v| !v.is_null()) {
        None => None,
        Some(v) => {
            let list = v
                .as_array()
                .filter(|l| l.len() == rows.len())
                .ok_or_else(|| format!("candidates.id: not an array of {} ids", rows.len()))?;
            Some(
                list.iter()
                    .enumerate()
                    .map(|(i, id)| integer(id, &format!("candidates.id[{i}]")))
                    .collect::<Result<_, _>>()?,
            )
        }
    };
    Ok(RankBody {
        user_fields: BTreeMap::new(),
        dense: None,
        item_fields: order.iter().map(|&j| names[j].clone()).collect(),
        ids,
        candidate_ids,
        candidates: rows.len(),
        top_k: None,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn body() -> RankBody {
        RankBody {
            user_fields: [("u1".to_owned(), 5), ("u2".to_owned(), 6)].into(),
            dense: Some(vec![1.5, 0.0]),
            item_fields: vec!["a".to_owned(), "b".to_owned()],
            ids: vec![10, 11, 20, 21, 30, 31],
            candidate_ids: Some(vec![7, 8, 9]),
            candidates: 3,
            top_k: Some(2),
        }
    }

    #[test]
    fn the_two_forms_are_written_as_docs_api_md_gives_them() {
        let b = body();
        let rows: Value = serde_json::from_slice(&b.to_json(BodyForm::Rows)).expect("JSON");
        assert_eq!(
            rows,
            json!({
                "user": {"fields": {"u1": 5, "u2": 6}, "dense": [1.5, 0.0]},
                "candidates": [
                    {"id": 7, "fields": {"a": 10, "b": 11}},
                    {"id": 8, "fields": {"a": 20, "b": 21}},
                    {"id": 9, "fields": {"a": 30, "b": 31}},
                ],
                "top_k": 2,
            })
        );
        let columnar = b.to_json(BodyForm::Columnar);
        assert_eq!(
            serde_json::from_slice::<Value>(&columnar).expect("JSON"),
            json!({
                "user": {"fields": {"u1": 5, "u2": 6}, "dense": [1.5, 0.0]},
                "candidates": {"fields": ["a", "b"], "ids": [[10, 11], [20, 21], [30, 31]], "id": [7, 8, 9]},
                "top_k": 2,
            })
        );
        // The names come before the ids, so a decoder knows each column as it reads it.
        let text = String::from_utf8(columnar.clone()).expect("UTF-8");
        assert!(text.find("\"fields\":[").expect("names") < text.find("\"ids\"").expect("ids"));
        assert!(columnar.len() < b.to_json(BodyForm::Rows).len());

        // Without candidate ids, dense values or top_k, neither form has the keys.
        let bare = RankBody {
            dense: None,
            candidate_ids: None,
            top_k: None,
            ..body()
        };
        for form in [BodyForm::Rows, BodyForm::Columnar] {
            let text = String::from_utf8(bare.to_json(form)).expect("UTF-8");
            for key in ["\"id\"", "\"dense\"", "\"top_k\""] {
                assert!(!text.contains(key), "{form:?}: {text}");
            }
        }
    }

    #[test]
    fn either_form_reads_back_as_the_same_body() {
        let b = body();
        for form in [BodyForm::Rows, BodyForm::Columnar] {
            assert_eq!(
                RankBody::parse(&b.to_json(form)).expect("parsed"),
                b,
                "{form:?}"
            );
        }
        // Columns in another order, keys in another order: the same request.
        let shuffled =
            br#"{"top_k": 2, "candidates": {"id": [7, 8, 9], "ids": [[11, 10], [21, 20], [31, 30]],
            "fields": ["b", "a"]}, "user": {"dense": [1.5, 0], "fields": {"u2": 6, "u1": 5}}}"#;
        assert_eq!(RankBody::parse(shuffled).expect("parsed"), b);
    }

    #[test]
    fn what_is_not_a_ranking_request_is_named() {
        for (bad, problem) in [
            (&b"["[..], "not a /v1 rank body"),
            (b"[1]", "not an object"),
            (br#"{"user": {}}"#, "no candidates"),
            (br#"{"candidates": 3}"#, "neither an array nor an object"),
            (
                br#"{"user": {"fields": {"u": "x"}}, "candidates": []}"#,
                "user.fields.u: not an integer id",
            ),
            (
                br#"{"user": {"dense": [1, "x"]}, "candidates": []}"#,
                "user.dense[1]: not a number",
            ),
            (
                br#"{"candidates": [{"fields": {"a": 1}}, {"fields": {"b": 1}}]}"#,
                "candidates[1].fields: names other",
            ),
            (
                br#"{"candidates": [{"id": 1}, {}]}"#,
                "candidates[1].id: missing",
            ),
            (
                br#"{"candidates": [{}, {"id": 1}]}"#,
                "candidates[1].id: present",
            ),
            (
                br#"{"candidates": [{}, {}, {"id": 1}]}"#,
                "candidates[2].id: present",
            ),
            (
                br#"{"candidates": {"fields": ["a", "a"], "ids": []}}"#,
                "\"a\" appears twice",
            ),
            (
                br#"{"candidates": {"fields": ["a"], "ids": [[1, 2]]}}"#,
                "candidates.ids[0]: not an array of 1 ids",
            ),
            (
                br#"{"candidates": {"fields": ["a"], "ids": [[1.5]]}}"#,
                "candidates.ids[0][0]: not an integer id",
            ),
            (
                br#"{"candidates": {"fields": ["a"], "ids": [[1]], "id": []}}"#,
                "candidates.id: not an array of 1",
            ),
            (br#"{"candidates": [], "top_k": -1}"#, "top_k: not a count"),
        ] {
            let err = RankBody::parse(bad).expect_err("refused");
            assert!(
                err.contains(problem),
                "{}: {err}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
