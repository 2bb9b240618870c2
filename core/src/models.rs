//! The model kinds the server serves, as the registry holds them: [`Model`] loads each kind through its own loader
//! and says whether a model ranks or recalls ([`Operation`]); [`build_pipelines`] checks the config's pipelines against the
//! loaded models, and [`ResolvedPipeline`] is a pipeline with the two models of one snapshot.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::batching::{BatchConfig, StatisticsSnapshot};
use crate::error::{LoadError, ServiceError};
use crate::metrics::Metrics;
use crate::pipeline::{Pipeline, PipelineConfig};
use crate::ranking::RankingModel;
use crate::recall::RecallModel;
use crate::registry::{LoadContext, Loadable, Served, Shadowed, Snapshot};
use crate::repository::{CandidateFeature, ModelKind, ModelSpec, ModelVersion};

/// What a request asks of a model: the `endpoint` label of the request metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operation {
    Rank,
    Recall,
    Recommend,
    /// KServe inference: whatever the model does (`rank` or `recall`; `infer` for a model that is not served).
    Infer,
}

impl Operation {
    pub fn endpoint(self) -> &'static str {
        match self {
            Operation::Rank => "rank",
            Operation::Recall => "recall",
            Operation::Recommend => "recommend",
            Operation::Infer => "infer",
        }
    }
}

/// A loaded model of one of the supported kinds.
#[derive(Debug)]
pub enum Model {
    Ranking(RankingModel),
    Recall(RecallModel),
}

/// One served version of a model.
pub type ServedModel = Served<Model>;

/// The models serving at one moment.
pub type Models = Snapshot<Model>;

impl Loadable for Model {
    fn load(
        ctx: &LoadContext,
        mv: &ModelVersion,
        spec: Arc<ModelSpec>,
    ) -> Result<Model, LoadError> {
        Ok(match spec.kind {
            ModelKind::Deepfm => Model::Ranking(RankingModel::load(ctx, mv, spec)?),
            ModelKind::Lightgcn => Model::Recall(RecallModel::load(ctx, mv, spec)?),
        })
    }

    fn device(&self) -> &str {
        match self {
            Model::Ranking(m) => m.device(),
            Model::Recall(m) => m.device(),
        }
    }
}

impl Shadowed for Model {
    fn set_shadow(&self, shadow: bool) {
        // Only ranking models take a shadow.
        if let Model::Ranking(m) = self {
            m.set_shadow(shadow);
        }
    }
}

impl Model {
    /// Shards of each table of `model.toml`, in its order.
    pub fn shard_counts(&self) -> Vec<usize> {
        match self {
            Model::Ranking(m) => m.shard_counts(),
            Model::Recall(m) => m.shard_counts(),
        }
    }

    /// What the model does: the `endpoint` label of its KServe requests.
    pub fn operation(&self) -> Operation {
        match self {
            Model::Ranking(_) => Operation::Rank,
            Model::Recall(_) => Operation::Recall,
        }
    }

    /// The batching its requests go through.
    pub fn batching(&self) -> &BatchConfig {
        match self {
            Model::Ranking(m) => m.batching(),
            Model::Recall(m) => m.batching(),
        }
    }

    /// How many executor threads run its batches.
    pub fn executors(&self) -> usize {
        match self {
            Model::Ranking(m) => m.executors(),
            Model::Recall(m) => m.executors(),
        }
    }

    /// What the statistics extension reports of it: its calls and executed batches since it was loaded.
    pub fn statistics(&self) -> StatisticsSnapshot {
        match self {
            Model::Ranking(m) => m.statistics(),
            Model::Recall(m) => m.statistics(),
        }
    }

    /// The deadline of its requests that come without one.
    pub fn default_deadline(&self) -> Duration {
        match self {
            Model::Ranking(m) => m.default_deadline(),
            Model::Recall(m) => m.default_deadline(),
        }
    }

    /// Refuses a request that its queue would refuse whatever the request holds.
    pub fn precheck(&self, deadline: Instant) -> Result<(), ServiceError> {
        match self {
            Model::Ranking(m) => m.precheck(deadline),
            Model::Recall(m) => m.precheck(deadline),
        }
    }
}

impl ServedModel {
    fn wrong_kind(&self, operation: Operation) -> ServiceError {
        ServiceError::WrongKind {
            model: self.name.clone(),
            kind: self.spec.kind.as_str(),
            operation: operation.endpoint(),
        }
    }

    pub fn ranking(&self) -> Result<&RankingModel, ServiceError> {
        match &self.model {
            Model::Ranking(m) => Ok(m),
            Model::Recall(_) => Err(self.wrong_kind(Operation::Rank)),
        }
    }

    pub fn recall(&self) -> Result<&RecallModel, ServiceError> {
        match &self.model {
            Model::Recall(m) => Ok(m),
            Model::Ranking(_) => Err(self.wrong_kind(Operation::Recall)),
        }
    }

    /// Refuses `operation` unless the model does it (`/v1` rank on a recall model, and the reverse).
    pub fn check_operation(&self, operation: Operation) -> Result<(), ServiceError> {
        match operation {
            Operation::Rank => self.ranking().map(drop),
            Operation::Recall => self.recall().map(drop),
            Operation::Infer | Operation::Recommend => Ok(()),
        }
    }
}

/// A pipeline with the two models it runs on, from one snapshot.
#[derive(Clone, Debug)]
pub struct ResolvedPipeline {
    pub pipeline: Arc<Pipeline>,
    pub recall: Arc<ServedModel>,
    pub ranking: Arc<ServedModel>,
}

impl ResolvedPipeline {
    /// `pipeline` with the versions of its models that their traffic splits give a request with `key` (a
    /// pipeline's models have no shadow).
    pub fn routed(
        pipeline: &Arc<Pipeline>,
        models: &Models,
        key: Option<&[u8]>,
    ) -> Result<ResolvedPipeline, ServiceError> {
        let model = |name: &str| {
            models
                .route(name, None, key)
                .map(|r| r.primary)
                .map_err(|e| ServiceError::Internal(format!("pipeline {:?}: {e}", pipeline.name)))
        };
        Ok(ResolvedPipeline {
            pipeline: Arc::clone(pipeline),
            recall: model(&pipeline.config.recall_model)?,
            ranking: model(&pipeline.config.ranking_model)?,
        })
    }

    /// `pipeline` with the highest loaded versions of its models in `models`.
    pub fn new(
        pipeline: &Arc<Pipeline>,
        models: &Models,
    ) -> Result<ResolvedPipeline, ServiceError> {
        let model = |name: &str| {
            models
                .get(name, None)
                .cloned()
                .map_err(|e| ServiceError::Internal(format!("pipeline {:?}: {e}", pipeline.name)))
        };
        Ok(ResolvedPipeline {
            pipeline: Arc::clone(pipeline),
            recall: model(&pipeline.config.recall_model)?,
            ranking: model(&pipeline.config.ranking_model)?,
        })
    }
}

/// Every loaded version of a pipeline's model `wanted` (the config's `key`), checked to be of `kind`.
fn versions_of<'m>(
    models: &'m Models,
    key: &str,
    wanted: &str,
    kind: ModelKind,
) -> Result<Vec<&'m Arc<ServedModel>>, String> {
    let loaded = models.versions(wanted);
    if loaded.is_empty() {
        return Err(format!(
            "{key} = {wanted:?} is not loaded (loaded models: {})",
            models.names()
        ));
    }
    loaded
        .into_iter()
        .map(|v| {
            let m = models.get(wanted, Some(v)).map_err(|e| e.to_string())?;
            if m.spec.kind != kind {
                return Err(format!(
                    "{key} = {wanted:?} is a {} model, not {}",
                    m.spec.kind.as_str(),
                    kind.as_str()
                ));
            }
            Ok(m)
        })
        .collect()
}

/// Checks a pipeline against every loaded version of its two models (a traffic split may route a request to any
/// of them): each pair must run it, and every ranking version must take the same candidate features (the pipeline
/// computes them once for all). The highest versions' models, for building it.
fn check_pipeline<'m>(
    config: &PipelineConfig,
    models: &'m Models,
) -> Result<(&'m RecallModel, &'m RankingModel), String> {
    let recalls = versions_of(
        models,
        "recall_model",
        &config.recall_model,
        ModelKind::Lightgcn,
    )?;
    let rankings = versions_of(
        models,
        "ranking_model",
        &config.ranking_model,
        ModelKind::Deepfm,
    )?;
    let several = recalls.len() * rankings.len() > 1;
    let mut features: Option<(u64, Vec<CandidateFeature>)> = None;
    for recall in &recalls {
        for ranking in &rankings {
            let (r, k) = (
                recall.recall().map_err(|e| e.to_string())?,
                ranking.ranking().map_err(|e| e.to_string())?,
            );
            let takes = Pipeline::check(config, r, k).map_err(|problem| {
                if several {
                    format!(
                        "{problem} (recall_model version {}, ranking_model version {})",
                        recall.version, ranking.version
                    )
                } else {
                    problem
                }
            })?;
            match &features {
                Some((v, first)) if *first != takes => {
                    return Err(format!(
                        "versions {v} and {} of ranking_model {:?} take different candidate features: a \
                         pipeline serves versions that take the same",
                        ranking.version, config.ranking_model
                    ));
                }
                Some(_) => {}
                None => features = Some((ranking.version, takes)),
            }
        }
    }
    // Versions come ascending: the last is the highest.
    let (recall, ranking) = (
        recalls.last().expect("loaded"),
        rankings.last().expect("loaded"),
    );
    match (recall.recall(), ranking.ranking()) {
        (Ok(recall), Ok(ranking)) => Ok((recall, ranking)),
        (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
    }
}

/// Whether every configured pipeline can run on `models` (a snapshot about to be served), on every loaded version
/// of its models: the first problem, naming the pipeline.
pub fn check_pipelines(
    configs: &BTreeMap<String, PipelineConfig>,
    models: &Models,
) -> Result<(), String> {
    for (name, config) in configs {
        check_pipeline(config, models)
            .map_err(|problem| format!("pipeline {name:?} would not run: {problem}"))?;
    }
    Ok(())
}

/// The config's `[pipelines.NAME]`, each checked against `models` ([`Pipeline::new`]). The error names the
/// pipeline and its problem.
pub fn build_pipelines(
    configs: &BTreeMap<String, PipelineConfig>,
    models: &Models,
    metrics: &Metrics,
) -> Result<BTreeMap<String, Arc<Pipeline>>, (String, String)> {
    let mut pipelines = BTreeMap::new();
    for (name, config) in configs {
        let fail = |problem: String| (name.clone(), problem);
        let (recall, ranking) = check_pipeline(config, models).map_err(fail)?;
        let pipeline = Pipeline::new(name, config, recall, ranking, metrics).map_err(fail)?;
        tracing::info!(
            pipeline = %name,
            recall = %config.recall_model,
            ranking = %config.ranking_model,
            candidates = config.candidates,
            k = config.k,
            "pipeline ready"
        );
        pipelines.insert(name.clone(), Arc::new(pipeline));
    }
    Ok(pipelines)
}
