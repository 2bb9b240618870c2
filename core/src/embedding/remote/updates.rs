//! Online row updates of the Redis tier: a trainer overwrites rows of a serving version in the cluster and then
//! announces them on the version's update stream (`python -m recserve_models update`); every server that serves
//! the version follows the stream with a task of its own and drops the announced rows from its cache, so the next
//! batch that needs them fetches the new values. The format is in `docs/model-repository.md` ("Online row
//! updates").
//!
//! Why a Redis Stream and not Pub/Sub: a stream keeps its entries, so a server whose connection dropped (a node
//! restarted, a failover, a partition) reads on from the last entry it applied instead of silently missing the
//! updates sent meanwhile; Pub/Sub would forget them and the server would serve stale rows until evicted. A stream
//! is trimmed (`MAXLEN ~`) by the publisher; a server that comes back after entries it had not read were trimmed
//! (Redis's `max-deleted-entry-id`) cannot know which rows changed and drops its whole cache.
//!
//! Never a torn row: a row is one Redis value, written whole by `SET` and read whole by `MGET`, and the cache holds
//! immutable copies, so a batch sees each row either before or after an update. The race that remains, a fetch
//! sent before the update whose old answer would be cached after the drop, is closed by the cache's update epochs
//! ([`super::cache`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use prometheus::{Histogram, IntCounter, IntGauge};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;

use super::cache::{self, RowCache};
use super::redis::{RedisCluster, SCHEME};

/// The key of the update stream of a version: `rs1:{M/V}:updates` (the marker's slot).
pub fn stream_key(model: &str, version: u64) -> String {
    format!("{SCHEME}:{{{model}/{version}}}:updates")
}

/// A stream entry's ID, `<ms>-<seq>`: the Redis master's clock in milliseconds when the entry was added, and a
/// sequence number within that millisecond.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct EntryId {
    pub(crate) ms: u64,
    pub(crate) seq: u64,
}

impl EntryId {
    /// Before every entry.
    pub(crate) const ZERO: EntryId = EntryId { ms: 0, seq: 0 };

    pub(crate) fn parse(id: &str) -> Option<EntryId> {
        let (ms, seq) = id.split_once('-')?;
        Some(EntryId {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// The Redis-tier tables of a store, by name: their index in the store and their row count.
#[derive(Clone, Debug, Default)]
pub(crate) struct UpdatedTables(pub HashMap<String, (usize, u64)>);

/// One announced update as the server applies it.
#[derive(Debug, PartialEq)]
pub(crate) struct Update {
    /// When it was announced, in microseconds since the Unix epoch: the entry's `published_us` field (the
    /// publisher's clock), or else its ID's milliseconds (the Redis master's clock).
    pub(crate) published_us: u64,
    /// `(table index, row)` of every row it names that the store has.
    pub(crate) rows: Vec<(usize, u64)>,
    /// What of the entry could not be read (an unknown table, an id that is not a row); those parts are skipped.
    pub(crate) problems: Vec<String>,
}

/// Reads one stream entry: `published_us` (optional) and `rows:<table>` fields whose values are row ids in
/// decimal, separated by commas. Other fields are ignored, so a later publisher may add some.
pub(crate) fn parse_entry(
    id: EntryId,
    fields: &HashMap<String, Vec<u8>>,
    tables: &UpdatedTables,
) -> Update {
    let mut update = Update {
        published_us: id.ms.saturating_mul(1000),
        rows: Vec::new(),
        problems: Vec::new(),
    };
    let mut names: Vec<&String> = fields.keys().collect();
    names.sort();
    for name in names {
        let value = &fields[name];
        if name == "published_us" {
            match std::str::from_utf8(value)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
            {
                Some(us) => update.published_us = us,
                None => update
                    .problems
                    .push("`published_us` is not a whole number of microseconds".to_owned()),
            }
            continue;
        }
        let Some(table) = name.strip_prefix("rows:") else {
            continue;
        };
        let Some(&(t, rows)) = tables.0.get(table) else {
            update.problems.push(format!(
                "table {table:?} is not a Redis-tier table of this version"
            ));
            continue;
        };
        let Ok(ids) = std::str::from_utf8(value) else {
            update.problems.push(format!("`{name}` is not text"));
            continue;
        };
        for item in ids.split(',').filter(|s| !s.is_empty()) {
            match item.trim().parse::<u64>() {
                Ok(row) if row < rows => update.rows.push((t, row)),
                _ => update.problems.push(format!(
                    "`{name}`: {item:?} is not a row of the table (0 to {})",
                    rows.saturating_sub(1)
                )),
            }
        }
    }
    update
}

/// Why following the stream went wrong, as `recserve_embedding_update_errors_total` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FollowError {
    /// Reading the stream failed (node down, failing over, partitioned); the follower retries.
    Connection,
    /// An entry, or part of one, could not be read and was skipped.
    BadEntry,
    /// Entries were trimmed from the stream before this server read them; it dropped its whole cache.
    Gap,
}

impl FollowError {
    pub(crate) const ALL: [FollowError; 3] = [
        FollowError::Connection,
        FollowError::BadEntry,
        FollowError::Gap,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            FollowError::Connection => "connection",
            FollowError::BadEntry => "bad_entry",
            FollowError::Gap => "gap",
        }
    }
}

/// What following one model's update stream reports into (`docs/metrics.md`).
#[derive(Clone, Debug)]
pub struct UpdateMetrics {
    /// From an entry's timestamp to its rows dropped from the cache.
    pub(crate) visible: Histogram,
    pub entries: IntCounter,
    pub(crate) rows: IntCounter,
    /// By [`FollowError::ALL`] order.
    pub(crate) errors: [IntCounter; 3],
    /// Versions whose last read of their stream succeeded (each follower adds 1 while it follows).
    pub(crate) following: IntGauge,
}

impl UpdateMetrics {
    fn error(&self, e: FollowError) {
        let i = FollowError::ALL.iter().position(|&x| x == e).unwrap_or(0);
        self.errors[i].inc();
    }
}

/// Entries read per XREAD at most.
const READ_COUNT: usize = 1000;
/// How long one XREAD blocks waiting for entries (it answers at once when one comes).
const BLOCK: Duration = Duration::from_millis(1000);
/// How long the follower's connection waits for an answer: past [`BLOCK`], so an idle stream is no error.
const RESPONSE_TIMEOUT: Duration = Duration::from_millis(3000);
/// Pause before reading again after an error.
const RETRY: Duration = Duration::from_millis(100);

/// The task following one store's update stream; stopped when dropped (the store is dropped with its version).
#[derive(Debug)]
pub(crate) struct Follower {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Follower {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Where and from where to follow, and what to drop rows from.
#[derive(Debug)]
pub(crate) struct Follow {
    pub(crate) key: String,
    /// The last entry already reflected in the cache: the stream's last entry before the cache held any row.
    pub(crate) after: EntryId,
    pub(crate) cache: Arc<RowCache>,
    pub(crate) tables: UpdatedTables,
    pub(crate) metrics: UpdateMetrics,
}

/// Starts following on the cluster client's runtime, over a connection of its own (an XREAD that blocks on the
/// shared connection would hold up the node's fetches behind it).
pub(crate) fn follow(cluster: &RedisCluster, follow: Follow) -> Result<Follower, String> {
    let client = cluster.follower_client(RESPONSE_TIMEOUT)?;
    let task = cluster.spawn(run(client, follow));
    Ok(Follower { task })
}

/// Whether this follower counts in [`UpdateMetrics::following`]; it stops counting when the task is dropped.
struct Following {
    gauge: IntGauge,
    on: bool,
}

impl Following {
    fn set(&mut self, on: bool) {
        match (self.on, on) {
            (false, true) => self.gauge.inc(),
            (true, false) => self.gauge.dec(),
            _ => {}
        }
        self.on = on;
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        self.set(false);
    }
}

async fn run(client: ClusterClient, f: Follow) {
    let mut following = Following {
        gauge: f.metrics.following.clone(),
        on: false,
    };
    let mut connection: Option<ClusterConnection> = None;
    let mut last = f.after;
    // Whether trimmed entries may have been missed: after an error, or when the last read was a full one.
    let mut check_gap = false;
    loop {
        let conn = match connection.as_mut() {
            Some(c) => c,
            None => match client.get_async_connection().await {
                Ok(c) => connection.insert(c),
                Err(e) => {
                    failed(&f, &mut following, &format!("cannot connect: {e}"));
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            },
        };
        if check_gap {
            match trimmed_after(conn, &f.key, last).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::warn!(stream = %f.key, last = %last,
                        "update entries were trimmed before this server read them: dropping the whole row cache");
                    f.cache.invalidate_all();
                    f.metrics.error(FollowError::Gap);
                }
                Err(e) => {
                    failed(
                        &f,
                        &mut following,
                        &format!("cannot read the stream's state: {e}"),
                    );
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            }
        }
        let mut xread = redis::cmd("XREAD");
        xread
            .arg("COUNT")
            .arg(READ_COUNT)
            .arg("BLOCK")
            .arg(BLOCK.as_millis() as u64)
            .arg("STREAMS")
            .arg(&f.key)
            .arg(last.to_string());
        type Reply = Option<Vec<(String, Vec<(String, HashMap<String, Vec<u8>>)>)>>;
        match xread.query_async::<Reply>(conn).await {
            Ok(reply) => {
                if !following.on {
                    tracing::info!(stream = %f.key, after = %last, "following the update stream");
                }
                following.set(true);
                let entries: Vec<_> = reply
                    .into_iter()
                    .flatten()
                    .flat_map(|(_, entries)| entries)
                    .collect();
                check_gap = entries.len() >= READ_COUNT;
                for (id, fields) in entries {
                    let Some(id) = EntryId::parse(&id) else {
                        f.metrics.error(FollowError::BadEntry);
                        continue;
                    };
                    apply(&f, id, &fields);
                    last = id;
                }
            }
            Err(e) => {
                failed(&f, &mut following, &e.to_string());
                check_gap = true;
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

fn failed(f: &Follow, following: &mut Following, error: &str) {
    if following.on {
        tracing::warn!(stream = %f.key, error, "reading the update stream failed; retrying");
    }
    following.set(false);
    f.metrics.error(FollowError::Connection);
}

/// Drops the rows of one entry and observes how long after its announcement that happened.
fn apply(f: &Follow, id: EntryId, fields: &HashMap<String, Vec<u8>>) {
    let update = parse_entry(id, fields, &f.tables);
    for &(t, row) in &update.rows {
        f.cache.invalidate(cache::key(t, row));
    }
    if !update.problems.is_empty() {
        tracing::warn!(stream = %f.key, entry = %id, problems = ?update.problems,
            "parts of an update entry were skipped");
        f.metrics.error(FollowError::BadEntry);
    }
    f.cache.report();
    let now_us = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    f.metrics
        .visible
        .observe(now_us.saturating_sub(update.published_us) as f64 / 1e6);
    f.metrics.entries.inc();
    f.metrics.rows.inc_by(update.rows.len() as u64);
}

/// Whether entries after `last` were deleted from the stream (`max-deleted-entry-id`, Redis 7) before being read.
async fn trimmed_after(
    conn: &mut ClusterConnection,
    key: &str,
    last: EntryId,
) -> redis::RedisResult<bool> {
    let info = redis::cmd("XINFO")
        .arg("STREAM")
        .arg(key)
        .query_async::<HashMap<String, redis::Value>>(conn)
        .await;
    let info = match info {
        Ok(info) => info,
        // No stream yet: nothing was ever announced, so nothing was trimmed.
        Err(e) if e.detail().is_some_and(|d| d.contains("no such key")) => return Ok(false),
        Err(e) => return Err(e),
    };
    let deleted = match info.get("max-deleted-entry-id") {
        Some(redis::Value::BulkString(b)) => std::str::from_utf8(b).ok().and_then(EntryId::parse),
        Some(redis::Value::SimpleString(s)) => EntryId::parse(s),
        _ => None,
    };
    Ok(deleted.is_some_and(|d| d > last))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tables() -> UpdatedTables {
        UpdatedTables(HashMap::from([
            ("C1".to_owned(), (0, 100)),
            ("C7".to_owned(), (6, 5)),
        ]))
    }

    fn fields(pairs: &[(&str, &str)]) -> HashMap<String, Vec<u8>> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect()
    }

    #[test]
    fn keys_and_ids() {
        assert_eq!(stream_key("deepfm", 3), "rs1:{deepfm/3}:updates");
        let id = EntryId::parse("1764650000123-7").expect("id");
        assert_eq!((id.ms, id.seq), (1_764_650_000_123, 7));
        assert_eq!(id.to_string(), "1764650000123-7");
        assert!(EntryId::parse("1764650000123-8").expect("id") > id);
        assert!(EntryId::parse("1764650000124-0").expect("id") > id);
        assert_eq!(EntryId::parse("12"), None);
        assert_eq!(EntryId::parse("a-1"), None);
    }

    #[test]
    fn an_entry_names_rows_by_table_and_its_time() {
        let id = EntryId { ms: 5, seq: 0 };
        let update = parse_entry(
            id,
            &fields(&[
                ("published_us", "4999"),
                ("rows:C1", "3,99,0"),
                ("rows:C7", "4"),
                ("by", "trainer-2"),
            ]),
            &tables(),
        );
        assert_eq!(update.published_us, 4999);
        assert_eq!(update.rows, vec![(0, 3), (0, 99), (0, 0), (6, 4)]);
        assert!(update.problems.is_empty(), "{:?}", update.problems);
        // Without `published_us`, the entry's ID tells the time.
        let update = parse_entry(id, &fields(&[("rows:C7", "1")]), &tables());
        assert_eq!((update.published_us, update.rows), (5000, vec![(6, 1)]));
    }

    #[test]
    fn what_cannot_be_read_is_named_and_skipped() {
        let update = parse_entry(
            EntryId::ZERO,
            &fields(&[
                ("rows:C1", "1,100,x,2"),
                ("rows:C9", "1"),
                ("published_us", "soon"),
            ]),
            &tables(),
        );
        assert_eq!(update.rows, vec![(0, 1), (0, 2)]);
        assert_eq!(
            update.problems,
            vec![
                "`published_us` is not a whole number of microseconds",
                "`rows:C1`: \"100\" is not a row of the table (0 to 99)",
                "`rows:C1`: \"x\" is not a row of the table (0 to 99)",
                "table \"C9\" is not a Redis-tier table of this version",
            ]
        );
    }
}
