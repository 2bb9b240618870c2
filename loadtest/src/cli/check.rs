//! `recload check`: sends sample ranking requests one at a time and saves them with their scores (`--save`), or
//! sends saved requests to another server, in the form `--body` names, and compares its scores with the saved ones
//! (`--expect`).

use super::output::{io_error, to_json, write_out};
use super::workload::build_workload;
use super::{CheckArgs, CliError};
use crate::check::{self, ScoresFile};
use crate::target::{HttpTarget, Target};
use crate::workload::{RankBody, Workload};

pub(super) async fn check_command(args: &CheckArgs) -> Result<(), CliError> {
    let envelope = args.target.envelope(&args.workload)?;
    let target =
        HttpTarget::with_access(&args.target.url, envelope, &args.target.access()?).await?;
    let expected = match &args.expect {
        Some(path) => Some(ScoresFile::parse(
            &std::fs::read_to_string(path).map_err(io_error(path))?,
        )?),
        None => None,
    };
    let requests = match &expected {
        // Sent in the form --body asks for, whichever form they were saved in; to --model's rank path when it is
        // given (another model that should score alike, e.g. a split version of the saved one).
        Some(file) => file
            .requests()
            .into_iter()
            .enumerate()
            .map(|(sample, mut r)| {
                let body = RankBody::parse(&r.body)
                    .map_err(|problem| crate::check::CheckError::Answer { sample, problem })?;
                r.body = body.to_json(args.workload.body).into();
                if let Some(model) = &args.workload.model {
                    r.path = format!("/v1/models/{model}/rank");
                }
                Ok(r)
            })
            .collect::<Result<Vec<_>, crate::check::CheckError>>()?,
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

#[cfg(test)]
mod tests {
    use super::super::testing::check;
    use super::*;

    /// Why check refuses `args`; nothing listens at its URL, so a refusal that names a flag came first.
    async fn refused(args: &[&str]) -> String {
        let a = check(&[&["--url", "http://127.0.0.1:1"], args].concat());
        check_command(&a).await.expect_err("refused").to_string()
    }

    #[tokio::test]
    async fn check_compares_whole_rankings_only() {
        assert_eq!(
            refused(&["--save", "s.json", "--model", "m", "--top-k", "3"]).await,
            "check compares every candidate's score: drop --top-k"
        );
        assert_eq!(
            refused(&[
                "--save",
                "s.json",
                "--workload",
                "recall",
                "--model",
                "m",
                "--users",
                "5"
            ])
            .await,
            "check compares ranking scores: use --workload rank"
        );
    }

    #[tokio::test]
    async fn a_missing_scores_file_is_named() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("scores.json");
        let err = refused(&["--expect", path.to_str().expect("UTF-8 path")]).await;
        assert!(err.starts_with(&format!("{}: ", path.display())), "{err}");
    }
}
