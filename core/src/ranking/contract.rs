//! The request contract of a ranking model, derived from its `model.toml`: what a request must carry
//! ([`RankContract`]) and the validated rows every transport decodes into ([`RankInput`]). Every check and its
//! message lives here once, so `/v1` rank, recommend and KServe v2 refuse the same input with the same words.

use std::cmp::Ordering;
use std::collections::HashMap;
use std::sync::Arc;

use crate::batching::QueueFit;
use crate::error::{Echo, ServiceError};
use crate::executor::GraphShape;
use crate::repository::{ModelSpec, OovPolicy, Side};

/// Validated rows to score: `ids` is `[rows, fields]` in graph order, `dense` is `[rows, dense_width]`: each row's
/// dense features, then its candidate features ([`RankContract::dense_width`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RankInput {
    pub rows: usize,
    pub ids: Vec<i64>,
    pub dense: Vec<f32>,
}

/// What a ranking request must carry, derived from `model.toml`. Transports decode against it.
#[derive(Debug, Clone)]
pub struct RankContract {
    pub spec: Arc<ModelSpec>,
    /// Indices into `spec.fields`, in graph order.
    pub user_fields: Vec<usize>,
    /// Item-side fields a candidate sends in `fields` (all item fields but `item_id_field`).
    pub item_fields: Vec<usize>,
    pub item_id_field: Option<usize>,
    pub dense_features: usize,
    /// Per-candidate floats after the dense features (`ranking.candidate_features`).
    pub candidate_features: usize,
    field_by_name: HashMap<String, usize>,
    /// Per field: the rows of its table when the table rejects ids outside them, `None` when it takes any id.
    id_limits: Vec<Option<u64>>,
    pub(crate) max_candidates: usize,
    /// How many rows of one request the model's queue can hold (unbounded until [`RankContract::with_queue`]).
    pub(crate) queue: QueueFit,
}

impl RankContract {
    pub fn new(spec: Arc<ModelSpec>, max_candidates: usize) -> RankContract {
        let ranking = spec.ranking.as_ref();
        let item_id_field = ranking.and_then(|r| r.item_id_field);
        let by_side = |side: Side| {
            spec.fields
                .iter()
                .enumerate()
                .filter(|(i, f)| f.side == side && Some(*i) != item_id_field)
                .map(|(i, _)| i)
                .collect::<Vec<_>>()
        };
        RankContract {
            user_fields: by_side(Side::User),
            item_fields: by_side(Side::Item),
            item_id_field,
            dense_features: ranking.map_or(0, |r| r.dense_features.len()),
            candidate_features: ranking.map_or(0, |r| r.candidate_features.len()),
            field_by_name: spec
                .fields
                .iter()
                .enumerate()
                .map(|(i, f)| (f.name.clone(), i))
                .collect(),
            id_limits: spec
                .fields
                .iter()
                .map(|f| {
                    let table = &spec.tables[f.table].spec;
                    (table.oov == OovPolicy::Reject).then_some(table.rows)
                })
                .collect(),
            max_candidates,
            queue: QueueFit::UNBOUNDED,
            spec,
        }
    }

    /// The contract of a model whose queue holds what `queue` says: larger requests are refused as such.
    pub(crate) fn with_queue(mut self, queue: QueueFit) -> RankContract {
        self.queue = queue;
        self
    }

    /// The most rows (candidates) one request may hold: `--max-candidates`, or fewer when the queue holds fewer.
    pub fn max_rows(&self) -> usize {
        self.max_candidates.min(self.queue.rows())
    }

    pub fn fields(&self) -> usize {
        self.spec.fields.len()
    }

    /// The shape of the dense graph's inputs this contract feeds.
    pub fn shape(&self) -> GraphShape {
        GraphShape {
            fields: self.fields(),
            dim: self.spec.field_dim(),
            dense: self.dense_width(),
        }
    }

    /// The width of the graph's dense input: the dense features, then the candidate features.
    pub fn dense_width(&self) -> usize {
        self.dense_features + self.candidate_features
    }

    /// The names of the candidate features, in the order the graph takes them.
    pub fn candidate_feature_names(&self) -> &[String] {
        self.spec
            .ranking
            .as_ref()
            .map_or(&[], |r| r.candidate_features.as_slice())
    }

    /// The position of candidate feature `name`.
    pub fn candidate_feature_index(&self, name: &str) -> Option<usize> {
        self.candidate_feature_names()
            .iter()
            .position(|n| n == name)
    }

    /// The rows' dense input: each row's user-side `dense` (the same for every row) followed by its candidate
    /// features (`candidate`, `[rows, candidate_features]`).
    pub fn dense_rows(&self, dense: &[f32], candidate: &[f32], rows: usize) -> Vec<f32> {
        self.join_dense(dense, 0, candidate, rows)
    }

    /// The rows' dense input from each row's dense features (`dense`, `stride` values apart: `dense_features`
    /// for one row each, 0 for one row shared by all) and its candidate features (`[rows, candidate_features]`).
    pub fn join_dense(
        &self,
        dense: &[f32],
        stride: usize,
        candidate: &[f32],
        rows: usize,
    ) -> Vec<f32> {
        let (width, count) = (self.dense_features, self.candidate_features);
        debug_assert!(stride == 0 || stride == width);
        debug_assert_eq!(candidate.len(), rows * count);
        if count == 0 && stride == width {
            return dense.to_vec();
        }
        let mut out = Vec::with_capacity(rows * self.dense_width());
        for row in 0..rows {
            out.extend_from_slice(&dense[row * stride..row * stride + width]);
            out.extend_from_slice(&candidate[row * count..(row + 1) * count]);
        }
        out
    }

    /// The error for a candidate (at `path`, e.g. `candidates[3].features`) that lacks candidate feature `feature`.
    pub fn candidate_feature_missing(&self, path: &str, feature: usize) -> ServiceError {
        ServiceError::invalid(
            format!("{path}.{}", self.candidate_feature_names()[feature]),
            "is missing: the model takes it for every candidate",
        )
    }

    /// What is wrong with a candidate feature named `name` that the model does not take.
    pub fn unknown_candidate_feature(&self, name: &str) -> String {
        let names = self.candidate_feature_names();
        if names.is_empty() {
            format!(
                "{:?} is not a candidate feature of this model, which takes none",
                Echo(name)
            )
        } else {
            format!(
                "{:?} is not a candidate feature of this model (it takes {})",
                Echo(name),
                names.join(", ")
            )
        }
    }

    pub fn field_index(&self, name: &str) -> Option<usize> {
        self.field_by_name.get(name).copied()
    }

    pub fn field_name(&self, field: usize) -> &str {
        &self.spec.fields[field].name
    }

    /// Checks `id` for `field` against its table's OOV policy: ids a `reject` table would refuse fail here,
    /// before the request is queued, so one bad request never fails a batch.
    pub fn check_id(&self, field: usize, id: i64) -> Result<(), String> {
        if !self.takes_id(field, id) {
            let table = &self.spec.tables[self.spec.fields[field].table].spec;
            return Err(format!(
                "id {id} is outside the vocabulary of table {:?} ({}), which rejects unknown ids",
                table.name,
                table.id_range()
            ));
        }
        Ok(())
    }

    /// Whether `field` takes `id` ([`RankContract::check_id`] without the message): what decoding checks for every
    /// id, so it is one comparison.
    #[inline]
    pub fn takes_id(&self, field: usize, id: i64) -> bool {
        match self.id_limits[field] {
            None => true,
            Some(rows) => u64::try_from(id).is_ok_and(|row| row < rows),
        }
    }

    /// Whether `input`, decoded against `from` (another version's contract), can be scored by this one as it is:
    /// the same fields in the same graph order, the same dense width, rows within this one's bound and every id one
    /// of this one's tables takes. What a shadow version checks before it scores a copy of a request; the problem
    /// otherwise.
    pub fn fits(&self, from: &RankContract, input: &RankInput) -> Result<(), String> {
        let same_fields = self.spec.fields.len() == from.spec.fields.len()
            && self
                .spec
                .fields
                .iter()
                .zip(&from.spec.fields)
                .all(|(a, b)| a.name == b.name);
        if !same_fields {
            return Err("its fields differ from the serving version's".to_owned());
        }
        if self.dense_width() != from.dense_width() {
            return Err(format!(
                "its dense input is {} wide, the serving version's {}",
                self.dense_width(),
                from.dense_width()
            ));
        }
        self.check_rows(input.rows)?;
        let fields = self.fields();
        if let Some(at) = input
            .ids
            .iter()
            .enumerate()
            .position(|(i, &id)| !self.takes_id(i % fields, id))
        {
            return Err(self
                .check_id(at % fields, input.ids[at])
                .expect_err("not taken"));
        }
        Ok(())
    }

    /// Checks a dense value.
    pub fn check_dense(value: f32) -> Result<(), String> {
        if value.is_finite() {
            Ok(())
        } else {
            Err(format!("must be a finite number, got {value}"))
        }
    }

    /// Checks the number of rows of a request: at least one, at most `--max-candidates` and what the queue holds.
    pub fn check_rows(&self, rows: usize) -> Result<(), String> {
        if rows == 0 {
            Err("must hold at least one candidate".to_owned())
        } else if rows > self.max_candidates {
            Err(format!(
                "holds {rows} candidates, more than the limit of {} (--max-candidates)",
                self.max_candidates
            ))
        } else {
            self.queue.check(rows, "candidates")
        }
    }

    /// Checks that a request has a `user` object when the model takes a user side (user fields or dense
    /// features): without one, say that it is missing rather than what its parts lack.
    pub fn check_user_given(&self, given: bool) -> Result<(), ServiceError> {
        let mut takes = Vec::new();
        if !self.user_fields.is_empty() {
            takes.push(format!(
                "{} user-side fields in user.fields",
                self.user_fields.len()
            ));
        }
        if self.dense_features > 0 {
            takes.push(format!(
                "{} dense features in user.dense",
                self.dense_features
            ));
        }
        if given || takes.is_empty() {
            return Ok(());
        }
        Err(ServiceError::invalid(
            "user",
            format!("is missing: the model takes {}", takes.join(" and ")),
        ))
    }

    /// Checks the number of dense values the request gave (at `user.dense`).
    pub fn check_dense_len(&self, len: usize) -> Result<(), ServiceError> {
        if len == self.dense_features {
            Ok(())
        } else {
            Err(ServiceError::invalid(
                "user.dense",
                format!(
                    "holds {len} values, but the model takes {} dense features",
                    self.dense_features
                ),
            ))
        }
    }

    /// Checks a request's dense values (at `user.dense`): their number, and that each is finite.
    pub fn check_dense_values(&self, values: &[f32]) -> Result<(), ServiceError> {
        self.check_dense_len(values.len())?;
        for (i, &v) in values.iter().enumerate() {
            Self::check_dense(v)
                .map_err(|problem| ServiceError::invalid(format!("user.dense[{i}]"), problem))?;
        }
        Ok(())
    }

    /// What is wrong with a key of a `fields` object on `side` that is not one of the fields it takes.
    pub fn misplaced_field(&self, name: &str, side: Side) -> &'static str {
        match self.field_index(name) {
            Some(f) if Some(f) == self.item_id_field => {
                "is the model's item_id_field: send it as the candidate's `id`, not in `fields`"
            }
            Some(_) if side == Side::User => {
                "is an item-side field: send it in candidates[i].fields"
            }
            Some(_) => "is a user-side field: send it in user.fields",
            None => "is not a field of this model",
        }
    }

    /// The error for a request without the item's id (at `path`: `candidates[i].id`, or the columnar form's
    /// `candidates.id`) when the model has an `item_id_field`, whose value it is.
    pub fn item_id_required(&self, path: String, item_id_field: usize) -> ServiceError {
        ServiceError::invalid(
            path,
            format!(
                "is required: it is the value of the model's item_id_field {:?}",
                self.field_name(item_id_field)
            ),
        )
    }

    /// Checks the `j`th name of the columnar form's `candidates.fields`: one of the item fields a candidate
    /// carries (every `side = "item"` field but the `item_id_field`), not named before in `seen` (by field, which
    /// this marks). Returns the field: the column's place in each row.
    pub fn column_field(
        &self,
        j: usize,
        name: &str,
        seen: &mut [bool],
    ) -> Result<usize, ServiceError> {
        let path = || format!("candidates.fields[{j}]");
        let field = self
            .field_index(name)
            .filter(|f| self.item_fields.contains(f));
        let Some(f) = field else {
            let problem = match self.field_index(name) {
                Some(f) if Some(f) == self.item_id_field => {
                    "is the model's item_id_field: send it in candidates.id, not as a column"
                }
                _ => self.misplaced_field(name, Side::Item),
            };
            return Err(ServiceError::invalid(
                path(),
                format!("{:?} {problem}", Echo(name)),
            ));
        };
        if std::mem::replace(&mut seen[f], true) {
            return Err(ServiceError::invalid(
                path(),
                format!("{:?} is given more than once", Echo(name)),
            ));
        }
        Ok(f)
    }

    /// Checks that the columnar form's `candidates.fields` named every item field a candidate carries (`seen`, by
    /// field, as [`RankContract::column_field`] marked them).
    pub fn check_columns(&self, seen: &[bool]) -> Result<(), ServiceError> {
        match self.item_fields.iter().find(|&&f| !seen[f]) {
            None => Ok(()),
            Some(&f) => Err(ServiceError::invalid(
                "candidates.fields",
                format!(
                    "{:?} is missing: name every item-side field but the item_id_field once, in the order of \
                     the ids of each row",
                    self.field_name(f)
                ),
            )),
        }
    }

    /// Checks the length of row `row` of the columnar form's `candidates.ids`: one id per item field a candidate
    /// carries, the columns `candidates.fields` names.
    pub fn check_row_len(&self, row: usize, len: usize) -> Result<(), ServiceError> {
        let columns = self.item_fields.len();
        if len == columns {
            return Ok(());
        }
        Err(ServiceError::invalid(
            format!("candidates.ids[{row}]"),
            format!(
                "holds {len} ids, but a row holds {columns}: one per name in candidates.fields, every item-side \
                 field but the item_id_field"
            ),
        ))
    }

    /// Checks the length of the columnar form's `candidates.id`: one id per row of `candidates.ids`.
    pub fn check_item_ids_len(&self, len: usize, rows: usize) -> Result<(), ServiceError> {
        if len == rows {
            Ok(())
        } else {
            Err(ServiceError::invalid(
                "candidates.id",
                format!("holds {len} ids, but candidates.ids holds {rows} rows: give one per row"),
            ))
        }
    }

    /// Checks id `id` at `candidates.ids[row][column]` of the columnar form, whose column is `field`'s: as
    /// [`RankContract::check_id`], naming the field beside the place.
    pub fn check_column_id(
        &self,
        row: usize,
        column: usize,
        field: usize,
        id: i64,
    ) -> Result<(), ServiceError> {
        self.check_id(field, id).map_err(|problem| {
            ServiceError::invalid(
                format!(
                    "candidates.ids[{row}][{column}] ({})",
                    self.field_name(field)
                ),
                problem,
            )
        })
    }

    /// Checks a `fields` object (at `path`) that must hold exactly the fields `expected`, each id against its
    /// table, and writes each id into its position of `row`. A key that is not expected is refused with the
    /// problem `misplaced` names for it (the first in name order, so the message does not depend on hashing).
    pub fn fill_fields(
        &self,
        path: &str,
        given: &HashMap<String, i64>,
        expected: &[usize],
        misplaced: impl Fn(&str) -> &'static str,
        row: &mut [i64],
    ) -> Result<(), ServiceError> {
        for &f in expected {
            let name = self.field_name(f);
            let id = *given
                .get(name)
                .ok_or_else(|| ServiceError::invalid(format!("{path}.{name}"), "is missing"))?;
            self.check_id(f, id)
                .map_err(|problem| ServiceError::invalid(format!("{path}.{name}"), problem))?;
            row[f] = id;
        }
        if given.len() != expected.len() {
            let mut unknown: Vec<&String> = given
                .keys()
                .filter(|k| !expected.iter().any(|&f| self.field_name(f) == k.as_str()))
                .collect();
            unknown.sort_unstable();
            if let Some(name) = unknown.first() {
                return Err(ServiceError::invalid(
                    format!("{path}.{name}"),
                    misplaced(name),
                ));
            }
        }
        Ok(())
    }
}

/// Orders candidate positions best first by `scores`: higher score first, equal scores in position order, and NaN
/// (a broken model) last rather than first.
pub fn best_first(scores: &[f32]) -> impl Fn(&usize, &usize) -> Ordering + '_ {
    let key = |i: usize| {
        if scores[i].is_nan() {
            f32::NEG_INFINITY
        } else {
            scores[i]
        }
    };
    move |&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shadow_contract_takes_only_inputs_that_fit_it() {
        use crate::testing::test_contract::{SPEC, contract, wide_contract};
        let primary = contract();
        // Fields u, item, cat: ids 9 and 4 are the last rows of the two tables that reject others.
        let input = RankInput {
            rows: 2,
            ids: vec![9, 500, 4, 0, 1, 0],
            dense: vec![0.0; 4],
        };
        assert_eq!(contract().fits(&primary, &input), Ok(()));
        let smaller = RankContract::new(
            Arc::new(ModelSpec::parse(&SPEC.replace("rows = 5", "rows = 4")).expect("spec")),
            3,
        );
        assert_eq!(
            smaller.fits(&primary, &input).expect_err("id 4 of cat"),
            "id 4 is outside the vocabulary of table \"cat\" (ids 0 to 3), which rejects unknown ids"
        );
        assert_eq!(
            wide_contract()
                .fits(&primary, &input)
                .expect_err("other fields"),
            "its fields differ from the serving version's"
        );
        let too_many = RankInput {
            rows: 4,
            ids: vec![0; 12],
            dense: vec![0.0; 8],
        };
        assert!(
            contract().fits(&primary, &too_many).is_err(),
            "above max_candidates"
        );
    }

    #[test]
    fn best_first_puts_nan_last_and_keeps_ties_in_order() {
        let scores = [0.2, 0.9, f32::NAN, 0.9, 0.5];
        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(best_first(&scores));
        assert_eq!(order, [1, 3, 4, 0, 2]);
    }
}
