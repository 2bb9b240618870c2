//! The `recload` command line: flags (clap, each with a `RECLOAD_*` variable), and the subcommands that tie the
//! library together. `main.rs` only parses and reports errors; tests call [`execute`] with parsed flags.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{Map, Value};

use crate::arrivals::Arrivals;
use crate::ceiling::{self, CeilingOptions};
use crate::check::{self, ScoresFile};
use crate::engine::{self, Mode, RunOptions};
use crate::peers_doc;
use crate::plot;
use crate::report::{RunReport, now_rfc3339};
use crate::sweep::{self, SWEEP_SCHEMA, SweepReport};
use crate::target::http::TargetError;
use crate::target::{Envelope, HttpTarget, Target};
use crate::workload::{
    Dataset, IdDistribution, Population, RankOptions, RankSchema, RankWorkload, RecallInput,
    RecallOptions, RecallWorkload, RecommendOptions, RecommendWorkload, Request, Workload,
};

/// recload: an open-loop load generator and benchmark driver for recserve (and any server that accepts the same
/// requests). Latency is measured from each request's scheduled send time, so a stalled server shows in the
/// percentiles (no coordinated omission). Reports: docs/recload.md.
#[derive(Debug, Parser)]
#[command(version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// One run: open loop at --rate (or closed loop with --closed), then a summary and optionally JSON.
    Run(RunArgs),
    /// Open-loop runs at increasing rates: the highest rate whose p99 stays under each --sla.
    Sweep(SweepArgs),
    /// Latency-vs-throughput chart (SVG) of one or more sweep reports.
    Plot(PlotArgs),
    /// Send sample ranking requests one by one and save their scores, or compare them with saved ones.
    Check(CheckArgs),
    /// The raw ceiling: gather + ONNX Runtime in-process through recserve's library, no server.
    Ceiling(CeilingArgs),
    /// Write the peer-benchmark section of docs/benchmarks.md from a loadtest/peers/run.sh results directory.
    PeersReport(PeersReportArgs),
}

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
    /// Write every request of the run, warm-up included, to this CSV file: its scheduled, sent and done times
    /// (Unix nanoseconds; sent is empty for a request never sent) and its outcome (ok, http_503, connect, ...).
    #[arg(long, env = "RECLOAD_LOG_REQUESTS")]
    pub log_requests: Option<PathBuf>,
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

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Target(#[from] TargetError),
    #[error(transparent)]
    Workload(#[from] crate::workload::WorkloadError),
    #[error(transparent)]
    Run(#[from] engine::RunError),
    #[error(transparent)]
    Check(#[from] check::CheckError),
    #[error(transparent)]
    Ceiling(#[from] ceiling::CeilingError),
    #[error(transparent)]
    Plot(#[from] plot::PlotError),
    #[error(transparent)]
    Doc(#[from] peers_doc::DocError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {problem}")]
    Describe { what: String, problem: String },
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> CliError + '_ {
    move |source| CliError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes `text` to `path`, or stdout for '-'.
fn write_out(path: &Path, text: &str) -> Result<(), CliError> {
    if path == Path::new("-") {
        println!("{text}");
        Ok(())
    } else {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io_error(dir))?;
        }
        std::fs::write(path, text).map_err(io_error(path))
    }
}

fn to_json<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).expect("reports serialize")
}

/// Runs a parsed command line.
pub fn execute(cli: Cli) -> Result<(), CliError> {
    match cli.command {
        Command::Ceiling(args) => ceiling_command(&args),
        Command::Plot(args) => plot_command(&args),
        Command::PeersReport(args) => peers_report_command(&args),
        Command::Run(args) => runtime(args.timing.threads)?.block_on(run_command(&args)),
        Command::Sweep(args) => runtime(args.timing.threads)?.block_on(sweep_command(&args)),
        Command::Check(args) => runtime(Some(1))?.block_on(check_command(&args)),
    }
}

fn runtime(threads: Option<usize>) -> Result<tokio::runtime::Runtime, CliError> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(n) = threads {
        if n == 0 {
            return Err(CliError::Usage("--threads must be at least 1".to_owned()));
        }
        builder.worker_threads(n);
    }
    builder.enable_all().build().map_err(|source| CliError::Io {
        path: PathBuf::from("(tokio runtime)"),
        source,
    })
}

fn target_of(args: &TargetArgs, workload: &WorkloadArgs) -> Result<Envelope, CliError> {
    Ok(match args.envelope {
        EnvelopeKind::None => Envelope::None,
        EnvelopeKind::KserveV2Bytes => Envelope::KserveV2Bytes {
            model: args
                .v2_model
                .clone()
                .or_else(|| workload.model.clone())
                .ok_or_else(|| {
                    CliError::Usage(
                        "--envelope kserve-v2-bytes needs --v2-model or --model".to_owned(),
                    )
                })?,
            input: args.v2_input.clone(),
        },
    })
}

/// Builds the workload; a ranking workload reads its model's fields from --repository or GET /v1/models.
pub async fn build_workload(
    args: &WorkloadArgs,
    target: &HttpTarget,
) -> Result<(Workload, String), CliError> {
    let dataset = args
        .dataset
        .as_deref()
        .map(Dataset::load)
        .transpose()?
        .map(Arc::new);
    let distribution = match args.ids {
        IdDistribution::Zipf => format!("zipf({})", args.zipf_exponent),
        IdDistribution::Uniform => "uniform".to_owned(),
    };
    let ids = match &args.dataset {
        Some(path) => format!("dataset {} (other ids {distribution})", path.display()),
        None => distribution,
    };
    let extra = match &args.body_extra {
        None => Map::new(),
        Some(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(map)) => map,
            _ => {
                return Err(CliError::Usage(format!(
                    "--body-extra must be a JSON object, got {text:?}"
                )));
            }
        },
    };
    let model = || {
        args.model
            .clone()
            .ok_or_else(|| CliError::Usage("--model is required for this workload".to_owned()))
    };
    let population = Population {
        dataset: dataset.clone(),
        users: args.users,
        items: args.items,
        ids: args.ids,
        zipf_exponent: args.zipf_exponent,
    };
    let workload = match args.workload {
        WorkloadKind::Rank => {
            let model = model()?;
            let schema = match &args.repository {
                Some(repo) => schema_from_repository(repo, &model)?,
                None => schema_from_server(target, &model).await?,
            };
            Workload::Rank(RankWorkload::new(
                schema,
                RankOptions {
                    candidates: args.candidates,
                    ids: args.ids,
                    zipf_exponent: args.zipf_exponent,
                    top_k: args.top_k,
                    user_id_field: args.user_id_field.clone(),
                },
                dataset,
            )?)
        }
        WorkloadKind::Recall => Workload::Recall(RecallWorkload::new(
            model()?,
            RecallOptions {
                input: args.recall_input,
                k: args.k,
                history_len: args.history_len,
                exclude_known: args.exclude_known,
                extra,
            },
            population,
        )?),
        WorkloadKind::Recommend => Workload::Recommend(RecommendWorkload::new(
            args.pipeline.clone().ok_or_else(|| {
                CliError::Usage("--pipeline is required for --workload recommend".to_owned())
            })?,
            RecommendOptions { k: args.k, extra },
            population,
        )?),
    };
    for note in workload.notes() {
        eprintln!("note: {note}");
    }
    Ok((workload, ids))
}

fn schema_from_repository(repo: &Path, model: &str) -> Result<RankSchema, CliError> {
    let describe = |problem: String| CliError::Describe {
        what: format!("--repository {}", repo.display()),
        problem,
    };
    let found = recserve::repository::discover(repo, &std::collections::HashMap::new())
        .map_err(|e| describe(e.to_string()))?;
    let mv = found
        .iter()
        .find(|m| m.name == model)
        .ok_or_else(|| describe(format!("holds no model {model:?}")))?;
    let spec = recserve::repository::read_spec(&mv.dir).map_err(|e| describe(e.to_string()))?;
    Ok(RankSchema::from_spec(model, &spec)?)
}

async fn schema_from_server(target: &HttpTarget, model: &str) -> Result<RankSchema, CliError> {
    let what = || format!("GET {}/v1/models", target.info().url);
    let (status, body) = target
        .get("/v1/models")
        .await
        .map_err(|e| CliError::Describe {
            what: what(),
            problem: format!(
                "{e} (use --repository DIR to read the model from its model.toml instead)"
            ),
        })?;
    if status != 200 {
        return Err(CliError::Describe {
            what: what(),
            problem: format!(
                "HTTP {status}: {} (use --repository DIR to read the model from its model.toml instead)",
                crate::target::http::quote(&body)
            ),
        });
    }
    let list: recserve::api::v1::ModelList =
        serde_json::from_slice(&body).map_err(|e| CliError::Describe {
            what: what(),
            problem: format!("not a model list: {e}"),
        })?;
    let info = list
        .models
        .iter()
        .find(|m| m.name == model)
        .ok_or_else(|| CliError::Describe {
            what: what(),
            problem: format!(
                "model {model:?} is not served (served: {})",
                list.models
                    .iter()
                    .map(|m| m.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        })?;
    Ok(RankSchema::from_model_info(info)?)
}

/// Target, workload and prepared request pool for run and sweep.
struct Prepared {
    target: Arc<HttpTarget>,
    pool: Vec<Request>,
    prepared: Arc<[<HttpTarget as Target>::Prepared]>,
    workload: crate::workload::WorkloadInfo,
}

async fn prepare(target: &TargetArgs, workload: &WorkloadArgs) -> Result<Prepared, CliError> {
    let envelope = target_of(target, workload)?;
    let http = Arc::new(HttpTarget::new(&target.url, envelope).await?);
    let (w, ids) = build_workload(workload, &http).await?;
    let pool = w.pool(workload.pool, workload.seed);
    let prepared: Arc<[_]> = pool.iter().map(|r| http.prepare(r)).collect();
    let info = w.info(&pool, workload.seed, ids);
    Ok(Prepared {
        target: http,
        pool,
        prepared,
        workload: info,
    })
}

fn run_options(timing: &TimingArgs, mode: Mode, seed: u64) -> RunOptions {
    RunOptions {
        mode,
        warmup: timing.warmup,
        duration: timing.duration,
        timeout: timing.timeout,
        seed,
        precise_pacing: !timing.coarse_pacing,
        progress: !timing.quiet && std::io::stderr().is_terminal(),
        settle: (!timing.settle_timeout.is_zero()).then_some(engine::Settle {
            latency: timing.settle_latency,
            timeout: timing.settle_timeout,
        }),
        log_requests: false,
    }
}

/// `recload run`: returns the report (also written where the flags say).
pub async fn run_command(args: &RunArgs) -> Result<(), CliError> {
    let report = run_report(args).await?;
    match &args.json {
        Some(path) if path == Path::new("-") => {
            eprint!("{report}");
            println!("{}", to_json(&report));
        }
        Some(path) => {
            print!("{report}");
            write_out(path, &to_json(&report))?;
        }
        None => print!("{report}"),
    }
    Ok(())
}

/// Performs the run `args` describe and returns its report, printing nothing but the progress line.
pub async fn run_report(args: &RunArgs) -> Result<RunReport, CliError> {
    let p = prepare(&args.target, &args.workload).await?;
    let mode = match (args.closed, args.rate) {
        (true, _) => Mode::Closed {
            concurrency: args.concurrency,
        },
        (false, Some(rate)) => Mode::Open {
            rate,
            arrivals: args.timing.arrivals,
            connections: args.timing.connections,
        },
        (false, None) => {
            return Err(CliError::Usage(
                "give --rate R (open loop) or --closed".to_owned(),
            ));
        }
    };
    let mut options = run_options(&args.timing, mode, args.workload.seed);
    options.log_requests = args.log_requests.is_some();
    let started_at = now_rfc3339();
    let stats = engine::run(Arc::clone(&p.target), Arc::clone(&p.prepared), &options).await?;
    drop(p.pool);
    if let Some(path) = &args.log_requests {
        write_out(path, &requests_csv(&stats))?;
    }
    Ok(RunReport::new(
        args.timing.label.clone(),
        started_at,
        p.target.info(),
        p.workload,
        &options,
        &stats,
    ))
}

/// The `--log-requests` file of a run.
fn requests_csv(stats: &engine::RunStats) -> String {
    let unix_ns = |since_start: Duration| {
        (stats.started + since_start)
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    };
    let mut csv = String::from("scheduled_unix_ns,sent_unix_ns,done_unix_ns,outcome\n");
    for r in &stats.log {
        let sent = r.sent.map(|t| unix_ns(t).to_string()).unwrap_or_default();
        let outcome = match r.outcome {
            Ok(()) => "ok".to_owned(),
            Err(kind) => kind.label(),
        };
        csv.push_str(&format!(
            "{},{sent},{},{outcome}\n",
            unix_ns(r.scheduled),
            unix_ns(r.done)
        ));
    }
    csv
}

/// `recload sweep`.
pub async fn sweep_command(args: &SweepArgs) -> Result<(), CliError> {
    let report = sweep_report(args).await?;
    print!("{report}");
    if let Some(path) = &args.json {
        write_out(path, &to_json(&report))?;
    }
    if let Some(path) = &args.svg {
        let title = format!("{} {}", report.workload.kind, report.workload.path);
        write_out(path, &plot::svg(&title, std::slice::from_ref(&report))?)?;
    }
    Ok(())
}

/// Performs the sweep `args` describe and returns its report.
pub async fn sweep_report(args: &SweepArgs) -> Result<SweepReport, CliError> {
    let rates = sweep::parse_rates(&args.rates).map_err(CliError::Usage)?;
    let slas = sweep::parse_slas(&args.sla).map_err(CliError::Usage)?;
    if !(0.0..=1.0).contains(&args.max_error_ratio) {
        return Err(CliError::Usage(
            "--max-error-ratio must be between 0 and 1".to_owned(),
        ));
    }
    let p = prepare(&args.target, &args.workload).await?;
    let started_at = now_rfc3339();
    let slas_ms: Vec<f64> = slas.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    let quiet = args.timing.quiet;
    let rules = sweep::SearchRules {
        refine: args.refine,
        max_error_ratio: args.max_error_ratio,
        confirm: args.confirm,
    };
    let (steps, sla) = sweep::search(&rates, &slas_ms, rules, |rate| {
        let mut options = run_options(
            &args.timing,
            Mode::Open {
                rate,
                arrivals: args.timing.arrivals,
                connections: args.timing.connections,
            },
            args.workload.seed,
        );
        options.duration = options
            .duration
            .max(Duration::from_secs_f64(args.min_requests as f64 / rate));
        let target = Arc::clone(&p.target);
        let prepared = Arc::clone(&p.prepared);
        let workload = p.workload.clone();
        let label = args.timing.label.clone();
        async move {
            let started_at = now_rfc3339();
            let stats = engine::run(Arc::clone(&target), prepared, &options).await?;
            let report =
                RunReport::new(label, started_at, target.info(), workload, &options, &stats);
            if !quiet {
                let l = report.latency_ms;
                eprintln!(
                    "  {rate:>8.0}/s offered → {:>8.1}/s achieved · p50 {} · p99 {} · {} failed",
                    report.achieved_rps,
                    l.map_or("-".to_owned(), |l| crate::stats::Ms(l.p50_ms).to_string()),
                    l.map_or("-".to_owned(), |l| crate::stats::Ms(l.p99_ms).to_string()),
                    report.requests.errors
                );
            }
            Ok::<_, CliError>(report)
        }
    })
    .await?;
    Ok(SweepReport {
        schema: SWEEP_SCHEMA.to_owned(),
        recload_version: env!("CARGO_PKG_VERSION").to_owned(),
        label: args.timing.label.clone(),
        started_at,
        target: p.target.info(),
        workload: p.workload,
        arrivals: args.timing.arrivals,
        connections: args.timing.connections,
        warmup_s: args.timing.warmup.as_secs_f64(),
        duration_s: args.timing.duration.as_secs_f64(),
        timeout_s: args.timing.timeout.as_secs_f64(),
        max_error_ratio: args.max_error_ratio,
        confirm: args.confirm,
        min_requests: args.min_requests,
        steps,
        sla,
    })
}

fn plot_command(args: &PlotArgs) -> Result<(), CliError> {
    let sweeps = args
        .sweeps
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).map_err(io_error(path))?;
            serde_json::from_str::<SweepReport>(&text).map_err(|e| CliError::Describe {
                what: path.display().to_string(),
                problem: format!("not a {SWEEP_SCHEMA} report: {e}"),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    write_out(&args.out, &plot::svg(&args.title, &sweeps)?)
}

async fn check_command(args: &CheckArgs) -> Result<(), CliError> {
    let envelope = target_of(&args.target, &args.workload)?;
    let target = HttpTarget::new(&args.target.url, envelope).await?;
    let expected = match &args.expect {
        Some(path) => Some(ScoresFile::parse(
            &std::fs::read_to_string(path).map_err(io_error(path))?,
        )?),
        None => None,
    };
    let requests = match &expected {
        Some(file) => file.requests(),
        None => {
            if args.workload.top_k.is_some() {
                return Err(CliError::Usage(
                    "check compares every candidate's score: drop --top-k".to_owned(),
                ));
            }
            let (w, _) = build_workload(&args.workload, &target).await?;
            if !matches!(w, Workload::Rank(_)) {
                return Err(CliError::Usage(
                    "check compares ranking scores: use --workload rank".to_owned(),
                ));
            }
            w.pool(args.samples, args.workload.seed)
        }
    };
    let scores = check::collect(&target, &requests).await?;
    match (&expected, &args.save) {
        (Some(file), _) => {
            let agreement = file.compare(&scores, args.tolerance)?;
            println!(
                "{} agrees with {}: {} samples, {} scores, largest difference {:.1e} (tolerance {:.0e})",
                target.info().url,
                file.target.url,
                agreement.samples,
                agreement.scores,
                agreement.worst,
                args.tolerance
            );
            if let Some(path) = &args.json {
                let json = serde_json::json!({
                    "samples": agreement.samples,
                    "scores": agreement.scores,
                    "worst_abs_diff": agreement.worst,
                });
                write_out(path, &to_json(&json))?;
            }
        }
        (None, Some(path)) => {
            let file = ScoresFile::new(target.info(), &requests, scores);
            write_out(path, &to_json(&file))?;
            println!(
                "saved {} requests and their scores to {}",
                requests.len(),
                path.display()
            );
        }
        (None, None) => {
            return Err(CliError::Usage(
                "give --save FILE or --expect FILE".to_owned(),
            ));
        }
    }
    Ok(())
}

fn ceiling_command(args: &CeilingArgs) -> Result<(), CliError> {
    let config = args
        .serve
        .resolve()
        .map_err(|e| CliError::Usage(e.to_string()))?;
    let batch_rows = if args.batch_rows.is_empty() {
        vec![args.candidates]
    } else {
        args.batch_rows.clone()
    };
    let report = ceiling::run(
        &config,
        &CeilingOptions {
            model: args.model.clone(),
            batch_rows,
            candidates: args.candidates,
            warmup: args.warmup,
            duration: args.duration,
            ids: args.ids,
            zipf_exponent: args.zipf_exponent,
            pool: args.pool,
            seed: args.seed,
        },
    )?;
    println!(
        "{} v{} ({}) in-process on {}: gather + ONNX Runtime, {} executor(s), {} intra-op thread(s)",
        report.model,
        report.version,
        report.precision,
        report.device,
        report.executors,
        report.intra_op_threads
    );
    for b in &report.batches {
        println!(
            "  {:>5} rows/batch (bucket {}): {:>9.1} calls/s · {:>10.0} rows/s · {:>8.1} requests of {}/s · {}",
            b.rows,
            b.bucket,
            b.calls_per_s,
            b.rows_per_s,
            b.requests_per_s,
            report.candidates,
            b.latency_ms.map_or("-".to_owned(), |l| l.to_string())
        );
    }
    if let Some(path) = &args.json {
        write_out(path, &to_json(&report))?;
    }
    Ok(())
}

fn peers_report_command(args: &PeersReportArgs) -> Result<(), CliError> {
    let section = peers_doc::render(&args.results)?;
    if args.doc == Path::new("-") {
        print!("{section}");
        return Ok(());
    }
    let current = match std::fs::read_to_string(&args.doc) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "# Benchmarks\n".to_owned(),
        Err(e) => return Err(io_error(&args.doc)(e)),
    };
    write_out(&args.doc, &peers_doc::splice(&current, &section)?)?;
    println!("wrote the peer-benchmark section of {}", args.doc.display());
    Ok(())
}
