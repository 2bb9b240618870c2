//! The search of a batch of queries through the IVF index, shared: the centroids are scored for every query in one
//! pass over them (the catalogue's matrix-product scan, [`Catalogue::search_with`]), the (query, list) pairs are
//! grouped by list, and each probed list is read once for the group of queries that probe it
//! ([`IvfIndex::scan_list`], whose kernel converts each code row once for up to 4 queries). Then each query
//! selects and re-ranks its own candidates.
//!
//! The lists are read best first: the groups in the order of their best centroid rank in any query that probes
//! them (for one query, its own centroid order). A query's best lists hold most of its best items, so its `k`-th
//! best lower bound rises early and most of the items after them are refused by one comparison, instead of
//! entering its selection and its second pass.
//!
//! Every query's answer is bit for bit the answer it gets searched alone, whatever order the batch visits its
//! lists in: its lists are chosen by its own centroid scores (whose bits and ties do not depend on the batch), its
//! bounds are the same arithmetic on the same code dot products (the kernel's sums do not depend on the tile
//! shape), and nothing after the scan depends on the order: the floor is the `k`-th best lower bound's score (the
//! same value whichever items reach the selection first), the candidates are every lane whose upper bound reaches
//! it (a panel left out earlier was below a threshold the floor is at least), sorted by a total order (upper
//! bound, then position). Its selection, exclusions, candidate cap and counts are its own.
//!
//! **The scan seam.** [`IvfIndex::scan_list`] is the only step that reads codes: one list's codes and per-item
//! parameters and the group's [`Prepared`] queries in, per query and panel of the list the lower and upper bounds
//! of every lane's exact score out ([`ListBounds`]). Everything after it (padding, selection, exclusion, cap,
//! re-rank) is independent of the code format, so a second format plugs in as another scan step with the same
//! contract: `lo ≤ exact score ≤ up` for every item lane.

use std::ops::Range;
use std::time::Instant;

use super::pq4::{self, Lut};
use super::{
    BOUND_SLACK, Codes, F32_UNIT, F64_UNIT, IvfIndex, IvfStats, NORM_SLACK, Probe, exact_score,
    round_up,
};
use crate::recall::catalogue::{LANES, SearchQuery, SearchScratch};
use crate::recall::kernel::{self, Isa};
use crate::recall::select::{Scored, TopK, answer_order};

/// Candidates re-ranked between two checks of the stopping rule.
const RERANK_CHUNK: usize = 32;

/// How many times more lists a query whose best `nprobe` lists hold fewer than `k + |exclude|` items has ranked
/// next ([`IvfIndex::probe_all`]).
pub(super) const SHORT_GROWTH: usize = 4;

/// What a list scan reads of one query besides its vector, computed once per search.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Prepared {
    /// `Σ_j q[j]` in index order (the int8 codes' bias term, and the exact score of int8 tables).
    pub(crate) qsum: f32,
    /// `‖q‖₁` raised by [`NORM_SLACK`]: an int8 item's bound is its `err` times this.
    pub(crate) qabs: f32,
    /// `‖q‖₂` raised by [`NORM_SLACK`]: a pq4 item's bound is its `err` times this, plus the list's `w`.
    pub(crate) qnorm: f32,
}

impl Prepared {
    fn of(vector: &[f32]) -> Prepared {
        let (mut qsum, mut qabs, mut qsq) = (0.0f32, 0.0f32, 0.0f32);
        for &x in vector {
            qsum += x;
            qabs += x.abs();
            qsq += x * x;
        }
        Prepared {
            qsum,
            qabs: qabs * (1.0 + NORM_SLACK),
            qnorm: qsq.sqrt() * (1.0 + NORM_SLACK),
        }
    }
}

/// A list scan's output for a group of queries: at `[i · panels + p]`, the bounds of the 16 lanes of the list's
/// panel `p` for the group's query `i` (padding lanes hold anything; the caller masks them).
#[derive(Debug, Default)]
pub(crate) struct ListBounds {
    pub(crate) lo: Vec<[f32; LANES]>,
    pub(crate) up: Vec<[f32; LANES]>,
    /// The pq4 scan's table sums of one query.
    sums: Vec<[u16; pq4::BLOCK]>,
}

/// The int8 codes' bounds, computed from each tile's dot products inside the kernel: `approx = dot · scale + bias ·
/// Σq`, and the exact score is within `err · ‖q‖₁` of it.
struct Int8Bounds<'a> {
    scale: &'a [[f32; LANES]],
    bias: &'a [[f32; LANES]],
    err: &'a [[f32; LANES]],
    prepared: &'a [Prepared],
    group: &'a [u32],
    panels: usize,
    lo: &'a mut [[f32; LANES]],
    up: &'a mut [[f32; LANES]],
}

impl kernel::DotSink for Int8Bounds<'_> {
    #[inline(always)]
    fn take(&mut self, i: usize, p: usize, dots: &[f32; LANES]) {
        let Prepared { qsum, qabs, .. } = self.prepared[self.group[i] as usize];
        let (scale, bias, err) = (&self.scale[p], &self.bias[p], &self.err[p]);
        let at = i * self.panels + p;
        let (lo, up) = (&mut self.lo[at], &mut self.up[at]);
        for l in 0..LANES {
            let approx = dots[l] * scale[l] + bias[l] * qsum;
            let w = err[l] * qabs;
            lo[l] = approx - w;
            up[l] = approx + w;
        }
    }
}

/// One query's search in progress.
#[derive(Debug, Default)]
struct QueryScan {
    /// Its probed lists: a range of [`IvfScratch::lists`].
    lists: Range<usize>,
    /// Items in its probed lists.
    total: usize,
    /// Its `k` best lower bounds among non-excluded items.
    lower: TopK,
    /// Upper bounds of the lanes of each scanned panel that may still hold a candidate, and which panel each is
    /// (the second pass reads them).
    upper: Vec<[f32; LANES]>,
    panels: Vec<u32>,
}

/// Buffers one executor reuses from search to search.
#[derive(Debug, Default)]
pub struct IvfScratch {
    centroids: SearchScratch,
    prepared: Vec<Prepared>,
    /// pq4: every query's look-up tables.
    luts: Vec<Lut>,
    /// Every query's probed lists, in its centroid order (best first).
    lists: Vec<u32>,
    /// `(list, query, rank of the list in the query's centroid order)` for every probed pair, sorted: the pairs
    /// grouped by list.
    pairs: Vec<(u32, u32, u32)>,
    /// The groups of `pairs`: `(best rank, list, range of pairs)`, in the order they are scanned.
    groups: Vec<(u32, u32, Range<usize>)>,
    /// The queries of the list being scanned.
    group: Vec<u32>,
    bounds: ListBounds,
    queries: Vec<QueryScan>,
    candidates: Vec<Scored>,
}

impl IvfIndex {
    /// Every query's top `k`: the exact top `k` of the items in its probed lists (see the module docs of
    /// [`super`]). The queries are searched together (see [`self`]); each answer is the one it gets alone.
    ///
    /// # Panics
    /// If a query's vector does not hold `dim` values.
    pub fn search(
        &self,
        queries: &[SearchQuery<'_>],
        probe: Probe,
        scratch: &mut IvfScratch,
    ) -> (Vec<Vec<Scored>>, IvfStats) {
        self.search_with(self.isa, queries, probe, scratch)
    }

    /// [`IvfIndex::search`] with the kernels of `isa` (which the CPU must support).
    pub(crate) fn search_with(
        &self,
        isa: Isa,
        queries: &[SearchQuery<'_>],
        probe: Probe,
        s: &mut IvfScratch,
    ) -> (Vec<Vec<Scored>>, IvfStats) {
        let started = Instant::now();
        let nq = queries.len();
        s.prepared.clear();
        for q in queries {
            assert_eq!(q.vector.len(), self.dim, "a query vector holds dim values");
            s.prepared.push(Prepared::of(q.vector));
        }
        if let Codes::Pq4 { m, codebooks, .. } = &self.coding {
            s.luts.resize_with(nq.max(s.luts.len()), Lut::default);
            for (q, lut) in queries.iter().zip(&mut s.luts) {
                lut.fill(q.vector, codebooks, *m);
            }
        }
        self.probe_all(isa, queries, probe.nprobe, s);
        s.queries
            .resize_with(nq.max(s.queries.len()), QueryScan::default);
        s.pairs.clear();
        for (qi, (q, scan)) in queries.iter().zip(&mut s.queries).enumerate() {
            let lists = &s.lists[scan.lists.clone()];
            scan.total = lists.iter().map(|&l| self.sizes[l as usize]).sum();
            scan.lower.reset(q.k, scan.total);
            scan.upper.clear();
            scan.panels.clear();
            // A query's lists are in its centroid order, best first: the rank is the position.
            s.pairs.extend(
                lists
                    .iter()
                    .zip(0u32..)
                    .map(|(&list, rank)| (list, qi as u32, rank)),
            );
        }
        s.pairs.sort_unstable();
        // The groups of pairs (one a list), best first: by the list's best rank in any of its queries.
        s.groups.clear();
        let mut at = 0;
        while at < s.pairs.len() {
            let (list, start) = (s.pairs[at].0, at);
            let mut rank = u32::MAX;
            while let Some(&(_, _, r)) = s.pairs.get(at).filter(|p| p.0 == list) {
                rank = rank.min(r);
                at += 1;
            }
            s.groups.push((rank, list, start..at));
        }
        s.groups
            .sort_unstable_by_key(|&(rank, list, _)| (rank, list));
        let vectors: Vec<&[f32]> = queries.iter().map(|q| q.vector).collect();
        // First pass, one list at a time for every query that probes it: every probed item's bounds, and each
        // query's k-th best lower bound of its non-excluded items.
        for (_, list, pairs) in &s.groups {
            let list = *list as usize;
            s.group.clear();
            s.group
                .extend(s.pairs[pairs.clone()].iter().map(|&(_, query, _)| query));
            match &self.coding {
                Codes::Int8 { scale, bias } => self.scan_list(
                    isa,
                    list,
                    (&vectors, &s.prepared),
                    &s.group,
                    (scale, bias),
                    &mut s.bounds,
                ),
                Codes::Pq4 { m, centroids, .. } => self.scan_list_pq4(
                    isa,
                    list,
                    (&vectors, &s.prepared, &s.luts),
                    &s.group,
                    (*m, centroids),
                    &mut s.bounds,
                ),
            }
            for (i, &qi) in s.group.iter().enumerate() {
                self.offer(
                    list,
                    i,
                    &s.bounds,
                    queries[qi as usize].exclude,
                    &mut s.queries[qi as usize],
                );
            }
        }
        let mut stats = IvfStats::default();
        let results = queries
            .iter()
            .enumerate()
            .map(|(qi, q)| {
                let scan = &mut s.queries[qi];
                stats.lists += scan.lists.len() as u64;
                stats.codes += scan.total as u64;
                self.answer(
                    q,
                    s.prepared[qi].qsum,
                    probe,
                    scan,
                    &mut s.candidates,
                    &mut stats,
                )
            })
            .collect();
        stats.seconds = started.elapsed().as_secs_f64();
        (results, stats)
    }

    /// The scan step (the seam a second code format plugs into): the bounds of every lane of list `list` for the
    /// queries `group` (indices into `vectors` and `prepared`), written to `out` as [`ListBounds`] lays them out.
    /// The int8 codes: `approx = dot(q, codes) · scale + bias · Σq`, within `err · ‖q‖₁` of the exact score.
    fn scan_list(
        &self,
        isa: Isa,
        list: usize,
        (vectors, prepared): (&[&[f32]], &[Prepared]),
        group: &[u32],
        (scale, bias): (&Range<usize>, &Range<usize>),
        out: &mut ListBounds,
    ) {
        let (first, last) = (self.offsets[list], self.offsets[list + 1]);
        let dim = self.dim;
        let panels = last - first;
        out.lo.resize(group.len() * panels, [0.0; LANES]);
        out.up.resize(group.len() * panels, [0.0; LANES]);
        let mut sink = Int8Bounds {
            scale: &self.floats(scale)[first..last],
            bias: &self.floats(bias)[first..last],
            err: &self.floats(&self.ranges.err)[first..last],
            prepared,
            group,
            panels,
            lo: &mut out.lo,
            up: &mut out.up,
        };
        let codes = &self.codes()[first * dim..last * dim];
        kernel::code_dots(isa, codes, dim, vectors, group, &mut sink);
    }

    /// The scan step of pq4 codes (same contract as [`IvfIndex::scan_list`], two panels per block): `approx =
    /// <q, c_l> + Σ_m offset_m + Δ · S` from the query's tables, within `err · ‖q‖₂ + w` of the exact score (the
    /// bound in the module docs of [`super`]).
    fn scan_list_pq4(
        &self,
        isa: Isa,
        list: usize,
        (vectors, prepared, luts): (&[&[f32]], &[Prepared], &[Lut]),
        group: &[u32],
        (m, centroids): (usize, &[f32]),
        out: &mut ListBounds,
    ) {
        let (first, last) = (self.offsets[list], self.offsets[list + 1]);
        let dim = self.dim;
        let bytes = pq4::block_bytes(m);
        let codes = &self.code_bytes()[first / 2 * bytes..last / 2 * bytes];
        let err = &self.floats(&self.ranges.err)[first..last];
        let panels = last - first;
        out.lo.resize(group.len() * panels, [0.0; LANES]);
        out.up.resize(group.len() * panels, [0.0; LANES]);
        let centroid = &centroids[list * dim..(list + 1) * dim];
        for (i, &qi) in group.iter().enumerate() {
            let (vector, lut) = (vectors[qi as usize], &luts[qi as usize]);
            let qnorm = prepared[qi as usize].qnorm;
            // The centroid's score in f64 (products exact, only the sum rounds), and the list's w.
            let (mut dot, mut abs) = (0.0f64, 0.0f64);
            for (&a, &c) in vector.iter().zip(centroid) {
                let p = f64::from(a) * f64::from(c);
                dot += p;
                abs += p.abs();
            }
            let offset = dot + lut.offset;
            let rounding = 8.0 * F32_UNIT * (offset.abs() + 255.0 * m as f64 * lut.delta)
                + 2.0 * (dim as f64 + 2.0) * F64_UNIT * abs;
            let w = round_up((lut.error + rounding) * (1.0 + BOUND_SLACK));
            let (offset, delta) = (offset as f32, lut.delta as f32);
            out.sums.clear();
            pq4::scan(isa, codes, m, &lut.table, &mut out.sums);
            let rows = i * panels..(i + 1) * panels;
            let (lo, up) = (&mut out.lo[rows.clone()], &mut out.up[rows]);
            for (b, sums) in out.sums.iter().enumerate() {
                for half in 0..2 {
                    let p = 2 * b + half;
                    for l in 0..LANES {
                        let approx = offset + delta * f32::from(sums[half * LANES + l]);
                        let width = err[p][l] * qnorm + w;
                        lo[p][l] = approx - width;
                        up[p][l] = approx + width;
                    }
                }
            }
        }
    }

    /// Hands the bounds of list `list` for the group's query `i` to that query's search: its lower bounds to its
    /// selection (unless excluded), and the upper bounds of the panels that may still hold a candidate to its
    /// second pass.
    fn offer(
        &self,
        list: usize,
        i: usize,
        bounds: &ListBounds,
        exclude: &[u32],
        scan: &mut QueryScan,
    ) {
        let (first, last) = (self.offsets[list], self.offsets[list + 1]);
        let (size, panels) = (self.sizes[list], last - first);
        let ids = self.ids();
        let rows = i * panels..(i + 1) * panels;
        for (local, (lo, up)) in bounds.lo[rows.clone()]
            .iter()
            .zip(&bounds.up[rows])
            .enumerate()
        {
            let p = first + local;
            let (mut lo, mut up) = (*lo, *up);
            // The lanes past the list's items are padding (checked at open).
            for l in (size.saturating_sub(local * LANES)).min(LANES)..LANES {
                lo[l] = f32::NEG_INFINITY;
                up[l] = f32::NEG_INFINITY;
            }
            // The selection's threshold never falls and the final floor is at least it: a panel whose upper bounds
            // are all below it holds no candidate.
            let mut highest = f32::NEG_INFINITY;
            for &u in &up {
                highest = highest.max(u);
            }
            if scan.lower.reaches(highest) {
                scan.upper.push(up);
                scan.panels.push(p as u32);
            }
            let mut best = f32::NEG_INFINITY;
            for &low in &lo {
                best = best.max(low);
            }
            if !scan.lower.wants(best) {
                continue;
            }
            for (l, &low) in lo.iter().enumerate() {
                let at = p * LANES + l;
                if low == f32::NEG_INFINITY || !scan.lower.wants(low) {
                    continue;
                }
                if exclude.binary_search(&ids[at]).is_ok() {
                    continue;
                }
                scan.lower.push(at as u32, low);
            }
        }
    }

    /// The second pass and the re-rank of one query: the candidates are the items whose upper bound reaches the
    /// `k`-th best lower bound (at most `max_candidates`, the highest upper bounds), scored exactly from the table.
    fn answer(
        &self,
        q: &SearchQuery<'_>,
        qsum: f32,
        probe: Probe,
        scan: &mut QueryScan,
        candidates: &mut Vec<Scored>,
        stats: &mut IvfStats,
    ) -> Vec<Scored> {
        let ids = self.ids();
        let floor = scan.lower.kth_score().unwrap_or(f32::NEG_INFINITY);
        candidates.clear();
        for (up, &p) in scan.upper.iter().zip(&scan.panels) {
            if up.iter().all(|&u| u < floor) {
                continue;
            }
            for (l, &u) in up.iter().enumerate() {
                let at = p as usize * LANES + l;
                if u < floor || u == f32::NEG_INFINITY {
                    continue;
                }
                if q.exclude.binary_search(&ids[at]).is_ok() {
                    continue;
                }
                candidates.push(Scored {
                    id: at as u32,
                    score: u,
                });
            }
        }
        let most = probe.max_candidates.max(q.k);
        // Highest upper bound first (equal ones: the lower lane), re-ranked a chunk at a time until the next upper
        // bound is below the k-th best exact score so far (see the module docs of [`super`]), or the cap is
        // reached. Only the best k + one chunk are sorted at first; the rest is sorted once that k-th best score
        // has dropped the candidates it beats.
        let table = (*self.table).as_ref();
        let row_bytes = self.storage.row_bytes(self.dim);
        let mut answer: Vec<Scored> = Vec::with_capacity(q.k + RERANK_CHUNK);
        let mut kth = f32::NEG_INFINITY;
        let mut done = 0;
        let head = (q.k + RERANK_CHUNK).min(candidates.len());
        if head < candidates.len() {
            candidates.select_nth_unstable_by(head - 1, answer_order);
        }
        candidates[..head].sort_unstable_by(answer_order);
        let (mut at, mut sorted) = (0, head);
        loop {
            let beaten = |c: &Scored, answer: &[Scored]| answer.len() >= q.k && c.score < kth;
            if at == sorted && at < candidates.len() {
                let mut kept = at;
                for r in at..candidates.len() {
                    if !beaten(&candidates[r], &answer) {
                        candidates.swap(kept, r);
                        kept += 1;
                    }
                }
                candidates.truncate(kept);
                candidates[at..].sort_unstable_by(answer_order);
                sorted = kept;
            }
            let rest = &candidates[at..sorted];
            let Some(next) = rest.first() else {
                break;
            };
            if beaten(next, &answer) {
                break;
            }
            if done == most {
                stats.capped += 1;
                break;
            }
            let take = rest.len().min(RERANK_CHUNK).min(most - done);
            let live = rest[..take]
                .iter()
                .position(|c| beaten(c, &answer))
                .unwrap_or(take);
            let chunk = &rest[..live];
            // The chunk's rows are touched first: these loads are independent, so their cache and TLB misses
            // overlap, where each exact score's long chain of dependent adds would take them one at a time.
            let mut touched = 0u8;
            for c in chunk {
                let start = ids[c.id as usize] as usize * row_bytes;
                for b in table[start..start + row_bytes].iter().step_by(64) {
                    touched ^= *b;
                }
            }
            std::hint::black_box(touched);
            answer.extend(chunk.iter().map(|c| {
                let id = ids[c.id as usize];
                let row = &table[id as usize * row_bytes..(id as usize + 1) * row_bytes];
                Scored {
                    id,
                    score: exact_score(self.storage, row, q.vector, qsum),
                }
            }));
            done += live;
            at += live;
            if answer.len() >= q.k {
                answer.select_nth_unstable_by(q.k - 1, answer_order);
                answer.truncate(q.k);
                kth = answer[q.k - 1].score;
            }
            if live < take {
                break; // the rest is beaten (kth only rises)
            }
        }
        stats.reranked += done as u64;
        answer.sort_unstable_by(answer_order);
        answer.truncate(q.k);
        answer
    }

    #[cfg(test)]
    /// Every item's (id, lower bound, upper bound) on its exact score for `query`, from the scan step.
    pub(crate) fn item_bounds(
        &self,
        isa: Isa,
        query: &[f32],
        s: &mut IvfScratch,
    ) -> Vec<(u32, f32, f32)> {
        let prepared = [Prepared::of(query)];
        let mut luts = vec![Lut::default()];
        if let Codes::Pq4 { m, codebooks, .. } = &self.coding {
            luts[0].fill(query, codebooks, *m);
        }
        let ids = self.ids();
        let mut out = Vec::new();
        for list in 0..self.nlist() {
            match &self.coding {
                Codes::Int8 { scale, bias } => self.scan_list(
                    isa,
                    list,
                    (&[query], &prepared),
                    &[0],
                    (scale, bias),
                    &mut s.bounds,
                ),
                Codes::Pq4 { m, centroids, .. } => self.scan_list_pq4(
                    isa,
                    list,
                    (&[query], &prepared, &luts),
                    &[0],
                    (*m, centroids),
                    &mut s.bounds,
                ),
            }
            let first = self.offsets[list];
            for lane in 0..self.sizes[list] {
                let (p, l) = (lane / LANES, lane % LANES);
                let id = ids[(first + p) * LANES + l];
                out.push((id, s.bounds.lo[p][l], s.bounds.up[p][l]));
            }
        }
        out
    }

    /// Fills every query's range of `s.lists` (best first) with its best `nprobe` lists by centroid score, and more
    /// in centroid order while they hold fewer than `k + |exclude|` items. The centroids are scored for all the
    /// queries in one pass; the queries whose lists held too few are scored again for [`SHORT_GROWTH`] times as
    /// many lists, until theirs hold enough or every list is ranked. A query's best `m` lists are the first `m` of
    /// its best `m'` for any `m' > m` (the same scores, ties to the lower list), so the lists are those of ranking
    /// every centroid, without sorting all of them for a query whose first lists fall a few items short.
    fn probe_all(&self, isa: Isa, queries: &[SearchQuery<'_>], nprobe: usize, s: &mut IvfScratch) {
        let nlist = self.nlist();
        let mut ranked = nprobe.clamp(1, nlist);
        let need = |q: &SearchQuery<'_>| (q.k + q.exclude.len()).min(self.items);
        let (mut best, _) = self.centroids.search_with(
            isa,
            &centroid_queries(queries.iter(), ranked),
            &mut s.centroids,
        );
        let holds = |found: &[Scored]| {
            found
                .iter()
                .map(|c| self.sizes[c.id as usize])
                .sum::<usize>()
        };
        let mut short: Vec<usize> = (0..queries.len())
            .filter(|&qi| holds(&best[qi]) < need(&queries[qi]))
            .collect();
        while !short.is_empty() && ranked < nlist {
            ranked = ranked.saturating_mul(SHORT_GROWTH).min(nlist);
            let again = centroid_queries(short.iter().map(|&qi| &queries[qi]), ranked);
            let (more, _) = self.centroids.search_with(isa, &again, &mut s.centroids);
            for (&qi, found) in short.iter().zip(more) {
                best[qi] = found;
            }
            short.retain(|&qi| holds(&best[qi]) < need(&queries[qi]));
        }
        s.lists.clear();
        s.queries
            .resize_with(queries.len().max(s.queries.len()), QueryScan::default);
        for ((q, found), scan) in queries.iter().zip(&best).zip(&mut s.queries) {
            let start = s.lists.len();
            let mut held = 0;
            for c in found {
                if s.lists.len() - start >= nprobe.max(1) && held >= need(q) {
                    break;
                }
                s.lists.push(c.id);
                held += self.sizes[c.id as usize];
            }
            scan.lists = start..s.lists.len();
        }
    }

    #[cfg(test)]
    /// The lists a query of `k` items excluding `excluded` ids would scan with `nprobe`, best first.
    pub(crate) fn probed_lists(
        &self,
        query: &[f32],
        k: usize,
        excluded: usize,
        nprobe: usize,
        scratch: &mut IvfScratch,
    ) -> Vec<u32> {
        let exclude = vec![u32::MAX; excluded];
        let q = SearchQuery {
            vector: query,
            k,
            exclude: &exclude,
        };
        self.probe_all(self.isa, &[q], nprobe, scratch);
        scratch.lists.clone()
    }
}

/// The centroid searches of `queries`: their vectors, `k` lists each, nothing excluded.
fn centroid_queries<'a>(
    queries: impl Iterator<Item = &'a SearchQuery<'a>>,
    k: usize,
) -> Vec<SearchQuery<'a>> {
    queries
        .map(|q| SearchQuery {
            vector: q.vector,
            k,
            exclude: &[],
        })
        .collect()
}
