//! `model.toml`: the typed description of one model version, and the checks that need nothing but the file
//! itself (names unique, fields pointing at tables, dims agreeing). Checks against the table and graph files
//! live with the code that opens them (`embedding`, `executor`); `repository` ties them together.
//!
//! Every key is documented in `docs/model-repository.md`; unknown keys are refused so a typo cannot silently
//! change behaviour.

use std::collections::HashSet;
use std::path::{Component, Path};

use serde::Deserialize;

use super::BatchingSpec;
use crate::repository::{OovPolicy, Storage, TableSpec, Tier, Unfetched};

/// The only `format_version` this build reads.
pub const FORMAT_VERSION: u32 = 1;

/// What a model does, and so which routes serve it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// Ranking: score candidates for a user (`/rank`).
    Deepfm,
    /// Recall: top-K items for a user by inner product (`/recall`).
    Lightgcn,
}

impl ModelKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ModelKind::Deepfm => "deepfm",
            ModelKind::Lightgcn => "lightgcn",
        }
    }
}

/// The numeric precision the dense graph computes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    Fp32,
    Int8,
}

impl Precision {
    pub fn as_str(self) -> &'static str {
        match self {
            Precision::Fp32 => "fp32",
            Precision::Int8 => "int8",
        }
    }
}

/// Whether a categorical field is sent once per request or once per candidate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    User,
    Item,
}

/// `model.toml`, parsed and checked for internal consistency.
#[derive(Clone, Debug)]
pub struct ModelSpec {
    pub kind: ModelKind,
    pub description: String,
    pub tables: Vec<TableEntry>,
    /// DeepFM only: the categorical inputs, in graph order.
    pub fields: Vec<FieldSpec>,
    pub ranking: Option<RankingSpec>,
    pub dense_graph: Option<DenseGraphSpec>,
    pub recall: Option<RecallSpec>,
    /// DeepFM only: the item feature table that recommend pipelines read the item side from.
    pub(crate) item_features: Option<ItemFeaturesSpec>,
    /// DeepFM only: the item-item table a pipeline computes the `cooccurrence` candidate feature from.
    pub(crate) cooccurrence: Option<CooccurrenceSpec>,
    /// The model author's batching defaults; server settings override them.
    pub batching: BatchingSpec,
}

/// A table and the file it lives in.
#[derive(Clone, Debug)]
pub struct TableEntry {
    pub spec: TableSpec,
    /// Relative to the version directory.
    pub(crate) file: String,
    /// Where the server reads the rows from.
    pub(crate) tier: Tier,
}

#[derive(Clone, Debug)]
pub struct FieldSpec {
    pub name: String,
    pub side: Side,
    /// Index into `ModelSpec::tables`.
    pub table: usize,
}

#[derive(Clone, Debug)]
pub struct RankingSpec {
    pub dense_features: Vec<String>,
    /// Per-candidate floats the graph takes after the dense features (`dense` is `[B, dense_features +
    /// candidate_features]`): sent with each candidate by rank clients, computed by a recommend pipeline
    /// ([`CandidateFeature`]).
    pub candidate_features: Vec<String>,
    /// Index into `ModelSpec::fields` of the item-side field fed by a candidate's `id`.
    pub item_id_field: Option<usize>,
}

#[derive(Clone, Debug)]
pub struct DenseGraphSpec {
    pub(crate) file: String,
    pub(crate) precision: Precision,
    pub(crate) embeddings_input: String,
    pub(crate) dense_input: String,
    pub output: String,
    /// `[dense_graph.split]`: the graph also comes cut into a user part and an item part.
    pub(crate) split: Option<SplitSpec>,
}

/// `[dense_graph.split]`: `file` cut at the tensor `state` into a user graph (the inputs of `file` → `state`
/// `[batch, U]`), run on one row per request, and an item graph (`embeddings_input` and `state` → `output`), run
/// on every candidate with its request's state (docs/model-repository.md, "Split graphs").
#[derive(Clone, Debug)]
pub struct SplitSpec {
    pub(crate) user_file: String,
    pub(crate) item_file: String,
    pub(crate) state: String,
}

#[derive(Clone, Debug)]
pub struct RecallSpec {
    /// Indices into `ModelSpec::tables`.
    pub user_table: usize,
    pub item_table: usize,
    pub(crate) history_table: Option<usize>,
    /// The I64 `[items]` tensor, in the item table's file, counting each item's training interactions: the
    /// popularity order a history without signal falls back on.
    pub(crate) popularity: Option<String>,
    /// Items per query when a request gives no `k`: `default_k` of the file (1 to the catalogue size), else
    /// [`DEFAULT_K`] or the whole catalogue when it is smaller.
    pub(crate) default_k: usize,
    /// `[recall.index]`: the IVF index recall serves from (exact top-K when absent).
    pub index: Option<IndexSpec>,
}

/// `[recall.index]`: an IVF index file of the version (built by `python -m recserve_models index`) and how a
/// query searches it unless the request says otherwise.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexSpec {
    /// Safetensors file, relative to the version directory.
    pub(crate) file: String,
    /// Lists a query scans (1 to the index's `nlist`, checked at load).
    pub(crate) nprobe: usize,
    /// The most candidates a query re-ranks with the exact score.
    pub(crate) max_candidates: usize,
    /// How the file codes its items: `"int8"` (the default) or `"pq4"`; the file must say the same (checked at
    /// load).
    pub(crate) codes: String,
}

/// The values `[recall.index] codes` may take.
pub const INDEX_CODES: [&str; 2] = ["int8", "pq4"];

/// `[recall.index] max_candidates` unless the file says otherwise.
pub const DEFAULT_MAX_CANDIDATES: usize = 10_000;

/// The `k` of a recall request that gives none, unless `[recall] default_k` says otherwise: generic Open
/// Inference Protocol clients send only what the model metadata lists, and need an answer without it.
pub(crate) const DEFAULT_K: usize = 100;

/// `[item_features]`: one row per catalogue item, one column per item-side field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemFeaturesSpec {
    /// Safetensors file, relative to the version directory.
    pub(crate) file: String,
    /// Name of the I64 tensor `[items, fields.len()]` in it.
    pub(crate) tensor: String,
    /// Indices into `ModelSpec::fields` of the columns, in column order.
    pub(crate) fields: Vec<usize>,
}

/// `[cooccurrence]`: a CSR item-item table (tensors `indptr` I64 `[items + 1]`, `indices` I64 `[nnz]`, `weights`
/// F32 `[nnz]`): row `h` holds the items `c` that co-occur with `h` and the weight `w(h → c)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CooccurrenceSpec {
    /// Safetensors file, relative to the version directory.
    pub(crate) file: String,
}

/// The candidate features a recommend pipeline computes for each recalled item (docs/model-repository.md,
/// "Candidate features"); a ranking model may declare others, which only rank clients can send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CandidateFeature {
    /// The recall model's score of the candidate.
    RecallScore,
    /// The candidate's 0-based place in the recall stage's list, best first.
    RecallRank,
    /// `Σ w(h → c)` over the distinct items `h` of the request's history, from `[cooccurrence]`.
    Cooccurrence,
}

impl CandidateFeature {
    pub const ALL: [CandidateFeature; 3] = [
        CandidateFeature::RecallScore,
        CandidateFeature::RecallRank,
        CandidateFeature::Cooccurrence,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CandidateFeature::RecallScore => "recall_score",
            CandidateFeature::RecallRank => "recall_rank",
            CandidateFeature::Cooccurrence => "cooccurrence",
        }
    }

    pub fn named(name: &str) -> Option<CandidateFeature> {
        CandidateFeature::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl ModelSpec {
    /// The row width shared by every table the fields read (the `D` axis of `embeddings`).
    pub fn field_dim(&self) -> usize {
        self.fields
            .first()
            .map_or(0, |f| self.tables[f.table].spec.dim)
    }

    pub fn precision(&self) -> Precision {
        match (&self.dense_graph, &self.recall) {
            (Some(graph), _) => graph.precision,
            // A recall model has no dense graph: its precision is that of its item table.
            (None, Some(recall)) => match self.tables[recall.item_table].spec.storage {
                Storage::Int8 => Precision::Int8,
                Storage::Fp32 | Storage::Fp16 => Precision::Fp32,
            },
            (None, None) => Precision::Fp32,
        }
    }

    /// Parses and checks `model.toml` text. Errors are sentences about the file's content; the caller adds the
    /// path.
    pub fn parse(text: &str) -> Result<ModelSpec, String> {
        let raw: RawModel = toml::from_str(text).map_err(|e| e.to_string())?;
        raw.check()
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    format_version: u32,
    kind: ModelKind,
    #[serde(default)]
    description: String,
    #[serde(default)]
    tables: Vec<RawTable>,
    #[serde(default)]
    fields: Vec<RawField>,
    ranking: Option<RawRanking>,
    dense_graph: Option<RawDenseGraph>,
    recall: Option<RawRecall>,
    item_features: Option<RawItemFeatures>,
    cooccurrence: Option<RawCooccurrence>,
    #[serde(default)]
    batching: BatchingSpec,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCooccurrence {
    file: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawItemFeatures {
    file: String,
    #[serde(default = "default_item_features_tensor")]
    tensor: String,
    fields: Vec<String>,
}

fn default_item_features_tensor() -> String {
    "item_features".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTable {
    name: String,
    file: String,
    rows: u64,
    dim: usize,
    storage: Storage,
    #[serde(default = "default_oov")]
    oov: RawOov,
    default_row: Option<u64>,
    #[serde(default = "default_tier")]
    tier: RawTier,
    unfetched: Option<RawUnfetched>,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawTier {
    File,
    Redis,
}

fn default_tier() -> RawTier {
    RawTier::File
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum RawUnfetched {
    DefaultRow,
    Unavailable,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RawOov {
    Default,
    Reject,
}

fn default_oov() -> RawOov {
    RawOov::Default
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawField {
    name: String,
    side: Side,
    table: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRanking {
    #[serde(default)]
    dense_features: Vec<String>,
    #[serde(default)]
    candidate_features: Vec<String>,
    item_id_field: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDenseGraph {
    file: String,
    precision: Precision,
    #[serde(default = "default_embeddings_input")]
    embeddings_input: String,
    #[serde(default = "default_dense_input")]
    dense_input: String,
    #[serde(default = "default_output")]
    output: String,
    split: Option<RawSplit>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSplit {
    user_file: String,
    item_file: String,
    #[serde(default = "default_state")]
    state: String,
}

fn default_state() -> String {
    "user_state".to_owned()
}

fn default_embeddings_input() -> String {
    "embeddings".to_owned()
}
fn default_dense_input() -> String {
    "dense".to_owned()
}
fn default_output() -> String {
    "probability".to_owned()
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRecall {
    user_table: String,
    item_table: String,
    history_table: Option<String>,
    popularity: Option<String>,
    default_k: Option<usize>,
    index: Option<RawIndex>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawIndex {
    file: String,
    nprobe: usize,
    max_candidates: Option<usize>,
    codes: Option<String>,
}

/// A file name inside the version directory: relative, no `..`, not empty.
fn check_relative_file(key: &str, file: &str) -> Result<(), String> {
    let path = Path::new(file);
    let inside = !file.is_empty()
        && path
            .components()
            .all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
    if inside {
        Ok(())
    } else {
        Err(format!(
            "{key} = {file:?} must be a relative path inside the version directory"
        ))
    }
}

fn check_name(what: &str, name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err(format!("{what} name must not be empty"));
    }
    Ok(())
}

/// Checks `[item_features]` against the fields: every column a distinct item-side field, and every item-side
/// field a column except the `item_id_field` (which, when it is not a column, takes the item's id itself).
fn check_item_features(
    raw: RawItemFeatures,
    fields: &[FieldSpec],
    item_id_field: Option<usize>,
) -> Result<ItemFeaturesSpec, String> {
    check_relative_file("item_features.file", &raw.file)?;
    check_name("item_features.tensor", &raw.tensor)?;
    let mut columns = Vec::with_capacity(raw.fields.len());
    for name in &raw.fields {
        let i = fields
            .iter()
            .position(|f| &f.name == name)
            .ok_or_else(|| format!("item_features.fields: {name:?} is not a declared field"))?;
        if fields[i].side != Side::Item {
            return Err(format!(
                "item_features.fields: {name:?} is a side = \"user\" field; the table holds item-side fields only"
            ));
        }
        if columns.contains(&i) {
            return Err(format!("item_features.fields: {name:?} is listed twice"));
        }
        columns.push(i);
    }
    for (i, f) in fields.iter().enumerate() {
        if f.side == Side::Item && Some(i) != item_id_field && !columns.contains(&i) {
            return Err(format!(
                "item_features.fields does not list item-side field {:?}: recalled items need a value for every \
                 item-side field (only ranking.item_id_field may be left out, it then takes the item id)",
                f.name
            ));
        }
    }
    Ok(ItemFeaturesSpec {
        file: raw.file,
        tensor: raw.tensor,
        fields: columns,
    })
}

impl RawModel {
    fn check(self) -> Result<ModelSpec, String> {
        self.batching.check()?;
        if self.format_version != FORMAT_VERSION {
            return Err(format!(
                "format_version = {} is not supported (this server reads {FORMAT_VERSION})",
                self.format_version
            ));
        }
        let mut tables = Vec::with_capacity(self.tables.len());
        let mut table_names = HashSet::new();
        for (i, t) in self.tables.into_iter().enumerate() {
            check_name(&format!("tables[{i}]"), &t.name)?;
            if !table_names.insert(t.name.clone()) {
                return Err(format!("table {:?} is declared twice", t.name));
            }
            check_relative_file(&format!("tables[{i}].file"), &t.file)?;
            if t.rows == 0 {
                return Err(format!("table {:?}: rows must be at least 1", t.name));
            }
            if t.dim == 0 {
                return Err(format!("table {:?}: dim must be at least 1", t.name));
            }
            let oov = match (t.oov, t.default_row) {
                (RawOov::Default, row) => {
                    let row = row.unwrap_or(0);
                    if row >= t.rows {
                        return Err(format!(
                            "table {:?}: default_row = {row} must be below rows = {}",
                            t.name, t.rows
                        ));
                    }
                    OovPolicy::Default { row }
                }
                (RawOov::Reject, None) => OovPolicy::Reject,
                (RawOov::Reject, Some(_)) => {
                    return Err(format!(
                        "table {:?}: default_row is only meaningful with oov = \"default\"",
                        t.name
                    ));
                }
            };
            let tier = match (t.tier, t.unfetched) {
                (RawTier::File, None) => Tier::File,
                (RawTier::File, Some(_)) => {
                    return Err(format!(
                        "table {:?}: unfetched is only meaningful with tier = \"redis\"",
                        t.name
                    ));
                }
                (RawTier::Redis, None | Some(RawUnfetched::Unavailable)) => Tier::Redis {
                    unfetched: Unfetched::Unavailable,
                },
                (RawTier::Redis, Some(RawUnfetched::DefaultRow)) => {
                    if oov == OovPolicy::Reject {
                        return Err(format!(
                            "table {:?}: unfetched = \"default_row\" needs oov = \"default\" (the row it reads is \
                             default_row)",
                            t.name
                        ));
                    }
                    Tier::Redis {
                        unfetched: Unfetched::DefaultRow,
                    }
                }
            };
            tables.push(TableEntry {
                spec: TableSpec {
                    name: t.name,
                    rows: t.rows,
                    dim: t.dim,
                    storage: t.storage,
                    oov,
                },
                file: t.file,
                tier,
            });
        }
        let table_index = |name: &str| tables.iter().position(|t| t.spec.name == name);

        let mut fields = Vec::with_capacity(self.fields.len());
        let mut field_names = HashSet::new();
        for (i, f) in self.fields.into_iter().enumerate() {
            check_name(&format!("fields[{i}]"), &f.name)?;
            if !field_names.insert(f.name.clone()) {
                return Err(format!("field {:?} is declared twice", f.name));
            }
            let table_name = f.table.unwrap_or_else(|| f.name.clone());
            let table = table_index(&table_name).ok_or_else(|| {
                format!(
                    "field {:?} reads table {table_name:?}, which no [[tables]] entry declares",
                    f.name
                )
            })?;
            fields.push(FieldSpec {
                name: f.name,
                side: f.side,
                table,
            });
        }

        let spec = match self.kind {
            ModelKind::Deepfm => {
                if self.recall.is_some() {
                    return Err("[recall] is for kind = \"lightgcn\", not \"deepfm\"".to_owned());
                }
                let graph = self
                    .dense_graph
                    .ok_or("kind = \"deepfm\" needs a [dense_graph] section")?;
                check_relative_file("dense_graph.file", &graph.file)?;
                if let Some(split) = &graph.split {
                    check_relative_file("dense_graph.split.user_file", &split.user_file)?;
                    check_relative_file("dense_graph.split.item_file", &split.item_file)?;
                    check_name("dense_graph.split.state", &split.state)?;
                    if !fields.iter().any(|f| f.side == Side::User)
                        || !fields.iter().any(|f| f.side == Side::Item)
                    {
                        return Err(
                            "[dense_graph.split] needs user-side and item-side fields".to_owned()
                        );
                    }
                }
                let ranking = self.ranking.unwrap_or(RawRanking {
                    dense_features: Vec::new(),
                    candidate_features: Vec::new(),
                    item_id_field: None,
                });
                if fields.is_empty() {
                    return Err("kind = \"deepfm\" needs at least one [[fields]] entry".to_owned());
                }
                let dim = tables[fields[0].table].spec.dim;
                for f in &fields {
                    let t = &tables[f.table].spec;
                    if t.dim != dim {
                        return Err(format!(
                            "field {:?} reads table {:?} with dim {}, but field {:?} reads dim {dim}; \
                             all fields must share one dim (the D axis of the embeddings input)",
                            f.name, t.name, t.dim, fields[0].name
                        ));
                    }
                }
                let mut dense_names = HashSet::new();
                for d in &ranking.dense_features {
                    check_name("ranking.dense_features", d)?;
                    if !dense_names.insert(d) {
                        return Err(format!("dense feature {d:?} is listed twice"));
                    }
                }
                let mut candidate_names = HashSet::new();
                for c in &ranking.candidate_features {
                    check_name("ranking.candidate_features", c)?;
                    if dense_names.contains(c) {
                        return Err(format!(
                            "candidate feature {c:?} is also a dense feature: names must be distinct"
                        ));
                    }
                    if !candidate_names.insert(c) {
                        return Err(format!("candidate feature {c:?} is listed twice"));
                    }
                }
                if graph.split.is_some() && !ranking.candidate_features.is_empty() {
                    return Err(
                        "[dense_graph.split] cannot take ranking.candidate_features: the split graph's user part \
                         reads the dense input once per request, and candidate features vary per candidate"
                            .to_owned(),
                    );
                }
                let wants_cooccurrence = ranking
                    .candidate_features
                    .iter()
                    .any(|c| c == CandidateFeature::Cooccurrence.name());
                let cooccurrence = match (self.cooccurrence, wants_cooccurrence) {
                    (Some(raw), true) => {
                        check_relative_file("cooccurrence.file", &raw.file)?;
                        Some(CooccurrenceSpec { file: raw.file })
                    }
                    (None, false) => None,
                    (None, true) => {
                        return Err(
                            "ranking.candidate_features lists \"cooccurrence\", which needs a [cooccurrence] \
                             section (the item-item table it is computed from)"
                                .to_owned(),
                        );
                    }
                    (Some(_), false) => {
                        return Err(
                            "[cooccurrence] is given, but ranking.candidate_features does not list \
                             \"cooccurrence\": nothing would read the table"
                                .to_owned(),
                        );
                    }
                };
                let item_id_field = match ranking.item_id_field {
                    None => None,
                    Some(name) => {
                        let i = fields.iter().position(|f| f.name == name).ok_or_else(|| {
                            format!("ranking.item_id_field = {name:?} is not a declared field")
                        })?;
                        if fields[i].side != Side::Item {
                            return Err(format!(
                                "ranking.item_id_field = {name:?} must be a side = \"item\" field"
                            ));
                        }
                        Some(i)
                    }
                };
                let item_features = self
                    .item_features
                    .map(|raw| check_item_features(raw, &fields, item_id_field))
                    .transpose()?;
                ModelSpec {
                    kind: self.kind,
                    description: self.description,
                    tables,
                    fields,
                    item_features,
                    cooccurrence,
                    ranking: Some(RankingSpec {
                        dense_features: ranking.dense_features,
                        candidate_features: ranking.candidate_features,
                        item_id_field,
                    }),
                    dense_graph: Some(DenseGraphSpec {
                        file: graph.file,
                        precision: graph.precision,
                        embeddings_input: graph.embeddings_input,
                        dense_input: graph.dense_input,
                        output: graph.output,
                        split: graph.split.map(|s| SplitSpec {
                            user_file: s.user_file,
                            item_file: s.item_file,
                            state: s.state,
                        }),
                    }),
                    recall: None,
                    batching: self.batching,
                }
            }
            ModelKind::Lightgcn => {
                if self.dense_graph.is_some()
                    || self.ranking.is_some()
                    || !fields.is_empty()
                    || self.item_features.is_some()
                    || self.cooccurrence.is_some()
                {
                    return Err(
                        "kind = \"lightgcn\" takes [recall] and [[tables]] only (no [dense_graph], [ranking], [[fields]], [item_features] or [cooccurrence])"
                            .to_owned(),
                    );
                }
                if let Some(t) = tables.iter().find(|t| t.tier != Tier::File) {
                    return Err(format!(
                        "table {:?}: tier = \"redis\" is for deepfm tables only (recall holds its item table whole)",
                        t.spec.name
                    ));
                }
                let recall = self
                    .recall
                    .ok_or("kind = \"lightgcn\" needs a [recall] section")?;
                let lookup = |key: &str, name: &str| {
                    table_index(name)
                        .ok_or_else(|| format!("recall.{key} = {name:?} is not a declared table"))
                };
                let user_table = lookup("user_table", &recall.user_table)?;
                let item_table = lookup("item_table", &recall.item_table)?;
                let history_table = recall
                    .history_table
                    .as_deref()
                    .map(|h| lookup("history_table", h))
                    .transpose()?;
                let dim = tables[item_table].spec.dim;
                for (key, t) in [
                    ("user_table", Some(user_table)),
                    ("history_table", history_table),
                ] {
                    if let Some(t) = t
                        && tables[t].spec.dim != dim
                    {
                        return Err(format!(
                            "recall.{key} {:?} has dim {}, but item_table {:?} has dim {dim}",
                            tables[t].spec.name, tables[t].spec.dim, tables[item_table].spec.name
                        ));
                    }
                }
                if recall.popularity.as_deref() == Some("") {
                    return Err(
                        "recall.popularity must name a tensor in the item table's file".to_owned(),
                    );
                }
                if let Some(h) = history_table
                    && tables[h].spec.rows != tables[item_table].spec.rows
                {
                    return Err(format!(
                        "recall.history_table {:?} has {} rows, but item_table {:?} has {}: one history vector per item",
                        tables[h].spec.name,
                        tables[h].spec.rows,
                        tables[item_table].spec.name,
                        tables[item_table].spec.rows
                    ));
                }
                let items = tables[item_table].spec.rows;
                let default_k = match recall.default_k {
                    None => DEFAULT_K.min(usize::try_from(items).unwrap_or(usize::MAX)),
                    Some(k) if u64::try_from(k).is_ok_and(|k| (1..=items).contains(&k)) => k,
                    Some(k) => {
                        return Err(format!(
                            "recall.default_k = {k} must be from 1 to the {items} items of item_table {:?}",
                            tables[item_table].spec.name
                        ));
                    }
                };
                let index = match recall.index {
                    None => None,
                    Some(raw) => {
                        check_relative_file("recall.index.file", &raw.file)?;
                        if raw.nprobe == 0 {
                            return Err("recall.index.nprobe must be at least 1".to_owned());
                        }
                        let max_candidates = raw.max_candidates.unwrap_or(DEFAULT_MAX_CANDIDATES);
                        if max_candidates == 0 {
                            return Err("recall.index.max_candidates must be at least 1".to_owned());
                        }
                        let codes = raw.codes.unwrap_or_else(|| INDEX_CODES[0].to_owned());
                        if !INDEX_CODES.contains(&codes.as_str()) {
                            return Err(format!(
                                "recall.index.codes = {codes:?} must be \"int8\" or \"pq4\""
                            ));
                        }
                        Some(IndexSpec {
                            file: raw.file,
                            nprobe: raw.nprobe,
                            max_candidates,
                            codes,
                        })
                    }
                };
                ModelSpec {
                    kind: self.kind,
                    description: self.description,
                    tables,
                    fields,
                    ranking: None,
                    dense_graph: None,
                    item_features: None,
                    cooccurrence: None,
                    recall: Some(RecallSpec {
                        user_table,
                        item_table,
                        history_table,
                        popularity: recall.popularity,
                        default_k,
                        index,
                    }),
                    batching: self.batching,
                }
            }
        };
        Ok(spec)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEEPFM: &str = r#"
format_version = 1
kind = "deepfm"

[ranking]
dense_features = ["I1", "I2"]
item_id_field = "item"

[dense_graph]
file = "dense.onnx"
precision = "fp32"

[[tables]]
name = "user"
file = "t.safetensors"
rows = 10
dim = 5
storage = "fp32"

[[tables]]
name = "item"
file = "t.safetensors"
rows = 20
dim = 5
storage = "int8"
oov = "reject"

[[fields]]
name = "user"
side = "user"

[[fields]]
name = "item"
side = "item"

[[fields]]
name = "last_item"
side = "user"
table = "item"
"#;

    fn parse_err(text: &str) -> String {
        ModelSpec::parse(text).expect_err("spec should be refused")
    }

    #[test]
    fn parses_a_deepfm_spec() {
        let spec = ModelSpec::parse(DEEPFM).expect("valid spec");
        assert_eq!(spec.kind, ModelKind::Deepfm);
        assert_eq!(spec.fields.len(), 3);
        assert_eq!(spec.fields[2].table, 1);
        assert_eq!(spec.field_dim(), 5);
        assert_eq!(spec.tables[0].spec.oov, OovPolicy::Default { row: 0 });
        assert_eq!(spec.tables[1].spec.oov, OovPolicy::Reject);
        let ranking = spec.ranking.expect("ranking");
        assert_eq!(ranking.item_id_field, Some(1));
        let graph = spec.dense_graph.expect("graph");
        assert_eq!(graph.embeddings_input, "embeddings");
        assert_eq!(graph.output, "probability");
    }

    #[test]
    fn reads_a_split_graph_and_checks_its_files_and_sides() {
        let split = "precision = \"fp32\"\n\n[dense_graph.split]\nuser_file = \"user.onnx\"\nitem_file = \"item.onnx\"";
        let spec = ModelSpec::parse(&DEEPFM.replacen("precision = \"fp32\"", split, 1))
            .expect("valid spec");
        let graph = spec.dense_graph.expect("graph");
        let parts = graph.split.expect("split");
        assert_eq!(
            (
                parts.user_file.as_str(),
                parts.item_file.as_str(),
                parts.state.as_str()
            ),
            ("user.onnx", "item.onnx", "user_state")
        );
        let escaping = DEEPFM.replacen(
            "precision = \"fp32\"",
            &split.replace("\"item.onnx\"", "\"../item.onnx\""),
            1,
        );
        assert!(parse_err(&escaping).contains("dense_graph.split.item_file"));
        let unknown = DEEPFM.replacen("precision = \"fp32\"", &format!("{split}\nitem = 1"), 1);
        assert!(parse_err(&unknown).contains("unknown field `item`"));
        let no_user_side = DEEPFM
            .replacen("precision = \"fp32\"", split, 1)
            .replace("side = \"user\"", "side = \"item\"");
        assert!(
            parse_err(&no_user_side)
                .contains("[dense_graph.split] needs user-side and item-side fields")
        );
    }

    #[test]
    fn reads_candidate_features_and_the_cooccurrence_table() {
        let with = |features: &str, extra: &str| {
            DEEPFM.replacen(
                "item_id_field = \"item\"",
                &format!("item_id_field = \"item\"\ncandidate_features = {features}{extra}"),
                1,
            )
        };
        let table = "\n\n[cooccurrence]\nfile = \"cooc.safetensors\"";
        let spec = ModelSpec::parse(&with(
            r#"["recall_score", "cooccurrence", "ctr_7d"]"#,
            table,
        ))
        .expect("valid spec");
        let ranking = spec.ranking.expect("ranking");
        assert_eq!(
            ranking.candidate_features,
            ["recall_score", "cooccurrence", "ctr_7d"]
        );
        assert_eq!(spec.cooccurrence.expect("table").file, "cooc.safetensors");
        let cases = [
            (
                with(r#"["recall_score", "recall_score"]"#, ""),
                "candidate feature \"recall_score\" is listed twice",
            ),
            (
                with(r#"["I1"]"#, ""),
                "candidate feature \"I1\" is also a dense feature",
            ),
            (
                with(r#"["cooccurrence"]"#, ""),
                "lists \"cooccurrence\", which needs a [cooccurrence] section",
            ),
            (
                with(r#"["recall_score"]"#, table),
                "[cooccurrence] is given, but ranking.candidate_features does not list",
            ),
            (
                with(r#"["cooccurrence"]"#, &table.replace("cooc.", "../cooc.")),
                "cooccurrence.file",
            ),
            (
                with(r#"["recall_rank"]"#, "").replacen(
                    "precision = \"fp32\"",
                    "precision = \"fp32\"\n\n[dense_graph.split]\nuser_file = \"u.onnx\"\nitem_file = \"i.onnx\"",
                    1,
                ),
                "[dense_graph.split] cannot take ranking.candidate_features",
            ),
        ];
        for (text, expected) in cases {
            let got = parse_err(&text);
            assert!(got.contains(expected), "expected {expected:?} in {got:?}");
        }
    }

    #[test]
    fn reads_each_tables_tier_and_unfetched_policy() {
        let spec = ModelSpec::parse(&DEEPFM.replace(
            "dim = 5\nstorage = \"fp32\"",
            "dim = 5\nstorage = \"fp32\"\ntier = \"redis\"\nunfetched = \"default_row\"",
        ))
        .expect("valid spec");
        assert_eq!(
            spec.tables[0].tier,
            Tier::Redis {
                unfetched: Unfetched::DefaultRow
            }
        );
        assert_eq!(spec.tables[1].tier, Tier::File);
        let spec = ModelSpec::parse(
            &DEEPFM.replace("storage = \"int8\"", "storage = \"int8\"\ntier = \"redis\""),
        )
        .expect("valid spec");
        assert_eq!(
            spec.tables[1].tier,
            Tier::Redis {
                unfetched: Unfetched::Unavailable
            }
        );
        let err = parse_err(&DEEPFM.replace(
            "storage = \"int8\"",
            "storage = \"int8\"\ntier = \"redis\"\nunfetched = \"default_row\"",
        ));
        assert!(
            err.contains("table \"item\": unfetched = \"default_row\" needs oov = \"default\""),
            "{err}"
        );
        let err = parse_err(&DEEPFM.replace(
            "storage = \"int8\"",
            "storage = \"int8\"\nunfetched = \"unavailable\"",
        ));
        assert!(
            err.contains("table \"item\": unfetched is only meaningful with tier = \"redis\""),
            "{err}"
        );
        let err =
            parse_err(&DEEPFM.replace("storage = \"int8\"", "storage = \"int8\"\ntier = \"s3\""));
        assert!(err.contains("unknown variant `s3`"), "{err}");
    }

    #[test]
    fn refuses_unknown_keys() {
        let err = parse_err(&DEEPFM.replace(
            "dim = 5\nstorage = \"fp32\"",
            "dim = 5\nstorage = \"fp32\"\nshards = 2",
        ));
        assert!(err.contains("unknown field `shards`"), "{err}");
    }

    #[test]
    fn refuses_inconsistent_specs() {
        let cases = [
            (
                DEEPFM.replace("format_version = 1", "format_version = 2"),
                "format_version = 2 is not supported",
            ),
            (
                DEEPFM.replace("rows = 10", "rows = 0"),
                "rows must be at least 1",
            ),
            (
                DEEPFM.replace("rows = 20\ndim = 5", "rows = 20\ndim = 6"),
                "all fields must share one dim",
            ),
            (
                DEEPFM.replace("table = \"item\"", "table = \"nope\""),
                "reads table \"nope\", which no [[tables]] entry declares",
            ),
            (
                DEEPFM.replace("item_id_field = \"item\"", "item_id_field = \"user\""),
                "must be a side = \"item\" field",
            ),
            (
                DEEPFM.replace("item_id_field = \"item\"", "item_id_field = \"x\""),
                "is not a declared field",
            ),
            (
                DEEPFM.replace("\"I1\", \"I2\"", "\"I1\", \"I1\""),
                "dense feature \"I1\" is listed twice",
            ),
            (
                DEEPFM.replace("file = \"dense.onnx\"", "file = \"../dense.onnx\""),
                "must be a relative path inside the version directory",
            ),
            (
                DEEPFM.replace(
                    "file = \"t.safetensors\"\nrows = 10",
                    "file = \"/etc/t\"\nrows = 10",
                ),
                "must be a relative path",
            ),
            (
                DEEPFM.replace("storage = \"fp32\"", "storage = \"fp32\"\ndefault_row = 10"),
                "default_row = 10 must be below rows = 10",
            ),
            (
                DEEPFM.replace("oov = \"reject\"", "oov = \"reject\"\ndefault_row = 1"),
                "only meaningful with oov = \"default\"",
            ),
            (
                DEEPFM.replace("storage = \"int8\"", "storage = \"int4\""),
                "unknown variant `int4`",
            ),
            (
                DEEPFM.replace("name = \"last_item\"", "name = \"user\""),
                "field \"user\" is declared twice",
            ),
            (
                format!("{DEEPFM}\n[batching]\nmax_queue_delay_us = 1000001\n"),
                "batching.max_queue_delay_us = 1000001 must be between 0 and 1000000",
            ),
            (
                format!("{DEEPFM}\n[batching]\ndefault_deadline_ms = 0\n"),
                "batching.default_deadline_ms = 0 must be between 1 and 3600000",
            ),
            (
                format!("{DEEPFM}\n[batching]\ndefault_deadline_ms = 3600001\n"),
                "batching.default_deadline_ms = 3600001 must be between 1 and 3600000",
            ),
        ];
        for (text, expected) in cases {
            let err = parse_err(&text);
            assert!(err.contains(expected), "expected {expected:?} in {err:?}");
        }
    }

    #[test]
    fn parses_a_lightgcn_spec() {
        let text = r#"
format_version = 1
kind = "lightgcn"

[recall]
user_table = "user"
item_table = "item"
history_table = "history"
popularity = "item_popularity"

[[tables]]
name = "user"
file = "t.safetensors"
rows = 3
dim = 4
storage = "fp32"

[[tables]]
name = "item"
file = "t.safetensors"
rows = 5
dim = 4
storage = "int8"

[[tables]]
name = "history"
file = "t.safetensors"
rows = 5
dim = 4
storage = "fp32"
"#;
        let spec = ModelSpec::parse(text).expect("valid");
        let recall = spec.recall.as_ref().expect("recall");
        assert_eq!(
            (recall.user_table, recall.item_table, recall.history_table),
            (0, 1, Some(2))
        );
        assert_eq!(recall.popularity.as_deref(), Some("item_popularity"));
        // Without default_k: DEFAULT_K, or the whole catalogue of 5 items when that is smaller.
        assert_eq!(recall.default_k, 5);
        let with_k =
            |k: &str| text.replace("popularity = ", &format!("default_k = {k}\npopularity = "));
        let err = parse_err(&text.replace(
            "rows = 3\ndim = 4\nstorage = \"fp32\"",
            "rows = 3\ndim = 4\nstorage = \"fp32\"\ntier = \"redis\"",
        ));
        assert!(
            err.contains("table \"user\": tier = \"redis\" is for deepfm tables only"),
            "{err}"
        );
        let three = ModelSpec::parse(&with_k("3")).expect("valid");
        assert_eq!(three.recall.expect("recall").default_k, 3);
        for bad in ["0", "6"] {
            let err = parse_err(&with_k(bad));
            assert!(
                err.contains(&format!(
                    "recall.default_k = {bad} must be from 1 to the 5 items of item_table \"item\""
                )),
                "{err}"
            );
        }
        let err = parse_err(&text.replace("popularity = \"item_popularity\"", "popularity = \"\""));
        assert!(
            err.contains("recall.popularity must name a tensor"),
            "{err}"
        );
        assert_eq!(recall.index, None);
        let with_index = |index: &str| {
            text.replace(
                "\n[[tables]]\nname = \"user\"",
                &format!("\n[recall.index]\n{index}\n\n[[tables]]\nname = \"user\""),
            )
        };
        let indexed =
            ModelSpec::parse(&with_index("file = \"ivf.safetensors\"\nnprobe = 8")).expect("valid");
        assert_eq!(
            indexed.recall.expect("recall").index,
            Some(IndexSpec {
                file: "ivf.safetensors".to_owned(),
                nprobe: 8,
                max_candidates: DEFAULT_MAX_CANDIDATES,
                codes: "int8".to_owned(),
            })
        );
        let pq = ModelSpec::parse(&with_index(
            "file = \"ivf.safetensors\"\nnprobe = 8\ncodes = \"pq4\"",
        ))
        .expect("valid");
        assert_eq!(
            pq.recall.expect("recall").index.expect("index").codes,
            "pq4"
        );
        for (index, says) in [
            (
                "file = \"ivf.safetensors\"\nnprobe = 0",
                "recall.index.nprobe must be at least 1",
            ),
            (
                "file = \"ivf.safetensors\"\nnprobe = 2\nmax_candidates = 0",
                "recall.index.max_candidates must be at least 1",
            ),
            (
                "file = \"../ivf\"\nnprobe = 2",
                "recall.index.file = \"../ivf\" must be a relative path",
            ),
            ("file = \"ivf.safetensors\"", "missing field `nprobe`"),
            (
                "file = \"ivf\"\nnprobe = 2\ncodes = \"pq8\"",
                "recall.index.codes = \"pq8\" must be \"int8\" or \"pq4\"",
            ),
            (
                "file = \"ivf\"\nnprobe = 2\nrerank = 3",
                "unknown field `rerank`",
            ),
        ] {
            let err = parse_err(&with_index(index));
            assert!(err.contains(says), "{index}: {err}");
        }
        assert_eq!(spec.precision(), Precision::Int8);
        let err = parse_err(&text.replace(
            "rows = 5\ndim = 4\nstorage = \"fp32\"",
            "rows = 6\ndim = 4\nstorage = \"fp32\"",
        ));
        assert!(err.contains("one history vector per item"), "{err}");
    }

    #[test]
    fn parses_and_checks_item_features() {
        let with = |section: &str| format!("{DEEPFM}\n[item_features]\n{section}\n");
        let spec = ModelSpec::parse(&with("file = \"items.safetensors\"\nfields = []"))
            .expect("item_id_field may be the only item field left out");
        let features = spec.item_features.expect("item_features");
        assert_eq!(features.tensor, "item_features");
        assert!(features.fields.is_empty());
        let spec = ModelSpec::parse(&with(
            "file = \"items.safetensors\"\ntensor = \"f\"\nfields = [\"item\"]",
        ))
        .expect("the item_id_field may be a column");
        assert_eq!(spec.item_features.expect("features").fields, vec![1]);
        assert!(
            ModelSpec::parse(DEEPFM)
                .expect("valid")
                .item_features
                .is_none()
        );

        let cases = [
            (
                "file = \"../x\"\nfields = []",
                "item_features.file = \"../x\" must be a relative path",
            ),
            (
                "file = \"x\"\nfields = [\"nope\"]",
                "\"nope\" is not a declared field",
            ),
            (
                "file = \"x\"\nfields = [\"user\"]",
                "\"user\" is a side = \"user\" field",
            ),
            (
                "file = \"x\"\nfields = [\"item\", \"item\"]",
                "\"item\" is listed twice",
            ),
            (
                "file = \"x\"\ntensor = \"\"\nfields = []",
                "item_features.tensor name must not be empty",
            ),
            (
                "file = \"x\"\nfields = []\nrows = 3",
                "unknown field `rows`",
            ),
        ];
        for (section, expected) in cases {
            let err = parse_err(&with(section));
            assert!(err.contains(expected), "expected {expected:?} in {err:?}");
        }
        // Without an item_id_field, every item-side field must be a column.
        let err =
            parse_err(&with("file = \"x\"\nfields = []").replace("item_id_field = \"item\"\n", ""));
        assert!(
            err.contains("does not list item-side field \"item\""),
            "{err}"
        );
        let err = parse_err(
            "format_version = 1\nkind = \"lightgcn\"\n[item_features]\nfile = \"x\"\nfields = []\n",
        );
        assert!(
            err.contains(
                "no [dense_graph], [ranking], [[fields]], [item_features] or [cooccurrence]"
            ),
            "{err}"
        );
    }
}
