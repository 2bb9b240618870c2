//! Checking that servers compute the same thing before comparing their speed: send sample ranking requests one at
//! a time, keep the scores (`--save`, schema `recload.scores/v1`), or send the saved requests to another server and
//! compare its scores with the saved ones within an absolute tolerance (`--expect`). And checking every answer of
//! a run against saved scores ([`AnswerCheck`], `recload run --check-scores`).

use std::sync::Mutex;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::target::{Failure, Target, TargetInfo};
use crate::workload::Request;

pub const SCORES_SCHEMA: &str = "recload.scores/v1";

/// Requests and the scores one server gave them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScoresFile {
    pub schema: String,
    pub target: TargetInfo,
    /// The request path (the API's, before any envelope), e.g. `/v1/models/deepfm-int8/rank`.
    pub path: String,
    pub samples: Vec<Sample>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    /// The request body, as JSON.
    pub request: Value,
    /// One score per candidate, in request order.
    pub scores: Vec<f32>,
}

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error("sample {sample}: the request failed: {failure}")]
    Request { sample: usize, failure: Failure },
    #[error("sample {sample}: {problem}")]
    Answer { sample: usize, problem: String },
    #[error(
        "sample {sample}, candidate {candidate}: score {got} differs from the expected {expected} by {diff:e}, more \
         than the tolerance {tolerance:e}"
    )]
    Mismatch {
        sample: usize,
        candidate: usize,
        expected: f32,
        got: f32,
        diff: f64,
        tolerance: f64,
    },
    #[error("the scores file is not a {SCORES_SCHEMA} document: {0}")]
    File(String),
}

/// How close two servers' scores were.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Agreement {
    pub samples: usize,
    pub scores: usize,
    /// Largest absolute difference.
    pub worst: f64,
}

fn candidates_of(body: &[u8]) -> Option<usize> {
    crate::workload::RankBody::parse(body)
        .ok()
        .map(|b| b.candidates)
}

/// Sends `requests` one after the other on one connection and returns each one's scores.
pub async fn collect<T: Target>(
    target: &T,
    requests: &[Request],
) -> Result<Vec<Vec<f32>>, CheckError> {
    let mut conn = None;
    let mut all = Vec::with_capacity(requests.len());
    for (sample, request) in requests.iter().enumerate() {
        let prepared = target.prepare(request);
        let c = match conn.take() {
            Some(c) if target.is_open(&c) => conn.insert(c),
            _ => conn.insert(
                target
                    .connect()
                    .await
                    .map_err(|failure| CheckError::Request { sample, failure })?,
            ),
        };
        let answer = target
            .send(c, &prepared)
            .await
            .map_err(|failure| CheckError::Request { sample, failure })?;
        let scores = target
            .rank_scores(&answer)
            .map_err(|problem| CheckError::Answer { sample, problem })?;
        if let Some(n) = candidates_of(&request.body)
            && n != scores.len()
        {
            return Err(CheckError::Answer {
                sample,
                problem: format!("{} scores for {n} candidates", scores.len()),
            });
        }
        all.push(scores);
    }
    Ok(all)
}

impl ScoresFile {
    pub fn new(target: TargetInfo, requests: &[Request], scores: Vec<Vec<f32>>) -> ScoresFile {
        ScoresFile {
            schema: SCORES_SCHEMA.to_owned(),
            target,
            path: requests.first().map(|r| r.path.clone()).unwrap_or_default(),
            samples: requests
                .iter()
                .zip(scores)
                .map(|(r, scores)| Sample {
                    request: serde_json::from_slice(&r.body).unwrap_or(Value::Null),
                    scores,
                })
                .collect(),
        }
    }

    pub fn parse(text: &str) -> Result<ScoresFile, CheckError> {
        let file: ScoresFile =
            serde_json::from_str(text).map_err(|e| CheckError::File(e.to_string()))?;
        if file.schema != SCORES_SCHEMA {
            return Err(CheckError::File(format!("schema is {:?}", file.schema)));
        }
        Ok(file)
    }

    /// The saved requests, to send again.
    pub fn requests(&self) -> Vec<Request> {
        self.samples
            .iter()
            .map(|s| Request {
                path: self.path.clone(),
                body: Bytes::from(serde_json::to_vec(&s.request).expect("JSON values serialize")),
            })
            .collect()
    }

    /// Compares `got` (one score list per sample) with the saved scores.
    pub fn compare(&self, got: &[Vec<f32>], tolerance: f64) -> Result<Agreement, CheckError> {
        let mut agreement = Agreement {
            samples: 0,
            scores: 0,
            worst: 0.0,
        };
        for (sample, (expected, got)) in self.samples.iter().zip(got).enumerate() {
            if expected.scores.len() != got.len() {
                return Err(CheckError::Answer {
                    sample,
                    problem: format!(
                        "{} scores, but {} were saved",
                        got.len(),
                        expected.scores.len()
                    ),
                });
            }
            for (candidate, (&e, &g)) in expected.scores.iter().zip(got).enumerate() {
                let diff = (f64::from(e) - f64::from(g)).abs();
                // A NaN score (or expected score) is a mismatch.
                if diff.is_nan() || diff > tolerance {
                    return Err(CheckError::Mismatch {
                        sample,
                        candidate,
                        expected: e,
                        got: g,
                        diff,
                        tolerance,
                    });
                }
                agreement.worst = agreement.worst.max(diff);
                agreement.scores += 1;
            }
            agreement.samples += 1;
        }
        if agreement.samples != self.samples.len() {
            return Err(CheckError::Answer {
                sample: agreement.samples,
                problem: "no answer".to_owned(),
            });
        }
        Ok(agreement)
    }
}

/// Every answer of a run checked against the scores saved in one or more files for the run's own pool of requests
/// (`recload run --check-scores A,B`): each candidate's score must be, within the tolerance, its score in one of the
/// files. With files saved from the model's rows before (A) and after (B) an update of one table, a candidate
/// whose row was read whole, old or new, matches one of them; a row read partly old and partly new matches neither
/// (and neither does a default row read in place of an unfetched one).
#[derive(Debug)]
pub struct AnswerCheck {
    /// Per file, per request of the pool, the saved scores.
    files: Vec<Vec<Vec<f32>>>,
    tolerance: f64,
    counts: Mutex<AnswerCounts>,
}

/// What [`AnswerCheck`] found (the run report's `score_check`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AnswerCounts {
    /// Answers checked (warm-up included).
    pub answers: u64,
    /// Their candidates.
    pub candidates: u64,
    /// Candidates whose score was the one of file `i` (the first that matched).
    pub matched: Vec<u64>,
    /// Candidates whose score matched no file, and the answers that held any.
    pub mismatched: u64,
    pub answers_mismatched: u64,
    /// Answers whose scores could not be read, or held another number of scores than the request's candidates.
    pub unreadable: u64,
    /// Largest absolute difference of a matched score from the file it matched.
    pub worst_match: f64,
    /// The first mismatch, described.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_mismatch: Option<String>,
}

impl AnswerCheck {
    /// `files` must each hold `pool`'s requests, in order (saved by `recload check --save --samples N` with the
    /// run's workload flags, `--seed` and `--pool N`).
    pub fn new(
        files: &[(String, ScoresFile)],
        pool: &[Request],
        tolerance: f64,
    ) -> Result<AnswerCheck, CheckError> {
        let mut saved = Vec::with_capacity(files.len());
        for (name, file) in files {
            let mismatch = |problem: String| {
                CheckError::File(format!(
                    "{name}: {problem}; save it with `recload check --save` and this run's workload flags, --seed \
                     and --samples equal to --pool"
                ))
            };
            if file.samples.len() != pool.len() {
                return Err(mismatch(format!(
                    "it holds {} requests, the run's pool {}",
                    file.samples.len(),
                    pool.len()
                )));
            }
            for (i, (sample, request)) in file.samples.iter().zip(pool).enumerate() {
                let body: Value = serde_json::from_slice(&request.body).unwrap_or(Value::Null);
                if request.path != file.path || sample.request != body {
                    return Err(mismatch(format!(
                        "request {i} is not the run's request {i}"
                    )));
                }
            }
            saved.push(file.samples.iter().map(|s| s.scores.clone()).collect());
        }
        Ok(AnswerCheck {
            counts: Mutex::new(AnswerCounts {
                matched: vec![0; files.len()],
                ..AnswerCounts::default()
            }),
            files: saved,
            tolerance,
        })
    }

    /// Checks the answer to request `index` of the pool, given its scores (or why they could not be read).
    pub fn check(&self, index: usize, scores: Result<Vec<f32>, String>) {
        let mut c = self
            .counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        c.answers += 1;
        let scores = match scores {
            Ok(s) if self.files.iter().all(|f| f[index].len() == s.len()) => s,
            _ => {
                c.unreadable += 1;
                return;
            }
        };
        let mut mismatched = false;
        for (candidate, &got) in scores.iter().enumerate() {
            c.candidates += 1;
            let matched = self.files.iter().enumerate().find_map(|(i, f)| {
                let diff = (f64::from(f[index][candidate]) - f64::from(got)).abs();
                (diff <= self.tolerance).then_some((i, diff))
            });
            match matched {
                Some((i, diff)) => {
                    c.matched[i] += 1;
                    c.worst_match = c.worst_match.max(diff);
                }
                None => {
                    c.mismatched += 1;
                    mismatched = true;
                    if c.first_mismatch.is_none() {
                        let saved: Vec<f32> =
                            self.files.iter().map(|f| f[index][candidate]).collect();
                        c.first_mismatch = Some(format!(
                            "request {index}, candidate {candidate}: score {got}, saved {saved:?}"
                        ));
                    }
                }
            }
        }
        if mismatched {
            c.answers_mismatched += 1;
        }
    }

    pub fn counts(&self) -> AnswerCounts {
        self.counts
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file() -> ScoresFile {
        let requests = vec![
            Request {
                path: "/v1/models/m/rank".to_owned(),
                body: Bytes::from_static(
                    br#"{"candidates":[{"id":1},{"id":2}],"user":{"fields":{"a":1}}}"#,
                ),
            },
            Request {
                path: "/v1/models/m/rank".to_owned(),
                body: Bytes::from_static(br#"{"candidates":[{"id":3}],"user":{"fields":{"a":2}}}"#),
            },
        ];
        ScoresFile::new(
            TargetInfo {
                url: "http://a".to_owned(),
                protocol: "http-json".to_owned(),
                v2_model: None,
            },
            &requests,
            vec![vec![0.5, 0.25], vec![0.75]],
        )
    }

    #[test]
    fn saved_requests_round_trip_byte_for_byte() {
        let f = file();
        let text = serde_json::to_string(&f).expect("serializes");
        let back = ScoresFile::parse(&text).expect("parses");
        assert_eq!(back, f);
        let requests = back.requests();
        assert_eq!(
            &requests[0].body[..],
            br#"{"candidates":[{"id":1},{"id":2}],"user":{"fields":{"a":1}}}"#
        );
        assert_eq!(requests[1].path, "/v1/models/m/rank");
        assert!(
            ScoresFile::parse(
                r#"{"schema":"x","target":{"url":"","protocol":""},"path":"","samples":[]}"#
            )
            .is_err()
        );
    }

    #[test]
    fn scores_agree_within_the_tolerance_and_the_first_difference_is_named() {
        let f = file();
        let a = f
            .compare(&[vec![0.5, 0.250_005], vec![0.75]], 1e-5)
            .expect("within 1e-5");
        assert_eq!((a.samples, a.scores), (2, 3));
        assert!((a.worst - 5e-6).abs() < 1e-7, "{a:?}");

        let err = f
            .compare(&[vec![0.5, 0.25], vec![0.7501]], 1e-5)
            .expect_err("too far");
        assert!(
            err.to_string()
                .starts_with("sample 1, candidate 0: score 0.7501 differs from the expected 0.75"),
            "{err}"
        );
        let err = f
            .compare(&[vec![0.5, f32::NAN], vec![0.75]], 1e-5)
            .expect_err("NaN");
        assert!(
            matches!(err, CheckError::Mismatch { candidate: 1, .. }),
            "{err}"
        );
        let err = f
            .compare(&[vec![0.5], vec![0.75]], 1e-5)
            .expect_err("length");
        assert!(
            err.to_string().contains("1 scores, but 2 were saved"),
            "{err}"
        );
        let err = f.compare(&[vec![0.5, 0.25]], 1e-5).expect_err("missing");
        assert!(err.to_string().contains("no answer"), "{err}");
    }

    #[test]
    fn answers_match_either_file_per_candidate_and_anything_else_is_counted() {
        let before = file();
        let mut after = file();
        after.samples[0].scores = vec![-0.5, -0.25];
        let pool = before.requests();
        let check = AnswerCheck::new(
            &[
                ("before".to_owned(), before.clone()),
                ("after".to_owned(), after),
            ],
            &pool,
            1e-6,
        )
        .expect("the files hold the pool");
        check.check(0, Ok(vec![0.5, -0.25])); // each candidate whole, one old, one new
        check.check(1, Ok(vec![0.75 + 5e-7]));
        check.check(0, Ok(vec![0.1, 0.25])); // candidate 0 neither
        check.check(1, Ok(vec![0.75, 0.75])); // too many scores
        check.check(1, Err("not JSON".to_owned()));
        let c = check.counts();
        assert_eq!(
            (
                c.answers,
                c.candidates,
                c.matched.clone(),
                c.mismatched,
                c.answers_mismatched,
                c.unreadable
            ),
            (5, 5, vec![3, 1], 1, 1, 2)
        );
        assert!((c.worst_match - 5e-7).abs() < 1e-7, "{}", c.worst_match);
        assert_eq!(
            c.first_mismatch.as_deref(),
            Some("request 0, candidate 0: score 0.1, saved [0.5, -0.5]")
        );
    }

    #[test]
    fn a_file_of_other_requests_is_refused_naming_it() {
        let f = file();
        let mut pool = f.requests();
        pool.swap(0, 1);
        let err = AnswerCheck::new(&[("b.json".to_owned(), f.clone())], &pool, 0.0)
            .expect_err("another order");
        assert!(
            err.to_string()
                .contains("b.json: request 0 is not the run's request 0"),
            "{err}"
        );
        let err =
            AnswerCheck::new(&[("b.json".to_owned(), f)], &pool[..1], 0.0).expect_err("fewer");
        assert!(
            err.to_string()
                .contains("b.json: it holds 2 requests, the run's pool 1"),
            "{err}"
        );
    }
}
