//! Recommend: recall then rank in one call, inside one process. A pipeline (`[pipelines.NAME]` in the server's
//! config file) names a recall model and a ranking model; a request recalls `candidates` items for a user
//! (`user_id` or `history`), looks up each item's ranking features in the ranking model's item feature table
//! ([`ItemFeatures`], `[item_features]` in its `model.toml`), ranks them with the user side the request sent, and
//! returns the `k` best. A ranking model that declares candidate features (`ranking.candidate_features`) gets
//! them computed here for each candidate ([`CandidateFeature`]): the recall score, the recall rank, and the
//! co-occurrence of the candidate with the request's history (`[cooccurrence]` of the ranking model). Each stage is timed for the response (when asked) and for
//! `recserve_pipeline_stage_duration_seconds`.
//!
//! A pipeline holds no model: each request brings the two models of one registry snapshot, so both stages run on
//! versions that were served together.

use std::sync::Arc;
use std::time::{Duration, Instant};

use prometheus::Histogram;
use serde::{Deserialize, Serialize};

use crate::error::ServiceError;
use crate::metrics::Metrics;
use crate::ranking::{ItemFeatures, RankInput, RankingModel, best_first};
use crate::recall::{Fallback, RecallInput, RecallModel, RecallQuery, SearchRequest};
use crate::repository::CandidateFeature;

/// One `[pipelines.NAME]` table of the config file: `POST /v1/recommend/NAME` recalls `candidates` items with
/// `recall_model`, ranks them with `ranking_model` (whose `[item_features]` supplies the item side) and returns
/// the `k` best (docs/api.md).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineConfig {
    pub recall_model: String,
    pub ranking_model: String,
    /// Items recalled and ranked per request.
    pub candidates: usize,
    /// Items returned (the request may ask for fewer, or up to `candidates`).
    pub k: usize,
}

/// A recommend request, as every transport decodes it.
#[derive(Clone, Debug, PartialEq)]
pub struct RecommendInput {
    /// One rank row (`[fields]` of the ranking model) with every user-side field set and checked against the
    /// ranking model's contract; item-side positions are filled per candidate.
    pub user: Vec<i64>,
    /// The ranking model's dense features, checked.
    pub dense: Vec<f32>,
    pub query: RecallQuery,
    /// The user's items for the `cooccurrence` candidate feature: a `user_id` request's `history` (a `history`
    /// query's own items need not be repeated here).
    pub history: Option<Vec<i64>>,
    pub exclude: Vec<i64>,
    /// Items to return (`1..=candidates`); `None`: the pipeline's `k`.
    pub k: Option<usize>,
    /// How the recall stage searches.
    pub search: SearchRequest,
}

/// One recommended item.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Recommended {
    pub id: u32,
    /// The ranking model's score.
    pub score: f32,
    /// The recall model's inner product.
    pub recall_score: f32,
}

/// How long each stage took (each includes its queueing).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StageTimings {
    pub recall: Duration,
    pub features: Duration,
    pub rank: Duration,
    pub total: Duration,
}

#[derive(Debug)]
pub struct Recommendation {
    /// Best first: higher ranking score, equal scores in recall order.
    pub items: Vec<Recommended>,
    pub timings: StageTimings,
    /// For a `history` request: how many of its items have a history vector (see [`crate::recall::Recalled`]).
    pub history_used: Option<usize>,
    /// Set when the history carried no signal and the candidates are the recall model's fallback.
    pub fallback: Option<Fallback>,
}

/// A configured pipeline, checked against the models it was built with.
#[derive(Debug)]
pub struct Pipeline {
    pub name: String,
    pub config: PipelineConfig,
    /// The ranking model's candidate features, in its order.
    features: Vec<CandidateFeature>,
    /// recall, features, rank.
    stages: [Histogram; 3],
}

/// The stage label values of `recserve_pipeline_stage_duration_seconds`.
pub(crate) const STAGES: [&str; 3] = ["recall", "features", "rank"];

impl Pipeline {
    /// A pipeline checked against its models ([`Pipeline::check`]).
    pub(crate) fn new(
        name: &str,
        config: &PipelineConfig,
        recall: &RecallModel,
        ranking: &RankingModel,
        metrics: &Metrics,
    ) -> Result<Pipeline, String> {
        let features = Pipeline::check(config, recall, ranking)?;
        Ok(Pipeline {
            name: name.to_owned(),
            config: config.clone(),
            features,
            stages: STAGES.map(|stage| metrics.pipeline_stage(name, stage)),
        })
    }

    /// Checks `config` against its models: a ranking model with `[item_features]` of exactly one row per
    /// catalogue item of the recall model, candidate features the pipeline can compute (and a `[cooccurrence]`
    /// table of the catalogue's size for `cooccurrence`), and no more candidates than items. Returns the
    /// candidate features.
    pub(crate) fn check(
        config: &PipelineConfig,
        recall: &RecallModel,
        ranking: &RankingModel,
    ) -> Result<Vec<CandidateFeature>, String> {
        let items = recall.items();
        let features = ranking.item_features().ok_or_else(|| {
            format!(
                "ranking_model {:?} has no [item_features] in its model.toml: the pipeline cannot look up the \
                 item-side fields of recalled items",
                config.ranking_model
            )
        })?;
        if features.rows() != items {
            return Err(format!(
                "the item feature table of {:?} has {} rows, but the catalogue of {:?} has {items} items: one row \
                 per item is needed",
                config.ranking_model,
                features.rows(),
                config.recall_model
            ));
        }
        let mut wanted = Vec::new();
        for name in ranking.contract.candidate_feature_names() {
            let feature = CandidateFeature::named(name).ok_or_else(|| {
                format!(
                    "ranking_model {:?} takes the candidate feature {name:?}, which a pipeline cannot compute \
                     (it computes {}): only rank clients, who send it, can call this model",
                    config.ranking_model,
                    CandidateFeature::ALL.map(CandidateFeature::name).join(", ")
                )
            })?;
            if feature == CandidateFeature::Cooccurrence {
                let table = ranking.cooccurrence().ok_or_else(|| {
                    format!(
                        "ranking_model {:?} takes \"cooccurrence\" but has no [cooccurrence] table",
                        config.ranking_model
                    )
                })?;
                if table.items() != items {
                    return Err(format!(
                        "the [cooccurrence] table of {:?} has {} items, but the catalogue of {:?} has {items}: \
                         one row per item is needed",
                        config.ranking_model,
                        table.items(),
                        config.recall_model
                    ));
                }
            }
            wanted.push(feature);
        }
        if config.candidates > items {
            return Err(format!(
                "candidates = {} is more than the {items} items of {:?}",
                config.candidates, config.recall_model
            ));
        }
        // Each request ranks all its candidates at once: a pipeline whose candidates the ranking model's queue
        // cannot hold would refuse every request.
        ranking
            .contract
            .queue
            .check(config.candidates, "candidates")
            .map_err(|problem| {
                format!(
                    "candidates = {}: the ranking model {:?} {problem}",
                    config.candidates, config.ranking_model
                )
            })?;
        let max_reply = recall.contract.limits.max_reply_items;
        if config.k > max_reply {
            return Err(format!(
                "k = {} is more items than one reply may hold ({max_reply}, --max-reply-items)",
                config.k
            ));
        }
        Ok(wanted)
    }

    /// Whether the ranking model takes a feature computed from the user's history (`cooccurrence`): a `user_id`
    /// request then sends the user's items in `history` too.
    pub fn takes_history(&self) -> bool {
        self.features.contains(&CandidateFeature::Cooccurrence)
    }

    /// Recalls with `recall`, looks up features, ranks with `ranking`, all under one `deadline`.
    pub async fn recommend(
        &self,
        recall: &RecallModel,
        ranking: &RankingModel,
        input: RecommendInput,
        deadline: Instant,
    ) -> Result<Recommendation, ServiceError> {
        let started = Instant::now();
        let candidates = self.config.candidates;
        let k = match input.k {
            None => self.config.k,
            Some(0) => return Err(ServiceError::invalid("k", "must be at least 1")),
            Some(k) if k > candidates => {
                return Err(ServiceError::invalid(
                    "k",
                    format!(
                        "is {k}, more than the {candidates} candidates of pipeline {:?}",
                        self.name
                    ),
                ));
            }
            Some(k) => k,
        };
        recall.contract.check_reply(1, k, "k")?;
        let features: &Arc<ItemFeatures> = ranking.item_features().ok_or_else(|| {
            ServiceError::Internal(format!(
                "pipeline {:?}: the ranking model has no item feature table",
                self.name
            ))
        })?;
        let fields = ranking.contract.fields();
        if input.user.len() != fields || input.dense.len() != ranking.contract.dense_features {
            return Err(ServiceError::Internal(format!(
                "pipeline {:?}: the user side holds {} ids and {} dense values, the ranking model takes {fields} and {}",
                self.name,
                input.user.len(),
                input.dense.len(),
                ranking.contract.dense_features
            )));
        }

        let history = match (&input.query, input.history) {
            _ if !self.takes_history() => None,
            (RecallQuery::History(items), _) => Some(items.clone()),
            (RecallQuery::UserId(_), Some(items)) => Some(items),
            (RecallQuery::UserId(_), None) => {
                return Err(ServiceError::invalid(
                    "history",
                    format!(
                        "is required with user_id: the ranking model of pipeline {:?} takes the candidate feature \
                         \"cooccurrence\", computed from the user's items; send them in history",
                        self.name
                    ),
                ));
            }
        };
        if let Some(items) = &history {
            recall.contract.check_history_len(items.len())?;
        }
        let recalled = recall
            .recall(
                RecallInput {
                    query: input.query,
                    k: candidates,
                    exclude: input.exclude,
                    search: input.search,
                },
                deadline,
            )
            .await?;
        let recalled_at = Instant::now();
        let (history_used, fallback) = (recalled.history_used, recalled.fallback);
        let recalled = recalled.items;

        let rows = recalled.len();
        let mut ids = Vec::with_capacity(rows * fields);
        for item in &recalled {
            let start = ids.len();
            ids.extend_from_slice(&input.user);
            features.fill(item.id, &mut ids[start..]);
        }
        let dense = if self.features.is_empty() {
            input.dense.repeat(rows)
        } else {
            let per_row = self.features.len();
            let mut values = vec![0f32; rows * per_row];
            for (c, feature) in self.features.iter().enumerate() {
                match feature {
                    CandidateFeature::RecallScore => {
                        for (row, item) in recalled.iter().enumerate() {
                            values[row * per_row + c] = item.score;
                        }
                    }
                    CandidateFeature::RecallRank => {
                        for row in 0..rows {
                            values[row * per_row + c] = row as f32;
                        }
                    }
                    CandidateFeature::Cooccurrence => {
                        let table = ranking.cooccurrence().ok_or_else(|| {
                            ServiceError::Internal(format!(
                                "pipeline {:?}: the ranking model has no [cooccurrence] table",
                                self.name
                            ))
                        })?;
                        let ids: Vec<u32> = recalled.iter().map(|item| item.id).collect();
                        let mut scores = vec![0f32; rows];
                        table.scores(history.as_deref().unwrap_or(&[]), &ids, &mut scores);
                        for (row, score) in scores.into_iter().enumerate() {
                            values[row * per_row + c] = score;
                        }
                    }
                }
            }
            ranking.contract.dense_rows(&input.dense, &values, rows)
        };
        let featured_at = Instant::now();

        let scores = if rows == 0 {
            Vec::new()
        } else {
            ranking
                .score(RankInput { rows, ids, dense }, deadline)
                .await?
        };
        let ranked_at = Instant::now();
        if scores.len() != rows {
            return Err(ServiceError::Internal(format!(
                "pipeline {:?}: {} scores for {rows} candidates",
                self.name,
                scores.len()
            )));
        }

        let mut order: Vec<usize> = (0..rows).collect();
        // Equal scores keep the recall order.
        order.sort_by(best_first(&scores));
        order.truncate(k);
        let timings = StageTimings {
            recall: recalled_at - started,
            features: featured_at - recalled_at,
            rank: ranked_at - featured_at,
            total: ranked_at - started,
        };
        for (histogram, took) in
            self.stages
                .iter()
                .zip([timings.recall, timings.features, timings.rank])
        {
            histogram.observe(took.as_secs_f64());
        }
        Ok(Recommendation {
            items: order
                .into_iter()
                .map(|i| Recommended {
                    id: recalled[i].id,
                    score: scores[i],
                    recall_score: recalled[i].score,
                })
                .collect(),
            timings,
            history_used,
            fallback,
        })
    }
}
