//! The columnar form of `/v1` rank candidates: the item-side ids as a matrix with one column per field,
//!
//! ```json
//! "candidates": {"fields": ["C21", "C22"], "ids": [[835, 81], [616, 45]], "id": [245, 1543]}
//! ```
//!
//! told apart from the row form (`"candidates": [{"id": 245, "fields": {"C21": 835, ...}}, ...]`) by being an
//! object, and decoded into the same rows. `fields` names every item-side field but the `item_id_field` once, in
//! any order: the order of the ids in each row of `ids`; `id` holds each row's item id (required when the model has
//! an `item_id_field`, whose value it is; else only echoed back); a model with candidate features takes them as
//! `"features": {"recall_score": [3.5, 2.0], ...}`, one array per feature with one value per row. Keys may come in any order: when `fields` comes
//! first (as clients write it) each id goes straight to its place in its row; when `ids` comes first, column `j`
//! waits at the place of the `j`th item field until `fields` is known, and [`Columns::finish`] puts each row in
//! order then. The byte scanner ([`super::scan`]) and the serde decoder here both fill a [`Columns`] and finish it
//! the same way; every check is [`RankContract`]'s.

use std::fmt;

use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::{Decoder, Key};
use recserve_core::error::ServiceError;
use recserve_core::ranking::RankContract;

/// What has been read of a columnar `candidates` object.
#[derive(Debug, Default)]
pub(super) struct Columns {
    /// The field of each column, once `fields` is read (and checked: every item field once).
    pub(crate) fields: Option<Vec<usize>>,
    /// The number of rows of `ids`, once read.
    pub(crate) rows: Option<usize>,
    /// Whether `ids` was read before `fields`: its columns then wait at the places of the item fields, in order.
    pub(crate) waiting: bool,
    /// `id`, once read: at most [`RankContract::max_rows`] of its elements.
    pub(crate) id: Option<Vec<Option<i64>>>,
    /// The number of elements of `id`, kept or not.
    pub(crate) id_len: usize,
    /// `features`, once read: each candidate feature's column, if given.
    pub(crate) features: Option<Vec<Option<Vec<f32>>>>,
}

impl Columns {
    /// The place in a row of each column of `ids` read now: its field's, or the one where it waits for `fields`.
    pub(crate) fn places<'c>(&'c self, contract: &'c RankContract) -> &'c [usize] {
        self.fields.as_deref().unwrap_or(&contract.item_fields)
    }

    /// Checks what can be checked only once every key is read, puts waiting columns in place (checking each id
    /// against its field's table then) and writes each row's item id: leaves `d` as the row form of the same
    /// candidates would.
    pub(crate) fn finish(self, d: &mut Decoder<'_>) -> Result<(), ServiceError> {
        let contract = d.contract;
        let fields = self.fields.ok_or_else(|| {
            ServiceError::invalid(
                "candidates.fields",
                "is required: it names the item field of each column of candidates.ids",
            )
        })?;
        let rows = self.rows.ok_or_else(|| {
            ServiceError::invalid(
                "candidates.ids",
                "is required: one row of ids per candidate",
            )
        })?;
        contract
            .check_rows(rows)
            .map_err(|problem| ServiceError::invalid("candidates.ids", problem))?;
        let nf = d.fields;
        if self.waiting {
            let mut row_columns = vec![0i64; fields.len()];
            for (i, row) in d.ids.chunks_exact_mut(nf).enumerate() {
                for (column, &waits_at) in row_columns.iter_mut().zip(&contract.item_fields) {
                    *column = row[waits_at];
                }
                for (j, (&f, &id)) in fields.iter().zip(&row_columns).enumerate() {
                    contract.check_column_id(i, j, f, id)?;
                    row[f] = id;
                }
            }
        }
        let candidate_ids = match (self.id, contract.item_id_field) {
            (Some(ids), item_id_field) => {
                contract.check_item_ids_len(self.id_len, rows)?;
                if let Some(f) = item_id_field {
                    for (i, (row, id)) in d.ids.chunks_exact_mut(nf).zip(&ids).enumerate() {
                        let path = || format!("candidates.id[{i}]");
                        let id = id.ok_or_else(|| contract.item_id_required(path(), f))?;
                        contract
                            .check_id(f, id)
                            .map_err(|problem| ServiceError::invalid(path(), problem))?;
                        row[f] = id;
                    }
                }
                ids
            }
            (None, Some(f)) => return Err(contract.item_id_required("candidates.id".to_owned(), f)),
            (None, None) => vec![None; rows],
        };
        let nc = contract.candidate_features;
        let mut given = self.features.unwrap_or_else(|| vec![None; nc]);
        d.features = vec![0.0; rows * nc];
        for (c, column) in given.iter_mut().enumerate() {
            let Some(column) = column.take() else {
                return Err(contract.candidate_feature_missing("candidates.features", c));
            };
            if column.len() != rows {
                return Err(ServiceError::invalid(
                    format!(
                        "candidates.features.{}",
                        contract.candidate_feature_names()[c]
                    ),
                    format!(
                        "holds {} values, but candidates.ids holds {rows} rows: give one per row",
                        column.len()
                    ),
                ));
            }
            for (row, value) in column.into_iter().enumerate() {
                d.features[row * nc + c] = value;
            }
        }
        d.candidate_ids = Some(candidate_ids);
        Ok(())
    }
}

/// Reads a columnar `candidates` object (the serde decoder's [`super::Candidates`] hands it over).
pub(super) fn visit_columns<'de, A: MapAccess<'de>>(
    d: &mut Decoder<'_>,
    mut map: A,
) -> Result<(), A::Error> {
    let mut columns = Columns::default();
    while let Some(Key(key)) = map.next_key()? {
        match &*key {
            "fields" => {
                if columns.fields.is_some() {
                    return Err(d.twice("candidates.fields".to_owned()));
                }
                let read = map.next_value_seed(Names(&mut *d));
                columns.fields = Some(d.locate(read, || "candidates.fields".to_owned())?);
            }
            "ids" => {
                if columns.rows.is_some() {
                    return Err(d.twice("candidates.ids".to_owned()));
                }
                columns.waiting = columns.fields.is_none();
                let read = map.next_value_seed(Rows {
                    d: &mut *d,
                    columns: &columns,
                });
                columns.rows = Some(d.locate(read, || "candidates.ids".to_owned())?);
            }
            "id" => {
                if columns.id.is_some() {
                    return Err(d.twice("candidates.id".to_owned()));
                }
                let read = map.next_value_seed(ItemIds(&mut *d));
                let (ids, len) = d.locate(read, || "candidates.id".to_owned())?;
                (columns.id, columns.id_len) = (Some(ids), len);
            }
            "features" => {
                if columns.features.is_some() {
                    return Err(d.twice("candidates.features".to_owned()));
                }
                let read = map.next_value_seed(FeatureColumns(&mut *d));
                columns.features = Some(d.locate(read, || "candidates.features".to_owned())?);
            }
            other => {
                return Err(d.fail(ServiceError::invalid(
                    format!("candidates.{other}"),
                    format!(
                        "unknown field `{other}`, expected `fields`, `ids`, `id` or `features`"
                    ),
                )));
            }
        }
    }
    columns.finish(d).map_err(|e| d.fail(e))
}

/// `candidates.features`: one array of finite numbers per candidate feature, by name.
struct FeatureColumns<'a, 'c>(&'a mut Decoder<'c>);

impl<'de> DeserializeSeed<'de> for FeatureColumns<'_, '_> {
    type Value = Vec<Option<Vec<f32>>>;
    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for FeatureColumns<'_, '_> {
    type Value = Vec<Option<Vec<f32>>>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of candidate feature name to an array of numbers")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let d = self.0;
        let contract = d.contract;
        let mut columns = vec![None; contract.candidate_features];
        while let Some(Key(key)) = map.next_key()? {
            let name = &*key;
            let path = || format!("candidates.features.{name}");
            let Some(c) = contract.candidate_feature_index(name) else {
                let problem = contract.unknown_candidate_feature(name);
                return Err(d.fail(ServiceError::invalid(path(), problem)));
            };
            if columns[c].is_some() {
                return Err(d.twice(path()));
            }
            let read = map.next_value::<Vec<f32>>();
            let values = d.locate(read, path)?;
            let bad = (values.iter().enumerate())
                .find_map(|(row, &v)| RankContract::check_dense(v).err().map(|p| (row, p)));
            if let Some((row, problem)) = bad {
                return Err(d.fail(ServiceError::invalid(format!("{}[{row}]", path()), problem)));
            }
            columns[c] = Some(values);
        }
        Ok(columns)
    }
}

/// `candidates.fields`: the field of each column, every item field but the item id once.
struct Names<'a, 'c>(&'a mut Decoder<'c>);

impl<'de> DeserializeSeed<'de> for Names<'_, '_> {
    type Value = Vec<usize>;
    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Vec<usize>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Names<'_, '_> {
    type Value = Vec<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of field names")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<usize>, A::Error> {
        let d = self.0;
        let contract = d.contract;
        let mut fields = Vec::with_capacity(contract.item_fields.len());
        d.seen.fill(false);
        loop {
            let j = fields.len();
            let read = seq.next_element::<Key>();
            let Some(Key(name)) = d.locate(read, || format!("candidates.fields[{j}]"))? else {
                break;
            };
            match contract.column_field(j, &name, &mut d.seen) {
                Ok(f) => fields.push(f),
                Err(e) => return Err(d.fail(e)),
            }
        }
        if let Err(e) = contract.check_columns(&d.seen) {
            return Err(d.fail(e));
        }
        Ok(fields)
    }
}

/// `candidates.ids`: at most [`RankContract::max_rows`] rows, each into its row of the decoder; its value is the
/// number of rows.
struct Rows<'a, 'c> {
    d: &'a mut Decoder<'c>,
    columns: &'a Columns,
}

impl<'de> DeserializeSeed<'de> for Rows<'_, '_> {
    type Value = usize;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<usize, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Rows<'_, '_> {
    type Value = usize;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of rows of ids")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<usize, A::Error> {
        let (d, columns) = (self.d, self.columns);
        let contract = d.contract;
        let max = contract.max_rows();
        let mut rows = 0;
        loop {
            if rows == max {
                // Past the limit: count the rest (the body size bounds them) to say how many there were.
                let mut total = rows;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    total += 1;
                }
                if let Err(problem) = contract.check_rows(total) {
                    return Err(d.fail(ServiceError::invalid("candidates.ids", problem)));
                }
                return Ok(total);
            }
            let start = d.ids.len();
            d.ids.resize(start + d.fields, 0);
            let read = seq.next_element_seed(Row {
                d: &mut *d,
                columns,
                row: rows,
            });
            match d.locate(read, || format!("candidates.ids[{rows}]"))? {
                Some(()) => rows += 1,
                None => {
                    d.ids.truncate(start);
                    return Ok(rows);
                }
            }
        }
    }
}

/// `candidates.ids[row]`: one id per column, each to its place in the decoder's row `row`.
struct Row<'a, 'c> {
    d: &'a mut Decoder<'c>,
    columns: &'a Columns,
    row: usize,
}

impl<'de> DeserializeSeed<'de> for Row<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Row<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of ids")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let (d, columns, i) = (self.d, self.columns, self.row);
        let contract = d.contract;
        let places = columns.places(contract);
        let start = i * d.fields;
        let mut j = 0;
        loop {
            let Some(&f) = places.get(j) else {
                // One more id than columns: count the rest to say how many there were.
                let mut len = j;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    len += 1;
                }
                return contract.check_row_len(i, len).map_err(|e| d.fail(e));
            };
            let read = seq.next_element::<i64>();
            let path = || match &columns.fields {
                Some(_) => format!("candidates.ids[{i}][{j}] ({})", contract.field_name(f)),
                None => format!("candidates.ids[{i}][{j}]"),
            };
            let Some(id) = d.locate(read, path)? else {
                return contract.check_row_len(i, j).map_err(|e| d.fail(e));
            };
            if columns.fields.is_some()
                && let Err(e) = contract.check_column_id(i, j, f, id)
            {
                return Err(d.fail(e));
            }
            d.ids[start + f] = id;
            j += 1;
        }
    }
}

/// `candidates.id`: each row's item id, or null for none; its value is the ids, at most
/// [`RankContract::max_rows`] of them (a request holds no more rows), and their number.
struct ItemIds<'a, 'c>(&'a mut Decoder<'c>);

impl<'de> DeserializeSeed<'de> for ItemIds<'_, '_> {
    type Value = (Vec<Option<i64>>, usize);
    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<(Vec<Option<i64>>, usize), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemIds<'_, '_> {
    type Value = (Vec<Option<i64>>, usize);
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of item ids")
    }
    fn visit_seq<A: SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> Result<(Vec<Option<i64>>, usize), A::Error> {
        let d = self.0;
        let max = d.contract.max_rows();
        let mut ids = Vec::new();
        loop {
            let i = ids.len();
            if i == max {
                // Past the limit of rows: count the rest (the body size bounds them) to say how many there were.
                let mut len = i;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    len += 1;
                }
                return Ok((ids, len));
            }
            let read = seq.next_element::<Option<i64>>();
            match d.locate(read, || format!("candidates.id[{i}]"))? {
                Some(id) => ids.push(id),
                None => return Ok((ids, i)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{RngExt, SeedableRng};
    use serde_json::{Value, json};

    use super::super::{RankBody, decode_rank, decode_rank_serde};
    use crate::testing::rank_reference::{self, to_columnar};
    use recserve_core::error::ServiceError;
    use recserve_core::ranking::RankContract;
    use recserve_core::repository::ModelSpec;
    use recserve_core::testing::test_contract::{SPEC, WIDE_SPEC, contract, wide_contract};

    /// Decodes `body` through the fast path and the serde decoder alone, which must agree; returns the result.
    fn decode_with(contract: &RankContract, body: &str) -> Result<RankBody, ServiceError> {
        let fast = decode_rank(contract, body.as_bytes());
        let serde = decode_rank_serde(contract, body.as_bytes());
        assert_eq!(format!("{fast:?}"), format!("{serde:?}"), "for {body}");
        fast
    }

    fn message(contract: &RankContract, body: &str) -> String {
        decode_with(contract, body)
            .expect_err("must be refused")
            .to_string()
    }

    /// The test contract with a table of item ids that rejects unknown ids.
    fn strict_item_ids() -> RankContract {
        let spec = SPEC.replacen(
            "name = \"item\"\nfile = \"t.safetensors\"\nrows = 100\ndim = 3\nstorage = \"fp32\"\n",
            "name = \"item\"\nfile = \"t.safetensors\"\nrows = 100\ndim = 3\nstorage = \"fp32\"\noov = \"reject\"\n",
            1,
        );
        assert_ne!(spec, SPEC);
        RankContract::new(Arc::new(ModelSpec::parse(&spec).expect("spec")), 3)
    }

    #[test]
    fn the_columnar_form_decodes_to_the_rows_of_the_row_form() {
        let contract = contract();
        let rows = r#"{"user": {"fields": {"u": 7}, "dense": [0.5, -1]}, "top_k": 1,
            "candidates": [{"id": 42, "fields": {"cat": 1}}, {"id": 3, "fields": {"cat": 4}}]}"#;
        let expected = decode_with(&contract, rows).expect("valid");
        assert_eq!(expected.input.ids, vec![7, 42, 1, 7, 3, 4]);
        for columns in [
            r#"{"fields": ["cat"], "ids": [[1], [4]], "id": [42, 3]}"#,
            r#"{"id": [42, 3], "ids": [[1], [4]], "fields": ["cat"]}"#,
            " { \"ids\" : [ [ 1 ] , [ 4 ] ] , \"fields\" : [ \"cat\" ] , \"id\" : [ 42 , 3 ] } ",
            r#"{"fields": ["c\u0061t"], "ids": [[1], [4]], "id": [42, 3]}"#,
        ] {
            let body = format!(
                r#"{{"user": {{"fields": {{"u": 7}}, "dense": [0.5, -1]}}, "candidates": {columns}, "top_k": 1}}"#
            );
            assert_eq!(
                decode_with(&contract, &body).expect("valid"),
                expected,
                "for {body}"
            );
        }
    }

    #[test]
    fn ids_are_echoed_and_may_be_absent_without_an_item_id_field() {
        // The wide contract's `item` is its item_id_field; without one, `id` is only echoed, null where absent.
        let spec = WIDE_SPEC.replace("item_id_field = \"item\"\n", "");
        let contract = RankContract::new(Arc::new(ModelSpec::parse(&spec).expect("spec")), 4);
        let user = r#""user": {"fields": {"u0": 1, "u1": 2, "u2": 3}, "dense": [0, 0, 0]}"#;
        let candidates = r#""fields": ["item", "i0", "i1", "i2", "i3"], "ids": [[9, 1, 2, 3, 4], [8, 5, 6, 7, 8]]"#;
        let with_ids = decode_with(
            &contract,
            &format!(r#"{{{user}, "candidates": {{{candidates}, "id": [70, null]}}}}"#),
        )
        .expect("valid");
        assert_eq!(with_ids.candidate_ids, vec![Some(70), None]);
        let without = decode_with(
            &contract,
            &format!(r#"{{{user}, "candidates": {{{candidates}}}}}"#),
        )
        .expect("valid");
        assert_eq!(without.candidate_ids, vec![None, None]);
        assert_eq!(with_ids.input, without.input);
        // Fields in model.toml order: u0 i0 u1 item i1 u2 i2 i3.
        assert_eq!(without.input.ids[..8], [1, 1, 2, 9, 2, 3, 3, 4]);
    }

    #[test]
    fn names_every_problem_of_the_columnar_form() {
        let user = r#""user": {"fields": {"u": 1}, "dense": [0, 0]}"#;
        let with = |candidates: &str| format!(r#"{{{user}, "candidates": {candidates}}}"#);
        let contract = contract();
        let cases = [
            (
                with("3"),
                "candidates: invalid type: integer `3`, expected an array of candidates, or an object of columns",
            ),
            (
                with("{}"),
                "candidates.fields: is required: it names the item field of each column of candidates.ids",
            ),
            (
                with(r#"{"fields": ["cat"], "id": [1]}"#),
                "candidates.ids: is required: one row of ids per candidate",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [], "id": []}"#),
                "candidates.ids: must hold at least one candidate",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0], [0], [0], [0]], "id": [1, 2, 3, 4]}"#),
                "candidates.ids: holds 4 candidates, more than the limit of 3 (--max-candidates)",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]]}"#),
                "candidates.id: is required: it is the value of the model's item_id_field \"item\"",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]], "id": [null]}"#),
                "candidates.id[0]: is required: it is the value of the model's item_id_field \"item\"",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]], "id": [1, 2]}"#),
                "candidates.id: holds 2 ids, but candidates.ids holds 1 rows: give one per row",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]], "id": ["1"]}"#),
                "candidates.id[0]: invalid type: string \"1\", expected i64",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]], "id": 1}"#),
                "candidates.id: invalid type: integer `1`, expected an array of item ids",
            ),
            (
                with(r#"{"id": [1, 2, 3, 4, 5], "fields": ["cat"], "ids": [[0]]}"#),
                "candidates.id: holds 5 ids, but candidates.ids holds 1 rows: give one per row",
            ),
            (
                with(r#"{"id": [1, 2, 3, 4], "fields": ["cat"], "ids": [[0], [0], [0], [0]]}"#),
                "candidates.ids: holds 4 candidates, more than the limit of 3 (--max-candidates)",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]], "id": [Infinity]}"#),
                "candidates.id[0]: Infinity is not a number JSON can carry (JSON has no NaN or Infinity): send a \
                 finite number",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[NaN]], "id": [1]}"#),
                "candidates.ids[0][0] (cat): NaN is not a number JSON can carry",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[1e400]], "id": [1]}"#),
                "candidates.ids[0][0] (cat): 1e400 is beyond the range of 64-bit floating point",
            ),
            (
                with(r#"{"fields": ["zz"], "ids": [[0]], "id": [1]}"#),
                "candidates.fields[0]: \"zz\" is not a field of this model",
            ),
            (
                with(r#"{"fields": ["u"], "ids": [[0]], "id": [1]}"#),
                "candidates.fields[0]: \"u\" is a user-side field: send it in user.fields",
            ),
            (
                with(r#"{"fields": ["item"], "ids": [[0]], "id": [1]}"#),
                "candidates.fields[0]: \"item\" is the model's item_id_field: send it in candidates.id, not as a column",
            ),
            (
                with(r#"{"fields": ["cat", "cat"], "ids": [[0, 0]], "id": [1]}"#),
                "candidates.fields[1]: \"cat\" is given more than once",
            ),
            (
                with(r#"{"fields": [], "ids": [[]], "id": [1]}"#),
                "candidates.fields: \"cat\" is missing: name every item-side field but the item_id_field once",
            ),
            (
                with(r#"{"fields": [1], "ids": [[0]], "id": [1]}"#),
                "candidates.fields[0]: invalid type: integer `1`, expected a field name",
            ),
            (
                with(r#"{"fields": "cat", "ids": [[0]], "id": [1]}"#),
                "candidates.fields: invalid type: string \"cat\", expected an array of field names",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[]], "id": [1]}"#),
                "candidates.ids[0]: holds 0 ids, but a row holds 1: one per name in candidates.fields",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0], [1, 2, 3]], "id": [1, 2]}"#),
                "candidates.ids[1]: holds 3 ids, but a row holds 1",
            ),
            (
                with(r#"{"ids": [[0], [1, 2]], "fields": ["cat"], "id": [1, 2]}"#),
                "candidates.ids[1]: holds 2 ids, but a row holds 1",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[5]], "id": [1]}"#),
                "candidates.ids[0][0] (cat): id 5 is outside the vocabulary of table \"cat\" (ids 0 to 4), which rejects unknown ids",
            ),
            (
                with(r#"{"ids": [[0], [-1]], "id": [1, 2], "fields": ["cat"]}"#),
                "candidates.ids[1][0] (cat): id -1 is outside the vocabulary of table \"cat\"",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [["x"]], "id": [1]}"#),
                "candidates.ids[0][0] (cat): invalid type: string \"x\", expected i64",
            ),
            (
                with(r#"{"ids": [[1.5]], "fields": ["cat"], "id": [1]}"#),
                "candidates.ids[0][0]: invalid type: floating point `1.5`, expected i64",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[99999999999999999999]], "id": [1]}"#),
                "candidates.ids[0][0] (cat): the integer 99999999999999999999 does not fit in 64 bits (expected i64)",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [1], "id": [1]}"#),
                "candidates.ids[0]: invalid type: integer `1`, expected an array of ids",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": {}, "id": [1]}"#),
                "candidates.ids: invalid type: map, expected an array of rows of ids",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]], "id": [1], "score": 1}"#),
                "candidates.score: unknown field `score`, expected `fields`, `ids`, `id` or `features`",
            ),
            (
                with(r#"{"fields": ["cat"], "fields": ["cat"], "ids": [[0]], "id": [1]}"#),
                "candidates.fields: is given more than once",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]], "ids": [[0]], "id": [1]}"#),
                "candidates.ids: is given more than once",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]], "id": [1], "id": [1]}"#),
                "candidates.id: is given more than once",
            ),
            (
                with(r#"{"fields": ["cat"], "ids": [[0]], "id": [1]"#),
                "malformed request body: EOF while parsing",
            ),
            (
                r#"{"candidates": {"fields": ["cat"], "ids": [[0]], "id": [1]}}"#.to_owned(),
                "user: is missing",
            ),
            (
                format!(
                    r#"{{{user}, "candidates": {{"fields": ["cat"], "ids": [[0]], "id": [1]}}, "candidates": {{"fields": ["cat"], "ids": [[0]], "id": [1]}}}}"#
                ),
                "candidates: is given more than once",
            ),
        ];
        for (body, expected) in cases {
            let got = message(&contract, &body);
            assert!(
                got.starts_with(expected),
                "for {body}\nexpected {expected:?}\ngot      {got:?}"
            );
        }
        let strict = strict_item_ids();
        assert_eq!(
            message(
                &strict,
                &with(r#"{"fields": ["cat"], "ids": [[0], [0]], "id": [99, 100]}"#)
            ),
            "candidates.id[1]: id 100 is outside the vocabulary of table \"item\" (ids 0 to 99), which rejects unknown ids"
        );
        // The wide contract's column names in an order of their own; a bad id is named with its column's field.
        let wide = wide_contract();
        let user = r#""user": {"fields": {"u0": 1, "u1": 2, "u2": 3}, "dense": [0, 0, 0]}"#;
        for candidates in [
            r#"{"fields": ["i3", "i1", "i0", "i2"], "ids": [[0, 1, 2, 3], [0, 50, 2, 3]], "id": [1, 2]}"#,
            r#"{"ids": [[0, 1, 2, 3], [0, 50, 2, 3]], "id": [1, 2], "fields": ["i3", "i1", "i0", "i2"]}"#,
        ] {
            assert_eq!(
                message(&wide, &format!(r#"{{{user}, "candidates": {candidates}}}"#)),
                "candidates.ids[1][1] (i1): id 50 is outside the vocabulary of table \"strict\" (ids 0 to 49), which \
                 rejects unknown ids"
            );
        }
    }

    /// Writes `request` (a row-form request as a JSON value) with its columnar candidates' keys in `order` and the
    /// top level's in the order given.
    fn columnar_text(request: &Value, columns: &[String], order: &[&str], top: &[&str]) -> String {
        let columnar = to_columnar(request, Some(columns));
        let candidates = &columnar["candidates"];
        let members: Vec<String> = order
            .iter()
            .filter(|k| candidates.get(**k).is_some())
            .map(|k| format!("\"{k}\": {}", candidates[*k]))
            .collect();
        let candidates = format!("{{{}}}", members.join(", "));
        let members: Vec<String> = top
            .iter()
            .filter(|k| columnar.get(**k).is_some())
            .map(|k| match *k {
                "candidates" => format!("\"candidates\": {candidates}"),
                _ => format!("\"{k}\": {}", columnar[*k]),
            })
            .collect();
        format!("{{{}}}", members.join(", "))
    }

    /// Random valid requests for the wide contract, each sent in the row form and in the columnar form with its
    /// columns and keys in random orders: the same body from the fast path, the serde decoder and the reference.
    #[test]
    fn both_forms_of_random_requests_decode_alike() {
        let contract = wide_contract();
        let mut rng = StdRng::seed_from_u64(19);
        let mut names: Vec<String> = ["i0", "i1", "i2", "i3"].map(str::to_owned).to_vec();
        for round in 0..300 {
            let rows = rng.random_range(1..=40);
            let candidates: Vec<Value> = (0..rows)
                .map(|_| {
                    json!({
                        "id": rng.random_range(-5..1100i64),
                        "fields": {
                            "i0": rng.random_range(-5..1100i64),
                            "i1": rng.random_range(0..50i64),
                            "i2": rng.random_range(-5..1100i64),
                            "i3": rng.random_range(0..1100i64),
                        }
                    })
                })
                .collect();
            let mut request = json!({
                "user": {
                    "fields": {"u0": rng.random_range(0..50i64), "u1": 7, "u2": rng.random_range(-5..1100i64)},
                    "dense": [rng.random_range(-10.0..10.0f32), 0.25, -3],
                },
                "candidates": candidates,
            });
            if round % 2 == 0 {
                request["top_k"] = json!(rng.random_range(1..rows + 3));
            }
            // Mostly model.toml order, as clients send it; often another.
            if rng.random_bool(0.5) {
                names.shuffle(&mut rng);
            }
            let mut order = ["fields", "ids", "id"];
            order.shuffle(&mut rng);
            let mut top = ["user", "candidates", "top_k"];
            top.shuffle(&mut rng);
            let columnar = columnar_text(&request, &names, &order, &top);
            let rows_form = decode_with(&contract, &request.to_string()).expect("valid rows");
            let columns_form = decode_with(&contract, &columnar).expect("valid columns");
            assert_eq!(columns_form, rows_form, "for {columnar}");
            let reference = rank_reference::decode_rank(&contract, columnar.as_bytes())
                .expect("the reference takes it");
            assert_eq!(columns_form, reference, "for {columnar}");
        }
    }
}
