//! Loading a recall model: opening its tables, making the item table a [`Catalogue`] (laid out at load, or, for a
//! model with an IVF index, read where it is mapped, so the table is held once), opening its IVF index, checking the user and history tables, warming an executor up so the batcher's estimate starts from
//! measured batch times, and starting the batcher.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::contract::{IndexContract, RecallContract, Search, Source};
use super::executor::{Query, RecallExecutor, RecallWork, Tables};
use super::signal::Popularity;
use super::{Catalogue, IvfIndex, Probe, RecallModel, ivf};
use crate::batching::{BatchConfig, Batcher, Estimator, Job};
use crate::embedding::{CpuStore, EmbeddingStore, open_tables};
use crate::error::LoadError;
use crate::metrics::RecallMetrics;
use crate::registry::LoadContext;
use crate::repository::{BatchingSpec, IndexSpec, ModelSpec, ModelVersion, TableSpec};

/// Queries per batch unless the model's `[batching]` or the server's flags say otherwise: a batch of 64 queries
/// scores the catalogue 64 times per pass over its memory, and waits at most one such pass.
pub const DEFAULT_MAX_BATCH_QUERIES: usize = 64;

/// Warm-up measures batch sizes 1, 2, 4, … and stops after the first that takes longer than this (the batcher's
/// estimate scales the nearest measured size for the others, and learns from every executed batch).
const WARM_UP_BUDGET: Duration = Duration::from_millis(250);

impl RecallModel {
    /// Opens the tables, makes the item table a [`Catalogue`] in `--shards` shards (laid out at load; read where
    /// it is mapped when the model has an index), measures a few batch sizes for the batcher's estimate, and
    /// starts the batcher.
    pub(crate) fn load(
        ctx: &LoadContext,
        mv: &ModelVersion,
        spec: Arc<ModelSpec>,
    ) -> Result<RecallModel, LoadError> {
        let toml = mv.dir.join("model.toml");
        let recall = spec
            .recall
            .as_ref()
            .ok_or_else(|| LoadError::new(&toml, "a lightgcn model needs [recall]"))?;
        let entry = |t: usize| spec.tables[t].clone();
        let item = entry(recall.item_table);
        // One call, so that tables sharing a file share one mapping (a second map of the same file would count its
        // pages twice in the process's memory).
        let mut entries = vec![item.clone(), entry(recall.user_table)];
        entries.extend(recall.history_table.map(entry));
        let mut bytes = open_tables(&mv.dir, &entries, ctx.preload)?;
        let store_entries = entries.split_off(1);
        let item_bytes = bytes.remove(0);
        let index = recall
            .index
            .as_ref()
            .map(|spec| open_index(&mv.dir, spec, &item.spec, &item_bytes, ctx.preload))
            .transpose()?;
        // With an index, the exact catalogue reads the same mapped rows as the index's re-rank: one copy of the
        // table. Without one, the table is laid out at load for the fastest exact scan.
        let catalogue = if index.is_some() {
            Catalogue::mapped(&item.spec, Arc::new(item_bytes), ctx.shards)
        } else {
            Catalogue::new(&item.spec, item_bytes.as_slice(), ctx.shards)
        }
        .map_err(|problem| {
            LoadError::new(
                &mv.dir.join(&item.file),
                format!("recall.item_table {:?} {problem}", item.spec.name),
            )
        })?;

        let mut zero_rows = Vec::with_capacity(store_entries.len());
        for (e, b) in store_entries.iter().zip(&bytes) {
            zero_rows.push(scan_rows(&e.spec, b.as_slice()).map_err(|problem| {
                LoadError::new(
                    &mv.dir.join(&e.file),
                    format!("table {:?} {problem}", e.spec.name),
                )
            })?);
        }
        let history_zero = zero_rows.pop().filter(|_| recall.history_table.is_some());
        let popularity = recall
            .popularity
            .as_deref()
            .map(|tensor| Popularity::open(&mv.dir.join(&item.file), tensor, catalogue.items()))
            .transpose()?;
        let counters = store_entries
            .iter()
            .map(|e| ctx.metrics.oov_counter(&mv.name, &e.spec.name))
            .collect();
        let specs: Vec<TableSpec> = store_entries.iter().map(|e| e.spec.clone()).collect();
        let store = CpuStore::new(specs, bytes, ctx.shards, counters);

        let mut shard_counts = vec![1; spec.tables.len()];
        shard_counts[recall.item_table] = catalogue.shards();
        shard_counts[recall.user_table] = store.shard_layouts()[0].shards;
        if let Some(h) = recall.history_table {
            shard_counts[h] = store.shard_layouts()[1].shards;
        }
        for (i, t) in spec.tables.iter().enumerate() {
            let bytes = if i == recall.item_table {
                catalogue.bytes()
            } else {
                t.spec.bytes()
            };
            ctx.metrics.set_table_bytes(
                &mv.name,
                &t.spec.name,
                t.spec.storage.as_str(),
                "cpu",
                bytes,
            );
        }
        let (batching, default_deadline) = batch_config(ctx, &spec.batching);
        let contract = RecallContract {
            user_table: spec.tables[recall.user_table].spec.clone(),
            history_table: recall.history_table.map(|h| spec.tables[h].spec.clone()),
            item_table: item.spec,
            default_k: recall.default_k,
            limits: ctx.limits,
            queue: batching.fit(),
            index: index.as_ref().map(|(index, probe)| IndexContract {
                nlist: index.nlist(),
                default: *probe,
            }),
        };
        if let Some((index, _)) = &index {
            ctx.metrics.set_table_bytes(
                &mv.name,
                &format!("{}.index", contract.item_table.name),
                "int8",
                "cpu",
                index.bytes(),
            );
        }
        let tables = Arc::new(Tables {
            dim: catalogue.dim(),
            catalogue,
            store,
            history_zero: history_zero.unwrap_or_default(),
            popularity,
            index,
        });

        let estimator = Estimator::new(&batching.buckets);
        let metrics = ctx.metrics.recall(&mv.name);
        let mut executors: Vec<RecallExecutor> = (0..ctx.executors)
            .map(|_| RecallExecutor::new(Arc::clone(&tables), metrics.clone()))
            .collect();
        if let Some(first) = executors.first_mut().filter(|_| ctx.warm_up) {
            let started = Instant::now();
            // The warm-up's queries are not traffic: they count nowhere.
            let counted =
                std::mem::replace(&mut first.metrics, RecallMetrics::unexported(&mv.name));
            let warmed = warm_up(first, &batching, &estimator, contract.items());
            first.metrics = counted;
            warmed.map_err(|problem| LoadError::new(&mv.dir, problem))?;
            ctx.metrics
                .observe_warmup(&mv.name, started.elapsed().as_secs_f64());
        }
        tracing::info!(
            model = %mv.name,
            items = tables.catalogue.items(),
            dim = tables.dim,
            shards = tables.catalogue.shards(),
            storage = tables.catalogue.storage().as_str(),
            isa = tables.catalogue.isa().as_str(),
            index_lists = tables.index.as_ref().map(|(i, _)| i.nlist()),
            index_bytes = tables.index.as_ref().map(|(i, _)| i.bytes()),
            "recall catalogue ready"
        );
        let batcher = Batcher::start(
            &mv.name,
            batching.clone(),
            estimator,
            executors,
            ctx.metrics.batching(&mv.name, mv.version),
        )
        .map_err(|e| LoadError::new(&mv.dir, format!("cannot start the executor threads: {e}")))?;
        Ok(RecallModel {
            contract,
            tables,
            shard_counts,
            batcher,
            batching,
            default_deadline,
        })
    }
}

/// Recall's batching: the model's `[batching]` with recall's own defaults (64 queries, no queue delay: a query
/// runs as soon as an executor is free, and queries that arrive meanwhile share the next pass), under the
/// server's flags. Unless buckets are configured, every batch size is its own bucket: recall pads nothing.
fn batch_config(ctx: &LoadContext, model: &BatchingSpec) -> (BatchConfig, Duration) {
    let mut spec = model.clone();
    spec.max_batch_rows.get_or_insert(DEFAULT_MAX_BATCH_QUERIES);
    spec.max_queue_delay_us.get_or_insert(0);
    let (mut config, deadline) = ctx.batching.resolve(&spec);
    if ctx.batching.buckets.is_none() && model.buckets.is_none() {
        config.buckets = (1..=config.max_batch_rows).collect();
    }
    (config, deadline)
}

/// Runs batches of 1, 2, 4, … zero queries (while each takes under [`WARM_UP_BUDGET`]) and records their times.
fn warm_up(
    executor: &mut RecallExecutor,
    batching: &BatchConfig,
    estimator: &Estimator,
    items: usize,
) -> Result<(), String> {
    let k = items.min(100);
    let search = match &executor.tables.index {
        Some((_, probe)) => Search::Index(*probe),
        None => Search::Exact,
    };
    let mut size = 1;
    loop {
        let size_now = size.min(batching.max_batch_rows);
        let queries = (0..size_now)
            .map(|_| Query {
                source: Source::User(0),
                k,
                exclude: Vec::new(),
                search,
                history_used: None,
            })
            .collect();
        let (job, mut answer) = Job::new(RecallWork { queries });
        let started = Instant::now();
        executor.answer(vec![job], None);
        let took = started.elapsed();
        match answer.try_recv().map(|a| a.result) {
            Ok(Ok(answers)) if answers.len() == size_now => {}
            Ok(Ok(_)) => return Err("a warm-up query got no answer".to_owned()),
            Ok(Err(e)) => return Err(format!("warm-up query failed: {e}")),
            Err(_) => return Err("warm-up query got no answer".to_owned()),
        }
        estimator.observe(size_now, took);
        if size_now >= batching.max_batch_rows || took > WARM_UP_BUDGET {
            return Ok(());
        }
        size *= 2;
    }
}

/// Maps `[recall.index]`'s file and checks it against the item table (`table`, mapped): what it was built from, its
/// structure, and `nprobe` against its `nlist`. The error names the file and the mismatch. Public so that tools
/// (`examples/ivf_bench.rs`) open an index exactly as the server does.
pub fn open_index(
    dir: &std::path::Path,
    spec: &IndexSpec,
    item: &TableSpec,
    table: &crate::embedding::TableBytes,
    preload: crate::embedding::Preload,
) -> Result<(IvfIndex, Probe), LoadError> {
    let path = dir.join(&spec.file);
    let map = crate::embedding::map_file(&path, preload)?;
    let file: ivf::Bytes = Arc::new(map);
    let index = IvfIndex::open(file, item, Arc::new(table.clone()))
        .map_err(|problem| LoadError::new(&path, format!("recall.index: {problem}")))?;
    if spec.codes != index.codes_name() {
        return Err(LoadError::new(
            &path,
            format!(
                "recall.index.codes = {:?}, but the index file holds {:?} codes: rebuild it with `python -m \
                 recserve_models index --codes {}` or set codes = {:?}",
                spec.codes,
                index.codes_name(),
                spec.codes,
                index.codes_name()
            ),
        ));
    }
    if spec.nprobe > index.nlist() {
        return Err(LoadError::new(
            &path,
            format!(
                "recall.index.nprobe = {} is more than the index's {} lists",
                spec.nprobe,
                index.nlist()
            ),
        ));
    }
    let probe = Probe {
        nprobe: spec.nprobe,
        max_candidates: spec.max_candidates,
    };
    Ok((index, probe))
}

/// Which rows of a user or history table are zero vectors; refuses a table with a non-finite value (a NaN or
/// infinite user or history vector would have no ordered scores).
fn scan_rows(spec: &TableSpec, bytes: &[u8]) -> Result<Vec<bool>, String> {
    let row_bytes = spec.storage.row_bytes(spec.dim);
    let mut values = vec![0.0f32; spec.dim];
    let mut zero = Vec::with_capacity(spec.rows as usize);
    for (row, chunk) in bytes.chunks_exact(row_bytes).enumerate() {
        crate::embedding::cpu::decode_row(spec.storage, chunk, &mut values);
        if let Some(v) = values.iter().find(|v| !v.is_finite()) {
            return Err(format!(
                "row {row} holds a non-finite value ({v}): recall needs finite embeddings"
            ));
        }
        zero.push(values.iter().all(|&v| v == 0.0));
    }
    Ok(zero)
}
