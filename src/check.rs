//! `recserve check-repository DIR`: judges every version of every model of a repository with the server's own
//! loader, without serving: the repository's layout and each `model.toml` ([`discover`], [`read_spec`]), then the
//! kind's loader (tables, item features, popularity, the IVF index, the dense graph and its split parts opened in
//! ONNX Runtime, the warm-up runs). The server loads only the served version of each model; this checks
//! every version, since any of them can be pinned.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use serde::Serialize;

use crate::api::auth::InferenceTokens;
use crate::config::{CheckRepositoryArgs, Config, ServeArgs, TlsFiles};
use crate::service::StartLoad;
use crate::tls::Tls;
use recserve_core::error::LoadError;
use recserve_core::metrics::Metrics;
use recserve_core::models::Model;
use recserve_core::registry::Loadable;
use recserve_core::registry::{ModelState, Registry};
use recserve_core::repository::{ModelSpec, ModelVersion, discover, read_spec};

/// Version of the `--json` document; the model toolchain's `check` reads it.
pub(crate) const JSON_FORMAT_VERSION: u32 = 1;

/// What the check found in one version directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct VersionReport {
    /// `deepfm` or `lightgcn`, once `model.toml` has been read.
    pub(crate) kind: Option<&'static str>,
    /// Why the server would refuse the version (the file at fault first), or `None` when it loads.
    pub(crate) error: Option<String>,
}

/// One model directory and its versions.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct ModelReport {
    /// The version the server serves unless another is pinned: the highest.
    pub(crate) served_version: u64,
    pub(crate) versions: BTreeMap<u64, VersionReport>,
}

/// The whole repository: a layout error (no model, a bad model directory name, a model without versions) stops
/// the check before any version is read, as it stops the server's start.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub(crate) struct Report {
    pub(crate) format_version: u32,
    pub(crate) repository: PathBuf,
    pub(crate) error: Option<String>,
    pub(crate) models: BTreeMap<String, ModelReport>,
}

impl Report {
    /// The refusals: the layout error, else every refused version's error.
    pub(crate) fn problems(&self) -> Vec<&str> {
        let versions = self
            .models
            .values()
            .flat_map(|m| m.versions.values())
            .filter_map(|v| v.error.as_deref());
        self.error.as_deref().into_iter().chain(versions).collect()
    }

    /// Prints the report on stdout (`json`: as one JSON document) and says how the process should exit: 0 when
    /// every version loads, 1 when one would be refused, 2 when the report cannot be written.
    pub(crate) fn print(&self, json: bool) -> ExitCode {
        let mut out = std::io::stdout().lock();
        let written = if json {
            serde_json::to_writer_pretty(&mut out, self)
                .map_err(std::io::Error::from)
                .and_then(|()| writeln!(out))
        } else {
            self.write_text(&mut out)
        };
        match written {
            Err(e) => {
                eprintln!("error: cannot write the report: {e}");
                ExitCode::from(2)
            }
            Ok(()) if self.problems().is_empty() => ExitCode::SUCCESS,
            Ok(()) => ExitCode::FAILURE,
        }
    }

    /// One line per version (`name/version (served) kind: ok` or `name/version: ERROR path: problem`), then a
    /// summary line.
    pub(crate) fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        if let Some(error) = &self.error {
            writeln!(out, "ERROR {error}")?;
        }
        for (name, model) in &self.models {
            for (version, report) in &model.versions {
                let served = if *version == model.served_version {
                    " (served)"
                } else {
                    ""
                };
                let kind = report.kind.map(|k| format!(" {k}")).unwrap_or_default();
                match &report.error {
                    None => writeln!(out, "{name}/{version}{served}{kind}: ok")?,
                    Some(e) => writeln!(out, "{name}/{version}{served}{kind}: ERROR {e}")?,
                }
            }
        }
        let problems = self.problems().len();
        if problems == 0 {
            writeln!(
                out,
                "check-repository: every model version in {} loads",
                self.repository.display()
            )
        } else if self.error.is_some() {
            writeln!(
                out,
                "check-repository: the server would not start on {}",
                self.repository.display()
            )
        } else {
            writeln!(
                out,
                "check-repository: {problems} model version(s) would be refused by the server"
            )
        }
    }
}

/// `check-config`'s second half: what `serve` loads at start, reported on stderr: the TLS files and the inference
/// tokens' file ([`credentials`]), then [`StartLoad`] (the admin token file, ONNX Runtime, the device, every model,
/// not warmed up, and the pipelines), one line per model and pipeline; exit status 1 when the server would not
/// start, naming why.
pub fn start(config: &Config) -> ExitCode {
    let problems = credentials(
        config.tls.as_ref(),
        config.inference_tokens_file.as_deref(),
        &mut std::io::stderr().lock(),
    );
    start_load(config, problems)
}

/// The TLS files (`--tls-cert`, `--tls-key`, `--tls-client-ca`) and `--inference-tokens-file`, read by the very
/// loaders `serve` starts with ([`Tls::load`]: readable, parseable, the key the certificate's; [`InferenceTokens::load`]:
/// at least one token, none with whitespace), one line each on `out`. Returns how many would stop the start.
pub(crate) fn credentials(
    tls: Option<&TlsFiles>,
    tokens_file: Option<&Path>,
    out: &mut impl Write,
) -> usize {
    let mut problems = 0;
    let mut say = |line: String| {
        // stderr that cannot be written has nowhere to say so.
        let _ = writeln!(out, "check-config: {line}");
    };
    if let Some(files) = tls {
        match Tls::load(files) {
            Ok(_) => say(format!(
                "TLS certificate {} and key {} load{}",
                files.cert.display(),
                files.key.display(),
                files
                    .client_ca
                    .as_ref()
                    .map(|ca| format!(
                        "; client certificates are verified against {}",
                        ca.display()
                    ))
                    .unwrap_or_default()
            )),
            Err(e) => {
                problems += 1;
                say(format!("ERROR the server would not start: {e}"));
            }
        }
    }
    if let Some(file) = tokens_file {
        match InferenceTokens::load(file) {
            Ok(tokens) => say(format!(
                "--inference-tokens-file {} holds {} token(s)",
                file.display(),
                tokens.count()
            )),
            Err(e) => {
                problems += 1;
                say(format!("ERROR the server would not start: {e}"));
            }
        }
    }
    problems
}

/// [`StartLoad`] as `serve` runs it, models not warmed up, reported on stderr; `credential_problems`: files
/// [`credentials`] refused, which stop the start whatever the models do.
fn start_load(config: &Config, credential_problems: usize) -> ExitCode {
    let metrics = Metrics::new();
    let registry = Registry::new(metrics.clone());
    match StartLoad::run(config, &registry, metrics, false) {
        Err(e) => {
            eprintln!(
                "check-config: ERROR the server would not start on {}: {e}",
                config.repository.display()
            );
            ExitCode::FAILURE
        }
        Ok(loaded) => {
            let failed: Vec<(String, String)> = registry
                .status()
                .into_iter()
                .filter_map(|(name, status)| match status.state {
                    ModelState::Failed { reason, .. } => Some((name, reason)),
                    _ => None,
                })
                .collect();
            for (name, reason) in &failed {
                eprintln!(
                    "check-config: ERROR model {name:?}: {reason} (with --model-control {}, the server starts without it)",
                    clap::ValueEnum::to_possible_value(&config.model_control)
                        .map(|v| v.get_name().to_owned())
                        .unwrap_or_default()
                );
            }
            for served in loaded.models.models() {
                eprintln!(
                    "check-config: model {:?} version {} ({}, {}, {}) loads",
                    served.name,
                    served.version,
                    served.spec.kind.as_str(),
                    served.spec.precision().as_str(),
                    served.model.device(),
                );
            }
            for (name, pipeline) in &loaded.pipelines {
                let c = &pipeline.config;
                eprintln!(
                    "check-config: pipeline {name:?} (recall {:?} → rank {:?}, {} candidates, k {}) runs on them",
                    c.recall_model, c.ranking_model, c.candidates, c.k
                );
            }
            if credential_problems > 0 {
                eprintln!(
                    "check-config: ERROR the server would not start: {credential_problems} TLS or token file(s) \
                     cannot be used (named above)"
                );
            }
            eprintln!(
                "check-config: the {} on {} ({} model(s), {} pipeline(s); not warmed up){}",
                if credential_problems > 0 {
                    "models would load"
                } else {
                    "server would start"
                },
                config.repository.display(),
                loaded.models.models().count(),
                loaded.pipelines.len(),
                if failed.is_empty() {
                    String::new()
                } else {
                    format!(", without {} model(s) that fail to load", failed.len())
                }
            );
            if failed.is_empty() && credential_problems == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// `check-repository`: every version through the loader the server starts with (its settings resolved as `serve`
/// resolves them), then the report; exit status 1 when any version would be refused, 2 when the check cannot run.
pub fn run(args: &CheckRepositoryArgs) -> ExitCode {
    let settings = ServeArgs {
        config: args.config.clone(),
        repository: Some(args.repository.clone()),
        ort_library: args.ort_library.clone(),
        max_candidates: args.max_candidates,
        ..ServeArgs::default()
    };
    let loaded = settings
        .resolve()
        .map_err(|e| e.to_string())
        .and_then(|config| {
            let runtime = recserve_core::executor::Runtime::load(&config.ort_library)
                .map_err(|e| e.to_string())?;
            let placement =
                recserve_core::gpu::select(config.device).map_err(|e| format!("--device: {e}"))?;
            let metrics = recserve_core::metrics::Metrics::new();
            Ok(config.load_context(runtime, metrics, placement))
        });
    let ctx = match loaded {
        Ok(ctx) => ctx,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let report = check_repository(&args.repository, |mv, spec| {
        Model::load(&ctx, mv, spec).map(drop)
    });
    report.print(args.json)
}

/// Checks every version of every model of `root`: its `model.toml`, then `load` (the kind's loader, which opens
/// and warms up everything the version names and is dropped at once).
pub(crate) fn check_repository(
    root: &Path,
    mut load: impl FnMut(&ModelVersion, Arc<ModelSpec>) -> Result<(), LoadError>,
) -> Report {
    let mut report = Report {
        format_version: JSON_FORMAT_VERSION,
        repository: root.to_path_buf(),
        error: None,
        models: BTreeMap::new(),
    };
    let models = match discover(root, &HashMap::new()) {
        Ok(models) => models,
        Err(e) => {
            report.error = Some(e.to_string());
            return report;
        }
    };
    for served in models {
        let mut versions = BTreeMap::new();
        for &version in &served.available {
            let mv = ModelVersion {
                name: served.name.clone(),
                version,
                dir: root.join(&served.name).join(version.to_string()),
                available: served.available.clone(),
            };
            let (kind, error) = match read_spec(&mv.dir) {
                Err(e) => (None, Some(e.to_string())),
                Ok(spec) => {
                    let kind = spec.kind.as_str();
                    let loaded = load(&mv, Arc::new(spec));
                    (Some(kind), loaded.err().map(|e| e.to_string()))
                }
            };
            versions.insert(version, VersionReport { kind, error });
        }
        report.models.insert(
            served.name,
            ModelReport {
                served_version: served.version,
                versions,
            },
        );
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEEPFM: &str = r#"format_version = 1
kind = "deepfm"

[[tables]]
name = "t"
file = "tables.safetensors"
rows = 4
dim = 2
storage = "fp32"
oov = "reject"

[[fields]]
name = "t"
side = "item"

[dense_graph]
file = "dense.onnx"
precision = "fp32"
"#;

    #[test]
    fn every_version_is_read_and_loaded_and_each_refusal_is_reported() {
        let root = tempfile::tempdir().expect("tempdir");
        for (dir, toml) in [
            ("a/1", DEEPFM),
            ("a/2", "format_version = 1\nkind = \"xgboost\"\n"),
            ("a/3", DEEPFM),
            ("b/1", DEEPFM),
        ] {
            std::fs::create_dir_all(root.path().join(dir)).expect("mkdir");
            std::fs::write(root.path().join(dir).join("model.toml"), toml).expect("write");
        }
        let mut loaded = Vec::new();
        let report = check_repository(root.path(), |mv, spec| {
            loaded.push((mv.name.clone(), mv.version, spec.kind));
            if mv.name == "b" {
                return Err(LoadError::new(&mv.dir.join("dense.onnx"), "broken graph"));
            }
            Ok(())
        });
        assert_eq!(loaded.len(), 3, "{loaded:?}");
        assert_eq!(report.error, None);
        let a = &report.models["a"];
        assert_eq!(a.served_version, 3);
        assert_eq!(a.versions[&1].error, None);
        assert_eq!(a.versions[&1].kind, Some("deepfm"));
        let refused = a.versions[&2].error.as_deref().expect("a/2 is refused");
        assert!(
            refused.contains("a/2/model.toml") && refused.contains("xgboost"),
            "{refused}"
        );
        assert_eq!(a.versions[&2].kind, None);
        let b = report.models["b"].versions[&1]
            .error
            .as_deref()
            .expect("b/1 is refused");
        assert!(b.contains("b/1/dense.onnx: broken graph"), "{b}");
        assert_eq!(report.problems().len(), 2);

        let mut text = Vec::new();
        report.write_text(&mut text).expect("write");
        let text = String::from_utf8(text).expect("utf-8");
        assert!(text.contains("a/1 deepfm: ok\n"), "{text}");
        assert!(text.contains("a/3 (served) deepfm: ok\n"), "{text}");
        assert!(text.contains("b/1 (served) deepfm: ERROR "), "{text}");
        assert!(
            text.ends_with("2 model version(s) would be refused by the server\n"),
            "{text}"
        );

        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["format_version"], JSON_FORMAT_VERSION);
        assert_eq!(
            json["models"]["a"]["versions"]["3"]["error"],
            serde_json::Value::Null
        );
    }

    /// `credentials`' lines and its count of problems.
    fn checked(tls: Option<&TlsFiles>, tokens: Option<&Path>) -> (String, usize) {
        let mut out = Vec::new();
        let problems = credentials(tls, tokens, &mut out);
        (String::from_utf8(out).expect("utf-8"), problems)
    }

    #[test]
    fn tls_and_token_files_are_judged_by_the_loaders_serve_starts_with() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |name: &str, text: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, text).expect("write");
            path
        };
        let one = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
        let other = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).expect("cert");
        let files = TlsFiles {
            cert: write("cert.pem", &one.cert.pem()),
            key: write("key.pem", &one.signing_key.serialize_pem()),
            client_ca: Some(write("ca.pem", &other.cert.pem())),
        };
        let tokens = write("tokens", "# team a\nalpha\n\nbeta\n");
        let (text, problems) = checked(Some(&files), Some(&tokens));
        assert_eq!(problems, 0, "{text}");
        assert!(
            text.contains("cert.pem and key ") && text.contains("verified against "),
            "{text}"
        );
        assert!(text.contains("tokens holds 2 token(s)\n"), "{text}");
        // Nothing configured: nothing to say.
        assert_eq!(checked(None, None), (String::new(), 0));

        // The key of another certificate, a client CA that is not a certificate, a tokens' file without tokens:
        // each named by its flag and file.
        let mismatched = TlsFiles {
            key: write("other.key", &other.signing_key.serialize_pem()),
            client_ca: None,
            ..files.clone()
        };
        let bad_ca = TlsFiles {
            client_ca: Some(write("notca.pem", "hello\n")),
            ..files.clone()
        };
        let empty = write("empty-tokens", "# nothing yet\n\n");
        for (tls, tokens, flag, file, problem) in [
            (
                Some(&mismatched),
                None,
                "--tls-key",
                "other.key",
                "does not match the certificate",
            ),
            (
                Some(&bad_ca),
                None,
                "--tls-client-ca",
                "notca.pem",
                "holds no certificate",
            ),
            (
                None,
                Some(empty.as_path()),
                "--inference-tokens-file",
                "empty-tokens",
                "holds no token",
            ),
            (
                None,
                Some(dir.path().join("missing").as_path()),
                "--inference-tokens-file",
                "missing",
                "cannot read",
            ),
        ] {
            let (text, problems) = checked(tls, tokens);
            assert_eq!(problems, 1, "{text}");
            let line = text.trim_end();
            assert!(
                line.starts_with(&format!(
                    "check-config: ERROR the server would not start: {flag} "
                )) && line.contains(&format!("{file}: {problem}")),
                "{line}"
            );
        }
        let (text, problems) = checked(Some(&mismatched), Some(&empty));
        assert_eq!(problems, 2, "{text}");
    }

    #[test]
    fn a_layout_error_stops_the_check_before_any_version() {
        let root = tempfile::tempdir().expect("tempdir");
        let report = check_repository(root.path(), |_, _| panic!("nothing to load"));
        let error = report.error.as_deref().expect("empty repository");
        assert!(error.contains("holds no model"), "{error}");
        assert!(report.models.is_empty());
        assert_eq!(report.problems(), vec![error]);
    }
}
