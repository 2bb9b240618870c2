//! The Redis Cluster the `redis` tier reads: the key scheme (shared with `recserve_models publish`, documented in
//! `docs/model-repository.md`), the connection (the `redis` crate's cluster client, which follows MOVED/ASK,
//! refreshes its slot map and reconnects to nodes that come back), and the fetch of one batch's missing rows.
//!
//! The client runs on a tokio runtime of its own (one thread, `recserve-redis`), so that Redis I/O never waits
//! behind the HTTP/gRPC workers and the executor threads, which are not tokio threads, can hand it work: an
//! executor sends a batch's misses over and waits at most the batch's budget for the answer.
//!
//! A connection that stops answering is replaced. The crate's cluster connection routes every request on one task;
//! while that task refreshes its slot map (after a MOVED, or a node lost), it polls none of the requests in flight,
//! and the refresh waits for the write half of the lock those requests read the slot map under. A request that took
//! its read permit in a poll where the task's tokio budget ran out (since tokio 1.54 such an acquire keeps its permit
//! and returns pending, to keep the lock's order) holds that permit until it is polled again, which never happens:
//! the refresh waits for good and nothing is answered, on every node, until the process restarts. A batch's 64
//! MGETs from two executors are about the 128 budget units of one poll, so this followed failovers and restarted
//! nodes in about half the runs (docs/model-repository.md, "When the client stalls"). So a watchdog sends a PING
//! every [`PROBE_EVERY`] and, when the connection has answered nothing at all, neither a value nor an error, for
//! [`WEDGED_AFTER`], connects again and swaps the new connection in; the old one's task is aborted when the last
//! fetch holding it lets go. A request is never unanswered that long otherwise: every step of the client is bounded
//! by [`RESPONSE_TIMEOUT`] (a slot-map query to a node that accepts connections but does not answer, stopped or
//! partitioned, would wait for good too).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock, mpsc};
use std::time::{Duration, Instant};

use prometheus::IntCounter;
use redis::cluster::{ClusterClient, ClusterClientBuilder};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};

use super::updates::EntryId;

/// The version of the key scheme; the first part of every key.
pub(crate) const SCHEME: &str = "rs1";

/// The key of row `id` of `table` of `model` version `version`: `rs1:{model/version/g}:table:id` with
/// `g = id mod groups`. The hash tag `{model/version/g}` puts every row of a version into one of `groups` slots
/// whatever its table, so a batch's rows are fetched with at most `groups` MGETs.
pub fn row_key(model: &str, version: u64, groups: u64, table: &str, id: u64) -> String {
    format!(
        "{SCHEME}:{{{model}/{version}/{}}}:{table}:{id}",
        id % groups
    )
}

/// The key of a version's completion marker, a hash that `publish` writes after every row: `groups` and, for each
/// table, `rows:<table>`.
pub(crate) fn marker_key(model: &str, version: u64) -> String {
    format!("{SCHEME}:{{{model}/{version}}}:published")
}

/// Why rows were not fetched, as `recserve_embedding_tier_errors_total` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FetchFailure {
    /// The batch's budget ran out first.
    Timeout,
    /// No connection to the node (down, partitioned, failing over).
    Connection,
    /// The node answered with an error.
    Server,
    /// The key does not exist: the version was not (fully) published.
    Missing,
    /// The value's length is not the table's row length.
    BadRow,
    /// Not asked for: its hash-tag group failed recently and its breaker is open ([`super::breaker`]).
    Skipped,
}

impl FetchFailure {
    pub(crate) const ALL: [FetchFailure; 6] = [
        FetchFailure::Timeout,
        FetchFailure::Connection,
        FetchFailure::Server,
        FetchFailure::Missing,
        FetchFailure::BadRow,
        FetchFailure::Skipped,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            FetchFailure::Timeout => "timeout",
            FetchFailure::Connection => "connection",
            FetchFailure::Server => "server",
            FetchFailure::Missing => "missing",
            FetchFailure::BadRow => "bad_row",
            FetchFailure::Skipped => "skipped",
        }
    }

    fn of(e: &redis::RedisError) -> FetchFailure {
        if e.is_timeout() {
            FetchFailure::Timeout
        } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
            FetchFailure::Connection
        } else {
            FetchFailure::Server
        }
    }
}

/// One MGET: keys of one hash-tag group.
pub(crate) type Group = Vec<String>;

/// The answer to one group: a value (or nil) per key, or why the group failed.
pub(crate) type GroupAnswer = Result<Vec<Option<Vec<u8>>>, FetchFailure>;

/// A connection to a Redis Cluster, shared by every model that has tables in it.
pub struct RedisCluster {
    /// Always `Some` until dropped: [`Drop`] shuts it down without waiting, which is allowed anywhere (the last
    /// model holding the connection may be dropped on a tokio worker).
    runtime: Option<tokio::runtime::Runtime>,
    live: Arc<Live>,
    nodes: Vec<String>,
}

/// The connection every request clones, and when it last answered anything; replaced by the watchdog
/// ([`watch`]) when it stops answering.
struct Live {
    connection: RwLock<ClusterConnection>,
    epoch: Instant,
    /// Milliseconds from `epoch` to the connection's last answer: a value or an error it returned (not a request
    /// given up by our own timeout).
    answered_ms: AtomicU64,
}

impl Live {
    fn new(connection: ClusterConnection) -> Live {
        Live {
            connection: RwLock::new(connection),
            epoch: Instant::now(),
            answered_ms: AtomicU64::new(0),
        }
    }

    fn current(&self) -> ClusterConnection {
        self.connection
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn answered(&self) {
        let ms = self.epoch.elapsed().as_millis() as u64;
        self.answered_ms.fetch_max(ms, Ordering::Relaxed);
    }

    /// How long since its last answer.
    fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.answered_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    fn replace(&self, connection: ClusterConnection) {
        *self
            .connection
            .write()
            .unwrap_or_else(PoisonError::into_inner) = connection;
        self.answered();
    }
}

impl std::fmt::Debug for RedisCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCluster")
            .field("nodes", &self.nodes)
            .finish_non_exhaustive()
    }
}

/// How long connecting to a node may take before the client tries another.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long the client waits for one answer of one node (a fetch gives up sooner, at its budget); it bounds every
/// step of the client's recovery, so that a request is always answered, if only with an error.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// How often the watchdog sends a PING through the connection.
pub(crate) const PROBE_EVERY: Duration = Duration::from_millis(500);
/// How long a connection may answer nothing, neither a value nor an error, before the watchdog replaces it:
/// longer than a healthy client takes to answer or fail a request ([`RESPONSE_TIMEOUT`], plus its retries).
pub(crate) const WEDGED_AFTER: Duration = Duration::from_secs(3);
/// How long the start-up commands (connect, the marker, the default rows) may take.
const LOAD_TIMEOUT: Duration = Duration::from_secs(10);

impl RedisCluster {
    /// Connects to the cluster through any of `nodes` (`redis://host:port` or `host:port`); `replaced` counts the
    /// connection's replacements by the watchdog.
    pub fn connect(nodes: &[String], replaced: IntCounter) -> Result<RedisCluster, String> {
        let nodes: Vec<String> = nodes
            .iter()
            .map(|n| {
                if n.contains("://") {
                    n.clone()
                } else {
                    format!("redis://{n}")
                }
            })
            .collect();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("recserve-redis")
            .on_thread_start(|| {
                crate::threads::register_current_thread(
                    crate::threads::ThreadRole::Other,
                    "recserve-redis",
                );
            })
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the Redis client's thread: {e}"))?;
        let client = client(&nodes, RESPONSE_TIMEOUT, None)?;
        let connecting = client.clone();
        let connection = wait_on(&runtime, LOAD_TIMEOUT, async move {
            connecting.get_async_connection().await
        })
        .ok_or_else(|| {
            format!("no answer from the Redis Cluster at {nodes:?} within {LOAD_TIMEOUT:?}")
        })?
        .map_err(|e| format!("cannot connect to the Redis Cluster at {nodes:?}: {e}"))?;
        let live = Arc::new(Live::new(connection));
        live.answered();
        runtime.spawn(watch(Arc::clone(&live), client, replaced));
        Ok(RedisCluster {
            runtime: Some(runtime),
            live,
            nodes,
        })
    }

    /// A client of the same cluster whose connections wait `response_timeout` for an answer, for a task that
    /// needs a connection of its own ([`super::updates`]).
    pub(crate) fn follower_client(
        &self,
        response_timeout: Duration,
    ) -> Result<ClusterClient, String> {
        client(&self.nodes, response_timeout, Some(response_timeout))
    }

    /// Runs `task` on the client's runtime.
    pub(crate) fn spawn(
        &self,
        task: impl Future<Output = ()> + Send + 'static,
    ) -> tokio::task::JoinHandle<()> {
        self.runtime().spawn(task)
    }

    /// The ID of the last entry of stream `key`, [`EntryId::ZERO`] when there is none. For loading only.
    pub(crate) fn last_entry(&self, key: &str) -> Result<EntryId, String> {
        let live = Arc::clone(&self.live);
        let xrevrange = redis::cmd("XREVRANGE")
            .arg(key)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .clone();
        let entries = wait_on(self.runtime(), LOAD_TIMEOUT, async move {
            let answer = xrevrange
                .query_async::<Vec<(String, redis::Value)>>(&mut live.current())
                .await;
            live.answered();
            answer
        })
        .ok_or_else(|| format!("no answer for {key} within {LOAD_TIMEOUT:?}"))?
        .map_err(|e| format!("cannot read {key}: {e}"))?;
        match entries.first() {
            None => Ok(EntryId::ZERO),
            Some((id, _)) => EntryId::parse(id)
                .ok_or_else(|| format!("{key}: the last entry's ID {id:?} is not <ms>-<seq>")),
        }
    }

    fn runtime(&self) -> &tokio::runtime::Runtime {
        self.runtime
            .as_ref()
            .expect("the runtime lives until the connection is dropped")
    }

    /// The nodes it was given, for messages.
    pub(crate) fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// The completion marker of a version (empty when there is none). For loading only: blocks the caller.
    pub(crate) fn marker(
        &self,
        model: &str,
        version: u64,
    ) -> Result<HashMap<String, String>, String> {
        let live = Arc::clone(&self.live);
        let key = marker_key(model, version);
        let hgetall = redis::cmd("HGETALL").arg(&key).clone();
        wait_on(self.runtime(), LOAD_TIMEOUT, async move {
            let answer = hgetall
                .query_async::<HashMap<String, String>>(&mut live.current())
                .await;
            live.answered();
            answer
        })
        .ok_or_else(|| format!("no answer for {key} within {LOAD_TIMEOUT:?}"))?
        .map_err(|e| format!("cannot read {key}: {e}"))
    }

    /// Fetches `groups` (one MGET each, all in flight together: the client sends each to its node over that
    /// node's one multiplexed connection, so the batch waits about one round trip to the slowest node) and waits
    /// until `deadline` at most. A group not answered by then is [`FetchFailure::Timeout`]; the others keep their
    /// answers. Callable from any thread that is not one of the client's own.
    pub fn fetch(&self, groups: Vec<Group>, deadline: Instant) -> Vec<GroupAnswer> {
        let n = groups.len();
        if n == 0 {
            return Vec::new();
        }
        let connection = self.live.current();
        let until = tokio::time::Instant::from_std(deadline);
        let requests = groups
            .into_iter()
            .map(|keys| mget(connection.clone(), Arc::clone(&self.live), keys, until));
        let all = futures_util::future::join_all(requests.collect::<Vec<_>>());
        // Each group times out by itself at the deadline; the margin covers a client thread slow to be scheduled.
        let wait = deadline.saturating_duration_since(Instant::now()) + Duration::from_millis(5);
        wait_on(self.runtime(), wait, all).unwrap_or_else(|| vec![Err(FetchFailure::Timeout); n])
    }

    /// Sends one group's MGET without waiting for it: `answered` gets its answer on the client's thread, a
    /// [`FetchFailure::Timeout`] after `timeout`. A breaker's probe ([`super::breaker`]).
    pub(crate) fn probe(
        &self,
        keys: Group,
        timeout: Duration,
        answered: impl FnOnce(GroupAnswer) + Send + 'static,
    ) {
        let until = tokio::time::Instant::from_std(Instant::now() + timeout);
        let mget = mget(self.live.current(), Arc::clone(&self.live), keys, until);
        self.runtime().spawn(async move { answered(mget.await) });
    }
}

/// One group's MGET on `connection`, given up at `until`; an answer, even an error, is noted in `live`.
async fn mget(
    mut connection: ClusterConnection,
    live: Arc<Live>,
    keys: Group,
    until: tokio::time::Instant,
) -> GroupAnswer {
    let mut cmd = redis::cmd("MGET");
    cmd.arg(&keys);
    let mget = async {
        let answer = cmd
            .query_async::<Vec<Option<Vec<u8>>>>(&mut connection)
            .await;
        live.answered();
        answer
    };
    match tokio::time::timeout_at(until, mget).await {
        Err(_) => Err(FetchFailure::Timeout),
        Ok(Err(e)) => Err(FetchFailure::of(&e)),
        Ok(Ok(values)) if values.len() != keys.len() => Err(FetchFailure::Server),
        Ok(Ok(values)) => Ok(values),
    }
}

/// The watchdog of a connection (module docs): a PING every [`PROBE_EVERY`] (bounded by [`WEDGED_AFTER`], so a
/// stuck connection's probes let it go), and a new connection in place of one that has answered nothing for
/// [`WEDGED_AFTER`]. Runs until the client's runtime shuts down.
async fn watch(live: Arc<Live>, client: ClusterClient, replaced: IntCounter) {
    let mut every = tokio::time::interval(PROBE_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let mut connection = live.current();
        let probed = Arc::clone(&live);
        tokio::spawn(async move {
            let ping = connection.route_command(
                redis::cmd("PING"),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            );
            if tokio::time::timeout(WEDGED_AFTER, ping).await.is_ok() {
                probed.answered();
            }
        });
        let silent = live.silent_for();
        if silent < WEDGED_AFTER {
            continue;
        }
        tracing::warn!(
            silent_ms = silent.as_millis() as u64,
            "the Redis Cluster connection has answered nothing, not even an error; connecting again"
        );
        match tokio::time::timeout(LOAD_TIMEOUT, client.get_async_connection()).await {
            Ok(Ok(connection)) => {
                live.replace(connection);
                replaced.inc();
                tracing::info!("the Redis Cluster connection was replaced");
            }
            Ok(Err(e)) => tracing::warn!("cannot connect to the Redis Cluster again: {e}"),
            Err(_) => tracing::warn!(
                "no answer from the Redis Cluster within {LOAD_TIMEOUT:?} while connecting again"
            ),
        }
    }
}

/// The cluster client: short connect timeouts and few quick retries, so a batch's fetch fails over to its
/// `unfetched` policy instead of waiting; each answer of a node waited for `response_timeout` at most, a whole
/// request (retries included) `overall` at most (`None`: the caller bounds it).
fn client(
    nodes: &[String],
    response_timeout: Duration,
    overall: Option<Duration>,
) -> Result<ClusterClient, String> {
    ClusterClientBuilder::new(nodes.to_vec())
        .connection_timeout(CONNECT_TIMEOUT)
        .response_timeout(response_timeout)
        .overall_response_timeout(overall)
        .retries(3)
        .min_retry_wait(10)
        .max_retry_wait(200)
        .build()
        .map_err(|e| format!("invalid Redis Cluster address in {nodes:?}: {e}"))
}

/// Runs `future` on `runtime` and waits for it `timeout` at most; `None` when it did not finish in time. Unlike
/// `block_on`, callable from any thread, a tokio worker's included.
fn wait_on<T: Send + 'static>(
    runtime: &tokio::runtime::Runtime,
    timeout: Duration,
    future: impl Future<Output = T> + Send + 'static,
) -> Option<T> {
    let (tx, rx) = mpsc::sync_channel(1);
    runtime.spawn(async move {
        if let Ok(value) = tokio::time::timeout(timeout, future).await {
            let _ = tx.send(value);
        }
    });
    rx.recv_timeout(timeout + Duration::from_millis(100)).ok()
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_model_version_table_and_id_and_group_by_hash_tag() {
        assert_eq!(
            row_key("deepfm", 3, 64, "C1", 4113),
            "rs1:{deepfm/3/17}:C1:4113"
        );
        assert_eq!(
            row_key("deepfm", 3, 64, "C2", 17),
            "rs1:{deepfm/3/17}:C2:17"
        );
        assert_eq!(marker_key("deepfm", 3), "rs1:{deepfm/3}:published");
    }
}
