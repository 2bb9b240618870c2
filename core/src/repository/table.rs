//! The table formats of `model.toml`: how a table's rows are stored ([`Storage`], byte for byte in
//! `docs/model-repository.md`), what an id outside the table does ([`OovPolicy`]), and one table's declaration
//! ([`TableSpec`]). The embedding store reads tables in these formats; the repository checks them.

use serde::Deserialize;

/// How a table's rows are stored. Documented byte for byte in `docs/model-repository.md`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Storage {
    Fp32,
    Fp16,
    /// FBGEMM's fused row-wise layout: `dim` u8 codes, then the row's f32 scale and f32 bias.
    Int8,
}

impl Storage {
    pub fn as_str(self) -> &'static str {
        match self {
            Storage::Fp32 => "fp32",
            Storage::Fp16 => "fp16",
            Storage::Int8 => "int8",
        }
    }

    /// Bytes of one stored row of `dim` values.
    pub fn row_bytes(self, dim: usize) -> usize {
        match self {
            Storage::Fp32 => 4 * dim,
            Storage::Fp16 => 2 * dim,
            Storage::Int8 => dim + 8,
        }
    }
}

/// What an id outside `[0, rows)` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OovPolicy {
    /// Read this row instead, and count it.
    Default { row: u64 },
    /// Refuse the request.
    Reject,
}

impl OovPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            OovPolicy::Default { .. } => "default",
            OovPolicy::Reject => "reject",
        }
    }
}

/// Where a table's rows live (`tier` in `model.toml`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tier {
    /// The table's safetensors file, memory-mapped in full.
    File,
    /// A Redis Cluster (`--redis-url`), under an in-process cache of hot rows; the file is only what
    /// `recserve_models publish` uploads.
    Redis { unfetched: Unfetched },
}

impl Tier {}

/// What a row of a Redis-tier table that could not be fetched within its batch's budget does (`unfetched`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unfetched {
    /// Read the table's `default_row` (held in memory from load on) instead, and count it.
    DefaultRow,
    /// Fail the requests of the batch with 503.
    Unavailable,
}

impl Unfetched {}

/// One table as `model.toml` declares it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TableSpec {
    pub name: String,
    pub rows: u64,
    pub dim: usize,
    pub storage: Storage,
    pub oov: OovPolicy,
}

impl TableSpec {
    /// The row an id reads under this table's policy, or `None` when the policy rejects it.
    #[inline]
    pub(crate) fn resolve(&self, id: i64) -> Option<u64> {
        match u64::try_from(id) {
            Ok(row) if row < self.rows => Some(row),
            _ => match self.oov {
                OovPolicy::Default { row } => Some(row),
                OovPolicy::Reject => None,
            },
        }
    }

    pub(crate) fn contains(&self, id: i64) -> bool {
        u64::try_from(id).is_ok_and(|row| row < self.rows)
    }

    /// The ids the table holds, as messages print them: `ids 0 to 1879` (not `0..1880`, which reads as if
    /// 1880 were one of them).
    pub(crate) fn id_range(&self) -> String {
        match self.rows {
            0 => "no ids".to_owned(),
            1 => "id 0 only".to_owned(),
            rows => format!("ids 0 to {}", rows - 1),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.rows * self.storage.row_bytes(self.dim) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_ranges_read_as_the_ids_they_hold() {
        let spec = |rows| TableSpec {
            name: "t".into(),
            rows,
            dim: 2,
            storage: Storage::Fp32,
            oov: OovPolicy::Reject,
        };
        assert_eq!(spec(1880).id_range(), "ids 0 to 1879");
        assert_eq!(spec(2).id_range(), "ids 0 to 1");
        assert_eq!(spec(1).id_range(), "id 0 only");
    }

    #[test]
    fn resolve_applies_the_policy() {
        let mut spec = TableSpec {
            name: "t".into(),
            rows: 5,
            dim: 2,
            storage: Storage::Fp32,
            oov: OovPolicy::Default { row: 3 },
        };
        assert_eq!(spec.resolve(0), Some(0));
        assert_eq!(spec.resolve(4), Some(4));
        assert_eq!(spec.resolve(5), Some(3));
        assert_eq!(spec.resolve(-1), Some(3));
        assert_eq!(spec.resolve(i64::MIN), Some(3));
        spec.oov = OovPolicy::Reject;
        assert_eq!(spec.resolve(5), None);
        assert_eq!(spec.resolve(-1), None);
        assert_eq!(spec.resolve(4), Some(4));
    }
}
