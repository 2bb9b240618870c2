"""A synthetic catalogue of N items drawn around the trained Gowalla item vectors: item = a random trained item +
Gaussian noise of `spread` × that dimension's standard deviation; users are the trained user table.

Usage: python scripts/ivf-synthetic.py SOURCE_VERSION OUT_VERSION ITEMS SPREAD  (e.g. models/demo/lightgcn/1 target/s1m 1000000 0.3)
"""
import sys
from pathlib import Path
import numpy as np
from recserve_models import model_toml
from recserve_models.repository import load_tables, values, write_lightgcn_version
from recserve_models.model_toml import LightGCNToml, RecallSpec, TableSpec
src, out, n, spread = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
model = model_toml.read(src / "model.toml"); t = load_tables(src, model)
items = values(t[model.recall.item_table]); users = values(t[model.recall.user_table])
rng = np.random.default_rng(11)
sd = items.std(axis=0)
x = np.empty((n, items.shape[1]), np.float32)
for a in range(0, n, 1 << 20):
    b = min(n, a + (1 << 20)); base = items[rng.integers(0, len(items), b - a)]
    x[a:b] = base + spread * sd * rng.standard_normal(base.shape, dtype=np.float32)
dim = items.shape[1]
m = LightGCNToml(tables=(TableSpec("user", "tables.safetensors", len(users), dim, "fp32", "reject"),
                         TableSpec("item", "tables.safetensors", n, dim, "fp32", "reject")),
                 recall=RecallSpec("user", "item"), description=f"synthetic: {n} items around Gowalla's, spread {spread}")
write_lightgcn_version(out, m, {"user": users, "item": x})
print("wrote", out)
