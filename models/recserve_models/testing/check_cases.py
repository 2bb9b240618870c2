"""Broken (and a few valid) model repositories that `recserve check-repository` and the server's loader must judge
as the format document says.

`write(out)` writes one small repository per case under `out/<case>/` and `out/cases.json`:
`[{"name", "kind", "intended", "blame"}]`. `intended` is what the format document says (`"load"` or `"refuse"`),
and `blame` is a file or directory name that the refusal must mention. The `fixture` command writes them to
`DIR/check-cases/`; `tests/check_parity.rs` runs `recserve check-repository` and the server's start-up load over
the same directories and requires both to decide as intended, and the toolchain's `check` (which asks
`check-repository`) is held to the same decisions in `models/tests/test_check.py`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper
from safetensors.numpy import save

from .. import deepfm, files
from ..model_toml import DeepFMToml, DenseGraphSpec, FieldSpec, LightGCNToml, RankingSpec, RecallSpec, TableSpec
from ..onnx_export import IR_VERSION, OPSET, build_graph
from ..onnx_export import save as save_onnx
from ..repository import MODEL_TOML, write_deepfm_version, write_lightgcn_version

MODEL = "m"
TABLES = "tables.safetensors"
GRAPH = "dense.onnx"


def _deepfm_toml(dense: tuple[str, ...] = ("x",)) -> DeepFMToml:
    return DeepFMToml(
        tables=(
            TableSpec("u", TABLES, 5, 3, "fp32", "default", 0),
            TableSpec("i", TABLES, 4, 3, "int8", "reject"),
        ),
        fields=(FieldSpec("u", "user"), FieldSpec("i", "item")),
        dense_graph=DenseGraphSpec(GRAPH, "fp32"),
        ranking=RankingSpec(dense, "i"),
        description="check parity case",
    )


def _deepfm_values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {"u": rng.normal(0, 0.3, (5, 3)).astype(np.float32), "i": rng.normal(0, 0.3, (4, 3)).astype(np.float32)}


def _exported_graph(fields: int = 2, dim: int = 3, dense: int = 1) -> onnx.ModelProto:
    rng = np.random.default_rng(4)
    rows = {f"t{j}": 4 for j in range(fields)}
    params = deepfm.init_params(rng, rows, list(rows), factors=dim - 1, num_dense=dense, hidden=[4])
    return build_graph(params)


def _tiny_graph(
    *,
    inputs: tuple[tuple[str, int, list[object]], ...] = (
        ("embeddings", TensorProto.FLOAT, ["batch", 2, 3]),
        ("dense", TensorProto.FLOAT, ["batch", 1]),
    ),
    outputs: tuple[tuple[str, list[object]], ...] = (("probability", ["batch", 1]),),
    half_batch: bool = False,
) -> onnx.ModelProto:
    """A small valid graph with chosen input/output names, types and shapes: the sum of every input value per
    row, through a sigmoid, into each output (for only the first half of the rows with `half_batch`)."""
    nodes, terms = [], []
    for name, elem, _ in inputs:
        source = name
        if elem != TensorProto.FLOAT:
            source = f"{name}.float"
            nodes.append(helper.make_node("Cast", [name], [source], to=TensorProto.FLOAT))
        flat = f"{name}.flat"
        nodes.append(helper.make_node("Flatten", [source], [flat], axis=1))
        total = f"{name}.sum"
        nodes.append(helper.make_node("ReduceSum", [flat, "axes"], [total], keepdims=1))
        terms.append(total)
    logit = terms[0]
    for i, term in enumerate(terms[1:]):
        nodes.append(helper.make_node("Add", [logit, term], [f"logit.{i}"]))
        logit = f"logit.{i}"
    if half_batch:  # keep the first half of the rows: a shape that onnxruntime cannot know before running
        nodes.append(helper.make_node("Shape", [logit], ["logit.shape"], end=1))
        nodes.append(helper.make_node("Div", ["logit.shape", "two"], ["logit.half"]))
        nodes.append(helper.make_node("Slice", [logit, "zero", "logit.half", "axes0"], ["logit.kept"]))
        logit = "logit.kept"
    nodes.append(helper.make_node("Sigmoid", [logit], ["p"]))
    for name, shape in outputs:
        wide = len(shape) == 2 and shape[1] == 2
        if len(shape) == 1:
            nodes.append(helper.make_node("Flatten", ["p"], [f"{name}.2d"], axis=1))
            nodes.append(helper.make_node("ReduceSum", [f"{name}.2d", "axes"], [name], keepdims=0))
        elif wide:
            nodes.append(helper.make_node("Concat", ["p", "p"], [name], axis=1))
        else:
            nodes.append(helper.make_node("Identity", ["p"], [name]))
    graph = helper.make_graph(
        nodes,
        "case",
        [helper.make_tensor_value_info(n, e, s) for n, e, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [
            helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
            helper.make_tensor("axes0", TensorProto.INT64, [1], [0]),
            helper.make_tensor("zero", TensorProto.INT64, [1], [0]),
            helper.make_tensor("two", TensorProto.INT64, [1], [2]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


def _write_deepfm(version: Path) -> None:
    write_deepfm_version(version, _deepfm_toml(), _deepfm_values(), _exported_graph())


def _write_lightgcn(version: Path, item_rows: int = 5, user_dim: int = 4, history_rows: int = 5) -> None:
    rng = np.random.default_rng(5)
    model = LightGCNToml(
        tables=(
            TableSpec("user", TABLES, 3, user_dim, "fp32", "reject"),
            TableSpec("item", TABLES, item_rows, 4, "int8", "reject"),
            TableSpec("history", TABLES, history_rows, 4, "fp16", "reject"),
        ),
        recall=RecallSpec("user", "item", "history"),
    )
    tables = {
        "user": rng.normal(0, 1, (3, user_dim)).astype(np.float32),
        "item": rng.normal(0, 1, (item_rows, 4)).astype(np.float32),
        "history": rng.normal(0, 1, (history_rows, 4)).astype(np.float32),
    }
    write_lightgcn_version(version, model, tables)


def _edit(version: Path, old: str, new: str) -> None:
    path = version / MODEL_TOML
    text = path.read_text(encoding="utf-8")
    if old not in text:
        raise AssertionError(f"case set-up: {old!r} is not in {path}")
    files.write_text(path, text.replace(old, new, 1), encoding="utf-8")


def _tensors(version: Path, tensors: dict[str, np.ndarray]) -> None:
    files.write_bytes(version / TABLES, save(tensors))


def _graph(model: onnx.ModelProto) -> Callable[[Path], None]:
    return lambda version: save_onnx(model, version / GRAPH)


def _graph_inputs(
    embeddings: list[object],
    dense: list[object] | None = None,
    *,
    element: int = TensorProto.FLOAT,
    extra: tuple[tuple[str, int, list[object]], ...] = (),
) -> Callable[[Path], None]:
    """Writes a `_tiny_graph` whose `embeddings` input has the shape `embeddings` and element type `element`, whose
    `dense` input has the shape `dense` (default `[batch, 1]`), followed by the `extra` inputs."""
    inputs = (("embeddings", element, embeddings), ("dense", TensorProto.FLOAT, dense or ["batch", 1]), *extra)
    return _graph(_tiny_graph(inputs=inputs))


@dataclass(frozen=True)
class Case:
    name: str
    kind: str
    intended: str  # "load" or "refuse"
    blame: str
    mutate: Callable[[Path], None]  # applied to the version directory of a valid model
    layout: Callable[[Path], None] | None = None  # applied to the repository root instead


def _cases() -> list[Case]:
    values = _deepfm_values()
    u8 = np.zeros((4, 3 + 8), dtype=np.uint8)
    deepfm_cases = [
        Case("ok-deepfm", "deepfm", "load", "", lambda v: None),
        Case("toml-syntax", "deepfm", "refuse", MODEL_TOML, lambda v: _edit(v, "[dense_graph]", "[dense_graph")),
        Case(
            "toml-unknown-key",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'kind = "deepfm"', 'kind = "deepfm"\ncolour = 1'),
        ),
        Case(
            "toml-format-version",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, "format_version = 1", "format_version = 2"),
        ),
        Case(
            "toml-kind-unknown",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'kind = "deepfm"', 'kind = "xgboost"'),
        ),
        Case("toml-rows-zero", "deepfm", "refuse", MODEL_TOML, lambda v: _edit(v, "rows = 5", "rows = 0")),
        Case(
            "toml-default-row-outside",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, "default_row = 0", "default_row = 5"),
        ),
        Case(
            "toml-default-row-with-reject",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'oov = "reject"', 'oov = "reject"\ndefault_row = 1'),
        ),
        Case(
            "toml-empty-field-name",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'name = "u"\nside', 'name = ""\ntable = "u"\nside'),
        ),
        Case(
            "toml-field-unknown-table",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'name = "u"\nside = "user"', 'name = "u"\nside = "user"\ntable = "nope"'),
        ),
        Case(
            "toml-dims-differ",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, "rows = 4\ndim = 3", "rows = 4\ndim = 4"),
        ),
        Case(
            "toml-item-id-user-side",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'item_id_field = "i"', 'item_id_field = "u"'),
        ),
        Case(
            "toml-item-id-unknown",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'item_id_field = "i"', 'item_id_field = "z"'),
        ),
        Case(
            "toml-dense-duplicate",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'dense_features = ["x"]', 'dense_features = ["x", "x"]'),
        ),
        Case(
            "toml-file-parent",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, f'file = "{TABLES}"', f'file = "../{TABLES}"'),
        ),
        Case(
            "toml-file-absolute",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, f'file = "{TABLES}"', f'file = "/tmp/{TABLES}"'),
        ),
        Case(
            "toml-storage-unknown",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'storage = "fp32"', 'storage = "int4"'),
        ),
        Case(
            "toml-recall-in-deepfm",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, "[dense_graph]", '[recall]\nuser_table = "u"\nitem_table = "i"\n\n[dense_graph]'),
        ),
        Case(
            "toml-no-dense-graph",
            "deepfm",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, f'[dense_graph]\nfile = "{GRAPH}"\nprecision = "fp32"\n', ""),
        ),
        Case(
            "toml-file-dot-slash",
            "deepfm",
            "load",
            "",
            lambda v: _edit(v, f'file = "{TABLES}"', f'file = "./{TABLES}"'),
        ),
        Case("table-file-missing", "deepfm", "refuse", TABLES, lambda v: (v / TABLES).unlink()),
        Case(
            "table-tensor-missing", "deepfm", "refuse", TABLES, lambda v: _tensors(v, {"u": values["u"], "other": u8})
        ),
        Case(
            "table-tensor-dtype",
            "deepfm",
            "refuse",
            TABLES,
            lambda v: _tensors(v, {"u": values["u"].astype(np.float16), "i": u8}),
        ),
        Case(
            "table-tensor-shape",
            "deepfm",
            "refuse",
            TABLES,
            lambda v: _tensors(v, {"u": np.zeros((6, 3), np.float32), "i": u8}),
        ),
        Case(
            "table-int8-without-trailer",
            "deepfm",
            "refuse",
            TABLES,
            lambda v: _tensors(v, {"u": values["u"], "i": u8[:, :3].copy()}),
        ),
        Case(
            "table-file-truncated",
            "deepfm",
            "refuse",
            TABLES,
            lambda v: (v / TABLES).write_bytes((v / TABLES).read_bytes()[:40]),
        ),
        Case(
            "table-extra-tensor", "deepfm", "load", "", lambda v: _tensors(v, {"u": values["u"], "i": u8, "unused": u8})
        ),
        Case("graph-missing", "deepfm", "refuse", GRAPH, lambda v: (v / GRAPH).unlink()),
        Case("graph-garbage", "deepfm", "refuse", GRAPH, lambda v: (v / GRAPH).write_bytes(b"not an onnx model")),
        Case("graph-tiny-valid", "deepfm", "load", "", _graph(_tiny_graph())),
        Case("graph-output-rank-1", "deepfm", "load", "", _graph(_tiny_graph(outputs=(("probability", ["batch"]),)))),
        Case(
            "graph-extra-input",
            "deepfm",
            "refuse",
            GRAPH,
            _graph_inputs(["batch", 2, 3], extra=(("mask", TensorProto.FLOAT, ["batch", 1]),)),
        ),
        Case("graph-no-dense-input", "deepfm", "refuse", GRAPH, _graph(_exported_graph(dense=0))),
        Case("graph-dense-undeclared", "deepfm", "refuse", GRAPH, lambda v: _edit(v, 'dense_features = ["x"]\n', "")),
        Case("graph-fields-mismatch", "deepfm", "refuse", GRAPH, _graph(_exported_graph(fields=3))),
        Case("graph-dim-mismatch", "deepfm", "refuse", GRAPH, _graph(_exported_graph(dim=4))),
        Case("graph-fixed-batch", "deepfm", "refuse", GRAPH, _graph_inputs([8, 2, 3])),
        Case("graph-symbolic-fields", "deepfm", "load", "", _graph_inputs(["batch", "fields", "dim"], ["batch", "n"])),
        Case(
            "graph-double-input", "deepfm", "refuse", GRAPH, _graph_inputs(["batch", 2, 3], element=TensorProto.DOUBLE)
        ),
        Case("graph-input-rank", "deepfm", "refuse", GRAPH, _graph_inputs(["batch", 6])),
        Case("graph-output-name", "deepfm", "refuse", GRAPH, _graph(_tiny_graph(outputs=(("score", ["batch", 1]),)))),
        Case(
            "graph-two-outputs",
            "deepfm",
            "refuse",
            GRAPH,
            _graph(_tiny_graph(outputs=(("probability", ["batch", 1]), ("logit", ["batch", 1])))),
        ),
        Case(
            "graph-output-wide",
            "deepfm",
            "refuse",
            GRAPH,
            _graph(_tiny_graph(outputs=(("probability", ["batch", 2]),))),
        ),
        Case("graph-half-the-scores", "deepfm", "refuse", GRAPH, _graph(_tiny_graph(half_batch=True))),
    ]
    lightgcn_cases = [
        Case("ok-lightgcn", "lightgcn", "load", "", lambda v: None),
        Case("lightgcn-no-history", "lightgcn", "load", "", lambda v: _edit(v, 'history_table = "history"\n', "")),
        Case(
            "lightgcn-with-dense-graph",
            "lightgcn",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, "[recall]", f'[dense_graph]\nfile = "{GRAPH}"\nprecision = "fp32"\n\n[recall]'),
        ),
        Case(
            "lightgcn-no-recall",
            "lightgcn",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, '[recall]\nuser_table = "user"\nitem_table = "item"\nhistory_table = "history"\n', ""),
        ),
        Case(
            "lightgcn-unknown-table",
            "lightgcn",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'item_table = "item"', 'item_table = "items"'),
        ),
        Case(
            "lightgcn-history-rows",
            "lightgcn",
            "refuse",
            MODEL_TOML,
            lambda v: (shutil.rmtree(v), _write_lightgcn(v, history_rows=6)),
        ),
        Case(
            "lightgcn-dim-mismatch",
            "lightgcn",
            "refuse",
            MODEL_TOML,
            lambda v: (shutil.rmtree(v), _write_lightgcn(v, user_dim=5)),
        ),
        Case(
            "lightgcn-default-k",
            "lightgcn",
            "load",
            "",
            lambda v: _edit(v, 'history_table = "history"\n', 'history_table = "history"\ndefault_k = 5\n'),
        ),
        Case(
            "lightgcn-default-k-zero",
            "lightgcn",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'history_table = "history"\n', 'history_table = "history"\ndefault_k = 0\n'),
        ),
        Case(
            "lightgcn-default-k-beyond-catalogue",
            "lightgcn",
            "refuse",
            MODEL_TOML,
            lambda v: _edit(v, 'history_table = "history"\n', 'history_table = "history"\ndefault_k = 6\n'),
        ),
        Case("lightgcn-tensor-shape", "lightgcn", "refuse", TABLES, lambda v: _edit(v, "rows = 3", "rows = 4")),
    ]

    def model_dir_named(name: str) -> Callable[[Path], None]:
        return lambda root: (root / MODEL).rename(root / name)

    layout_cases = [
        Case(
            "layout-ignored-entries",
            "deepfm",
            "load",
            "",
            lambda v: None,
            lambda root: (
                files.mkdir(root / MODEL / "tmp"),
                files.mkdir(root / MODEL / "01"),
                files.mkdir(root / MODEL / "0"),
                files.write_text(root / MODEL / "README", "not a version"),
                files.mkdir(root / ".hidden" / "x"),
                files.write_text(root / "notes.txt", "not a model"),
            ),
        ),
        Case(
            "layout-version-plus-sign",
            "deepfm",
            "refuse",
            MODEL,
            lambda v: None,
            lambda root: (root / MODEL / "1").rename(root / MODEL / "+1"),
        ),
        Case("layout-bad-model-name", "deepfm", "refuse", "bad name", lambda v: None, model_dir_named("bad name")),
        Case(
            "layout-no-version",
            "deepfm",
            "refuse",
            MODEL,
            lambda v: None,
            lambda root: (root / MODEL / "1").rename(root / MODEL / "latest"),
        ),
        Case("layout-empty", "deepfm", "refuse", "", lambda v: None, lambda root: shutil.rmtree(root / MODEL)),
        Case("layout-no-model-toml", "deepfm", "refuse", MODEL_TOML, lambda v: (v / MODEL_TOML).unlink()),
    ]
    return deepfm_cases + lightgcn_cases + layout_cases


def write(out: Path) -> list[dict[str, object]]:
    """Writes every case under `out` and `out/cases.json`."""
    files.mkdir(out, exist_ok=True)
    results = []
    for case in _cases():
        root = out / case.name
        version = root / MODEL / "1"
        (_write_lightgcn if case.kind == "lightgcn" else _write_deepfm)(version)
        case.mutate(version)
        if case.layout is not None:
            case.layout(root)
        results.append({"name": case.name, "kind": case.kind, "intended": case.intended, "blame": case.blame})
    files.write_text(out / "cases.json", json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return results
