"""The committed demo repository: it passes `check`, meets the issue's quality and size budgets as measured in
its quality.json, and docs/model-quality.md is exactly what `report` renders from that file."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from recserve_models import check, report

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "models" / "demo"


@pytest.fixture(scope="module")
def quality() -> dict:
    return json.loads((DEMO / "quality.json").read_text(encoding="utf-8"))


def test_the_quality_page_is_what_report_renders(quality: dict) -> None:
    page = (ROOT / "docs" / "model-quality.md").read_text(encoding="utf-8")
    assert page == report.render(quality), "regenerate: python -m recserve_models report --quality " + (
        "models/demo/quality.json --out docs/model-quality.md"
    )


def test_the_demo_repository_passes_check() -> None:
    validation = check.validate(DEMO)
    assert validation.errors == []
    assert [m.name for m in validation.models] == ["deepfm", "deepfm-fp32", "deepfm-gowalla", "lightgcn"]


def test_the_demo_meets_the_budgets(quality: dict) -> None:
    rows = quality["check"]["deepfm"]
    fp32 = next(r for r in rows if r["variant"] == "deepfm-fp32")
    int8 = next(r for r in rows if r["variant"] == "deepfm")
    assert (fp32["auc"] - int8["auc"]) * 100 <= report.INT8_AUC_BUDGET_PP
    assert quality["table_bytes"]["int8"] <= 0.4 * quality["table_bytes"]["fp32"]
    assert quality["criteo"]["test"]["teacher_auc"] > fp32["auc"] > 0.75
    files = {p.relative_to(DEMO): p.stat().st_size for p in DEMO.rglob("*") if p.is_file()}
    for name, model in quality["demo"].items():
        assert model["files"] == {p.name: size for p, size in files.items() if p.parts[0] == name}
    # The ranker's co-occurrence table (20 neighbours per item, I64 indices: about 9.4 MiB) is most of the growth.
    assert sum(files.values()) < 25 * 2**20, "the committed demo stays small (23.5 MiB with the pipeline's ranker)"


def test_the_demo_pipeline_runs_on_small_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """`demo` end to end with small data and short training: the same code path as the real demo."""
    import numpy as np

    from recserve_models import criteo, demo, gowalla_rank, lightgcn, train_deepfm
    from recserve_models.testing.demo_cases import demo_cases

    monkeypatch.setattr(demo, "TRAIN_ROWS", 3000)
    monkeypatch.setattr(demo, "TEST_ROWS", 1000)
    monkeypatch.setattr(demo, "GENERATOR", criteo.GeneratorConfig(seed=3, vocab_scale=0.002, max_vocab=300))
    monkeypatch.setattr(
        demo, "DEEPFM", train_deepfm.TrainConfig(factors=4, hidden=(16, 8), epochs=1, batch=256, min_count=3)
    )
    monkeypatch.setattr(demo, "LIGHTGCN", lightgcn.TrainConfig(dim=8, epochs=2, batch=256, lr=0.01))
    monkeypatch.setattr(demo, "LIGHTGCN_EVAL_EVERY", 1)
    monkeypatch.setattr(
        demo, "RANKER", gowalla_rank.RankConfig(candidates=10, neighbours=5, max_epochs=2, batch=256, hidden=(8,))
    )
    monkeypatch.setattr(demo, "PIPELINE_CANDIDATES", (5, 10))
    gowalla = tmp_path / "gowalla"
    data = lightgcn.synthetic_interactions(np.random.default_rng(0), 80, 100, 12)
    lightgcn.write_interactions(gowalla, data)
    out, work, page = tmp_path / "demo", tmp_path / "work", tmp_path / "quality.md"
    quality = demo.build(out, work, gowalla, page)
    assert sorted(p.name for p in out.iterdir()) == [
        "deepfm",
        "deepfm-fp32",
        "deepfm-gowalla",
        "lightgcn",
        "quality.json",
        "rank-request.json",
        "recserve.toml",
    ]
    pipeline = tomllib.loads((out / "recserve.toml").read_text())["pipelines"]["demo"]
    assert pipeline["recall_model"] == "lightgcn" and pipeline["ranking_model"] == "deepfm-gowalla"
    rows = quality["ranker"]["quality"]
    assert [(r["users_from"], r["candidates"]) for r in rows] == [
        ("user table", None), ("user table", 5), ("user table", 10), ("history", None), ("history", 5), ("history", 10),
    ]  # fmt: skip
    assert all(0 <= r["recall@20"] <= 1 and 0 <= r["ndcg@20"] <= 1 for r in rows)
    aucs = quality["ranker"]["auc"]
    assert [(r["users_from"], r["scorer"]) for r in aucs] == [
        (users_from, scorer)
        for users_from in ("user table", "history")
        for scorer in ("the ranker", "LightGCN's score", "log popularity")
    ]
    assert all(r["candidates"] == 5 and 0 <= r["auc"] <= 1 for r in aucs)
    ranker = check.validate(out).served("deepfm-gowalla")
    assert ranker is not None and ranker.cooccurrence is not None
    assert page.read_text() == report.render(json.loads((out / "quality.json").read_text()))
    assert {r["variant"] for r in quality["check"]["deepfm"]} == {
        "deepfm-fp32", "deepfm-fp32 tables + deepfm graph", "deepfm tables + deepfm-fp32 graph", "deepfm",
    }  # fmt: skip
    assert check.validate(out).errors == []
    request = json.loads((out / "rank-request.json").read_text())
    assert len(request["candidates"]) == 3 and "C21" not in request["candidates"][0]["fields"]
    cases = demo_cases(out, (1, 5))
    assert [(c["model"], len(c["expected_scores"])) for c in cases["cases"]] == [
        ("deepfm-fp32", 1), ("deepfm-fp32", 5), ("deepfm", 1), ("deepfm", 5),
    ]  # fmt: skip
    # A second run reuses the data and both training runs, and writes the same bytes.
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    capsys.readouterr()
    demo.build(out, work, gowalla, page)
    assert capsys.readouterr().err.count("reusing") == 6  # + the early-window LightGCN run
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
