//! The model repository on disk: `<repository>/<model>/<version>/model.toml`. Finds the models, picks the versions
//! to serve (by each model's [`VersionPolicy`]: the highest, unless configured otherwise), and reads each
//! `model.toml` into a checked [`ModelSpec`].

mod batching;
mod spec;
mod table;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub use batching::{
    BatchingSpec, MAX_BATCH_ROWS, MAX_DEFAULT_DEADLINE_MS, MAX_QUEUE_DELAY_US, check_buckets,
};
pub use spec::{
    CandidateFeature, CooccurrenceSpec, DEFAULT_MAX_CANDIDATES, DenseGraphSpec, FORMAT_VERSION,
    FieldSpec, IndexSpec, ItemFeaturesSpec, ModelKind, ModelSpec, Precision, RankingSpec,
    RecallSpec, Side, SplitSpec, TableEntry,
};
pub use table::{OovPolicy, Storage, TableSpec, Tier, Unfetched};

use crate::error::{Echo, LoadError};

/// Which versions of a model serve, as Triton's version policy says it: the `latest` N present (the default is
/// the highest alone), or the `specific` versions named (each must be present). `--pin MODEL=V` is `specific [V]`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum VersionPolicy {
    Latest(usize),
    Specific(Vec<u64>),
}

impl Default for VersionPolicy {
    fn default() -> VersionPolicy {
        VersionPolicy::Latest(1)
    }
}

impl VersionPolicy {
    /// Checks the policy itself (not the repository): the problem, for the caller to name the key.
    pub fn check(&self) -> Result<(), String> {
        match self {
            VersionPolicy::Latest(0) => Err("latest must be at least 1".to_owned()),
            VersionPolicy::Latest(_) => Ok(()),
            VersionPolicy::Specific(v) if v.is_empty() => {
                Err("specific must name at least one version".to_owned())
            }
            VersionPolicy::Specific(v) if v.contains(&0) => {
                Err("specific: versions start at 1".to_owned())
            }
            VersionPolicy::Specific(_) => Ok(()),
        }
    }

    /// The versions of `available` (ascending) it serves, ascending; the problem when a named one is missing.
    fn pick(&self, available: &[u64]) -> Result<Vec<u64>, String> {
        match self {
            VersionPolicy::Latest(n) => {
                Ok(available[available.len().saturating_sub(*n)..].to_vec())
            }
            VersionPolicy::Specific(wanted) => {
                let mut picked = Vec::with_capacity(wanted.len());
                for v in wanted {
                    if !available.contains(v) {
                        return Err(format!(
                            "version {v} is pinned but not present (present: {available:?})"
                        ));
                    }
                    picked.push(*v);
                }
                picked.sort_unstable();
                picked.dedup();
                Ok(picked)
            }
        }
    }
}

/// One version of a model of the repository, chosen for serving.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelVersion {
    pub name: String,
    pub version: u64,
    /// The version directory.
    pub dir: PathBuf,
    /// Every version present on disk, ascending.
    pub available: Vec<u64>,
}

/// A model name clients can put in a URL: `[A-Za-z0-9_-]+`, at most 128 characters.
pub fn is_valid_model_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `name` is a model directory of the repository at `root` (a valid name with a directory of that name):
/// what a load of a name can leave a trace of, where any other name a client sends must leave none.
pub fn holds(root: &Path, name: &str) -> bool {
    is_valid_model_name(name) && root.join(name).is_dir()
}

/// Lists the models under `root` and picks each one's versions by its policy (default: the highest), in name then
/// version order.
pub fn discover(
    root: &Path,
    policies: &HashMap<String, VersionPolicy>,
) -> Result<Vec<ModelVersion>, LoadError> {
    let entries = std::fs::read_dir(root)
        .map_err(|e| LoadError::new(root, format!("cannot read the model repository: {e}")))?;
    let mut models = BTreeMap::new();
    for entry in entries {
        let entry = entry.map_err(|e| LoadError::new(root, format!("cannot list: {e}")))?;
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || !path.is_dir() {
            continue;
        }
        if !is_valid_model_name(&name) {
            return Err(LoadError::new(
                &path,
                "model directory names may contain only letters, digits, '_' and '-' (at most 128)",
            ));
        }
        let versions = versions_of(&path)?;
        models.insert(name, (path, versions));
    }
    if models.is_empty() {
        return Err(LoadError::new(
            root,
            "holds no model (expected <repository>/<model>/<version>/model.toml)",
        ));
    }
    for pinned in policies.keys() {
        if !models.contains_key(pinned) {
            return Err(LoadError::new(
                root,
                format!(
                    "a version policy (or pin) is set for model {pinned:?}, which is not in the repository"
                ),
            ));
        }
    }
    let mut found = Vec::new();
    for (name, (path, available)) in models {
        found.extend(choose(
            &name,
            &path,
            available,
            policies.get(name.as_str()),
        )?);
    }
    Ok(found)
}

/// The versions of one model of `root` to serve (by `policy`, else the highest), ascending, as [`discover`] picks
/// them.
pub fn discover_model(
    root: &Path,
    name: &str,
    policy: Option<&VersionPolicy>,
) -> Result<Vec<ModelVersion>, LoadError> {
    if !is_valid_model_name(name) {
        return Err(LoadError::new(
            root,
            format!(
                "{:?} is not a model name (letters, digits, '_' and '-', at most 128)",
                Echo(name)
            ),
        ));
    }
    let path = root.join(name);
    if !path.is_dir() {
        return Err(LoadError::new(
            root,
            format!(
                "the repository has no model {name:?} (expected <repository>/{name}/<version>/model.toml)"
            ),
        ));
    }
    let available = versions_of(&path)?;
    choose(name, &path, available, policy)
}

/// The versions of a model directory, ascending; a directory without any is refused.
fn versions_of(model_dir: &Path) -> Result<Vec<u64>, LoadError> {
    let versions = list_versions(model_dir)?;
    if versions.is_empty() {
        return Err(LoadError::new(
            model_dir,
            "has no version directory (expected <model>/<version>/model.toml with an integer version ≥ 1)",
        ));
    }
    Ok(versions)
}

fn choose(
    name: &str,
    path: &Path,
    available: Vec<u64>,
    policy: Option<&VersionPolicy>,
) -> Result<Vec<ModelVersion>, LoadError> {
    let versions = policy
        .unwrap_or(&VersionPolicy::default())
        .pick(&available)
        .map_err(|problem| LoadError::new(path, problem))?;
    if versions.is_empty() {
        return Err(LoadError::new(path, "has no version directory"));
    }
    Ok(versions
        .into_iter()
        .map(|version| ModelVersion {
            dir: path.join(version.to_string()),
            name: name.to_owned(),
            version,
            available: available.clone(),
        })
        .collect())
}

fn list_versions(model_dir: &Path) -> Result<Vec<u64>, LoadError> {
    let entries = std::fs::read_dir(model_dir)
        .map_err(|e| LoadError::new(model_dir, format!("cannot list: {e}")))?;
    let mut versions = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| LoadError::new(model_dir, format!("cannot list: {e}")))?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !entry.path().is_dir() {
            continue;
        }
        // Plain decimal digits only: `+1` or `01` would parse, but the version would be read from another path.
        let plain =
            !name.is_empty() && name.bytes().all(|b| b.is_ascii_digit()) && !name.starts_with('0');
        match name.parse::<u64>() {
            Ok(v) if plain && v >= 1 => versions.push(v),
            // Debug only: a writer's temporary directory (docs/model-repository.md) is seen at every poll.
            _ => tracing::debug!(
                path = %entry.path().display(),
                "ignoring a directory whose name is not a version number"
            ),
        }
    }
    versions.sort_unstable();
    Ok(versions)
}

/// Reads and checks `<dir>/model.toml`.
pub fn read_spec(dir: &Path) -> Result<ModelSpec, LoadError> {
    let path = dir.join("model.toml");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| LoadError::cannot_open(&path, "cannot read", &e))?;
    ModelSpec::parse(&text).map_err(|problem| LoadError::new(&path, problem))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mkdirs(root: &Path, dirs: &[&str]) {
        for d in dirs {
            std::fs::create_dir_all(root.join(d)).expect("mkdir");
        }
    }

    #[test]
    fn serves_the_highest_version_unless_pinned() {
        let root = tempfile::tempdir().expect("tempdir");
        mkdirs(
            root.path(),
            &[
                "a/1",
                "a/2",
                "a/10",
                "a/tmp",
                "a/01",
                "a/+3",
                "a/0",
                "b/3",
                ".hidden/1",
            ],
        );
        std::fs::write(root.path().join("README"), "not a model").expect("write");
        let found = discover(root.path(), &HashMap::new()).expect("discover");
        let summary: Vec<_> = found
            .iter()
            .map(|m| (m.name.as_str(), m.version, m.available.clone()))
            .collect();
        assert_eq!(summary, vec![("a", 10, vec![1, 2, 10]), ("b", 3, vec![3])]);
        assert_eq!(found[0].dir, root.path().join("a/10"));

        let pins = HashMap::from([("a".to_owned(), VersionPolicy::Specific(vec![2]))]);
        let found = discover(root.path(), &pins).expect("discover");
        assert_eq!(found[0].version, 2);
        assert_eq!(found[0].dir, root.path().join("a/2"));
    }

    #[test]
    fn a_version_policy_serves_the_latest_n_or_the_versions_named() {
        let root = tempfile::tempdir().expect("tempdir");
        mkdirs(root.path(), &["a/1", "a/2", "a/10", "b/3"]);
        let versions = |policy: VersionPolicy| -> Vec<(String, u64)> {
            discover(root.path(), &HashMap::from([("a".to_owned(), policy)]))
                .expect("discover")
                .into_iter()
                .map(|m| (m.name, m.version))
                .collect()
        };
        let named = |v: &[(&str, u64)]| -> Vec<(String, u64)> {
            v.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect()
        };
        assert_eq!(
            versions(VersionPolicy::Latest(2)),
            named(&[("a", 2), ("a", 10), ("b", 3)])
        );
        assert_eq!(
            versions(VersionPolicy::Latest(5)),
            named(&[("a", 1), ("a", 2), ("a", 10), ("b", 3)]),
            "more than present: all of them"
        );
        assert_eq!(
            versions(VersionPolicy::Specific(vec![10, 1, 10])),
            named(&[("a", 1), ("a", 10), ("b", 3)])
        );
        let missing = discover(
            root.path(),
            &HashMap::from([("a".to_owned(), VersionPolicy::Specific(vec![1, 4]))]),
        )
        .expect_err("4 is missing");
        assert_eq!(missing.path, root.path().join("a"));
        assert!(
            missing
                .problem
                .contains("version 4 is pinned but not present (present: [1, 2, 10])"),
            "{missing}"
        );
        assert_eq!(
            discover_model(root.path(), "a", Some(&VersionPolicy::Latest(2)))
                .expect("a")
                .iter()
                .map(|m| m.version)
                .collect::<Vec<_>>(),
            [2, 10]
        );
        assert_eq!(
            VersionPolicy::Latest(0).check().expect_err("0"),
            "latest must be at least 1"
        );
        assert!(VersionPolicy::Specific(vec![]).check().is_err());
        assert!(VersionPolicy::Specific(vec![0]).check().is_err());
    }

    #[test]
    fn refuses_bad_layouts_with_the_path() {
        let root = tempfile::tempdir().expect("tempdir");
        let err = discover(root.path(), &HashMap::new()).expect_err("empty");
        assert!(err.problem.contains("holds no model"), "{err}");

        mkdirs(root.path(), &["a/1", "b/notaversion"]);
        let err = discover(root.path(), &HashMap::new()).expect_err("b has no versions");
        assert_eq!(err.path, root.path().join("b"));
        std::fs::remove_dir_all(root.path().join("b")).expect("rm");

        let err = discover(
            root.path(),
            &HashMap::from([("a".to_owned(), VersionPolicy::Specific(vec![7]))]),
        )
        .expect_err("missing pin");
        assert!(
            err.problem.contains("version 7 is pinned but not present"),
            "{err}"
        );
        let err = discover(
            root.path(),
            &HashMap::from([("zz".to_owned(), VersionPolicy::default())]),
        )
        .expect_err("unknown pin");
        assert!(err.problem.contains("\"zz\""), "{err}");

        mkdirs(root.path(), &["bad name/1"]);
        let err = discover(root.path(), &HashMap::new()).expect_err("bad name");
        assert!(err.problem.contains("only letters, digits"), "{err}");
    }

    #[test]
    fn read_spec_names_the_file() {
        let root = tempfile::tempdir().expect("tempdir");
        let err = read_spec(root.path()).expect_err("missing");
        assert_eq!(err.path, root.path().join("model.toml"));
        std::fs::write(
            root.path().join("model.toml"),
            "format_version = 1\nkind = \"xgboost\"\n",
        )
        .expect("write");
        let err = read_spec(root.path()).expect_err("bad kind");
        assert!(err.to_string().contains("model.toml"), "{err}");
        assert!(err.problem.contains("unknown variant `xgboost`"), "{err}");
    }
}
