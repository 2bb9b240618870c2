//! Bounded top-K selection and the merge of per-shard results: the order every recall answer is sorted by
//! (higher score first, equal scores by lower item id) lives here, once.
//!
//! [`TopK`] keeps the best `k` of a stream of `(score, id)` pairs that arrive in ascending id order (a shard scan).
//! It appends candidates to a buffer and, when the buffer holds `max(2k, k + 64)`, keeps the best `k` with a
//! partial select (`select_nth_unstable_by`, O(buffer)) and raises its threshold to the `k`-th score. From then on
//! a candidate enters only with a score strictly above the threshold: because ids ascend, a later candidate with
//! an equal score has a higher id and so ranks below every kept one. Most candidates are refused by that one
//! comparison (the kernels even compare a whole tile's maximum first), so selection costs O(n) plus O(k log k)
//! per query, for any `k` up to the whole catalogue. Out of id order (the IVF index's lower bounds, read best list
//! first) an item equal to the threshold may be refused where a lower id would have won the tie, so the kept ids
//! may differ at ties, but the `k`-th best score, all the IVF search reads, does not. [`merge`] then combines the
//! sorted per-shard lists with a heap, in O(k log shards).

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// One recalled item: its id in the catalogue and its inner-product score.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Scored {
    pub id: u32,
    pub score: f32,
}

/// NaN sorts below every number, -0.0 equals 0.0 (a NaN score needs a non-finite vector, which the loader
/// refuses; this only keeps the order total).
#[inline]
fn key(score: f32) -> f32 {
    if score.is_nan() {
        f32::NEG_INFINITY
    } else {
        score
    }
}

/// The answer order: `Less` when `a` comes before `b` (higher score, then lower id).
#[inline]
pub fn answer_order(a: &Scored, b: &Scored) -> Ordering {
    let (x, y) = (key(a.score), key(b.score));
    if x > y {
        Ordering::Less
    } else if x < y {
        Ordering::Greater
    } else {
        a.id.cmp(&b.id)
    }
}

/// Candidates a buffer holds beyond `k` at least, so that small `k` does not prune after every entry.
const SLACK: usize = 64;

/// The best `k` of a stream of candidates with ascending ids.
#[derive(Debug, Default)]
pub struct TopK {
    k: usize,
    /// Buffer length that triggers pruning back to `k`; `usize::MAX` when the stream cannot exceed `k`.
    cap: usize,
    buf: Vec<Scored>,
    /// The `k`-th best score kept, once the buffer has been pruned at least once.
    threshold: f32,
    primed: bool,
}

impl TopK {
    /// Starts a selection of the best `k` (≥ 1) of at most `candidates` items.
    pub(crate) fn reset(&mut self, k: usize, candidates: usize) {
        let k = k.max(1);
        self.k = k;
        self.cap = if k >= candidates {
            usize::MAX
        } else {
            (2 * k).max(k + SLACK).min(candidates)
        };
        self.buf.clear();
        self.threshold = f32::NEG_INFINITY;
        self.primed = false;
    }

    /// Whether a candidate with this score would be kept (before checking whether it is excluded).
    #[inline(always)]
    pub(crate) fn wants(&self, score: f32) -> bool {
        !self.primed || score > self.threshold
    }

    /// Whether a score is at least the `k`-th best kept so far (every score is, before the first prune). The
    /// threshold never falls, so a score below it is below the `k`-th best of the whole stream.
    #[inline(always)]
    pub(crate) fn reaches(&self, score: f32) -> bool {
        !self.primed || score >= self.threshold
    }

    /// Adds a candidate that [`TopK::wants`] accepted; its id must be higher than every id offered before for the
    /// kept ids to be the answer's at ties (see the module docs).
    #[inline]
    pub(crate) fn push(&mut self, id: u32, score: f32) {
        self.buf.push(Scored { id, score });
        if self.buf.len() >= self.cap {
            self.prune();
        }
    }

    /// Keeps the best `k` and raises the threshold to the worst of them.
    #[cold]
    fn prune(&mut self) {
        // Only called with more than k buffered (cap > k). After the select, the element at k - 1 is the k-th best
        // and every element before it precedes it in answer order.
        let k = self.k;
        self.buf.select_nth_unstable_by(k - 1, answer_order);
        self.buf.truncate(k);
        self.threshold = key(self.buf[k - 1].score);
        self.primed = true;
    }

    /// The `k`-th best score offered (`None`: fewer than `k` were offered), without sorting the rest. The
    /// selection is empty afterwards.
    pub(crate) fn kth_score(&mut self) -> Option<f32> {
        let k = self.k;
        let kth = (self.buf.len() >= k).then(|| {
            let (_, kth, _) = self.buf.select_nth_unstable_by(k - 1, answer_order);
            kth.score
        });
        self.buf.clear();
        kth
    }

    /// The best `min(k, offered)` candidates, in answer order. The selection is empty afterwards.
    pub(crate) fn finish(&mut self) -> Vec<Scored> {
        if self.buf.len() > self.k {
            self.buf.select_nth_unstable_by(self.k - 1, answer_order);
            self.buf.truncate(self.k);
        }
        self.buf.sort_unstable_by(answer_order);
        std::mem::take(&mut self.buf)
    }
}

/// The head of one sorted list in the merge heap; the heap's maximum is the best head.
struct Head {
    item: Scored,
    list: usize,
    next: usize,
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Head {}
impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap pops its maximum: the item that comes first in answer order.
        answer_order(&other.item, &self.item)
    }
}

/// The best `k` of several lists that are each in answer order (one per shard; their ids never repeat).
pub fn merge(mut lists: Vec<Vec<Scored>>, k: usize) -> Vec<Scored> {
    lists.retain(|l| !l.is_empty());
    if lists.len() <= 1 {
        let mut only = lists.pop().unwrap_or_default();
        only.truncate(k);
        return only;
    }
    let total: usize = lists.iter().map(Vec::len).sum();
    let mut out = Vec::with_capacity(k.min(total));
    let mut heap: BinaryHeap<Head> = lists
        .iter()
        .enumerate()
        .map(|(list, l)| Head {
            item: l[0],
            list,
            next: 1,
        })
        .collect();
    while out.len() < k {
        let Some(head) = heap.pop() else { break };
        out.push(head.item);
        if let Some(&item) = lists[head.list].get(head.next) {
            heap.push(Head {
                item,
                list: head.list,
                next: head.next + 1,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic stream of scores with many exact ties (few distinct values).
    fn scores(n: usize, distinct: u64, seed: u64) -> Vec<f32> {
        let mut state = seed;
        (0..n)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 33) % distinct) as f32 - (distinct / 2) as f32
            })
            .collect()
    }

    fn by_sorting(scores: &[f32], k: usize) -> Vec<Scored> {
        let mut all: Vec<Scored> = scores
            .iter()
            .enumerate()
            .map(|(id, &score)| Scored {
                id: id as u32,
                score,
            })
            .collect();
        all.sort_by(answer_order);
        all.truncate(k);
        all
    }

    fn select(scores: &[f32], k: usize) -> Vec<Scored> {
        let mut top = TopK::default();
        top.reset(k, scores.len());
        for (id, &s) in scores.iter().enumerate() {
            if top.wants(s) {
                top.push(id as u32, s);
            }
        }
        top.finish()
    }

    #[test]
    fn keeps_the_best_k_with_ties_by_lower_id() {
        for (n, distinct) in [
            (1usize, 3u64),
            (7, 2),
            (100, 5),
            (1000, 7),
            (5000, 1000),
            (300, 1),
        ] {
            let s = scores(n, distinct, n as u64);
            for k in [1, 2, 3, 10, 64, 65, 129, n / 2 + 1, n, n + 5] {
                assert_eq!(
                    select(&s, k),
                    by_sorting(&s, k),
                    "n {n} distinct {distinct} k {k}"
                );
            }
        }
    }

    #[test]
    fn the_kth_score_is_the_same_in_any_order_offered() {
        for (n, distinct) in [(1usize, 3u64), (100, 5), (1000, 7), (5000, 1000), (300, 1)] {
            let s = scores(n, distinct, n as u64);
            // In id order, reversed, and evens before odds: out of id order, as the IVF index's lower bounds
            // arrive (best list first).
            let orders: [Vec<usize>; 3] = [
                (0..n).collect(),
                (0..n).rev().collect(),
                (0..n).step_by(2).chain((1..n).step_by(2)).collect(),
            ];
            for k in [1, 2, 64, 65, n / 2 + 1, n, n + 5] {
                let want = by_sorting(&s, k).get(k - 1).map(|x| x.score);
                for order in &orders {
                    let mut top = TopK::default();
                    top.reset(k, n);
                    for &id in order {
                        if top.wants(s[id]) {
                            top.push(id as u32, s[id]);
                        }
                    }
                    assert_eq!(
                        top.kth_score(),
                        want,
                        "n {n} distinct {distinct} k {k} order starting {:?}",
                        &order[..n.min(3)]
                    );
                }
            }
        }
    }

    #[test]
    fn orders_nan_last_and_zeroes_as_equal() {
        let s = [f32::NAN, -0.0, 0.0, 1.0, f32::NEG_INFINITY, -0.0, f32::NAN];
        let got: Vec<u32> = select(&s, s.len()).iter().map(|x| x.id).collect();
        // 1.0; then the zeros by id (-0.0 == 0.0); then -inf (id 4) and the NaNs (ids 0, 6) as -inf, by id.
        assert_eq!(got, vec![3, 1, 2, 5, 0, 4, 6]);
        let got: Vec<u32> = select(&s, 2).iter().map(|x| x.id).collect();
        assert_eq!(got, vec![3, 1]);
    }

    #[test]
    fn can_be_reused_after_finish() {
        let mut top = TopK::default();
        top.reset(2, 10);
        for (id, s) in [(0u32, 1.0f32), (1, 3.0), (2, 2.0)] {
            if top.wants(s) {
                top.push(id, s);
            }
        }
        assert_eq!(top.finish().len(), 2);
        top.reset(1, 1);
        top.push(7, -1.0);
        assert_eq!(top.finish(), vec![Scored { id: 7, score: -1.0 }]);
    }

    #[test]
    fn merge_equals_sorting_the_concatenation() {
        let s = scores(2000, 50, 9);
        // Shards of contiguous ids, as the catalogue splits them, including empty ones.
        for bounds in [
            vec![0usize, 2000],
            vec![0, 500, 1000, 1500, 2000],
            vec![0, 1, 1, 999, 2000],
            vec![0, 700, 700, 2000],
        ] {
            for k in [1usize, 5, 100, 1999, 2000, 2500] {
                let lists: Vec<Vec<Scored>> = bounds
                    .windows(2)
                    .map(|w| {
                        let mut part = by_sorting(&s[w[0]..w[1]], k);
                        for item in &mut part {
                            item.id += w[0] as u32;
                        }
                        part
                    })
                    .collect();
                assert_eq!(merge(lists, k), by_sorting(&s, k), "{bounds:?} k {k}");
            }
        }
        assert!(merge(vec![vec![], vec![]], 3).is_empty());
    }
}
