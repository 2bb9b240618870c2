"""Criteo data: the generator is reproducible and writes the real format; the reader and vocabulary read it
back exactly and refuse broken files naming the line."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from recserve_models import criteo
from recserve_models.metrics import auc, log_loss

SMALL = criteo.GeneratorConfig(seed=7, vocab_scale=0.01, max_vocab=5000)


def test_the_generator_is_reproducible_and_writes_the_criteo_format(tmp_path: Path) -> None:
    generator = criteo.Generator(SMALL)
    first = criteo.format_chunk(generator.chunk("train", 0, 300))
    assert first == criteo.format_chunk(criteo.Generator(SMALL).chunk("train", 0, 300))
    assert first != criteo.format_chunk(generator.chunk("test", 0, 300))
    lines = first.splitlines()
    assert len(lines) == 300
    for line in lines:
        columns = line.split("\t")
        assert len(columns) == 40 and columns[0] in ("0", "1")
        assert all(c == "" or c.lstrip("-").isdigit() for c in columns[1:14])
        assert all(c == "" or (len(c) == 8 and int(c, 16) >= 0) for c in columns[14:])
    missing = np.array([[c == "" for c in line.split("\t")[14:]] for line in lines]).mean(axis=0)
    assert missing[19] > 0.3 and missing[0] == 0.0  # C20 is often missing, C1 never (CATEGORICAL_MISSING)


def test_labels_follow_the_teacher() -> None:
    chunk = criteo.Generator(criteo.GeneratorConfig(seed=11)).chunk("train", 0, 20_000)
    assert abs(chunk.labels.mean() - 0.25) < 0.02
    teacher_auc = auc(chunk.labels, chunk.teacher_probability)
    assert 0.75 < teacher_auc < 0.95
    # The teacher's probabilities are calibrated: its log loss beats the constant predictor's.
    constant = np.full(len(chunk.labels), chunk.labels.mean())
    assert log_loss(chunk.labels, chunk.teacher_probability) < log_loss(chunk.labels, constant) - 0.05


def test_zipf_ranks_stay_in_the_vocabulary_and_favour_small_ranks() -> None:
    u = np.random.default_rng(0).random(100_000)
    ranks = criteo.zipf_ranks(u, 1000, 1.2)
    assert ranks.min() == 0 and ranks.max() < 1000
    counts = np.bincount(ranks, minlength=1000)
    assert counts[0] > counts[1] > counts[10] > counts[100]


@pytest.mark.parametrize("suffix", [".tsv", ".tsv.gz"])
def test_the_reader_reads_back_what_the_generator_wrote(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"rows{suffix}"
    stats = criteo.write(criteo.Generator(SMALL), "train", 500, path)
    assert stats["rows"] == 500
    chunk = criteo.Generator(SMALL).chunk("train", 0, 500)
    raw = criteo.read(path, chunk_rows=128)  # several chunks
    assert np.array_equal(raw.labels, chunk.labels)
    assert np.array_equal(raw.dense, np.where(np.isnan(chunk.dense), 0.0, chunk.dense).astype(np.float32))
    for f in range(26):
        text = [raw.values[f][c] for c in raw.codes[:, f]]
        expected = ["" if m else f"{h:08x}" for h, m in zip(chunk.hashes[:, f], chunk.missing[:, f], strict=True)]
        assert text == expected
        assert raw.counts[f].sum() == 500
    assert len(criteo.read(path, max_rows=7).labels) == 7


def test_the_vocabulary_keeps_frequent_values_and_maps_the_rest_to_row_0(tmp_path: Path) -> None:
    path = tmp_path / "rows.tsv"
    lines = []
    for i in range(10):
        categorical = ["a"] * 26
        categorical[0] = "x" if i < 6 else ("y" if i < 9 else "")
        lines.append("\t".join(["1" if i % 2 else "0", *["1"] * 13, *categorical]))
    path.write_text("\n".join(lines) + "\n")
    raw = criteo.read(path)
    vocabulary = criteo.Vocabulary.build(raw, min_count=3)
    assert vocabulary.values["C1"] == ("x", "y")  # by decreasing count; "" (missing) was seen once: row 0
    assert vocabulary.rows("C1") == 3
    ids = vocabulary.ids(raw)
    assert ids[:, 0].tolist() == [1] * 6 + [2] * 3 + [0]
    assert criteo.Vocabulary.from_json(vocabulary.to_json()) == vocabulary


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("1\t2\t3", r"rows\.tsv:2: has 3 tab-separated columns, expected 40"),
        ("2" + "\t" * 39, r"rows\.tsv:2: the label must be 0 or 1, not '2'"),
        ("0\tx" + "\t" * 38, r"rows\.tsv:2: I1 = 'x' is not a number"),
    ],
)
def test_broken_files_are_refused_naming_the_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "rows.tsv"
    path.write_text("0" + "\t" * 39 + "\n" + line + "\n")
    with pytest.raises(criteo.CriteoError, match=message):
        criteo.read(path)


def test_unreadable_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(criteo.CriteoError, match="cannot read"):
        criteo.read(tmp_path / "absent.tsv")
    (tmp_path / "bad.gz").write_bytes(b"not gzip")
    with pytest.raises(criteo.CriteoError, match="cannot read"):
        criteo.read(tmp_path / "bad.gz")
    empty = tmp_path / "empty.tsv.gz"
    with gzip.open(empty, "wt") as f:
        f.write("")
    with pytest.raises(criteo.CriteoError, match="holds no rows"):
        criteo.read(empty)


def test_auc_and_log_loss_match_their_definitions() -> None:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.random(200), 1)  # many ties
    pairs = [(a, b) for a in s[y == 1] for b in s[y == 0]]
    brute = np.mean([1.0 if a > b else 0.5 if a == b else 0.0 for a, b in pairs])
    assert auc(y, s) == pytest.approx(brute, abs=1e-12)
    p = np.clip(rng.random(200), 0.01, 0.99)
    assert log_loss(y, p) == pytest.approx(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)), abs=1e-12)
    with pytest.raises(ValueError, match="at least one positive"):
        auc(np.ones(3), np.ones(3))
