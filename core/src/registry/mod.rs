//! Which versions of each model serve now. The registry loads the models of a repository (each through its
//! kind's loader, [`Loadable::load`], which `models` implements above it; the versions each model's
//! [`VersionPolicy`] picks: the highest, or the latest N, or those named), keeps them as one [`Snapshot`] behind
//! an `Arc`, and hands that snapshot to every request, which keeps it to its end: a request finishes on the
//! versions it started on, and a recommend call uses one snapshot for both of its models. The snapshot also holds
//! each model's [`Traffic`] split, which routes requests between its loaded versions. What loading needs besides
//! the model itself (the server's settings, ONNX Runtime, the metrics) is a [`LoadContext`].
//!
//! Versions change while serving ([`Registry::reload`], [`Registry::unload`], [`Registry::set_traffic`]): new
//! versions are loaded and warmed up beside the serving ones, checked, then swapped in with one atomic switch of
//! the snapshot. A version that leaves keeps answering the requests that hold it and is released (its threads
//! joined, sessions and mapped tables dropped) on a thread of its own once the last of them ends, never on a
//! request's thread. A load that fails leaves the serving versions serving and is reported in the model's
//! [`Status`].
//!
//! The registry is generic over the model type so that it knows nothing of model kinds: `ranking` and `recall`
//! sit above it and read their [`LoadContext`] from here, and its bookkeeping is tested with a model of its own.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};
use std::time::Instant;

use crate::error::LoadError;
use crate::metrics::Metrics;
use crate::repository::{self, ModelVersion};

mod context;
mod releaser;
mod snapshot;
mod traffic;

pub use context::{LoadContext, Loadable, RequestLimits, Shadowed};
use releaser::Releaser;
pub use snapshot::Routed;
pub(crate) use snapshot::{Served, Snapshot};
pub use traffic::{MAX_WEIGHT, Route, Shadow, Traffic};

use crate::repository::VersionPolicy;

/// Where a model of the repository stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The highest version serving now, if any.
    pub serving: Option<u64>,
    /// Every version serving now, ascending (several under a version policy).
    pub versions: Vec<u64>,
    pub state: ModelState,
}

/// What is happening to a model, or happened last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModelState {
    /// Serving, nothing pending.
    Ready,
    /// Loading `version` (beside the serving one, if any).
    Loading { version: u64 },
    /// The last load failed (of `version`, when one was found); the serving version, if any, goes on.
    Failed {
        version: Option<u64>,
        reason: String,
    },
    /// Unloaded on request, or gone from the repository.
    Unloaded,
}

/// Why a version did not start serving.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LoadFailure {
    /// The model or its version could not be found, read, checked or loaded; the error names the file.
    #[error("{0}")]
    Invalid(LoadError),
    /// It loaded, but the models it serves with refused it (a pipeline whose models no longer fit).
    #[error("{0}")]
    Refused(String),
}

impl LoadFailure {
    /// The failure as clients read it: the paths of the files it names relative to the repository at `root`, whose
    /// place on the server's disk is the operator's business, not the client's.
    pub fn describe(&self, root: &Path) -> String {
        match self {
            LoadFailure::Invalid(e) => match e.path.strip_prefix(root) {
                Ok(rel) if rel.as_os_str().is_empty() => e.problem.clone(),
                Ok(rel) => format!("{}: {}", rel.display(), e.problem),
                Err(_) => e.to_string(),
            },
            LoadFailure::Refused(problem) => problem.clone(),
        }
    }

    /// The `outcome` label of `recserve_model_loads_total`.
    pub(crate) fn outcome(&self) -> &'static str {
        match self {
            LoadFailure::Invalid(_) => "invalid_model",
            LoadFailure::Refused(_) => "refused",
        }
    }
}

/// A change the registry made: `name` serves `versions` now (none: unloaded) instead of `previous`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Change {
    pub(crate) name: String,
    pub(crate) versions: Vec<u64>,
    pub(crate) previous: Vec<u64>,
}

/// A served version as snapshots and requests hold it.
type Shared<M> = Arc<Served<M>>;

/// Owns which version of each model serves now.
#[derive(Debug)]
pub struct Registry<M: Send + Sync + 'static> {
    /// `None` until the first snapshot is installed.
    current: RwLock<Option<Arc<Snapshot<M>>>>,
    /// Each model's lifecycle, for the repository index and `/v1/models`.
    status: Mutex<BTreeMap<String, Status>>,
    /// One load or unload at a time: each builds its snapshot from the one before.
    changes: Mutex<()>,
    releaser: Releaser<M>,
}

impl<M: Shadowed + Send + Sync + 'static> Registry<M> {
    pub fn new(metrics: Metrics) -> Registry<M> {
        Registry {
            current: RwLock::new(None),
            status: Mutex::new(BTreeMap::new()),
            changes: Mutex::new(()),
            releaser: Releaser::start(metrics),
        }
    }

    /// Serves `snapshot` from now on. Requests already running keep the snapshot they took.
    pub fn install(&self, snapshot: Snapshot<M>) {
        let mut status = lock(&self.status);
        for (name, versions) in &snapshot.models {
            let versions: Vec<u64> = versions.keys().copied().collect();
            let failed = status
                .get(name)
                .filter(|s| matches!(s.state, ModelState::Failed { .. }))
                .map(|s| s.state.clone());
            status.insert(
                name.clone(),
                Status {
                    serving: versions.last().copied(),
                    versions,
                    // A version of it that failed at start stays reported beside those that serve.
                    state: failed.unwrap_or(ModelState::Ready),
                },
            );
        }
        drop(status);
        self.publish(snapshot);
    }

    /// The models serving now, or `None` before the first snapshot is installed.
    pub fn snapshot(&self) -> Option<Arc<Snapshot<M>>> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Each model's status, by name: those serving, loading, failed or unloaded.
    pub fn status(&self) -> BTreeMap<String, Status> {
        lock(&self.status).clone()
    }

    #[cfg(test)]
    /// Versions replaced or unloaded that still answer requests admitted before the switch.
    pub(crate) fn draining(&self) -> usize {
        self.releaser.len()
    }

    fn set_status(&self, name: &str, versions: Vec<u64>, state: ModelState) {
        lock(&self.status).insert(
            name.to_owned(),
            Status {
                serving: versions.last().copied(),
                versions,
                state,
            },
        );
    }

    /// The snapshot serving now, or an empty one before the first.
    fn current(&self) -> Arc<Snapshot<M>> {
        self.snapshot().unwrap_or_else(|| {
            Arc::new(Snapshot {
                models: BTreeMap::new(),
                traffic: BTreeMap::new(),
            })
        })
    }

    /// Serves exactly `versions` of `name` (or, with an empty list, takes `name` out) if `check` accepts the
    /// snapshot that makes; the versions that leave drain. Returns the switch, or `check`'s objection.
    fn switch(
        &self,
        name: &str,
        versions: Vec<Arc<Served<M>>>,
        check: impl FnOnce(&Snapshot<M>) -> Result<(), String>,
    ) -> Result<(Change, Vec<Shared<M>>), String> {
        let current = self.current();
        let previous = current.versions(name);
        let now: Vec<u64> = versions.iter().map(|m| m.version).collect();
        let (next, old) = if versions.is_empty() {
            current.without(name)
        } else {
            current.with(versions)
        };
        check(&next)?;
        self.publish(next);
        let switch = Change {
            name: name.to_owned(),
            versions: now,
            previous,
        };
        Ok((switch, old))
    }

    /// Routes `name`'s requests by `traffic` from now on (`None`: all to its highest loaded version). Requests
    /// already running keep their route. The split may name versions not loaded now: they take traffic once they
    /// are.
    pub fn set_traffic(&self, name: &str, traffic: Option<Traffic>) {
        let _one_at_a_time = lock(&self.changes);
        let next = self.current().with_traffic(name, traffic.map(Arc::new));
        self.publish(next);
    }

    /// Serves `next` from now on; each version learns whether it is now its model's shadow.
    fn publish(&self, next: Snapshot<M>) {
        for (name, versions) in &next.models {
            let shadow = next.traffic(name).and_then(|t| t.shadow).map(|s| s.version);
            for (&version, served) in versions {
                served.model.set_shadow(shadow == Some(version));
            }
        }
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(next));
    }
}

impl<M: Loadable> Registry<M> {
    /// Takes `name` out of service (its version drains), if `check` accepts the snapshot without it.
    pub fn unload(
        &self,
        name: &str,
        metrics: &Metrics,
        check: impl FnOnce(&Snapshot<M>) -> Result<(), String>,
    ) -> Result<Change, String> {
        let _one_at_a_time = lock(&self.changes);
        if self.current().versions(name).is_empty() {
            return Err(format!("model {name:?} is not served"));
        }
        let (switch, old) = self.switch(name, Vec::new(), check)?;
        self.set_status(name, Vec::new(), ModelState::Unloaded);
        for old in old {
            self.release(old, metrics);
        }
        tracing::info!(model = %name, versions = ?switch.previous, "model unloaded; draining");
        Ok(switch)
    }

    /// Hands a replaced version to the releaser and clears its `recserve_model_info` series.
    fn release(&self, old: Arc<Served<M>>, metrics: &Metrics) {
        // A version reloaded afresh serves under the same labels: its series stays.
        let reloaded = self
            .snapshot()
            .is_some_and(|s| s.get(&old.name, Some(old.version)).is_ok());
        if !reloaded {
            metrics.clear_batching(&old.name, old.version);
            metrics.clear_model_info(
                &old.name,
                old.version,
                old.spec.kind.as_str(),
                old.spec.precision().as_str(),
                old.model.device(),
            );
        }
        self.releaser.push(old);
    }
    /// Loads every model of `repository` (the versions its policy in `policies` picks, else the highest), in name
    /// then version order. The first version that cannot be loaded stops the load, unless `keep_going` (a server
    /// whose models change while it serves): then that version is left out, its model's status says why (and its
    /// load counts as failed), and the others load. The result is not served until it is
    /// [installed](Self::install).
    pub fn load(
        &self,
        ctx: &LoadContext,
        repository: &Path,
        policies: &HashMap<String, VersionPolicy>,
        keep_going: bool,
    ) -> Result<Snapshot<M>, LoadError> {
        let mut models = Vec::new();
        for mv in repository::discover(repository, policies)? {
            let started = Instant::now();
            let (name, version) = (mv.name.clone(), mv.version);
            match load_version(ctx, mv) {
                Ok(served) => {
                    ctx.metrics
                        .model_loaded(&name, "loaded", started.elapsed().as_secs_f64());
                    models.push(served);
                }
                Err(e) if keep_going => {
                    let failure = LoadFailure::Invalid(e);
                    tracing::error!(model = %name, version, error = %failure, "model load failed; the server starts without it");
                    ctx.metrics.model_loaded(
                        &name,
                        failure.outcome(),
                        started.elapsed().as_secs_f64(),
                    );
                    self.set_status(
                        &name,
                        Vec::new(),
                        ModelState::Failed {
                            version: Some(version),
                            reason: failure.describe(repository),
                        },
                    );
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Snapshot::new(models))
    }

    /// Loads the versions of `name` that the repository offers now (by `policy`, else the highest) beside the
    /// serving ones, warms them up, and swaps them in if `check` accepts the snapshot they make (the service checks
    /// its pipelines); serving versions the policy no longer picks leave. On failure the serving versions go on
    /// serving and the model's status says why. Blocking: call it off the request path. `skip_if_serving`: keep
    /// the versions that already serve as they are, and do nothing when the set is unchanged (polling); otherwise
    /// every picked version is loaded afresh (a reload).
    pub fn reload(
        &self,
        ctx: &LoadContext,
        repository: &Path,
        name: &str,
        policy: Option<&VersionPolicy>,
        skip_if_serving: bool,
        check: impl FnOnce(&Snapshot<M>) -> Result<(), String>,
    ) -> Result<Option<Change>, LoadFailure> {
        let _one_at_a_time = lock(&self.changes);
        let current = self.current();
        let serving = current.versions(name);
        let started = Instant::now();
        let fail = |version: Option<u64>, failure: LoadFailure| {
            tracing::error!(model = %name, version, error = %failure, "model load failed; the serving versions go on");
            ctx.metrics
                .model_loaded(name, failure.outcome(), started.elapsed().as_secs_f64());
            self.set_status(
                name,
                serving.clone(),
                ModelState::Failed {
                    version,
                    reason: failure.describe(repository),
                },
            );
            failure
        };
        let wanted = match repository::discover_model(repository, name, policy) {
            Ok(wanted) => wanted,
            // A name that is neither in the repository nor known here leaves no trace: clients may send any
            // number of made-up names, and each would otherwise become a status entry and metric series.
            Err(e)
                if serving.is_empty()
                    && !lock(&self.status).contains_key(name)
                    && !repository::holds(repository, name) =>
            {
                return Err(LoadFailure::Invalid(e));
            }
            Err(e) => return Err(fail(None, LoadFailure::Invalid(e))),
        };
        let picked: Vec<u64> = wanted.iter().map(|mv| mv.version).collect();
        if skip_if_serving && picked == serving {
            return Ok(None);
        }
        let mut versions = Vec::with_capacity(wanted.len());
        for mv in wanted {
            let version = mv.version;
            if skip_if_serving && let Ok(kept) = current.get(name, Some(version)) {
                versions.push(Arc::clone(kept));
                continue;
            }
            self.set_status(name, serving.clone(), ModelState::Loading { version });
            let model =
                load_version(ctx, mv).map_err(|e| fail(Some(version), LoadFailure::Invalid(e)))?;
            versions.push(Arc::new(model));
        }
        let (switch, old) = self
            .switch(name, versions, check)
            .map_err(|problem| fail(picked.last().copied(), LoadFailure::Refused(problem)))?;
        ctx.metrics
            .model_loaded(name, "loaded", started.elapsed().as_secs_f64());
        self.set_status(name, picked.clone(), ModelState::Ready);
        for old in old {
            self.release(old, &ctx.metrics);
        }
        tracing::info!(model = %name, versions = ?picked, previous = ?switch.previous, "switched to the new versions");
        Ok(Some(switch))
    }
}

/// Loads one version, records it in `recserve_model_info` and logs it.
fn load_version<M: Loadable>(ctx: &LoadContext, mv: ModelVersion) -> Result<Served<M>, LoadError> {
    let started = Instant::now();
    let spec = Arc::new(repository::read_spec(&mv.dir)?);
    let model = M::load(ctx, &mv, Arc::clone(&spec))?;
    ctx.metrics.set_model_info(
        &mv.name,
        mv.version,
        spec.kind.as_str(),
        spec.precision().as_str(),
        model.device(),
    );
    tracing::info!(
        model = %mv.name,
        version = mv.version,
        kind = spec.kind.as_str(),
        precision = spec.precision().as_str(),
        device = model.device(),
        seconds = started.elapsed().as_secs_f64(),
        warmed_up = ctx.warm_up,
        "model loaded"
    );
    Ok(Served {
        name: mv.name,
        version: mv.version,
        available: mv.available,
        spec,
        model,
    })
}

pub(super) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Every update under these locks is a single insert or swap: a panic cannot leave them half done.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::releaser::RELEASE_EVERY;
    use super::*;
    use crate::repository::ModelSpec;

    fn served(name: &str, version: u64) -> Served<()> {
        let spec = r#"
format_version = 1
kind = "lightgcn"
[recall]
user_table = "user"
item_table = "item"
[[tables]]
name = "user"
file = "t.safetensors"
rows = 2
dim = 2
storage = "fp32"
[[tables]]
name = "item"
file = "t.safetensors"
rows = 2
dim = 2
storage = "fp32"
"#;
        Served {
            name: name.to_owned(),
            version,
            available: vec![version],
            spec: Arc::new(ModelSpec::parse(spec).expect("spec")),
            model: (),
        }
    }

    #[test]
    fn a_snapshot_finds_models_by_name_and_version() {
        let snapshot = Snapshot::new([served("b", 3), served("a", 1)]);
        assert_eq!(snapshot.names(), "a, b");
        assert_eq!(snapshot.get("b", None).expect("served").version, 3);
        assert_eq!(snapshot.get("b", Some(3)).expect("served").version, 3);
        assert_eq!(
            snapshot.get("b", Some(2)).expect_err("old").to_string(),
            "model \"b\" version 2 is not served (serving version 3)"
        );
        let two = Snapshot::new([served("b", 3), served("b", 5)]);
        assert_eq!(two.get("b", None).expect("highest").version, 5);
        assert_eq!(two.get("b", Some(3)).expect("3").version, 3);
        assert_eq!(
            two.get("b", Some(4)).expect_err("absent").to_string(),
            "model \"b\" version 4 is not served (serving versions 3, 5)"
        );
        assert_eq!(two.models().count(), 2);
        assert_eq!(
            snapshot.get("c", None).expect_err("absent").to_string(),
            "model \"c\" is not served (served models: a, b)"
        );
    }

    /// A model that records the thread it is dropped on.
    #[derive(Debug)]
    struct Recorded(Arc<Mutex<Vec<String>>>);

    impl Shadowed for Recorded {}
    impl Shadowed for () {}

    impl Drop for Recorded {
        fn drop(&mut self) {
            let thread = std::thread::current().name().unwrap_or("").to_owned();
            lock(&self.0).push(thread);
        }
    }

    fn recorded(
        name: &str,
        version: u64,
        drops: &Arc<Mutex<Vec<String>>>,
    ) -> Arc<Served<Recorded>> {
        let base = served(name, version);
        Arc::new(Served {
            name: base.name,
            version: base.version,
            available: base.available,
            spec: base.spec,
            model: Recorded(Arc::clone(drops)),
        })
    }

    #[test]
    fn a_replaced_version_is_released_on_the_releaser_once_its_last_request_ends() {
        let drops = Arc::new(Mutex::new(Vec::new()));
        let registry = Registry::<Recorded>::new(Metrics::new());
        let (change, _) = registry
            .switch("a", vec![recorded("a", 1, &drops)], |_| Ok(()))
            .expect("first version");
        assert_eq!((change.versions, change.previous), (vec![1], vec![]));
        let request = registry.snapshot().expect("serving");
        let (change, old) = registry
            .switch("a", vec![recorded("a", 2, &drops)], |_| Ok(()))
            .expect("second version");
        assert_eq!((change.versions, change.previous), (vec![2], vec![1]));
        assert_eq!(old.len(), 1, "version 1 replaced");
        registry
            .releaser
            .push(old.into_iter().next().expect("version 1"));
        assert_eq!(
            registry
                .snapshot()
                .expect("serving")
                .get("a", None)
                .expect("a")
                .version,
            2
        );
        assert_eq!(
            request.get("a", None).expect("a").version,
            1,
            "the request keeps its version"
        );

        std::thread::sleep(RELEASE_EVERY * 4);
        assert!(
            lock(&drops).is_empty(),
            "version 1 is still held by a request"
        );
        assert_eq!(registry.draining(), 1);
        drop(request);
        let deadline = Instant::now() + Duration::from_secs(10);
        while registry.draining() > 0 && Instant::now() < deadline {
            std::thread::sleep(RELEASE_EVERY);
        }
        assert_eq!(
            *lock(&drops),
            ["model-releaser"],
            "released off the request's thread"
        );
    }

    #[test]
    fn a_refused_switch_leaves_the_serving_snapshot_alone() {
        let drops = Arc::new(Mutex::new(Vec::new()));
        let registry = Registry::<Recorded>::new(Metrics::new());
        registry
            .switch("a", vec![recorded("a", 1, &drops)], |_| Ok(()))
            .expect("first version");
        let refused = registry.switch("a", vec![recorded("a", 2, &drops)], |next| {
            assert_eq!(
                next.get("a", None).expect("a").version,
                2,
                "checked before serving"
            );
            Err("pipeline p no longer fits".to_owned())
        });
        assert_eq!(refused.expect_err("refused"), "pipeline p no longer fits");
        assert_eq!(
            registry
                .snapshot()
                .expect("serving")
                .get("a", None)
                .expect("a")
                .version,
            1
        );
        let (change, removed) = registry
            .switch("a", Vec::new(), |next| {
                assert!(next.get("a", None).is_err());
                Ok(())
            })
            .expect("unloaded");
        assert_eq!((change.versions, change.previous), (vec![], vec![1]));
        assert_eq!(removed.len(), 1);
    }

    #[test]
    fn several_versions_serve_side_by_side_and_the_split_routes_between_them() {
        let drops = Arc::new(Mutex::new(Vec::new()));
        let registry = Registry::<Recorded>::new(Metrics::new());
        registry
            .switch(
                "a",
                vec![recorded("a", 7, &drops), recorded("a", 8, &drops)],
                |_| Ok(()),
            )
            .expect("two versions");
        let route = |key: &str| {
            let s = registry.snapshot().expect("serving");
            let r = s.route("a", None, Some(key.as_bytes())).expect("routed");
            (r.primary.version, r.shadow.map(|m| m.version))
        };
        assert_eq!(route("u1"), (8, None), "no split: the highest");
        registry.set_traffic(
            "a",
            Some(Traffic::new(BTreeMap::from([(7, 1), (8, 0)]), None).expect("split")),
        );
        assert_eq!(route("u1"), (7, None));
        let s = registry.snapshot().expect("serving");
        assert_eq!(
            s.route("a", Some(8), Some(b"u1"))
                .expect("named")
                .primary
                .version,
            8,
            "a version asked for is served whatever the split"
        );
        // Loading a third version and dropping 7 keeps the split, which now routes to what is loaded.
        let (change, old) = registry
            .switch(
                "a",
                vec![
                    Arc::clone(s.get("a", Some(8)).expect("8")),
                    recorded("a", 9, &drops),
                ],
                |_| Ok(()),
            )
            .expect("8 and 9");
        assert_eq!((change.versions, change.previous), (vec![8, 9], vec![7, 8]));
        assert_eq!(
            old.iter().map(|m| m.version).collect::<Vec<_>>(),
            [7],
            "only 7 leaves: 8 is the same version"
        );
        drop(s);
        assert_eq!(route("u1"), (9, None), "7 gone: the highest serves");
        registry.set_traffic("a", None);
        assert_eq!(route("u1"), (9, None));
    }

    #[test]
    fn requests_keep_the_snapshot_they_took() {
        let registry = Registry::<()>::new(Metrics::new());
        assert!(
            registry.snapshot().is_none(),
            "nothing serves before install"
        );
        registry.install(Snapshot::new([served("a", 1)]));
        let taken = registry.snapshot().expect("installed");
        registry.install(Snapshot::new([served("a", 2)]));
        assert_eq!(taken.get("a", None).expect("a").version, 1);
        let now = registry.snapshot().expect("installed");
        assert_eq!(now.get("a", None).expect("a").version, 2);
    }
}
