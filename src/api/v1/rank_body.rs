//! Decoding of `/v1` rank bodies straight into the rows the model takes, in one pass over the JSON: no map per
//! candidate, no key strings, no hashing on the way. Candidates come in one of two forms: the row form (an array
//! of `{"id": ..., "fields": {...}}`) or the columnar form (an object: the item fields' names once and a matrix of
//! ids, [`columnar`]); both decode into the same rows. Field names are matched against the contract as they are
//! read (the name expected next first, since clients send every candidate's fields in one order), each id lands
//! in its column of the candidate's row, and every problem names its place in the request
//! (`candidates[3].fields.C21`, `candidates.ids[3][2] (C23)`). A model with candidate features
//! (`ranking.candidate_features`) takes them per candidate: `"features": {"recall_score": 3.5, ...}` in the row
//! form, one array per feature in the columnar form. [`crate::testing::rank_reference`] is the plain
//! decoding (serde derive into maps, then checks) that this one is tested and benchmarked against. Bodies in the
//! shape clients write go through a byte scanner first ([`scan`]), which fills the same decoder state without
//! serde's visitors and hands anything else, every malformed body included, to the serde decoder here.

mod columnar;
mod scan;

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};

use crate::api::envelope::{json_error, require_object};
use recserve_core::error::ServiceError;
use recserve_core::ranking::{RankContract, RankInput};
use recserve_core::repository::Side;

/// A decoded rank request.
#[derive(Debug, PartialEq)]
pub struct RankBody {
    /// The rows to score: the user side repeated for every candidate.
    pub input: RankInput,
    /// Each candidate's `id` as sent, in request order (echoed in the response).
    pub(crate) candidate_ids: Vec<Option<i64>>,
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
    /// `[rows, candidate_features]`, filled as read.
    features: Vec<f32>,
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
            features: Vec::new(),
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
                dense: contract.dense_rows(&dense, &self.features, rows),
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
                f.write_str("a field name")
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
        let mut missing = None;
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
                    missing = d.locate(read, || "user.fields".to_owned())?;
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
        if let Some(f) = missing {
            let name = d.contract.field_name(f);
            return Err(d.fail(ServiceError::invalid(
                format!("user.fields.{name}"),
                "is missing",
            )));
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

/// `candidates`: an array of at most [`RankContract::max_rows`] candidates, each decoded into its row, or the
/// columnar form, an object ([`columnar`]).
struct Candidates<'a, 'c>(&'a mut Decoder<'c>);

impl<'de> DeserializeSeed<'de> for Candidates<'_, '_> {
    type Value = ();
    fn deserialize<D: de::Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Candidates<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of candidates, or an object of columns")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        columnar::visit_columns(self.0, map)
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
        let nc = d.contract.candidate_features;
        d.features.resize((i + 1) * nc, 0.0);
        let mut id: Option<Option<i64>> = None;
        let mut fields_read = false;
        let mut features_read = false;
        let mut missing = None;
        let mut missing_feature = None;
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
                    missing = d.locate(read, || format!("candidates[{i}].fields"))?;
                    fields_read = true;
                }
                "features" => {
                    if features_read {
                        return Err(d.twice(format!("candidates[{i}].features")));
                    }
                    let read = map.next_value_seed(Features {
                        d: &mut *d,
                        candidate: i,
                    });
                    missing_feature = d.locate(read, || format!("candidates[{i}].features"))?;
                    features_read = true;
                }
                other => {
                    return Err(d.fail(ServiceError::invalid(
                        format!("candidates[{i}].{other}"),
                        format!("unknown field `{other}`, expected `id`, `fields` or `features`"),
                    )));
                }
            }
        }
        let contract = d.contract;
        let missing = if fields_read {
            missing
        } else {
            contract.item_fields.first().copied()
        };
        if let Some(f) = missing {
            return Err(d.fail(ServiceError::invalid(
                format!("candidates[{i}].fields.{}", contract.field_name(f)),
                "is missing",
            )));
        }
        let missing_feature = if features_read {
            missing_feature
        } else {
            (nc > 0).then_some(0)
        };
        if let Some(c) = missing_feature {
            let path = format!("candidates[{i}].features");
            return Err(d.fail(contract.candidate_feature_missing(&path, c)));
        }
        let id = id.flatten();
        if let Some(f) = contract.item_id_field {
            let Some(value) = id else {
                return Err(d.fail(contract.item_id_required(format!("candidates[{i}].id"), f)));
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

/// `candidates[candidate].features`: the candidate's value of every candidate feature of the model, finite, each
/// written into its place of the candidate's feature row. Its value is the first feature it lacks.
struct Features<'a, 'c> {
    d: &'a mut Decoder<'c>,
    candidate: usize,
}

impl<'de> DeserializeSeed<'de> for Features<'_, '_> {
    type Value = Option<usize>;
    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Option<usize>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Features<'_, '_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of candidate feature name to number")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<usize>, A::Error> {
        let (d, i) = (self.d, self.candidate);
        let contract = d.contract;
        let nc = contract.candidate_features;
        let mut seen = vec![false; nc];
        while let Some(Key(key)) = map.next_key()? {
            let name = &*key;
            let path = || format!("candidates[{i}].features.{name}");
            let Some(c) = contract.candidate_feature_index(name) else {
                let problem = contract.unknown_candidate_feature(name);
                return Err(d.fail(ServiceError::invalid(path(), problem)));
            };
            let read = map.next_value::<f32>();
            let value = d.locate(read, path)?;
            if std::mem::replace(&mut seen[c], true) {
                return Err(d.twice(path()));
            }
            if let Err(problem) = RankContract::check_dense(value) {
                return Err(d.fail(ServiceError::invalid(path(), problem)));
            }
            d.features[i * nc + c] = value;
        }
        Ok(seen.iter().position(|&s| !s))
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
    /// The first expected field the object lacks: refused by the object that holds it, once that has been read
    /// whole, so that a `fields` key given twice is named as such rather than as the first one's gap.
    type Value = Option<usize>;
    fn deserialize<D: de::Deserializer<'de>>(
        self,
        deserializer: D,
    ) -> Result<Option<usize>, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for Fields<'_, '_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object of field name to integer id")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<usize>, A::Error> {
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
        if read == expected.len() {
            return Ok(None);
        }
        Ok(expected.iter().find(|&&f| !d.seen[f]).copied())
    }
}

#[cfg(test)]
mod tests;
