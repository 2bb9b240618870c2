//! The ranking workload: `POST /v1/models/{model}/rank` bodies (docs/api.md) of one user and N candidates, with
//! one valid id for every field the model declares, drawn from the rows of the field's table (Zipf or uniform),
//! or users and items from a dataset file; and `dense_features` plausible count-like values. Each request is
//! drawn once as a [`RankBody`] and written in the row or the columnar form (`--body`): the same seed draws the
//! same rows in both.
//!
//! What the model needs comes from a [`RankSchema`]: from a server's `GET /v1/models` or, without a server (the
//! in-process ceiling, peers that do not describe models), from the repository's `model.toml`.

use std::sync::Arc;

use rand::rngs::StdRng;
use rand_distr::{Distribution, Exp};
use recserve::api::v1::ModelInfo;
use recserve_core::repository::OovPolicy;
use recserve_core::repository::{ModelKind, ModelSpec, Side};

use super::WorkloadError;
use super::ids::{Dataset, IdDistribution, IdSampler};
use super::rank_body::{BodyForm, RankBody};

/// One categorical field and the ids that are valid for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldRange {
    pub name: String,
    /// Rows of the table the field reads: ids `0..rows` are in its vocabulary.
    pub rows: u64,
    /// The table refuses ids outside `0..rows` (`oov = "reject"`).
    pub rejects_unknown: bool,
}

/// What a ranking request for one model must carry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankSchema {
    pub model: String,
    pub user_fields: Vec<FieldRange>,
    /// Item-side fields sent in `candidates[i].fields` (every item field but the `item_id_field`).
    pub item_fields: Vec<FieldRange>,
    /// The item-side field fed by `candidates[i].id`, when the model has one.
    pub item_id_field: Option<FieldRange>,
    pub dense_features: usize,
    /// Assumptions made while building the schema, printed as warnings.
    pub notes: Vec<String>,
}

impl RankSchema {
    /// From a model repository's `model.toml`: exact (each field's own table).
    pub fn from_spec(model: &str, spec: &ModelSpec) -> Result<RankSchema, WorkloadError> {
        if spec.kind != ModelKind::Deepfm {
            return Err(WorkloadError::Schema(format!(
                "model {model:?} is a {} model; the rank workload needs a deepfm model",
                spec.kind.as_str()
            )));
        }
        let ranking = spec.ranking.as_ref();
        check_no_candidate_features(model, ranking.map_or(&[], |r| &r.candidate_features))?;
        let id_field = ranking.and_then(|r| r.item_id_field);
        let range = |f: usize| {
            let table = &spec.tables[spec.fields[f].table].spec;
            FieldRange {
                name: spec.fields[f].name.clone(),
                rows: table.rows,
                rejects_unknown: table.oov == OovPolicy::Reject,
            }
        };
        let on = |side: Side| -> Vec<FieldRange> {
            (0..spec.fields.len())
                .filter(|&f| spec.fields[f].side == side && Some(f) != id_field)
                .map(range)
                .collect()
        };
        Ok(RankSchema {
            model: model.to_owned(),
            user_fields: on(Side::User),
            item_fields: on(Side::Item),
            item_id_field: id_field.map(range),
            dense_features: ranking.map_or(0, |r| r.dense_features.len()),
            notes: Vec::new(),
        })
    }

    /// From a server's `GET /v1/models` entry. That description does not say which table a field reads, so a
    /// field reads the table of the same name; a field with no such table gets ids below the smallest table's
    /// row count (valid whichever table it reads), and a note says so.
    pub fn from_model_info(info: &ModelInfo) -> Result<RankSchema, WorkloadError> {
        if info.kind != "deepfm" {
            return Err(WorkloadError::Schema(format!(
                "model {:?} is a {} model; the rank workload needs a deepfm model",
                info.name, info.kind
            )));
        }
        check_no_candidate_features(&info.name, &info.candidate_features)?;
        let smallest = info.tables.iter().min_by_key(|t| t.rows).ok_or_else(|| {
            WorkloadError::Schema(format!("model {:?} lists no tables", info.name))
        })?;
        let mut notes = Vec::new();
        let mut range = |name: &str| match info.tables.iter().find(|t| t.name == name) {
            Some(t) => FieldRange {
                name: name.to_owned(),
                rows: t.rows,
                rejects_unknown: t.oov == "reject",
            },
            None => {
                notes.push(format!(
                    "field {name:?} of model {:?} has no table of its name in GET /v1/models; its ids are drawn \
                     below {} (the smallest table's rows)",
                    info.name, smallest.rows
                ));
                FieldRange {
                    name: name.to_owned(),
                    rows: smallest.rows,
                    rejects_unknown: true,
                }
            }
        };
        let user_fields = info.user_fields.iter().map(|n| range(n)).collect();
        let item_id_field = info.item_id_field.as_deref().map(&mut range);
        let item_fields = info
            .item_fields
            .iter()
            .filter(|n| Some(n.as_str()) != info.item_id_field.as_deref())
            .map(|n| range(n))
            .collect();
        Ok(RankSchema {
            model: info.name.clone(),
            user_fields,
            item_fields,
            item_id_field,
            dense_features: info.dense_features.len(),
            notes,
        })
    }
}

/// Refuses a model that takes candidate features: the workload does not draw them, and every body would be refused.
fn check_no_candidate_features(model: &str, features: &[String]) -> Result<(), WorkloadError> {
    if features.is_empty() {
        return Ok(());
    }
    Err(WorkloadError::Schema(format!(
        "model {model:?} takes the candidate features {}, which the rank workload does not generate: load it \
         through its pipeline (--workload recommend)",
        features.join(", ")
    )))
}

/// Settings of the ranking workload.
#[derive(Clone, Debug)]
pub struct RankOptions {
    /// Candidates per request.
    pub candidates: usize,
    pub ids: IdDistribution,
    pub zipf_exponent: f64,
    pub top_k: Option<usize>,
    /// With a dataset: users are its users, and this user-side field carries the user's id.
    pub user_id_field: Option<String>,
    /// How the candidates are written.
    pub body: BodyForm,
}

/// Generates ranking request bodies.
#[derive(Clone, Debug)]
pub struct RankWorkload {
    pub schema: RankSchema,
    pub options: RankOptions,
    user: Vec<IdSampler>,
    item: Vec<IdSampler>,
    item_id: Option<IdSampler>,
    dataset: Option<DatasetUse>,
    dense: Exp<f64>,
    /// The item fields' names, ascending (the body's columns), and the column of each of `schema.item_fields`.
    item_columns: Vec<String>,
    column_of: Vec<usize>,
}

#[derive(Clone, Debug)]
struct DatasetUse {
    data: Arc<Dataset>,
    /// Index into `schema.user_fields` of the field that carries the dataset's user id.
    user_field: usize,
}

/// Mean of the dense feature values (count-like, as Criteo's integer features are).
const DENSE_MEAN: f64 = 8.0;

impl RankWorkload {
    pub fn new(
        schema: RankSchema,
        options: RankOptions,
        dataset: Option<Arc<Dataset>>,
    ) -> Result<RankWorkload, WorkloadError> {
        if options.candidates == 0 {
            return Err(WorkloadError::Invalid(
                "--candidates must be at least 1".to_owned(),
            ));
        }
        if options.top_k == Some(0) {
            return Err(WorkloadError::Invalid(
                "--top-k must be at least 1".to_owned(),
            ));
        }
        let sampler = |f: &FieldRange| IdSampler::new(options.ids, f.rows, options.zipf_exponent);
        let user = schema
            .user_fields
            .iter()
            .map(sampler)
            .collect::<Result<_, _>>()?;
        let item = schema
            .item_fields
            .iter()
            .map(sampler)
            .collect::<Result<_, _>>()?;
        let item_id = schema.item_id_field.as_ref().map(sampler).transpose()?;
        let mut schema = schema;
        let dataset = match dataset {
            None => {
                if options.user_id_field.is_some() {
                    return Err(WorkloadError::Invalid(
                        "--user-id-field needs --dataset".to_owned(),
                    ));
                }
                None
            }
            Some(data) => Some(Self::use_dataset(&mut schema, &options, data)?),
        };
        let mut item_columns: Vec<String> =
            schema.item_fields.iter().map(|f| f.name.clone()).collect();
        item_columns.sort();
        let column_of = schema
            .item_fields
            .iter()
            .map(|f| {
                item_columns
                    .binary_search(&f.name)
                    .expect("a column of its own")
            })
            .collect();
        Ok(RankWorkload {
            schema,
            options,
            user,
            item,
            item_id,
            dataset,
            dense: Exp::new(1.0 / DENSE_MEAN).expect("a positive constant rate"),
            item_columns,
            column_of,
        })
    }

    fn use_dataset(
        schema: &mut RankSchema,
        options: &RankOptions,
        data: Arc<Dataset>,
    ) -> Result<DatasetUse, WorkloadError> {
        let name = options.user_id_field.as_deref().ok_or_else(|| {
            WorkloadError::Invalid(format!(
                "with --dataset, --user-id-field must name the user-side field that carries the user id (one of: {})",
                names(&schema.user_fields)
            ))
        })?;
        let user_field = schema
            .user_fields
            .iter()
            .position(|f| f.name == name)
            .ok_or_else(|| {
                WorkloadError::Invalid(format!(
                    "--user-id-field {name:?} is not a user-side field of model {:?} (user fields: {})",
                    schema.model,
                    names(&schema.user_fields)
                ))
            })?;
        let field = &schema.user_fields[user_field];
        if let Some(u) = data.user_outside(field.rows) {
            let problem = format!(
                "user id {} ({}, line {}) is outside the vocabulary of field {:?} ({} rows)",
                u.user,
                data.path.display(),
                u.line,
                field.name,
                field.rows
            );
            if field.rejects_unknown {
                return Err(WorkloadError::Invalid(format!(
                    "{problem}, whose table rejects unknown ids"
                )));
            }
            schema.notes.push(format!(
                "{problem}: such users score with the table's default row"
            ));
        }
        if let Some(f) = &schema.item_id_field {
            let (_, items) = data.extents();
            if items > f.rows {
                let problem = format!(
                    "item ids of {} reach {}, beyond the {} rows of the item id field {:?}",
                    data.path.display(),
                    items - 1,
                    f.rows,
                    f.name
                );
                if f.rejects_unknown {
                    return Err(WorkloadError::Invalid(format!(
                        "{problem}, whose table rejects unknown ids"
                    )));
                }
                schema
                    .notes
                    .push(format!("{problem}: those score with the default row"));
            }
        }
        Ok(DatasetUse { data, user_field })
    }

    pub fn path(&self) -> String {
        format!("/v1/models/{}/rank", self.schema.model)
    }

    /// One request body, in the workload's form.
    pub fn body(&self, rng: &mut StdRng) -> Vec<u8> {
        self.draw(rng).to_json(self.options.body)
    }

    /// One request. The draws come in a fixed order (user fields, the dataset user, dense values, then each
    /// candidate's id and item fields in the model's order), whatever form the request is written in.
    pub fn draw(&self, rng: &mut StdRng) -> RankBody {
        let mut user_fields: std::collections::BTreeMap<String, i64> = self
            .schema
            .user_fields
            .iter()
            .zip(&self.user)
            .map(|(f, s)| (f.name.clone(), s.sample(rng)))
            .collect();
        if let Some(d) = &self.dataset {
            let user = d.data.user(rng).user;
            user_fields.insert(self.schema.user_fields[d.user_field].name.clone(), user);
        }
        let dense = (0..self.schema.dense_features)
            .map(|_| self.dense.sample(rng).floor() as f32)
            .collect();
        let candidates = self.options.candidates;
        let width = self.item_columns.len();
        let mut ids = vec![0; candidates * width];
        let mut candidate_ids = self
            .item_id
            .as_ref()
            .map(|_| Vec::with_capacity(candidates));
        for i in 0..candidates {
            if let (Some(s), Some(list)) = (&self.item_id, &mut candidate_ids) {
                list.push(
                    self.dataset
                        .as_ref()
                        .and_then(|d| d.data.item(rng))
                        .unwrap_or_else(|| s.sample(rng)),
                );
            }
            for (sampler, &column) in self.item.iter().zip(&self.column_of) {
                ids[i * width + column] = sampler.sample(rng);
            }
        }
        RankBody {
            user_fields,
            dense: Some(dense),
            item_fields: self.item_columns.clone(),
            ids,
            candidate_ids,
            candidates,
            top_k: self.options.top_k,
        }
    }
}

fn names(fields: &[FieldRange]) -> String {
    fields
        .iter()
        .map(|f| f.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use rand::SeedableRng;
    use recserve::api::v1::TableInfo;
    use recserve::api::v1::rank_body::decode_rank;
    use recserve_core::ranking::RankContract;

    use super::*;

    /// A model with a reject table on each side, a default table, an item id field, and a field (`cat2`) that
    /// reads another field's table (`cat`).
    const SPEC: &str = r#"
format_version = 1
kind = "deepfm"
[ranking]
dense_features = ["d0", "d1", "d2"]
item_id_field = "item"
[dense_graph]
file = "g.onnx"
precision = "fp32"
[[tables]]
name = "u"
file = "t.safetensors"
rows = 10
dim = 3
storage = "fp32"
oov = "reject"
[[tables]]
name = "age"
file = "t.safetensors"
rows = 7
dim = 3
storage = "fp32"
[[tables]]
name = "item"
file = "t.safetensors"
rows = 50
dim = 3
storage = "fp32"
oov = "reject"
[[tables]]
name = "cat"
file = "t.safetensors"
rows = 5
dim = 3
storage = "fp32"
oov = "reject"
[[fields]]
name = "u"
side = "user"
[[fields]]
name = "age"
side = "user"
[[fields]]
name = "item"
side = "item"
[[fields]]
name = "cat"
side = "item"
[[fields]]
name = "cat2"
side = "item"
table = "cat"
"#;

    fn spec() -> ModelSpec {
        ModelSpec::parse(SPEC).expect("valid spec")
    }

    fn options(candidates: usize) -> RankOptions {
        RankOptions {
            candidates,
            ids: IdDistribution::Zipf,
            zipf_exponent: 1.05,
            top_k: None,
            user_id_field: None,
            body: BodyForm::Rows,
        }
    }

    /// Decodes `body` exactly as the server does, against the contract of `spec`.
    fn server_accepts(body: &[u8], candidates: usize) -> recserve_core::ranking::RankInput {
        let contract = RankContract::new(Arc::new(spec()), 1000);
        let input = decode_rank(&contract, body)
            .expect("the server accepts every id")
            .input;
        assert_eq!(input.rows, candidates);
        input
    }

    #[test]
    fn every_generated_request_is_accepted_by_the_servers_own_decoder() {
        let schema = RankSchema::from_spec("m", &spec()).expect("deepfm");
        assert_eq!(
            schema.item_id_field.as_ref().map(|f| f.name.as_str()),
            Some("item")
        );
        let names: Vec<&str> = schema.item_fields.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, vec!["cat", "cat2"]);
        assert_eq!(schema.item_fields[1].rows, 5, "cat2 reads table cat");
        let workload = RankWorkload::new(schema, options(20), None).expect("valid");
        assert_eq!(workload.path(), "/v1/models/m/rank");
        let mut rng = StdRng::seed_from_u64(3);
        let mut distinct_users = std::collections::HashSet::new();
        for _ in 0..200 {
            let body = workload.body(&mut rng);
            let input = server_accepts(&body, 20);
            assert_eq!(input.dense.len(), 20 * 3);
            assert!(input.dense.iter().all(|v| v.is_finite() && *v >= 0.0));
            distinct_users.insert(input.ids[0]);
        }
        assert!(
            distinct_users.len() > 3,
            "user ids vary: {distinct_users:?}"
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_bytes() {
        let make = || {
            RankWorkload::new(
                RankSchema::from_spec("m", &spec()).expect("deepfm"),
                options(5),
                None,
            )
            .expect("valid")
        };
        let a = make().body(&mut StdRng::seed_from_u64(9));
        let b = make().body(&mut StdRng::seed_from_u64(9));
        assert_eq!(a, b);
        assert_ne!(a, make().body(&mut StdRng::seed_from_u64(10)));
    }

    #[test]
    fn top_k_is_sent_when_asked() {
        let mut o = options(4);
        o.top_k = Some(2);
        let w = RankWorkload::new(
            RankSchema::from_spec("m", &spec()).expect("deepfm"),
            o,
            None,
        )
        .expect("valid");
        let body = w.body(&mut StdRng::seed_from_u64(1));
        let contract = RankContract::new(Arc::new(spec()), 1000);
        let decoded = decode_rank(&contract, &body).expect("accepted");
        assert_eq!(decoded.top_k, Some(2));
    }

    fn model_info() -> ModelInfo {
        let table = |name: &str, rows: u64, oov: &str| TableInfo {
            name: name.to_owned(),
            rows,
            dim: 3,
            storage: "fp32".to_owned(),
            oov: oov.to_owned(),
            shards: 1,
            bytes: rows * 12,
        };
        ModelInfo {
            name: "m".to_owned(),
            version: 1,
            available_versions: vec![1],
            kind: "deepfm".to_owned(),
            precision: "fp32".to_owned(),
            device: "cpu".to_owned(),
            description: String::new(),
            user_fields: vec!["u".to_owned(), "age".to_owned()],
            item_fields: vec!["item".to_owned(), "cat".to_owned(), "cat2".to_owned()],
            item_id_field: Some("item".to_owned()),
            dense_features: vec!["d0".to_owned(), "d1".to_owned(), "d2".to_owned()],
            candidate_features: Vec::new(),
            tables: vec![
                table("u", 10, "reject"),
                table("age", 7, "default"),
                table("item", 50, "reject"),
                table("cat", 5, "reject"),
            ],
            state: "ready".to_owned(),
            load: None,
        }
    }

    #[test]
    fn a_server_description_gives_valid_requests_and_notes_what_it_had_to_assume() {
        let schema = RankSchema::from_model_info(&model_info()).expect("deepfm");
        assert_eq!(schema.notes.len(), 1, "{:?}", schema.notes);
        assert!(schema.notes[0].contains("\"cat2\""), "{:?}", schema.notes);
        assert_eq!(schema.item_fields[1].rows, 5, "the smallest table's rows");
        assert_eq!(schema.user_fields[1].rows, 7);
        let workload = RankWorkload::new(schema, options(30), None).expect("valid");
        let mut rng = StdRng::seed_from_u64(4);
        for _ in 0..100 {
            server_accepts(&workload.body(&mut rng), 30);
        }

        let mut recall = model_info();
        recall.kind = "lightgcn".to_owned();
        let err = RankSchema::from_model_info(&recall).expect_err("not deepfm");
        assert!(err.to_string().contains("needs a deepfm model"), "{err}");
    }

    #[test]
    fn dataset_users_fill_the_named_field_and_dataset_items_the_candidate_ids() {
        let data =
            Arc::new(Dataset::parse(Path::new("d.txt"), "3 40 41\n4 42\n9 40\n").expect("valid"));
        let schema = || RankSchema::from_spec("m", &spec()).expect("deepfm");
        let mut o = options(6);
        o.user_id_field = Some("u".to_owned());
        let w = RankWorkload::new(schema(), o.clone(), Some(Arc::clone(&data))).expect("valid");
        let mut rng = StdRng::seed_from_u64(5);
        for _ in 0..50 {
            let body = w.body(&mut rng);
            let input = server_accepts(&body, 6);
            // Field order in the graph: u, age, item, cat, cat2.
            assert!([3, 4, 9].contains(&input.ids[0]), "user {}", input.ids[0]);
            for row in input.ids.chunks(5) {
                assert!([40, 41, 42].contains(&row[2]), "item {}", row[2]);
            }
        }

        o.user_id_field = Some("item".to_owned());
        let err = RankWorkload::new(schema(), o.clone(), Some(Arc::clone(&data)))
            .expect_err("item is not a user field");
        assert!(err.to_string().contains("not a user-side field"), "{err}");

        o.user_id_field = None;
        let err = RankWorkload::new(schema(), o.clone(), Some(Arc::clone(&data)))
            .expect_err("needs the field");
        assert!(
            err.to_string().contains("--user-id-field must name"),
            "{err}"
        );

        // User 12 is outside table u (10 rows, reject): refused before any request is sent.
        let far = Arc::new(Dataset::parse(Path::new("far.txt"), "3 40\n12 41\n").expect("valid"));
        o.user_id_field = Some("u".to_owned());
        let err = RankWorkload::new(schema(), o.clone(), Some(far)).expect_err("outside");
        assert_eq!(
            err.to_string(),
            "user id 12 (far.txt, line 2) is outside the vocabulary of field \"u\" (10 rows), whose table rejects \
             unknown ids"
        );
        // Field age (7 rows) has a default row: allowed, with a note.
        let far = Arc::new(Dataset::parse(Path::new("far.txt"), "3 40\n12 41\n").expect("valid"));
        o.user_id_field = Some("age".to_owned());
        let w = RankWorkload::new(schema(), o, Some(far)).expect("default table");
        assert_eq!(w.schema.notes.len(), 1, "{:?}", w.schema.notes);
    }
}
