//! Where a ranking workload learns its model's fields and the rows of their tables: the model repository's
//! `model.toml` (`--repository DIR`: exact, each field's own table) or the server's `GET /v1/models` (for a server
//! that describes its models; a field is assumed to read the table of its name). Errors name the flag or request
//! to fix.

use std::path::Path;

use super::CliError;
use crate::target::{HttpTarget, Target, TensorLayout};
use crate::workload::RankSchema;

fn read_model_spec(
    repo: &Path,
    model: &str,
) -> Result<recserve_core::repository::ModelSpec, CliError> {
    let describe = |problem: String| CliError::Describe {
        what: format!("--repository {}", repo.display()),
        problem,
    };
    let found = recserve_core::repository::discover(repo, &std::collections::HashMap::new())
        .map_err(|e| describe(e.to_string()))?;
    let mv = found
        .iter()
        .find(|m| m.name == model)
        .ok_or_else(|| describe(format!("holds no model {model:?}")))?;
    recserve_core::repository::read_spec(&mv.dir).map_err(|e| describe(e.to_string()))
}

pub(super) fn schema_from_repository(repo: &Path, model: &str) -> Result<RankSchema, CliError> {
    Ok(RankSchema::from_spec(
        model,
        &read_model_spec(repo, model)?,
    )?)
}

/// The columns of `model`'s KServe v2 tensors, from its `model.toml` (`[[fields]]` order, which `GET /v1/models`
/// does not give).
pub(super) fn tensor_layout(repo: &Path, model: &str) -> Result<TensorLayout, CliError> {
    let spec = read_model_spec(repo, model)?;
    // The same check as the workload's, so a recall model is refused naming the flag here too.
    RankSchema::from_spec(model, &spec)?;
    Ok(TensorLayout::from_spec(&spec))
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::super::testing::fixture_repo;
    use super::*;
    use crate::target::Envelope;
    use crate::workload::rank::FieldRange;

    #[test]
    fn model_toml_gives_each_field_its_own_table() {
        // deepfm-fp16: C1..C19 on the user side, C20..C26 on the item side, C26 reading C25's table.
        let schema = schema_from_repository(&fixture_repo(), "deepfm-fp16").expect("deepfm");
        assert_eq!(schema.model, "deepfm-fp16");
        assert_eq!(
            (schema.user_fields.len(), schema.item_fields.len()),
            (19, 7)
        );
        assert_eq!(schema.item_id_field, None);
        assert_eq!(schema.dense_features, 13);
        assert!(schema.notes.is_empty(), "{:?}", schema.notes);
        let c26 = schema.item_fields.iter().find(|f| f.name == "C26");
        assert_eq!(
            c26,
            Some(&FieldRange {
                name: "C26".to_owned(),
                rows: 96,
                rejects_unknown: true
            })
        );

        let int8 = schema_from_repository(&fixture_repo(), "deepfm-int8").expect("deepfm");
        assert_eq!(int8.item_id_field.map(|f| f.name).as_deref(), Some("C20"));
    }

    #[test]
    fn a_repository_without_the_model_or_of_another_kind_is_named() {
        let repo = fixture_repo();
        let err = schema_from_repository(&repo, "nope").expect_err("not in the repository");
        assert_eq!(
            err.to_string(),
            format!("--repository {}: holds no model \"nope\"", repo.display())
        );
        let err = schema_from_repository(&repo, "lightgcn").expect_err("a recall model");
        assert_eq!(
            err.to_string(),
            "model \"lightgcn\" is a lightgcn model; the rank workload needs a deepfm model"
        );
        let missing = PathBuf::from("/nonexistent/recload-repository");
        let err = schema_from_repository(&missing, "m").expect_err("no directory");
        assert!(
            err.to_string()
                .starts_with("--repository /nonexistent/recload-repository: "),
            "{err}"
        );
    }

    /// A stand-in server whose `GET /v1/models` answers `status` with `body`.
    async fn describing(status: u16, body: &'static str) -> HttpTarget {
        let code = axum::http::StatusCode::from_u16(status).expect("a status");
        let app = axum::Router::new().route(
            "/v1/models",
            axum::routing::get(move || async move { (code, body) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind port 0");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move { axum::serve(listener, app).await });
        HttpTarget::new(&format!("http://{addr}"), Envelope::None)
            .await
            .expect("URL")
    }

    /// One served model, `m`: user field `u` and item field `x`, whose table GET /v1/models does not name.
    const MODELS: &str = r#"{"models": [{"name": "m", "version": 1, "available_versions": [1],
        "kind": "deepfm", "precision": "fp32", "device": "cpu", "description": "",
        "user_fields": ["u"], "item_fields": ["x"], "item_id_field": null, "dense_features": ["d"],
        "tables": [{"name": "u", "rows": 50, "dim": 4, "storage": "fp32", "oov": "default",
                    "shards": 1, "bytes": 800},
                   {"name": "t", "rows": 20, "dim": 4, "storage": "fp32", "oov": "reject",
                    "shards": 1, "bytes": 320}]}]}"#;

    #[tokio::test]
    async fn the_servers_model_list_gives_the_fields_and_a_note_for_a_guessed_table() {
        let target = describing(200, MODELS).await;
        let schema = schema_from_server(&target, "m").await.expect("described");
        let user = &schema.user_fields[0];
        assert_eq!(
            (user.name.as_str(), user.rows, user.rejects_unknown),
            ("u", 50, false)
        );
        let item = &schema.item_fields[0];
        assert_eq!(
            (item.name.as_str(), item.rows, item.rejects_unknown),
            ("x", 20, true)
        );
        assert_eq!(schema.dense_features, 1);
        assert_eq!(schema.notes.len(), 1, "{:?}", schema.notes);

        let err = schema_from_server(&target, "other")
            .await
            .expect_err("not served");
        let url = target.info().url;
        assert_eq!(
            err.to_string(),
            format!("GET {url}/v1/models: model \"other\" is not served (served: m)")
        );
    }

    #[tokio::test]
    async fn a_server_that_does_not_describe_models_is_told_to_use_repository() {
        let target = describing(404, "no such route").await;
        let url = target.info().url;
        let err = schema_from_server(&target, "m").await.expect_err("404");
        assert_eq!(
            err.to_string(),
            format!(
                "GET {url}/v1/models: HTTP 404: no such route (use --repository DIR to read the model from its \
                 model.toml instead)"
            )
        );
        let target = describing(200, "<html>").await;
        let url = target.info().url;
        let err = schema_from_server(&target, "m")
            .await
            .expect_err("not JSON");
        assert!(
            err.to_string()
                .starts_with(&format!("GET {url}/v1/models: not a model list: ")),
            "{err}"
        );
    }
}
