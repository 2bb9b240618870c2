//! The `/v1` rank decoder's fuzz targets: bodies with candidates in the row form and in the columnar form, each
//! decoded by the server's decoder (its byte scanner, then its serde decoder), which must answer as the serde decoder
//! alone and, for what it takes, as the reference decoder ([`crate::testing::rank_reference`]).

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use super::{Outcome, array, clear, damaged, float, int, json_text, mostly, object, run};

/// Bodies for `/v1` rank on [`recserve_core::testing::test_contract`] (user field `u`, item fields `item` by `id` and
/// `cat`, two dense features, at most 3 candidates): arbitrary, any JSON, and near-valid.
fn rank_bodies() -> BoxedStrategy<Vec<u8>> {
    let user = object(vec![
        ("fields", object(vec![("u", int(0..10))])),
        ("dense", array(float(), 2..3)),
    ]);
    let candidate = object(vec![
        ("id", int(-5..105)),
        ("fields", object(vec![("cat", int(0..5))])),
    ]);
    let near_valid = object(vec![
        ("user", mostly(user)),
        ("candidates", mostly(array(candidate, 1..4))),
        ("top_k", int(1..5)),
    ]);
    let keys = &[
        "user",
        "fields",
        "dense",
        "candidates",
        "id",
        "top_k",
        "u",
        "item",
        "cat",
    ];
    prop_oneof![
        1 => vec(any::<u8>(), 0..200),
        2 => json_text(keys).prop_map(String::into_bytes),
        6 => damaged(near_valid),
    ]
    .boxed()
}

/// Bodies for `/v1` rank on [`recserve_core::testing::test_contract::wide_contract`] (user fields `u0` to `u2`, item
/// fields `i0` to `i3` and `item` by `id`, three dense features, at most 40 candidates) with candidates in the
/// columnar form: columns in any order (now and then a wrong, repeated or missing name), rows of ids now and then
/// too short or long, `id` now and then of another length, its keys in any order, some left out; and any JSON.
fn columnar_rank_bodies() -> BoxedStrategy<Vec<u8>> {
    // Ids every table takes (`i1`'s and `u0`'s tables have 50 rows and reject others), now and then others.
    let id = || prop_oneof![6 => int(0..50), 1 => int(-5..1100)].boxed();
    let names = prop_oneof![
        8 => Just(vec!["i0", "i1", "i2", "i3"]).prop_shuffle(),
        1 => vec(prop::sample::select(vec!["i0", "i1", "i2", "i3", "u0", "item", "zz"]), 0..6),
    ];
    let rows = prop_oneof![8 => 1usize..5, 1 => 0usize..45];
    let candidates = (names, rows)
        .prop_flat_map(move |(names, rows)| {
            let width = names.len();
            let row = prop_oneof![
                12 => vec(id(), width..width + 1),
                1 => vec(id(), 0..6),
            ]
            .prop_map(|ids| format!("[{}]", ids.join(",")));
            let ids = vec(row, rows..rows + 1).prop_map(|rows| format!("[{}]", rows.join(",")));
            let item_ids = prop_oneof![
                10 => vec(id(), rows..rows + 1),
                1 => vec(id(), 0..6),
            ]
            .prop_map(|ids| format!("[{}]", ids.join(",")));
            let names = serde_json::to_string(&names).unwrap_or_default();
            let member = |key: &'static str, value: BoxedStrategy<String>| {
                prop_oneof![
                    30 => mostly(value).prop_map(move |v| Some(format!("\"{key}\":{v}"))),
                    1 => Just(None),
                ]
            };
            (
                member("fields", Just(names).boxed()),
                member("ids", ids.boxed()),
                member("id", item_ids.boxed()),
            )
                .prop_map(|(a, b, c)| vec![a, b, c])
                .prop_shuffle()
                .prop_map(|members| {
                    let members: Vec<String> = members.into_iter().flatten().collect();
                    format!("{{{}}}", members.join(","))
                })
        })
        .boxed();
    let user = object(vec![
        (
            "fields",
            object(vec![
                ("u0", int(0..50)),
                ("u1", int(-5..1100)),
                ("u2", int(-5..1100)),
            ]),
        ),
        ("dense", array(float(), 3..4)),
    ]);
    let near_valid = object(vec![
        ("user", mostly(user)),
        ("candidates", mostly(candidates)),
        ("top_k", int(1..5)),
    ]);
    let keys = &[
        "user",
        "fields",
        "dense",
        "candidates",
        "ids",
        "id",
        "top_k",
        "u0",
        "i0",
        "i1",
    ];
    prop_oneof![
        1 => json_text(keys).prop_map(String::into_bytes),
        8 => damaged(near_valid),
    ]
    .boxed()
}

/// Decodes `body` with the server's decoder: its answer is the serde decoder's alone, and what it takes the
/// reference takes the same way.
fn check_rank_decoder(
    contract: &recserve_core::ranking::RankContract,
    body: &[u8],
) -> Result<Outcome, TestCaseError> {
    use crate::api::v1::rank_body::{decode_rank, decode_rank_serde};
    use crate::testing::rank_reference;
    let decoded = decode_rank(contract, body);
    // The fast path gives what the serde decoder alone gives, value or error, whichever of them answered.
    let serde = decode_rank_serde(contract, body);
    prop_assert_eq!(format!("{decoded:?}"), format!("{serde:?}"));
    match decoded {
        Ok(fast) => {
            // What the one-pass decoder takes, the plain one takes the same way (the plain one also takes keys
            // given twice, which the one-pass decoder refuses).
            match rank_reference::decode_rank(contract, body) {
                Ok(reference) => prop_assert_eq!(&fast, &reference),
                Err(e) => {
                    return Err(TestCaseError::fail(format!(
                        "the reference refused what the decoder took: {e}"
                    )));
                }
            }
            prop_assert_eq!(fast.input.ids.len(), fast.input.rows * contract.fields());
            prop_assert_eq!(fast.candidate_ids.len(), fast.input.rows);
            Ok(Outcome::Accepted)
        }
        Err(e) => clear(&e),
    }
}

#[test]
fn fuzz_rank_decoder_answers_every_body_and_agrees_with_the_reference() {
    let contract = recserve_core::testing::test_contract::contract();
    run("/v1 rank decoder", rank_bodies(), |body| {
        check_rank_decoder(&contract, &body)
    });
}

#[test]
fn fuzz_columnar_rank_decoder_answers_every_body_and_agrees_with_the_reference() {
    let contract = recserve_core::testing::test_contract::wide_contract();
    run(
        "/v1 rank decoder, columnar",
        columnar_rank_bodies(),
        |body| check_rank_decoder(&contract, &body),
    );
}
