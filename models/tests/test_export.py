"""`export --storage` and `quantize --tables`: one storage for every table, or a storage per table (issue 23,
item 4: the item table is the one scanned per query), and the LightGCN popularity tensor carried into every
version written from a run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from recserve_models import check, lightgcn, model_toml
from recserve_models.commands import main
from recserve_models.repository import MODEL_TOML, POPULARITY, read_popularity


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("export")
    data = lightgcn.synthetic_interactions(np.random.default_rng(6), 50, 60, 8)
    lightgcn.write_interactions(directory / "data", data)
    lightgcn.run_training(directory / "data", directory / "run", lightgcn.TrainConfig(dim=8, epochs=1, batch=64))
    return directory / "run"


def _storages(version: Path) -> dict[str, str]:
    return {t.name: t.storage for t in model_toml.read(version / MODEL_TOML).tables}


def test_one_storage_re_encodes_every_table_user_and_history_included(run_dir: Path, tmp_path: Path, capsys) -> None:
    main(["export", "--run", str(run_dir), "--out", str(tmp_path / "all" / "1"), "--storage", "int8"])
    assert _storages(tmp_path / "all" / "1") == {"user": "int8", "item": "int8", "history": "int8"}
    assert "(lightgcn, int8 tables)" in capsys.readouterr().out


def test_a_per_table_choice_re_encodes_only_the_tables_it_names(run_dir: Path, tmp_path: Path, capsys) -> None:
    main(["export", "--run", str(run_dir), "--out", str(tmp_path / "e" / "1"), "--storage", "item=int8"])
    assert _storages(tmp_path / "e" / "1") == {"user": "fp32", "item": "int8", "history": "fp32"}
    assert "(lightgcn, tables user fp32, item int8, history fp32)" in capsys.readouterr().out
    main(["export", "--run", str(run_dir), "--out", str(tmp_path / "f" / "1")])
    main(
        ["quantize", "--model", str(tmp_path / "f" / "1"), "--out", str(tmp_path / "q" / "1"), "--tables", "item=int8"]
    )
    assert _storages(tmp_path / "q" / "1") == {"user": "fp32", "item": "int8", "history": "fp32"}
    main(
        ["quantize", "--model", str(tmp_path / "q" / "1"), "--out", str(tmp_path / "r" / "1"), "--tables", "user=fp16"]
    )
    assert _storages(tmp_path / "r" / "1") == {"user": "fp16", "item": "int8", "history": "fp32"}
    assert check.validate(tmp_path).errors == []


@pytest.mark.parametrize(
    ("command", "value", "message"),
    [
        (
            "export",
            "itme=int8",
            "export: --storage: 'itme' is not a table of the model (its tables: user, item, history)",
        ),
        ("export", "int4", "argument --storage: expected fp32, fp16, int8, or TABLE=STORAGE pairs"),
        ("export", "item=int4", "argument --storage: 'item=int4': expected TABLE=STORAGE with a storage of fp32"),
        ("quantize", "history=int8,nope=fp16", "quantize: --tables: 'nope' is not a table of the model"),
        ("quantize", "item=int8,item=fp16", "argument --tables: table 'item' is named twice"),
    ],
)
def test_a_wrong_per_table_choice_is_refused_naming_the_flag(
    run_dir: Path, tmp_path: Path, capsys, command: str, value: str, message: str
) -> None:
    source = tmp_path / "src" / "1"
    main(["export", "--run", str(run_dir), "--out", str(source)])
    capsys.readouterr()
    flag = "--storage" if command == "export" else "--tables"
    where = ["--run", str(run_dir)] if command == "export" else ["--model", str(source)]
    with pytest.raises(SystemExit) as refused:
        main([command, *where, "--out", str(tmp_path / "out" / "1"), flag, value])
    assert message in str(refused.value) + capsys.readouterr().err


def test_the_popularity_tensor_is_exported_and_kept_by_quantize(run_dir: Path, tmp_path: Path) -> None:
    run = lightgcn.LightGCNRun.load(run_dir)
    main(["export", "--run", str(run_dir), "--out", str(tmp_path / "p" / "1")])
    main(["quantize", "--model", str(tmp_path / "p" / "1"), "--out", str(tmp_path / "p8" / "1"), "--tables", "int8"])
    for version in (tmp_path / "p" / "1", tmp_path / "p8" / "1"):
        tensors = load_file(version / "tables.safetensors")
        assert tensors[POPULARITY].dtype == np.int64 and tensors[POPULARITY].shape == (run.items.shape[0],)
        np.testing.assert_array_equal(tensors[POPULARITY], run.item_popularity)
        model = model_toml.read_lightgcn(version / MODEL_TOML)
        np.testing.assert_array_equal(read_popularity(version, model), run.item_popularity)
        assert f'popularity = "{POPULARITY}"' in (version / MODEL_TOML).read_text()
    assert check.validate(tmp_path).errors == []
