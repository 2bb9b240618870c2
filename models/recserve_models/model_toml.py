"""`model.toml`: its contents as dataclasses, the writer, and a strict reader (docs/model-repository.md).

The reader applies the document's rules, the same as the server's `src/repository/spec.rs`, for both kinds
(`deepfm` and `lightgcn`): every key known and of the right type, required keys present, defaults filled in,
names non-empty and unique, references resolved. Errors name the file and the key. The parity of these rules with
the server's is tested on a shared set of broken repositories (`testing/check_cases.py`, `tests/check_parity.rs`).
The writer omits keys that hold their default, except a table's `oov` (and `default_row` under
`oov = "default"`), which are always written because they are the policy a reader of the file wants to see.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

FORMAT_VERSION = 1
STORAGES = ("fp32", "fp16", "int8")
OOV_POLICIES = ("default", "reject")
TIERS = ("file", "redis")
UNFETCHED_POLICIES = ("default_row", "unavailable")
SIDES = ("user", "item")
PRECISIONS = ("fp32", "int8")
# The per-candidate features a recall → rank pipeline computes for a ranking model (docs/model-repository.md):
# the recall score, the 0-based recall position, and the co-occurrence sum of `[cooccurrence]`. A model may
# declare other names, which only rank clients send (the server refuses a pipeline over it).
RECALL_SCORE, RECALL_RANK, COOCCURRENCE = "recall_score", "recall_rank", "cooccurrence"
CANDIDATE_FEATURES = (RECALL_SCORE, RECALL_RANK, COOCCURRENCE)
# The server's `k` for a recall request without one when `[recall] default_k` is absent (src/repository/spec.rs).
DEFAULT_K = 100


class ModelTomlError(ValueError):
    """A model.toml that breaks the format; the message names the file and the key."""


def id_range(rows: int) -> str:
    """The ids of a table of `rows` rows as every message says them: `ids 0 to 1879`, never `0..1880`, which reads
    as if 1880 were one of them."""
    return f"ids 0 to {rows - 1}"


@dataclass(frozen=True)
class TableSpec:
    """One `[[tables]]` entry."""

    name: str
    file: str
    rows: int
    dim: int
    storage: str
    oov: str = "default"
    default_row: int = 0
    tier: str = "file"
    unfetched: str = ""


@dataclass(frozen=True)
class FieldSpec:
    """One `[[fields]]` entry; `table` is the field's name unless given."""

    name: str
    side: str
    table: str = ""

    def __post_init__(self) -> None:
        if not self.table:
            object.__setattr__(self, "table", self.name)


@dataclass(frozen=True)
class SplitSpec:
    """The `[dense_graph.split]` table: the graph `file` cut at `state` into a user graph (run once per request)
    and an item graph (run per candidate), as `split_graph.split` writes them."""

    user_file: str
    item_file: str
    state: str = "user_state"


@dataclass(frozen=True)
class DenseGraphSpec:
    """The `[dense_graph]` table."""

    file: str
    precision: str
    embeddings_input: str = "embeddings"
    dense_input: str = "dense"
    output: str = "probability"
    split: SplitSpec | None = None


@dataclass(frozen=True)
class RankingSpec:
    """The `[ranking]` table. The graph's dense input is `dense_features` (per request) followed by
    `candidate_features` (per candidate, computed by a pipeline), in declared order."""

    dense_features: tuple[str, ...] = ()
    item_id_field: str | None = None
    candidate_features: tuple[str, ...] = ()

    @property
    def dense_width(self) -> int:
        """N, the width of the graph's dense input."""
        return len(self.dense_features) + len(self.candidate_features)


@dataclass(frozen=True)
class CooccurrenceSpec:
    """The `[cooccurrence]` table: the CSR item co-occurrence table in `file` (tensors `indptr`, `indices`,
    `weights`: `cooccurrence.read`), required exactly when `candidate_features` lists "cooccurrence"."""

    file: str


@dataclass(frozen=True)
class ItemFeaturesSpec:
    """The `[item_features]` table: the I64 tensor `tensor` [items, len(fields)] in `file`, one column per item-side
    field (the `item_id_field` may be left out: it then takes the item's id)."""

    file: str
    fields: tuple[str, ...]
    tensor: str = "item_features"


@dataclass(frozen=True)
class DeepFMToml:
    """A whole DeepFM `model.toml`; `fields` is in the order of the graph's F axis."""

    tables: tuple[TableSpec, ...]
    fields: tuple[FieldSpec, ...]
    dense_graph: DenseGraphSpec
    ranking: RankingSpec = field(default_factory=RankingSpec)
    description: str = ""
    item_features: ItemFeaturesSpec | None = None
    cooccurrence: CooccurrenceSpec | None = None

    def table(self, name: str) -> TableSpec:
        """The table called `name`."""
        return _find_table(self.tables, name)

    def fields_on(self, side: str) -> tuple[FieldSpec, ...]:
        """The fields of one side, in graph order."""
        return tuple(f for f in self.fields if f.side == side)


def _string(value: str) -> str:
    # A JSON string without non-ASCII escapes is a valid TOML basic string, except for DEL, which TOML
    # wants escaped as well.
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def _value(value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int, tuple)):
        raise TypeError(f"model.toml holds no values of type {type(value).__name__}")
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    return "[" + ", ".join(_value(item) for item in value) + "]"


@dataclass(frozen=True)
class IndexSpec:
    """`[recall.index]`: the version's IVF index file and how queries search it by default."""

    file: str
    nprobe: int
    # The most candidates a query re-ranks; None: the server's default (src/repository/spec.rs).
    max_candidates: int | None = None
    # How the file codes its items: "int8" or "pq4" (the file must say the same).
    codes: str = "int8"


@dataclass(frozen=True)
class RecallSpec:
    """The `[recall]` table of a LightGCN (two-tower) model."""

    user_table: str
    item_table: str
    history_table: str | None = None
    # The int64 [items] tensor in the item table's file counting each item's training interactions: the popularity
    # order a history without signal falls back on (docs/model-repository.md).
    popularity: str | None = None
    # Items per query of a request that gives no `k` (1 to the catalogue); None: DEFAULT_K, or the whole catalogue
    # when it is smaller.
    default_k: int | None = None
    index: IndexSpec | None = None


@dataclass(frozen=True)
class LightGCNToml:
    """A whole LightGCN `model.toml`."""

    tables: tuple[TableSpec, ...]
    recall: RecallSpec
    description: str = ""

    def table(self, name: str) -> TableSpec:
        """The table called `name`."""
        return _find_table(self.tables, name)


def _find_table(tables: tuple[TableSpec, ...], name: str) -> TableSpec:
    for table in tables:
        if table.name == name:
            return table
    raise KeyError(f"no table named {name!r}")


ModelToml = DeepFMToml | LightGCNToml


def _section(header: str, pairs: list[tuple[str, object]]) -> str:
    lines = [header] if header else []
    lines += [f"{key} = {_value(value)}" for key, value in pairs]
    return "\n".join(lines) + "\n"


def _table_section(t: TableSpec) -> str:
    keys = ("name", "file", "rows", "dim", "storage", "oov") + (("default_row",) if t.oov == "default" else ())
    keys += (("tier",) if t.tier != "file" else ()) + (("unfetched",) if t.unfetched else ())
    return _section("[[tables]]", [(key, getattr(t, key)) for key in keys])


def to_toml(model: ModelToml) -> str:
    """The text of `model.toml` for `model`."""
    kind = "lightgcn" if isinstance(model, LightGCNToml) else "deepfm"
    top: list[tuple[str, object]] = [("format_version", FORMAT_VERSION), ("kind", kind)]
    if model.description:
        top.append(("description", model.description))
    sections = [_section("", top)]
    if isinstance(model, LightGCNToml):
        recall: list[tuple[str, object]] = [
            ("user_table", model.recall.user_table),
            ("item_table", model.recall.item_table),
        ]
        if model.recall.history_table is not None:
            recall.append(("history_table", model.recall.history_table))
        if model.recall.popularity is not None:
            recall.append(("popularity", model.recall.popularity))
        if model.recall.default_k is not None:
            recall.append(("default_k", model.recall.default_k))
        sections.append(_section("[recall]", recall))
        index = model.recall.index
        if index is not None:
            pairs: list[tuple[str, object]] = [("file", index.file), ("nprobe", index.nprobe)]
            if index.max_candidates is not None:
                pairs.append(("max_candidates", index.max_candidates))
            if index.codes != "int8":
                pairs.append(("codes", index.codes))
            sections.append(_section("[recall.index]", pairs))
        sections += [_table_section(t) for t in model.tables]
        return "\n".join(sections)

    ranking: list[tuple[str, object]] = []
    if model.ranking.dense_features:
        ranking.append(("dense_features", model.ranking.dense_features))
    if model.ranking.item_id_field is not None:
        ranking.append(("item_id_field", model.ranking.item_id_field))
    if model.ranking.candidate_features:
        ranking.append(("candidate_features", model.ranking.candidate_features))
    if ranking:
        sections.append(_section("[ranking]", ranking))

    graph = model.dense_graph
    defaults = DenseGraphSpec(file=graph.file, precision=graph.precision)
    keys = ("file", "precision", "embeddings_input", "dense_input", "output")
    changed = [key for key in keys if key in ("file", "precision") or getattr(graph, key) != getattr(defaults, key)]
    sections.append(_section("[dense_graph]", [(key, getattr(graph, key)) for key in changed]))
    if graph.split is not None:
        pairs_s: list[tuple[str, object]] = [("user_file", graph.split.user_file), ("item_file", graph.split.item_file)]
        if graph.split.state != "user_state":
            pairs_s.append(("state", graph.split.state))
        sections.append(_section("[dense_graph.split]", pairs_s))
    features = model.item_features
    if features is not None:
        pairs_f: list[tuple[str, object]] = [("file", features.file), ("fields", features.fields)]
        if features.tensor != "item_features":
            pairs_f.append(("tensor", features.tensor))
        sections.append(_section("[item_features]", pairs_f))
    if model.cooccurrence is not None:
        sections.append(_section("[cooccurrence]", [("file", model.cooccurrence.file)]))
    sections += [_table_section(t) for t in model.tables]
    for f in model.fields:
        pairs: list[tuple[str, object]] = [("name", f.name), ("side", f.side)]
        if f.table != f.name:
            pairs.append(("table", f.table))
        sections.append(_section("[[fields]]", pairs))
    return "\n".join(sections)


_REQUIRED = object()


class _Reader:
    """Typed access to one TOML table; every error names the file and the key."""

    def __init__(self, path: Path, where: str, table: object) -> None:
        self.path, self.where = path, where
        if not isinstance(table, dict):
            self.fail("", "must be a table")
        self.table: dict[str, Any] = table

    def fail(self, key: str, problem: str) -> None:
        name = ".".join(part for part in (self.where, key) if part)
        raise ModelTomlError(f"{self.path}: {name} {problem}")

    def only(self, *keys: str) -> None:
        for key in self.table:
            if key not in keys:
                self.fail(key, f"is not a known key (known: {', '.join(keys)})")

    def get(self, key: str, kind: type, default: Any = _REQUIRED, choices: tuple[str, ...] = ()) -> Any:
        if key not in self.table:
            if default is _REQUIRED:
                self.fail(key, "is required")
            return default
        value = self.table[key]
        # TOML booleans are Python bools, which are ints too.
        if isinstance(value, bool) or not isinstance(value, kind):
            self.fail(key, f"must be {_KIND_NAMES[kind]}, not {value!r}")
        if choices and value not in choices:
            self.fail(key, f"must be one of {', '.join(map(repr, choices))}, not {value!r}")
        return value

    def relative_file(self, key: str) -> str:
        # The server's rule (Rust's `Path::components` all `Normal` or `CurDir`): not empty, not absolute, no `..`.
        value = self.get(key, str)
        if not value or value.startswith("/") or ".." in PurePosixPath(value).parts:
            self.fail(key, f"must be a path inside the version directory, not {value!r}")
        return value

    def name(self, key: str, default: Any = _REQUIRED) -> Any:
        value = self.get(key, str, default)
        if value == "":
            self.fail(key, "must not be empty")
        return value


_KIND_NAMES = {int: "an integer", str: "a string", list: "an array", dict: "a table"}


def read(path: Path) -> ModelToml:
    """Parse and validate the `model.toml` at `path` (either kind)."""
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        raise ModelTomlError(f"{path}: {e}") from e
    top = _Reader(path, "", doc)
    top.only(
        "format_version",
        "kind",
        "description",
        "tables",
        "fields",
        "ranking",
        "dense_graph",
        "recall",
        "item_features",
        "cooccurrence",
    )
    if top.get("format_version", int) != FORMAT_VERSION:
        top.fail("format_version", f"must be {FORMAT_VERSION}")
    kind = top.get("kind", str, choices=("deepfm", "lightgcn"))
    description = top.get("description", str, "")

    tables = []
    for i, raw in enumerate(top.get("tables", list, [])):
        t = _Reader(path, f"tables[{i}]", raw)
        t.only("name", "file", "rows", "dim", "storage", "oov", "default_row", "tier", "unfetched")
        spec = TableSpec(
            name=t.name("name"),
            file=t.relative_file("file"),
            rows=t.get("rows", int),
            dim=t.get("dim", int),
            storage=t.get("storage", str, choices=STORAGES),
            oov=t.get("oov", str, "default", OOV_POLICIES),
            default_row=t.get("default_row", int, 0),
            tier=t.get("tier", str, "file", TIERS),
            unfetched=t.get("unfetched", str, "", UNFETCHED_POLICIES),
        )
        for key in ("rows", "dim"):
            if getattr(spec, key) < 1:
                t.fail(key, "must be at least 1")
        if spec.oov == "reject" and "default_row" in raw:
            t.fail("default_row", 'is only meaningful with oov = "default"')
        if spec.unfetched and spec.tier != "redis":
            t.fail("unfetched", 'is only meaningful with tier = "redis"')
        if spec.unfetched == "default_row" and spec.oov != "default":
            t.fail("unfetched", '"default_row" needs oov = "default" (the row it reads is default_row)')
        if not 0 <= spec.default_row < spec.rows:
            t.fail("default_row", f"is {spec.default_row}, outside the table's {id_range(spec.rows)}")
        tables.append(spec)

    fields = []
    for i, raw in enumerate(top.get("fields", list, [])):
        f = _Reader(path, f"fields[{i}]", raw)
        f.only("name", "side", "table")
        name = f.name("name")
        fields.append(FieldSpec(name=name, side=f.get("side", str, choices=SIDES), table=f.name("table", name)))

    if kind == "lightgcn":
        for key in ("dense_graph", "ranking", "fields", "item_features", "cooccurrence"):
            if key in doc:
                top.fail(key, 'does not belong to kind = "lightgcn", which takes [recall] and [[tables]] only')
        r = _Reader(path, "recall", top.get("recall", dict))
        r.only("user_table", "item_table", "history_table", "popularity", "default_k", "index")
        popularity = r.get("popularity", str, None)
        if popularity == "":
            r.fail("popularity", "must name a tensor in the item table's file")
        index = None
        if "index" in r.table:
            ix = _Reader(path, "recall.index", r.get("index", dict))
            ix.only("file", "nprobe", "max_candidates", "codes")
            index = IndexSpec(
                ix.relative_file("file"),
                ix.get("nprobe", int),
                ix.get("max_candidates", int, None),
                ix.get("codes", str, "int8", choices=("int8", "pq4")),
            )
            for key in ("nprobe", "max_candidates"):
                value = getattr(index, key)
                if value is not None and value < 1:
                    ix.fail(key, "must be at least 1")
        model_l = LightGCNToml(
            tables=tuple(tables),
            recall=RecallSpec(
                r.get("user_table", str),
                r.get("item_table", str),
                r.get("history_table", str, None),
                popularity,
                r.get("default_k", int, None),
                index,
            ),
            description=description,
        )
        _check_names(path, model_l.tables, ())
        _check_recall(path, model_l)
        return model_l

    if "recall" in doc:
        top.fail("recall", 'belongs to kind = "lightgcn", not "deepfm"')
    r = _Reader(path, "ranking", top.get("ranking", dict, {}))
    r.only("dense_features", "item_id_field", "candidate_features")
    features = r.get("dense_features", list, [])
    if not all(isinstance(name, str) for name in features):
        r.fail("dense_features", "must be an array of strings")
    if "" in features:
        r.fail("dense_features", "must not hold an empty name")
    per_candidate = r.get("candidate_features", list, [])
    for name in per_candidate:
        if not isinstance(name, str) or name == "":
            r.fail("candidate_features", f"must hold non-empty names, not {name!r}")
    if len(set(per_candidate)) != len(per_candidate):
        twice = next(name for i, name in enumerate(per_candidate) if name in per_candidate[:i])
        r.fail("candidate_features", f"lists {twice!r} twice")
    ranking = RankingSpec(
        dense_features=tuple(features),
        item_id_field=r.get("item_id_field", str, None),
        candidate_features=tuple(per_candidate),
    )
    cooccurrence = None
    if "cooccurrence" in doc:
        c = _Reader(path, "cooccurrence", top.get("cooccurrence", dict))
        c.only("file")
        cooccurrence = CooccurrenceSpec(c.relative_file("file"))
    if (cooccurrence is not None) != (COOCCURRENCE in per_candidate):
        if cooccurrence is None:
            r.fail("candidate_features", 'lists "cooccurrence", which needs a [cooccurrence] table naming its file')
        top.fail("cooccurrence", 'is only meaningful when ranking.candidate_features lists "cooccurrence"')

    g = _Reader(path, "dense_graph", top.get("dense_graph", dict))
    g.only("file", "precision", "embeddings_input", "dense_input", "output", "split")
    split = None
    if "split" in g.table:
        sp = _Reader(path, "dense_graph.split", g.get("split", dict))
        sp.only("user_file", "item_file", "state")
        split = SplitSpec(sp.relative_file("user_file"), sp.relative_file("item_file"), sp.get("state", str, "user_state"))
    graph = DenseGraphSpec(
        file=g.relative_file("file"),
        precision=g.get("precision", str, choices=PRECISIONS),
        embeddings_input=g.get("embeddings_input", str, "embeddings"),
        dense_input=g.get("dense_input", str, "dense"),
        output=g.get("output", str, "probability"),
        split=split,
    )

    item_features = None
    if "item_features" in doc:
        f = _Reader(path, "item_features", top.get("item_features", dict))
        f.only("file", "tensor", "fields")
        columns = f.get("fields", list)
        if not all(isinstance(name, str) for name in columns):
            f.fail("fields", "must be an array of strings")
        item_features = ItemFeaturesSpec(f.relative_file("file"), tuple(columns), f.name("tensor", "item_features"))
    model = DeepFMToml(
        tables=tuple(tables),
        fields=tuple(fields),
        dense_graph=graph,
        ranking=ranking,
        description=description,
        item_features=item_features,
        cooccurrence=cooccurrence,
    )
    _check_references(path, model)
    return model


def _check_names(path: Path, tables: tuple[TableSpec, ...], fields: tuple[FieldSpec, ...]) -> None:
    for what, names in (("table", [t.name for t in tables]), ("field", [f.name for f in fields])):
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ModelTomlError(f"{path}: {what} name {duplicates[0]!r} is used more than once")


def _check_recall(path: Path, model: LightGCNToml) -> None:
    tables = {t.name: t for t in model.tables}
    recall = model.recall
    for key in ("user_table", "item_table", "history_table"):
        name = getattr(recall, key)
        if name is not None and name not in tables:
            raise ModelTomlError(f"{path}: recall.{key} {name!r} is not a declared [[tables]] entry")
    item = tables[recall.item_table]
    for key in ("user_table", "history_table"):
        name = getattr(recall, key)
        if name is not None and tables[name].dim != item.dim:
            raise ModelTomlError(
                f"{path}: recall.{key} {name!r} has dim {tables[name].dim}, but item_table {item.name!r} has dim "
                f"{item.dim}"
            )
    if recall.default_k is not None and not 1 <= recall.default_k <= item.rows:
        raise ModelTomlError(
            f"{path}: recall.default_k = {recall.default_k} must be from 1 to the {item.rows} items of item_table "
            f"{item.name!r}"
        )
    if recall.history_table is not None and tables[recall.history_table].rows != item.rows:
        raise ModelTomlError(
            f"{path}: recall.history_table {recall.history_table!r} has {tables[recall.history_table].rows} rows, "
            f"but item_table {item.name!r} has {item.rows}: one history vector per item"
        )


def _check_references(path: Path, model: DeepFMToml) -> None:
    def fail(problem: str) -> None:
        raise ModelTomlError(f"{path}: {problem}")

    _check_names(path, model.tables, model.fields)
    features = list(model.ranking.dense_features)
    duplicates = sorted({n for n in features if features.count(n) > 1})
    if duplicates:
        fail(f"dense feature name {duplicates[0]!r} is used more than once")
    both = [name for name in model.ranking.candidate_features if name in features]
    if both:
        fail(f"{both[0]!r} is both a ranking.dense_features and a ranking.candidate_features name")
    if not model.fields:
        fail("a deepfm model needs at least one [[fields]] entry")
    tables = {t.name: t for t in model.tables}
    for i, f in enumerate(model.fields):
        if f.table not in tables:
            fail(f"fields[{i}] ({f.name!r}) reads table {f.table!r}, which no [[tables]] entry defines")
    first = model.fields[0]
    for f in model.fields:
        if tables[f.table].dim != tables[first.table].dim:
            fail(
                f"field {f.name!r} reads rows of dim {tables[f.table].dim} but field {first.name!r} reads dim "
                f"{tables[first.table].dim}: all tables read by fields must have the same dim"
            )
    item_id = model.ranking.item_id_field
    if item_id is not None and item_id not in {f.name for f in model.fields_on("item")}:
        fail(f'ranking.item_id_field {item_id!r} is not a side = "item" field')
    features = model.item_features
    if features is not None:
        sides = {f.name: f.side for f in model.fields}
        for i, name in enumerate(features.fields):
            if name not in sides:
                fail(f"item_features.fields: {name!r} is not a declared field")
            if sides[name] != "item":
                fail(f'item_features.fields: {name!r} is a side = "user" field; the table holds item-side fields only')
            if name in features.fields[:i]:
                fail(f"item_features.fields: {name!r} is listed twice")
        for f in model.fields_on("item"):
            if f.name != item_id and f.name not in features.fields:
                fail(
                    f"item_features.fields does not list item-side field {f.name!r}: recalled items need a value for "
                    "every item-side field (only ranking.item_id_field may be left out, it then takes the item id)"
                )


def read_deepfm(path: Path) -> DeepFMToml:
    """`read`, for callers that need a DeepFM model."""
    model = read(path)
    if not isinstance(model, DeepFMToml):
        raise ModelTomlError(f"{path}: kind is 'lightgcn', a deepfm model is needed here")
    return model


def read_lightgcn(path: Path) -> LightGCNToml:
    """`read`, for callers that need a LightGCN model."""
    model = read(path)
    if not isinstance(model, LightGCNToml):
        raise ModelTomlError(f"{path}: kind is 'deepfm', a lightgcn model is needed here")
    return model
