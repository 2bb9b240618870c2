"""A synthetic catalogue of N items drawn around the trained Gowalla item vectors: item = a random trained item +
Gaussian noise of `spread` × that dimension's standard deviation; users are the trained user table (fp32).

Usage: python scripts/ivf-synthetic.py SOURCE_VERSION OUT_VERSION ITEMS SPREAD  (e.g. models/demo/lightgcn/1 target/s1m 1000000 0.3)

The item table is generated and written in blocks of 2^20 rows straight into the safetensors file (its layout:
an 8-byte little-endian header length, the JSON header, the tensors' bytes), so 10M × 64 items (2.56 GB) take
one block of memory, not two copies of the table.
"""
import json
import struct
import sys
from pathlib import Path
import numpy as np
from recserve_models import model_toml
from recserve_models.repository import load_tables, values
from recserve_models.model_toml import LightGCNToml, RecallSpec, TableSpec

BLOCK = 1 << 20
src, out, n, spread = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
model = model_toml.read(src / "model.toml"); t = load_tables(src, model)
items = values(t[model.recall.item_table]); users = np.ascontiguousarray(values(t[model.recall.user_table]), "<f4")
dim = items.shape[1]
rng = np.random.default_rng(11)
sd = items.std(axis=0)
header = {
    "user": {"dtype": "F32", "shape": list(users.shape), "data_offsets": [0, users.nbytes]},
    "item": {"dtype": "F32", "shape": [n, dim], "data_offsets": [users.nbytes, users.nbytes + n * dim * 4]},
}
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((-len(text)) % 8)  # tensors start 8-byte aligned
out.mkdir(parents=True)
with open(out / "tables.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text))); f.write(text); f.write(users.tobytes())
    for a in range(0, n, BLOCK):
        b = min(n, a + BLOCK); base = items[rng.integers(0, len(items), b - a)]
        block = base + spread * sd * rng.standard_normal(base.shape, dtype=np.float32)
        f.write(np.ascontiguousarray(block, "<f4").tobytes())
        print(f"items {b}/{n}", file=sys.stderr, flush=True)
m = LightGCNToml(tables=(TableSpec("user", "tables.safetensors", len(users), dim, "fp32", "reject"),
                         TableSpec("item", "tables.safetensors", n, dim, "fp32", "reject")),
                 recall=RecallSpec("user", "item"), description=f"synthetic: {n} items around Gowalla's, spread {spread}")
(out / "model.toml").write_text(model_toml.to_toml(m), encoding="utf-8")
print("wrote", out)
