//! The recall and recommend workloads: `POST /v1/models/{model}/recall` with `{"user_id": u, "k": k}` (optionally
//! `"exclude"`: the user's known items) or `{"history": [items], "k": k}`, and `POST /v1/recommend/{pipeline}` with
//! `{"user_id": u, "k": k}`, with `"user": {"fields": {F: u}}` when the pipeline's ranking model reads the user
//! id from a user-side field F (`--user-id-field`), and, with a dataset, the user's items as `exclude`
//! (`--exclude-known`) and as `history` (`--send-history`, for a ranker that takes the co-occurrence feature). Users and items come from a dataset file (e.g. Gowalla's
//! `test.txt`) or are drawn from `0..--users` / `0..--items`. `--body-extra` adds fixed keys to every body (for
//! options these APIs grow, and the ranking model's other user fields, which are merged with F).
//!
//! Recall by user with `--users-per-request N` (N > 1) asks for N users in one call, the way a caller batches its
//! users: `POST /v2/models/{model}/infer` with `{"inputs": [{"name": "user_id", "datatype": "INT64", "shape":
//! [N], "data": [...]}], "parameters": {"k": k}}` (the `/v1` recall API takes one user), the N users drawn
//! independently.

use std::sync::Arc;

use rand::rngs::StdRng;
use serde_json::{Map, Value, json};

use super::WorkloadError;
use super::ids::{Dataset, IdDistribution, IdSampler};

/// What a recall request queries with.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum RecallInput {
    /// `user_id`: the server looks the user's embedding up.
    User,
    /// `history`: the server builds the query from the items the user interacted with.
    History,
}

/// Where users and items come from.
#[derive(Clone, Debug)]
pub struct Population {
    pub dataset: Option<Arc<Dataset>>,
    /// Users `0..users` when there is no dataset.
    pub users: Option<u64>,
    /// Items `0..items` when there is no dataset (or a dataset user has no items).
    pub items: Option<u64>,
    pub ids: IdDistribution,
    pub zipf_exponent: f64,
}

/// Where a request's user comes from.
#[derive(Clone, Debug)]
enum Users {
    Drawn(IdSampler),
    Dataset(Arc<Dataset>),
}

impl Users {
    fn new(population: &Population) -> Result<Users, WorkloadError> {
        match (&population.dataset, population.users) {
            (Some(d), _) => Ok(Users::Dataset(Arc::clone(d))),
            (None, Some(n)) => Ok(Users::Drawn(IdSampler::new(
                population.ids,
                n,
                population.zipf_exponent,
            )?)),
            (None, None) => Err(WorkloadError::Invalid(
                "user ids need --users N (drawn from 0..N) or --dataset FILE".to_owned(),
            )),
        }
    }

    /// A user id and, for a dataset user, the user's items.
    fn draw<'a>(&'a self, rng: &mut StdRng) -> (i64, Option<&'a [i64]>) {
        match self {
            Users::Drawn(s) => (s.sample(rng), None),
            Users::Dataset(d) => {
                let u = d.user(rng);
                (u.user, Some(&u.items))
            }
        }
    }
}

/// Where a recall request's history comes from.
#[derive(Clone, Debug)]
enum Histories {
    /// `history_len` items drawn from `0..--items`.
    Drawn(IdSampler),
    /// A dataset user's items; users without items get a drawn history when `fallback` is set, and are never
    /// drawn otherwise.
    Dataset {
        data: Arc<Dataset>,
        fallback: Option<IdSampler>,
    },
}

/// Settings of the recall workload.
#[derive(Clone, Debug)]
pub struct RecallOptions {
    pub input: RecallInput,
    pub k: usize,
    /// Longest `history` or `exclude` list sent.
    pub history_len: usize,
    /// With `input = user` and a dataset: send the user's dataset items as `exclude`.
    pub exclude_known: bool,
    pub extra: Map<String, Value>,
    /// Users per request; more than 1 (recall by user only) sends a KServe v2 infer call of that many users.
    pub users_per_request: usize,
}

#[derive(Clone, Debug)]
enum Query {
    User(Users),
    History(Histories),
}

#[derive(Clone, Debug)]
pub struct RecallWorkload {
    pub model: String,
    pub options: RecallOptions,
    query: Query,
}

impl RecallWorkload {
    pub fn new(
        model: String,
        options: RecallOptions,
        population: Population,
    ) -> Result<RecallWorkload, WorkloadError> {
        if options.k == 0 {
            return Err(WorkloadError::Invalid("--k must be at least 1".to_owned()));
        }
        if options.history_len == 0 {
            return Err(WorkloadError::Invalid(
                "--history-len must be at least 1".to_owned(),
            ));
        }
        if options.exclude_known
            && (options.input != RecallInput::User || population.dataset.is_none())
        {
            return Err(WorkloadError::Invalid(
                "--exclude-known sends each dataset user's items as `exclude`: it needs --dataset and \
                 --recall-input user"
                    .to_owned(),
            ));
        }
        check_extra(&options.extra, &["user_id", "history", "k", "exclude"])?;
        if options.users_per_request == 0 {
            return Err(WorkloadError::Invalid(
                "--users-per-request must be at least 1".to_owned(),
            ));
        }
        if options.users_per_request > 1
            && (options.input != RecallInput::User
                || options.exclude_known
                || !options.extra.is_empty())
        {
            return Err(WorkloadError::Invalid(
                "--users-per-request above 1 sends a KServe v2 recall of user ids: it takes --recall-input user, \
                 without --exclude-known or --body-extra"
                    .to_owned(),
            ));
        }
        let items = population
            .items
            .map(|n| IdSampler::new(population.ids, n, population.zipf_exponent))
            .transpose()?;
        let query = match options.input {
            RecallInput::User => Query::User(Users::new(&population)?),
            RecallInput::History => Query::History(match (population.dataset, items) {
                (Some(data), fallback) => {
                    if fallback.is_none() && data.interactions.is_empty() {
                        return Err(WorkloadError::Invalid(format!(
                            "--recall-input history: no user of {} has items; add --items N to draw histories",
                            data.path.display()
                        )));
                    }
                    Histories::Dataset { data, fallback }
                }
                (None, Some(items)) => Histories::Drawn(items),
                (None, None) => {
                    return Err(WorkloadError::Invalid(
                        "--recall-input history needs --items N (histories drawn from 0..N) or --dataset FILE"
                            .to_owned(),
                    ));
                }
            }),
        };
        Ok(RecallWorkload {
            model,
            options,
            query,
        })
    }

    pub fn path(&self) -> String {
        if self.options.users_per_request > 1 {
            format!("/v2/models/{}/infer", self.model)
        } else {
            format!("/v1/models/{}/recall", self.model)
        }
    }

    pub fn body(&self, rng: &mut StdRng) -> Vec<u8> {
        if let (n @ 2.., Query::User(users)) = (self.options.users_per_request, &self.query) {
            let ids: Vec<i64> = (0..n).map(|_| users.draw(rng).0).collect();
            let body = json!({
                "inputs": [{"name": "user_id", "datatype": "INT64", "shape": [n], "data": ids}],
                "parameters": {"k": self.options.k},
            });
            return serde_json::to_vec(&body).expect("JSON values serialize");
        }
        let mut body = Map::new();
        match &self.query {
            Query::User(users) => {
                let (user, known) = users.draw(rng);
                body.insert("user_id".to_owned(), json!(user));
                if self.options.exclude_known
                    && let Some(items) = known
                {
                    body.insert("exclude".to_owned(), json!(self.truncated(items)));
                }
            }
            Query::History(histories) => {
                let history = match histories {
                    Histories::Drawn(items) => self.drawn(items, rng),
                    Histories::Dataset { data, fallback } => match fallback {
                        Some(items) => {
                            let user = data.user(rng);
                            if user.items.is_empty() {
                                self.drawn(items, rng)
                            } else {
                                self.truncated(&user.items).to_vec()
                            }
                        }
                        None => data
                            .user_with_items(rng)
                            .map(|u| self.truncated(&u.items).to_vec())
                            .unwrap_or_default(),
                    },
                };
                body.insert("history".to_owned(), json!(history));
            }
        }
        body.insert("k".to_owned(), json!(self.options.k));
        body.extend(self.options.extra.clone());
        serde_json::to_vec(&Value::Object(body)).expect("JSON values serialize")
    }

    fn drawn(&self, items: &IdSampler, rng: &mut StdRng) -> Vec<i64> {
        (0..self.options.history_len)
            .map(|_| items.sample(rng))
            .collect()
    }

    fn truncated<'a>(&self, items: &'a [i64]) -> &'a [i64] {
        &items[..items.len().min(self.options.history_len)]
    }
}

/// Settings of the recommend workload.
#[derive(Clone, Debug)]
pub struct RecommendOptions {
    pub k: usize,
    pub extra: Map<String, Value>,
    /// The ranking model's user-side field that carries the request's user id: `user.fields[F] = user_id`.
    pub user_id_field: Option<String>,
    /// The most dataset items sent as `history` or `exclude`.
    pub history_len: usize,
    /// Send the dataset user's items as `exclude`.
    pub exclude_known: bool,
    /// Send the dataset user's items as `history` beside `user_id`.
    pub send_history: bool,
}

#[derive(Clone, Debug)]
pub struct RecommendWorkload {
    pub pipeline: String,
    pub options: RecommendOptions,
    users: Users,
}

impl RecommendWorkload {
    pub fn new(
        pipeline: String,
        options: RecommendOptions,
        population: Population,
    ) -> Result<RecommendWorkload, WorkloadError> {
        if options.k == 0 {
            return Err(WorkloadError::Invalid("--k must be at least 1".to_owned()));
        }
        check_extra(&options.extra, &["user_id", "k", "history", "exclude"])?;
        for (set, flag, key) in [
            (options.exclude_known, "--exclude-known", "exclude"),
            (options.send_history, "--send-history", "history"),
        ] {
            if set && population.dataset.is_none() {
                return Err(WorkloadError::Invalid(format!(
                    "{flag} sends each dataset user's items as `{key}`: it needs --dataset"
                )));
            }
        }
        if options.history_len == 0 {
            return Err(WorkloadError::Invalid(
                "--history-len must be at least 1".to_owned(),
            ));
        }
        if let Some(field) = &options.user_id_field {
            let fields = options
                .extra
                .get("user")
                .map(|user| user.as_object().map(|u| u.get("fields")));
            match fields {
                None | Some(Some(None)) => {}
                Some(Some(Some(Value::Object(fields)))) if fields.contains_key(field) => {
                    return Err(WorkloadError::Invalid(format!(
                        "--body-extra sets user.fields.{field}, which --user-id-field {field} generates"
                    )));
                }
                Some(Some(Some(Value::Object(_)))) => {}
                _ => {
                    return Err(WorkloadError::Invalid(
                        "--body-extra's \"user\" must be an object whose \"fields\" is an object, to merge \
                         --user-id-field into"
                            .to_owned(),
                    ));
                }
            }
        }
        Ok(RecommendWorkload {
            pipeline,
            options,
            users: Users::new(&population)?,
        })
    }

    pub fn path(&self) -> String {
        format!("/v1/recommend/{}", self.pipeline)
    }

    pub fn body(&self, rng: &mut StdRng) -> Vec<u8> {
        let (user_id, items) = self.users.draw(rng);
        let mut body = Map::new();
        body.insert("user_id".to_owned(), json!(user_id));
        body.insert("k".to_owned(), json!(self.options.k));
        let known = items.map_or(&[][..], |items| {
            &items[..items.len().min(self.options.history_len)]
        });
        if self.options.send_history && !known.is_empty() {
            body.insert("history".to_owned(), json!(known));
        }
        if self.options.exclude_known && !known.is_empty() {
            body.insert("exclude".to_owned(), json!(known));
        }
        body.extend(self.options.extra.clone());
        if let Some(field) = &self.options.user_id_field {
            // `new` checked that an extra `user` is an object whose `fields`, if any, is an object.
            let user = body.entry("user").or_insert_with(|| json!({}));
            if let Some(user) = user.as_object_mut() {
                let fields = user.entry("fields").or_insert_with(|| json!({}));
                if let Some(fields) = fields.as_object_mut() {
                    fields.insert(field.clone(), json!(user_id));
                }
            }
        }
        serde_json::to_vec(&Value::Object(body)).expect("JSON values serialize")
    }
}

fn check_extra(extra: &Map<String, Value>, generated: &[&str]) -> Result<(), WorkloadError> {
    match extra.keys().find(|k| generated.contains(&k.as_str())) {
        Some(key) => Err(WorkloadError::Invalid(format!(
            "--body-extra sets {key:?}, which the workload generates itself ({})",
            generated.join(", ")
        ))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rand::SeedableRng;

    use super::*;

    fn gowalla_like() -> Arc<Dataset> {
        Arc::new(
            Dataset::parse(
                Path::new("test.txt"),
                "0 7580 3730 5983\n1 31613 34341\n2 1526 1513 1686 1500 35515\n3\n",
            )
            .expect("valid"),
        )
    }

    fn population(
        dataset: Option<Arc<Dataset>>,
        users: Option<u64>,
        items: Option<u64>,
    ) -> Population {
        Population {
            dataset,
            users,
            items,
            ids: IdDistribution::Zipf,
            zipf_exponent: 1.05,
        }
    }

    fn recall(input: RecallInput, exclude_known: bool) -> RecallOptions {
        RecallOptions {
            input,
            k: 100,
            history_len: 3,
            exclude_known,
            extra: Map::new(),
            users_per_request: 1,
        }
    }

    fn decode(body: &[u8]) -> Value {
        serde_json::from_slice(body).expect("JSON")
    }

    #[test]
    fn users_per_request_sends_a_kserve_call_of_that_many_drawn_users() {
        let options = RecallOptions {
            users_per_request: 32,
            ..recall(RecallInput::User, false)
        };
        let w = RecallWorkload::new(
            "lightgcn".to_owned(),
            options,
            population(None, Some(50), None),
        )
        .expect("valid");
        assert_eq!(w.path(), "/v2/models/lightgcn/infer");
        let mut rng = StdRng::seed_from_u64(3);
        let mut distinct = std::collections::BTreeSet::new();
        for _ in 0..20 {
            let v = decode(&w.body(&mut rng));
            assert_eq!(v["parameters"], json!({"k": 100}));
            let input = &v["inputs"][0];
            assert_eq!(
                (&input["name"], &input["datatype"], &input["shape"]),
                (&json!("user_id"), &json!("INT64"), &json!([32]))
            );
            let ids = input["data"].as_array().expect("data");
            assert_eq!(ids.len(), 32);
            for id in ids {
                let id = id.as_i64().expect("an id");
                assert!((0..50).contains(&id), "{id} not below --users 50");
                distinct.insert(id);
            }
        }
        assert!(
            distinct.len() > 10,
            "users are drawn, not repeated: {distinct:?}"
        );
    }

    #[test]
    fn users_per_request_is_refused_where_it_cannot_apply() {
        let make = |options: RecallOptions, data: Option<Arc<Dataset>>| {
            RecallWorkload::new(
                "m".to_owned(),
                options,
                population(data, Some(50), Some(50)),
            )
            .expect_err("refused")
            .to_string()
        };
        let zero = make(
            RecallOptions {
                users_per_request: 0,
                ..recall(RecallInput::User, false)
            },
            None,
        );
        assert!(
            zero.contains("--users-per-request must be at least 1"),
            "{zero}"
        );
        let history = make(
            RecallOptions {
                users_per_request: 2,
                ..recall(RecallInput::History, false)
            },
            None,
        );
        assert!(history.contains("--recall-input user"), "{history}");
        let exclude = make(
            RecallOptions {
                users_per_request: 2,
                ..recall(RecallInput::User, true)
            },
            Some(gowalla_like()),
        );
        assert!(exclude.contains("without --exclude-known"), "{exclude}");
    }

    #[test]
    fn user_recall_from_a_dataset_sends_dataset_users_and_excludes_their_known_items() {
        let w = RecallWorkload::new(
            "lightgcn".to_owned(),
            recall(RecallInput::User, true),
            population(Some(gowalla_like()), None, None),
        )
        .expect("valid");
        assert_eq!(w.path(), "/v1/models/lightgcn/recall");
        let mut rng = StdRng::seed_from_u64(1);
        let mut users = std::collections::BTreeSet::new();
        for _ in 0..100 {
            let v = decode(&w.body(&mut rng));
            let user = v["user_id"].as_i64().expect("user_id");
            users.insert(user);
            assert_eq!(v["k"], 100);
            let expected = match user {
                0 => json!([7580, 3730, 5983]),
                1 => json!([31613, 34341]),
                2 => json!([1526, 1513, 1686]),
                3 => json!([]),
                other => panic!("user {other} is not in the dataset"),
            };
            assert_eq!(
                v["exclude"], expected,
                "exclude is the first --history-len items"
            );
            assert!(v.get("history").is_none());
        }
        assert_eq!(users.len(), 4, "every dataset user is drawn");
    }

    #[test]
    fn history_recall_sends_dataset_histories_and_falls_back_to_drawn_items() {
        let w = RecallWorkload::new(
            "lightgcn".to_owned(),
            recall(RecallInput::History, false),
            population(Some(gowalla_like()), None, Some(40_981)),
        )
        .expect("valid");
        let mut rng = StdRng::seed_from_u64(2);
        for _ in 0..100 {
            let v = decode(&w.body(&mut rng));
            let history = v["history"].as_array().expect("history");
            assert!(!history.is_empty() && history.len() <= 3, "{v}");
            assert!(
                history
                    .iter()
                    .all(|i| (0..40_981).contains(&i.as_i64().expect("id")))
            );
            assert!(v.get("user_id").is_none());
        }

        let w = RecallWorkload::new(
            "m".to_owned(),
            recall(RecallInput::History, false),
            population(None, None, Some(50)),
        )
        .expect("drawn histories");
        let v = decode(&w.body(&mut rng));
        assert_eq!(v["history"].as_array().expect("history").len(), 3);
    }

    #[test]
    fn recall_without_a_source_of_ids_is_refused_with_the_flag_to_set() {
        let err = RecallWorkload::new(
            "m".to_owned(),
            recall(RecallInput::User, false),
            population(None, None, None),
        )
        .expect_err("no users");
        assert!(err.to_string().contains("--users N"), "{err}");
        let err = RecallWorkload::new(
            "m".to_owned(),
            recall(RecallInput::History, false),
            population(None, Some(5), None),
        )
        .expect_err("no items");
        assert!(err.to_string().contains("--items N"), "{err}");
        let err = RecallWorkload::new(
            "m".to_owned(),
            recall(RecallInput::User, true),
            population(None, Some(5), None),
        )
        .expect_err("exclude needs a dataset");
        assert!(err.to_string().contains("it needs --dataset"), "{err}");
        let mut o = recall(RecallInput::User, false);
        o.extra.insert("k".to_owned(), json!(5));
        let err = RecallWorkload::new("m".to_owned(), o, population(None, Some(5), None))
            .expect_err("clash");
        assert!(err.to_string().contains("--body-extra sets \"k\""), "{err}");
    }

    #[test]
    fn drawn_users_stay_below_the_user_count() {
        let w = RecallWorkload::new(
            "m".to_owned(),
            recall(RecallInput::User, false),
            population(None, Some(29_858), None),
        )
        .expect("valid");
        let mut rng = StdRng::seed_from_u64(3);
        for _ in 0..1000 {
            let v = decode(&w.body(&mut rng));
            assert!((0..29_858).contains(&v["user_id"].as_i64().expect("user")));
            assert!(v.get("exclude").is_none());
        }
    }

    #[test]
    fn recommend_sends_the_user_k_and_the_extra_keys() {
        let mut extra = Map::new();
        extra.insert("candidates".to_owned(), json!(200));
        let w = RecommendWorkload::new(
            "feed".to_owned(),
            RecommendOptions {
                k: 10,
                extra,
                user_id_field: None,
                history_len: 50,
                exclude_known: false,
                send_history: false,
            },
            population(Some(gowalla_like()), None, None),
        )
        .expect("valid");
        assert_eq!(w.path(), "/v1/recommend/feed");
        let v = decode(&w.body(&mut StdRng::seed_from_u64(4)));
        assert!((0..4).contains(&v["user_id"].as_i64().expect("user")));
        assert_eq!(v["k"], 10);
        assert_eq!(v["candidates"], 200);
        assert!(v.get("user").is_none());

        let err = RecommendWorkload::new(
            "feed".to_owned(),
            RecommendOptions {
                k: 0,
                extra: Map::new(),
                user_id_field: None,
                history_len: 50,
                exclude_known: false,
                send_history: false,
            },
            population(None, Some(3), None),
        )
        .expect_err("k = 0");
        assert!(err.to_string().contains("--k must be at least 1"), "{err}");
    }

    #[test]
    fn recommend_sends_the_dataset_users_items_as_history_and_exclude_when_asked() {
        let options = |send_history, exclude_known| RecommendOptions {
            k: 10,
            extra: Map::new(),
            user_id_field: None,
            history_len: 2,
            exclude_known,
            send_history,
        };
        let w = RecommendWorkload::new(
            "demo".to_owned(),
            options(true, true),
            population(Some(gowalla_like()), None, None),
        )
        .expect("valid");
        let data = gowalla_like();
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..20 {
            let v = decode(&w.body(&mut rng));
            let user = v["user_id"].as_i64().expect("user");
            let items = &data
                .users
                .iter()
                .find(|u| u.user == user)
                .expect("dataset user")
                .items;
            let expected = if items.is_empty() {
                Value::Null
            } else {
                json!(items[..items.len().min(2)])
            };
            assert_eq!(v["history"], expected, "{v}");
            assert_eq!(v["exclude"], expected, "{v}");
        }
        let err = RecommendWorkload::new(
            "demo".to_owned(),
            options(true, false),
            population(None, Some(3), None),
        )
        .expect_err("no dataset");
        assert!(
            err.to_string().contains(
                "--send-history sends each dataset user's items as `history`: it needs --dataset"
            ),
            "{err}"
        );
    }

    #[test]
    fn recommend_puts_the_user_id_in_the_ranking_user_field_beside_the_extra_fields() {
        let options = |extra: Value| RecommendOptions {
            k: 5,
            extra: extra.as_object().expect("object").clone(),
            user_id_field: Some("user".to_owned()),
            history_len: 50,
            exclude_known: false,
            send_history: false,
        };
        let w = RecommendWorkload::new(
            "demo".to_owned(),
            options(json!({"user": {"fields": {"activity": 4}}, "exact": true})),
            population(None, Some(1000), None),
        )
        .expect("valid");
        let mut rng = StdRng::seed_from_u64(9);
        for _ in 0..100 {
            let v = decode(&w.body(&mut rng));
            let user = v["user_id"].as_i64().expect("user_id");
            assert!((0..1000).contains(&user));
            assert_eq!(
                v["user"],
                json!({"fields": {"user": user, "activity": 4}}),
                "{v}"
            );
            assert_eq!(v["exact"], true);
        }
        // Without extra user fields, the id is the only one.
        let w = RecommendWorkload::new(
            "demo".to_owned(),
            options(json!({})),
            population(None, Some(3), None),
        )
        .expect("valid");
        let v = decode(&w.body(&mut rng));
        assert_eq!(v["user"]["fields"]["user"], v["user_id"]);

        for (extra, problem) in [
            (
                json!({"user": {"fields": {"user": 1}}}),
                "which --user-id-field user generates",
            ),
            (json!({"user": 3}), "must be an object"),
            (json!({"user": {"fields": [1]}}), "must be an object"),
        ] {
            let err = RecommendWorkload::new(
                "demo".to_owned(),
                options(extra.clone()),
                population(None, Some(3), None),
            )
            .expect_err("refused");
            assert!(err.to_string().contains(problem), "{extra}: {err}");
        }
    }
}
