//! `POST /v1/models/{model}/rank` (and `/versions/{version}/rank`): the body is decoded in one pass against the
//! model's contract ([`super::rank_body`]), scored through the service's envelope, and answered with every
//! candidate's score in request order, or the `top_k` best.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde::{Deserialize, Serialize};

use super::rank_body::{RankBody, decode_rank};
use crate::api::envelope::{HttpBody, ModelPath};
use crate::service::{Operation, Protocol, Service};
use recserve_core::ranking::best_first;

/// The routes, for [`super::routes`].
pub(crate) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/v1/models/{model}/rank", post(rank))
        .route("/v1/models/{model}/versions/{version}/rank", post(rank))
}

async fn rank(
    State(service): State<Arc<Service>>,
    path: ModelPath,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let request = path.request(Protocol::V1, Operation::Rank, &headers, false);
    let mut body = HttpBody::new(&headers, body, service.limits.max_body_bytes);
    let result = service
        .model_call(request, &mut body, |call, body| async move {
            let contract = &call.ranking()?.contract;
            let RankBody {
                input,
                candidate_ids,
                top_k,
            } = decode_rank(contract, &body)?;
            let scores = call.rank(input).await?;
            Ok(axum::Json(rank_response(
                &call.model.name,
                call.model.version,
                &candidate_ids,
                top_k,
                &scores,
            ))
            .into_response())
        })
        .await;
    body.respond(result)
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct RankResponse {
    pub(crate) model: String,
    pub version: u64,
    pub scores: Vec<ScoredCandidate>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ScoredCandidate {
    pub index: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) id: Option<i64>,
    pub score: f32,
}

/// Builds the response: every candidate in request order, or the `top_k` best (highest score first, ties by
/// request order).
pub(crate) fn rank_response(
    model: &str,
    version: u64,
    candidate_ids: &[Option<i64>],
    top_k: Option<usize>,
    scores: &[f32],
) -> RankResponse {
    let mut order: Vec<usize> = (0..scores.len()).collect();
    if let Some(k) = top_k {
        let by_score = best_first(scores);
        if k < order.len() {
            order.select_nth_unstable_by(k - 1, &by_score);
            order.truncate(k);
        }
        order.sort_unstable_by(&by_score);
    }
    RankResponse {
        model: model.to_owned(),
        version,
        scores: order
            .into_iter()
            .map(|i| ScoredCandidate {
                index: i,
                id: candidate_ids[i],
                score: scores[i],
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top_k_sorts_by_score_then_request_order() {
        let scores = [0.2, 0.9, f32::NAN, 0.9, 0.5];
        let order = |k: Option<usize>| {
            let ids: Vec<Option<i64>> = (10..15).map(Some).collect();
            let resp = rank_response("m", 1, &ids, k, &scores);
            resp.scores
                .iter()
                .map(|s| (s.index, s.id))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            order(Some(3)),
            vec![(1, Some(11)), (3, Some(13)), (4, Some(14))]
        );
        assert_eq!(order(Some(1)), vec![(1, Some(11))]);
        assert_eq!(
            order(Some(9)),
            vec![
                (1, Some(11)),
                (3, Some(13)),
                (4, Some(14)),
                (0, Some(10)),
                (2, Some(12))
            ]
        );
        assert_eq!(
            order(None),
            (0..5).map(|i| (i, Some(10 + i as i64))).collect::<Vec<_>>()
        );
    }
}
