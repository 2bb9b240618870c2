"""Faiss beside recserve's IVF index, on the same vectors, queries, lists and exact answers: QPS at recall@100 =
0.90, 0.95 and 0.99, and a recall-vs-QPS SVG. Run by scripts/ivf-bench.sh in its own virtualenv (faiss-cpu and
numpy only; this file imports nothing of recserve).

Usage: python scripts/ivf-faiss.py VERSION_DIR BENCH_JSON TRUTH_U32 OUT_SVG [OUT_JSON]

BENCH_JSON and TRUTH_U32 come from `examples/ivf_bench.rs` (`--json`, `--truth`): its figures for recserve, the
user rows it queried, and their exact top-k ids. Faiss gets the same coarse quantizer (recserve's centroids, an
`IndexFlatIP`, so it probes the same lists in the same order) and the same lists (each item added to the list
recserve put it in, through `add_core`), so the two differ only in how a list is scanned and re-ranked:
`IVF<nlist>,SQ8` (8-bit per dimension, like recserve's codes) and `IVF<nlist>,PQ<dim/2>x4fs` (4-bit fast scan),
each with an exact re-rank over the float32 vectors (`IndexRefine` over one shared `IndexFlatIP`) of
`k_factor · k` candidates. One thread (`omp_set_num_threads(1)`), one query per `search` call (as recserve's
single-query figures), timed around the call, pinned to core `$CORE` when it is set.
"""

import json
import os
import struct
import sys
import time
from pathlib import Path

import faiss
import numpy as np

RECALLS = (0.90, 0.95, 0.99)
NPROBES = (1, 2, 4, 8, 16, 32, 64, 128)


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


def pareto(points: list[dict]) -> list[dict]:
    """The points no other point beats in both recall and QPS, by recall."""
    best = []
    for p in sorted(points, key=lambda p: (-p["recall"], -p["qps"])):
        if not best or p["qps"] > best[-1]["qps"]:
            best.append(p)
    return sorted(best, key=lambda p: p["recall"])


def svg(series: dict[str, list[dict]], title: str) -> str:
    w, h, left, right, top, bottom = 720, 440, 70, 190, 40, 50
    xs = [p["recall"] for s in series.values() for p in s]
    ys = [p["qps"] for s in series.values() for p in s]
    x0, x1 = max(0.5, min(xs) - 0.01), 1.0
    y0, y1 = np.log10(min(ys)) - 0.05, np.log10(max(ys)) + 0.05
    px = lambda x: left + (x - x0) / (x1 - x0) * (w - left - right)  # noqa: E731
    py = lambda y: top + (y1 - np.log10(y)) / (y1 - y0) * (h - top - bottom)  # noqa: E731
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{left}" y="22" font-size="14">{title}</text>',
        f'<line x1="{left}" y1="{h - bottom}" x2="{w - right}" y2="{h - bottom}" stroke="black"/>',
        f'<line x1="{left}" y1="{top}" x2="{left}" y2="{h - bottom}" stroke="black"/>',
        f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">recall@100</text>',
        f'<text x="16" y="{(top + h - bottom) / 2}" transform="rotate(-90 16 {(top + h - bottom) / 2})" '
        'text-anchor="middle">queries per second, one thread (log)</text>',
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
    colours = ["#d62728", "#1f77b4", "#2ca02c", "#9467bd"]
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


def main() -> None:
    version, bench_json, truth_path, out_svg = (Path(a) for a in sys.argv[1:5])
    out_json = Path(sys.argv[5]) if len(sys.argv) > 5 else None
    bench = json.loads(bench_json.read_text())
    k, dim, nlist, items = bench["k"], bench["dim"], bench["nlist"], bench["items"]
    truth = np.fromfile(truth_path, dtype="<u4").reshape(bench["queries"], k)
    toml = (version / "model.toml").read_text()
    if bench["item_storage"] != "fp32":
        raise SystemExit("ivf-faiss.py compares fp32 catalogues only")
    table = tensors(version / "tables.safetensors")
    x, users = table["item"], table["user"]
    queries = np.ascontiguousarray(users[np.array(bench["query_users"])], dtype=np.float32)
    ivf = tensors(version / index_file(toml))
    centroids = np.ascontiguousarray(ivf["centroids"], dtype=np.float32)
    offsets, sizes, ids = ivf["list_offsets"], ivf["list_sizes"], ivf["ids"]
    assign = np.empty(items, dtype=np.int64)
    for l in range(nlist):
        a = int(offsets[l]) * 16
        assign[ids[a : a + int(sizes[l])]] = l

    faiss.omp_set_num_threads(2)  # building only; searches below run on one thread
    quantizer = faiss.IndexFlatIP(dim)
    quantizer.add(centroids)
    sq8 = faiss.IndexIVFScalarQuantizer(quantizer, dim, nlist, faiss.ScalarQuantizer.QT_8bit, faiss.METRIC_INNER_PRODUCT)
    # The fast-scan index is filled as a plain 4-bit IVFPQ and then converted: `add_core` of IndexIVFPQFastScan
    # itself corrupts the heap (faiss-cpu 1.15.1).
    pq = faiss.IndexIVFPQ(quantizer, dim, nlist, dim // 2, 4, faiss.METRIC_INNER_PRODUCT)
    rng = np.random.default_rng(0)
    sample = np.sort(rng.choice(items, size=min(items, 64 * nlist), replace=False))
    train = np.ascontiguousarray(x[sample], dtype=np.float32)
    built = {}
    for name, index in (("SQ8", sq8), ("PQ4fs", pq)):
        started = time.monotonic()
        index.train(train)  # the quantizer is already trained (and kept): this trains the codes
        built[name] = time.monotonic() - started
    flat = faiss.IndexFlatIP(dim)
    block = 1 << 20
    started = time.monotonic()
    for a in range(0, items, block):
        part = np.ascontiguousarray(x[a : a + block], dtype=np.float32)
        flat.add(part)
        lists = np.ascontiguousarray(assign[a : a + block])
        ids = np.arange(a, a + len(part), dtype=np.int64)
        for index in (sq8, pq):
            index.add_core(len(part), faiss.swig_ptr(part), faiss.swig_ptr(ids), faiss.swig_ptr(lists))
        print(f"faiss: added {min(items, a + block)}/{items}", file=sys.stderr, flush=True)
    pq = faiss.IndexIVFPQFastScan(pq)
    add_seconds = time.monotonic() - started
    del train

    faiss.omp_set_num_threads(1)
    if "CORE" in os.environ:  # pinned as recserve's run is (scripts/ivf-bench.sh)
        os.sched_setaffinity(0, {int(os.environ["CORE"])})
    results = {}
    for name, base, factors in (("SQ8", sq8, (1, 2, 4)), ("PQ4fs", pq, (2, 4, 8))):
        refine = faiss.IndexRefine(base, flat)
        points = []
        for nprobe in NPROBES:
            for kf in factors:
                params = faiss.IndexRefineSearchParameters(
                    k_factor=float(kf), base_index_params=faiss.SearchParametersIVF(nprobe=nprobe)
                )
                took, hits = [], 0
                for i in range(len(queries)):
                    q = queries[i : i + 1]
                    t0 = time.perf_counter()
                    _, got = refine.search(q, k, params=params)
                    took.append(time.perf_counter() - t0)
                    hits += len(np.intersect1d(got[0], truth[i]))
                took = np.array(took)
                points.append(
                    {
                        "nprobe": nprobe,
                        "k_factor": kf,
                        "recall": hits / truth.size,
                        "qps": 1.0 / took.mean(),
                        "p50_ms": float(np.percentile(took, 50) * 1e3),
                        "p99_ms": float(np.percentile(took, 99) * 1e3),
                    }
                )
                print(f"faiss {name} nprobe {nprobe} k_factor {kf}: {points[-1]}", file=sys.stderr, flush=True)
        results[f"Faiss IVF{nlist},{name if name == 'SQ8' else f'PQ{dim // 2}x4fs'} + refine"] = points

    ours = [
        {
            "nprobe": r["nprobe"],
            "recall": r["recall"],
            "qps": r["qps"],
            "p50_ms": r["single_ms"]["p50"],
            "p99_ms": r["single_ms"]["p99"],
        }
        for r in bench["ivf"]
    ]
    series = {"recserve IVF int8 + exact re-rank": ours, **results}
    title = f"{items:,} × {dim} items, nlist {nlist}, top {k}, one thread, single queries"
    out_svg.write_text(svg(series, title), encoding="utf-8")
    summary = {}
    # QPS = 1 / mean latency (what a client sees, preemptions by other processes included), and 1 / median
    # latency (the same search without them: on a shared machine the mean carries other processes' noise).
    for measure, label in (("qps", "QPS = 1 / mean latency"), ("qps_p50", "QPS = 1 / median latency")):
        for points in series.values():
            for p in points:
                p["qps_p50"] = 1e3 / p["p50_ms"]
        print(f"\n{label}\n\n| recall@{k} | " + " | ".join(series) + " |")
        print("| ---: |" + " ---: |" * len(series))
        for target in RECALLS:
            cells = []
            for name, points in series.items():
                ok = [p for p in points if p["recall"] >= target]
                p = max(ok, key=lambda p: p[measure]) if ok else None
                summary.setdefault(measure, {}).setdefault(name, {})[str(target)] = p
                if p is None:
                    cells.append("not reached")
                else:
                    how = f"nprobe {p['nprobe']}" + (f", k_factor {p['k_factor']}" if "k_factor" in p else "")
                    cells.append(f"{p[measure]:,.0f} ({how})")
            print(f"| {target:.2f} | " + " | ".join(cells) + " |")
        print()
        for target in RECALLS:
            mine = summary[measure]["recserve IVF int8 + exact re-rank"][str(target)]
            for name in results:
                theirs = summary[measure][name][str(target)]
                if mine and theirs:
                    print(f"recall {target:.2f}: recserve / {name} = {mine[measure] / theirs[measure]:.2f}×")
    print(f"faiss: codes trained in {built}, s; lists filled (both indexes and the flat refine) in {add_seconds:.0f} s")
    if out_json:
        out_json.write_text(json.dumps({"series": series, "summary": summary}), encoding="utf-8")


if __name__ == "__main__":
    main()
