"""recall@100 of the IVF index's answer (the exact top 100 of the probed lists, as src/recall/ivf.rs returns it
unless capped) against the exact top 100, per nprobe, on a version directory with an index.

Usage: python scripts/ivf-recall.py VERSION_DIR QUERIES NPROBE,NPROBE,...  (after source scripts/env.sh)
"""
import sys
from pathlib import Path
import numpy as np
from safetensors.numpy import load_file
from recserve_models import model_toml
from recserve_models.repository import load_tables, values

version = Path(sys.argv[1]); queries_n = int(sys.argv[2]); nprobes = [int(x) for x in sys.argv[3].split(",")]
model = model_toml.read(version / "model.toml")
tables = load_tables(version, model)
items = values(tables[model.recall.item_table]); users = values(tables[model.recall.user_table])
t = load_file(str(version / model.recall.index.file))
nlist = t["centroids"].shape[0]
rng = np.random.default_rng(7)
q = users[rng.choice(len(users), size=min(queries_n, len(users)), replace=False)]
lists = []
for l in range(nlist):
    a, b = int(t["list_offsets"][l]) * 16, int(t["list_offsets"][l + 1]) * 16
    ids = t["ids"][a:b]; lists.append(ids[ids != 2**32 - 1].astype(np.int64))
scores = q @ items.T
exact = np.argsort(-scores, axis=1, kind="stable")[:, :100]
order = np.argsort(-(q @ t["centroids"].T), axis=1, kind="stable")
print(f"{len(items)} items, nlist {nlist}, {len(q)} queries (user-table rows)")
for nprobe in nprobes:
    rec, scanned = [], []
    for i in range(len(q)):
        probed = np.concatenate([lists[l] for l in order[i, :nprobe]])
        top = probed[np.argsort(-scores[i, probed], kind="stable")[:100]]
        rec.append(len(np.intersect1d(top, exact[i])) / 100); scanned.append(len(probed))
    print(f"nprobe {nprobe:5d}: recall@100 mean {np.mean(rec):.4f}, min {np.min(rec):.2f}, items scanned {np.mean(scanned)/len(items)*100:.1f}%")
