//! Opening embedding tables: safetensors files memory-mapped once each, every table's tensor checked against its
//! `model.toml` entry (present, dtype, shape) before anything is served.

use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use memmap2::{Mmap, MmapOptions};
use safetensors::{Dtype, SafeTensors};

use crate::error::LoadError;
use crate::repository::Storage;
use crate::repository::TableEntry;

/// Bytes of one table (or a shard of it) inside a memory-mapped file. Cheap to clone.
#[derive(Clone)]
pub struct TableBytes {
    map: Arc<Mmap>,
    range: Range<usize>,
}

impl std::fmt::Debug for TableBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TableBytes")
            .field("range", &self.range)
            .finish_non_exhaustive()
    }
}

impl TableBytes {
    pub fn as_slice(&self) -> &[u8] {
        &self.map[self.range.clone()]
    }

    /// A sub-range, relative to this view.
    pub fn slice(&self, range: Range<usize>) -> TableBytes {
        debug_assert!(range.end <= self.range.len());
        TableBytes {
            map: Arc::clone(&self.map),
            range: self.range.start + range.start..self.range.start + range.end,
        }
    }
}

fn expected_dtype(storage: Storage) -> Dtype {
    match storage {
        Storage::Fp32 => Dtype::F32,
        Storage::Fp16 => Dtype::F16,
        Storage::Int8 => Dtype::U8,
    }
}

/// Maps every file the tables name and returns each table's bytes, in `entries` order.
pub fn open_tables(dir: &Path, entries: &[TableEntry]) -> Result<Vec<TableBytes>, LoadError> {
    let mut maps: HashMap<&str, Arc<Mmap>> = HashMap::new();
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let path = dir.join(&entry.file);
        let map = match maps.get(entry.file.as_str()) {
            Some(map) => Arc::clone(map),
            None => {
                let file = File::open(&path)
                    .map_err(|e| LoadError::new(&path, format!("cannot open table file: {e}")))?;
                // SAFETY: the map is read-only and the model repository is not modified while it is served
                // (new versions go into new directories). `populate` pre-faults the pages so the first requests
                // do not pay for page faults.
                let map = unsafe { MmapOptions::new().populate().map(&file) }.map_err(|e| {
                    LoadError::new(&path, format!("cannot memory-map table file: {e}"))
                })?;
                let map = Arc::new(map);
                maps.insert(&entry.file, Arc::clone(&map));
                map
            }
        };
        let tensors = SafeTensors::deserialize(&map).map_err(|e| {
            LoadError::new(
                &path,
                format!("not a valid safetensors file (truncated or corrupt?): {e}"),
            )
        })?;
        let spec = &entry.spec;
        let view = tensors.tensor(&spec.name).map_err(|_| {
            let mut names = tensors.names();
            names.sort_unstable();
            LoadError::new(
                &path,
                format!(
                    "has no tensor {:?} for table {:?} (tensors in the file: {})",
                    spec.name,
                    spec.name,
                    names.join(", ")
                ),
            )
        })?;
        let dtype = expected_dtype(spec.storage);
        if view.dtype() != dtype {
            return Err(LoadError::new(
                &path,
                format!(
                    "tensor {:?} has dtype {:?}, but model.toml declares storage = \"{}\", which is stored as {dtype:?}",
                    spec.name,
                    view.dtype(),
                    spec.storage.as_str()
                ),
            ));
        }
        let width = match spec.storage {
            Storage::Int8 => spec.dim + 8,
            Storage::Fp32 | Storage::Fp16 => spec.dim,
        };
        let expected = [spec.rows as usize, width];
        if view.shape() != expected {
            return Err(LoadError::new(
                &path,
                format!(
                    "tensor {:?} has shape {:?}, but model.toml declares rows = {}, dim = {} with storage = \"{}\", \
                     which is stored as {expected:?}",
                    spec.name,
                    view.shape(),
                    spec.rows,
                    spec.dim,
                    spec.storage.as_str()
                ),
            ));
        }
        let data = view.data();
        let start = data.as_ptr() as usize - map.as_ptr() as usize;
        out.push(TableBytes {
            map: Arc::clone(&map),
            range: start..start + data.len(),
        });
    }
    Ok(out)
}

/// An I64 tensor of the model repository that is not a table (`[item_features]`, a recall model's popularity
/// order): its values and shape. `what` names what the tensor is for, in messages.
pub fn read_i64_tensor(
    path: &Path,
    tensor: &str,
    what: &str,
) -> Result<(Vec<i64>, Vec<usize>), LoadError> {
    let file = File::open(path)
        .map_err(|e| LoadError::new(path, format!("cannot open the file of {what}: {e}")))?;
    // SAFETY: read-only, and the repository is not modified while served (as for embedding tables); the values
    // are copied out before the map is dropped.
    let map = unsafe { Mmap::map(&file) }
        .map_err(|e| LoadError::new(path, format!("cannot memory-map: {e}")))?;
    let tensors = SafeTensors::deserialize(&map).map_err(|e| {
        LoadError::new(
            path,
            format!("not a valid safetensors file (truncated or corrupt?): {e}"),
        )
    })?;
    let view = tensors.tensor(tensor).map_err(|_| {
        let mut names = tensors.names();
        names.sort_unstable();
        LoadError::new(
            path,
            format!(
                "has no tensor {tensor:?} for {what} (tensors in the file: {})",
                names.join(", ")
            ),
        )
    })?;
    if view.dtype() != Dtype::I64 {
        return Err(LoadError::new(
            path,
            format!(
                "tensor {tensor:?} is {:?} {:?}, but {what} is I64",
                view.dtype(),
                view.shape()
            ),
        ));
    }
    let values = view
        .data()
        .as_chunks::<8>()
        .0
        .iter()
        .map(|b| i64::from_le_bytes(*b))
        .collect();
    Ok((values, view.shape().to_vec()))
}
