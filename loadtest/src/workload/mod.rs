//! What is sent: a [`Workload`] generates request bodies for one API (ranking, recall, recommend). A run sends a
//! pool of bodies generated before it starts from a seed (so generating them costs nothing during the run and the
//! same seed sends the same requests), cycling through the pool.

pub mod ids;
pub mod rank;
pub mod rank_body;
pub mod recall;

use std::path::PathBuf;

use bytes::Bytes;
use rand::SeedableRng;
use rand::rngs::StdRng;
use serde::{Deserialize, Serialize};

pub use ids::{Dataset, IdDistribution, IdSampler};
pub use rank::{RankOptions, RankSchema, RankWorkload};
pub use rank_body::{BodyForm, RankBody};
pub use recall::{
    Population, RecallInput, RecallOptions, RecallWorkload, RecommendOptions, RecommendWorkload,
};

/// A workload that cannot be built; the message names the flag or file to fix.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Schema(String),
    #[error("dataset {}{}: {problem}", path.display(), if *line > 0 { format!(", line {line}") } else { String::new() })]
    Dataset {
        path: PathBuf,
        line: usize,
        problem: String,
    },
}

/// One request as the API defines it: a path and a JSON body. Targets wrap it for their protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub path: String,
    pub body: Bytes,
}

/// The request generator of one API.
#[derive(Clone, Debug)]
pub enum Workload {
    // Boxed: it carries the model's schema and its samplers, far larger than the other variants.
    Rank(Box<RankWorkload>),
    Recall(RecallWorkload),
    Recommend(RecommendWorkload),
}

/// What a report says about the workload.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadInfo {
    /// `rank`, `recall` or `recommend`.
    pub kind: String,
    /// The request path, e.g. `/v1/models/deepfm-int8/rank`.
    pub path: String,
    /// Candidates per ranking request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidates: Option<usize>,
    /// `k` of recall and recommend requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub k: Option<usize>,
    /// Users per recall request, when more than one (`--users-per-request`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub users_per_request: Option<usize>,
    /// How ids are drawn: `zipf(1.05)`, `uniform`, or `dataset <file>` (plus the distribution of the ids the
    /// file does not provide).
    pub ids: String,
    /// Distinct request bodies, cycled through.
    pub pool: usize,
    pub seed: u64,
    /// Mean body size in bytes, as the workload generates it (before any protocol envelope).
    pub mean_body_bytes: f64,
    /// How a ranking request's candidates are written: `rows` or `columnar`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<BodyForm>,
}

impl Workload {
    pub fn path(&self) -> String {
        match self {
            Workload::Rank(w) => w.path(),
            Workload::Recall(w) => w.path(),
            Workload::Recommend(w) => w.path(),
        }
    }

    pub fn body(&self, rng: &mut StdRng) -> Vec<u8> {
        match self {
            Workload::Rank(w) => w.body(rng),
            Workload::Recall(w) => w.body(rng),
            Workload::Recommend(w) => w.body(rng),
        }
    }

    /// `size` requests generated from `seed`.
    pub fn pool(&self, size: usize, seed: u64) -> Vec<Request> {
        let mut rng = StdRng::seed_from_u64(seed);
        let path = self.path();
        (0..size.max(1))
            .map(|_| Request {
                path: path.clone(),
                body: Bytes::from(self.body(&mut rng)),
            })
            .collect()
    }

    /// Warnings about assumptions the workload made (e.g. a field whose table it had to guess).
    pub fn notes(&self) -> &[String] {
        match self {
            Workload::Rank(w) => &w.schema.notes,
            Workload::Recall(_) | Workload::Recommend(_) => &[],
        }
    }

    pub fn info(&self, pool: &[Request], seed: u64, ids: String) -> WorkloadInfo {
        let bytes: usize = pool.iter().map(|r| r.body.len()).sum();
        let (kind, candidates, k, body) = match self {
            Workload::Rank(w) => (
                "rank",
                Some(w.options.candidates),
                None,
                Some(w.options.body),
            ),
            Workload::Recall(w) => ("recall", None, Some(w.options.k), None),
            Workload::Recommend(w) => ("recommend", None, Some(w.options.k), None),
        };
        WorkloadInfo {
            kind: kind.to_owned(),
            path: self.path(),
            candidates,
            k,
            users_per_request: match self {
                Workload::Recall(w) if w.options.users_per_request > 1 => {
                    Some(w.options.users_per_request)
                }
                _ => None,
            },
            ids,
            pool: pool.len(),
            seed,
            mean_body_bytes: bytes as f64 / pool.len().max(1) as f64,
            body,
        }
    }
}
