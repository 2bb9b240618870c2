//! Model lifecycle while serving (`--model-control`): the repository API's load, unload and index (Triton's model
//! repository extension, for `explicit`), the repository poll (`poll`), and the bearer token that protects the
//! API (`--admin-token-file`). Loads run on a thread of their own at a lower priority than serving, so a load
//! costs the requests being served as little CPU as it can; the swap itself is the registry's
//! ([`recserve_core::registry::Registry::reload`]): a new version is loaded and warmed up beside the serving one, the
//! pipelines are checked against the snapshot it would make, then one atomic switch.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, SystemTime};

use subtle::ConstantTimeEq;

use super::Service;
use crate::config::{Config, ModelControl, PipelineConfig};
use recserve_core::error::{LoadError, ServiceError};
use recserve_core::models;
use recserve_core::registry::{Change, LoadContext, ModelState, Status};
use recserve_core::repository::{self, VersionPolicy};

/// Nice value of the threads that load models while the server serves: below the executors' (so warm-up runs do
/// not take cores from batches) and the transport's.
const LOADER_NICENESS: u8 = 10;

/// What loading while serving needs, kept from start-up.
#[derive(Debug)]
pub(super) struct Lifecycle {
    ctx: LoadContext,
    repository: PathBuf,
    /// Each model's version policy (`[models.NAME] versions`, `--pin`).
    policies: HashMap<String, VersionPolicy>,
    pipelines: BTreeMap<String, PipelineConfig>,
    control: ModelControl,
    poll_every: Duration,
    /// The admin bearer token, read from `--admin-token-file` at start.
    token: Option<String>,
    /// Versions whose load failed, with when their directory last changed: polling retries them only once it has.
    failed: Mutex<HashMap<String, (u64, Option<SystemTime>)>>,
    /// Served models whose directory is gone but that cannot be unloaded (a pipeline uses them), with why: polling
    /// says so once, not at every look.
    kept: Mutex<HashMap<String, String>>,
}

/// Reads the admin token: the file's contents without surrounding whitespace, not empty.
pub(super) fn read_token(path: &Path) -> Result<String, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        LoadError::new(
            path,
            format!("cannot read the admin token (--admin-token-file): {e}"),
        )
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(LoadError::new(
            path,
            "holds no admin token (--admin-token-file): write the token into it",
        ));
    }
    Ok(token.to_owned())
}

impl Lifecycle {
    /// The version policy of `model`, if one is set.
    pub(super) fn policy(&self, model: &str) -> Option<VersionPolicy> {
        self.policies.get(model).cloned()
    }

    pub(super) fn new(config: &Config, ctx: LoadContext, token: Option<String>) -> Lifecycle {
        Lifecycle {
            ctx,
            repository: config.repository.clone(),
            policies: config.policies.clone(),
            pipelines: config.pipelines.clone(),
            control: config.model_control,
            poll_every: Duration::from_secs(config.repository_poll_s),
            token,
            failed: Mutex::new(HashMap::new()),
            kept: Mutex::new(HashMap::new()),
        }
    }
}

/// One line of the repository index: a model of the repository and where it stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IndexEntry {
    pub(crate) name: String,
    /// The version serving (or, while loading, the one being loaded); empty when there is none.
    pub(crate) version: String,
    /// `READY`, `LOADING` or `UNAVAILABLE`, as Triton names them.
    pub(crate) state: &'static str,
    /// Why it is not ready, or what the last failed load said.
    pub(crate) reason: String,
}

impl IndexEntry {
    /// The model's lines: one per serving version (several under a version policy), or one saying why none is.
    fn of(name: &str, status: Option<&Status>) -> Vec<IndexEntry> {
        let entry = |version: String, state: &'static str, reason: String| IndexEntry {
            name: name.to_owned(),
            version,
            state,
            reason,
        };
        let serving = |state: &'static str, reason: String| -> Vec<IndexEntry> {
            let versions = status.map(|s| s.versions.as_slice()).unwrap_or_default();
            if versions.is_empty() {
                return vec![entry(String::new(), state, reason)];
            }
            versions
                .iter()
                .map(|v| entry(v.to_string(), state, reason.clone()))
                .collect()
        };
        match status {
            None => vec![entry(String::new(), "UNAVAILABLE", "not loaded".to_owned())],
            Some(s) => match &s.state {
                ModelState::Ready => serving("READY", String::new()),
                ModelState::Loading { version: v } => {
                    vec![entry(v.to_string(), "LOADING", String::new())]
                }
                ModelState::Failed { version: v, reason } => {
                    let what = match v {
                        Some(v) => format!("version {v} failed to load: {reason}"),
                        None => format!("failed to load: {reason}"),
                    };
                    let state = if s.serving.is_some() {
                        "READY"
                    } else {
                        "UNAVAILABLE"
                    };
                    serving(state, what)
                }
                ModelState::Unloaded => {
                    vec![entry(String::new(), "UNAVAILABLE", "unloaded".to_owned())]
                }
            },
        }
    }
}

/// Runs `work` on a thread of its own at [`LOADER_NICENESS`] and waits for it without blocking the runtime.
async fn on_loader_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ServiceError> {
    let (done, answer) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("model-load".to_owned())
        .spawn(move || {
            // No model label: the name comes from an admin call and may not be in the repository.
            recserve_core::threads::register_current_thread(
                recserve_core::threads::ThreadRole::Loader,
                "",
            );
            recserve_core::batching::lower_priority(LOADER_NICENESS);
            let _ = done.send(work());
        })
        .map_err(|e| ServiceError::Internal(format!("cannot start a model load thread: {e}")))?;
    answer
        .await
        .map_err(|_| ServiceError::Internal("the model load thread panicked".to_owned()))
}

impl Service {
    fn lifecycle(&self) -> Result<&Lifecycle, ServiceError> {
        self.lifecycle
            .get()
            .ok_or(ServiceError::Unavailable("models are still loading"))
    }

    /// Lets a repository API call through only with the admin token: `authorization` is the request's
    /// `Authorization` header. Compared in constant time.
    pub(crate) fn authorize_admin(&self, authorization: Option<&str>) -> Result<(), ServiceError> {
        let life = self.lifecycle()?;
        let Some(token) = &life.token else {
            return Err(ServiceError::PermissionDenied(
                "the repository API is disabled on this server: start it with --admin-token-file to enable it"
                    .to_owned(),
            ));
        };
        let Some(given) = authorization else {
            return Err(ServiceError::Unauthenticated(
                "the repository API needs the header `Authorization: Bearer <token>` (the token of \
                 --admin-token-file)"
                    .to_owned(),
            ));
        };
        let given = given
            .split_once(' ')
            .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
            .map(|(_, credentials)| credentials.trim())
            .ok_or_else(|| {
                ServiceError::Unauthenticated(
                    "the Authorization header must be `Bearer <token>`".to_owned(),
                )
            })?;
        if bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
            Ok(())
        } else {
            Err(ServiceError::PermissionDenied(
                "the bearer token is not this server's admin token".to_owned(),
            ))
        }
    }

    /// Refuses load and unload unless the server runs with `--model-control explicit`.
    fn require_explicit(&self) -> Result<&Lifecycle, ServiceError> {
        let life = self.lifecycle()?;
        match life.control {
            ModelControl::Explicit => Ok(life),
            ModelControl::Poll => Err(ServiceError::NotAllowed(
                "the server polls its repository (--model-control poll): models are loaded and unloaded by \
                 changing the repository, not through the API"
                    .to_owned(),
            )),
            ModelControl::None => Err(ServiceError::NotAllowed(
                "the server loads its models once (--model-control none): start it with --model-control \
                 explicit to load and unload through the API"
                    .to_owned(),
            )),
        }
    }

    /// Loads the version of `name` the repository offers now (`--pin`, else the highest) and swaps it in; the
    /// version it replaces finishes the requests it holds. Also when that version already serves (a reload).
    pub(crate) async fn load_model(
        self: &Arc<Self>,
        name: &str,
    ) -> Result<Option<Change>, ServiceError> {
        self.require_explicit()?;
        let (service, model) = (Arc::clone(self), name.to_owned());
        on_loader_thread(move || service.reload(&model, false)).await?
    }

    /// Takes `name` out of service; the requests it holds finish on it. Refused for a model a pipeline needs.
    pub(crate) async fn unload_model(self: &Arc<Self>, name: &str) -> Result<Change, ServiceError> {
        self.require_explicit()?;
        let (service, model) = (Arc::clone(self), name.to_owned());
        on_loader_thread(move || service.unload(&model)).await?
    }

    fn reload(&self, name: &str, skip_if_serving: bool) -> Result<Option<Change>, ServiceError> {
        let life = self.lifecycle()?;
        self.registry
            .reload(
                &life.ctx,
                &life.repository,
                name,
                life.policies.get(name),
                skip_if_serving,
                |next| models::check_pipelines(&life.pipelines, next),
            )
            .map_err(|failure| ServiceError::LoadFailed {
                model: name.to_owned(),
                reason: failure.describe(&life.repository),
            })
    }

    fn unload(&self, name: &str) -> Result<Change, ServiceError> {
        let life = self.lifecycle()?;
        if self
            .registry
            .snapshot()
            .is_none_or(|s| s.get(name, None).is_err())
        {
            return Err(ServiceError::ModelNotFound {
                model: name.to_owned(),
                served: self
                    .registry
                    .snapshot()
                    .map(|s| s.names())
                    .unwrap_or_default(),
            });
        }
        let user = life.pipelines.iter().find_map(|(pipeline, config)| {
            let role = if config.recall_model == name {
                "recall_model"
            } else if config.ranking_model == name {
                "ranking_model"
            } else {
                return None;
            };
            Some((pipeline, role))
        });
        if let Some((pipeline, role)) = user {
            return Err(ServiceError::NotAllowed(format!(
                "model {name:?} cannot be unloaded: pipeline {pipeline:?} uses it as its {role}; load another \
                 version of it instead, or remove the pipeline from the config file and restart"
            )));
        }
        self.registry
            .unload(name, &life.ctx.metrics, |next| {
                models::check_pipelines(&life.pipelines, next)
            })
            .map_err(|problem| {
                ServiceError::NotAllowed(format!("model {name:?} cannot be unloaded: {problem}"))
            })
    }

    /// The repository's models and where each stands: those in the repository directory and those loaded
    /// (a served model whose directory went away is still listed). `ready_only`: only the `READY` ones.
    pub(crate) fn repository_index(
        &self,
        ready_only: bool,
    ) -> Result<Vec<IndexEntry>, ServiceError> {
        let life = self.lifecycle()?;
        let status = self.registry.status();
        let mut names: Vec<String> = model_dirs(&life.repository);
        names.extend(status.keys().cloned());
        names.sort_unstable();
        names.dedup();
        Ok(names
            .iter()
            .flat_map(|name| IndexEntry::of(name, status.get(name)))
            .filter(|e| !ready_only || e.state == "READY")
            .collect())
    }

    /// Every model's lifecycle status, by name.
    pub(crate) fn model_status(&self) -> BTreeMap<String, Status> {
        self.registry.status()
    }

    /// Starts watching the repository every `--repository-poll-s`, when the server polls; the thread ends with
    /// the service or when it drains.
    pub(crate) fn start_polling(self: &Arc<Self>) -> std::io::Result<()> {
        let Ok(life) = self.lifecycle() else {
            return Ok(());
        };
        if life.control != ModelControl::Poll {
            return Ok(());
        }
        let every = life.poll_every;
        let service: Weak<Service> = Arc::downgrade(self);
        std::thread::Builder::new()
            .name("repository-poll".to_owned())
            .spawn(move || {
                recserve_core::threads::register_current_thread(
                    recserve_core::threads::ThreadRole::Other,
                    "repository-poll",
                );
                recserve_core::batching::lower_priority(LOADER_NICENESS);
                loop {
                    std::thread::sleep(every);
                    let Some(service) = service.upgrade() else {
                        return;
                    };
                    if service.readiness() == super::Readiness::ShuttingDown {
                        return;
                    }
                    service.poll_once();
                }
            })?;
        Ok(())
    }

    /// One look at the repository: swaps in each model's new version (a version whose load failed is tried again
    /// only once its directory changes), loads new models, unloads models whose directory is gone.
    pub(crate) fn poll_once(&self) {
        let Ok(life) = self.lifecycle() else {
            return;
        };
        let on_disk = model_dirs(&life.repository);
        for name in &on_disk {
            let Ok(versions) =
                repository::discover_model(&life.repository, name, life.policies.get(name))
            else {
                // A model directory being written (no complete version yet) is tried at the next poll.
                continue;
            };
            let mv = versions
                .last()
                .expect("discover_model picks at least one version");
            let changed = changed_at(&mv.dir);
            let retry = {
                let failed = life.failed.lock().unwrap_or_else(PoisonError::into_inner);
                failed.get(name) != Some(&(mv.version, changed))
            };
            if !retry {
                continue;
            }
            match self.reload(name, true) {
                Ok(_) => {
                    life.failed
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(name);
                }
                Err(_) => {
                    life.failed
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .insert(name.clone(), (mv.version, changed));
                }
            }
        }
        let served: Vec<String> = self
            .registry
            .snapshot()
            .map(|s| s.models().map(|m| m.name.clone()).collect())
            .unwrap_or_default();
        let mut kept = life.kept.lock().unwrap_or_else(PoisonError::into_inner);
        kept.retain(|name, _| served.contains(name) && !on_disk.contains(name));
        for name in served.iter().filter(|n| !on_disk.contains(n)) {
            match self.unload(name) {
                Ok(_) => {
                    kept.remove(name);
                }
                Err(e) => {
                    let why = e.to_string();
                    if kept.get(name) != Some(&why) {
                        tracing::warn!(model = %name, error = %why, "the model's directory is gone, but it stays served (said once, until this changes)");
                        kept.insert(name.clone(), why);
                    }
                }
            }
        }
    }
}

/// The model directories of the repository (valid names only), sorted.
fn model_dirs(repository: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(repository) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| e.path().is_dir())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && repository::is_valid_model_name(n))
        .collect();
    names.sort_unstable();
    names
}

/// When a version directory last changed: the later of the directory's and its `model.toml`'s modification.
fn changed_at(dir: &Path) -> Option<SystemTime> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    modified(dir).max(modified(&dir.join("model.toml")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_entries_say_where_each_model_stands() {
        let status = |versions: &[u64], state| Status {
            serving: versions.last().copied(),
            versions: versions.to_vec(),
            state,
        };
        let one = |entries: Vec<IndexEntry>| {
            assert_eq!(entries.len(), 1, "{entries:?}");
            entries.into_iter().next().expect("one")
        };
        assert_eq!(
            one(IndexEntry::of("a", Some(&status(&[3], ModelState::Ready)))),
            IndexEntry {
                name: "a".into(),
                version: "3".into(),
                state: "READY",
                reason: String::new()
            }
        );
        let both = IndexEntry::of("a", Some(&status(&[7, 8], ModelState::Ready)));
        assert_eq!(
            both.iter()
                .map(|e| (e.version.as_str(), e.state))
                .collect::<Vec<_>>(),
            [("7", "READY"), ("8", "READY")],
            "one line per serving version"
        );
        let loading = one(IndexEntry::of(
            "a",
            Some(&status(&[3], ModelState::Loading { version: 4 })),
        ));
        assert_eq!((loading.version.as_str(), loading.state), ("4", "LOADING"));
        let failed = one(IndexEntry::of(
            "a",
            Some(&status(
                &[3],
                ModelState::Failed {
                    version: Some(4),
                    reason: "x/4/model.toml: bad".into(),
                },
            )),
        ));
        assert_eq!(
            (
                failed.version.as_str(),
                failed.state,
                failed.reason.as_str()
            ),
            (
                "3",
                "READY",
                "version 4 failed to load: x/4/model.toml: bad"
            ),
            "the old version goes on serving"
        );
        let unloaded = one(IndexEntry::of(
            "a",
            Some(&status(&[], ModelState::Unloaded)),
        ));
        assert_eq!(
            (unloaded.state, unloaded.reason.as_str()),
            ("UNAVAILABLE", "unloaded")
        );
        assert_eq!(one(IndexEntry::of("b", None)).state, "UNAVAILABLE");
    }

    #[test]
    fn the_token_file_must_hold_a_token() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("token");
        std::fs::write(&file, "  s3cret\n").expect("write");
        assert_eq!(read_token(&file).expect("token"), "s3cret");
        std::fs::write(&file, "\n").expect("write");
        assert!(
            read_token(&file)
                .expect_err("empty")
                .problem
                .contains("holds no admin token")
        );
        assert!(
            read_token(&dir.path().join("none"))
                .expect_err("missing")
                .problem
                .contains("cannot read")
        );
    }
}
