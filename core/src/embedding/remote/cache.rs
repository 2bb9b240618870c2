//! The in-process cache of hot rows in front of the Redis tier: rows as stored (the table's byte layout), keyed by
//! (table, row), bounded in bytes. It is `quick_cache`'s sharded cache (one lock per shard, never a global one)
//! with its S3-FIFO-style eviction: a new row enters a small probation queue and is evicted from there unless it
//! is read again, so one pass over cold ids does not flush the Zipf-hot rows (an LRU would let it).
//!
//! Online updates ([`super::updates`]) drop rows from it while fetches fill it. A fetch that was sent before an
//! update and answered with the old value must not put that value back after the update dropped the row, or the
//! server would serve the old row until it is evicted. So every key belongs to one of [`STRIPES`] update epochs:
//! a fetch notes its rows' epochs before it sends ([`RowCache::epoch`]), and inserts a row only if its epoch has
//! not moved since ([`RowCache::insert_if_current`]); an update moves the epoch and drops the row under the same
//! stripe lock ([`RowCache::invalidate`]), so the check and the insert cannot straddle it.

use std::sync::{Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use prometheus::{IntCounter, IntGauge};
use quick_cache::Lifecycle;
use quick_cache::Weighter;
use quick_cache::sync::Cache;

/// Bytes an entry costs beyond its row: key, value handle and the cache's own bookkeeping, so that the bound
/// holds for what the process holds, not only for row bytes.
pub(crate) const ENTRY_OVERHEAD_BYTES: u64 = 64;

/// The cache key of row `row` of table `table` (tables are few, rows fewer than 2^48).
#[inline]
pub(crate) fn key(table: usize, row: u64) -> u64 {
    ((table as u64) << 48) | row
}

#[derive(Clone, Debug)]
struct RowWeighter;

impl Weighter<u64, Bytes> for RowWeighter {
    fn weight(&self, _key: &u64, row: &Bytes) -> u64 {
        row.len() as u64 + ENTRY_OVERHEAD_BYTES
    }
}

/// Counts rows the cache evicted to make room (`recserve_embedding_cache_evictions_total`).
#[derive(Clone, Debug)]
struct CountEvictions(IntCounter);

impl Lifecycle<u64, Bytes> for CountEvictions {
    type RequestState = ();

    fn on_evict(&self, _state: &mut (), _key: u64, _row: Bytes) {
        self.0.inc();
    }
}

/// What the cache reports into: evictions, and the bytes it holds.
#[derive(Clone, Debug)]
pub struct CacheMetrics {
    pub(crate) evictions: IntCounter,
    pub(crate) bytes: IntGauge,
}

/// Update epochs: each key belongs to stripe `hash(key) mod STRIPES`. More stripes make a fetch less likely to
/// skip caching a row because another row of its stripe was updated meanwhile.
pub(crate) const STRIPES: usize = 4096;

/// Hot rows of one model's Redis-tier tables, at most `capacity` bytes (rows plus [`ENTRY_OVERHEAD_BYTES`] each).
pub(crate) struct RowCache {
    rows: Cache<u64, Bytes, RowWeighter, std::hash::RandomState, CountEvictions>,
    bytes: IntGauge,
    /// The update epoch of each stripe of keys (see the module's comment).
    epochs: Box<[Mutex<u64>]>,
}

impl std::fmt::Debug for RowCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowCache")
            .field("rows", &self.rows.len())
            .field("bytes", &self.rows.weight())
            .field("capacity", &self.rows.capacity())
            .finish()
    }
}

impl RowCache {
    /// A cache of at most `capacity` bytes for rows of about `row_bytes` bytes.
    pub(crate) fn new(capacity: u64, row_bytes: usize, metrics: CacheMetrics) -> RowCache {
        let per_row = row_bytes as u64 + ENTRY_OVERHEAD_BYTES;
        let estimated = (capacity / per_row).clamp(16, 1 << 28) as usize;
        RowCache {
            rows: Cache::with(
                estimated,
                capacity.max(1),
                RowWeighter,
                std::hash::RandomState::new(),
                CountEvictions(metrics.evictions),
            ),
            bytes: metrics.bytes,
            epochs: (0..STRIPES).map(|_| Mutex::new(0)).collect(),
        }
    }

    #[inline]
    fn stripe(key: u64) -> usize {
        // Fibonacci hashing: consecutive rows land in different stripes.
        (key.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 52) as usize % STRIPES
    }

    #[inline]
    fn lock(&self, key: u64) -> MutexGuard<'_, u64> {
        self.epochs[Self::stripe(key)]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The update epoch of `key` now: note it before fetching the row, pass it to [`RowCache::insert_if_current`].
    #[inline]
    pub(crate) fn epoch(&self, key: u64) -> u64 {
        *self.lock(key)
    }

    /// Caches a fetched row unless an update of its stripe was applied since `epoch` was read (the row may then be
    /// the value from before the update); returns whether it was cached.
    pub(crate) fn insert_if_current(&self, key: u64, row: Bytes, epoch: u64) -> bool {
        let stripe = self.lock(key);
        if *stripe != epoch {
            return false;
        }
        self.rows.insert(key, row);
        true
    }

    /// Drops `key` because its row was updated: fetches in flight that read its epoch before this do not cache
    /// what they get.
    pub(crate) fn invalidate(&self, key: u64) {
        let mut stripe = self.lock(key);
        *stripe += 1;
        self.rows.remove(&key);
    }

    /// Drops every row (updates were missed, so any row may be stale), with the same guarantee as
    /// [`RowCache::invalidate`] for every key.
    pub(crate) fn invalidate_all(&self) {
        let mut stripes: Vec<_> = self
            .epochs
            .iter()
            .map(|e| e.lock().unwrap_or_else(PoisonError::into_inner))
            .collect();
        for stripe in &mut stripes {
            **stripe += 1;
        }
        self.rows.clear();
    }

    #[inline]
    pub(crate) fn get(&self, key: u64) -> Option<Bytes> {
        self.rows.get(&key)
    }

    #[cfg(test)]
    /// Caches a row whatever the updates (for tests and the default rows read at load).
    pub(crate) fn insert(&self, key: u64, row: Bytes) {
        self.rows.insert(key, row);
    }

    /// Publishes the bytes held now to `recserve_embedding_cache_bytes`.
    pub(crate) fn report(&self) {
        self.bytes.set(self.rows.weight() as i64);
    }

    #[cfg(test)]
    /// Bytes held now (rows plus overhead).
    pub(crate) fn bytes(&self) -> u64 {
        self.rows.weight()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metrics() -> CacheMetrics {
        CacheMetrics {
            evictions: IntCounter::new("e", "e").expect("counter"),
            bytes: IntGauge::new("b", "b").expect("gauge"),
        }
    }

    #[test]
    fn holds_rows_and_stays_within_its_bytes() {
        let m = metrics();
        let cache = RowCache::new(100 * (8 + ENTRY_OVERHEAD_BYTES), 8, m.clone());
        for row in 0..1000u64 {
            cache.insert(key(1, row), Bytes::from(row.to_le_bytes().to_vec()));
            assert!(cache.bytes() <= 100 * (8 + ENTRY_OVERHEAD_BYTES));
        }
        assert!(m.evictions.get() >= 900, "evicted {}", m.evictions.get());
        // Whatever it still holds is the row that was inserted under that key.
        let mut held = 0;
        for row in 0..1000u64 {
            if let Some(bytes) = cache.get(key(1, row)) {
                assert_eq!(&bytes[..], &row.to_le_bytes());
                held += 1;
            }
        }
        assert!(held > 0 && held <= 100, "held {held}");
        cache.report();
        assert_eq!(m.bytes.get() as u64, cache.bytes());
        assert_eq!(cache.get(key(2, 999)), None, "tables do not share rows");
    }

    #[test]
    fn a_fetch_that_straddles_an_update_does_not_cache_the_old_row() {
        let cache = RowCache::new(100 * (8 + ENTRY_OVERHEAD_BYTES), 8, metrics());
        let (old, new) = (
            Bytes::from_static(b"version1"),
            Bytes::from_static(b"version2"),
        );
        cache.insert(key(0, 5), old.clone());
        // A fetch of row 5 notes its epoch and sends; the update is applied before its answer comes.
        let epoch = cache.epoch(key(0, 5));
        cache.invalidate(key(0, 5));
        assert_eq!(cache.get(key(0, 5)), None, "the update dropped the row");
        assert!(!cache.insert_if_current(key(0, 5), old, epoch));
        assert_eq!(cache.get(key(0, 5)), None, "the old answer was not cached");
        // A fetch sent after the update caches what it gets; other stripes were not disturbed.
        let epoch = cache.epoch(key(0, 5));
        assert!(cache.insert_if_current(key(0, 5), new.clone(), epoch));
        assert_eq!(cache.get(key(0, 5)), Some(new));
        let other = cache.epoch(key(3, 77));
        cache.invalidate_all();
        assert_eq!(cache.get(key(0, 5)), None);
        assert!(!cache.insert_if_current(key(3, 77), Bytes::from_static(b"stale..."), other));
        assert_eq!(cache.bytes(), 0);
    }

    #[test]
    fn rows_read_again_survive_a_scan_of_cold_ids() {
        let cache = RowCache::new(100 * (8 + ENTRY_OVERHEAD_BYTES), 8, metrics());
        let row = |r: u64| Bytes::from(r.to_le_bytes().to_vec());
        for r in 0..20 {
            cache.insert(key(0, r), row(r));
        }
        for _ in 0..3 {
            for r in 0..20 {
                assert!(cache.get(key(0, r)).is_some());
            }
        }
        for r in 1000..3000 {
            cache.insert(key(0, r), row(r));
        }
        let hot = (0..20).filter(|&r| cache.get(key(0, r)).is_some()).count();
        assert!(hot >= 18, "{hot} of 20 hot rows survived the scan");
    }

    /// A plain LRU of `capacity` rows, the policy the cache is compared with.
    struct Lru {
        capacity: usize,
        tick: u64,
        last_use: std::collections::HashMap<u64, u64>,
        by_age: std::collections::BTreeMap<u64, u64>,
    }

    impl Lru {
        /// Whether `key` was held; it is held (most recent) afterwards.
        fn access(&mut self, key: u64) -> bool {
            self.tick += 1;
            let hit = match self.last_use.insert(key, self.tick) {
                Some(old) => {
                    self.by_age.remove(&old);
                    true
                }
                None => false,
            };
            self.by_age.insert(self.tick, key);
            if self.last_use.len() > self.capacity
                && let Some((_, oldest)) = self.by_age.pop_first()
            {
                self.last_use.remove(&oldest);
            }
            hit
        }
    }

    /// The eviction policy is kept because it holds Zipf-hot rows better than LRU: on Zipf(1.05) ids over 200,000
    /// rows, with room for 5% and 20% of them, its hit ratio must not be below LRU's. Hit ratios, not times: the
    /// same id sequence goes through both. `--nocapture` prints the ratios.
    #[test]
    fn its_hit_ratio_on_zipf_ids_is_at_least_lrus() {
        use rand::SeedableRng;
        use rand_distr::Distribution;

        const ROWS: u64 = 200_000;
        const ROW_BYTES: u64 = 25; // the demo's int8 rows: dim 17 + scale + bias
        const LOOKUPS: usize = 1_000_000;
        let zipf = rand_distr::Zipf::new(ROWS as f64, 1.05).expect("zipf");
        let mut rng = rand::rngs::StdRng::seed_from_u64(18);
        // Ids by popularity rank, shuffled over the table (hot ids are not the low ones).
        let ids: Vec<u64> = (0..LOOKUPS)
            .map(|_| (zipf.sample(&mut rng) as u64 - 1).wrapping_mul(2_654_435_761) % ROWS)
            .collect();
        for share in [0.05, 0.20] {
            let rows = (ROWS as f64 * share) as usize;
            let cache = RowCache::new(
                rows as u64 * (ROW_BYTES + ENTRY_OVERHEAD_BYTES),
                ROW_BYTES as usize,
                metrics(),
            );
            let mut lru = Lru {
                capacity: rows,
                tick: 0,
                last_use: Default::default(),
                by_age: Default::default(),
            };
            let (mut ours, mut theirs) = (0usize, 0usize);
            let row = Bytes::from(vec![0u8; ROW_BYTES as usize]);
            // The first half warms both up; the second half is counted.
            for (i, &id) in ids.iter().enumerate() {
                let hit = cache.get(key(0, id)).is_some();
                if !hit {
                    cache.insert(key(0, id), row.clone());
                }
                let lru_hit = lru.access(id);
                if i >= LOOKUPS / 2 {
                    ours += usize::from(hit);
                    theirs += usize::from(lru_hit);
                }
            }
            let counted = (LOOKUPS - LOOKUPS / 2) as f64;
            let (ours, theirs) = (ours as f64 / counted, theirs as f64 / counted);
            eprintln!(
                "Zipf(1.05) over {ROWS} rows, cache of {:.0}% of them: S3-FIFO (quick_cache) hit ratio {ours:.4}, LRU {theirs:.4}",
                share * 100.0
            );
            assert!(
                ours >= theirs,
                "S3-FIFO {ours} below LRU {theirs} at {share}"
            );
        }
    }
}
