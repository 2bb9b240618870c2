//! Gathering a ranking batch with its user side once per request: in a DeepFM request every candidate carries
//! the same user and context ids, so a batch's rows come in runs whose user columns are equal. [`SharedGather`]
//! finds those runs, gathers each run's user rows once and every row's item rows, and lays them out as the plain
//! gather would (`[rows, fields, dim]`). The values are the same bits: an id reads the same stored row and
//! decodes it with the same operations, whichever rows it is copied into.
//!
//! Runs are found from the ids alone (consecutive rows whose user columns are all equal), so a batch that mixes
//! requests, padding rows, or KServe rows whose user ids differ per row is gathered correctly: a row that starts
//! a new run just costs its own user lookups. An out-of-vocabulary user id read from a default row is counted once
//! per run (once per request), not once per candidate.

use std::time::Instant;

use super::{GatherError, GatherLane};

/// Which columns are user side, and the scratch buffers of the two gathers; owned by one executor thread.
#[derive(Debug)]
pub(crate) struct SharedGather {
    /// Table of every column, in graph order.
    fields: Vec<usize>,
    /// For every column: `Some(i)` when it is the `i`-th user column, `None` when it is an item column.
    user_index: Vec<Option<usize>>,
    user_columns: Vec<usize>,
    item_columns: Vec<usize>,
    user_tables: Vec<usize>,
    item_tables: Vec<usize>,
    /// First row of every run.
    runs: Vec<usize>,
    user_ids: Vec<i64>,
    item_ids: Vec<i64>,
    user_rows: Vec<f32>,
    item_rows: Vec<f32>,
}

impl SharedGather {
    /// `fields[f]` is the table column `f` reads; `user_columns` the columns that are one value per request.
    pub(crate) fn new(fields: &[usize], user_columns: &[usize]) -> SharedGather {
        let mut user_index = vec![None; fields.len()];
        for (i, &c) in user_columns.iter().enumerate() {
            user_index[c] = Some(i);
        }
        let item_columns: Vec<usize> = (0..fields.len())
            .filter(|&c| user_index[c].is_none())
            .collect();
        SharedGather {
            user_tables: user_columns.iter().map(|&c| fields[c]).collect(),
            item_tables: item_columns.iter().map(|&c| fields[c]).collect(),
            fields: fields.to_vec(),
            user_index,
            user_columns: user_columns.to_vec(),
            item_columns,
            runs: Vec::new(),
            user_ids: Vec::new(),
            item_ids: Vec::new(),
            user_rows: Vec::new(),
            item_rows: Vec::new(),
        }
    }

    /// Gathers `ids` (`[rows, fields]`) into `out` (`[rows, fields, dim]`) through `lane`, each run's user rows
    /// once, waiting for rows of a remote tier until `deadline` at most. Errors as the lane's gather, with rows
    /// numbered as in `ids`.
    pub(crate) fn gather(
        &mut self,
        lane: &mut dyn GatherLane,
        ids: &[i64],
        dim: usize,
        out: &mut [f32],
        deadline: Instant,
    ) -> Result<(), GatherError> {
        let nf = self.fields.len();
        if self.user_columns.is_empty() || nf == 0 || !ids.len().is_multiple_of(nf) {
            return lane.gather_host_until(&self.fields, ids, out, deadline);
        }
        if out.len() != ids.len() * dim {
            return Err(GatherError::Shape(format!(
                "output holds {} values, expected {} ids × dim {dim}",
                out.len(),
                ids.len()
            )));
        }
        let rows = ids.len() / nf;
        let (nu, ni) = (self.user_columns.len(), self.item_columns.len());

        self.runs.clear();
        self.user_ids.clear();
        for r in 0..rows {
            let row = &ids[r * nf..(r + 1) * nf];
            let same = r > 0 && {
                let previous = &ids[(r - 1) * nf..r * nf];
                self.user_columns.iter().all(|&c| row[c] == previous[c])
            };
            if !same {
                self.runs.push(r);
                self.user_ids
                    .extend(self.user_columns.iter().map(|&c| row[c]));
            }
        }
        // Not cleared first (nor `item_rows` below): the gathers write every value.
        self.user_rows.resize(self.runs.len() * nu * dim, 0.0);
        let runs = &self.runs;
        lane.gather_host_until(
            &self.user_tables,
            &self.user_ids,
            &mut self.user_rows,
            deadline,
        )
        .map_err(|e| match e {
            GatherError::Rejected { table, row, id } => GatherError::Rejected {
                table,
                row: runs[row],
                id,
            },
            other => other,
        })?;

        if ni > 0 {
            self.item_ids.clear();
            for row in ids.chunks_exact(nf) {
                self.item_ids
                    .extend(self.item_columns.iter().map(|&c| row[c]));
            }
            self.item_rows.resize(rows * ni * dim, 0.0);
            lane.gather_host_until(
                &self.item_tables,
                &self.item_ids,
                &mut self.item_rows,
                deadline,
            )?;
        }

        let mut run = 0;
        for (r, dst) in out.chunks_exact_mut(nf * dim).enumerate() {
            if run + 1 < self.runs.len() && self.runs[run + 1] == r {
                run += 1;
            }
            let user = &self.user_rows[run * nu * dim..(run + 1) * nu * dim];
            let item = &self.item_rows[r * ni * dim..(r + 1) * ni * dim];
            let mut next_item = 0;
            for (c, slot) in dst.chunks_exact_mut(dim).enumerate() {
                match self.user_index[c] {
                    Some(u) => slot.copy_from_slice(&user[u * dim..(u + 1) * dim]),
                    None => {
                        slot.copy_from_slice(&item[next_item * dim..(next_item + 1) * dim]);
                        next_item += 1;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::embedding::{CpuStore, EmbeddingStore, lane};
    use crate::repository::{OovPolicy, Storage};
    use crate::testing::tables::{TestTable, oov_counter as counter, write_tables};

    /// A deadline no test gather reaches.
    fn far() -> Instant {
        Instant::now() + std::time::Duration::from_secs(3600)
    }

    /// Request-shaped rows: `requests` runs of `candidates` rows sharing their user columns, the item columns
    /// drawn per row; some ids outside the tables (default rows), and two padding rows of zeros at the end.
    fn batch(
        rows_of: &[u64],
        user: &[usize],
        requests: usize,
        candidates: usize,
        seed: u64,
    ) -> Vec<i64> {
        let mut state = seed;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let r = state >> 33;
            if r.is_multiple_of(13) {
                n as i64 + 3 // outside: reads the default row
            } else {
                (r % n) as i64
            }
        };
        let nf = rows_of.len();
        let mut ids = Vec::new();
        for _ in 0..requests {
            let shared: Vec<i64> = rows_of.iter().map(|&n| next(n)).collect();
            for _ in 0..candidates {
                for f in 0..nf {
                    ids.push(if user.contains(&f) {
                        shared[f]
                    } else {
                        next(rows_of[f])
                    });
                }
            }
        }
        ids.extend(std::iter::repeat_n(0, 2 * nf));
        ids
    }

    #[test]
    fn gives_the_plain_gather_s_values_for_every_storage_and_layout() {
        let dir = tempfile::tempdir().expect("tempdir");
        for storage in [Storage::Fp32, Storage::Fp16, Storage::Int8] {
            let tables = [
                TestTable::new("a", 37, 5, storage, OovPolicy::Default { row: 0 }),
                TestTable::new("b", 1, 5, storage, OovPolicy::Default { row: 0 }),
                TestTable::new("c", 64, 5, storage, OovPolicy::Default { row: 63 }),
                TestTable::new("d", 100, 5, storage, OovPolicy::Default { row: 7 }),
            ];
            let (specs, bytes, _) = write_tables(dir.path(), storage.as_str(), &tables);
            // Columns read tables; column 4 reads table a again, as fields may share a table.
            let fields = [0usize, 1, 2, 3, 0, 2];
            let rows_of: Vec<u64> = fields.iter().map(|&t| specs[t].rows).collect();
            for user in [
                vec![0usize, 1, 4],
                vec![5],
                vec![0, 1, 2, 3, 4, 5],
                vec![2, 3],
            ] {
                let counters: Vec<_> = specs.iter().map(|_| counter()).collect();
                let store: Arc<dyn EmbeddingStore> =
                    Arc::new(CpuStore::new(specs.clone(), bytes.clone(), 3, counters));
                let mut lane = lane(&store, 0).expect("lane");
                let mut shared = SharedGather::new(&fields, &user);
                for (requests, candidates, seed) in [(1usize, 1usize, 1u64), (1, 100, 2), (5, 7, 3)]
                {
                    let ids = batch(&rows_of, &user, requests, candidates, seed);
                    let mut got = vec![f32::NAN; ids.len() * 5];
                    shared
                        .gather(lane.as_mut(), &ids, 5, &mut got, far())
                        .expect("shared gather");
                    let mut want = vec![f32::NAN; ids.len() * 5];
                    store.gather(&fields, &ids, &mut want).expect("gather");
                    assert_eq!(
                        got, want,
                        "storage {storage:?} user {user:?} requests {requests}"
                    );
                }
            }
        }
    }

    #[test]
    fn rows_whose_user_ids_differ_are_gathered_each_on_their_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tables = [
            TestTable::new("u", 50, 3, Storage::Fp32, OovPolicy::Default { row: 0 }),
            TestTable::new("i", 50, 3, Storage::Int8, OovPolicy::Default { row: 0 }),
        ];
        let (specs, bytes, _) = write_tables(dir.path(), "t", &tables);
        let counters = vec![counter(), counter()];
        let store: Arc<dyn EmbeddingStore> =
            Arc::new(CpuStore::new(specs, bytes, 1, counters.clone()));
        let mut lane = lane(&store, 0).expect("lane");
        let mut shared = SharedGather::new(&[0, 1], &[0]);
        // KServe rows: the user column changes from row to row, then repeats; ids 60 and -1 read the default row.
        let ids = [1, 2, 3, 4, 3, 5, 60, 6, 60, 7, -1, 8];
        let mut got = vec![0.0; ids.len() * 3];
        shared
            .gather(lane.as_mut(), &ids, 3, &mut got, far())
            .expect("gather");
        let mut want = vec![0.0; ids.len() * 3];
        let before = counters[0].get();
        store.gather(&[0, 1], &ids, &mut want).expect("gather");
        assert_eq!(got, want);
        // The plain gather counted 60, 60 and -1; the shared one counted the run of 60 once, and -1.
        assert_eq!(before, 2);
        assert_eq!(counters[0].get() - before, 3);
    }

    #[test]
    fn a_rejected_user_id_names_its_row_in_the_batch() {
        let dir = tempfile::tempdir().expect("tempdir");
        let tables = [
            TestTable::new("u", 4, 2, Storage::Fp32, OovPolicy::Reject),
            TestTable::new("i", 4, 2, Storage::Fp32, OovPolicy::Reject),
        ];
        let (specs, bytes, _) = write_tables(dir.path(), "t", &tables);
        let store: Arc<dyn EmbeddingStore> =
            Arc::new(CpuStore::new(specs, bytes, 1, vec![counter(), counter()]));
        let mut lane = lane(&store, 0).expect("lane");
        let mut shared = SharedGather::new(&[0, 1], &[0]);
        let ids = [1, 0, 1, 1, 9, 2];
        let mut out = vec![0.0; ids.len() * 2];
        let err = shared
            .gather(lane.as_mut(), &ids, 2, &mut out, far())
            .expect_err("9 is outside rows = 4");
        assert_eq!(
            err,
            GatherError::Rejected {
                table: "u".into(),
                row: 2,
                id: 9
            }
        );
    }
}
