//! Decoding of `/v1` rank bodies straight into the rows the model takes, in one pass over the JSON: no map per
//! candidate, no key strings, no hashing on the way. Field names are matched against the contract as they are
//! read (the name expected next first, since clients send every candidate's fields in one order), each id lands
//! in its column of the candidate's row, and every problem names its place in the request
//! (`candidates[3].fields.C21`). [`crate::testing::rank_reference`] is the plain decoding (serde derive into maps, then
//! checks) that this one is tested and benchmarked against. Bodies in the shape clients write go through a byte
//! scanner first ([`scan`]), which fills the same decoder state without serde's visitors and hands anything else,
//! every malformed body included, to the serde decoder here.

mod scan;

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::api::envelope::{json_error, require_object};
use crate::error::ServiceError;
use crate::ranking::{RankContract, RankInput};
use crate::repository::Side;

/// A decoded rank request.
#[derive(Debug, PartialEq)]
pub struct RankBody {
    /// The rows to score: the user side repeated for every candidate.
    pub input: RankInput,
    /// Each candidate's `id` as sent, in request order (echoed in the response).
    pub candidate_ids: Vec<Option<i64>>,
    pub top_k: Option<usize>,
}

/// Decodes a `/v1` rank body against the model's contract: through the fast path ([`scan`]) when the body is in
/// the shape it takes, else through the serde decoder ([`decode_rank_serde`]), with the same result either way.
pub fn decode_rank(contract: &RankContract, body: &[u8]) -> Result<RankBody, ServiceError> {
    require_object(body)?;
    let mut decoder = Decoder::new(contract);
    if scan::scan(&mut decoder, body).is_some() {
        return decoder.finish();
    }
    decode_rank_serde(contract, body)
}

/// The serde decoder alone: what [`decode_rank`] falls back to for bodies its fast path does not take, and the
/// one that names every problem. Public for the benchmark and the fuzz target that hold the two paths together.
pub fn decode_rank_serde(contract: &RankContract, body: &[u8]) -> Result<RankBody, ServiceError> {
    require_object(body)?;
    let mut decoder = Decoder::new(contract);
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed = Top(&mut decoder)
        .deserialize(&mut de)
        .and_then(|()| de.end());
    match parsed {
        Ok(()) => decoder.finish(),
        Err(e) => Err(decoder
            .problem
            .take()
            .unwrap_or_else(|| json_error(body, decoder.at.take(), &e))),
    }
}

/// What has been read so far, and the first problem.
struct Decoder<'c> {
    contract: &'c RankContract,
    fields: usize,
    /// A problem one of our checks found; the serde error that carries it out of the parser is a placeholder.
    problem: Option<ServiceError>,
    /// Where the first serde error (a wrong type, a number out of range) arose.
    at: Option<String>,
    user_row: Vec<i64>,
    user_read: bool,
    user_fields_read: bool,
    dense: Option<Vec<f32>>,
    /// `[rows, fields]`, item columns filled as read, user columns at the end.
    ids: Vec<i64>,
    candidate_ids: Option<Vec<Option<i64>>>,
    top_k: Option<Option<usize>>,
    /// Which fields the object being read has set.
    seen: Vec<bool>,
}

impl<'c> Decoder<'c> {
    fn new(contract: &'c RankContract) -> Self {
        let fields = contract.fields();
        Decoder {
            contract,
            fields,
            problem: None,
            at: None,
            user_row: vec![0; fields],
            user_read: false,
            user_fields_read: false,
            dense: None,
            ids: Vec::new(),
            candidate_ids: None,
            top_k: None,
            seen: vec![false; fields],
        }
    }

    /// Records `error` and returns the placeholder that stops the parser.
    fn fail<E: de::Error>(&mut self, error: ServiceError) -> E {
        self.problem = Some(error);
        E::custom("rejected")
    }

    /// Notes where a serde error arose, if nothing deeper has.
    fn locate<T, E>(
        &mut self,
        result: Result<T, E>,
        path: impl FnOnce() -> String,
    ) -> Result<T, E> {
        if result.is_err() && self.at.is_none() && self.problem.is_none() {
            self.at = Some(path());
        }
        result
    }

    fn twice<E: de::Error>(&mut self, path: String) -> E {
        self.fail(ServiceError::invalid(path, "is given more than once"))
    }

    /// Checks what could not be checked while reading and lays out the rows.
    fn finish(mut self) -> Result<RankBody, ServiceError> {
        let contract = self.contract;
        let Some(candidate_ids) = self.candidate_ids.take() else {
            return Err(ServiceError::invalid("candidates", "is required"));
        };
        let rows = candidate_ids.len();
        contract
            .check_rows(rows)
            .map_err(|problem| ServiceError::invalid("candidates", problem))?;
        contract.check_user_given(self.user_read)?;
        let dense = self.dense.take().unwrap_or_default();
        contract.check_dense_len(dense.len())?;
        if !self.user_fields_read
            && let Some(&f) = contract.user_fields.first()
        {
            return Err(ServiceError::invalid(
                format!("user.fields.{}", contract.field_name(f)),
                "is missing",
            ));
        }
        let mut ids = self.ids;
        for row in ids.chunks_exact_mut(self.fields) {
            for &f in &contract.user_fields {
                row[f] = self.user_row[f];
            }
        }
        Ok(RankBody {
            input: RankInput {
                rows,
                ids,
                dense: dense.repeat(rows),
            },
            candidate_ids,
            top_k: self.top_k.flatten(),
        })
    }
}

/// An object key, borrowed from the body unless it holds escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: de::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a key")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// The body: `{"user": ..., "candidates": [...], "top_k": k}`.
struct Top<'a, 'c>(&'a mut Decoder<'c>);

impl<'de> DeserializeSeed<'de> for Top<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Top<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a rank request object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let d = self.0;
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "user" => {
                    if std::mem::replace(&mut d.user_read, true) {
                        return Err(d.twice("user".to_owned()));
                    }
                    let read = map.next_value_seed(User(&mut *d));
                    d.locate(read, || "user".to_owned())?;
                }
                "candidates" => {
                    if d.candidate_ids.is_some() {
                        return Err(d.twice("candidates".to_owned()));
                    }
                    let read = map.next_value_seed(Candidates(&mut *d));
                    d.locate(read, || "candidates".to_owned())?;
                }
                "top_k" => {
                    if d.top_k.is_some() {
                        return Err(d.twice("top_k".to_owned()));
                    }
                    let read = map.next_value::<Option<usize>>();
                    let top_k = d.locate(read, || "top_k".to_owned())?;
                    if top_k == Some(0) {
                        return Err(d.fail(ServiceError::invalid("top_k", "must be at least 1")));
                    }
                    d.top_k = Some(top_k);
                }
                other => {
                    return Err(d.fail(ServiceError::invalid(
                        other,
                        format!(
                            "unknown field `{other}`, expected one of `user`, `candidates`, `top_k`"
                        ),
                    )));
                }
            }
        }
        Ok(())
    }
}

/// `user`: `{"fields": {...}, "dense": [...]}`.
struct User<'a, 'c>(&'a mut Decoder<'c>);

impl<'de> DeserializeSeed<'de> for User<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for User<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object with `fields` and `dense`")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let d = self.0;
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "fields" => {
                    if d.user_fields_read {
                        return Err(d.twice("user.fields".to_owned()));
                    }
                    let read = map.next_value_seed(Fields {
                        d: &mut *d,
                        candidate: None,
                    });
                    d.locate(read, || "user.fields".to_owned())?;
                    d.user_fields_read = true;
                }
                "dense" => {
                    if d.dense.is_some() {
                        return Err(d.twice("user.dense".to_owned()));
                    }
                    let read = map.next_value_seed(Dense(&mut *d));
                    let dense = d.locate(read, || "user.dense".to_owned())?;
                    d.dense = Some(dense);
                }
                other => {
                    return Err(d.fail(ServiceError::invalid(
                        format!("user.{other}"),
                        format!("unknown field `{other}`, expected `fields` or `dense`"),
                    )));
                }
            }
        }
        Ok(())
    }
}

/// `user.dense`: finite numbers.
struct Dense<'a, 'c>(&'a mut Decoder<'c>);

impl<'de> DeserializeSeed<'de> for Dense<'_, '_> {
    type Value = Vec<f32>;
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<Vec<f32>, D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Dense<'_, '_> {
    type Value = Vec<f32>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of numbers")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<f32>, A::Error> {
        let d = self.0;
        let mut dense = Vec::with_capacity(d.contract.dense_features);
        loop {
            let i = dense.len();
            let read = seq.next_element::<f32>();
            let Some(value) = d.locate(read, || format!("user.dense[{i}]"))? else {
                return Ok(dense);
            };
            if let Err(problem) = RankContract::check_dense(value) {
                return Err(d.fail(ServiceError::invalid(format!("user.dense[{i}]"), problem)));
            }
            dense.push(value);
        }
    }
}

/// `candidates`: at most [`RankContract::max_rows`] of them, each decoded into its row.
struct Candidates<'a, 'c>(&'a mut Decoder<'c>);

impl<'de> DeserializeSeed<'de> for Candidates<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for Candidates<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of candidates")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let d = self.0;
        let max = d.contract.max_rows();
        let mut candidate_ids = Vec::new();
        loop {
            let i = candidate_ids.len();
            if i == max {
                // Past the limit: count the rest (the body size bounds them) to say how many there were.
                let mut rows = i;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    rows += 1;
                }
                if let Err(problem) = d.contract.check_rows(rows) {
                    return Err(d.fail(ServiceError::invalid("candidates", problem)));
                }
                break;
            }
            let read = seq.next_element_seed(Candidate {
                d: &mut *d,
                index: i,
            });
            match d.locate(read, || format!("candidates[{i}]"))? {
                Some(id) => candidate_ids.push(id),
                None => break,
            }
        }
        d.candidate_ids = Some(candidate_ids);
        Ok(())
    }
}

/// `candidates[index]`: `{"id": ..., "fields": {...}}`; its value is the `id` as sent.
struct Candidate<'a, 'c> {
    d: &'a mut Decoder<'c>,
    index: usize,
}

impl<'de> DeserializeSeed<'de> for Candidate<'_, '_> {
    type Value = Option<i64>;
    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Option<i64>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Candidate<'_, '_> {
    type Value = Option<i64>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a candidate object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<i64>, A::Error> {
        let (d, i) = (self.d, self.index);
        let nf = d.fields;
        let start = d.ids.len();
        debug_assert_eq!(start, i * nf);
        d.ids.resize(start + nf, 0);
        let mut id: Option<Option<i64>> = None;
        let mut fields_read = false;
        while let Some(Key(key)) = map.next_key()? {
            match &*key {
                "id" => {
                    if id.is_some() {
                        return Err(d.twice(format!("candidates[{i}].id")));
                    }
                    let read = map.next_value::<Option<i64>>();
                    id = Some(d.locate(read, || format!("candidates[{i}].id"))?);
                }
                "fields" => {
                    if fields_read {
                        return Err(d.twice(format!("candidates[{i}].fields")));
                    }
                    let read = map.next_value_seed(Fields {
                        d: &mut *d,
                        candidate: Some(i),
                    });
                    d.locate(read, || format!("candidates[{i}].fields"))?;
                    fields_read = true;
                }
                other => {
                    return Err(d.fail(ServiceError::invalid(
                        format!("candidates[{i}].{other}"),
                        format!("unknown field `{other}`, expected `id` or `fields`"),
                    )));
                }
            }
        }
        let contract = d.contract;
        if !fields_read && let Some(&f) = contract.item_fields.first() {
            return Err(d.fail(ServiceError::invalid(
                format!("candidates[{i}].fields.{}", contract.field_name(f)),
                "is missing",
            )));
        }
        let id = id.flatten();
        if let Some(f) = contract.item_id_field {
            let Some(value) = id else {
                return Err(d.fail(ServiceError::invalid(
                    format!("candidates[{i}].id"),
                    format!(
                        "is required: it is the value of the model's item_id_field {:?}",
                        contract.field_name(f)
                    ),
                )));
            };
            if let Err(problem) = contract.check_id(f, value) {
                return Err(d.fail(ServiceError::invalid(
                    format!("candidates[{i}].id"),
                    problem,
                )));
            }
            d.ids[start + f] = value;
        }
        Ok(id)
    }
}

/// A `fields` object: the user's (`candidate` is `None`) or a candidate's. Every id is written into its column.
struct Fields<'a, 'c> {
    d: &'a mut Decoder<'c>,
    candidate: Option<usize>,
}

impl Fields<'_, '_> {
    fn path(candidate: Option<usize>, name: &str) -> String {
        match candidate {
            None => format!("user.fields.{name}"),
            Some(i) => format!("candidates[{i}].fields.{name}"),
        }
    }
}

impl<'de> DeserializeSeed<'de> for Fields<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Fields<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of field name to integer id")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let (d, candidate) = (self.d, self.candidate);
        let contract = d.contract;
        let (expected, side, row_start) = match candidate {
            None => (&contract.user_fields, Side::User, None),
            Some(i) => (&contract.item_fields, Side::Item, Some(i * d.fields)),
        };
        d.seen.fill(false);
        let mut read = 0;
        // Where in `expected` the next key most likely is.
        let mut next = 0;
        while let Some(Key(key)) = map.next_key()? {
            let name = &*key;
            let position = if expected
                .get(next)
                .is_some_and(|&f| contract.field_name(f) == name)
            {
                next
            } else {
                match contract
                    .field_index(name)
                    .and_then(|f| expected.iter().position(|&e| e == f))
                {
                    Some(position) => position,
                    None => {
                        let problem = contract.misplaced_field(name, side);
                        return Err(
                            d.fail(ServiceError::invalid(Self::path(candidate, name), problem))
                        );
                    }
                }
            };
            next = position + 1;
            let f = expected[position];
            let value = map.next_value::<i64>();
            let id = d.locate(value, || Self::path(candidate, name))?;
            if std::mem::replace(&mut d.seen[f], true) {
                return Err(d.twice(Self::path(candidate, name)));
            }
            if let Err(problem) = contract.check_id(f, id) {
                return Err(d.fail(ServiceError::invalid(Self::path(candidate, name), problem)));
            }
            match row_start {
                None => d.user_row[f] = id,
                Some(start) => d.ids[start + f] = id,
            }
            read += 1;
        }
        if read != expected.len()
            && let Some(&f) = expected.iter().find(|&&f| !d.seen[f])
        {
            return Err(d.fail(ServiceError::invalid(
                Self::path(candidate, contract.field_name(f)),
                "is missing",
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rand::rngs::StdRng;
    use rand::seq::SliceRandom;
    use rand::{RngExt, SeedableRng};

    use super::*;
    use crate::repository::ModelSpec;
    use crate::testing::rank_reference;
    use crate::testing::test_contract::contract;

    fn decode(body: &str) -> Result<RankInput, ServiceError> {
        decode_rank(&contract(), body.as_bytes()).map(|b| b.input)
    }

    fn message(body: &str) -> String {
        decode(body).expect_err("must be refused").to_string()
    }

    #[test]
    fn expands_user_side_to_every_candidate() {
        let input = decode(
            r#"{"user": {"fields": {"u": 7}, "dense": [0.5, -1]},
                "candidates": [{"id": 42, "fields": {"cat": 1}}, {"id": 3, "fields": {"cat": 4}}]}"#,
        )
        .expect("valid");
        assert_eq!(input.rows, 2);
        assert_eq!(input.ids, vec![7, 42, 1, 7, 3, 4]);
        assert_eq!(input.dense, vec![0.5, -1.0, 0.5, -1.0]);
    }

    #[test]
    fn out_of_vocabulary_ids_pass_only_for_default_tables() {
        // `item` has oov = "default": any id passes here and reads the default row in the gather.
        let input = decode(r#"{"user": {"fields": {"u": 0}, "dense": [0, 0]}, "candidates": [{"id": -5, "fields": {"cat": 0}}]}"#)
            .expect("default policy");
        assert_eq!(input.ids, vec![0, -5, 0]);
    }

    #[test]
    fn names_the_field_of_every_problem() {
        let ok_user = r#""user": {"fields": {"u": 1}, "dense": [0, 0]}"#;
        let cases = [
            (r#"{"user": "#.to_owned(), "malformed request body: EOF while parsing"),
            (format!(r#"{{{ok_user}}}"#), "candidates: is required"),
            (format!(r#"{{{ok_user}, "candidates": []}}"#), "candidates: must hold at least one candidate"),
            (
                format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}, {{"id": 1, "fields": {{"cat": 0}}}}, {{"id": 1, "fields": {{"cat": 0}}}}, {{"id": 1, "fields": {{"cat": 0}}}}]}}"#),
                "candidates: holds 4 candidates, more than the limit of 3",
            ),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": "x"}}}}]}}"#), "candidates[0].fields.cat: invalid type: string \"x\", expected i64"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1.5, "fields": {{"cat": 0}}}}]}}"#), "candidates[0].id: invalid type: floating point"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{}}}}]}}"#), "candidates[0].fields.cat: is missing"),
            (format!(r#"{{{ok_user}, "candidates": [{{"fields": {{"cat": 0}}}}]}}"#), "candidates[0].id: is required: it is the value of the model's item_id_field \"item\""),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 5}}}}]}}"#), "candidates[0].fields.cat: id 5 is outside the vocabulary of table \"cat\" (ids 0 to 4), which rejects unknown ids"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0, "item": 1}}}}]}}"#), "candidates[0].fields.item: is the model's item_id_field"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0, "u": 1}}}}]}}"#), "candidates[0].fields.u: is a user-side field"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0, "zz": 1}}}}]}}"#), "candidates[0].fields.zz: is not a field of this model"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}], "top_k": 0}}"#), "top_k: must be at least 1"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}], "extra": 1}}"#), "extra: unknown field `extra`"),
            (r#"{"user": {"fields": {"u": 10}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.u: id 10 is outside the vocabulary"),
            (r#"{"user": {"fields": {"u": 1, "cat": 1}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.cat: is an item-side field"),
            (r#"{"user": {"fields": {}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.u: is missing"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.dense: holds 1 values, but the model takes 2 dense features"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0, 1e39]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.dense[1]: must be a finite number, got inf"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0, NaN]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.dense[1]: NaN is not a number JSON can carry (JSON has no NaN or Infinity): send a finite number"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [-Infinity, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.dense[0]: -Infinity is not a number JSON can carry"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0, 1e400]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.dense[1]: 1e400 is beyond the range of 64-bit floating point (about ±1.8e308)"),
            (format!(r#"{{"user": {{"fields": {{"u": 1}}, "dense": [0, {}]}}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}]}}"#, "1".repeat(5000)), "user.dense[1]: the integer 1111111111"),
            (format!(r#"{{"user": {{"fields": {{"u": 1}}, "dense": [0, {}]}}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}]}}"#, "1".repeat(5000)), "… (first 100 of 5000 characters) is beyond the range of every 64-bit number, integer or floating point"),
            (r#"{"user": {"fields": {"u": -9223372036854775809}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.u: the integer -9223372036854775809 does not fit in 64 bits (expected i64)"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0, 0]}, "candidates": [{"id": 18446744073709551616, "fields": {"cat": 0}}]}"#.to_owned(), "candidates[0].id: the integer 18446744073709551616 does not fit in 64 bits (expected i64)"),
            (r#"{"candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user: is missing: the model takes 1 user-side fields in user.fields and 2 dense features in user.dense"),
            (r#"{"user": {"fields": {"u": 1}, "dense": [0, "1"]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.dense[1]: invalid type: string"),
            (r#"{"user": {"fields": {"u": 99999999999999999999}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.u"),
            ("[]".to_owned(), "malformed request body"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}]}} trailing"#), "malformed request body: trailing characters"),
        ];
        for (body, expected) in cases {
            let got = message(&body);
            assert!(
                got.contains(expected),
                "for {body}\nexpected {expected:?}\ngot      {got:?}"
            );
        }
    }

    #[test]
    fn takes_fields_in_any_order_and_keys_with_escapes() {
        let input = decode(
            r#"{"candidates": [{"fields": {"cat": 2}, "id": 9}], "top_k": null,
                "user": {"dense": [1, 2], "fields": {"\u0075": 3}}}"#,
        )
        .expect("valid");
        assert_eq!(input.ids, vec![3, 9, 2]);
        assert_eq!(input.dense, vec![1.0, 2.0]);
    }

    #[test]
    fn refuses_a_key_given_twice() {
        let ok_user = r#""user": {"fields": {"u": 1}, "dense": [0, 0]}"#;
        let cases = [
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0, "cat": 1}}}}]}}"#), "candidates[0].fields.cat: is given more than once"),
            (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "id": 2, "fields": {{"cat": 0}}}}]}}"#), "candidates[0].id: is given more than once"),
            (format!(r#"{{{ok_user}, {ok_user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}]}}"#), "user: is given more than once"),
            (r#"{"user": {"fields": {"u": 1, "u": 2}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields.u: is given more than once"),
        ];
        for (body, expected) in cases {
            let got = message(&body);
            assert!(
                got.contains(expected),
                "for {body}\nexpected {expected:?}\ngot      {got:?}"
            );
        }
    }

    /// A wider contract for the comparison with the reference: three user fields (one table rejects unknown
    /// ids), four item fields besides the item id (one rejects), three dense features.
    const WIDE: &str = r#"
format_version = 1
kind = "deepfm"
[ranking]
dense_features = ["d0", "d1", "d2"]
item_id_field = "item"
[dense_graph]
file = "g.onnx"
precision = "fp32"
[[tables]]
name = "strict"
file = "t.safetensors"
rows = 50
dim = 2
storage = "fp32"
oov = "reject"
[[tables]]
name = "open"
file = "t.safetensors"
rows = 1000
dim = 2
storage = "fp32"
[[fields]]
name = "u0"
side = "user"
table = "strict"
[[fields]]
name = "i0"
side = "item"
table = "open"
[[fields]]
name = "u1"
side = "user"
table = "open"
[[fields]]
name = "item"
side = "item"
table = "open"
[[fields]]
name = "i1"
side = "item"
table = "strict"
[[fields]]
name = "u2"
side = "user"
table = "open"
[[fields]]
name = "i2"
side = "item"
table = "open"
[[fields]]
name = "i3"
side = "item"
table = "open"
"#;

    /// One part of a generated body: an object's members, kept apart so that tests can shuffle, drop or change
    /// them before writing the JSON.
    fn object(members: &[(String, String)]) -> String {
        let inner: Vec<String> = members
            .iter()
            .map(|(k, v)| format!("{}: {v}", serde_json::to_string(k).expect("key")))
            .collect();
        format!("{{{}}}", inner.join(", "))
    }

    /// A valid body for [`WIDE`] with `rows` candidates: members in random order, ids mostly in vocabulary
    /// (the open table scores unknown ids with its default row, so some are out of it).
    fn wide_body(rng: &mut StdRng, rows: usize) -> Vec<(String, Vec<(String, String)>)> {
        let id = |rng: &mut StdRng, strict: bool| -> String {
            if strict {
                rng.random_range(0..50i64).to_string()
            } else {
                rng.random_range(-5..1100i64).to_string()
            }
        };
        let mut user_fields: Vec<(String, String)> = vec![
            ("u0".into(), id(rng, true)),
            ("u1".into(), id(rng, false)),
            ("u2".into(), id(rng, false)),
        ];
        user_fields.shuffle(rng);
        let dense: Vec<String> = (0..3)
            .map(|_| format!("{:.3}", rng.random_range(-10.0..10.0f32)))
            .collect();
        let mut user = vec![
            ("fields".to_owned(), object(&user_fields)),
            ("dense".to_owned(), format!("[{}]", dense.join(","))),
        ];
        user.shuffle(rng);
        let candidates: Vec<String> = (0..rows)
            .map(|_| {
                let mut fields: Vec<(String, String)> = vec![
                    ("i0".into(), id(rng, false)),
                    ("i1".into(), id(rng, true)),
                    ("i2".into(), id(rng, false)),
                    ("i3".into(), id(rng, false)),
                ];
                // Mostly one order for every candidate, as clients send them; sometimes another.
                if rng.random_bool(0.2) {
                    fields.shuffle(rng);
                }
                let mut c = vec![
                    ("id".to_owned(), id(rng, false)),
                    ("fields".to_owned(), object(&fields)),
                ];
                c.shuffle(rng);
                object(&c)
            })
            .collect();
        let mut top = vec![
            ("user".to_owned(), user),
            (
                "candidates".to_owned(),
                vec![("[]".to_owned(), format!("[{}]", candidates.join(",")))],
            ),
        ];
        if rng.random_bool(0.5) {
            let k = rng.random_range(1..rows + 3).to_string();
            top.push(("top_k".to_owned(), vec![("=".to_owned(), k)]));
        }
        top.shuffle(rng);
        top
    }

    fn write(top: &[(String, Vec<(String, String)>)]) -> String {
        let members: Vec<(String, String)> = top
            .iter()
            .map(|(k, parts)| {
                let value = match parts.first().map(|(tag, _)| tag.as_str()) {
                    Some("[]") | Some("=") => parts[0].1.clone(),
                    _ => object(parts),
                };
                (k.clone(), value)
            })
            .collect();
        object(&members)
    }

    #[test]
    fn agrees_with_the_reference_on_valid_bodies() {
        let contract = RankContract::new(Arc::new(ModelSpec::parse(WIDE).expect("spec")), 40);
        let mut rng = StdRng::seed_from_u64(7);
        for _ in 0..300 {
            let rows = rng.random_range(1..=40);
            let body = write(&wide_body(&mut rng, rows));
            let fast = decode_rank(&contract, body.as_bytes()).expect("valid body");
            let reference = rank_reference::decode_rank(&contract, body.as_bytes())
                .expect("the reference takes it too");
            assert_eq!(fast, reference, "for {body}");
        }
    }

    /// One fault per body: both decoders refuse it, and when both name a field, the same one.
    #[test]
    fn agrees_with_the_reference_on_what_to_refuse() {
        let contract = RankContract::new(Arc::new(ModelSpec::parse(WIDE).expect("spec")), 40);
        let mut rng = StdRng::seed_from_u64(11);
        let faults: [(&str, &str); 12] = [
            ("user field id out of a rejecting table", r#""u0": 50"#),
            ("item field id out of a rejecting table", r#""i1": -1"#),
            ("string id", r#""i2": "7""#),
            ("float id", r#""i3": 2.5"#),
            ("id beyond i64", r#""u1": 9223372036854775808"#),
            ("unknown field", r#""zz": 1"#),
            ("user field sent with an item", r#""u2": 1"#),
            ("item field sent with the user", r#""i0": 1"#),
            ("item id field sent in fields", r#""item": 1"#),
            ("null id", r#""i0": null"#),
            ("array id", r#""u0": [1]"#),
            ("object id", r#""i1": {}"#),
        ];
        let mut refused_alike = 0;
        for round in 0..400 {
            let rows = rng.random_range(1..=8);
            let body = write(&wide_body(&mut rng, rows));
            let (what, member) = faults[round % faults.len()];
            // Put the faulty member into the user's or a random candidate's `fields`, replacing the member of
            // the same name or as an extra one.
            let name = &member[1..member[1..].find('"').expect("quoted") + 1];
            let targets: Vec<usize> = body
                .match_indices("\"fields\": {")
                .map(|(i, m)| i + m.len())
                .collect();
            let at = targets[rng.random_range(0..targets.len())];
            let existing = format!("\"{name}\": ");
            let close = at + body[at..].find('}').expect("closed");
            let faulty = match body[at..close].find(&existing) {
                Some(offset) => {
                    let start = at + offset;
                    let end = start + body[start..close].find(',').unwrap_or(close - start);
                    format!("{}{member}{}", &body[..start], &body[end..])
                }
                None => format!("{}{member}, {}", &body[..at], &body[at..]),
            };
            let fast = decode_rank(&contract, faulty.as_bytes());
            let reference = rank_reference::decode_rank(&contract, faulty.as_bytes());
            match (fast, reference) {
                (Err(f), Err(r)) => {
                    if let (
                        ServiceError::InvalidInput { field: ff, .. },
                        ServiceError::InvalidInput { field: rf, .. },
                    ) = (&f, &r)
                    {
                        assert_eq!(ff, rf, "{what}: {faulty}\nfast: {f}\nreference: {r}");
                        refused_alike += 1;
                    }
                }
                (Ok(_), Ok(_)) => {
                    // Only a fault that lands where it is valid: an open table takes any id, and a field moved
                    // to its own side replaces itself.
                    assert!(
                        matches!(
                            what,
                            "user field sent with an item" | "item field sent with the user"
                        ),
                        "{what} accepted: {faulty}"
                    );
                }
                (f, r) => panic!("{what}: {faulty}\nfast: {f:?}\nreference: {r:?}"),
            }
        }
        assert!(
            refused_alike > 300,
            "only {refused_alike} bodies were refused by both with a field"
        );
    }

    #[test]
    fn agrees_with_the_reference_on_truncated_bodies() {
        let contract = RankContract::new(Arc::new(ModelSpec::parse(WIDE).expect("spec")), 40);
        let mut rng = StdRng::seed_from_u64(3);
        let body = write(&wide_body(&mut rng, 3));
        for end in 0..body.len() {
            let cut = &body.as_bytes()[..end];
            let fast = decode_rank(&contract, cut).expect_err("a cut body is refused");
            let reference =
                rank_reference::decode_rank(&contract, cut).expect_err("and by the reference");
            assert_eq!(
                fast.kind(),
                reference.kind(),
                "cut at {end}: {fast} / {reference}"
            );
        }
    }
}
