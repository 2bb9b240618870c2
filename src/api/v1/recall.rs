//! `POST /v1/models/{model}/recall` (and `/versions/{version}/recall`): the body ([`RecallRequest`]) decodes into
//! a [`RecallInput`] (the model checks ids, `k` and lengths), which runs through the service's envelope.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};

use crate::api::envelope::{HttpBody, ModelPath, parse_json};
use crate::service::{Operation, Protocol, Service};
use recserve_core::error::ServiceError;
use recserve_core::recall::{RecallInput, RecallQuery, Recalled, SearchRequest};

/// The routes, for [`super::routes`].
pub(crate) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/v1/models/{model}/recall", post(recall))
        .route("/v1/models/{model}/versions/{version}/recall", post(recall))
}

async fn recall(
    State(service): State<Arc<Service>>,
    path: ModelPath,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let request = path.request(Protocol::V1, Operation::Recall, &headers, false);
    let mut body = HttpBody::new(&headers, body, service.limits.max_body_bytes);
    let result = service
        .model_call(request, &mut body, |call, body| async move {
            let default_k = call.recall_model()?.contract.default_k;
            let input = recall_input(parse_json(&body)?, default_k)?;
            call.recall_model()?.contract.check_reply(1, input.k, "k")?;
            let mut answers = call.recall(vec![input]).await?;
            let answer = answers.pop().ok_or_else(|| {
                ServiceError::Internal("recall: a query without an answer".to_owned())
            })?;
            Ok(axum::Json(recall_response(
                &call.model.name,
                call.model.version,
                &answer,
            ))
            .into_response())
        })
        .await;
    body.respond(result)
}

/// `POST /v1/models/{model}/recall`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RecallRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) user_id: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) history: Option<Vec<i64>>,
    /// Items to return; without it, the model's `[recall] default_k`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) k: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) exclude: Vec<i64>,
    /// `true`: score every item, even when the model has an IVF index.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) exact: Option<bool>,
    /// Lists of the model's IVF index to scan (1 to its `nlist`); without it, `[recall.index] nprobe`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) nprobe: Option<usize>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct RecallResponse {
    pub(crate) model: String,
    pub(crate) version: u64,
    pub(crate) items: Vec<RecalledItem>,
    /// For a `history` request: how many of its distinct items have a history vector (were seen in training).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) history_used: Option<usize>,
    /// `"popularity"` when the history carried no signal and `items` are the model's most popular ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) fallback: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub(crate) struct RecalledItem {
    pub(crate) id: i64,
    pub(crate) score: f32,
}

/// Exactly one of `user_id` and `history`.
pub(super) fn recall_query(
    user_id: Option<i64>,
    history: Option<Vec<i64>>,
) -> Result<RecallQuery, ServiceError> {
    match (user_id, history) {
        (Some(id), None) => Ok(RecallQuery::UserId(id)),
        (None, Some(history)) => Ok(RecallQuery::History(history)),
        (Some(_), Some(_)) => Err(ServiceError::invalid(
            "history",
            "cannot be sent together with user_id: send one of them",
        )),
        (None, None) => Err(ServiceError::invalid(
            "user_id",
            "is missing: send user_id (a row of the user table) or history (item ids the user interacted with)",
        )),
    }
}

/// `exact` and `nprobe` of a `/v1` request: at most one of `exact = true` and `nprobe` (the model checks the range).
pub(super) fn search_request(
    exact: Option<bool>,
    nprobe: Option<usize>,
) -> Result<SearchRequest, ServiceError> {
    match (exact, nprobe) {
        (Some(true), Some(_)) => Err(ServiceError::invalid(
            "nprobe",
            "cannot be sent together with exact = true: send one of them",
        )),
        (Some(true), None) => Ok(SearchRequest::Exact),
        (_, Some(n)) => Ok(SearchRequest::Nprobe(n)),
        (_, None) => Ok(SearchRequest::Default),
    }
}

/// Decodes a recall request (`default_k` when it gives no `k`); the model checks the ids, `k` and the lengths.
pub(crate) fn recall_input(
    request: RecallRequest,
    default_k: usize,
) -> Result<RecallInput, ServiceError> {
    Ok(RecallInput {
        query: recall_query(request.user_id, request.history)?,
        k: request.k.unwrap_or(default_k),
        exclude: request.exclude,
        search: search_request(request.exact, request.nprobe)?,
    })
}

pub(crate) fn recall_response(model: &str, version: u64, answer: &Recalled) -> RecallResponse {
    RecallResponse {
        model: model.to_owned(),
        version,
        history_used: answer.history_used,
        fallback: answer.fallback.map(|f| f.as_str().to_owned()),
        items: answer
            .items
            .iter()
            .map(|s| RecalledItem {
                id: i64::from(s.id),
                score: s.score,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::envelope::parse_json;

    fn decode(body: &str) -> Result<RecallInput, ServiceError> {
        recall_input(parse_json(body.as_bytes())?, 20)
    }

    #[test]
    fn decodes_recall_requests() {
        assert_eq!(
            decode(r#"{"user_id": 3, "k": 5, "exclude": [1, 2]}"#).expect("valid"),
            RecallInput {
                query: RecallQuery::UserId(3),
                k: 5,
                exclude: vec![1, 2],
                search: SearchRequest::Default,
            }
        );
        assert_eq!(
            decode(r#"{"history": [4, 4, 7], "k": 1}"#).expect("valid"),
            RecallInput {
                query: RecallQuery::History(vec![4, 4, 7]),
                k: 1,
                exclude: vec![],
                search: SearchRequest::Default,
            }
        );
        let search = |body: &str| decode(body).map(|i| i.search);
        assert_eq!(
            search(r#"{"user_id": 3, "exact": true}"#).ok(),
            Some(SearchRequest::Exact)
        );
        assert_eq!(
            search(r#"{"user_id": 3, "exact": false}"#).ok(),
            Some(SearchRequest::Default)
        );
        assert_eq!(
            search(r#"{"user_id": 3, "exact": false, "nprobe": 7}"#).ok(),
            Some(SearchRequest::Nprobe(7))
        );
        let err = search(r#"{"user_id": 3, "exact": true, "nprobe": 7}"#).expect_err("both");
        assert!(
            err.to_string()
                .starts_with("nprobe: cannot be sent together with exact = true"),
            "{err}"
        );
        let err = search(r#"{"user_id": 3, "nprobe": -2}"#).expect_err("negative");
        assert!(err.to_string().starts_with("nprobe: "), "{err}");
        assert_eq!(
            decode(r#"{"user_id": 3}"#).expect("valid").k,
            20,
            "without k: the model's default_k"
        );
        let cases = [
            (r#"{"k": 5}"#, "user_id: is missing: send user_id"),
            (
                r#"{"user_id": 1, "history": [1], "k": 5}"#,
                "history: cannot be sent together with user_id",
            ),
            (
                r#"{"user_id": 1, "k": -1}"#,
                "k: invalid value: integer `-1`",
            ),
            (
                r#"{"user_id": 1.5, "k": 1}"#,
                "user_id: invalid type: floating point",
            ),
            (
                r#"{"history": [1, "x"], "k": 1}"#,
                "history[1]: invalid type: string",
            ),
            (
                r#"{"user_id": 1, "k": 1, "exclude": [null]}"#,
                "exclude[0]: invalid type: null",
            ),
            (
                r#"{"user_id": 1, "k": 1, "top_k": 3}"#,
                "unknown field `top_k`",
            ),
            (
                r#"{"user_id": 1, "k": NaN}"#,
                "k: NaN is not a number JSON can carry",
            ),
            (
                r#"{"user_id": -9223372036854775809, "k": 1}"#,
                "user_id: the integer -9223372036854775809 does not fit in 64 bits (expected i64)",
            ),
            (
                r#"{"user_id": 1, "k": 18446744073709551616}"#,
                "k: the integer 18446744073709551616 does not fit in 64 bits (expected usize)",
            ),
            (
                r#"{"history": [1, 1e400], "k": 1}"#,
                "history[1]: 1e400 is beyond the range of 64-bit floating point",
            ),
        ];
        for (body, expected) in cases {
            let got = decode(body).expect_err(body).to_string();
            assert!(
                got.contains(expected),
                "{body}: expected {expected:?} in {got:?}"
            );
        }
    }
}
