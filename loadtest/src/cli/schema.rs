//! Where a ranking workload learns its model's fields and the rows of their tables: the model repository's
//! `model.toml` (`--repository DIR`: exact, each field's own table) or the server's `GET /v1/models` (for a server
//! that describes its models; a field is assumed to read the table of its name). Errors name the flag or request
//! to fix.

use std::path::Path;

use super::CliError;
use crate::target::{HttpTarget, Target};
use crate::workload::RankSchema;

pub(super) fn schema_from_repository(repo: &Path, model: &str) -> Result<RankSchema, CliError> {
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

pub(super) async fn schema_from_server(
    target: &HttpTarget,
    model: &str,
) -> Result<RankSchema, CliError> {
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
