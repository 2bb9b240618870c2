//! Tests of the `/v1` rank decoder: both forms, every error named, and agreement with the reference decoder.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};

use super::*;
use crate::testing::rank_reference;
use recserve_core::testing::test_contract::{contract, featured_contract, wide_contract};

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
        // A key given twice is named as such, even where the first one lacks a field.
        (format!(r#"{{{ok_user}, "candidates": [{{"id": 1, "fields": {{}}, "fields": {{"cat": 0}}}}]}}"#), "candidates[0].fields: is given more than once"),
        (r#"{"user": {"fields": {}, "fields": {"u": 1}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}}]}"#.to_owned(), "user.fields: is given more than once"),
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
    let contract = wide_contract();
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
    let contract = wide_contract();
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
    let contract = wide_contract();
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

#[test]
fn candidate_features_land_after_the_dense_features_of_each_row() {
    let contract = featured_contract();
    let user = r#""user": {"fields": {"u": 7}, "dense": [0.5, -1]}"#;
    let rows = format!(
        r#"{{{user}, "candidates": [
            {{"id": 42, "fields": {{"cat": 1}}, "features": {{"recall_rank": 0, "recall_score": 3.5}}}},
            {{"features": {{"recall_score": -2, "recall_rank": 1}}, "id": 3, "fields": {{"cat": 4}}}}]}}"#
    );
    let columnar = format!(
        r#"{{{user}, "candidates": {{"features": {{"recall_rank": [0, 1], "recall_score": [3.5, -2]}},
            "fields": ["cat"], "ids": [[1], [4]], "id": [42, 3]}}}}"#
    );
    for body in [rows, columnar] {
        let input = decode_rank(&contract, body.as_bytes()).expect(&body).input;
        assert_eq!(input.ids, vec![7, 42, 1, 7, 3, 4]);
        assert_eq!(
            input.dense,
            vec![0.5, -1.0, 3.5, 0.0, 0.5, -1.0, -2.0, 1.0],
            "{body}"
        );
    }
}

#[test]
fn names_every_problem_of_candidate_features() {
    let contract = featured_contract();
    let user = r#""user": {"fields": {"u": 1}, "dense": [0, 0]}"#;
    let cases = [
        (
            format!(r#"{{{user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}}}]}}"#),
            "candidates[0].features.recall_score: is missing: the model takes it for every candidate",
        ),
        (
            format!(
                r#"{{{user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}, "features": {{"recall_score": 1}}}}]}}"#
            ),
            "candidates[0].features.recall_rank: is missing",
        ),
        (
            format!(
                r#"{{{user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}, "features": {{"recall_score": 1, "recall_rank": 0, "ctr": 2}}}}]}}"#
            ),
            "candidates[0].features.ctr: \"ctr\" is not a candidate feature of this model (it takes recall_score, recall_rank)",
        ),
        (
            format!(
                r#"{{{user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}, "features": {{"recall_score": 1e39, "recall_rank": 0}}}}]}}"#
            ),
            "candidates[0].features.recall_score: must be a finite number, got inf",
        ),
        (
            format!(
                r#"{{{user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}, "features": {{"recall_score": 1, "recall_score": 2}}}}]}}"#
            ),
            "candidates[0].features.recall_score: is given more than once",
        ),
        (
            format!(
                r#"{{{user}, "candidates": [{{"id": 1, "fields": {{"cat": 0}}, "features": {{"recall_score": "x", "recall_rank": 0}}}}]}}"#
            ),
            "candidates[0].features.recall_score: invalid type: string",
        ),
        (
            format!(r#"{{{user}, "candidates": {{"fields": ["cat"], "ids": [[0]], "id": [1]}}}}"#),
            "candidates.features.recall_score: is missing",
        ),
        (
            format!(
                r#"{{{user}, "candidates": {{"fields": ["cat"], "ids": [[0], [1]], "id": [1, 2], "features": {{"recall_score": [1, 2], "recall_rank": [0]}}}}}}"#
            ),
            "candidates.features.recall_rank: holds 1 values, but candidates.ids holds 2 rows",
        ),
        (
            format!(
                r#"{{{user}, "candidates": {{"fields": ["cat"], "ids": [[0]], "id": [1], "features": {{"recall_score": [1e39], "recall_rank": [0]}}}}}}"#
            ),
            "candidates.features.recall_score[0]: must be a finite number",
        ),
    ];
    for (body, expected) in cases {
        let got = decode_rank(&contract, body.as_bytes())
            .expect_err(&body)
            .to_string();
        assert!(
            got.contains(expected),
            "{body}\nexpected {expected:?}\ngot {got:?}"
        );
    }
    // A model without candidate features refuses any.
    let got = message(
        r#"{"user": {"fields": {"u": 1}, "dense": [0, 0]}, "candidates": [{"id": 1, "fields": {"cat": 0}, "features": {"recall_score": 1}}]}"#,
    );
    assert!(
        got.contains("candidates[0].features.recall_score: \"recall_score\" is not a candidate feature of this model, which takes none"),
        "{got}"
    );
}
