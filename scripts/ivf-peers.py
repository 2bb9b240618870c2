"""recserve's IVF index beside the other indexes users pick, on the same vectors, queries and exact answers: Faiss's
best IVF variants and two graph indexes, each with its build time and memory, QPS of single queries and of
batches of 32 on one core, and QPS at recall@100 = 0.90, 0.95 and 0.99 as the median and the worst of the rounds.
Run by scripts/ivf-bench.sh in a throwaway virtualenv (faiss-cpu, hnswlib, usearch and numpy, pinned there; this
file imports nothing of recserve).

    python scripts/ivf-peers.py build   VERSION_DIR BENCH_JSON OUT_DIR           # every peer, each in a child process
    python scripts/ivf-peers.py measure VERSION_DIR BENCH_JSON TRUTH_U32 OUT_DIR ROUND
    python scripts/ivf-peers.py report  OUT_DIR OUT_SVG [TITLE]

BENCH_JSON and TRUTH_U32 come from `examples/ivf_bench.rs` (`--json`, `--truth`): its figures for recserve, the
user rows it queried, and their exact top-k ids. OUT_DIR holds the peers' indexes (`peer-NAME.*`), their build
figures (`build-NAME.json`), one JSON per round and peer (`round-R-NAME.json`), and recserve's rounds
(`round-R-recserve.json`, written there by scripts/ivf-bench.sh). `PEERS` (a comma list of the names below;
default `faiss-sq8,faiss-pq4fs,hnswlib-ip,usearch-ip`) picks the peers.

The peers, each at its strongest on this data:

- `faiss-sq8`, `faiss-pq4fs`: `IVF<nlist>,SQ8` and `IVF<nlist>,PQ<dim/2>x4fs` (4-bit fast scan), each with an exact
  float32 re-rank (`IndexRefine` over an `IndexFlatIP` of the table) of `k_factor · k` candidates, swept. They
  get recserve's coarse quantizer (its centroids in an `IndexFlatIP`, so the same lists are probed in the same
  order) and recserve's lists (each item added to the list recserve put it in, through `add_core`), so they
  differ from recserve only in how a list is scanned and re-ranked.
- `hnswlib-ip`, `usearch-ip`: HNSW graphs over the raw vectors with the inner-product metric. On unnormalised
  vectors inner product is not a metric, and graph search loses recall on it (hnswlib#74): what is printed is
  the recall they reach.
- `hnswlib-mips`, `usearch-mips`: the same graphs in L2 over the vectors lifted to dim + 1 by the classic
  inner-product-to-L2 reduction (`x' = [x, √(M² − ‖x‖²)]`, `q' = [q, 0]`, M the largest norm: the L2-nearest
  `x'` are the largest-inner-product `x`), which is how a user would get exact-metric graph search.
  Graphs: M = 16 neighbours (`connectivity`), 200 candidates while building (`ef_construction` /
  `expansion_add`), the search breadth `ef` / `expansion_search` swept.

Building uses every core (faiss's OpenMP, hnswlib's and usearch's threads); its wall time and the child's peak
RSS are recorded. Measuring pins the process to core `$CORE` with one thread (`omp_set_num_threads(1)`,
`OMP_NUM_THREADS=1`, `num_threads=1`, `threads=1`); memory is the RSS after the index is loaded (and, for Faiss,
its float32 re-rank table filled), before any query. Single queries are timed one `search` call each; batches are
the same queries 32 per call. A sweep for one setting stops at the first point whose recall reaches 0.995.
QPS = 1 / mean latency (single) and 32 / mean batch latency (batches). The QPS at a recall level is that of the
fastest swept point whose recall reaches it (the nearest sweep point at or above the level, not interpolated).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

RECALLS = (0.90, 0.95, 0.99)
STOP_AT = 0.995
BATCH = 32
NPROBES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
EFS = (100, 160, 256, 400, 640, 1024, 1600)
GRAPH_M, GRAPH_EF_BUILD = 16, 200
PEERS = ("faiss-sq8", "faiss-pq4fs", "hnswlib-ip", "hnswlib-mips", "usearch-ip", "usearch-mips")
DEFAULT_PEERS = ("faiss-sq8", "faiss-pq4fs", "hnswlib-ip", "usearch-ip")
LABELS = {
    "recserve": "recserve IVF int8 + exact re-rank",
    "faiss-sq8": "Faiss IVF-SQ8 + refine",
    "faiss-pq4fs": "Faiss IVF-PQ4 fast scan + refine",
    "hnswlib-ip": "hnswlib HNSW, inner product",
    "hnswlib-mips": "hnswlib HNSW, L2 of the MIPS lift",
    "usearch-ip": "usearch HNSW, inner product",
    "usearch-mips": "usearch HNSW, L2 of the MIPS lift",
}


def tensors(path: Path) -> dict:
    """Read-only memory maps of every tensor of a safetensors file."""
    with open(path, "rb") as f:
        size = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(size))
    dtypes = {"F32": "<f4", "U32": "<u4", "I64": "<i8", "U8": "u1"}
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        out[name] = np.memmap(path, dtype=dtypes[e["dtype"]], mode="r", offset=8 + size + a, shape=tuple(e["shape"]))
    return out


def index_file(toml: str) -> str:
    """`file` of model.toml's `[recall.index]` table."""
    section = toml.split("[recall.index]", 1)[1] if "[recall.index]" in toml else ""
    for line in section.splitlines():
        if line.startswith("["):
            break
        if line.split("=")[0].strip() == "file":
            return line.split("=", 1)[1].strip().strip('"')
    raise SystemExit("model.toml has no [recall.index] file: build the index first")


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def lift(x: np.ndarray, max_norm: float) -> np.ndarray:
    """The inner-product-to-L2 reduction: rows of `x` with √(max_norm² − ‖x‖²) appended (0 where rounding would
    make it negative), float32."""
    x = np.asarray(x, dtype=np.float32)
    extra = np.sqrt(np.maximum(np.float64(max_norm) ** 2 - (x.astype(np.float64) ** 2).sum(axis=1), 0.0))
    return np.ascontiguousarray(np.hstack([x, extra.astype(np.float32)[:, None]]))


def recall_of(got: np.ndarray, truth: np.ndarray) -> float:
    """Mean over queries of |got ∩ truth| / k (rows of ids; negative ids, Faiss's "none", never match)."""
    return float(np.mean([len(np.intersect1d(g[g >= 0], t)) / t.size for g, t in zip(got, truth)]))


class Inputs:
    """The catalogue, the queries and the lists of one benchmark run, as ivf_bench.rs left them."""

    def __init__(self, version: Path, bench_json: Path, truth: Path | None = None):
        self.bench = json.loads(bench_json.read_text())
        b = self.bench
        if b["item_storage"] != "fp32":
            raise SystemExit("ivf-peers.py compares fp32 catalogues only")
        self.k, self.dim, self.nlist, self.items = b["k"], b["dim"], b["nlist"], b["items"]
        self.version = version
        table = tensors(version / "tables.safetensors")
        self.x = table["item"]
        self.queries = np.ascontiguousarray(table["user"][np.array(b["query_users"])], dtype=np.float32)
        if truth is not None:
            self.truth = np.fromfile(truth, dtype="<u4").reshape(b["queries"], self.k).astype(np.int64)

    def blocks(self, block: int = 1 << 20):
        for a in range(0, self.items, block):
            yield a, np.ascontiguousarray(self.x[a : a + block], dtype=np.float32)

    def max_norm(self) -> float:
        return max(float(np.sqrt((part.astype(np.float64) ** 2).sum(axis=1).max())) for _, part in self.blocks())


# ---- building --------------------------------------------------------------------------------------------------


def build_faiss(name: str, inp: Inputs, out: Path) -> dict:
    import faiss

    faiss.omp_set_num_threads(os.cpu_count() or 1)
    ivf = tensors(inp.version / index_file((inp.version / "model.toml").read_text()))
    centroids = np.ascontiguousarray(ivf["centroids"], dtype=np.float32)
    offsets, sizes, ids = ivf["list_offsets"], ivf["list_sizes"], ivf["ids"]
    assign = np.empty(inp.items, dtype=np.int64)
    for lst in range(inp.nlist):
        a = int(offsets[lst]) * 16
        assign[ids[a : a + int(sizes[lst])]] = lst
    quantizer = faiss.IndexFlatIP(inp.dim)
    quantizer.add(centroids)
    if name == "faiss-sq8":
        index = faiss.IndexIVFScalarQuantizer(
            quantizer, inp.dim, inp.nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT
        )
    else:
        # Filled as a plain 4-bit IVFPQ and then converted: `add_core` of IndexIVFPQFastScan itself corrupts the
        # heap (faiss-cpu 1.15.1).
        index = faiss.IndexIVFPQ(quantizer, inp.dim, inp.nlist, inp.dim // 2, 4, faiss.METRIC_INNER_PRODUCT)
    index.own_fields = False
    started = time.monotonic()
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(inp.items, size=min(inp.items, 64 * inp.nlist), replace=False))
    index.train(np.ascontiguousarray(inp.x[sample], dtype=np.float32))  # the quantizer is kept: trains the codes
    for a, part in inp.blocks():
        lists = np.ascontiguousarray(assign[a : a + len(part)])
        keys = np.arange(a, a + len(part), dtype=np.int64)
        index.add_core(len(part), faiss.swig_ptr(part), faiss.swig_ptr(keys), faiss.swig_ptr(lists))
    if name == "faiss-pq4fs":
        index = faiss.IndexIVFPQFastScan(index)
    seconds = time.monotonic() - started
    index.quantizer = quantizer  # keep the quantizer alive and written with the index
    faiss.write_index(index, str(out / f"peer-{name}.faiss"))
    return {"seconds": seconds, "files": [f"peer-{name}.faiss"], "note": "coarse k-means reused from recserve's index"}


def build_graph(name: str, inp: Inputs, out: Path) -> dict:
    lib, space = name.split("-")
    dim = inp.dim + (space == "mips")
    max_norm = inp.max_norm() if space == "mips" else 0.0
    threads = os.cpu_count() or 1
    started = time.monotonic()
    if lib == "hnswlib":
        import hnswlib

        index = hnswlib.Index(space="ip" if space == "ip" else "l2", dim=dim)
        index.init_index(max_elements=inp.items, ef_construction=GRAPH_EF_BUILD, M=GRAPH_M, random_seed=100)
        for a, part in inp.blocks():
            index.add_items(lift(part, max_norm) if space == "mips" else part, np.arange(a, a + len(part)), num_threads=threads)
        seconds = time.monotonic() - started
        path = out / f"peer-{name}.hnsw"
        index.save_index(str(path))
    else:
        from usearch.index import Index

        index = Index(
            ndim=dim, metric="ip" if space == "ip" else "l2sq", dtype="f32", connectivity=GRAPH_M,
            expansion_add=GRAPH_EF_BUILD,
        )
        for a, part in inp.blocks():
            index.add(np.arange(a, a + len(part), dtype=np.uint64), lift(part, max_norm) if space == "mips" else part, threads=threads)
        seconds = time.monotonic() - started
        path = out / f"peer-{name}.usearch"
        index.save(str(path))
    return {"seconds": seconds, "files": [path.name], "max_norm": max_norm, "M": GRAPH_M, "ef_construction": GRAPH_EF_BUILD}


def build_one(name: str, version: Path, bench_json: Path, out: Path) -> None:
    inp = Inputs(version, bench_json)
    built = build_faiss(name, inp, out) if name.startswith("faiss") else build_graph(name, inp, out)
    built["index_bytes"] = sum((out / f).stat().st_size for f in built["files"])
    built["peak_rss_bytes"] = peak_rss_bytes()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    built["cpu_seconds"] = usage.ru_utime + usage.ru_stime  # the whole child: reading the table included
    built["threads"] = os.cpu_count()
    (out / f"build-{name}.json").write_text(json.dumps(built), encoding="utf-8")
    print(f"{name}: built in {built['seconds']:.1f} s wall, {built['cpu_seconds']:.0f} s CPU, index {built['index_bytes'] / 1e6:.1f} MB, "
          f"peak RSS {built['peak_rss_bytes'] / 1e9:.2f} GB", flush=True)


# ---- measuring -------------------------------------------------------------------------------------------------


class Searcher:
    """One loaded peer: `settings()` to sweep, `search(queries, setting)` → ids [n, k]."""

    def __init__(self, name: str, inp: Inputs, out: Path):
        self.name, self.k = name, inp.k
        lib, space = name.split("-")
        self.lib, self.space = lib, space
        if lib == "faiss":
            import faiss

            faiss.omp_set_num_threads(1)
            self.faiss = faiss
            base = faiss.read_index(str(out / f"peer-{name}.faiss"))
            self.flat = faiss.IndexFlatIP(inp.dim)
            for _, part in inp.blocks():
                self.flat.add(part)
            self.base = base
            self.index = faiss.IndexRefine(base, self.flat)
        else:
            built = json.loads((out / f"build-{name}.json").read_text())
            self.max_norm = built["max_norm"]
            dim = inp.dim + (space == "mips")
            if lib == "hnswlib":
                import hnswlib

                self.index = hnswlib.Index(space="ip" if space == "ip" else "l2", dim=dim)
                self.index.load_index(str(out / f"peer-{name}.hnsw"), max_elements=inp.items)
                self.index.set_num_threads(1)
            else:
                from usearch.index import Index

                self.index = Index.restore(str(out / f"peer-{name}.usearch"))

    def settings(self) -> list[list[dict]]:
        """Sweeps, each in increasing cost: a sweep stops at its first point with recall ≥ STOP_AT."""
        if self.lib == "faiss":
            factors = (1, 2, 4) if self.name == "faiss-sq8" else (2, 4, 8, 16)
            return [[{"nprobe": p, "k_factor": f} for p in NPROBES if p <= self.base.nlist] for f in factors]
        return [[{"ef": ef} for ef in EFS]]

    def prepare(self, q: np.ndarray) -> np.ndarray:
        if self.space == "mips":
            return np.ascontiguousarray(np.hstack([q, np.zeros((len(q), 1), np.float32)]))
        return q

    def search(self, q: np.ndarray, s: dict) -> np.ndarray:
        if self.lib == "faiss":
            params = self.faiss.IndexRefineSearchParameters(
                k_factor=float(s["k_factor"]), base_index_params=self.faiss.SearchParametersIVF(nprobe=s["nprobe"])
            )
            return self.index.search(q, self.k, params=params)[1]
        if self.lib == "hnswlib":
            self.index.set_ef(max(s["ef"], self.k))
            return self.index.knn_query(q, k=self.k, num_threads=1)[0].astype(np.int64)
        self.index.expansion_search = max(s["ef"], self.k)
        found = self.index.search(q, self.k, threads=1)
        keys = np.asarray(found.keys, dtype=np.int64).reshape(len(q), -1)
        return keys


def sweep(s: Searcher, inp: Inputs) -> list[dict]:
    queries = s.prepare(inp.queries)
    n = len(queries)
    points = []
    for settings in s.settings():
        for setting in settings:
            s.search(queries[:1], setting)  # warm
            took, found = [], []
            for i in range(n):
                q = queries[i : i + 1]
                t0 = time.perf_counter()
                got = s.search(q, setting)
                took.append(time.perf_counter() - t0)
                found.append(got[0])
            batches = []
            for a in range(0, n - BATCH + 1, BATCH):
                q = queries[a : a + BATCH]
                t0 = time.perf_counter()
                s.search(q, setting)
                batches.append(time.perf_counter() - t0)
            took, batches = np.array(took), np.array(batches)
            point = {
                **setting,
                "recall": recall_of(np.array(found), inp.truth),
                "qps": 1.0 / took.mean(),
                "p50_ms": float(np.percentile(took, 50) * 1e3),
                "p99_ms": float(np.percentile(took, 99) * 1e3),
                "batch_qps": BATCH / batches.mean(),
                "batch_p50_ms": float(np.percentile(batches, 50) * 1e3),
            }
            points.append(point)
            print(f"{s.name} {setting}: recall {point['recall']:.4f}, {point['qps']:,.0f} QPS single, "
                  f"{point['batch_qps']:,.0f} QPS in batches", file=sys.stderr, flush=True)
            if point["recall"] >= STOP_AT:
                break
    return points


def measure_one(name: str, version: Path, bench_json: Path, truth: Path, out: Path, round_: int) -> None:
    if "CORE" in os.environ:
        os.sched_setaffinity(0, {int(os.environ["CORE"])})
    inp = Inputs(version, bench_json, truth)
    before = rss_bytes()
    started = time.monotonic()
    s = Searcher(name, inp, out)
    loaded = time.monotonic() - started
    rss = rss_bytes()
    points = sweep(s, inp)
    result = {"name": name, "round": round_, "rss_bytes": rss, "rss_before_load_bytes": before,
              "load_seconds": loaded, "points": points}
    (out / f"round-{round_}-{name}.json").write_text(json.dumps(result), encoding="utf-8")


def peers() -> list[str]:
    chosen = [p for p in (os.environ.get("PEERS") or ",".join(DEFAULT_PEERS)).split(",") if p]
    unknown = [p for p in chosen if p not in PEERS]
    if unknown:
        raise SystemExit(f"PEERS: unknown peer(s) {', '.join(unknown)}; known: {', '.join(PEERS)}")
    return chosen


def child(*args: str) -> None:
    env = {**os.environ}
    subprocess.run([sys.executable, __file__, *args], check=True, env=env)


# ---- reporting -------------------------------------------------------------------------------------------------


def recserve_points(bench: dict) -> list[dict]:
    return [
        {
            "nprobe": r["nprobe"],
            "recall": r["recall"],
            "qps": r["qps"],
            "p50_ms": r["single_ms"]["p50"],
            "p99_ms": r["single_ms"]["p99"],
            "batch_qps": bench["batch"] / r["batch_ms"]["mean"] * 1e3 if r.get("batch_ms") else None,
            "batch_p50_ms": r["batch_ms"]["p50"] if r.get("batch_ms") else None,
        }
        for r in bench["ivf"]
    ]


def at_recall(points: list[dict], target: float, measure: str) -> dict | None:
    """The fastest point (by `measure`) whose recall reaches `target`, or None."""
    ok = [p for p in points if p["recall"] >= target and p.get(measure)]
    return max(ok, key=lambda p: p[measure]) if ok else None


def setting_of(p: dict) -> str:
    keys = [k for k in ("nprobe", "k_factor", "ef") if k in p]
    return ", ".join(f"{k} {p[k]}" for k in keys)


def summarise(rounds: dict[str, list[list[dict]]]) -> dict:
    """Per peer, measure and recall level: the median and the worst (lowest) QPS over the rounds, with the
    setting each round picked."""
    out: dict = {}
    for name, per_round in rounds.items():
        for measure in ("qps", "batch_qps"):
            for target in RECALLS:
                picks = [at_recall(points, target, measure) for points in per_round]
                cell = {"reached": all(picks), "rounds": len(picks)}
                if all(picks):
                    values = [p[measure] for p in picks]
                    cell.update(median=statistics.median(values), worst=min(values),
                                settings=sorted({setting_of(p) for p in picks}))
                out.setdefault(name, {}).setdefault(measure, {})[str(target)] = cell
    return out


def report(out: Path, out_svg: Path, title: str) -> None:
    rounds: dict[str, list[list[dict]]] = {}
    memory: dict[str, dict] = {}
    numbers = sorted({int(p.name.split("-")[1]) for p in out.glob("round-*-*.json")})
    if not numbers:
        raise SystemExit(f"{out}: no round-R-*.json; run the rounds first")
    for r in numbers:
        bench = json.loads((out / f"round-{r}-recserve.json").read_text())
        rounds.setdefault("recserve", []).append(recserve_points(bench))
        memory["recserve"] = {"rss_bytes": bench["rss_bytes"]["loaded"], "index_bytes": bench["bytes"]["index_file"]}
        for name in PEERS:
            path = out / f"round-{r}-{name}.json"
            if path.exists():
                got = json.loads(path.read_text())
                rounds.setdefault(name, []).append(got["points"])
                memory[name] = {"rss_bytes": got["rss_bytes"]}
    builds = {}
    if (out / "build.log").exists():
        builds["recserve"] = time_v((out / "build.log").read_text())
    for name in rounds:
        path = out / f"build-{name}.json"
        if path.exists():
            builds[name] = json.loads(path.read_text())
            memory[name]["index_bytes"] = builds[name]["index_bytes"]
    if "recserve" in builds:
        builds["recserve"]["index_bytes"] = memory["recserve"]["index_bytes"]
    summary = summarise(rounds)
    k = 100
    print(f"QPS at recall@{k}, one core: median / worst of {len(numbers)} rounds (the fastest sweep point at or above "
          "the level, not interpolated; settings picked in brackets)\n")
    for measure, label in (("qps", "single queries"), ("batch_qps", f"batches of {BATCH}")):
        print(f"**{label}**\n")
        print("| index | " + " | ".join(f"recall {t:.2f}" for t in RECALLS) + " |")
        print("| --- |" + " ---: |" * len(RECALLS))
        for name in rounds:
            cells = []
            for t in RECALLS:
                c = summary[name][measure][str(t)]
                cells.append(f"{c['median']:,.0f} / {c['worst']:,.0f} ({'; '.join(c['settings'])})"
                             if c["reached"] else "not reached")
            print(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
        print()
    print("| index | build wall (CPU) | build peak RSS | index bytes | RSS loaded (one core, measuring) | best recall reached |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name in rounds:
        b = builds.get(name, {})
        best = max(p["recall"] for pts in rounds[name] for p in pts)
        build = f"{b['seconds']:.0f} s ({b['cpu_seconds']:.0f} s)" if b else "see build.log"
        peak = f"{b['peak_rss_bytes'] / 1e9:.2f} GB" if b else "see build.log"
        print(f"| {LABELS[name]} | {build} | {peak} | {memory[name].get('index_bytes', 0) / 1e6:,.0f} MB | "
              f"{memory[name]['rss_bytes'] / 1e9:.2f} GB | {best:.4f} |")
    print()
    for t in RECALLS:
        mine = summary["recserve"]["qps"][str(t)]
        for name in rounds:
            theirs = summary[name]["qps"][str(t)]
            if name != "recserve" and mine["reached"] and theirs["reached"]:
                print(f"recall {t:.2f}, single: recserve / {LABELS[name]} = {mine['median'] / theirs['median']:.2f}× "
                      "by median", flush=True)
    series = {LABELS[name]: per_round[len(per_round) // 2] for name, per_round in rounds.items()}
    out_svg.write_text(svg(series, title), encoding="utf-8")
    (out / "summary.json").write_text(json.dumps({"summary": summary, "builds": builds, "memory": memory}),
                                      encoding="utf-8")


def time_v(log: str) -> dict:
    """Wall time, CPU seconds and peak RSS from the report of `/usr/bin/time -v`."""
    fields = {}
    for line in log.splitlines():
        key, _, value = line.strip().rpartition(": ")
        fields[key] = value
    wall = 0.0
    for part in fields.get("Elapsed (wall clock) time (h:mm:ss or m:ss)", "0").split(":"):
        wall = wall * 60 + float(part)
    return {
        "seconds": wall,
        "cpu_seconds": float(fields.get("User time (seconds)", 0)) + float(fields.get("System time (seconds)", 0)),
        "peak_rss_bytes": int(fields.get("Maximum resident set size (kbytes)", 0)) * 1024,
    }


def pareto(points: list[dict]) -> list[dict]:
    """The points no other point beats in both recall and QPS, by recall."""
    best = []
    for p in sorted(points, key=lambda p: (-p["recall"], -p["qps"])):
        if not best or p["qps"] > best[-1]["qps"]:
            best.append(p)
    return sorted(best, key=lambda p: p["recall"])


def svg(series: dict[str, list[dict]], title: str) -> str:
    w, h, left, right, top, bottom = 760, 460, 70, 250, 40, 50
    xs = [p["recall"] for s in series.values() for p in s]
    ys = [p["qps"] for s in series.values() for p in s]
    x0, x1 = max(0.5, min(xs) - 0.01), 1.0
    y0, y1 = np.log10(min(ys)) - 0.05, np.log10(max(ys)) + 0.05
    px = lambda x: left + (max(x, x0) - x0) / (x1 - x0) * (w - left - right)  # noqa: E731
    py = lambda y: top + (y1 - np.log10(y)) / (y1 - y0) * (h - top - bottom)  # noqa: E731
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{title}</text>',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
        f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">recall@100</text>',
        f'<text x="16" y="{(top + h - bottom) / 2}" transform="rotate(-90 16 {(top + h - bottom) / 2})" '
        'text-anchor="middle">single queries per second, one core (log)</text>',
    ]
    step = 0.05 if x1 - x0 > 0.2 else 0.02
    t = np.ceil(x0 / step) * step
    while t <= x1 + 1e-9:
        out.append(f'<line x1="{px(t):.1f}" y1="{top}" x2="{px(t):.1f}" y2="{h - bottom}" stroke="#ddd"/>')
        out.append(f'<text x="{px(t):.1f}" y="{h - bottom + 16}" text-anchor="middle">{t:.2f}</text>')
        t += step
    for e in range(int(np.floor(y0)), int(np.ceil(y1)) + 1):
        for m in (1, 2, 5):
            v = m * 10.0**e
            if y0 <= np.log10(v) <= y1:
                out.append(f'<line x1="{left}" y1="{py(v):.1f}" x2="{w - right}" y2="{py(v):.1f}" stroke="#ddd"/>')
                out.append(f'<text x="{left - 6}" y="{py(v) + 4:.1f}" text-anchor="end">{v:g}</text>')
    colours = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf"]
    for i, (name, points) in enumerate(series.items()):
        c = colours[i % len(colours)]
        front = pareto(points)
        path = " ".join(f"{px(p['recall']):.1f},{py(p['qps']):.1f}" for p in front)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for p in points:
            out.append(f'<circle cx="{px(p["recall"]):.1f}" cy="{py(p["qps"]):.1f}" r="3" fill="{c}"/>')
        ly = top + 16 + 20 * i
        out.append(f'<line x1="{w - right + 12}" y1="{ly}" x2="{w - right + 32}" y2="{ly}" stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{w - right + 38}" y="{ly + 4}">{name}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> None:
    usage = __doc__.split("\n\n")[1]
    if not argv:
        raise SystemExit(usage)
    command, args = argv[0], argv[1:]
    if command == "build" and len(args) == 3:
        version, bench_json, out = (Path(a) for a in args)
        for name in peers():
            if not (out / f"build-{name}.json").exists():
                child("build-one", name, *args)
    elif command == "build-one" and len(args) == 4:
        build_one(args[0], *(Path(a) for a in args[1:]))
    elif command == "measure" and len(args) == 5:
        for name in peers():
            child("measure-one", name, *args)
    elif command == "measure-one" and len(args) == 6:
        measure_one(args[0], Path(args[1]), Path(args[2]), Path(args[3]), Path(args[4]), int(args[5]))
    elif command == "report" and len(args) in (2, 3):
        report(Path(args[0]), Path(args[1]), args[2] if len(args) == 3 else "")
    else:
        raise SystemExit(usage)


if __name__ == "__main__":
    main(sys.argv[1:])
