"""The IVF index builder against plain references: k-means and nearest-centroid assignment against loops over
points, the int8 encoder and its error bound against a per-row loop in Python floats, the panel layout against
item-by-item placement, the table checksum against Python integers; and the `index` command with `check`, which
refuses a stale or mismatched index naming the file."""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

from recserve_models import check, ivf, model_toml, pq4
from recserve_models.commands import main
from recserve_models.model_toml import LightGCNToml, RecallSpec, TableSpec
from recserve_models.repository import Table, encode_table, load_tables, values, write_lightgcn_version


def clustered(rng: np.random.Generator, n: int, dim: int, clusters: int, spread: float = 0.05) -> np.ndarray:
    centres = rng.normal(size=(clusters, dim)) * 3
    return (centres[rng.integers(0, clusters, n)] + spread * rng.normal(size=(n, dim))).astype(np.float32)


def naive_nearest(x: np.ndarray, c: np.ndarray) -> np.ndarray:
    out = []
    for row in x.astype(np.float64):
        d = [float(np.sum((row - centre) ** 2)) for centre in c.astype(np.float64)]
        out.append(min(range(len(d)), key=lambda i: (d[i], i)))
    return np.array(out)


def naive_kmeans(x: np.ndarray, nlist: int, iterations: int, seed: int) -> np.ndarray:
    """Lloyd's algorithm point by point, from the same initial rows as `ivf.kmeans`."""
    rng = np.random.default_rng(seed)
    centroids = [x[i].astype(np.float64) for i in np.sort(rng.choice(len(x), size=nlist, replace=False))]
    for _ in range(iterations):
        assign = naive_nearest(x, np.array(centroids, dtype=np.float32))
        for c in range(nlist):
            members = [x[i].astype(np.float64) for i in range(len(x)) if assign[i] == c]
            assert members, "the reference data leaves no cluster empty"
            centroids[c] = sum(members) / len(members)
    return np.array(centroids, dtype=np.float32)


def test_nearest_is_the_nearest_centroid_by_squared_l2(rng) -> None:
    x = rng.normal(size=(200, 7)).astype(np.float32)
    c = rng.normal(size=(9, 7)).astype(np.float32)
    got = ivf.nearest(x, c, chunk=33)
    want = naive_nearest(x, c)
    # float32 distances may order two nearly equidistant centroids differently from float64: allow only those.
    d = ((x[:, None, :].astype(np.float64) - c[None].astype(np.float64)) ** 2).sum(-1)
    differ = got != want
    assert np.all(np.abs(d[differ, got[differ]] - d[differ, want[differ]]) <= 1e-4 * d[differ, want[differ]])
    assert differ.mean() < 0.02


def test_kmeans_equals_lloyd_point_by_point(rng) -> None:
    x = clustered(rng, 300, 5, 6)
    got = ivf.kmeans(x, 6, iterations=4, seed=3)
    want = naive_kmeans(x, 6, 4, 3)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_kmeans_splits_empty_lists_and_refuses_too_many(rng) -> None:
    x = np.repeat(rng.normal(size=(3, 4)).astype(np.float32), 20, axis=0)  # 3 distinct points, 60 rows
    centroids = ivf.kmeans(x, 5, iterations=3, seed=0)
    assert centroids.shape == (5, 4) and np.isfinite(centroids).all()
    assert len({tuple(c) for c in centroids}) == 5, "every centroid distinct after the splits"
    with pytest.raises(ivf.IndexError_, match="nlist must be from 1 to the 60"):
        ivf.kmeans(x, 61)


def naive_encode(row: np.ndarray, exact_range: float) -> tuple[list[int], float, float, float]:
    """The documented quantizer and bound for one row, in Python floats (float64) from the float32 parameters."""
    lo, hi = float(row.min()), float(row.max())
    scale = float(np.float32((np.float32(hi) - np.float32(lo)) / np.float32(255)))
    if scale == 0:
        scale = 1.0
    codes = [min(255, max(0, round(float(np.float32(np.float32(v) - np.float32(lo)) / np.float32(scale))))) for v in row]
    diff = max(abs(float(v) - (c * scale + lo)) for v, c in zip(row, codes))
    dim = len(row)
    g = (dim + 2) * 2.0**-24 / (1 - (dim + 2) * 2.0**-24)
    bound = (diff + 2 * g * (exact_range + abs(lo) + 255 * abs(scale))) * (1 + 2.0**-10)
    return codes, scale, lo, bound


@pytest.mark.parametrize("storage", ["fp32", "fp16", "int8"])
def test_encode_equals_the_per_row_quantizer_and_bounds_its_error(rng, storage: str) -> None:
    x = rng.normal(size=(40, 6)).astype(np.float32)
    x[3] = 0.25  # a constant row: scale 1.0
    spec = TableSpec("item", "t.safetensors", 40, 6, storage)
    stored = encode_table(spec, x)
    decoded = values(load_like(spec, stored))
    codes = ivf.encode(decoded, spec, stored)
    for r in range(40):
        if storage == "int8":
            t = stored[r, 6:].copy().view("<f4")
            exact_range = abs(float(t[1])) + 255 * abs(float(t[0]))
        else:
            exact_range = float(np.abs(decoded[r].astype(np.float64)).max())
        want_codes, scale, bias, bound = naive_encode(decoded[r], exact_range)
        assert codes.codes[r].tolist() == want_codes, r
        assert (float(codes.scale[r]), float(codes.bias[r])) == (scale, bias), r
        assert float(codes.err[r]) >= bound and math.isclose(float(codes.err[r]), bound, rel_tol=1e-6), r


def load_like(spec: TableSpec, stored: np.ndarray) -> Table:
    return Table(spec=spec, stored=stored)


def test_layout_places_every_item_in_its_list_in_panels(rng) -> None:
    items, dim, nlist = 70, 3, 4
    assign = rng.integers(0, nlist, items)
    assign[assign == 2] = 1  # an empty list
    codes = ivf.Codes(
        rng.integers(0, 256, (items, dim)).astype(np.uint8),
        rng.random(items).astype(np.float32),
        rng.random(items).astype(np.float32),
        rng.random(items).astype(np.float32),
    )
    t = ivf.layout(assign, nlist, codes)
    assert t["list_sizes"].tolist() == [int((assign == l).sum()) for l in range(nlist)]
    assert t["list_sizes"][2] == 0
    for l in range(nlist):
        members = [i for i in range(items) if assign[i] == l]  # ascending ids
        first = int(t["list_offsets"][l])
        assert int(t["list_offsets"][l + 1]) - first == -(-len(members) // 16)
        for slot in range((int(t["list_offsets"][l + 1]) - first) * 16):
            p, lane = first + slot // 16, slot % 16
            if slot < len(members):
                i = members[slot]
                assert t["ids"][p * 16 + lane] == i
                assert t["codes"][p, :, lane].tolist() == codes.codes[i].tolist()
                for name in ("scale", "bias", "err"):
                    assert t[name][p, lane] == getattr(codes, name)[i]
            else:
                assert t["ids"][p * 16 + lane] == 2**32 - 1
                assert t["err"][p, lane] == 0


def test_table_checksum_equals_python_integers(rng) -> None:
    for size in (0, 5, 8, 1003):
        raw = rng.integers(0, 256, size).astype(np.uint8)
        padded = bytes(raw) + bytes((-size) % 8)
        want = sum(int.from_bytes(padded[i : i + 8], "little") * (2 * (i // 8) + 1) for i in range(0, len(padded), 8))
        assert ivf.table_checksum(raw) == f"{want % 2**64:016x}"


def version(tmp_path: Path, rng: np.random.Generator, storage: str = "fp32") -> Path:
    items, users, dim = 500, 20, 8
    model = LightGCNToml(
        tables=(
            TableSpec("user", "tables.safetensors", users, dim, "fp32", "reject"),
            TableSpec("item", "tables.safetensors", items, dim, storage, "reject"),
        ),
        recall=RecallSpec("user", "item"),
    )
    directory = tmp_path / "repo" / "m" / "1"
    tables = {"user": rng.normal(size=(users, dim)).astype(np.float32), "item": clustered(rng, items, dim, 10, 0.5)}
    write_lightgcn_version(directory, model, tables)
    return directory


def exact_top(x: np.ndarray, q: np.ndarray, k: int) -> set[int]:
    return set(np.argsort(-(x.astype(np.float64) @ q.astype(np.float64)), kind="stable")[:k].tolist())


def test_the_index_command_writes_the_file_and_model_toml_and_check_accepts_it(tmp_path: Path, rng, capsys) -> None:
    directory = version(tmp_path, rng)
    main(["index", str(directory), "--nlist", "16", "--nprobe", "4", "--max-candidates", "300"])
    assert "500 items in 16 lists" in capsys.readouterr().out
    model = model_toml.read(directory / "model.toml")
    assert model.recall.index == model_toml.IndexSpec("ivf.safetensors", 4, 300)
    assert check.validate(tmp_path / "repo").errors == []
    item = load_tables(directory, model)["item"]
    assert ivf.verify(directory / "ivf.safetensors", item.spec, item.stored, values(item)) == 16


def test_check_refuses_a_stale_or_mismatched_index_naming_the_file(tmp_path: Path, rng) -> None:
    directory = version(tmp_path, rng)
    main(["index", str(directory), "--nlist", "16", "--nprobe", "4"])
    path = directory / "ivf.safetensors"
    toml = directory / "model.toml"
    text = toml.read_text()
    toml.write_text(text.replace("nprobe = 4", "nprobe = 17"))
    (error,) = check.validate(tmp_path / "repo").errors
    assert str(path) in error and "recall.index.nprobe = 17 is more than the index's 16 lists" in error
    toml.write_text(text)

    model = model_toml.read(toml)
    tables = load_tables(directory, model)
    changed = {name: values(t).copy() for name, t in tables.items()}
    changed["item"][7, 3] += 1.0
    shutil.copy(path, tmp_path / "ivf.safetensors")
    shutil.rmtree(directory)
    write_lightgcn_version(directory, model, changed)
    shutil.copy(tmp_path / "ivf.safetensors", path)
    (error,) = check.validate(tmp_path / "repo").errors
    assert str(path) in error and "the table changed since the index was built" in error


def test_recall_through_the_built_index_finds_most_of_the_exact_top_k(tmp_path: Path, rng) -> None:
    """The index's lists hold the items near each centroid: probing a quarter of them finds most of a query's
    exact top 20 (a property of the clustered data, checked with numpy, not the server's search)."""
    directory = version(tmp_path, rng)
    main(["index", str(directory), "--nlist", "16", "--nprobe", "4"])
    model = model_toml.read(directory / "model.toml")
    x = values(load_tables(directory, model)["item"])
    t = load_file(str(directory / "ivf.safetensors"))
    hits = 0
    for q in rng.normal(size=(20, 8)).astype(np.float32):
        lists = np.argsort(-(t["centroids"] @ q), kind="stable")[:4]
        probed = set()
        for l in lists:
            first, last = int(t["list_offsets"][l]), int(t["list_offsets"][l + 1])
            ids = t["ids"][first * 16 : last * 16]
            probed |= set(ids[ids != 2**32 - 1].tolist())
        hits += len(exact_top(x, q, 20) & probed)
    assert hits / (20 * 20) > 0.6, hits


def test_pq4_pack_is_the_documented_layout_and_unpack_inverts_it(rng) -> None:
    for m in (2, 4, 6, 32):
        codes = rng.integers(0, 16, size=(3 * pq4.BLOCK, m), dtype=np.uint8)
        packed = pq4.pack(codes)
        assert packed.shape == (3, m // 2, 32)
        for lane in range(codes.shape[0]):
            b, item = divmod(lane, 32)
            for s in range(m):
                byte = int(packed[b, s // 2, (s % 2) * 16 + item % 16])
                assert (byte & 15 if item < 16 else byte >> 4) == codes[lane, s]
        assert np.array_equal(pq4.unpack(packed), codes)


def test_pq4_default_m_and_its_checks() -> None:
    assert [pq4.default_m(d) for d in (2, 6, 8, 10, 64, 100)] == [2, 2, 4, 2, 32, 50]
    with pytest.raises(ivf.IndexError_, match="even number of sub-quantizers dividing dim 9"):
        pq4.default_m(9)
    for m in (0, 3, 5, 512):
        with pytest.raises(ivf.IndexError_, match=f"--pq-m must be even.*not {m}"):
            pq4.check_m(m, 10 if m != 512 else 1024)


@pytest.mark.parametrize("storage", ["fp32", "int8"])
def test_the_index_command_writes_pq4_codes_that_bound_every_items_score(tmp_path: Path, rng, storage) -> None:
    """A pq4 index: model.toml says so, check accepts it, every item's err bounds its code error, and for random
    queries every exact score lies within err·‖q‖₂ of the centroid's plus the decoded residual's score."""
    directory = version(tmp_path, rng, storage)
    main(["index", str(directory), "--nlist", "8", "--nprobe", "2", "--codes", "pq4"])
    model = model_toml.read(directory / "model.toml")
    assert model.recall.index == model_toml.IndexSpec("ivf.safetensors", 2, None, "pq4")
    assert 'codes = "pq4"' in (directory / "model.toml").read_text()
    assert check.validate(tmp_path / "repo").errors == []
    item = load_tables(directory, model)["item"]
    assert ivf.verify(directory / "ivf.safetensors", item.spec, item.stored, values(item)) == 8
    t = load_file(str(directory / "ivf.safetensors"))
    assert t["codes"].shape[1:] == (2, 32) and t["codebooks"].shape == (4, 16, 2)
    x = values(item).astype(np.float64)
    used = t["ids"] != 2**32 - 1
    ids = t["ids"][used].astype(np.int64)
    spans = np.diff(t["list_offsets"]) * 32
    lists = np.repeat(np.arange(8), spans)[used]
    decoded = t["centroids"][lists].astype(np.float64) + pq4.decode(pq4.unpack(t["codes"])[used], t["codebooks"])
    err = t["err"].reshape(-1)[used].astype(np.float64)
    for q in rng.normal(size=(20, 8)):
        gap = np.abs(x[ids] @ q - decoded @ q)
        assert np.all(gap <= err * np.linalg.norm(q)), gap.max()
    # A loose err is accepted by neither check nor verify when it no longer bounds the code error.
    t["err"][:] = 0.0
    save_file(t, str(directory / "ivf.safetensors"), metadata=safe_metadata(directory / "ivf.safetensors"))
    with pytest.raises(ivf.IndexError_, match="does not bound its code error"):
        ivf.verify(directory / "ivf.safetensors", item.spec, item.stored, values(item))


def safe_metadata(path: Path) -> dict[str, str]:
    with safe_open(str(path), framework="numpy") as f:
        return f.metadata()


def test_model_toml_refuses_an_unknown_index_codes(tmp_path: Path, rng) -> None:
    directory = version(tmp_path, rng)
    main(["index", str(directory), "--nlist", "4"])
    toml = directory / "model.toml"
    toml.write_text(toml.read_text().replace("nprobe = 1", 'nprobe = 1\ncodes = "pq8"'))
    with pytest.raises(model_toml.ModelTomlError, match="recall.index.codes must be one of 'int8', 'pq4', not 'pq8'"):
        model_toml.read(toml)
