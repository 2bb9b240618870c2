//! The flags of every subcommand, as clap reads them: one struct per subcommand, built from the groups that run,
//! sweep and check share (where requests go, what is sent, how a run is timed), each run and sweep flag with its
//! `RECLOAD_*` variable; and the small parsers that turn flags into values the library takes (durations, the
//! KServe envelope, `--body-extra`). Doc comments are the `--help` text (docs/recload.md explains the flags).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use serde_json::{Map, Value};

use super::CliError;
use crate::arrivals::Arrivals;
use crate::target::Envelope;
use crate::workload::{IdDistribution, RecallInput};

/// Where requests go.
#[derive(Clone, Debug, Args)]
pub struct TargetArgs {
    /// Server URL: http://host:port, optionally with a path prefix.
    #[arg(long, env = "RECLOAD_URL", default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// How the JSON body travels: as is, or as one BYTES tensor of a KServe v2 request (Triton Python-backend
    /// models that parse recserve's /v1 JSON).
    #[arg(long, env = "RECLOAD_ENVELOPE", value_enum, default_value_t = EnvelopeKind::None)]
    pub envelope: EnvelopeKind,
    /// KServe v2 model name [default: --model].
    #[arg(long, env = "RECLOAD_V2_MODEL")]
    pub v2_model: Option<String>,
    /// Name of the KServe v2 BYTES input that carries the body.
    #[arg(long, env = "RECLOAD_V2_INPUT", default_value = "REQUEST")]
    pub v2_input: String,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum EnvelopeKind {
    None,
    KserveV2Bytes,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum WorkloadKind {
    Rank,
    Recall,
    Recommend,
}

/// What is sent.
#[derive(Clone, Debug, Args)]
pub struct WorkloadArgs {
    /// The API to load.
    #[arg(long, env = "RECLOAD_WORKLOAD", value_enum, default_value_t = WorkloadKind::Rank)]
    pub workload: WorkloadKind,
    /// Model to rank with or recall from.
    #[arg(long, env = "RECLOAD_MODEL")]
    pub model: Option<String>,
    /// Recommend pipeline.
    #[arg(long, env = "RECLOAD_PIPELINE")]
    pub pipeline: Option<String>,
    /// Read the ranking model's fields from this model repository's model.toml instead of the server's
    /// GET /v1/models (needed for servers that do not describe their models).
    #[arg(long, env = "RECLOAD_REPOSITORY")]
    pub repository: Option<PathBuf>,
    /// Candidates per ranking request.
    #[arg(long, env = "RECLOAD_CANDIDATES", default_value_t = 100)]
    pub candidates: usize,
    /// Ask rank for only the k best candidates.
    #[arg(long, env = "RECLOAD_TOP_K")]
    pub top_k: Option<usize>,
    /// How ids are drawn from each table's rows.
    #[arg(long, env = "RECLOAD_IDS", value_enum, default_value_t = IdDistribution::Zipf)]
    pub ids: IdDistribution,
    /// Exponent of the Zipf distribution.
    #[arg(long, env = "RECLOAD_ZIPF_EXPONENT", default_value_t = 1.05)]
    pub zipf_exponent: f64,
    /// Users (and their items) from a file of lines `user item item ...`, e.g. Gowalla's test.txt.
    #[arg(long, env = "RECLOAD_DATASET")]
    pub dataset: Option<PathBuf>,
    /// Ranking with --dataset: the user-side field that carries the dataset's user id.
    #[arg(long, env = "RECLOAD_USER_ID_FIELD")]
    pub user_id_field: Option<String>,
    /// Results per recall or recommend request.
    #[arg(long, env = "RECLOAD_K", default_value_t = 100)]
    pub k: usize,
    /// What recall requests query with.
    #[arg(long, env = "RECLOAD_RECALL_INPUT", value_enum, default_value_t = RecallInput::User)]
    pub recall_input: RecallInput,
    /// Longest history or exclude list sent.
    #[arg(long, env = "RECLOAD_HISTORY_LEN", default_value_t = 50)]
    pub history_len: usize,
    /// Recall by user with --dataset: send the user's dataset items as `exclude`.
    #[arg(long, env = "RECLOAD_EXCLUDE_KNOWN")]
    pub exclude_known: bool,
    /// Without --dataset: user ids are drawn from 0..N.
    #[arg(long, env = "RECLOAD_USERS")]
    pub users: Option<u64>,
    /// Item ids for histories are drawn from 0..N.
    #[arg(long, env = "RECLOAD_ITEMS")]
    pub items: Option<u64>,
    /// A JSON object whose keys are added to every recall or recommend body.
    #[arg(long, env = "RECLOAD_BODY_EXTRA")]
    pub body_extra: Option<String>,
    /// Distinct request bodies generated before the run and cycled through.
    #[arg(long, env = "RECLOAD_POOL", default_value_t = 1000)]
    pub pool: usize,
    /// Seed of the request generator and of the Poisson schedule.
    #[arg(long, env = "RECLOAD_SEED", default_value_t = 1)]
    pub seed: u64,
}

fn duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text)
        .map_err(|e| format!("{text:?} is not a duration like 10s or 500ms ({e})"))
}

/// Timing shared by run and sweep.
#[derive(Clone, Debug, Args)]
pub struct TimingArgs {
    /// Sent but not recorded, before each measurement.
    #[arg(long, env = "RECLOAD_WARMUP", value_parser = duration, default_value = "2s")]
    pub warmup: Duration,
    /// The measurement window of each run.
    #[arg(long, env = "RECLOAD_DURATION", value_parser = duration, default_value = "10s")]
    pub duration: Duration,
    /// A request unanswered this long after its scheduled time counts as a timeout.
    #[arg(long, env = "RECLOAD_TIMEOUT", value_parser = duration, default_value = "5s")]
    pub timeout: Duration,
    /// Open loop: arrival process.
    #[arg(long, env = "RECLOAD_ARRIVALS", value_enum, default_value_t = Arrivals::Poisson)]
    pub arrivals: Arrivals,
    /// Open loop: connections (each carries one request at a time; when all are busy, due requests wait and
    /// that wait counts in their latency).
    #[arg(long, env = "RECLOAD_CONNECTIONS", default_value_t = 64)]
    pub connections: usize,
    /// Trust tokio's millisecond timer for send times instead of spinning through the last 2 ms before each
    /// (spinning keeps send times within microseconds but keeps one core busy).
    #[arg(long, env = "RECLOAD_COARSE_PACING")]
    pub coarse_pacing: bool,
    /// Runtime threads [default: the cores recload may use].
    #[arg(long, env = "RECLOAD_THREADS")]
    pub threads: Option<usize>,
    /// Before each run, wait until 3 requests in a row, sent one at a time, are answered within this (a server
    /// may still be working off the backlog of an earlier overloaded run).
    #[arg(long, env = "RECLOAD_SETTLE_LATENCY", value_parser = duration, default_value = "100ms")]
    pub settle_latency: Duration,
    /// Longest wait for that before the run starts anyway, with a warning; 0s skips the wait.
    #[arg(long, env = "RECLOAD_SETTLE_TIMEOUT", value_parser = duration, default_value = "60s")]
    pub settle_timeout: Duration,
    /// No progress line.
    #[arg(long, short, env = "RECLOAD_QUIET")]
    pub quiet: bool,
    /// A name for the report (e.g. the system under test).
    #[arg(long, env = "RECLOAD_LABEL")]
    pub label: Option<String>,
}

#[derive(Clone, Debug, Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub timing: TimingArgs,
    /// Open loop: requests per second.
    #[arg(
        long,
        env = "RECLOAD_RATE",
        required_unless_present = "closed",
        conflicts_with = "closed"
    )]
    pub rate: Option<f64>,
    /// Closed loop: each of --concurrency workers sends as soon as its previous request was answered.
    #[arg(long, env = "RECLOAD_CLOSED")]
    pub closed: bool,
    /// Closed loop: workers (and connections).
    #[arg(long, env = "RECLOAD_CONCURRENCY", default_value_t = 8)]
    pub concurrency: usize,
    /// Write the report as JSON to this file ('-': stdout, and the text summary goes to stderr).
    #[arg(long, env = "RECLOAD_JSON")]
    pub json: Option<PathBuf>,
}

#[derive(Clone, Debug, Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    #[command(flatten)]
    pub timing: TimingArgs,
    /// Offered rates: `100,200,400`, `100:6400:x2` (geometric) or `100:1000:+100` (linear).
    #[arg(long, env = "RECLOAD_RATES", default_value = "50:20000:x1.5")]
    pub rates: String,
    /// p99 bounds, e.g. `5ms,20ms`.
    #[arg(long, env = "RECLOAD_SLA", default_value = "5ms,20ms")]
    pub sla: String,
    /// Bisection steps per SLA between its last passing and first failing rate.
    #[arg(long, env = "RECLOAD_REFINE", default_value_t = 3)]
    pub refine: u32,
    /// Most failed requests a passing step may have, as a fraction.
    #[arg(long, env = "RECLOAD_MAX_ERROR_RATIO", default_value_t = 0.001)]
    pub max_error_ratio: f64,
    /// Runs added at a rate that fails an SLA before it counts as failing (a rate passes when any of its runs
    /// does), so that one hiccup does not end the search.
    #[arg(long, env = "RECLOAD_CONFIRM", default_value_t = 1)]
    pub confirm: u32,
    /// Lengthen a step's measurement window to hold at least this many requests (a p99 from 200 requests is
    /// their second-worst).
    #[arg(long, env = "RECLOAD_MIN_REQUESTS", default_value_t = 1000)]
    pub min_requests: u64,
    #[arg(long, env = "RECLOAD_JSON")]
    pub json: Option<PathBuf>,
    /// Also draw the sweep's latency-vs-throughput chart into this SVG file.
    #[arg(long, env = "RECLOAD_SVG")]
    pub svg: Option<PathBuf>,
}

#[derive(Clone, Debug, Args)]
pub struct PlotArgs {
    /// Sweep reports (recload sweep --json), one series each.
    #[arg(required = true)]
    pub sweeps: Vec<PathBuf>,
    #[arg(long)]
    pub out: PathBuf,
    #[arg(
        long,
        default_value = "p99 and p50 latency against achieved throughput"
    )]
    pub title: String,
}

#[derive(Clone, Debug, Args)]
pub struct CheckArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Sample requests to send (ignored with --expect, which sends the saved ones).
    #[arg(long, default_value_t = 32)]
    pub samples: usize,
    /// Save the requests and their scores to this file.
    #[arg(long, conflicts_with = "expect")]
    pub save: Option<PathBuf>,
    /// Send the requests saved in this file and compare the scores with the saved ones.
    #[arg(long, required_unless_present = "save")]
    pub expect: Option<PathBuf>,
    /// Largest absolute difference accepted.
    #[arg(long, default_value_t = 1e-5)]
    pub tolerance: f64,
    /// Write the agreement ({"samples", "scores", "worst_abs_diff"}) to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

#[derive(Clone, Debug, Args)]
pub struct CeilingArgs {
    /// The model to measure.
    #[arg(long, env = "RECLOAD_MODEL")]
    pub model: String,
    /// Request rows per batch, comma-separated; each is padded to the server's bucket for it, as the server pads
    /// [default: --candidates, one request per batch].
    #[arg(long, value_delimiter = ',')]
    pub batch_rows: Vec<usize>,
    /// Candidates per generated request.
    #[arg(long, default_value_t = 100)]
    pub candidates: usize,
    #[arg(long, value_parser = duration, default_value = "2s")]
    pub warmup: Duration,
    #[arg(long, value_parser = duration, default_value = "10s")]
    pub duration: Duration,
    #[arg(long, value_enum, default_value_t = IdDistribution::Zipf)]
    pub ids: IdDistribution,
    #[arg(long, default_value_t = 1.05)]
    pub zipf_exponent: f64,
    #[arg(long, default_value_t = 1000)]
    pub pool: usize,
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// The server's own settings (`recserve serve` flags and RECSERVE_* variables): --repository, --executors,
    /// --intra-op-threads, --shards, --device, batching buckets, … so the ceiling runs what that server would.
    #[command(flatten)]
    pub serve: recserve::config::ServeArgs,
}

#[derive(Clone, Debug, Args)]
pub struct PeersReportArgs {
    /// Results directory of loadtest/peers/run.sh.
    #[arg(long)]
    pub results: PathBuf,
    /// Document whose peer-benchmark section is replaced (created when missing); '-' prints the section.
    #[arg(long, default_value = "docs/benchmarks.md")]
    pub doc: PathBuf,
}

impl TargetArgs {
    /// How bodies travel: a KServe v2 envelope needs a model name, from --v2-model or else --model.
    pub(super) fn envelope(&self, workload: &WorkloadArgs) -> Result<Envelope, CliError> {
        Ok(match self.envelope {
            EnvelopeKind::None => Envelope::None,
            EnvelopeKind::KserveV2Bytes => Envelope::KserveV2Bytes {
                model: self
                    .v2_model
                    .clone()
                    .or_else(|| workload.model.clone())
                    .ok_or_else(|| {
                        CliError::Usage(
                            "--envelope kserve-v2-bytes needs --v2-model or --model".to_owned(),
                        )
                    })?,
                input: self.v2_input.clone(),
            },
        })
    }
}

impl WorkloadArgs {
    /// How ids are drawn, as a report says it: `zipf(1.05)`, `uniform`, or the dataset and the distribution of
    /// the ids it does not provide.
    pub(super) fn ids_description(&self) -> String {
        let distribution = match self.ids {
            IdDistribution::Zipf => format!("zipf({})", self.zipf_exponent),
            IdDistribution::Uniform => "uniform".to_owned(),
        };
        match &self.dataset {
            Some(path) => format!("dataset {} (other ids {distribution})", path.display()),
            None => distribution,
        }
    }

    /// The keys --body-extra adds to every recall or recommend body (none without it).
    pub(super) fn body_extra(&self) -> Result<Map<String, Value>, CliError> {
        match &self.body_extra {
            None => Ok(Map::new()),
            Some(text) => match serde_json::from_str::<Value>(text) {
                Ok(Value::Object(map)) => Ok(map),
                _ => Err(CliError::Usage(format!(
                    "--body-extra must be a JSON object, got {text:?}"
                ))),
            },
        }
    }
}

impl CeilingArgs {
    /// The batch sizes to measure: --batch-rows, or one request of --candidates rows without it.
    pub(super) fn batch_sizes(&self) -> Vec<usize> {
        if self.batch_rows.is_empty() {
            vec![self.candidates]
        } else {
            self.batch_rows.clone()
        }
    }
}
