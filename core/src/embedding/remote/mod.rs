//! The `redis` tier of embedding tables: a table with `tier = "redis"` in `model.toml` lives in a Redis Cluster
//! ([`redis`]) under an in-process cache of hot rows ([`cache`]), behind the same [`EmbeddingStore`] gather as the
//! mapped files. A model may mix tiers: its `file` tables are memory-mapped as on the CPU store.
//!
//! A gather resolves every id (OOV policy as everywhere), reads what it can from the cache, and fetches the
//! batch's distinct missing rows from the cluster in one go: one MGET per hash-tag group, all in flight together,
//! waited for until the batch's earliest deadline, and `--redis-fetch-timeout-ms`, at most. A row that did not
//! come in time follows its table's `unfetched` policy: the table's default row (held in memory from load on,
//! counted), or the batch fails with 503.
//!
//! Where the waiting happens: on the executor thread that gathers (an OS thread of its own, never a tokio
//! worker), while the Redis client's own runtime thread does the I/O. So a fetch blocks one executor for about
//! one round trip, never the HTTP/gRPC workers or the batcher, and other executors keep running. The other place
//! considered, fetching a request's misses in its async task before it is queued, would keep executors from ever
//! waiting but needs the rows pinned in the cache from that fetch to the gather, and a batch would make one round
//! trip per request instead of one per batch.

pub(crate) mod breaker;
pub mod cache;
pub mod redis;
pub mod updates;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use prometheus::{Histogram, IntCounter, IntGauge};

use self::breaker::{Admit, Breakers, Outcome};
use self::cache::{CacheMetrics, RowCache};
use self::redis::{FetchFailure, GroupAnswer, RedisCluster};
use self::updates::{Follow, Follower, UpdateMetrics, UpdatedTables};
use super::cpu::{decode_row, resolve_row};
use super::{EmbeddingStore, GatherError, ShardLayout, TableBytes, check_gather_shape};
use crate::error::LoadError;
use crate::repository::{TableSpec, Unfetched};

/// The server's side of the tier: where the cluster is (`--redis-url`), how much each model may cache
/// (`--embedding-cache-bytes`), how long a batch waits for its rows at most (`--redis-fetch-timeout-ms`), and the
/// one connection every model shares, made when a model first needs it.
#[derive(Debug, Clone)]
pub struct TierContext {
    nodes: Vec<String>,
    pub(crate) cache_bytes: u64,
    pub(crate) fetch_timeout: Duration,
    cluster: Arc<Mutex<Option<Arc<RedisCluster>>>>,
    /// `recserve_embedding_tier_client_replaced_total`, which the connection counts its replacements in.
    replaced: IntCounter,
}

impl TierContext {
    pub fn new(
        nodes: Vec<String>,
        cache_bytes: u64,
        fetch_timeout: Duration,
        replaced: IntCounter,
    ) -> TierContext {
        TierContext {
            nodes,
            cache_bytes,
            fetch_timeout,
            cluster: Arc::default(),
            replaced,
        }
    }

    /// The shared connection, connecting now if there is none yet (a failed attempt is tried again by the next
    /// load).
    pub(crate) fn cluster(&self) -> Result<Arc<RedisCluster>, String> {
        if self.nodes.is_empty() {
            return Err(
                "it has tables with tier = \"redis\", but the server has no --redis-url".to_owned(),
            );
        }
        let mut cluster = self.cluster.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(cluster) = cluster.as_ref() {
            return Ok(Arc::clone(cluster));
        }
        let connected = Arc::new(RedisCluster::connect(&self.nodes, self.replaced.clone())?);
        *cluster = Some(Arc::clone(&connected));
        Ok(connected)
    }
}

/// What the tier reports into, for one model (`docs/metrics.md`).
#[derive(Clone, Debug)]
pub struct TierMetrics {
    pub(crate) hits: IntCounter,
    pub(crate) misses: IntCounter,
    /// One observation per batch that fetched.
    pub(crate) fetch_duration: Histogram,
    pub rows_fetched: IntCounter,
    /// Rows not fetched, by [`FetchFailure::ALL`] order.
    pub failures: [IntCounter; 6],
    /// Hash-tag groups whose breaker is open.
    pub open_groups: IntGauge,
    pub cache: CacheMetrics,
    /// Following the version's update stream.
    pub updates: UpdateMetrics,
}

/// A table of a [`TieredStore`], as `model.toml` places it.
#[derive(Debug)]
pub(crate) enum TableSource {
    /// Mapped from its file (as [`super::open_tables`] returns it).
    File(TableBytes),
    /// In the cluster; `unfetched` rows read the default row (fetched at load) or fail the batch.
    Redis {
        unfetched: Unfetched,
        /// `recserve_embedding_unfetched_total` of the table: ids read from the default row because their row
        /// was not fetched in time.
        defaulted: IntCounter,
    },
}

#[derive(Debug)]
enum Source {
    File(TableBytes),
    Redis {
        defaulted: IntCounter,
        /// The table's `default_row` when `unfetched = "default_row"`; `None`: unfetched rows fail the batch.
        default_row: Option<Bytes>,
    },
}

/// Where one model's rows are in the cluster.
#[derive(Debug)]
struct Remote {
    cluster: Arc<RedisCluster>,
    model: String,
    version: u64,
    /// Hash-tag groups of the version's keys, from its completion marker.
    groups: u64,
    /// `--redis-fetch-timeout-ms`: a batch's fetch waits until its deadline, this long at most.
    fetch_timeout: Duration,
    /// Shared with the [`Follower`], which drops updated rows from it.
    cache: Arc<RowCache>,
    /// One per group; shared with the probes in flight.
    breakers: Arc<Breakers>,
    metrics: TierMetrics,
    /// Whether the version serves yet ([`EmbeddingStore::serving`]): its warm-up's lookups and fetches are not
    /// traffic and count nowhere.
    counting: AtomicBool,
}

/// Tables of one model in the Redis tier (and possibly mapped files), gathered on the CPU.
#[derive(Debug)]
pub(crate) struct TieredStore {
    specs: Vec<TableSpec>,
    layouts: Vec<ShardLayout>,
    sources: Vec<Source>,
    row_bytes: Vec<usize>,
    oov: Vec<IntCounter>,
    remote: Remote,
    /// Follows the version's update stream while the store lives (stopped when it is dropped).
    _follower: Follower,
}

/// The most hash-tag groups a version may have: Redis Cluster's slots (more would share slots anyway).
const MAX_GROUPS: u64 = 16384;

/// How long a load may wait for the default rows.
const LOAD_BUDGET: Duration = Duration::from_secs(10);

/// A row of the batch, as the gather finds it.
enum Slot<'a> {
    Mapped(&'a [u8]),
    Held(Bytes),
    /// Index into the batch's distinct misses.
    Miss(usize),
}

impl TieredStore {
    /// Checks the version's completion marker in the cluster (present, every Redis table's row count equal to
    /// `model.toml`'s), fetches the default rows of tables that fall back on them, and sets up the cache.
    /// `version_dir` is for messages.
    #[expect(
        clippy::too_many_arguments,
        reason = "one store of one model version, built once at load"
    )]
    pub(crate) fn open(
        version_dir: &std::path::Path,
        tier: &TierContext,
        model: &str,
        version: u64,
        specs: Vec<TableSpec>,
        sources: Vec<TableSource>,
        oov: Vec<IntCounter>,
        metrics: TierMetrics,
    ) -> Result<TieredStore, LoadError> {
        let fail = |m: String| LoadError::new(version_dir, m);
        let cluster = tier.cluster().map_err(&fail)?;
        let marker = cluster.marker(model, version).map_err(&fail)?;
        let marker_key = redis::marker_key(model, version);
        if marker.is_empty() {
            return Err(fail(format!(
                "the Redis tier has no completion marker for this version ({marker_key} on {:?}): it was not \
                 published, or its publishing did not finish (python -m recserve_models publish)",
                cluster.nodes()
            )));
        }
        let groups = marker
            .get("groups")
            .and_then(|g| g.parse::<u64>().ok())
            .filter(|g| (1..=MAX_GROUPS).contains(g))
            .ok_or_else(|| {
                fail(format!(
                    "{marker_key} has no valid `groups` field (1 to {MAX_GROUPS})"
                ))
            })?;
        for (spec, source) in specs.iter().zip(&sources) {
            if let TableSource::Redis { .. } = source {
                let published = marker.get(&format!("rows:{}", spec.name));
                match published.map(|r| r.parse::<u64>()) {
                    Some(Ok(rows)) if rows == spec.rows => {}
                    Some(Ok(rows)) => {
                        return Err(fail(format!(
                            "table {:?}: the Redis tier holds {rows} rows of it, but model.toml declares rows = {}",
                            spec.name, spec.rows
                        )));
                    }
                    _ => {
                        return Err(fail(format!(
                            "table {:?}: the Redis tier's completion marker {marker_key} does not list it (was it \
                             published with tier = \"redis\"?)",
                            spec.name
                        )));
                    }
                }
            }
        }
        // Updates announced before now are in the rows already; the follower reads on from the last of them, and
        // starts before any row is cached.
        let stream = updates::stream_key(model, version);
        let after = cluster.last_entry(&stream).map_err(&fail)?;
        let updated = UpdatedTables(
            specs
                .iter()
                .zip(&sources)
                .enumerate()
                .filter(|(_, (_, source))| matches!(source, TableSource::Redis { .. }))
                .map(|(t, (spec, _))| (spec.name.clone(), (t, spec.rows)))
                .collect(),
        );
        let row_bytes: Vec<usize> = specs.iter().map(|s| s.storage.row_bytes(s.dim)).collect();
        let widest = row_bytes.iter().copied().max().unwrap_or(1);
        let cache = Arc::new(RowCache::new(
            tier.cache_bytes,
            widest,
            metrics.cache.clone(),
        ));
        let follower = updates::follow(
            &cluster,
            Follow {
                key: stream,
                after,
                cache: Arc::clone(&cache),
                tables: updated,
                metrics: metrics.updates.clone(),
            },
        )
        .map_err(&fail)?;
        let remote = Remote {
            fetch_timeout: tier.fetch_timeout,
            breakers: Arc::new(Breakers::new(groups as usize, metrics.open_groups.clone())),
            cache,
            cluster,
            model: model.to_owned(),
            version,
            groups,
            metrics,
            counting: AtomicBool::new(false),
        };
        let mut store = TieredStore {
            layouts: specs.iter().map(|s| ShardLayout::new(s.rows, 1)).collect(),
            sources: Vec::with_capacity(sources.len()),
            row_bytes,
            specs,
            oov,
            remote,
            _follower: follower,
        };
        for (t, source) in sources.into_iter().enumerate() {
            let source = match source {
                TableSource::File(bytes) => Source::File(bytes),
                TableSource::Redis {
                    unfetched,
                    defaulted,
                } => {
                    let default_row = match (unfetched, store.specs[t].oov) {
                        (Unfetched::DefaultRow, crate::repository::OovPolicy::Default { row }) => {
                            let fetched =
                                store.fetch(&[(t, row)], Instant::now() + LOAD_BUDGET, LOAD_BUDGET);
                            match fetched.into_iter().next() {
                                Some(Ok(bytes)) => Some(bytes),
                                Some(Err(failure)) => {
                                    return Err(fail(format!(
                                        "table {:?}: cannot fetch its default_row = {row} from the Redis tier ({})",
                                        store.specs[t].name,
                                        failure.as_str()
                                    )));
                                }
                                None => None,
                            }
                        }
                        _ => None,
                    };
                    Source::Redis {
                        defaulted,
                        default_row,
                    }
                }
            };
            store.sources.push(source);
        }
        Ok(store)
    }

    /// Fetches rows `(table, row)` (distinct) until `deadline` and `budget` from now at most, caching those that
    /// came; one answer per row. Rows of groups whose breaker is open are not waited for ([`breaker`]).
    fn fetch(
        &self,
        rows: &[(usize, u64)],
        deadline: Instant,
        budget: Duration,
    ) -> Vec<Result<Bytes, FetchFailure>> {
        let remote = &self.remote;
        let started = Instant::now();
        let until = deadline.min(started + budget);
        // A timeout within a budget that a request's deadline cut short says nothing about the node.
        let full_budget = deadline >= started + budget;
        // Rows by hash-tag group, each group one MGET.
        let mut by_group: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, &(_, row)) in rows.iter().enumerate() {
            by_group.entry(row % remote.groups).or_default().push(i);
        }
        // Noted before the MGETs go out: a row updated meanwhile is used by this batch but not cached.
        let epochs: Vec<u64> = rows
            .iter()
            .map(|&(t, row)| remote.cache.epoch(cache::key(t, row)))
            .collect();
        let keys = |member: &[usize]| -> Vec<String> {
            member
                .iter()
                .map(|&i| {
                    let (t, row) = rows[i];
                    redis::row_key(
                        &remote.model,
                        remote.version,
                        remote.groups,
                        &self.specs[t].name,
                        row,
                    )
                })
                .collect()
        };
        let mut out = vec![Err(FetchFailure::Skipped); rows.len()];
        let mut fetched: Vec<(usize, Vec<usize>)> = Vec::with_capacity(by_group.len());
        for (group, member) in by_group {
            let group = group as usize;
            match remote.breakers.admit(group, started) {
                Admit::Fetch => fetched.push((group, member)),
                Admit::Skip => {}
                Admit::Probe => {
                    let arrival = Arrival {
                        cache: Arc::clone(&remote.cache),
                        metrics: remote.metrics.clone(),
                        rows: member
                            .iter()
                            .map(|&i| {
                                let (t, row) = rows[i];
                                (cache::key(t, row), self.row_bytes[t], epochs[i])
                            })
                            .collect(),
                    };
                    let breakers = Arc::clone(&remote.breakers);
                    remote
                        .cluster
                        .probe(keys(&member), remote.fetch_timeout, move |answer| {
                            let outcome = outcome(&answer, true);
                            if let Ok(values) = answer {
                                arrival.store(values);
                            }
                            breakers.probed(group, outcome, Instant::now());
                        });
                }
            }
        }
        let m = &remote.metrics;
        let counting = remote.counting.load(Ordering::Relaxed);
        if !fetched.is_empty() {
            let groups = fetched.iter().map(|(_, member)| keys(member)).collect();
            let answers = remote.cluster.fetch(groups, until);
            let now = Instant::now();
            for ((group, member), answer) in fetched.iter().zip(answers) {
                remote
                    .breakers
                    .fetched(*group, outcome(&answer, full_budget), now);
                match answer {
                    Ok(values) => {
                        for (&i, value) in member.iter().zip(values) {
                            let (t, row) = rows[i];
                            out[i] = match value {
                                None => Err(FetchFailure::Missing),
                                Some(v) if v.len() != self.row_bytes[t] => {
                                    Err(FetchFailure::BadRow)
                                }
                                Some(v) => {
                                    let bytes = Bytes::from(v);
                                    remote.cache.insert_if_current(
                                        cache::key(t, row),
                                        bytes.clone(),
                                        epochs[i],
                                    );
                                    Ok(bytes)
                                }
                            };
                        }
                    }
                    Err(failure) => {
                        for &i in member {
                            out[i] = Err(failure);
                        }
                    }
                }
            }
            if counting {
                m.fetch_duration.observe(started.elapsed().as_secs_f64());
            }
        }
        for result in out.iter().filter(|_| counting) {
            match result {
                Ok(_) => m.rows_fetched.inc(),
                Err(failure) => m.failures[failure_index(*failure)].inc(),
            }
        }
        remote.cache.report();
        out
    }
}

/// How a group's answer counts for its breaker; `full_budget`: it was given the whole `--redis-fetch-timeout-ms`.
fn outcome(answer: &GroupAnswer, full_budget: bool) -> Outcome {
    match answer {
        Ok(_) => Outcome::Answered,
        Err(FetchFailure::Timeout) if !full_budget => Outcome::Unknown,
        Err(_) => Outcome::Failed,
    }
}

/// Where a probe's rows go when it is answered, on the Redis client's thread: into the cache (unless updated
/// meanwhile), counted as fetched. The batch that sent it did not wait and read its `unfetched` policy.
struct Arrival {
    cache: Arc<RowCache>,
    metrics: TierMetrics,
    /// Per key of the MGET: the cache key, the table's row length, the row's epoch when the probe went out.
    rows: Vec<(u64, usize, u64)>,
}

impl Arrival {
    fn store(&self, values: Vec<Option<Vec<u8>>>) {
        for (&(key, len, epoch), value) in self.rows.iter().zip(values) {
            match value {
                Some(v) if v.len() == len => {
                    self.cache.insert_if_current(key, Bytes::from(v), epoch);
                    self.metrics.rows_fetched.inc();
                }
                Some(_) => self.metrics.failures[failure_index(FetchFailure::BadRow)].inc(),
                None => self.metrics.failures[failure_index(FetchFailure::Missing)].inc(),
            }
        }
        self.cache.report();
    }
}

fn failure_index(failure: FetchFailure) -> usize {
    FetchFailure::ALL
        .iter()
        .position(|&f| f == failure)
        .unwrap_or(0)
}

/// How long a gather without a deadline (not on the request path) may wait for rows.
const UNTIMED_BUDGET: Duration = Duration::from_secs(1);

impl EmbeddingStore for TieredStore {
    fn tables(&self) -> &[TableSpec] {
        &self.specs
    }

    fn shard_layouts(&self) -> &[ShardLayout] {
        &self.layouts
    }

    fn device(&self) -> &str {
        "cpu"
    }

    fn serving(&self) {
        self.remote.counting.store(true, Ordering::Relaxed);
    }

    fn gather(&self, fields: &[usize], ids: &[i64], out: &mut [f32]) -> Result<(), GatherError> {
        self.gather_until(fields, ids, out, Instant::now() + UNTIMED_BUDGET)
    }

    fn gather_until(
        &self,
        fields: &[usize],
        ids: &[i64],
        out: &mut [f32],
        deadline: Instant,
    ) -> Result<(), GatherError> {
        let dim = check_gather_shape(&self.specs, fields, ids, out)?;
        let nf = fields.len();
        let remote = &self.remote;
        let mut slots = Vec::with_capacity(ids.len());
        let mut misses: Vec<(usize, u64)> = Vec::new();
        let mut missed: HashMap<u64, usize> = HashMap::new();
        let (mut hits, mut lookups) = (0u64, 0u64);
        for (p, &id) in ids.iter().enumerate() {
            let t = fields[p % nf];
            let row = resolve_row(&self.specs[t], id, p / nf, &self.oov[t])?;
            let slot = match &self.sources[t] {
                Source::File(bytes) => {
                    let start = row as usize * self.row_bytes[t];
                    Slot::Mapped(&bytes.as_slice()[start..start + self.row_bytes[t]])
                }
                Source::Redis { .. } => {
                    lookups += 1;
                    let key = cache::key(t, row);
                    match remote.cache.get(key) {
                        Some(bytes) => {
                            hits += 1;
                            Slot::Held(bytes)
                        }
                        None => Slot::Miss(*missed.entry(key).or_insert_with(|| {
                            misses.push((t, row));
                            misses.len() - 1
                        })),
                    }
                }
            };
            slots.push(slot);
        }
        if remote.counting.load(Ordering::Relaxed) {
            remote.metrics.hits.inc_by(hits);
            remote.metrics.misses.inc_by(lookups - hits);
        }
        let fetched = if misses.is_empty() {
            Vec::new()
        } else {
            self.fetch(&misses, deadline, remote.fetch_timeout)
        };
        for (p, (slot, dst)) in slots.iter().zip(out.chunks_exact_mut(dim)).enumerate() {
            let t = fields[p % nf];
            let storage = self.specs[t].storage;
            match slot {
                Slot::Mapped(row) => decode_row(storage, row, dst),
                Slot::Held(row) => decode_row(storage, row, dst),
                Slot::Miss(i) => match (&fetched[*i], &self.sources[t]) {
                    (Ok(row), _) => decode_row(storage, row, dst),
                    (
                        Err(_),
                        Source::Redis {
                            default_row: Some(row),
                            defaulted,
                            ..
                        },
                    ) => {
                        defaulted.inc();
                        decode_row(storage, row, dst);
                    }
                    (Err(failure), _) => {
                        let rows = fetched.iter().filter(|r| r.is_err()).count();
                        return Err(GatherError::Unfetched {
                            table: self.specs[t].name.clone(),
                            rows,
                            failure: failure.as_str(),
                        });
                    }
                },
            }
        }
        Ok(())
    }
}
