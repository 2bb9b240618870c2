"""scripts/recall-check.py against what `check --json` writes (issue 23, items 1 and 2): it compares or exits
non-zero, and it counts the same users as `check`, including on a split where some test users have no training
items. The served side is a small stand-in HTTP server that answers recall requests from the same tables with
numpy, so no recserve binary is needed."""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from recserve_models import lightgcn, model_toml
from recserve_models.commands import main as toolchain
from recserve_models.repository import MODEL_TOML, load_tables, values

SCRIPT = Path(__file__).parents[2] / "scripts" / "recall-check.py"
MODEL = "lastfm-fp32"
WITHOUT_TRAINING = (0, 3)  # test users whose training items are removed


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("recall_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


recall_check = _script()


def _split_with_users_without_training(directory: Path) -> lightgcn.Interactions:
    """A small clustered split in which the users `WITHOUT_TRAINING` have test items but no training item."""
    data = lightgcn.synthetic_interactions(np.random.default_rng(11), 60, 90, 12)
    counts = np.diff(data.train_indptr)
    keep = np.ones(data.train_pairs, dtype=bool)
    for u in WITHOUT_TRAINING:
        keep[data.train_indptr[u] : data.train_indptr[u + 1]] = False
        counts[u] = 0
    indptr = np.concatenate([[0], np.cumsum(counts)])
    data = lightgcn.Interactions(
        data.users, data.items, indptr, data.train_indices[keep], data.test_indptr, data.test_indices
    )
    lightgcn.write_interactions(directory, data)
    return data


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(split directory, repository, the JSON `check --json` wrote for it)."""
    root = tmp_path_factory.mktemp("recall-check")
    data_dir = root / "data"
    _split_with_users_without_training(data_dir)
    config = lightgcn.TrainConfig(dim=8, layers=2, epochs=3, batch=256, lr=0.02)
    lightgcn.run_training(data_dir, root / "run", config)
    repo = root / "repo"
    toolchain(["export", "--run", str(root / "run"), "--out", str(repo / MODEL / "1")])
    report = root / "check.json"
    toolchain(["check", str(repo), "--lightgcn-data", str(data_dir), "--json", str(report)])
    return data_dir, repo, report


def _offline(report: Path) -> dict[str, dict]:
    return recall_check.offline_figures(report, MODEL, ["user_id", "history"])


def test_check_counts_every_test_user_by_id_and_only_those_with_training_items_by_history(checked) -> None:
    data_dir, _, report = checked
    document = json.loads(report.read_text())
    assert document["format_version"] == 1
    rows = {r["users_from"]: r for r in document["lightgcn"]}
    test = recall_check.read_split(data_dir / "test.txt")
    train = recall_check.read_split(data_dir / "train.txt")
    users, history_users = recall_check.counted_users(train, test)
    assert len(users) - len(history_users) == len(WITHOUT_TRAINING)
    assert (rows["user table"]["test_users"], rows["user table"]["skipped_users"]) == (len(users), 0)
    assert (rows["history"]["test_users"], rows["history"]["skipped_users"]) == (
        len(history_users),
        len(WITHOUT_TRAINING),
    )


def test_figures_equal_to_the_check_json_rows_agree(checked) -> None:
    offline = _offline(checked[2])
    measured = {
        key: recall_check.Figure(row["recall@20"], row["ndcg@20"], row["test_users"]) for key, row in offline.items()
    }
    assert recall_check.compare(measured, offline, lambda _: None) == recall_check.AGREE


def test_a_figure_that_differs_fails(checked) -> None:
    offline = _offline(checked[2])
    row = offline["user_id"]
    measured = {"user_id": recall_check.Figure(row["recall@20"] + 1e-4, row["ndcg@20"], row["test_users"])}
    assert recall_check.compare(measured, {"user_id": row}, lambda _: None) == recall_check.DISAGREE
    # A disagreement is reported as one even when another figure (here: history, not measured) is not compared.
    assert recall_check.compare(measured, offline, lambda _: None) == recall_check.DISAGREE


def test_figures_over_other_users_are_not_compared(checked) -> None:
    offline = _offline(checked[2])
    row = offline["history"]
    lines: list[str] = []
    measured = {"history": recall_check.Figure(row["recall@20"], row["ndcg@20"], row["test_users"] + 2)}
    assert recall_check.compare(measured, {"history": row}, lines.append) == recall_check.CANNOT_COMPARE
    assert f"{row['test_users'] + 2} users here, {row['test_users']} offline" in lines[-1]


def test_a_figure_without_offline_row_is_not_a_pass(checked) -> None:
    offline = _offline(checked[2])
    row = offline["user_id"]
    measured = {"user_id": recall_check.Figure(row["recall@20"], row["ndcg@20"], row["test_users"])}
    measured["history"] = measured["user_id"]
    assert recall_check.compare(measured, {"user_id": row}, lambda _: None) == recall_check.CANNOT_COMPARE
    assert recall_check.compare(measured, None, lambda _: None) == recall_check.AGREE  # --no-compare


def test_the_demo_quality_json_layout_holds_the_same_rows(checked, tmp_path: Path) -> None:
    rows = json.loads(checked[2].read_text())["lightgcn"]
    quality = tmp_path / "quality.json"
    quality.write_text(json.dumps({"format_version": 1, "check": {"deepfm": [], "lightgcn": rows}}))
    assert recall_check.offline_figures(quality, MODEL, ["user_id", "history"]) == _offline(checked[2])


@pytest.mark.parametrize(
    ("document", "model", "message"),
    [
        ({"repository": "repo", "models": {}}, MODEL, "holds no LightGCN figures"),
        ({"check": {"deepfm": []}}, MODEL, "holds no LightGCN figures"),
        (None, "lightgcn", "no offline figure for user_id of model 'lightgcn'"),
    ],
)
def test_recall_check_exits_2_before_asking_when_it_has_nothing_to_compare_with(
    checked, tmp_path: Path, capsys, document: dict | None, model: str, message: str
) -> None:
    data_dir, _, report = checked
    if document is not None:
        report = tmp_path / "offline.json"
        report.write_text(json.dumps(document))
    # No server listens on port 9: a request would fail; the refusal comes before any.
    argv = ["--server", "http://127.0.0.1:9", "--model", model, "--data", str(data_dir), "--quality", str(report)]
    assert recall_check.main(argv) == recall_check.CANNOT_COMPARE
    assert message in capsys.readouterr().err


def test_limit_and_another_k_are_refused_unless_only_measuring(checked, capsys) -> None:
    data_dir, _, report = checked
    base = ["--server", "http://127.0.0.1:9", "--model", MODEL, "--data", str(data_dir), "--quality", str(report)]
    assert recall_check.main([*base, "--limit", "5"]) == recall_check.CANNOT_COMPARE
    assert "--limit 5 measures a subset" in capsys.readouterr().err
    assert recall_check.main([*base, "--k", "10"]) == recall_check.CANNOT_COMPARE
    assert "the offline figures are @20" in capsys.readouterr().err


def test_a_split_with_a_second_line_per_user_is_refused_with_the_expected_format(tmp_path: Path) -> None:
    path = tmp_path / "train.txt"
    path.write_text("0 1\n0 2\n")
    with pytest.raises(SystemExit, match=r"train.txt:2: user 0 has a second line \(expected one line per user"):
        recall_check.read_split(path)


# --- end to end, against a stand-in server ------------------------------------------------------------------


class _Recall:
    """Answers `POST /v1/models/MODEL/recall` from a LightGCN version's tables, as the server defines it: the
    user's row or the history embedding, scores against every item, `exclude` removed, top `k` by score."""

    def __init__(self, version: Path) -> None:
        model = model_toml.read_lightgcn(version / MODEL_TOML)
        tables = load_tables(version, model)
        self.users = values(tables[model.recall.user_table])
        self.items = values(tables[model.recall.item_table])
        assert model.recall.history_table is not None
        self.history = values(tables[model.recall.history_table])
        self.asked = {"user_id": 0, "history": 0}

    def answer(self, body: dict) -> tuple[int, dict]:
        if "history" in body:
            if not body["history"]:
                return 400, {"error": "history: must hold at least one item id"}
            self.asked["history"] += 1
            query = lightgcn.embed_history(self.history, np.array(body["history"], dtype=np.int64))
        else:
            self.asked["user_id"] += 1
            query = self.users[body["user_id"]]
        scores = (query[None, :] @ self.items.T)[0]
        scores[body.get("exclude", [])] = -np.inf
        top = np.argsort(-scores, kind="stable")[: body["k"]]
        return 200, {"version": 1, "items": [{"id": int(i), "score": float(scores[i])} for i in top]}


@pytest.fixture
def server(checked) -> Iterator[tuple[str, _Recall]]:
    recall = _Recall(checked[1] / MODEL / "1")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            assert self.path == f"/v1/models/{MODEL}/recall", self.path
            status, body = recall.answer(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: object) -> None:
            pass

    http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=http.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{http.server_address[1]}", recall
    http.shutdown()
    http.server_close()


def test_served_figures_agree_with_check_over_the_same_users(checked, server, capsys) -> None:
    data_dir, _, report = checked
    url, recall = server
    argv = ["--server", url, "--model", MODEL, "--data", str(data_dir), "--quality", str(report), "--history"]
    assert recall_check.main([*argv, "--concurrency", "2"]) == recall_check.AGREE
    out = capsys.readouterr().out
    rows = {r["users_from"]: r for r in json.loads(report.read_text())["lightgcn"]}
    assert recall.asked == {"user_id": rows["user table"]["test_users"], "history": rows["history"]["test_users"]}
    assert f"history: {len(WITHOUT_TRAINING)} test users without training items left out" in out
    assert out.count(" yes (") == 2


def test_a_wider_tolerance_agrees_within_it_and_not_beyond(checked) -> None:
    row = _offline(checked[2])["user_id"]
    near = {"user_id": recall_check.Figure(row["recall@20"] - 0.0018, row["ndcg@20"] - 0.001, row["test_users"])}
    far = {"user_id": recall_check.Figure(row["recall@20"] - 0.0021, row["ndcg@20"], row["test_users"])}
    lines: list[str] = []
    assert recall_check.compare(near, {"user_id": row}, lines.append, tolerance=0.002) == recall_check.AGREE
    assert "agree within 0.002" in lines[0]
    assert recall_check.compare(near, {"user_id": row}, lambda _: None) == recall_check.DISAGREE
    assert recall_check.compare(far, {"user_id": row}, lambda _: None, tolerance=0.002) == recall_check.DISAGREE


# --- the pipeline mode (--pipeline) ------------------------------------------------------------------------------


def _quality_with_pipeline_rows(path: Path) -> Path:
    rows = [
        {"users_from": "user table", "pipeline": "LightGCN alone", "candidates": None, "recall@20": 0.16,
         "ndcg@20": 0.13, "test_users": 10},
        {"users_from": "user table", "pipeline": "recall 100 → rank → top 20", "candidates": 100, "recall@20": 0.17,
         "ndcg@20": 0.14, "test_users": 10},
        {"users_from": "history", "pipeline": "recall 100 → rank → top 20", "candidates": 100, "recall@20": 0.168,
         "ndcg@20": 0.136, "test_users": 9},
    ]  # fmt: skip
    path.write_text(json.dumps({"format_version": 1, "ranker": {"quality": rows}}))
    return path


def test_pipeline_figures_are_the_rows_of_the_pipelines_candidates(tmp_path: Path) -> None:
    quality = _quality_with_pipeline_rows(tmp_path / "quality.json")
    found = recall_check.pipeline_figures(quality, 100, ["user_id", "history"])
    assert (found["user_id"]["recall@20"], found["history"]["recall@20"]) == (0.17, 0.168)
    assert found["history"]["variant"] == "recall 100 → rank → top 20 (history)"
    with pytest.raises(recall_check.CannotCompare, match="no offline pipeline figure with users from 'user table' and 500"):
        recall_check.pipeline_figures(quality, 500, ["user_id"])
    (tmp_path / "none.json").write_text(json.dumps({"check": {}}))
    with pytest.raises(recall_check.CannotCompare, match="holds no pipeline figures"):
        recall_check.pipeline_figures(tmp_path / "none.json", 100, ["user_id"])


def test_the_rankers_user_side_follows_the_rules() -> None:
    rules = recall_check.parse_user_fields(["user=user_id", "activity=activity"])
    assert recall_check.user_side(rules, 7, list(range(49))) == {"fields": {"user": 7, "activity": 5}}
    # By history the user is unknown (-1); the activity bucket is capped at 15.
    assert recall_check.user_side(rules, None, list(range(70000))) == {"fields": {"user": -1, "activity": 15}}
    assert recall_check.user_side({}, 3, [1]) == {"fields": {}}
    with pytest.raises(SystemExit, match="--user-field 'age=42': expected NAME=user_id or NAME=activity"):
        recall_check.parse_user_fields(["age=42"])


def test_pipeline_flags_need_pipeline(capsys) -> None:
    with pytest.raises(SystemExit):
        recall_check.main(["--send-history"])
    assert "--send-history and --user-field go with --pipeline" in capsys.readouterr().err
