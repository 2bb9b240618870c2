//! A `/v1` rank request as the KServe v2 tensors of a DeepFM model ([`TensorLayout`], from its `model.toml`): the
//! model's own row tensors ([`row_tensors`]) or the compact grouped form ([`grouped_batched_tensors`]), each a named,
//! typed, shaped [`Tensor`] of little-endian bytes. The HTTP target sends them as binary tensor data, the gRPC target
//! as `raw_input_contents`: one construction for both transports.

use bytes::{BufMut, Bytes, BytesMut};

use crate::workload::RankBody;

/// The columns of a DeepFM model's KServe v2 tensors, from its `model.toml`: `categorical` INT64 `[N, fields]` (a
/// row per candidate: its item fields, the request's user fields), `dense` FP32 `[N, dense]` (the request's
/// `user.dense` on every row); or, grouped, the user fields and the item fields apart, each in that order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorLayout {
    /// Field names in `[[fields]]` order: the columns of `categorical`.
    pub fields: Vec<String>,
    /// Those of `fields` on the user side, in the same order; the others are the item side's.
    pub user_fields: Vec<String>,
    /// The item-side field that a candidate's `id` feeds.
    pub item_id_field: Option<String>,
    /// Dense features per row.
    pub dense: usize,
}

impl TensorLayout {
    /// The layout of a DeepFM model's tensors, as its `model.toml` declares them.
    pub fn from_spec(spec: &recserve_core::repository::ModelSpec) -> TensorLayout {
        let ranking = spec.ranking.as_ref();
        TensorLayout {
            fields: spec.fields.iter().map(|f| f.name.clone()).collect(),
            user_fields: spec
                .fields
                .iter()
                .filter(|f| f.side == recserve_core::repository::Side::User)
                .map(|f| f.name.clone())
                .collect(),
            item_id_field: ranking
                .and_then(|r| r.item_id_field)
                .map(|f| spec.fields[f].name.clone()),
            dense: ranking.map_or(0, |r| r.dense_features.len()),
        }
    }
}

/// One input tensor: its name, KServe v2 datatype and shape, and its elements as little-endian bytes in row-major
/// order (the form of binary tensor data and of gRPC `raw_input_contents` alike).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub name: String,
    pub datatype: &'static str,
    pub shape: Vec<usize>,
    pub data: Bytes,
}

fn int64s(values: impl Iterator<Item = i64>) -> Bytes {
    let mut data = BytesMut::new();
    for v in values {
        data.put_i64_le(v);
    }
    data.freeze()
}

fn fp32s<'a>(values: impl Iterator<Item = &'a f32>) -> Bytes {
    let mut data = BytesMut::new();
    for &v in values {
        data.put_f32_le(v);
    }
    data.freeze()
}

/// The id of `field` for candidate `row` of `body`: the candidate's `id` for the item id field, else its own
/// column, else the user's.
fn id_of(layout: &TensorLayout, body: &RankBody, field: &str, row: usize) -> Result<i64, String> {
    let id = if layout.item_id_field.as_deref() == Some(field) {
        body.candidate_ids.as_ref().map(|ids| ids[row])
    } else if let Ok(column) = body.item_fields.binary_search_by(|f| f.as_str().cmp(field)) {
        Some(body.row(row)[column])
    } else {
        body.user_fields.get(field).copied()
    };
    id.ok_or_else(|| format!("candidates[{row}] has no integer id for field {field:?}"))
}

/// The body's `user.dense`, as many values as the layout's dense features.
fn dense_of<'a>(layout: &TensorLayout, body: &'a RankBody) -> Result<&'a [f32], String> {
    let dense = match &body.dense {
        None if layout.dense == 0 => &[][..],
        None => return Err("the body has no user.dense".to_owned()),
        Some(values) => values,
    };
    if dense.len() != layout.dense {
        return Err(format!(
            "user.dense holds {} values, the model {}",
            dense.len(),
            layout.dense
        ));
    }
    Ok(dense)
}

/// `body`, a `/v1` rank request in either form, as the model's own row tensors: `categorical` INT64
/// `[candidates, fields]` (a row per candidate, the user's ids repeated on every row) and, when the model has dense
/// features, `dense` FP32 `[candidates, dense]`.
pub fn row_tensors(layout: &TensorLayout, body: &[u8]) -> Result<Vec<Tensor>, String> {
    let request = RankBody::parse(body)?;
    let dense = dense_of(layout, &request)?;
    let rows = request.candidates;
    let mut ids = Vec::with_capacity(rows * layout.fields.len());
    for row in 0..rows {
        for field in &layout.fields {
            ids.push(id_of(layout, &request, field, row)?);
        }
    }
    let mut inputs = vec![Tensor {
        name: "categorical".to_owned(),
        datatype: "INT64",
        shape: vec![rows, layout.fields.len()],
        data: int64s(ids.into_iter()),
    }];
    if layout.dense > 0 {
        inputs.push(Tensor {
            name: "dense".to_owned(),
            datatype: "FP32",
            shape: vec![rows, layout.dense],
            data: fp32s((0..rows).flat_map(|_| dense.iter())),
        });
    }
    Ok(inputs)
}

/// `body`, a `/v1` rank request in either form, as the compact tensors of one user and its candidates for a model that batches requests (Triton's dynamic batcher): `user_categorical` INT64 `[1, user fields]`,
/// `user_dense` FP32 `[1, dense]` (when the model has dense features) and `item_categorical` INT64
/// `[1, candidates, item fields]`, columns in the model's field order (the item id field among the item fields),
/// each with a leading dimension of 1, the request being one element of the server's batch.
pub fn grouped_batched_tensors(layout: &TensorLayout, body: &[u8]) -> Result<Vec<Tensor>, String> {
    let request = RankBody::parse(body)?;
    let dense = dense_of(layout, &request)?;
    let rows = request.candidates;
    let user: Vec<i64> = layout
        .user_fields
        .iter()
        .map(|f| {
            request
                .user_fields
                .get(f)
                .copied()
                .ok_or_else(|| format!("user.fields has no integer id for field {f:?}"))
        })
        .collect::<Result<_, _>>()?;
    let item_fields: Vec<&String> = layout
        .fields
        .iter()
        .filter(|f| !layout.user_fields.contains(f))
        .collect();
    let mut items = Vec::with_capacity(rows * item_fields.len());
    for row in 0..rows {
        for field in &item_fields {
            items.push(id_of(layout, &request, field, row)?);
        }
    }
    let mut inputs = vec![Tensor {
        name: "user_categorical".to_owned(),
        datatype: "INT64",
        shape: vec![1, user.len()],
        data: int64s(user.into_iter()),
    }];
    if layout.dense > 0 {
        inputs.push(Tensor {
            name: "user_dense".to_owned(),
            datatype: "FP32",
            shape: vec![1, layout.dense],
            data: fp32s(dense.iter()),
        });
    }
    inputs.push(Tensor {
        name: "item_categorical".to_owned(),
        datatype: "INT64",
        shape: vec![1, rows, item_fields.len()],
        data: int64s(items.into_iter()),
    });
    Ok(inputs)
}
