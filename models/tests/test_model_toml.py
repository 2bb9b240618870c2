"""The strict model.toml reader: what it refuses, and how it says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from recserve_models import model_toml

VALID = """
format_version = 1
kind = "deepfm"

[ranking]
dense_features = ["I1"]
item_id_field = "C2"

[dense_graph]
file = "dense.onnx"
precision = "int8"

[[tables]]
name = "C1"
file = "tables.safetensors"
rows = 10
dim = 9
storage = "int8"

[[tables]]
name = "C2"
file = "tables.safetensors"
rows = 5
dim = 9
storage = "fp16"
oov = "reject"

[[fields]]
name = "C1"
side = "user"

[[fields]]
name = "C2"
side = "item"
"""


def read(tmp_path: Path, text: str) -> model_toml.DeepFMToml:
    path = tmp_path / "model.toml"
    path.write_text(text)
    return model_toml.read(path)


def test_defaults_are_filled_in(tmp_path: Path) -> None:
    model = read(tmp_path, VALID)
    assert model.table("C1").oov == "default" and model.table("C1").default_row == 0
    assert model.fields[0].table == "C1"
    assert model.dense_graph.embeddings_input == "embeddings" and model.dense_graph.output == "probability"
    assert model.description == ""
    assert model_toml.read(tmp_path / "model.toml") == read(tmp_path, model_toml.to_toml(model))


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('kind = "deepfm"', 'kind = "deepfm"\ncolour = 1', r"model\.toml: colour is not a known key"),
        ('storage = "int8"', 'storage = "int4"', r"tables\[0\]\.storage must be one of 'fp32', 'fp16', 'int8'"),
        ("rows = 10", "rows = 10\ndefault_row = 10", r"tables\[0\]\.default_row is 10, outside the table's ids 0 to 9"),
        ("rows = 10", 'rows = "10"', r"tables\[0\]\.rows must be an integer, not '10'"),
        ('file = "tables.safetensors"\nrows = 10', 'file = "../x"\nrows = 10', r"tables\[0\]\.file must be a path"),
        ('dim = 9\nstorage = "fp16"', 'dim = 8\nstorage = "fp16"', "all tables read by fields must have the same dim"),
        ('item_id_field = "C2"', 'item_id_field = "C1"', "ranking.item_id_field 'C1' is not a side = \"item\" field"),
        ('name = "C2"\nside', 'name = "C2"\ntable = "C9"\nside', r"fields\[1\] \('C2'\) reads table 'C9'"),
        ('name = "C2"\nside', 'name = "C1"\nside', "field name 'C1' is used more than once"),
        ('precision = "int8"\n', "", r"dense_graph\.precision is required"),
        ("format_version = 1", "format_version = 2", "format_version must be 1"),
    ],
)
def test_broken_files_are_refused_naming_the_key(tmp_path: Path, old: str, new: str, message: str) -> None:
    assert old in VALID
    with pytest.raises(model_toml.ModelTomlError, match=message):
        read(tmp_path, VALID.replace(old, new, 1))


def test_strings_are_escaped(tmp_path: Path) -> None:
    model = read(tmp_path, VALID)
    tricky = model_toml.DeepFMToml(model.tables, model.fields, model.dense_graph, model.ranking, 'a "q"\\ \n\t\x7f é')
    assert read(tmp_path, model_toml.to_toml(tricky)).description == tricky.description


ITEM_FEATURES = VALID + """
[[tables]]
name = "C3"
file = "tables.safetensors"
rows = 4
dim = 9
storage = "fp32"

[[fields]]
name = "C3"
side = "item"

[item_features]
file = "item_features.safetensors"
fields = ["C3"]
"""


def test_item_features_are_read_checked_and_written(tmp_path: Path) -> None:
    model = read(tmp_path, ITEM_FEATURES)
    assert model.item_features == model_toml.ItemFeaturesSpec("item_features.safetensors", ("C3",))
    assert read(tmp_path, model_toml.to_toml(model)) == model
    for old, new, message in [
        ('fields = ["C3"]', "fields = []", "does not list item-side field 'C3'"),
        ('fields = ["C3"]', 'fields = ["C3", "C3"]', "'C3' is listed twice"),
        ('fields = ["C3"]', 'fields = ["C1", "C3"]', "'C1' is a side = \"user\" field"),
        ('fields = ["C3"]', 'fields = ["C9", "C3"]', "'C9' is not a declared field"),
        ('file = "item_features.safetensors"', 'file = "/x"', "item_features.file must be a path"),
        ('fields = ["C3"]', 'fields = ["C3"]\ncolour = 1', "item_features.colour is not a known key"),
    ]:
        with pytest.raises(model_toml.ModelTomlError, match=message):
            read(tmp_path, ITEM_FEATURES.replace(old, new, 1))


CANDIDATE_FEATURES = ITEM_FEATURES.replace(
    'item_id_field = "C2"', 'item_id_field = "C2"\ncandidate_features = ["cooccurrence", "recall_score"]'
) + """
[cooccurrence]
file = "cooccurrence.safetensors"
"""


def test_candidate_features_and_the_cooccurrence_table_are_read_checked_and_written(tmp_path: Path) -> None:
    model = read(tmp_path, CANDIDATE_FEATURES)
    assert model.ranking.candidate_features == ("cooccurrence", "recall_score")  # declared order: the graph's
    assert model.ranking.dense_width == 3  # I1, then the two candidate features
    assert model.cooccurrence == model_toml.CooccurrenceSpec("cooccurrence.safetensors")
    assert read(tmp_path, model_toml.to_toml(model)) == model
    # Without them the file is written as before (no empty key, no section).
    plain = read(tmp_path, ITEM_FEATURES)
    assert "candidate_features" not in model_toml.to_toml(plain) and "[cooccurrence]" not in model_toml.to_toml(plain)
    only_score = CANDIDATE_FEATURES.replace('["cooccurrence", "recall_score"]', '["recall_rank"]').replace(
        '[cooccurrence]\nfile = "cooccurrence.safetensors"\n', ""
    )
    assert read(tmp_path, only_score).cooccurrence is None
    # Names a pipeline cannot compute are the model's own: rank clients send them (the server refuses a pipeline).
    own = CANDIDATE_FEATURES.replace('["cooccurrence", "recall_score"]', '["cooccurrence", "ctr_7d"]')
    assert read(tmp_path, own).ranking.candidate_features == ("cooccurrence", "ctr_7d")
    for old, new, message in [
        ('"cooccurrence", "recall_score"]', '"cooccurrence", ""]', "must hold non-empty names, not ''"),
        ('"cooccurrence", "recall_score"]', '"cooccurrence", 3]', "must hold non-empty names, not 3"),
        ('"cooccurrence", "recall_score"]', '"recall_score", "recall_score"]', "lists 'recall_score' twice"),
        ('"cooccurrence", "recall_score"]', '"recall_score"]', r"cooccurrence is only meaningful when"),
        (
            '[cooccurrence]\nfile = "cooccurrence.safetensors"\n',
            "",
            r'lists "cooccurrence", which needs a \[cooccurrence\]',
        ),
        ('file = "cooccurrence.safetensors"', 'file = "../c.safetensors"', "cooccurrence.file must be a path"),
        ('file = "cooccurrence.safetensors"', 'file = "c"\nrows = 3', "cooccurrence.rows is not a known key"),
        ('dense_features = ["I1"]', 'dense_features = ["recall_score"]', "'recall_score' is both a ranking.dense"),
    ]:
        assert old in CANDIDATE_FEATURES
        with pytest.raises(model_toml.ModelTomlError, match=message):
            read(tmp_path, CANDIDATE_FEATURES.replace(old, new, 1))
