//! A ranking model's item-item table (`[cooccurrence]` of its `model.toml`), from which a recommend pipeline
//! computes the `cooccurrence` candidate feature: for candidate `c` and a request's history `H`,
//! `Σ_{h ∈ distinct(H)} w(h → c)`, accumulated in f64 and rounded to f32 once (so the order of the history does not
//! change the value). History ids outside the table read nothing. Read and checked when the ranking model loads.

use std::collections::HashSet;
use std::path::Path;

use crate::embedding::TensorFile;
use crate::error::LoadError;
use crate::repository::ModelSpec;

const WHAT: &str = "[cooccurrence]";

/// The table: row `h` lists the items `c` with `w(h → c) ≠ 0`, in increasing order, and their weights.
#[derive(Debug)]
pub(crate) struct Cooccurrence {
    /// `[items + 1]`: row `h` is `indices[indptr[h]..indptr[h + 1]]`.
    indptr: Vec<usize>,
    indices: Vec<u32>,
    weights: Vec<f32>,
}

impl Cooccurrence {
    /// Reads and checks the `[cooccurrence]` of a ranking model, if it has one: tensors `indptr` I64 `[items + 1]`
    /// (from 0, non-decreasing, ending at `nnz`), `indices` I64 `[nnz]` (each row strictly increasing, every id an
    /// item) and `weights` F32 `[nnz]` (finite).
    pub(crate) fn open(dir: &Path, spec: &ModelSpec) -> Result<Option<Cooccurrence>, LoadError> {
        let Some(table) = &spec.cooccurrence else {
            return Ok(None);
        };
        let path = dir.join(&table.file);
        let file = TensorFile::open(&path, WHAT)?;
        let fail = |problem: String| Err(LoadError::new(&path, problem));
        let (indptr, indptr_shape) = file.i64("indptr", WHAT)?;
        let (indices, indices_shape) = file.i64("indices", WHAT)?;
        let (weights, weights_shape) = file.f32("weights", WHAT)?;
        let items = match indptr_shape.as_slice() {
            &[n] if n >= 2 => n - 1,
            shape => {
                return fail(format!(
                    "tensor \"indptr\" has shape {shape:?}, but [cooccurrence] needs I64 [items + 1] with at \
                     least one item"
                ));
            }
        };
        let nnz = indices.len();
        if indices_shape != [nnz] || weights_shape != [nnz] {
            return fail(format!(
                "tensors \"indices\" {indices_shape:?} and \"weights\" {weights_shape:?} must both be [nnz], one \
                 entry per neighbour"
            ));
        }
        if indptr[0] != 0 || indptr[items] != nnz as i64 {
            return fail(format!(
                "tensor \"indptr\" runs from {} to {}, but must run from 0 to the {nnz} entries of \"indices\"",
                indptr[0], indptr[items]
            ));
        }
        if let Some(h) = (0..items).find(|&h| indptr[h] > indptr[h + 1]) {
            return fail(format!(
                "tensor \"indptr\" decreases at item {h} ({} then {}): rows must follow each other",
                indptr[h],
                indptr[h + 1]
            ));
        }
        let indptr: Vec<usize> = indptr.into_iter().map(|p| p as usize).collect();
        let mut ids = Vec::with_capacity(nnz);
        for h in 0..items {
            let row = &indices[indptr[h]..indptr[h + 1]];
            for (j, &c) in row.iter().enumerate() {
                if !(0..items as i64).contains(&c) {
                    return fail(format!(
                        "row {h} of \"indices\" holds {c}, outside the {items} items of the table"
                    ));
                }
                if j > 0 && row[j - 1] >= c {
                    return fail(format!(
                        "row {h} of \"indices\" is not strictly increasing ({} then {c})",
                        row[j - 1]
                    ));
                }
                ids.push(c as u32);
            }
        }
        if let Some(at) = weights.iter().position(|w| !w.is_finite()) {
            return fail(format!(
                "tensor \"weights\" holds {} at entry {at}: weights must be finite",
                weights[at]
            ));
        }
        Ok(Some(Cooccurrence {
            indptr,
            indices: ids,
            weights,
        }))
    }

    /// Items the table describes (ids `0..items`).
    pub(crate) fn items(&self) -> usize {
        self.indptr.len() - 1
    }

    /// `w(h → c)`: 0 when `c` is not in row `h`.
    fn weight(&self, h: usize, c: u32) -> f32 {
        let row = self.indptr[h]..self.indptr[h + 1];
        match self.indices[row.clone()].binary_search(&c) {
            Ok(j) => self.weights[row.start + j],
            Err(_) => 0.0,
        }
    }

    /// The `cooccurrence` feature of every candidate (`out[i]` for `candidates[i]`) given `history`.
    pub(crate) fn scores(&self, history: &[i64], candidates: &[u32], out: &mut [f32]) {
        let items = self.items();
        let mut seen = HashSet::with_capacity(history.len());
        let distinct: Vec<usize> = history
            .iter()
            .filter_map(|&h| usize::try_from(h).ok().filter(|&h| h < items))
            .filter(|&h| seen.insert(h))
            .collect();
        for (slot, &c) in out.iter_mut().zip(candidates) {
            let sum: f64 = distinct.iter().map(|&h| f64::from(self.weight(h, c))).sum();
            *slot = sum as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(rows: &[&[(u32, f32)]]) -> Cooccurrence {
        let mut indptr = vec![0];
        let (mut indices, mut weights) = (Vec::new(), Vec::new());
        for row in rows {
            for &(c, w) in *row {
                indices.push(c);
                weights.push(w);
            }
            indptr.push(indices.len());
        }
        Cooccurrence {
            indptr,
            indices,
            weights,
        }
    }

    #[test]
    fn scores_sum_the_weights_of_distinct_history_items_against_a_naive_loop() {
        let t = table(&[
            &[(1, 0.5), (3, 0.25)],
            &[(0, 0.5), (2, 1.0), (3, 0.125)],
            &[(1, 1.0)],
            &[(0, 0.25), (1, 0.125)],
        ]);
        // Duplicates count once; ids outside the table read nothing.
        let history = [1, 3, 1, -4, 99, 0];
        let candidates = [0, 1, 2, 3];
        let mut got = [f32::NAN; 4];
        t.scores(&history, &candidates, &mut got);
        let dense = |h: usize, c: u32| {
            let row = t.indptr[h]..t.indptr[h + 1];
            (row.clone())
                .find(|&j| t.indices[j] == c)
                .map_or(0.0, |j| f64::from(t.weights[j]))
        };
        for (i, &c) in candidates.iter().enumerate() {
            let naive: f64 = [1usize, 3, 0].iter().map(|&h| dense(h, c)).sum();
            assert_eq!(got[i], naive as f32, "candidate {c}");
        }
        assert_eq!(got, [0.75, 0.625, 1.0, 0.375]);
        let mut none = [1.0; 2];
        t.scores(&[], &[0, 1], &mut none);
        assert_eq!(none, [0.0, 0.0]);
    }

    /// Writes a `[cooccurrence]` file of the given tensors into a fresh directory and opens it as a model would.
    fn open_written(
        indptr: &[i64],
        indices: &[i64],
        weights: &[f32],
    ) -> Result<Cooccurrence, String> {
        use safetensors::{Dtype, tensor::TensorView};
        let dir = tempfile::tempdir().expect("temp dir");
        let bytes = |values: Vec<[u8; 8]>| values.concat();
        let (p, i) = (
            bytes(indptr.iter().map(|v| v.to_le_bytes()).collect()),
            bytes(indices.iter().map(|v| v.to_le_bytes()).collect()),
        );
        let w: Vec<u8> = weights.iter().flat_map(|v| v.to_le_bytes()).collect();
        let views = vec![
            (
                "indptr",
                TensorView::new(Dtype::I64, vec![indptr.len()], &p).expect("view"),
            ),
            (
                "indices",
                TensorView::new(Dtype::I64, vec![indices.len()], &i).expect("view"),
            ),
            (
                "weights",
                TensorView::new(Dtype::F32, vec![weights.len()], &w).expect("view"),
            ),
        ];
        safetensors::serialize_to_file(views, None, &dir.path().join("c.safetensors"))
            .expect("write");
        let text = crate::testing::test_contract::SPEC.replace(
            "dense_features = [\"d0\", \"d1\"]",
            "dense_features = [\"d0\", \"d1\"]\ncandidate_features = [\"cooccurrence\"]",
        ) + "\n[cooccurrence]\nfile = \"c.safetensors\"\n";
        let spec = ModelSpec::parse(&text).expect("spec");
        Cooccurrence::open(dir.path(), &spec)
            .map(|table| table.expect("declared"))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn opens_a_valid_table_and_names_every_problem_of_a_broken_one() {
        let table = open_written(&[0, 2, 2, 3], &[1, 2, 0], &[0.5, 0.25, 1.0]).expect("valid");
        assert_eq!(table.items(), 3);
        let mut got = [0.0; 3];
        table.scores(&[0, 2], &[0, 1, 2], &mut got);
        assert_eq!(got, [1.0, 0.5, 0.25]);
        type Case<'a> = (&'a [i64], &'a [i64], &'a [f32], &'a str);
        let cases: [Case; 6] = [
            (&[0], &[], &[], "tensor \"indptr\" has shape [1]"),
            (
                &[0, 2, 3],
                &[1, 0],
                &[0.5, 1.0],
                "must run from 0 to the 2 entries",
            ),
            (
                &[0, 2, 1, 2],
                &[1, 0],
                &[0.5, 1.0],
                "\"indptr\" decreases at item 1",
            ),
            (
                &[0, 2, 2],
                &[1, 5],
                &[0.5, 1.0],
                "row 0 of \"indices\" holds 5, outside the 2 items",
            ),
            (
                &[0, 2, 2],
                &[1, 1],
                &[0.5, 1.0],
                "row 0 of \"indices\" is not strictly increasing (1 then 1)",
            ),
            (
                &[0, 2, 2],
                &[0, 1],
                &[0.5, f32::NAN],
                "\"weights\" holds NaN at entry 1",
            ),
        ];
        for (indptr, indices, weights, expected) in cases {
            let got = open_written(indptr, indices, weights).expect_err(expected);
            assert!(got.contains(expected), "expected {expected:?} in {got:?}");
            assert!(got.contains("c.safetensors"), "{got}");
        }
    }
}
