"""Writing the toolchain's files so that the serving user can read them, and finding files it could not.

The container image serves as uid 65532, rarely the uid that wrote the repository, so every file the toolchain
writes (tables, `ivf.safetensors`, graphs, `model.toml`, JSON, run directories) gets mode 0644 and every
directory it creates 0755: readable by others, whatever the umask (a umask of 077 would otherwise give 0600, and
safetensors' `save_file` writes 0600 under any umask). The mode is set with `chmod` after writing, so the umask
does not apply to it. `--file-mode` (`set_file_mode`) chooses another mode for files; a directory gets the file
mode plus execute wherever it grants read (0640 → 0750). Files written by another library (`save_file`,
`np.savez`, `shutil.copyfile`, `shutil.copytree`) go through `finish`. Temporary files are not covered.

`check` reports what a different user could not read (`unreadable_by_others`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

DEFAULT_FILE_MODE = 0o644
_file_mode = DEFAULT_FILE_MODE  # set once from --file-mode by the command line, before any command runs


def parse_file_mode(text: str) -> int:
    """An octal mode such as `644` or `0640` (`--file-mode`); it must let the owner read and write, since the
    toolchain rewrites some of its files (`index` updates `model.toml`). Raises `ValueError` naming the value."""
    try:
        mode = int(text.removeprefix("0o"), 8)
    except ValueError:
        mode = -1
    if not 0 <= mode <= 0o777:
        raise ValueError(f"expected an octal mode such as 644 or 0640, not {text!r}")
    if mode & 0o600 != 0o600:
        raise ValueError(f"{text!r} does not let the owner read and write the file (expected 6xx, such as 644)")
    return mode


def set_file_mode(mode: int) -> None:
    """Makes `mode` the mode of every file written from now on (the command line's `--file-mode`)."""
    global _file_mode
    _file_mode = parse_file_mode(f"{mode:o}")


def file_mode() -> int:
    return _file_mode


def dir_mode() -> int:
    """The file mode plus execute (search) wherever it grants read: 0644 → 0755, 0640 → 0750."""
    return _file_mode | ((_file_mode & 0o444) >> 2)


def write_bytes(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    os.chmod(path, _file_mode)


def write_text(path: Path, text: str, encoding: str = "utf-8") -> None:
    path.write_text(text, encoding=encoding)
    os.chmod(path, _file_mode)


def mkdir(path: Path, exist_ok: bool = False) -> None:
    """Creates `path` and its missing parents, each with `dir_mode()` (directories that existed are left alone)."""
    missing = [p for p in (path, *path.parents) if not p.exists()]
    path.mkdir(parents=True, exist_ok=exist_ok)
    for created in missing:
        os.chmod(created, dir_mode())


def finish(path: Path) -> None:
    """Gives a file written by another library the file mode; a directory (a copied tree) gets `dir_mode()`, and
    everything under it the mode of its kind."""
    if not path.is_dir():
        os.chmod(path, _file_mode)
        return
    os.chmod(path, dir_mode())
    for parent, dirs, names in os.walk(path):
        for name in dirs:
            os.chmod(Path(parent, name), dir_mode())
        for name in names:
            os.chmod(Path(parent, name), _file_mode)


def unreadable_by_others(root: Path) -> list[str]:
    """One line per file under `root` that a user other than its owner (and outside its group) could not read,
    and per directory it could not list and enter: the path, its mode in octal and the fix."""
    found: list[str] = []
    for parent, dirs, names in os.walk(root):
        dirs.sort()
        for path, needed, fix in (
            [(Path(parent), stat.S_IROTH | stat.S_IXOTH, "a+rx")]
            + [(Path(parent, name), stat.S_IROTH, "a+r") for name in sorted(names)]
        ):
            try:
                mode = stat.S_IMODE(path.stat().st_mode)
            except OSError:  # a dangling link: not a mode question
                continue
            if mode & needed != needed:
                found.append(
                    f"{path}: mode {mode:04o} is not readable by other users, such as the container image's uid "
                    f"65532: chmod {fix} {path}, or write it with --file-mode 644"
                )
    return found
