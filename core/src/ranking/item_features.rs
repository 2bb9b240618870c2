//! A ranking model's item feature table (`[item_features]` of its `model.toml`): for each catalogue item, the
//! ids of its item-side fields, so that a recommend pipeline can rank the items its recall model returns. Read
//! and checked when the ranking model loads.

use std::path::Path;

use crate::embedding::read_i64_tensor;
use crate::error::LoadError;
use crate::repository::{ModelSpec, OovPolicy};

/// A ranking model's item feature table: for catalogue item `i`, the ids of its item-side fields.
#[derive(Debug)]
pub(crate) struct ItemFeatures {
    rows: usize,
    /// The ranking field each column feeds (indices into the model's fields).
    columns: Vec<usize>,
    /// `[rows, columns]`, row-major.
    values: Vec<i64>,
    /// The model's `item_id_field` when no column feeds it: it then takes the item's id.
    id_field: Option<usize>,
}

impl ItemFeatures {
    /// Reads and checks the `[item_features]` of a ranking model, if it has one: the tensor exists, is I64 of shape
    /// `[items, columns]`, and every id in a column whose table rejects unknown ids is inside that table.
    pub(crate) fn open(dir: &Path, spec: &ModelSpec) -> Result<Option<ItemFeatures>, LoadError> {
        let Some(features) = &spec.item_features else {
            return Ok(None);
        };
        let path = dir.join(&features.file);
        let (values, shape) = read_i64_tensor(&path, &features.tensor, "[item_features]")?;
        let cols = features.fields.len();
        let rows = match shape.as_slice() {
            &[rows, c] if c == cols && rows > 0 => rows,
            shape => {
                return Err(LoadError::new(
                    &path,
                    format!(
                        "tensor {:?} is I64 {shape:?}, but [item_features] needs I64 [items, {cols}] (one column \
                         per entry of item_features.fields, at least one item)",
                        features.tensor
                    ),
                ));
            }
        };
        for (c, &field) in features.fields.iter().enumerate() {
            let table = &spec.tables[spec.fields[field].table].spec;
            if table.oov != OovPolicy::Reject {
                continue;
            }
            if let Some(row) = (0..rows).find(|&r| !table.contains(values[r * cols + c])) {
                return Err(LoadError::new(
                    &path,
                    format!(
                        "tensor {:?} row {row}, column {:?}: id {} is outside table {:?} ({}), which rejects \
                         unknown ids",
                        features.tensor,
                        spec.fields[field].name,
                        values[row * cols + c],
                        table.name,
                        table.id_range()
                    ),
                ));
            }
        }
        let id_field = spec
            .ranking
            .as_ref()
            .and_then(|r| r.item_id_field)
            .filter(|f| !features.fields.contains(f));
        Ok(Some(ItemFeatures {
            rows,
            columns: features.fields.clone(),
            values,
            id_field,
        }))
    }

    /// Items the table describes (ids `0..rows`).
    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    /// Writes item `id`'s item-side fields into `row` (one rank row, `[fields]`).
    pub(crate) fn fill(&self, id: u32, row: &mut [i64]) {
        let at = id as usize * self.columns.len();
        for (&field, &value) in self.columns.iter().zip(&self.values[at..]) {
            row[field] = value;
        }
        if let Some(field) = self.id_field {
            row[field] = i64::from(id);
        }
    }
}
