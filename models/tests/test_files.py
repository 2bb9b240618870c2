"""File modes (issue 35): what the toolchain writes is readable by the serving user (0644, directories 0755)
whatever the umask, `--file-mode` chooses another mode, and `check` names what others could not read."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from recserve_models import files
from recserve_models.commands import main
from recserve_models.model_toml import LightGCNToml, RecallSpec, TableSpec
from recserve_models.repository import write_lightgcn_version


@pytest.fixture(autouse=True)
def restrictive_umask() -> Iterator[None]:
    """umask 077, under which a plain `open` creates 0600; the file mode is reset after each test."""
    previous = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(previous)
        files.set_file_mode(files.DEFAULT_FILE_MODE)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def lightgcn_version(root: Path) -> Path:
    items, users, dim = 200, 10, 8
    model = LightGCNToml(
        tables=(
            TableSpec("user", "tables.safetensors", users, dim, "fp32", "reject"),
            TableSpec("item", "tables.safetensors", items, dim, "fp32", "reject"),
        ),
        recall=RecallSpec("user", "item"),
    )
    rng = np.random.default_rng(35)
    tables = {spec.name: rng.normal(size=(spec.rows, dim)).astype(np.float32) for spec in model.tables}
    directory = root / "m" / "1"
    write_lightgcn_version(directory, model, tables)
    return directory


def test_the_table_writer_and_the_index_write_0644_under_umask_077(tmp_path: Path) -> None:
    directory = lightgcn_version(tmp_path / "repo")
    main(["index", str(directory), "--nlist", "4"])
    for name in ("tables.safetensors", "model.toml", "ivf.safetensors"):
        assert f"{mode(directory / name):04o}" == "0644", name
    for created in (tmp_path / "repo", directory.parent, directory):
        assert f"{mode(created):04o}" == "0755", created
    assert f"{mode(tmp_path):04o}" != "0755"  # existed before: left alone


def test_file_mode_is_honoured_before_or_after_the_command(tmp_path: Path) -> None:
    directory = lightgcn_version(tmp_path / "repo")
    main(["--file-mode", "640", "index", str(directory), "--nlist", "4"])
    assert f"{mode(directory / 'ivf.safetensors'):04o}" == "0640"
    assert f"{mode(directory / 'model.toml'):04o}" == "0640"
    main(["index", str(directory), "--nlist", "4", "--file", "ivf-600.safetensors", "--file-mode", "0600"])
    assert f"{mode(directory / 'ivf-600.safetensors'):04o}" == "0600"


@pytest.mark.parametrize(
    ("value", "says"),
    [("abc", "expected an octal mode such as 644 or 0640, not 'abc'"), ("0444", "'0444' does not let the owner")],
)
def test_a_bad_file_mode_is_refused_naming_the_option_and_the_value(value: str, says: str, capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["--file-mode", value, "report", "--quality", "q.json", "--out", "r.md"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --file-mode:" in err and says in err


def test_check_warns_about_what_other_users_cannot_read(tmp_path: Path, capsys) -> None:
    directory = lightgcn_version(tmp_path / "repo")
    os.chmod(directory / "tables.safetensors", 0o600)
    os.chmod(directory.parent, 0o750)
    main(["check", str(tmp_path / "repo")])  # a warning: exit status 0
    out = capsys.readouterr()
    tables = directory / "tables.safetensors"
    assert f"{tables}: mode 0600 is not readable by other users" in out.err
    assert f"chmod a+r {tables}" in out.err and "--file-mode" in out.err
    assert f"{directory.parent}: mode 0750" in out.err and f"chmod a+rx {directory.parent}" in out.err
    assert str(directory / "model.toml") not in out.err
    assert "2 path(s) only their owner can read" in out.out
