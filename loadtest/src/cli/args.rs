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
use crate::target::tls::read_token;
use crate::target::{Access, Envelope, TensorLayout, TlsClient, TlsFiles};
use crate::workload::{BodyForm, IdDistribution, RecallInput};

/// Where requests go.
#[derive(Clone, Debug, Args)]
pub struct TargetArgs {
    /// Server URL: http://host:port, optionally with a path prefix; https:// speaks TLS (needs --tls-ca).
    #[arg(long, env = "RECLOAD_URL", default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// PEM file of the CA certificate(s) that signed the server's certificate, for an https:// --url. The
    /// handshake is made when a connection opens, before the clock starts: it counts in a request's latency only
    /// when a connection has to be opened again during the run (the report says how often).
    #[arg(long, env = "RECLOAD_TLS_CA")]
    pub tls_ca: Option<PathBuf>,
    /// PEM file of recload's client certificate, for a server that asks for one (`--tls-client-ca`); with
    /// --tls-key.
    #[arg(long, env = "RECLOAD_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM file of the private key of --tls-cert.
    #[arg(long, env = "RECLOAD_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// File whose first token (one per line; blank lines and `#` comments skipped, as the server's
    /// --inference-tokens-file) is sent as `Authorization: Bearer <token>` with every request (gRPC: the
    /// `authorization` metadata). A file, so the token shows neither in the process list nor in reports.
    #[arg(long, env = "RECLOAD_TOKEN_FILE")]
    pub token_file: Option<PathBuf>,
    /// How the JSON body travels: as is, as one BYTES tensor of a KServe v2 request (Triton Python-backend
    /// models that parse recserve's /v1 JSON), or rewritten into KServe v2 tensors (rank workload, needs
    /// --repository for the tensors' column order): the DeepFM model's own row tensors as binary data
    /// (`kserve-v2-tensors`), the same tensors in a KServe v2 gRPC ModelInfer call's raw_input_contents to --url,
    /// the server's gRPC address (`kserve-v2-grpc`, run and sweep), or the user once and the candidates' item ids
    /// as a matrix, each tensor with a leading request dimension of 1, as a model behind Triton's dynamic batcher
    /// takes them (`kserve-v2-grouped-batched`).
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
    KserveV2Tensors,
    KserveV2GroupedBatched,
    KserveV2Grpc,
}

/// Where and how requests go: over HTTP/1.1 in an envelope, or over KServe v2 gRPC as the model's tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Transport {
    Http(Envelope),
    Grpc { model: String, layout: TensorLayout },
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
    /// How ranking requests write their candidates: an array of objects that name every field (`rows`), or the
    /// item fields named once and the candidates' ids as a matrix (`columnar`). The same seed draws the same
    /// requests in both forms.
    #[arg(long, env = "RECLOAD_BODY", value_enum, default_value_t = BodyForm::Rows)]
    pub body: BodyForm,
    /// How ids are drawn from each table's rows.
    #[arg(long, env = "RECLOAD_IDS", value_enum, default_value_t = IdDistribution::Zipf)]
    pub ids: IdDistribution,
    /// Exponent of the Zipf distribution.
    #[arg(long, env = "RECLOAD_ZIPF_EXPONENT", default_value_t = 1.05)]
    pub zipf_exponent: f64,
    /// Users (and their items) from a file of lines `user item item ...`, e.g. Gowalla's test.txt.
    #[arg(long, env = "RECLOAD_DATASET")]
    pub dataset: Option<PathBuf>,
    /// Ranking with --dataset: the user-side field that carries the dataset's user id. Recommend: the ranking
    /// model's user-side field that carries the request's user id (`user.fields`; other user fields come from
    /// --body-extra's `user.fields`).
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
    /// Recall or recommend by user with --dataset: send the user's dataset items as `exclude`.
    #[arg(long, env = "RECLOAD_EXCLUDE_KNOWN")]
    pub exclude_known: bool,
    /// Recommend with --dataset: also send the user's items (at most --history-len) as `history`, which a
    /// ranking model with the `cooccurrence` candidate feature reads.
    #[arg(long, env = "RECLOAD_SEND_HISTORY")]
    pub send_history: bool,
    /// Recall by user: users per request. Above 1, each request is a KServe v2 infer call
    /// (`/v2/models/{model}/infer`) with a `user_id` tensor of that many users, searched together by the server.
    #[arg(long, env = "RECLOAD_USERS_PER_REQUEST", default_value_t = 1)]
    pub users_per_request: usize,
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
    /// Write every request of the run, warm-up included, to this CSV file: its scheduled, sent and done times
    /// (Unix nanoseconds; sent is empty for a request never sent) and its outcome (ok, http_503, connect, ...).
    #[arg(long, env = "RECLOAD_LOG_REQUESTS")]
    pub log_requests: Option<PathBuf>,
    /// Check every answer (warm-up included) against scores saved for this run's pool of requests
    /// (`recload check --save F --samples N` with this run's workload flags, --seed and --pool N): each candidate's
    /// score must be, within --check-tolerance, its score in one of these comma-separated files. The report counts
    /// the candidates that matched each file and those that matched none (`score_check`).
    #[arg(long, env = "RECLOAD_CHECK_SCORES", value_delimiter = ',')]
    pub check_scores: Vec<PathBuf>,
    /// Largest absolute difference from a saved score that --check-scores accepts.
    #[arg(long, env = "RECLOAD_CHECK_TOLERANCE", default_value_t = 1e-6)]
    pub check_tolerance: f64,
    /// p99 bounds, e.g. `5ms,20ms`, drawn on the --svg chart with the verdict for each (met: p99 within the bound
    /// and at most 0.1% of requests failed, the sweep's default rule).
    #[arg(long, env = "RECLOAD_SLA")]
    pub sla: Option<String>,
    /// Draw the run's latency percentiles (p50, p90, p99, p99.9, max) against the --sla bounds into this SVG file.
    #[arg(long, env = "RECLOAD_SVG")]
    pub svg: Option<PathBuf>,
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
    #[arg(long, env = "RECLOAD_MAX_ERROR_RATIO", default_value_t = crate::sweep::DEFAULT_MAX_ERROR_RATIO)]
    pub max_error_ratio: f64,
    /// Rates of --rates still run after the first that missed the largest --sla, so the chart shows how latency
    /// grows past the knee (they do not change the answer; 0 stops at the first miss).
    #[arg(long, env = "RECLOAD_PAST_KNEE", default_value_t = 2)]
    pub past_knee: u32,
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
pub struct BodiesArgs {
    #[command(flatten)]
    pub target: TargetArgs,
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Write the bodies here: one per line where no body holds a newline (JSON), else only the first (binary
    /// tensor data), as `oha -Z FILE` and `oha -D FILE` read them.
    #[arg(long)]
    pub out: PathBuf,
}

#[derive(Clone, Debug, Args)]
pub struct CeilingArgs {
    /// The model to measure.
    #[arg(long, env = "RECLOAD_MODEL")]
    pub model: String,
    /// Request rows per batch, comma-separated; each is padded to the server's bucket for it where the server
    /// pads (executors on a GPU) [default: --candidates, one request per batch].
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

impl TargetArgs {
    /// The TLS client and token the flags name, their files read.
    pub(super) fn access(&self) -> Result<Access, CliError> {
        let tls = match (&self.tls_ca, &self.tls_cert, &self.tls_key) {
            (Some(ca), cert, key) => Some(
                TlsClient::load(&TlsFiles {
                    ca: ca.clone(),
                    identity: cert.clone().zip(key.clone()),
                })
                .map_err(|e| CliError::Usage(e.to_string()))?,
            ),
            (None, None, None) => None,
            (None, _, _) => {
                return Err(CliError::Usage(
                    "--tls-cert and --tls-key need --tls-ca: a client certificate is sent only over TLS".to_owned(),
                ));
            }
        };
        let token = self
            .token_file
            .as_deref()
            .map(read_token)
            .transpose()
            .map_err(CliError::Usage)?;
        Ok(Access { tls, token })
    }

    /// How bodies travel over HTTP, for the commands that send HTTP only (check, bodies).
    pub(super) fn envelope(&self, workload: &WorkloadArgs) -> Result<Envelope, CliError> {
        match self.transport(workload)? {
            Transport::Http(envelope) => Ok(envelope),
            Transport::Grpc { .. } => Err(CliError::Usage(
                "--envelope kserve-v2-grpc is for recload run and sweep; this command sends HTTP: use \
                 --envelope kserve-v2-tensors for the same tensors over HTTP"
                    .to_owned(),
            )),
        }
    }

    /// Where and how requests go: a KServe v2 envelope needs a model name, from --v2-model or else --model; the
    /// tensor envelopes (HTTP or gRPC) a rank workload and the model's --repository.
    pub(super) fn transport(&self, workload: &WorkloadArgs) -> Result<Transport, CliError> {
        let v2_model = |flag: &str| {
            self.v2_model
                .clone()
                .or_else(|| workload.model.clone())
                .ok_or_else(|| {
                    CliError::Usage(format!("--envelope {flag} needs --v2-model or --model"))
                })
        };
        Ok(match self.envelope {
            EnvelopeKind::None => Transport::Http(Envelope::None),
            EnvelopeKind::KserveV2Bytes => Transport::Http(Envelope::KserveV2Bytes {
                model: v2_model("kserve-v2-bytes")?,
                input: self.v2_input.clone(),
            }),
            EnvelopeKind::KserveV2Tensors
            | EnvelopeKind::KserveV2GroupedBatched
            | EnvelopeKind::KserveV2Grpc => {
                let flag = match self.envelope {
                    EnvelopeKind::KserveV2Tensors => "kserve-v2-tensors",
                    EnvelopeKind::KserveV2Grpc => "kserve-v2-grpc",
                    _ => "kserve-v2-grouped-batched",
                };
                if workload.workload != WorkloadKind::Rank {
                    return Err(CliError::Usage(format!(
                        "--envelope {flag} carries ranking requests: use --workload rank"
                    )));
                }
                let model = v2_model(flag)?;
                let repo = workload.repository.as_deref().ok_or_else(|| {
                    CliError::Usage(format!(
                        "--envelope {flag} needs --repository DIR: the tensors' columns are the model.toml's \
                         [[fields]] in order"
                    ))
                })?;
                let layout = super::schema::tensor_layout(
                    repo,
                    workload.model.as_deref().unwrap_or(&model),
                )?;
                match self.envelope {
                    EnvelopeKind::KserveV2Tensors => {
                        Transport::Http(Envelope::KserveV2Tensors { model, layout })
                    }
                    EnvelopeKind::KserveV2Grpc => Transport::Grpc { model, layout },
                    _ => Transport::Http(Envelope::KserveV2GroupedBatched { model, layout }),
                }
            }
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

#[cfg(test)]
mod tests {
    use clap::error::ErrorKind;
    use clap::{CommandFactory, Parser};

    use super::super::Cli;
    use super::super::testing::{ceiling, check, plot, run, sweep};
    use super::*;

    /// Why clap refuses `recload <args>`.
    fn refused(args: &[&str]) -> clap::Error {
        Cli::try_parse_from(std::iter::once("recload").chain(args.iter().copied()))
            .expect_err("refused")
    }

    /// The workload flags of `recload run --rate 1 <args>`.
    fn workload(args: &[&str]) -> WorkloadArgs {
        run(&[&["--rate", "1"], args].concat()).workload
    }

    const S: fn(u64) -> Duration = Duration::from_secs;
    const MS: fn(u64) -> Duration = Duration::from_millis;

    #[test]
    fn run_defaults_are_the_documented_ones() {
        let a = run(&["--rate", "100"]);
        assert_eq!(a.target.url, "http://127.0.0.1:8000");
        assert_eq!(a.target.envelope, EnvelopeKind::None);
        assert_eq!(a.target.v2_model, None);
        assert_eq!(a.target.v2_input, "REQUEST");

        let w = &a.workload;
        assert_eq!(w.workload, WorkloadKind::Rank);
        assert_eq!((w.model.as_deref(), w.pipeline.as_deref()), (None, None));
        assert_eq!(
            (w.repository.as_deref(), w.dataset.as_deref()),
            (None, None)
        );
        assert_eq!((w.candidates, w.top_k, w.body), (100, None, BodyForm::Rows));
        assert_eq!((w.ids, w.zipf_exponent), (IdDistribution::Zipf, 1.05));
        assert_eq!(w.user_id_field, None);
        assert_eq!(
            (w.k, w.recall_input, w.history_len),
            (100, RecallInput::User, 50)
        );
        assert!(!w.exclude_known);
        assert_eq!(
            (w.users, w.items, w.body_extra.as_deref()),
            (None, None, None)
        );
        assert_eq!((w.pool, w.seed), (1000, 1));

        let t = &a.timing;
        assert_eq!((t.warmup, t.duration, t.timeout), (S(2), S(10), S(5)));
        assert_eq!((t.arrivals, t.connections), (Arrivals::Poisson, 64));
        assert!(!t.coarse_pacing && !t.quiet);
        assert_eq!(t.threads, None);
        assert_eq!((t.settle_latency, t.settle_timeout), (MS(100), S(60)));
        assert_eq!(t.label, None);

        assert_eq!(a.rate, Some(100.0));
        assert!(!a.closed);
        assert_eq!(a.concurrency, 8);
        assert_eq!(a.json, None);
        assert_eq!((a.sla, a.svg), (None, None));
    }

    #[test]
    fn sweep_defaults_are_the_documented_ones() {
        let a = sweep(&[]);
        assert_eq!(a.rates, "50:20000:x1.5");
        assert_eq!(a.sla, "5ms,20ms");
        assert_eq!((a.refine, a.min_requests, a.past_knee), (3, 1000, 2));
        assert_eq!(a.max_error_ratio, 0.001);
        assert_eq!((a.json, a.svg), (None, None));
        // The shared groups are the same flags as run's.
        assert_eq!(a.timing.duration, S(10));
        assert_eq!(a.workload.pool, 1000);
    }

    #[test]
    fn check_plot_and_ceiling_defaults_are_the_documented_ones() {
        let c = check(&["--save", "scores.json"]);
        assert_eq!((c.samples, c.tolerance), (32, 1e-5));
        assert_eq!(c.save, Some(PathBuf::from("scores.json")));
        assert_eq!((c.expect, c.json), (None, None));
        assert_eq!(c.workload.workload, WorkloadKind::Rank);

        let p = plot(&["--out", "chart.svg", "a.json", "b.json"]);
        assert_eq!(p.sweeps, [PathBuf::from("a.json"), PathBuf::from("b.json")]);
        assert_eq!(p.out, PathBuf::from("chart.svg"));
        assert_eq!(p.title, "p99 and p50 latency against achieved throughput");

        let c = ceiling(&["--model", "m"]);
        assert_eq!(c.model, "m");
        assert!(c.batch_rows.is_empty());
        assert_eq!((c.candidates, c.warmup, c.duration), (100, S(2), S(10)));
        assert_eq!((c.ids, c.zipf_exponent), (IdDistribution::Zipf, 1.05));
        assert_eq!((c.pool, c.seed, c.json), (1000, 1, None));
    }

    /// The `RECLOAD_*` variable clap reads for each long flag of `subcommand`, by flag.
    fn variables(subcommand: &str) -> Vec<(String, Option<String>)> {
        let mut cli = Cli::command();
        cli.build();
        let sub = cli
            .find_subcommand(subcommand)
            .expect("a subcommand of recload");
        sub.get_arguments()
            .filter_map(|a| {
                let long = a.get_long()?;
                (long != "help").then(|| {
                    let env = a.get_env().map(|e| e.to_string_lossy().into_owned());
                    (long.to_owned(), env)
                })
            })
            .collect()
    }

    #[test]
    fn every_run_and_sweep_flag_reads_its_recload_variable() {
        for subcommand in ["run", "sweep"] {
            let flags = variables(subcommand);
            assert!(flags.len() > 30, "{subcommand}: {flags:?}");
            for (long, env) in flags {
                let expected = format!("RECLOAD_{}", long.to_uppercase().replace('-', "_"));
                assert_eq!(env, Some(expected), "{subcommand} --{long}");
            }
        }
    }

    #[test]
    fn check_reads_variables_for_target_and_workload_only_and_ceiling_for_its_model() {
        let check = variables("check");
        for (long, env) in &check {
            let own = ["samples", "save", "expect", "tolerance", "json"].contains(&long.as_str());
            assert_eq!(env.is_none(), own, "check --{long}: {env:?}");
        }
        let ceiling = variables("ceiling");
        let read = |flag: &str| {
            ceiling
                .iter()
                .find(|(long, _)| long == flag)
                .and_then(|(_, env)| env.clone())
        };
        assert_eq!(read("model").as_deref(), Some("RECLOAD_MODEL"));
        assert_eq!(read("batch-rows"), None);
        // The server's own settings keep the server's variables.
        assert_eq!(read("repository").as_deref(), Some("RECSERVE_REPOSITORY"));
        assert_eq!(read("executors").as_deref(), Some("RECSERVE_EXECUTORS"));
    }

    #[test]
    fn durations_are_humantime_and_a_bad_one_is_named() {
        assert_eq!(duration("500ms"), Ok(MS(500)));
        assert_eq!(duration("2s"), Ok(S(2)));
        assert_eq!(duration("1m 30s"), Ok(S(90)));
        assert_eq!(duration("0s"), Ok(Duration::ZERO));
        let err = duration("10parsecs").expect_err("unknown unit");
        assert!(
            err.starts_with("\"10parsecs\" is not a duration like 10s or 500ms ("),
            "{err}"
        );
        let err = duration("10").expect_err("no unit");
        assert!(
            err.starts_with("\"10\" is not a duration like 10s"),
            "{err}"
        );

        // Through clap, the flag is named before the parser's sentence.
        let err = refused(&["run", "--rate", "1", "--warmup", "soon"]);
        assert_eq!(err.kind(), ErrorKind::ValueValidation);
        let text = err.to_string();
        assert!(
            text.starts_with(
                "error: invalid value 'soon' for '--warmup <WARMUP>': \"soon\" is not a duration like 10s or 500ms ("
            ),
            "{text}"
        );
    }

    #[test]
    fn clap_refuses_missing_and_conflicting_flags() {
        let kind = |args: &[&str]| refused(args).kind();
        assert_eq!(kind(&["run"]), ErrorKind::MissingRequiredArgument);
        assert_eq!(
            kind(&["run", "--rate", "5", "--closed"]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(kind(&["check"]), ErrorKind::MissingRequiredArgument);
        assert_eq!(
            kind(&["check", "--save", "a", "--expect", "b"]),
            ErrorKind::ArgumentConflict
        );
        assert_eq!(
            kind(&["plot", "a.json"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            kind(&["plot", "--out", "x.svg"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(kind(&["ceiling"]), ErrorKind::MissingRequiredArgument);
        assert_eq!(
            kind(&["run", "--rate", "1", "--envelope", "grpc"]),
            ErrorKind::InvalidValue
        );
        assert_eq!(
            kind(&["run", "--rate", "1", "--workload", "search"]),
            ErrorKind::InvalidValue
        );
        // --closed needs no --rate.
        let closed = run(&["--closed", "--concurrency", "2"]);
        assert!(closed.closed && closed.rate.is_none());
        assert_eq!(closed.concurrency, 2);
    }

    #[test]
    fn the_kserve_envelope_names_its_model_from_v2_model_or_model() {
        let envelope = |args: &[&str]| {
            let a = run(&[&["--rate", "1"], args].concat());
            a.target.envelope(&a.workload)
        };
        assert_eq!(
            envelope(&["--model", "m"]).expect("plain JSON"),
            Envelope::None
        );
        assert_eq!(
            envelope(&["--envelope", "kserve-v2-bytes", "--model", "m"]).expect("from --model"),
            Envelope::KserveV2Bytes {
                model: "m".to_owned(),
                input: "REQUEST".to_owned()
            }
        );
        assert_eq!(
            envelope(&[
                "--envelope",
                "kserve-v2-bytes",
                "--model",
                "m",
                "--v2-model",
                "triton-m",
                "--v2-input",
                "BODY"
            ])
            .expect("from --v2-model"),
            Envelope::KserveV2Bytes {
                model: "triton-m".to_owned(),
                input: "BODY".to_owned()
            }
        );
        let err = envelope(&["--envelope", "kserve-v2-bytes"]).expect_err("no model");
        assert_eq!(
            err.to_string(),
            "--envelope kserve-v2-bytes needs --v2-model or --model"
        );
    }

    #[test]
    fn the_grpc_envelope_sends_a_rank_workload_s_tensors_from_run_and_sweep_only() {
        let repo = super::super::testing::fixture_repo();
        let repo = super::super::testing::arg(&repo);
        let args = |extra: &[&str]| {
            run(&[
                &[
                    "--rate",
                    "1",
                    "--envelope",
                    "kserve-v2-grpc",
                    "--model",
                    "deepfm-int8",
                ],
                extra,
            ]
            .concat())
        };
        let a = args(&["--repository", repo, "--v2-model", "other"]);
        let Transport::Grpc { model, layout } = a.target.transport(&a.workload).expect("gRPC")
        else {
            panic!("a gRPC transport")
        };
        // Sent to --v2-model, in the columns of --model's model.toml.
        assert_eq!(model, "other");
        assert_eq!((layout.fields.len(), layout.dense), (26, 13));
        let err = a.target.envelope(&a.workload).expect_err("not HTTP");
        assert!(
            err.to_string()
                .starts_with("--envelope kserve-v2-grpc is for recload run and sweep;"),
            "{err}"
        );
        let a = args(&[]);
        let err = a.target.transport(&a.workload).expect_err("no repository");
        assert!(
            err.to_string()
                .starts_with("--envelope kserve-v2-grpc needs --repository DIR"),
            "{err}"
        );
        let a = args(&["--repository", repo, "--workload", "recall"]);
        let err = a.target.transport(&a.workload).expect_err("not ranking");
        assert_eq!(
            err.to_string(),
            "--envelope kserve-v2-grpc carries ranking requests: use --workload rank"
        );
    }

    #[test]
    fn the_ids_label_names_the_distribution_and_the_dataset() {
        let ids = |args: &[&str]| workload(args).ids_description();
        assert_eq!(ids(&[]), "zipf(1.05)");
        assert_eq!(ids(&["--zipf-exponent", "1.2"]), "zipf(1.2)");
        assert_eq!(ids(&["--ids", "uniform"]), "uniform");
        assert_eq!(
            ids(&["--dataset", "data/test.txt", "--ids", "uniform"]),
            "dataset data/test.txt (other ids uniform)"
        );
    }

    #[test]
    fn body_extra_must_be_a_json_object() {
        let extra = |args: &[&str]| workload(args).body_extra();
        assert!(extra(&[]).expect("no extra keys").is_empty());
        let map = extra(&[
            "--body-extra",
            r#"{"filter": {"region": "eu"}, "debug": true}"#,
        ])
        .expect("an object");
        assert_eq!(map.get("debug"), Some(&Value::Bool(true)));
        assert_eq!(map.len(), 2);
        for text in ["[1]", "3", "{not json"] {
            let err = extra(&["--body-extra", text]).expect_err("not an object");
            assert_eq!(
                err.to_string(),
                format!("--body-extra must be a JSON object, got {text:?}")
            );
        }
    }

    #[test]
    fn the_ceiling_measures_one_request_per_batch_without_batch_rows() {
        let sizes = |args: &[&str]| ceiling(&[&["--model", "m"], args].concat()).batch_sizes();
        assert_eq!(sizes(&[]), [100]);
        assert_eq!(sizes(&["--candidates", "7"]), [7]);
        assert_eq!(
            sizes(&["--batch-rows", "100,1000", "--candidates", "7"]),
            [100, 1000]
        );
    }
}
