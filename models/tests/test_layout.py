"""The package's three parts stay apart: the library does not import the command line or the test support, every
command is a module of `commands/` with `add_arguments` and `run`, and models/README.md lists every module."""

from __future__ import annotations

import ast
from pathlib import Path

from recserve_models.commands import COMMANDS, command_module

PACKAGE = Path(__file__).parents[1] / "recserve_models"
README = Path(__file__).parents[1] / "README.md"


def _library_modules() -> list[Path]:
    return sorted(p for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def _relative_imports(path: Path) -> set[str]:
    """The package-relative modules `path` imports (`from .x import y` -> `x`, `from . import x` -> `x`)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level:
            if node.module:
                found.add(node.module.split(".")[0])
            else:
                found.update(alias.name for alias in node.names)
    return found


def test_the_library_imports_neither_the_commands_nor_the_test_support() -> None:
    for path in _library_modules():
        upward = _relative_imports(path) & {"commands", "testing"}
        assert not upward, f"{path.name} imports {sorted(upward)}: the library must not depend on them"


def test_every_command_is_a_module_with_its_options_and_its_run() -> None:
    modules = {m for m, _ in COMMANDS.values()}
    files = {p.stem for p in (PACKAGE / "commands").glob("*.py") if not p.name.startswith("_")}
    assert modules == files, "one module per command, and no command module unused"
    for name in COMMANDS:
        module = command_module(name)
        assert callable(module.add_arguments) and callable(module.run), name
        assert module.__name__.endswith(name.replace("-", "_")), f"command {name!r} lives in {module.__name__}"


def test_the_readme_lists_every_module() -> None:
    text = README.read_text(encoding="utf-8")
    for part in ("", "commands/", "testing/"):
        for path in sorted((PACKAGE / part).glob("*.py")):
            if path.name.startswith("_"):
                continue
            assert f"| `{path.name}` |" in text, f"models/README.md does not list {part}{path.name}"


def test_no_message_prints_an_id_range_as_0_dot_dot_rows() -> None:
    """`ids 0..1880` reads as if 1880 were valid: messages say `ids 0 to 1879` (`repository.id_range`)."""
    root = PACKAGE.parents[1]
    sources = [*PACKAGE.rglob("*.py"), *(root / "scripts").glob("*.py"), *(root / "loadtest" / "peers").glob("*.py")]
    for path in sources:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            assert "0..{" not in line, (
                f"{path.relative_to(root)}:{number}: an inclusive-looking id range: {line.strip()}"
            )
