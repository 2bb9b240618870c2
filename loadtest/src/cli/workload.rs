//! What run, sweep and check send, built from their flags: the [`Workload`] (ranking, recall or recommend), with
//! the ranking model's fields from [`super::schema`]; and, for run and sweep, the target and the pool of requests
//! generated and put in its wire form before the clock starts.

use std::sync::Arc;

use super::schema::{schema_from_repository, schema_from_server};
use super::{CliError, TargetArgs, WorkloadArgs, WorkloadKind};
use crate::target::{HttpTarget, Target};
use crate::workload::{
    Dataset, Population, RankOptions, RankWorkload, RecallOptions, RecallWorkload,
    RecommendOptions, RecommendWorkload, Request, Workload, WorkloadInfo,
};

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

/// Target, workload and prepared request pool for run and sweep.
pub(super) struct Prepared {
    pub(super) target: Arc<HttpTarget>,
    pub(super) pool: Vec<Request>,
    pub(super) prepared: Arc<[<HttpTarget as Target>::Prepared]>,
    pub(super) workload: WorkloadInfo,
}

pub(super) async fn prepare(
    target: &TargetArgs,
    workload: &WorkloadArgs,
) -> Result<Prepared, CliError> {
    let envelope = target.envelope(workload)?;
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
