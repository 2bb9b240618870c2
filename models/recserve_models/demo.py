"""The demo: the committed demo repository and docs/model-quality.md, from scratch (what the `demo` command
runs), and the held-out rank requests drawn from its data (`heldout_requests`).

`python -m recserve_models demo --out models/demo` runs, in a work directory (`--work`, default
`target/demo-work`):

1. `generate-criteo`: `TRAIN_ROWS` training and `TEST_ROWS` held-out rows (independent streams) of synthetic
   Criteo data with the default generator parameters;
2. `train-deepfm` (`DEEPFM`) and `train-lightgcn` on `--gowalla` (`LIGHTGCN`, a fixed number of epochs: the
   result does not depend on the machine's speed);
3. `export` / `quantize` into `work/repo`: `deepfm-fp32` (fp32 tables and graph), `deepfm` (int8 tables, INT8 QDQ
   graph calibrated on training rows), `lightgcn-fp32` (fp32 tables) and `lightgcn` (int8 tables);
4. the Gowalla ranker for the recall → rank pipeline (`gowalla_rank`, `RANKER`): the training interactions split
   into an early and a late window (`label_window`, `WINDOW`), LightGCN-A trained on the early window with the
   `LIGHTGCN` recipe (`lightgcn-early-run`), the ranker trained on LightGCN-A's candidates labelled by the late
   window, exported with the item feature and co-occurrence tables of all training interactions as
   `deepfm-gowalla-fp32` and quantized into `deepfm-gowalla` (int8 tables, fp32 graph);
5. `check` on the held-out rows and the Gowalla test split, and the pipeline's quality (`PIPELINE_CANDIDATES`);
6. copies `deepfm`, `deepfm-fp32`, `lightgcn` and `deepfm-gowalla` into `--out`, with `quality.json` (all the
   figures), an example rank request and the server config `recserve.toml` with `[pipelines.demo]` (`PIPELINE`),
   and renders `--report` (docs/model-quality.md) from `quality.json`.

Each step whose output already exists in the work directory with the same parameters is reused (data files by
their `.json` description, training runs by their `training.json`), so a second run only re-exports. Everything is
seeded: the same command on the same kind of machine writes the same bytes (numpy's BLAS kernels differ between
CPU generations in the last bits of float sums, which then carry through training).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from . import criteo, files, gowalla_rank, label_window, lightgcn, model_toml, report, train_deepfm
from .check import VOCABULARY, Validation, compare_deepfm, compare_lightgcn, validate
from .export import export_deepfm, export_lightgcn, quantize_version
from .model_toml import DeepFMToml
from .progress import to_stderr
from .repository import MODEL_TOML

TRAIN_ROWS = 500_000
TEST_ROWS = 100_000
GENERATOR = criteo.GeneratorConfig()
DEEPFM = train_deepfm.TrainConfig(epochs=2, min_count=20)
LIGHTGCN = lightgcn.TrainConfig(epochs=40, batch=16384, lr=0.01)
LIGHTGCN_EVAL_EVERY = 10
ITEM_ID_FIELD = "C21"
WINDOW = label_window.WindowConfig()
RANKER = gowalla_rank.RankConfig()
RANKER_NAME = "deepfm-gowalla"
# The demo's recommend pipeline (docs/api.md), served by scripts/run-demo.sh:
# `recserve serve --repository models/demo --config models/demo/recserve.toml`.
PIPELINE = {"name": "demo", "recall_model": "lightgcn", "ranking_model": RANKER_NAME, "candidates": 100, "k": 10}
PIPELINE_CANDIDATES = (100, 500)  # the N of "recall N → rank → top 20" measured for the report
CONFIG_FILE = "recserve.toml"
COMMAND = "nice -n 10 python -m recserve_models demo --out models/demo --report docs/model-quality.md"
COMMITTED = {
    "deepfm": "DeepFM, int8 tables, INT8 QDQ dense graph",
    "deepfm-fp32": "DeepFM, fp32 tables, fp32 dense graph",
    "lightgcn": "LightGCN on Gowalla, int8 user, item and history tables",
    RANKER_NAME: (
        "DeepFM reranking LightGCN's candidates (pipeline demo), int8 tables, fp32 dense graph, item features, "
        "co-occurrence table"
    ),
}


def _log(message: str) -> None:
    print(f"demo: {message}", file=sys.stderr, flush=True)


def _same(a: object, b: object) -> bool:
    return json.loads(json.dumps(a)) == json.loads(json.dumps(b))


def _generated(path: Path, split: str, rows: int) -> dict[str, Any]:
    description = criteo.sidecar(path)
    if path.is_file() and description.is_file():
        known = json.loads(description.read_text(encoding="utf-8"))
        if (
            _same(known.get("generator"), criteo.generator_info(GENERATOR))
            and known.get("split") == split
            and known.get("rows") == rows
        ):
            _log(f"reusing {path}")
            return known
    _log(f"generating {rows} {split} rows into {path}")
    return criteo.generate(GENERATOR, split, rows, path)


def _run_info(directory: Path) -> dict[str, Any] | None:
    path = directory / "training.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


def _deepfm_run(work: Path, train_file: Path, test_file: Path) -> train_deepfm.DeepFMRun:
    directory = work / "deepfm-run"
    info = _run_info(directory)
    if (
        info is not None
        and _same(info.get("config"), asdict(DEEPFM))
        and info["data"]["train"] == str(train_file.resolve())
        and info["data"]["test"] == str(test_file.resolve())
    ):
        _log(f"reusing the DeepFM run in {directory}")
        return train_deepfm.DeepFMRun.load(directory)
    shutil.rmtree(directory, ignore_errors=True)
    _log("training DeepFM")
    return train_deepfm.run_training(train_file, directory, DEEPFM, test_path=test_file)


def _lightgcn_run(work: Path, gowalla: Path) -> lightgcn.LightGCNRun:
    directory = work / "lightgcn-run"
    info = _run_info(directory)
    if (
        info is not None
        and _same(info.get("config"), asdict(LIGHTGCN))
        and Path(info["data"]["directory"]).resolve() == gowalla.resolve()
    ):
        _log(f"reusing the LightGCN run in {directory}")
        return lightgcn.LightGCNRun.load(directory)
    shutil.rmtree(directory, ignore_errors=True)
    _log("training LightGCN")
    return lightgcn.run_training(gowalla, directory, LIGHTGCN, LIGHTGCN_EVAL_EVERY)


def _early_run(work: Path, gowalla: Path) -> lightgcn.LightGCNRun:
    directory = work / label_window.WINDOW_RUN
    if label_window.matches(directory, gowalla, LIGHTGCN, WINDOW):
        _log(f"reusing the early-window LightGCN run in {directory}")
        return lightgcn.LightGCNRun.load(directory)
    shutil.rmtree(directory, ignore_errors=True)
    _log("training LightGCN-A on the early window")
    return label_window.early_run(gowalla, directory, LIGHTGCN, WINDOW)


def _ranker_run(work: Path, early: lightgcn.LightGCNRun, window: lightgcn.Interactions) -> gowalla_rank.RankRun:
    directory = work / "ranker-run"
    info = _run_info(directory)
    if (
        info is not None
        and info.get("kind") == "deepfm-gowalla"
        and _same(info.get("lightgcn"), early.info["config"])
        and _same(info.get("window"), asdict(WINDOW))
        and _same(info.get("config"), asdict(RANKER))
    ):
        _log(f"reusing the Gowalla ranker run in {directory}")
        return gowalla_rank.RankRun.load(directory)
    shutil.rmtree(directory, ignore_errors=True)
    _log("training the Gowalla ranker")
    return gowalla_rank.run_training(early, window, WINDOW, directory, RANKER, to_stderr("train-ranker"))


def _pipeline_config() -> str:
    lines = [
        "# The demo's recall → rank pipeline (written by `python -m recserve_models demo`):",
        "#   recserve serve --repository models/demo --config models/demo/recserve.toml",
        f"[pipelines.{PIPELINE['name']}]",
    ]
    lines += [f"{key} = {json.dumps(value)}" for key, value in PIPELINE.items() if key != "name"]
    return "\n".join(lines) + "\n"


def _portable(info: dict[str, Any], *keys: str) -> dict[str, Any]:
    """`info` with the data paths under `keys` made relative to the working directory."""
    data = dict(info["data"])
    for key in keys:
        path = Path(data[key])
        if path.is_absolute():
            data[key] = os.path.relpath(path)
    return info | {"data": data}


def _files(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}


def _table_bytes(version: Path) -> int:
    model = model_toml.read(version / MODEL_TOML)
    return sum((version / f).stat().st_size for f in {t.file for t in model.tables})


def build(out: Path, work: Path, gowalla: Path, report_path: Path | None) -> dict[str, Any]:
    files.mkdir(work, exist_ok=True)
    train_file, test_file = work / "criteo" / "train.tsv", work / "criteo" / "test.tsv"
    train_data = _generated(train_file, "train", TRAIN_ROWS)
    test_data = _generated(test_file, "test", TEST_ROWS)
    deepfm_run = _deepfm_run(work, train_file, test_file)
    lightgcn_run = _lightgcn_run(work, gowalla)
    interactions = lightgcn.read_interactions(gowalla / "train.txt", gowalla / "test.txt")
    early_run = _early_run(work, gowalla)
    ranker_run = _ranker_run(work, early_run, label_window.split(interactions, WINDOW))

    repo = work / "repo"
    shutil.rmtree(repo, ignore_errors=True)
    _log(f"exporting and quantizing into {repo}")
    description = f"DeepFM trained on {TRAIN_ROWS:,} synthetic Criteo rows (recserve demo)"
    export_deepfm(
        deepfm_run, repo / "deepfm-fp32" / "1", "fp32", item_id_field=ITEM_ID_FIELD, description=f"{description}, fp32"
    )
    quantize_version(
        repo / "deepfm-fp32" / "1",
        repo / "deepfm" / "1",
        tables_storage="int8",
        graph_precision="int8",
        calibration=deepfm_run.directory / train_deepfm.CALIBRATION,
        description=f"{description}, int8 tables and INT8 dense graph",
    )
    gowalla_description = f"LightGCN trained on Gowalla for {LIGHTGCN.epochs} epochs (recserve demo)"
    export_lightgcn(lightgcn_run, repo / "lightgcn-fp32" / "1", "fp32", f"{gowalla_description}, fp32 tables")
    quantize_version(
        repo / "lightgcn-fp32" / "1",
        repo / "lightgcn" / "1",
        tables_storage="int8",
        graph_precision=None,
        description=f"{gowalla_description}, int8 tables",
    )
    ranker_description = (
        "DeepFM reranking LightGCN's Gowalla candidates, trained on a label window (recserve demo pipeline)"
    )
    ranker_fp32 = repo / f"{RANKER_NAME}-fp32" / "1"
    served_transforms = gowalla_rank.export(
        ranker_run, lightgcn_run, interactions, ranker_fp32, "fp32", f"{ranker_description}, fp32"
    )
    quantize_version(
        ranker_fp32,
        repo / RANKER_NAME / "1",
        tables_storage="int8",
        graph_precision=None,
        description=f"{ranker_description}, int8 tables",
    )

    _log("checking and comparing precisions (check)")
    validation: Validation = validate(repo)
    if validation.errors:
        raise SystemExit(f"demo: the work repository does not pass check: {validation.errors[0]}")
    rankers = {RANKER_NAME, f"{RANKER_NAME}-fp32"}
    criteo_models = Validation(
        [m for m in validation.models if m.name not in rankers],
        {name: v for name, v in validation.versions.items() if name not in rankers},
        validation.warnings,
    )
    deepfm_rows = compare_deepfm(criteo_models, test_file)
    lightgcn_rows = compare_lightgcn(validation, gowalla)
    _log(f"measuring the pipeline: recall N → rank → top 20 for N in {PIPELINE_CANDIDATES}")
    recall_model, ranker = validation.served("lightgcn"), validation.served(RANKER_NAME)
    assert recall_model is not None and ranker is not None
    pipeline_rows, auc_rows = gowalla_rank.pipeline_quality(
        recall_model,
        ranker,
        interactions,
        PIPELINE_CANDIDATES,
        to_stderr("demo"),
        auc_candidates=PIPELINE_CANDIDATES[0],
    )

    _log(f"writing {out}")
    files.mkdir(out, exist_ok=True)
    for name in COMMITTED:
        shutil.rmtree(out / name, ignore_errors=True)
        shutil.copytree(repo / name, out / name)
        files.finish(out / name)
    quality = {
        "format_version": 1,
        # Paths relative to the working directory, so that the committed file does not depend on the checkout.
        "command": COMMAND,
        "machine": f"{os.cpu_count()} CPU cores ({platform.machine()}), onnxruntime {ort.__version__}",
        "criteo": {"train": train_data, "test": test_data},
        "deepfm": {"training": _portable(deepfm_run.info, "train", "test")},
        "lightgcn": {"training": _portable(lightgcn_run.info, "directory")},
        "check": {"deepfm": deepfm_rows, "lightgcn": lightgcn_rows},
        "ranker": {
            "early_lightgcn": _portable(early_run.info, "directory"),
            "training": ranker_run.info,
            "served_transforms": [asdict(t) for t in served_transforms],
            "pipeline": PIPELINE,
            "quality": pipeline_rows,
            "auc": auc_rows,
        },
        "table_bytes": {
            "fp32": _table_bytes(repo / "deepfm-fp32" / "1"),
            "int8": _table_bytes(repo / "deepfm" / "1"),
        },
        "demo": {name: {"what": what, "files": _files(out / name / "1")} for name, what in COMMITTED.items()},
    }
    files.write_text(out / "quality.json", json.dumps(quality, indent=2) + "\n", encoding="utf-8")
    files.write_text(out / "rank-request.json", json.dumps(_example_request(out), indent=2) + "\n", encoding="utf-8")
    files.write_text(out / CONFIG_FILE, _pipeline_config(), encoding="utf-8")
    if report_path is not None:
        files.write_text(report_path, report.render(quality), encoding="utf-8")
        _log(f"wrote {report_path}")
    return quality


# --- held-out rank requests ------------------------------------------------------------------------------------


def heldout_rows(quality: dict[str, Any], count: int) -> criteo.RawData:
    """The first `count` held-out rows of the demo's test file, regenerated from the parameters in quality.json."""
    test = quality["criteo"]["test"]
    info = dict(test["generator"])
    info.pop("vocab_sizes", None)
    generator = criteo.Generator(criteo.GeneratorConfig(**info))
    first = next(generator.rows(test["split"], test["rows"]))
    with tempfile.TemporaryDirectory(prefix="recserve-demo-") as scratch:
        path = Path(scratch, "heldout.tsv")
        path.write_text(criteo.format_chunk(first), encoding="ascii")
        return criteo.read(path, max_rows=count)


def heldout_requests(
    model: DeepFMToml, ids: np.ndarray, dense: np.ndarray, sizes: tuple[int, ...]
) -> list[tuple[str, dict[str, Any]]]:
    """Rank requests over held-out rows: request `r` takes the user-side fields and dense features of one row and
    the item-side fields of the next `size` rows (the first candidate is that row itself)."""
    columns = {name: i for i, name in enumerate(criteo.CATEGORICAL_FIELDS)}
    item_id = model.ranking.item_id_field
    out, row = [], 0
    for size in sizes:
        user = {f.name: int(ids[row, columns[f.name]]) for f in model.fields_on("user")}
        candidates = []
        for j in range(row, row + size):
            candidate: dict[str, Any] = {
                "fields": {f.name: int(ids[j, columns[f.name]]) for f in model.fields_on("item") if f.name != item_id}
            }
            if item_id is not None:
                candidate = {"id": int(ids[j, columns[item_id]])} | candidate
            candidates.append(candidate)
        request = {"user": {"fields": user, "dense": [float(v) for v in dense[row]]}, "candidates": candidates}
        out.append((f"held-out rows {row}..{row + size - 1}", request))
        row += size
    return out


def _example_request(out: Path) -> dict[str, Any]:
    quality = json.loads((out / "quality.json").read_text(encoding="utf-8"))
    model = model_toml.read_deepfm(out / "deepfm" / "1" / MODEL_TOML)
    vocabulary = criteo.Vocabulary.from_json((out / "deepfm" / "1" / VOCABULARY).read_text(encoding="utf-8"))
    raw = heldout_rows(quality, 3)
    return heldout_requests(model, vocabulary.ids(raw), raw.dense, (3,))[0][1]
