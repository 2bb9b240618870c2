//! Where the ids in generated requests come from: a Zipf or uniform distribution over a table's rows, or a
//! dataset file of real users and their items (the LightGCN split format: `user item item ...` per line, as in
//! Gowalla's `test.txt`).

use std::path::{Path, PathBuf};

use rand::RngExt;
use rand::rngs::StdRng;
use rand_distr::{Distribution, Zipf};
use serde::{Deserialize, Serialize};

use super::WorkloadError;

/// How ids are drawn from `0..n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum IdDistribution {
    /// Zipf with exponent `--zipf-exponent`: a few ids are hot, most are cold, as categorical features are.
    Zipf,
    /// Every id equally likely.
    Uniform,
}

/// Multiplier that scatters Zipf ranks over the id space: a prime, so `rank × P mod n` is a bijection of `0..n`
/// for every `n` it does not divide. Hashed categorical ids are not ordered by popularity, so hot ids should not
/// be neighbours (which would make the gather unrealistically cache-friendly).
const SCATTER: u128 = 2_654_435_761;

/// Draws ids from `0..n`.
#[derive(Clone, Debug)]
pub struct IdSampler {
    n: u64,
    zipf: Option<Zipf<f64>>,
}

impl IdSampler {
    pub fn new(
        distribution: IdDistribution,
        n: u64,
        exponent: f64,
    ) -> Result<IdSampler, WorkloadError> {
        if n == 0 {
            return Err(WorkloadError::Invalid(
                "cannot draw ids from an empty range (0 rows)".to_owned(),
            ));
        }
        let zipf = match distribution {
            IdDistribution::Uniform => None,
            IdDistribution::Zipf => Some(Zipf::new(n as f64, exponent).map_err(|_| {
                WorkloadError::Invalid(format!(
                    "--zipf-exponent must be a finite number ≥ 0, got {exponent}"
                ))
            })?),
        };
        Ok(IdSampler { n, zipf })
    }

    pub fn sample(&self, rng: &mut StdRng) -> i64 {
        let id = match &self.zipf {
            None => rng.random_range(0..self.n),
            Some(zipf) => {
                // Zipf samples ranks 1..=n as floats.
                let rank = (zipf.sample(rng) as u64).clamp(1, self.n) - 1;
                if (self.n as u128).is_multiple_of(SCATTER) {
                    rank
                } else {
                    ((rank as u128 * SCATTER) % self.n as u128) as u64
                }
            }
        };
        i64::try_from(id).unwrap_or(i64::MAX)
    }
}

/// One line of a dataset file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DatasetUser {
    pub user: i64,
    /// 1-based line number, for messages.
    pub line: usize,
    pub items: Vec<i64>,
}

/// Users and their items, from a file of lines `user item item ...` (whitespace-separated integers).
#[derive(Clone, Debug)]
pub struct Dataset {
    pub path: PathBuf,
    pub users: Vec<DatasetUser>,
    /// Every item occurrence of the file, so that drawing from it is popularity-weighted.
    pub interactions: Vec<i64>,
    /// Indices into `users` of the users with at least one item.
    with_items: Vec<usize>,
}

impl Dataset {
    pub fn load(path: &Path) -> Result<Dataset, WorkloadError> {
        let text = std::fs::read_to_string(path).map_err(|e| WorkloadError::Dataset {
            path: path.to_path_buf(),
            line: 0,
            problem: format!("cannot read: {e}"),
        })?;
        Dataset::parse(path, &text)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Dataset, WorkloadError> {
        let mut users = Vec::new();
        let mut interactions = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let mut ids = line.split_whitespace().map(|word| {
                word.parse::<i64>().map_err(|_| WorkloadError::Dataset {
                    path: path.to_path_buf(),
                    line: i + 1,
                    problem: format!("{word:?} is not an integer id"),
                })
            });
            let Some(user) = ids.next() else { continue };
            let items = ids.collect::<Result<Vec<i64>, _>>()?;
            interactions.extend_from_slice(&items);
            users.push(DatasetUser {
                user: user?,
                line: i + 1,
                items,
            });
        }
        if users.is_empty() {
            return Err(WorkloadError::Dataset {
                path: path.to_path_buf(),
                line: 0,
                problem: "holds no user (expected lines of `user item item ...`)".to_owned(),
            });
        }
        let with_items = (0..users.len())
            .filter(|&i| !users[i].items.is_empty())
            .collect();
        Ok(Dataset {
            path: path.to_path_buf(),
            users,
            interactions,
            with_items,
        })
    }

    /// A user drawn uniformly.
    pub fn user(&self, rng: &mut StdRng) -> &DatasetUser {
        &self.users[rng.random_range(0..self.users.len())]
    }

    /// A user drawn uniformly among those with at least one item, or `None` when no user has items.
    pub fn user_with_items(&self, rng: &mut StdRng) -> Option<&DatasetUser> {
        (!self.with_items.is_empty())
            .then(|| &self.users[self.with_items[rng.random_range(0..self.with_items.len())]])
    }

    /// An item drawn in proportion to its number of interactions, or `None` when the file has no items.
    pub fn item(&self, rng: &mut StdRng) -> Option<i64> {
        (!self.interactions.is_empty())
            .then(|| self.interactions[rng.random_range(0..self.interactions.len())])
    }

    /// The first user whose id is outside `0..rows`, if any.
    pub fn user_outside(&self, rows: u64) -> Option<&DatasetUser> {
        self.users
            .iter()
            .find(|u| u64::try_from(u.user).map_or(true, |id| id >= rows))
    }

    /// Largest user id plus one, and largest item id plus one.
    pub fn extents(&self) -> (u64, u64) {
        let users = self.users.iter().map(|u| u.user).max().unwrap_or(-1);
        let items = self.interactions.iter().copied().max().unwrap_or(-1);
        ((users + 1).max(0) as u64, (items + 1).max(0) as u64)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use rand::SeedableRng;

    use super::*;

    #[test]
    fn zipf_ids_stay_in_range_and_hot_ids_are_scattered() {
        let sampler = IdSampler::new(IdDistribution::Zipf, 1000, 1.05).expect("valid");
        let mut rng = StdRng::seed_from_u64(1);
        let mut counts: HashMap<i64, u32> = HashMap::new();
        for _ in 0..100_000 {
            let id = sampler.sample(&mut rng);
            assert!((0..1000).contains(&id), "{id}");
            *counts.entry(id).or_default() += 1;
        }
        let mut by_count: Vec<(i64, u32)> = counts.into_iter().collect();
        by_count.sort_by_key(|&(_, n)| std::cmp::Reverse(n));
        // Rank 1 of Zipf(1000, 1.05) has probability ≈ 0.14; the uniform one would be 0.001.
        assert!(
            by_count[0].1 > 10_000,
            "hottest id drawn {} times",
            by_count[0].1
        );
        // Rank 1 maps to id 0, rank 2 to SCATTER mod 1000 = 761: the two hottest ids are not neighbours.
        assert_eq!(by_count[0].0, 0);
        assert_eq!(by_count[1].0, 761);
    }

    #[test]
    fn uniform_ids_cover_the_range() {
        let sampler = IdSampler::new(IdDistribution::Uniform, 10, 0.0).expect("valid");
        let mut rng = StdRng::seed_from_u64(2);
        let mut seen = [false; 10];
        for _ in 0..1000 {
            seen[sampler.sample(&mut rng) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
        assert!(IdSampler::new(IdDistribution::Uniform, 0, 1.0).is_err());
        assert!(IdSampler::new(IdDistribution::Zipf, 10, -1.0).is_err());
    }

    #[test]
    fn dataset_files_parse_with_line_numbers_in_errors() {
        let path = Path::new("users.txt");
        let d = Dataset::parse(path, "0 5 6 7\n\n1 9\n2\n").expect("valid");
        assert_eq!(d.users.len(), 3);
        assert_eq!(
            d.users[1],
            DatasetUser {
                user: 1,
                line: 3,
                items: vec![9]
            }
        );
        assert_eq!(d.interactions, vec![5, 6, 7, 9]);
        assert_eq!(d.extents(), (3, 10));
        assert_eq!(d.user_outside(3), None);
        assert_eq!(d.user_outside(2).map(|u| u.user), Some(2));

        let err = Dataset::parse(path, "0 1\n1 x\n").expect_err("bad id");
        assert_eq!(
            err.to_string(),
            "dataset users.txt, line 2: \"x\" is not an integer id"
        );
        let err = Dataset::parse(path, "\n\n").expect_err("empty");
        assert!(err.to_string().contains("holds no user"), "{err}");
    }
}
