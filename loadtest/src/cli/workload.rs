//! What run, sweep and check send, built from their flags: the [`Workload`] (ranking, recall or recommend), with
//! the ranking model's fields from [`super::schema`]; and, for run and sweep, the target (HTTP or gRPC) and the pool
//! of requests generated and put in its wire form before the clock starts.

use std::sync::Arc;

use super::args::Transport;
use super::schema::{schema_from_repository, schema_from_server};
use super::{CliError, TargetArgs, WorkloadArgs, WorkloadKind};
use crate::target::{GrpcTarget, HttpTarget, Target};
use crate::workload::{
    BodyForm, Dataset, Population, RankOptions, RankWorkload, RecallOptions, RecallWorkload,
    RecommendOptions, RecommendWorkload, Request, Workload, WorkloadInfo,
};

/// Builds the workload; a ranking workload reads its model's fields from --repository or GET /v1/models.
pub async fn build_workload(
    args: &WorkloadArgs,
    target: &HttpTarget,
) -> Result<(Workload, String), CliError> {
    workload_from(args, Some(target)).await
}

/// Builds the workload; a ranking workload reads its model's fields from --repository, else from `server`'s
/// GET /v1/models (none for a gRPC target).
async fn workload_from(
    args: &WorkloadArgs,
    server: Option<&HttpTarget>,
) -> Result<(Workload, String), CliError> {
    let dataset = args
        .dataset
        .as_deref()
        .map(Dataset::load)
        .transpose()?
        .map(Arc::new);
    let ids = args.ids_description();
    let extra = args.body_extra()?;
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
    if args.users_per_request != 1 && args.workload != WorkloadKind::Recall {
        return Err(CliError::Usage(
            "--users-per-request applies to --workload recall".to_owned(),
        ));
    }
    let workload = match args.workload {
        WorkloadKind::Rank => {
            let model = model()?;
            let schema = match (&args.repository, server) {
                (Some(repo), _) => schema_from_repository(repo, &model)?,
                (None, Some(server)) => schema_from_server(server, &model).await?,
                (None, None) => {
                    return Err(CliError::Usage(
                        "--repository is needed: a gRPC target does not describe its models' fields"
                            .to_owned(),
                    ));
                }
            };
            Workload::Rank(Box::new(RankWorkload::new(
                schema,
                RankOptions {
                    candidates: args.candidates,
                    ids: args.ids,
                    zipf_exponent: args.zipf_exponent,
                    top_k: args.top_k,
                    user_id_field: args.user_id_field.clone(),
                    body: args.body,
                },
                dataset,
            )?))
        }
        WorkloadKind::Recall | WorkloadKind::Recommend if args.body != BodyForm::Rows => {
            return Err(CliError::Usage(
                "--body columnar writes ranking requests: use --workload rank".to_owned(),
            ));
        }
        WorkloadKind::Recall => Workload::Recall(RecallWorkload::new(
            model()?,
            RecallOptions {
                input: args.recall_input,
                k: args.k,
                history_len: args.history_len,
                exclude_known: args.exclude_known,
                extra,
                users_per_request: args.users_per_request,
            },
            population,
        )?),
        WorkloadKind::Recommend => Workload::Recommend(RecommendWorkload::new(
            args.pipeline.clone().ok_or_else(|| {
                CliError::Usage("--pipeline is required for --workload recommend".to_owned())
            })?,
            RecommendOptions {
                k: args.k,
                extra,
                user_id_field: args.user_id_field.clone(),
                history_len: args.history_len,
                exclude_known: args.exclude_known,
                send_history: args.send_history,
            },
            population,
        )?),
    };
    for note in workload.notes() {
        eprintln!("note: {note}");
    }
    Ok((workload, ids))
}

/// Target, workload and prepared request pool for run and sweep.
pub(super) struct Prepared<T: Target> {
    pub(super) target: Arc<T>,
    pub(super) pool: Vec<Request>,
    pub(super) prepared: Arc<[T::Prepared]>,
    pub(super) workload: WorkloadInfo,
}

/// A run's target and pool, over the transport --envelope names.
pub(super) enum AnyPrepared {
    Http(Prepared<HttpTarget>),
    Grpc(Prepared<GrpcTarget>),
}

/// The target --url and --envelope name, and the pool of requests in its wire form.
pub(super) async fn prepare(
    target: &TargetArgs,
    workload: &WorkloadArgs,
) -> Result<AnyPrepared, CliError> {
    Ok(match target.transport(workload)? {
        Transport::Http(envelope) => {
            AnyPrepared::Http(prepare_http(target, envelope, workload).await?)
        }
        Transport::Grpc { model, layout } => {
            let grpc =
                GrpcTarget::with_access(&target.url, model, layout, &target.access()?).await?;
            let (w, ids) = workload_from(workload, None).await?;
            AnyPrepared::Grpc(pooled(grpc, &w, ids, workload))
        }
    })
}

/// The HTTP target --url names, with `envelope`, and the pool of requests in its wire form.
pub(super) async fn prepare_http(
    target: &TargetArgs,
    envelope: crate::target::Envelope,
    workload: &WorkloadArgs,
) -> Result<Prepared<HttpTarget>, CliError> {
    let http = HttpTarget::with_access(&target.url, envelope, &target.access()?).await?;
    let (w, ids) = build_workload(workload, &http).await?;
    Ok(pooled(http, &w, ids, workload))
}

/// `w`'s pool of --pool requests, each put in `target`'s wire form.
fn pooled<T: Target>(target: T, w: &Workload, ids: String, args: &WorkloadArgs) -> Prepared<T> {
    let pool = w.pool(args.pool, args.seed);
    let prepared: Arc<[_]> = pool.iter().map(|r| target.prepare(r)).collect();
    let info = w.info(&pool, args.seed, ids);
    Prepared {
        target: Arc::new(target),
        pool,
        prepared,
        workload: info,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::super::testing::{arg, fixture_repo, run};
    use super::*;
    use crate::target::Envelope;
    use crate::workload::RankBody;

    /// Nothing listens at port 1: a workload built against it did not ask the server anything.
    const NOWHERE: &str = "http://127.0.0.1:1";

    async fn built(args: &[&str]) -> Result<(Workload, String), CliError> {
        let a = run(&[&["--url", NOWHERE, "--rate", "1"], args].concat());
        let target = HttpTarget::new(NOWHERE, Envelope::None).await.expect("URL");
        build_workload(&a.workload, &target).await
    }

    fn body(request: &Request) -> Value {
        serde_json::from_slice(&request.body).expect("JSON body")
    }

    #[tokio::test]
    async fn a_ranking_workload_reads_its_fields_from_the_repository_without_the_server() {
        let repo = fixture_repo();
        let (w, ids) = built(&[
            "--model",
            "deepfm-fp16",
            "--repository",
            arg(&repo),
            "--candidates",
            "5",
            "--ids",
            "uniform",
        ])
        .await
        .expect("built from model.toml");
        assert!(matches!(w, Workload::Rank(_)));
        assert_eq!(ids, "uniform");
        let pool = w.pool(3, 1);
        assert_eq!(pool.len(), 3);
        assert_eq!(pool[0].path, "/v1/models/deepfm-fp16/rank");
        let first = body(&pool[0]);
        assert_eq!(first["candidates"].as_array().map(Vec::len), Some(5));
        // C26 reads C25's table of 96 rows, which rejects unknown ids.
        for candidate in first["candidates"].as_array().expect("candidates") {
            let id = candidate["fields"]["C26"].as_u64().expect("a C26 id");
            assert!(id < 96, "{candidate}");
        }
    }

    #[tokio::test]
    async fn the_columnar_body_holds_the_rows_of_the_row_body_of_the_same_seed() {
        let repo = fixture_repo();
        let pool = async |form: &str| {
            let (w, _) = built(&[
                "--model",
                "deepfm-int8",
                "--repository",
                arg(&repo),
                "--candidates",
                "7",
                "--body",
                form,
            ])
            .await
            .expect("built from model.toml");
            w.pool(5, 3)
        };
        let (rows, columnar) = (pool("rows").await, pool("columnar").await);
        for (r, c) in rows.iter().zip(&columnar) {
            assert_eq!(r.path, c.path);
            assert!(body(r)["candidates"].is_array(), "{}", body(r));
            let columns = &body(c)["candidates"];
            assert_eq!(
                columns["ids"].as_array().map(Vec::len),
                Some(7),
                "{columns}"
            );
            assert_eq!(
                RankBody::parse(&r.body).expect("rows"),
                RankBody::parse(&c.body).expect("columnar")
            );
            assert!(c.body.len() < r.body.len());
        }
        // The fixture's model has an item id field (C20): the columnar form carries its ids in `candidates.id`.
        assert_eq!(
            body(&columnar[0])["candidates"]["id"]
                .as_array()
                .map(Vec::len),
            Some(7)
        );
        let err = built(&["--workload", "recall", "--model", "m", "--body", "columnar"])
            .await
            .expect_err("not a ranking workload");
        assert_eq!(
            err.to_string(),
            "--body columnar writes ranking requests: use --workload rank"
        );
    }

    #[tokio::test]
    async fn recall_and_recommend_need_their_model_or_pipeline() {
        let err = built(&["--workload", "recall"])
            .await
            .expect_err("no model");
        assert_eq!(err.to_string(), "--model is required for this workload");
        let err = built(&["--workload", "rank"]).await.expect_err("no model");
        assert_eq!(err.to_string(), "--model is required for this workload");
        let err = built(&["--workload", "recommend", "--users", "10"])
            .await
            .expect_err("no pipeline");
        assert_eq!(
            err.to_string(),
            "--pipeline is required for --workload recommend"
        );
        let err = built(&["--workload", "recall", "--model", "m", "--body-extra", "[]"])
            .await
            .expect_err("not an object");
        assert_eq!(
            err.to_string(),
            "--body-extra must be a JSON object, got \"[]\""
        );
    }

    #[tokio::test]
    async fn recommend_bodies_carry_the_body_extra_keys() {
        let (w, ids) = built(&[
            "--workload",
            "recommend",
            "--pipeline",
            "home",
            "--users",
            "10",
            "--k",
            "7",
            "--body-extra",
            r#"{"debug": true}"#,
        ])
        .await
        .expect("built");
        assert_eq!(ids, "zipf(1.05)");
        let pool = w.pool(4, 1);
        assert_eq!(pool[0].path, "/v1/recommend/home");
        for request in &pool {
            let b = body(request);
            assert_eq!(
                (b["k"].as_u64(), b["debug"].as_bool()),
                (Some(7), Some(true))
            );
            assert!(b["user_id"].as_u64().is_some_and(|u| u < 10), "{b}");
        }
    }

    #[tokio::test]
    async fn prepare_builds_the_pool_in_the_targets_wire_form() {
        let repo = fixture_repo();
        let a = run(&[
            "--url",
            NOWHERE,
            "--rate",
            "1",
            "--model",
            "deepfm-int8",
            "--repository",
            arg(&repo),
            "--envelope",
            "kserve-v2-bytes",
            "--pool",
            "6",
            "--seed",
            "9",
        ]);
        let AnyPrepared::Http(p) = prepare(&a.target, &a.workload).await.expect("prepared") else {
            panic!("an HTTP target")
        };
        assert_eq!((p.pool.len(), p.prepared.len()), (6, 6));
        assert_eq!(p.target.info().protocol, "kserve-v2-bytes");
        assert_eq!(p.target.info().v2_model.as_deref(), Some("deepfm-int8"));
        assert_eq!(p.workload.kind, "rank");
        assert_eq!(p.workload.path, "/v1/models/deepfm-int8/rank");
        assert_eq!((p.workload.pool, p.workload.seed), (6, 9));
        assert_eq!(p.workload.candidates, Some(100));
        assert!(p.workload.mean_body_bytes > 0.0);
    }
}
