"""The command line starts fast (issue 35): `--help`, and each command's `--help`, import none of the slow
packages (scipy, onnx, onnxruntime, jax), since commands import them where they run; `--version` prints the
toolchain's version, the workspace's. Each run is a fresh interpreter, since this one has imported everything."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import recserve_models
from recserve_models.commands import COMMANDS, main

SLOW = ("scipy", "onnx", "onnxruntime", "jax")
RUNNER = f"""
import sys
from recserve_models.commands import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(sorted({{m.split(".")[0] for m in sys.modules}} & set({SLOW!r})))
"""


def imported_by(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-c", RUNNER, *argv], capture_output=True, text=True, check=True)
    assert "usage: python -m recserve_models" in done.stdout, done.stdout
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_imports_no_slow_package(command: str) -> None:
    assert imported_by(*([command] if command else []), "--help") == "[]"


def test_version_prints_the_workspace_version(capsys) -> None:
    cargo = tomllib.loads((Path(__file__).parents[2] / "Cargo.toml").read_text(encoding="utf-8"))
    assert recserve_models.__version__ == cargo["workspace"]["package"]["version"]
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"python -m recserve_models {recserve_models.__version__}\n"
