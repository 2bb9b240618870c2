//! A ranking model's item feature table (`[item_features]` of its `model.toml`): for each catalogue item, the
//! ids of its item-side fields, so that a recommend pipeline can rank the items its recall model returns. Read
//! and checked when the ranking model loads.

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;
use safetensors::{Dtype, SafeTensors};

use crate::error::LoadError;
use crate::repository::{ModelSpec, OovPolicy};

/// A ranking model's item feature table: for catalogue item `i`, the ids of its item-side fields.
#[derive(Debug)]
pub struct ItemFeatures {
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
    pub fn open(dir: &Path, spec: &ModelSpec) -> Result<Option<ItemFeatures>, LoadError> {
        let Some(features) = &spec.item_features else {
            return Ok(None);
        };
        let path = dir.join(&features.file);
        let file = File::open(&path).map_err(|e| {
            LoadError::new(&path, format!("cannot open the item feature table: {e}"))
        })?;
        // SAFETY: read-only, and the repository is not modified while served (as for embedding tables).
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| LoadError::new(&path, format!("cannot memory-map: {e}")))?;
        let tensors = SafeTensors::deserialize(&map).map_err(|e| {
            LoadError::new(
                &path,
                format!("not a valid safetensors file (truncated or corrupt?): {e}"),
            )
        })?;
        let view = tensors.tensor(&features.tensor).map_err(|_| {
            let mut names = tensors.names();
            names.sort_unstable();
            LoadError::new(
                &path,
                format!(
                    "has no tensor {:?} for [item_features] (tensors in the file: {})",
                    features.tensor,
                    names.join(", ")
                ),
            )
        })?;
        let cols = features.fields.len();
        let rows = match (view.dtype(), view.shape()) {
            (Dtype::I64, &[rows, c]) if c == cols && rows > 0 => rows,
            (dtype, shape) => {
                return Err(LoadError::new(
                    &path,
                    format!(
                        "tensor {:?} is {dtype:?} {shape:?}, but [item_features] needs I64 [items, {cols}] (one column \
                         per entry of item_features.fields, at least one item)",
                        features.tensor
                    ),
                ));
            }
        };
        let values: Vec<i64> = view
            .data()
            .as_chunks::<8>()
            .0
            .iter()
            .map(|b| i64::from_le_bytes(*b))
            .collect();
        for (c, &field) in features.fields.iter().enumerate() {
            let table = &spec.tables[spec.fields[field].table].spec;
            if table.oov != OovPolicy::Reject {
                continue;
            }
            if let Some(row) = (0..rows).find(|&r| !table.contains(values[r * cols + c])) {
                return Err(LoadError::new(
                    &path,
                    format!(
                        "tensor {:?} row {row}, column {:?}: id {} is outside table {:?} (ids 0..{}), which rejects \
                         unknown ids",
                        features.tensor,
                        spec.fields[field].name,
                        values[row * cols + c],
                        table.name,
                        table.rows
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
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Writes item `id`'s item-side fields into `row` (one rank row, `[fields]`).
    pub fn fill(&self, id: u32, row: &mut [i64]) {
        let at = id as usize * self.columns.len();
        for (&field, &value) in self.columns.iter().zip(&self.values[at..]) {
            row[field] = value;
        }
        if let Some(field) = self.id_field {
            row[field] = i64::from(id);
        }
    }
}
