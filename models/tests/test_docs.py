"""The runnable example of docs/bring-your-own-model.md runs as written and writes a version that passes check."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from recserve_models import check

DOC = Path(__file__).resolve().parents[2] / "docs" / "bring-your-own-model.md"


def test_the_worked_deepfm_example_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.S)
    runnable = [b for b in blocks if "check_version(version)" in b]
    assert len(runnable) == 1, "the doc's runnable example is gone or duplicated"
    monkeypatch.chdir(tmp_path)
    exec(compile(runnable[0], str(DOC), "exec"), {})
    assert 'kind = "deepfm"' in capsys.readouterr().out
    validation = check.validate(tmp_path / "repo")
    assert validation.errors == [] and [m.name for m in validation.models] == ["my-deepfm"]
