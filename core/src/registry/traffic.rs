//! How a model's requests are shared between its loaded versions: a weighted [`Traffic`] split, sticky by a
//! request key, and an optional shadow version that scores a copy of a share of the requests and whose answers are
//! thrown away.
//!
//! Routing is a pure function of the key: the key's 64-bit hash, reduced to a point of `[0, total weight)`, falls
//! in one version's range, the ranges laid out in ascending version order. The same key therefore always lands on
//! the same version while the split holds, and a changed split moves only the keys whose points changed ranges
//! (going from 90/10 to 80/20 moves one key in ten, from the first version to the second). A request without a
//! key gets a point from a per-split counter scrambled the same way, so shares still hold, without stickiness.
//! Versions the split names that are not loaded take no traffic: the loaded ones share the line by their weights;
//! with none of them loaded, the highest loaded version takes every request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Largest weight of one version (weights are relative: 90/10 and 9/1 split alike).
pub const MAX_WEIGHT: u32 = 1_000_000;

/// A split of a model's requests between its versions, and a shadow.
#[derive(Debug, Default)]
pub struct Traffic {
    /// Version → weight; no entry: the highest loaded version takes every request.
    pub split: BTreeMap<u64, u32>,
    pub shadow: Option<Shadow>,
    /// Points for requests without a key.
    counter: AtomicU64,
}

/// A version that scores a copy of `percent` of the model's requests (sticky by key as the split is), its answers
/// discarded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shadow {
    pub version: u64,
    pub percent: f64,
}

impl Clone for Traffic {
    fn clone(&self) -> Traffic {
        Traffic {
            split: self.split.clone(),
            shadow: self.shadow,
            counter: AtomicU64::new(0),
        }
    }
}

impl PartialEq for Traffic {
    fn eq(&self, other: &Traffic) -> bool {
        self.split == other.split && self.shadow == other.shadow
    }
}

/// Where one request goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    pub version: u64,
    /// The shadow version that also scores it, when it takes this request.
    pub shadow: Option<u64>,
}

impl Traffic {
    pub fn new(split: BTreeMap<u64, u32>, shadow: Option<Shadow>) -> Result<Traffic, String> {
        let traffic = Traffic {
            split,
            shadow,
            counter: AtomicU64::new(0),
        };
        traffic.check()?;
        Ok(traffic)
    }

    /// The split's own rules (not which versions are loaded): the problem, for the caller to name where it is set.
    pub fn check(&self) -> Result<(), String> {
        for (&version, &weight) in &self.split {
            if version == 0 {
                return Err("versions start at 1".to_owned());
            }
            if weight > MAX_WEIGHT {
                return Err(format!(
                    "version {version}: weight {weight} is above {MAX_WEIGHT}"
                ));
            }
        }
        if !self.split.is_empty() && self.split.values().all(|&w| w == 0) {
            return Err("every weight is 0: at least one version must take traffic".to_owned());
        }
        if let Some(shadow) = &self.shadow {
            if shadow.version == 0 {
                return Err("shadow: versions start at 1".to_owned());
            }
            if !(shadow.percent > 0.0 && shadow.percent <= 100.0) {
                return Err(format!(
                    "shadow: percent {} is not in (0, 100]",
                    shadow.percent
                ));
            }
            if self.split.get(&shadow.version).is_some_and(|&w| w > 0) {
                return Err(format!(
                    "shadow: version {} takes traffic in the split; a shadow's answers are thrown away",
                    shadow.version
                ));
            }
        }
        Ok(())
    }

    /// Where a request with `key` goes, among the `loaded` versions (the registry's map of them, not empty).
    pub fn route<V>(&self, loaded: &BTreeMap<u64, V>, key: Option<&[u8]>) -> Route {
        let highest = *loaded
            .keys()
            .next_back()
            .expect("a served model has a version");
        let point = match key {
            Some(key) => hash(key),
            None => mix(self.counter.fetch_add(1, Ordering::Relaxed)),
        };
        let version = self.pick(loaded, point).unwrap_or(highest);
        let shadow = self.shadow.and_then(|s| {
            // The shadow's draw uses the hash's other half, so it is independent of the version's.
            let draw = (point >> 32) as f64 / (1u64 << 32) as f64;
            (loaded.contains_key(&s.version) && s.version != version && draw * 100.0 < s.percent)
                .then_some(s.version)
        });
        Route { version, shadow }
    }

    /// The version whose range holds `point`, among the loaded ones with weight; `None` when none is loaded.
    fn pick<V>(&self, loaded: &BTreeMap<u64, V>, point: u64) -> Option<u64> {
        let live = || {
            self.split
                .iter()
                .filter(|&(v, &w)| w > 0 && loaded.contains_key(v))
        };
        let total: u64 = live().map(|(_, &w)| u64::from(w)).sum();
        if total == 0 {
            return None;
        }
        // The low 32 bits scaled to [0, total): fair to within 2^-32 of each weight.
        let mut at = ((point & 0xffff_ffff) * total) >> 32;
        for (&version, &weight) in live() {
            if at < u64::from(weight) {
                return Some(version);
            }
            at -= u64::from(weight);
        }
        unreachable!("the point lies below the total weight")
    }
}

/// A key's point: FNV-1a over its bytes, then a finalizer so that keys differing only in their last bytes (user ids
/// `"1"`, `"2"`, ...) spread over the whole range.
pub fn hash(key: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in key {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h)
}

/// SplitMix64's finalizer.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The registry's map of loaded versions, for `versions`.
    fn loaded(versions: &[u64]) -> BTreeMap<u64, ()> {
        versions.iter().map(|&v| (v, ())).collect()
    }

    fn split(pairs: &[(u64, u32)]) -> Traffic {
        Traffic::new(pairs.iter().copied().collect(), None).expect("valid")
    }

    #[test]
    fn no_split_sends_everything_to_the_highest_loaded_version() {
        let t = Traffic::default();
        for i in 0..100 {
            let key = i.to_string();
            assert_eq!(t.route(&loaded(&[3, 7]), Some(key.as_bytes())).version, 7);
        }
        assert_eq!(t.route(&loaded(&[3, 7]), None).version, 7);
    }

    #[test]
    fn a_split_lands_within_its_weights_and_each_key_stays_on_its_version() {
        let t = split(&[(7, 90), (8, 10)]);
        let n = 100_000;
        let mut on_8 = 0;
        for user in 0..n {
            let key = user.to_string();
            let route = t.route(&loaded(&[7, 8]), Some(key.as_bytes()));
            if route.version == 8 {
                on_8 += 1;
            }
            assert_eq!(
                t.route(&loaded(&[7, 8]), Some(key.as_bytes())),
                route,
                "user {user} is sticky"
            );
        }
        // Binomial(100000, 0.1): sd ≈ 95, so ±1000 is more than 10 sd.
        assert!(
            (9_000..=11_000).contains(&on_8),
            "{on_8} of {n} on version 8"
        );
        let keyless = (0..n)
            .filter(|_| t.route(&loaded(&[7, 8]), None).version == 8)
            .count();
        assert!(
            (9_000..=11_000).contains(&keyless),
            "{keyless} of {n} keyless on version 8"
        );
    }

    #[test]
    fn a_changed_split_moves_only_the_keys_whose_range_changed() {
        let before = split(&[(7, 90), (8, 10)]);
        let after = split(&[(7, 80), (8, 20)]);
        let mut moved_back = 0;
        let mut moved = 0;
        for user in 0..20_000 {
            let key = user.to_string();
            let (b, a) = (
                before.route(&loaded(&[7, 8]), Some(key.as_bytes())).version,
                after.route(&loaded(&[7, 8]), Some(key.as_bytes())).version,
            );
            if b == 8 && a == 7 {
                moved_back += 1;
            }
            if b != a {
                moved += 1;
            }
        }
        assert_eq!(moved_back, 0, "no user of version 8 goes back to 7");
        assert!((1_700..=2_300).contains(&moved), "{moved} of 20000 moved");
    }

    #[test]
    fn versions_not_loaded_take_no_traffic_and_without_any_the_highest_serves() {
        let t = split(&[(7, 50), (8, 50)]);
        for user in 0..1000 {
            let key = user.to_string();
            assert_eq!(t.route(&loaded(&[8, 9]), Some(key.as_bytes())).version, 8);
        }
        let t = split(&[(5, 100)]);
        assert_eq!(t.route(&loaded(&[8, 9]), Some(b"u")).version, 9);
    }

    #[test]
    fn the_shadow_takes_its_percent_of_the_requests_sticky_and_only_when_loaded() {
        let t = Traffic::new(
            BTreeMap::from([(7, 1)]),
            Some(Shadow {
                version: 9,
                percent: 25.0,
            }),
        )
        .expect("valid");
        let shadowed = (0..40_000)
            .filter(|user: &i32| {
                let key = user.to_string();
                let route = t.route(&loaded(&[7, 9]), Some(key.as_bytes()));
                assert_eq!(route.version, 7);
                assert_eq!(t.route(&loaded(&[7, 9]), Some(key.as_bytes())), route);
                route.shadow == Some(9)
            })
            .count();
        assert!((9_000..=11_000).contains(&shadowed), "{shadowed} of 40000");
        assert_eq!(
            t.route(&loaded(&[7]), Some(b"u")).shadow,
            None,
            "9 is not loaded"
        );
    }

    #[test]
    fn bad_splits_name_the_problem() {
        let bad = |pairs: &[(u64, u32)], shadow: Option<Shadow>| {
            Traffic::new(pairs.iter().copied().collect(), shadow).expect_err("refused")
        };
        assert_eq!(bad(&[(0, 1)], None), "versions start at 1");
        assert_eq!(
            bad(&[(1, 0), (2, 0)], None),
            "every weight is 0: at least one version must take traffic"
        );
        assert!(bad(&[(1, MAX_WEIGHT + 1)], None).contains("is above"));
        let shadow = |version, percent| Some(Shadow { version, percent });
        assert_eq!(
            bad(&[(1, 1)], shadow(2, 0.0)),
            "shadow: percent 0 is not in (0, 100]"
        );
        assert!(bad(&[(1, 1)], shadow(2, f64::NAN)).contains("is not in"));
        assert!(bad(&[(1, 1)], shadow(1, 10.0)).contains("takes traffic in the split"));
    }
}
