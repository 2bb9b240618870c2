"""Version directories: safetensors layouts exactly as documented, table loading checks, the naive gather."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from conftest import criteo_params

from recserve_models import model_toml
from recserve_models.model_toml import DeepFMToml, DenseGraphSpec, FieldSpec, RankingSpec, TableSpec
from recserve_models.onnx_export import build_graph
from recserve_models.repository import (
    MODEL_TOML,
    OutOfVocabulary,
    TableError,
    encode_table,
    gather,
    load_tables,
    write_deepfm_version,
)

I64_MIN, I64_MAX = -(2**63), 2**63 - 1


def small_model(storages: dict[str, str]) -> tuple[DeepFMToml, dict[str, np.ndarray]]:
    rng = np.random.default_rng(5)
    tables = {
        name: rng.normal(0, 0.2, (rows, 9)).astype(np.float32) for name, rows in (("a", 40), ("b", 3), ("c", 1000))
    }
    specs = (
        TableSpec("a", "a.safetensors", 40, 9, storages["a"], oov="default", default_row=17),
        TableSpec("b", "bc.safetensors", 3, 9, storages["b"], oov="reject"),
        TableSpec("c", "bc.safetensors", 1000, 9, storages["c"]),
    )
    fields = (FieldSpec("a", "user"), FieldSpec("b", "item"), FieldSpec("c", "item"), FieldSpec("c2", "item", "c"))
    model = DeepFMToml(specs, fields, DenseGraphSpec("net.onnx", "fp32"), RankingSpec(("x",), "b"))
    return model, tables


def safetensors_header(path: Path) -> dict:
    """The file's JSON header, read by hand rather than through the library."""
    data = path.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + size])


def write(tmp_path: Path, storages: dict[str, str]) -> tuple[Path, DeepFMToml, dict[str, np.ndarray]]:
    model, tables = small_model(storages)
    params = criteo_params(np.random.default_rng(0))
    directory = tmp_path / "m" / "1"
    write_deepfm_version(directory, model, tables, build_graph(params))
    return directory, model, tables


def test_tensors_have_the_documented_dtype_and_shape(tmp_path: Path) -> None:
    directory, _, _ = write(tmp_path, {"a": "fp32", "b": "fp16", "c": "int8"})
    assert sorted(p.name for p in directory.iterdir()) == ["a.safetensors", "bc.safetensors", "model.toml", "net.onnx"]
    a = safetensors_header(directory / "a.safetensors")
    bc = safetensors_header(directory / "bc.safetensors")
    assert (a["a"]["dtype"], a["a"]["shape"]) == ("F32", [40, 9])
    assert (bc["b"]["dtype"], bc["b"]["shape"]) == ("F16", [3, 9])
    assert (bc["c"]["dtype"], bc["c"]["shape"]) == ("U8", [1000, 9 + 8])


def test_model_toml_round_trips_and_keeps_policies_explicit(tmp_path: Path) -> None:
    directory, model, _ = write(tmp_path, {"a": "fp32", "b": "fp32", "c": "fp32"})
    assert model_toml.read(directory / MODEL_TOML) == model
    text = (directory / MODEL_TOML).read_text()
    assert text.count("oov = ") == 3 and text.count("default_row = ") == 2  # none for the reject table
    assert 'table = "c"' in text and text.count("table = ") == 1  # only where it differs from the field name
    assert "embeddings_input" not in text and "description" not in text


@pytest.mark.parametrize(("storage", "tolerance"), [("fp32", 0.0), ("fp16", 2e-4), ("int8", 2e-3)])
def test_gather_reads_rows_and_applies_default_policy(tmp_path: Path, storage: str, tolerance: float) -> None:
    directory, model, values = write(tmp_path, {"a": storage, "b": storage, "c": storage})
    tables = load_tables(directory, model)
    ids = np.array([0, 39, 5, -1, 40, I64_MIN, I64_MAX], dtype=np.int64)
    rows = gather(tables["a"], ids)
    assert rows.dtype == np.float32 and rows.shape == (7, 9)
    expected = values["a"][[0, 39, 5, 17, 17, 17, 17]]
    assert np.abs(rows - expected).max() <= tolerance
    assert np.array_equal(rows[3:], np.repeat(rows[3:4], 4, axis=0))


def test_gather_refuses_unknown_ids_of_reject_tables(tmp_path: Path) -> None:
    directory, model, _ = write(tmp_path, {"a": "fp32", "b": "int8", "c": "fp32"})
    table = load_tables(directory, model)["b"]
    assert gather(table, np.array([0, 2])).shape == (2, 9)
    for bad in (-1, 3, I64_MIN, I64_MAX):
        with pytest.raises(OutOfVocabulary, match=rf"id {bad} is outside the vocabulary of table 'b' \(ids 0 to 2\)"):
            gather(table, np.array([1, bad, 2]))


def test_tables_that_do_not_match_model_toml_are_refused(tmp_path: Path) -> None:
    directory, model, values = write(tmp_path, {"a": "fp32", "b": "fp32", "c": "fp32"})
    relabelled = DeepFMToml(
        (TableSpec("a", "a.safetensors", 40, 9, "fp16"), *model.tables[1:]), model.fields, model.dense_graph
    )
    with pytest.raises(TableError, match=r"a\.safetensors: tensor 'a' is float32 \[40, 9\] but storage 'fp16'"):
        load_tables(directory, relabelled)
    missing = DeepFMToml((TableSpec("zz", "a.safetensors", 40, 9, "fp32"),), model.fields[:1], model.dense_graph)
    with pytest.raises(TableError, match=r"a\.safetensors: no tensor named 'zz'"):
        load_tables(directory, missing)
    with pytest.raises(ValueError, match=r"table 'a' has shape \[40, 9\], model.toml says \[41, 9\]"):
        encode_table(TableSpec("a", "a.safetensors", 41, 9, "fp32"), values["a"])


@pytest.mark.parametrize("storage", ["fp32", "fp16", "int8"])
def test_mapped_tables_equal_the_tables_read_into_memory(tmp_path: Path, storage: str) -> None:
    directory, model, _ = write(tmp_path, {"a": storage, "b": storage, "c": storage})
    read, mapped = load_tables(directory, model), load_tables(directory, model, mapped=True)
    for name, table in read.items():
        assert isinstance(mapped[name].stored, np.memmap) and not mapped[name].stored.flags.writeable
        assert mapped[name].stored.dtype == table.stored.dtype
        np.testing.assert_array_equal(mapped[name].stored, table.stored)
    missing = DeepFMToml((TableSpec("zz", "a.safetensors", 40, 9, storage),), model.fields[:1], model.dense_graph)
    with pytest.raises(TableError, match=r"a\.safetensors: no tensor named 'zz'"):
        load_tables(directory, missing, mapped=True)
    wrong = DeepFMToml((TableSpec("a", "a.safetensors", 41, 9, storage),), model.fields[:1], model.dense_graph)
    with pytest.raises(TableError, match=r"a\.safetensors: tensor 'a' is"):
        load_tables(directory, wrong, mapped=True)
