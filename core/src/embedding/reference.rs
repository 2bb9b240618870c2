//! The naive gather: reads the whole file, decodes one value at a time straight from the documented byte layout,
//! no sharding, no prefetch, no slices of slices. Every faster gather (CPU, GPU) is tested against this one.

use std::path::Path;

use safetensors::SafeTensors;

use super::GatherError;

use crate::repository::{Storage, TableSpec};

/// Gathers `ids` (`[rows, fields]`) from tables that all live in the safetensors file `file` into `out`
/// (`[rows, fields, dim]`), applying each table's OOV policy.
pub(crate) fn gather(
    file: &Path,
    specs: &[TableSpec],
    fields: &[usize],
    ids: &[i64],
    out: &mut [f32],
) -> Result<(), GatherError> {
    let dim = super::check_gather_shape(specs, fields, ids, out)?;
    let bytes =
        std::fs::read(file).map_err(|e| GatherError::Shape(format!("read {file:?}: {e}")))?;
    let tensors = SafeTensors::deserialize(&bytes)
        .map_err(|e| GatherError::Shape(format!("parse {file:?}: {e}")))?;
    for (p, &id) in ids.iter().enumerate() {
        let spec = &specs[fields[p % fields.len()]];
        let data = tensors
            .tensor(&spec.name)
            .map_err(|e| GatherError::Shape(format!("tensor {:?}: {e}", spec.name)))?
            .data();
        let row = spec.resolve(id).ok_or_else(|| GatherError::Rejected {
            table: spec.name.clone(),
            row: p / fields.len(),
            id,
        })? as usize;
        for j in 0..dim {
            out[p * dim + j] = value(data, spec.storage, dim, row, j);
        }
    }
    Ok(())
}

/// Value `j` of row `row`, decoded from the documented layout.
fn value(data: &[u8], storage: Storage, dim: usize, row: usize, j: usize) -> f32 {
    let bytes4 = |at: usize| [data[at], data[at + 1], data[at + 2], data[at + 3]];
    match storage {
        Storage::Fp32 => f32::from_le_bytes(bytes4((row * dim + j) * 4)),
        Storage::Fp16 => {
            let at = (row * dim + j) * 2;
            half::f16::from_le_bytes([data[at], data[at + 1]]).to_f32()
        }
        Storage::Int8 => {
            let start = row * (dim + 8);
            let scale = f32::from_le_bytes(bytes4(start + dim));
            let bias = f32::from_le_bytes(bytes4(start + dim + 4));
            f32::from(data[start + j]) * scale + bias
        }
    }
}
