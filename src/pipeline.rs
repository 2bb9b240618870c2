//! Recommend: recall then rank in one call, inside one process. A pipeline (`[pipelines.NAME]` in the server's
//! config file) names a recall model and a ranking model; a request recalls `candidates` items for a user
//! (`user_id` or `history`), looks up each item's ranking features in the ranking model's item feature table
//! ([`ItemFeatures`], `[item_features]` in its `model.toml`), ranks them with the user side the request sent, and
//! returns the `k` best. Each stage is timed for the response (when asked) and for
//! `recserve_pipeline_stage_duration_seconds`.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use memmap2::Mmap;
use prometheus::Histogram;
use safetensors::{Dtype, SafeTensors};

use crate::config::PipelineConfig;
use crate::error::{LoadError, ServiceError};
use crate::metrics::Metrics;
use crate::ranking::RankInput;
use crate::recall::{RecallInput, RecallQuery};
use crate::repository::OovPolicy;
use crate::repository::{ModelKind, ModelSpec};
use crate::service::ServedModel;

/// A ranking model's item feature table: for catalogue item `i`, the ids of its item-side fields.
#[derive(Debug)]
pub struct ItemFeatures {
    rows: usize,
    /// The ranking field each column feeds (indices into the model's fields).
    columns: Vec<usize>,
    /// `[rows, columns]`, row-major.
    values: Vec<i64>,
    /// The model's `item_id_field` when no column feeds it: it then takes the item's id.
    id_field: Option<usize>,
}

impl ItemFeatures {
    /// Reads and checks the `[item_features]` of a ranking model, if it has one: the tensor exists, is I64 of shape
    /// `[items, columns]`, and every id in a column whose table rejects unknown ids is inside that table.
    pub fn open(dir: &Path, spec: &ModelSpec) -> Result<Option<ItemFeatures>, LoadError> {
        let Some(features) = &spec.item_features else {
            return Ok(None);
        };
        let path = dir.join(&features.file);
        let file = File::open(&path).map_err(|e| {
            LoadError::new(&path, format!("cannot open the item feature table: {e}"))
        })?;
        // SAFETY: read-only, and the repository is not modified while served (as for embedding tables).
        let map = unsafe { Mmap::map(&file) }
            .map_err(|e| LoadError::new(&path, format!("cannot memory-map: {e}")))?;
        let tensors = SafeTensors::deserialize(&map).map_err(|e| {
            LoadError::new(
                &path,
                format!("not a valid safetensors file (truncated or corrupt?): {e}"),
            )
        })?;
        let view = tensors.tensor(&features.tensor).map_err(|_| {
            let mut names = tensors.names();
            names.sort_unstable();
            LoadError::new(
                &path,
                format!(
                    "has no tensor {:?} for [item_features] (tensors in the file: {})",
                    features.tensor,
                    names.join(", ")
                ),
            )
        })?;
        let cols = features.fields.len();
        let rows = match (view.dtype(), view.shape()) {
            (Dtype::I64, &[rows, c]) if c == cols && rows > 0 => rows,
            (dtype, shape) => {
                return Err(LoadError::new(
                    &path,
                    format!(
                        "tensor {:?} is {dtype:?} {shape:?}, but [item_features] needs I64 [items, {cols}] (one column \
                         per entry of item_features.fields, at least one item)",
                        features.tensor
                    ),
                ));
            }
        };
        let values: Vec<i64> = view
            .data()
            .as_chunks::<8>()
            .0
            .iter()
            .map(|b| i64::from_le_bytes(*b))
            .collect();
        for (c, &field) in features.fields.iter().enumerate() {
            let table = &spec.tables[spec.fields[field].table].spec;
            if table.oov != OovPolicy::Reject {
                continue;
            }
            if let Some(row) = (0..rows).find(|&r| !table.contains(values[r * cols + c])) {
                return Err(LoadError::new(
                    &path,
                    format!(
                        "tensor {:?} row {row}, column {:?}: id {} is outside table {:?} (ids 0..{}), which rejects \
                         unknown ids",
                        features.tensor,
                        spec.fields[field].name,
                        values[row * cols + c],
                        table.name,
                        table.rows
                    ),
                ));
            }
        }
        let id_field = spec
            .ranking
            .as_ref()
            .and_then(|r| r.item_id_field)
            .filter(|f| !features.fields.contains(f));
        Ok(Some(ItemFeatures {
            rows,
            columns: features.fields.clone(),
            values,
            id_field,
        }))
    }

    /// Items the table describes (ids `0..rows`).
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Writes item `id`'s item-side fields into `row` (one rank row, `[fields]`).
    fn fill(&self, id: u32, row: &mut [i64]) {
        let at = id as usize * self.columns.len();
        for (&field, &value) in self.columns.iter().zip(&self.values[at..]) {
            row[field] = value;
        }
        if let Some(field) = self.id_field {
            row[field] = i64::from(id);
        }
    }
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
    pub exclude: Vec<i64>,
    /// Items to return (`1..=candidates`); `None`: the pipeline's `k`.
    pub k: Option<usize>,
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
}

/// A configured, checked pipeline.
#[derive(Debug)]
pub struct Pipeline {
    pub name: String,
    pub config: PipelineConfig,
    pub recall: Arc<ServedModel>,
    pub ranking: Arc<ServedModel>,
    features: Arc<ItemFeatures>,
    /// recall, features, rank.
    stages: [Histogram; 3],
}

/// The stage label values of `recserve_pipeline_stage_duration_seconds`.
pub const STAGES: [&str; 3] = ["recall", "features", "rank"];

impl Pipeline {
    /// Checks `config` against the loaded models: a lightgcn recall model, a deepfm ranking model with
    /// `[item_features]` of exactly one row per catalogue item, and no more candidates than items.
    pub fn new(
        name: &str,
        config: &PipelineConfig,
        models: &BTreeMap<String, Arc<ServedModel>>,
        metrics: &Metrics,
    ) -> Result<Pipeline, String> {
        let model = |key: &str, wanted: &str, kind: ModelKind| {
            let m = models.get(wanted).ok_or_else(|| {
                format!(
                    "{key} = {wanted:?} is not a model of the repository (models: {})",
                    models.keys().cloned().collect::<Vec<_>>().join(", ")
                )
            })?;
            if m.spec.kind != kind {
                return Err(format!(
                    "{key} = {wanted:?} is a {} model, not {}",
                    m.spec.kind.as_str(),
                    kind.as_str()
                ));
            }
            Ok(Arc::clone(m))
        };
        let recall = model("recall_model", &config.recall_model, ModelKind::Lightgcn)?;
        let ranking = model("ranking_model", &config.ranking_model, ModelKind::Deepfm)?;
        let items = recall.recall().map_err(|e| e.to_string())?.items();
        let features = ranking.item_features.clone().ok_or_else(|| {
            format!(
                "ranking_model {:?} has no [item_features] in its model.toml: the pipeline cannot look up the \
                 item-side fields of recalled items",
                ranking.name
            )
        })?;
        if features.rows() != items {
            return Err(format!(
                "the item feature table of {:?} has {} rows, but the catalogue of {:?} has {items} items: one row \
                 per item is needed",
                ranking.name,
                features.rows(),
                recall.name
            ));
        }
        if config.candidates > items {
            return Err(format!(
                "candidates = {} is more than the {items} items of {:?}",
                config.candidates, recall.name
            ));
        }
        Ok(Pipeline {
            name: name.to_owned(),
            config: config.clone(),
            recall,
            ranking,
            features,
            stages: STAGES.map(|stage| metrics.pipeline_stage(name, stage)),
        })
    }

    /// Recalls, looks up features, ranks. `deadline` applies to both models' queues (each defaults to its model's
    /// default deadline).
    pub async fn recommend(
        &self,
        input: RecommendInput,
        deadline: Option<Instant>,
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
        let ranking = self.ranking.ranking()?;
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

        // Under overload the ranking model refuses most requests: refuse before spending a recall on one that
        // its queue would turn away whatever the number of candidates.
        ranking.precheck(deadline)?;
        let recalled = self
            .recall
            .recall()?
            .recall(
                RecallInput {
                    query: input.query,
                    k: candidates,
                    exclude: input.exclude,
                },
                deadline,
            )
            .await?;
        let recalled_at = Instant::now();

        let rows = recalled.len();
        let mut ids = Vec::with_capacity(rows * fields);
        for item in &recalled {
            let start = ids.len();
            ids.extend_from_slice(&input.user);
            self.features.fill(item.id, &mut ids[start..]);
        }
        let dense = input.dense.repeat(rows);
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
        // NaN (a broken model) sorts last; equal scores keep the recall order.
        let key = |i: usize| {
            if scores[i].is_nan() {
                f32::NEG_INFINITY
            } else {
                scores[i]
            }
        };
        order.sort_by(|&a, &b| key(b).total_cmp(&key(a)).then(a.cmp(&b)));
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
        })
    }
}
