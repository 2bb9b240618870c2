"""The split DeepFM graph (`split_graph`): its unsplit form against the numpy reference forward, and its user and
item parts against the unsplit form, run as the server runs them (the user part on one row per request, its state
repeated for the request's candidates, the item part on the whole batch)."""

from __future__ import annotations

import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import criteo_params, random_inputs

from recserve_models import check, deepfm, model_toml
from recserve_models.commands import main
from recserve_models.quantize import quantize_dense_graph
from recserve_models.split_graph import USER_STATE, build_split_graph, split, state_width

USER = list(range(13))  # C1..C13, as the synth presets


def session(model: onnx.ModelProto) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # as the server's executors
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def requests(rng: np.random.Generator, params: deepfm.DeepFMParams, counts: list[int]) -> tuple[np.ndarray, ...]:
    """Rows of len(counts) requests of `counts` candidates: user fields and dense features equal within a request."""
    emb, dense = random_inputs(rng, params, sum(counts))
    starts = np.cumsum([0, *counts[:-1]])
    for start, count in zip(starts, counts, strict=True):
        emb[start : start + count, USER] = emb[start, USER]
        dense[start : start + count] = dense[start]
    return emb, dense, starts


def split_scores(user: ort.InferenceSession, item: ort.InferenceSession, emb, dense, starts, counts) -> np.ndarray:
    state = user.run(None, {"embeddings": emb[starts], "dense": dense[starts]})[0]
    assert state.shape[0] == len(starts)
    return item.run(None, {"embeddings": emb, USER_STATE: np.repeat(state, counts, axis=0)})[0][:, 0]


def test_unsplit_form_equals_reference_forward(rng: np.random.Generator) -> None:
    params = criteo_params(rng)
    emb, dense = random_inputs(rng, params, 512)
    got = session(build_split_graph(params, USER)).run(None, {"embeddings": emb, "dense": dense})[0][:, 0]
    assert np.abs(got - deepfm.forward(params, emb, dense)).max() <= 1e-5


# Batches of requests as the batcher forms them: one request, a few, many small ones, one of one candidate.
SHAPES = [[100], [37, 1, 64], [5] * 40, [1], [250, 250, 3]]


def test_int8_parts_equal_the_unsplit_int8_graph_exactly(rng: np.random.Generator) -> None:
    params = criteo_params(rng)
    calibration, calibration_dense = random_inputs(rng, params, 400)
    graph = quantize_dense_graph(build_split_graph(params, USER), calibration, calibration_dense, progress=lambda _: None)
    user, item = (session(part) for part in split(graph))
    whole = session(graph)
    for counts in SHAPES:
        emb, dense, starts = requests(rng, params, counts)
        want = whole.run(None, {"embeddings": emb, "dense": dense})[0][:, 0]
        got = split_scores(user, item, emb, dense, starts, counts)
        # Bit for bit: the parts are the graph's own nodes, and INT8 QGemm accumulates integers.
        assert np.array_equal(got, want), f"{counts}: max abs difference {np.abs(got - want).max()}"
        assert np.abs(want - deepfm.forward(params, emb, dense)).max() <= 0.05  # INT8 against the float reference


def test_fp32_parts_match_the_unsplit_fp32_graph_within_float_rounding(rng: np.random.Generator) -> None:
    """Not bit for bit: ONNX Runtime's fp32 Gemm rounds a row differently with the number of rows it runs with (the
    unsplit graph itself gives a row other bits at another batch size), so the user part's first-layer product
    computed on one row per request can differ from the one computed on every row in the last bits."""
    params = criteo_params(rng)
    graph = build_split_graph(params, USER)
    user, item = (session(part) for part in split(graph))
    whole = session(graph)
    worst = 0.0
    for counts in SHAPES:
        emb, dense, starts = requests(rng, params, counts)
        want = whole.run(None, {"embeddings": emb, "dense": dense})[0][:, 0]
        got = split_scores(user, item, emb, dense, starts, counts)
        worst = max(worst, float(np.abs(got - want).max()))
    assert worst <= 1e-6, worst


def test_the_parts_have_the_documented_interface(rng: np.random.Generator) -> None:
    params = criteo_params(rng)
    user, item = split(build_split_graph(params, USER))

    def names(values):
        return [(v.name, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values]

    width = state_width(params)
    assert width == 32 + 2 * 8 + 1
    assert names(user.graph.input) == [("embeddings", ["batch", 26, 9]), ("dense", ["batch", 13])]
    assert names(user.graph.output) == [(USER_STATE, ["batch", width])]
    assert names(item.graph.input) == [("embeddings", ["batch", 26, 9]), (USER_STATE, ["batch", width])]
    assert names(item.graph.output) == [("probability", ["batch", 1])]


@pytest.mark.parametrize(
    ("user", "problem"),
    [([], "at least one user-side field"), (list(range(26)), "at least one item-side field"), ([0, 0], "distinct")],
)
def test_split_needs_both_sides(rng: np.random.Generator, user: list[int], problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        build_split_graph(criteo_params(rng), user)


def test_split_section_round_trips_through_model_toml(tmp_path, rng: np.random.Generator) -> None:
    from recserve_models.synth import PRESETS, model_of

    model = model_of(PRESETS["realistic"], PRESETS["realistic"].rows, "int8", split=True)
    path = tmp_path / "model.toml"
    path.write_text(model_toml.to_toml(model), encoding="utf-8")
    assert model_toml.read(path) == model
    path.write_text(model_toml.to_toml(model).replace('item_file = "item.onnx"', 'item_file = "../x"'))
    with pytest.raises(model_toml.ModelTomlError, match="dense_graph.split.item_file"):
        model_toml.read(path)


@pytest.fixture(scope="module")
def split_repo(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("split")
    main(["synth", "--preset", "realistic", "--out", str(out), "--max-rows", "2000", "--requests", "2", "--cases", "1", "--split"])
    return out


def _copy_version(split_repo, tmp_path, name: str):
    root = tmp_path / "repo"
    shutil.copytree(split_repo / name, root / name)
    return root, root / name / "1"


def test_check_opens_and_compares_the_split_parts_of_synth_s_versions(split_repo) -> None:
    validation = check.validate(split_repo)
    assert not validation.errors, validation.errors
    assert {"realistic-int8-split", "realistic-fp32-split"} <= {m.name for m in validation.models}


def test_check_refuses_split_parts_that_do_not_compute_the_graph(split_repo, tmp_path) -> None:
    # The INT8 model's user part has the fp32 model's interface but a quantized state: scores move by ~1e-3.
    root, version = _copy_version(split_repo, tmp_path, "realistic-fp32-split")
    shutil.copy(split_repo / "realistic-int8-split" / "1" / "user.onnx", version / "user.onnx")
    errors = check.validate(root).errors
    assert len(errors) == 1 and "do not compute the graph dense.onnx" in errors[0], errors
    assert "item.onnx" in errors[0]


@pytest.mark.parametrize(
    ("source", "target", "message"),
    [
        ("item.onnx", "user.onnx", 'the user graph\'s inputs are ["embeddings", "user_state"]'),
        ("user.onnx", "item.onnx", 'the item graph\'s inputs are ["embeddings", "dense"]'),
        (None, "item.onnx", "item.onnx: dense graph file does not exist"),
    ],
)
def test_check_refuses_split_parts_with_the_wrong_interface(split_repo, tmp_path, source, target, message) -> None:
    root, version = _copy_version(split_repo, tmp_path, "realistic-int8-split")
    if source is None:
        (version / target).unlink()
    else:
        shutil.copy(version / source, version / target)
    errors = check.validate(root).errors
    assert len(errors) == 1 and message in errors[0] and target in errors[0], errors
