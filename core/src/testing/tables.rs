//! Synthetic tables of deterministic pseudo-random values written to real safetensors files in the documented
//! layouts, for the tests of every gather, the gather benchmark and the GPU device check.
//!
//! These helpers panic on I/O errors: they are for tests and benchmarks, not for serving.

use std::path::{Path, PathBuf};

use safetensors::{Dtype, tensor::TensorView};

use crate::embedding::{TableBytes, open_tables};
use crate::repository::{OovPolicy, Storage, TableEntry, TableSpec};

/// A table of deterministic pseudo-random values.
#[derive(Debug, Clone)]
pub struct TestTable {
    spec: TableSpec,
}

impl TestTable {
    pub fn new(name: &str, rows: u64, dim: usize, storage: Storage, oov: OovPolicy) -> TestTable {
        TestTable {
            spec: TableSpec {
                name: name.to_owned(),
                rows,
                dim,
                storage,
                oov,
            },
        }
    }

    /// Values in [-1, 1), different per table, row and column; row 0 of every table is constant so int8
    /// quantization meets its `scale = 1` corner case.
    fn values(&self) -> Vec<f32> {
        let seed = self
            .spec
            .name
            .bytes()
            .fold(17u64, |h, b| h * 31 + u64::from(b));
        (0..self.spec.rows as usize * self.spec.dim)
            .map(|i| {
                if i < self.spec.dim {
                    return 0.25;
                }
                let x = (i as u64 + 1)
                    .wrapping_mul(seed)
                    .wrapping_mul(0x9E37_79B9_7F4A_7C15);
                ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn encode(&self) -> (Dtype, Vec<usize>, Vec<u8>) {
        let values = self.values();
        let (rows, dim) = (self.spec.rows as usize, self.spec.dim);
        match self.spec.storage {
            Storage::Fp32 => (
                Dtype::F32,
                vec![rows, dim],
                values.iter().flat_map(|v| v.to_le_bytes()).collect(),
            ),
            Storage::Fp16 => (
                Dtype::F16,
                vec![rows, dim],
                values
                    .iter()
                    .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
                    .collect(),
            ),
            Storage::Int8 => {
                let mut out = Vec::with_capacity(rows * (dim + 8));
                for row in values.chunks_exact(dim) {
                    let min = row.iter().copied().fold(f32::INFINITY, f32::min);
                    let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let scale = if max > min { (max - min) / 255.0 } else { 1.0 };
                    out.extend(
                        row.iter()
                            .map(|v| ((v - min) / scale).round().clamp(0.0, 255.0) as u8),
                    );
                    out.extend(scale.to_le_bytes());
                    out.extend(min.to_le_bytes());
                }
                (Dtype::U8, vec![rows, dim + 8], out)
            }
        }
    }
}

/// Writes `tables` into `<dir>/<stem>.safetensors` and opens them as the server does.
///
/// # Panics
/// On any I/O or format error.
pub fn write_tables(
    dir: &Path,
    stem: &str,
    tables: &[TestTable],
) -> (Vec<TableSpec>, Vec<TableBytes>, PathBuf) {
    let file = dir.join(format!("{stem}.safetensors"));
    let encoded: Vec<_> = tables.iter().map(TestTable::encode).collect();
    let views: Vec<_> = tables
        .iter()
        .zip(&encoded)
        .map(|(t, (dtype, shape, data))| {
            let view = TensorView::new(*dtype, shape.clone(), data).expect("consistent view");
            (t.spec.name.clone(), view)
        })
        .collect();
    safetensors::serialize_to_file(views, None, &file).expect("write safetensors");
    let entries: Vec<_> = tables
        .iter()
        .map(|t| TableEntry {
            spec: t.spec.clone(),
            file: file
                .file_name()
                .expect("file name")
                .to_string_lossy()
                .into_owned(),
            tier: crate::repository::Tier::File,
        })
        .collect();
    let bytes =
        open_tables(dir, &entries, crate::embedding::Preload::Populate).expect("open tables");
    (tables.iter().map(|t| t.spec.clone()).collect(), bytes, file)
}

/// A counter of default-row reads, for a store under test (`recserve_embedding_oov_total` in the server).
pub fn oov_counter() -> prometheus::IntCounter {
    prometheus::IntCounter::new("test_oov_total", "test").expect("counter")
}
