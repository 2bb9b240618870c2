//! `[models.NAME]` of the config file: which versions of a model serve (its version policy), how its requests are
//! split between them, and a shadow version. Only in the file: each is a table, not a flag. The split and the
//! shadow can be changed while serving through the repository API (`/v2/repository/models/NAME/traffic`).

use std::collections::{BTreeMap, HashMap};

use serde::{Deserialize, Serialize};

use super::ConfigError;
use recserve_core::registry::{Shadow, Traffic};
use recserve_core::repository::{VersionPolicy, is_valid_model_name};

/// One model's `[models.NAME]`.
#[derive(Clone, Debug, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// `{ latest = N }` or `{ specific = [V, ...] }`; default `{ latest = 1 }`, the highest version alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<VersionPolicy>,
    /// `[models.NAME.traffic]`: version = weight (TOML keys are strings: `7 = 90`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub traffic: BTreeMap<String, u32>,
    /// `shadow = { version = V, percent = P }`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shadow: Option<ShadowSettings>,
}

/// A shadow version, as the file spells it.
#[derive(Clone, Copy, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ShadowSettings {
    pub version: u64,
    pub percent: f64,
}

// `percent` is checked to be a number in (0, 100] (never NaN).
impl Eq for ShadowSettings {}
impl Eq for ModelSettings {}

impl ModelSettings {
    /// The traffic split and shadow it sets, if any (checked by [`check`], which parsed them the same way: `None`
    /// for settings it would have refused).
    pub(crate) fn traffic(&self) -> Option<Traffic> {
        if self.traffic.is_empty() && self.shadow.is_none() {
            return None;
        }
        let split = split_of(&self.traffic).ok()?;
        Traffic::new(
            split,
            self.shadow.map(|s| Shadow {
                version: s.version,
                percent: s.percent,
            }),
        )
        .ok()
    }
}

/// Parses a split's versions, as the file and the repository API spell them (strings); a key that is not a
/// version comes back with the problem.
pub(crate) fn split_of(
    weights: &BTreeMap<String, u32>,
) -> Result<BTreeMap<u64, u32>, (String, String)> {
    weights
        .iter()
        .map(|(v, &w)| match v.parse::<u64>() {
            // Plain digits only, as version directories are named: `07` or `+7` would name another directory.
            Ok(n) if n >= 1 && n.to_string() == *v => Ok((n, w)),
            _ => Err((
                v.clone(),
                format!("{v:?} is not a version (an integer ≥ 1)"),
            )),
        })
        .collect()
}

/// Checks every `[models.NAME]` and merges the version policies with `--pin` (a pin is `specific = [V]`; a model
/// may not have both).
pub(super) fn check(
    models: &BTreeMap<String, ModelSettings>,
    pins: &HashMap<String, u64>,
) -> Result<HashMap<String, VersionPolicy>, ConfigError> {
    let mut policies: HashMap<String, VersionPolicy> = pins
        .iter()
        .map(|(m, v)| (m.clone(), VersionPolicy::Specific(vec![*v])))
        .collect();
    for (name, settings) in models {
        let fail = |key: &str, problem: String| {
            let at = if key.is_empty() {
                format!("[models.{name}]")
            } else {
                format!("models.{name}.{key}")
            };
            ConfigError(format!("--config {at}: {problem}"))
        };
        if !is_valid_model_name(name) {
            return Err(fail(
                "",
                "model names may contain only letters, digits, '_' and '-' (at most 128)"
                    .to_owned(),
            ));
        }
        if let Some(policy) = &settings.versions {
            policy.check().map_err(|p| fail("versions", p))?;
            if pins.contains_key(name) {
                return Err(fail(
                    "versions",
                    "the model is also pinned (--pin / [pin]): give one or the other".to_owned(),
                ));
            }
            policies.insert(name.clone(), policy.clone());
        }
        let split = split_of(&settings.traffic).map_err(|(_, p)| fail("traffic", p))?;
        let shadow = settings.shadow.map(|s| Shadow {
            version: s.version,
            percent: s.percent,
        });
        Traffic::new(split.clone(), shadow).map_err(|p| {
            let key = if p.starts_with("shadow") {
                ""
            } else {
                "traffic"
            };
            fail(key, p)
        })?;
        // A version the policy can never load would take no traffic: most likely a typo.
        let named = split.keys().chain(shadow.as_ref().map(|s| &s.version));
        let served = policies.get(name);
        for v in named {
            if let Some(VersionPolicy::Specific(versions)) = served
                && !versions.contains(v)
            {
                return Err(fail(
                    "",
                    format!(
                        "the traffic split or shadow names version {v}, which the model's versions \
                         ({versions:?}) do not serve"
                    ),
                ));
            }
        }
        if (!split.is_empty() || shadow.is_some())
            && matches!(served, None | Some(VersionPolicy::Latest(1)))
        {
            return Err(fail(
                "",
                "a traffic split or shadow needs several versions serving: set versions = { latest = N } or \
                 { specific = [...] }"
                    .to_owned(),
            ));
        }
    }
    Ok(policies)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(toml_text: &str) -> BTreeMap<String, ModelSettings> {
        #[derive(Deserialize)]
        struct File {
            models: BTreeMap<String, ModelSettings>,
        }
        toml::from_str::<File>(toml_text).expect("parses").models
    }

    #[test]
    fn a_models_table_sets_its_policy_split_and_shadow() {
        let models = settings(
            "[models.deepfm]\nversions = { specific = [7, 8, 9] }\nshadow = { version = 9, percent = 5 }\n\
             [models.deepfm.traffic]\n7 = 90\n8 = 10\n[models.lightgcn]\nversions = { latest = 2 }\n",
        );
        let policies = check(&models, &HashMap::new()).expect("valid");
        assert_eq!(policies["deepfm"], VersionPolicy::Specific(vec![7, 8, 9]));
        assert_eq!(policies["lightgcn"], VersionPolicy::Latest(2));
        let traffic = models["deepfm"].traffic().expect("a split");
        assert_eq!(traffic.split, BTreeMap::from([(7, 90), (8, 10)]));
        assert_eq!(
            traffic.shadow,
            Some(Shadow {
                version: 9,
                percent: 5.0
            })
        );
        assert!(models["lightgcn"].traffic().is_none());
        let pinned = check(&BTreeMap::new(), &HashMap::from([("a".to_owned(), 3)])).expect("pin");
        assert_eq!(pinned["a"], VersionPolicy::Specific(vec![3]));
    }

    #[test]
    fn bad_models_tables_name_the_key_and_the_problem() {
        let bad = |text: &str| {
            check(&settings(text), &HashMap::from([("pinned".to_owned(), 2)]))
                .expect_err("refused")
                .to_string()
        };
        assert_eq!(
            bad("[models.a]\nversions = { latest = 0 }\n"),
            "--config models.a.versions: latest must be at least 1"
        );
        assert_eq!(
            bad("[models.pinned]\nversions = { latest = 2 }\n"),
            "--config models.pinned.versions: the model is also pinned (--pin / [pin]): give one or the other"
        );
        assert_eq!(
            bad("[models.a]\nversions = { latest = 2 }\n[models.a.traffic]\nx = 1\n"),
            "--config models.a.traffic: \"x\" is not a version (an integer ≥ 1)"
        );
        assert_eq!(
            bad("[models.a]\nversions = { latest = 2 }\n[models.a.traffic]\n1 = 0\n2 = 0\n"),
            "--config models.a.traffic: every weight is 0: at least one version must take traffic"
        );
        assert!(
            bad("[models.a]\nversions = { specific = [1, 2] }\n[models.a.traffic]\n3 = 1\n")
                .contains("names version 3, which the model's versions ([1, 2]) do not serve")
        );
        assert!(
            bad("[models.a.traffic]\n1 = 1\n2 = 1\n").contains("needs several versions serving")
        );
        assert!(
            bad("[models.a]\nversions = { latest = 2 }\nshadow = { version = 2, percent = 101 }\n")
                .contains("--config [models.a]: shadow: percent 101 is not in (0, 100]")
        );
        assert!(
            toml::from_str::<toml::Table>("[models.a]\nversion = 1\n")
                .ok()
                .and_then(|t| t["models"]
                    .clone()
                    .try_into::<BTreeMap<String, ModelSettings>>()
                    .err())
                .is_some_and(|e| e.to_string().contains("unknown field `version`")),
            "a misspelt key is refused"
        );
    }
}
