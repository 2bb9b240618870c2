"""The command line, `python -m recserve_models <command> [options]`: one module per command.

Each command module provides `add_arguments(parser)` (its options) and `run(args)` (parse-level checks, a call
into the library, the lines it prints, its exit status), and nothing else: what a command computes lives in the
library modules of `recserve_models`, and what it generates for the tests in `recserve_models.testing`.
`--help` lists the commands. `--file-mode` (before or after the command) sets the mode of every file written
(`recserve_models.files`).
"""

from __future__ import annotations

import argparse
import importlib
from types import ModuleType

from .. import __version__, files

# name: (module of recserve_models.commands, summary). A module is imported only when its command is parsed, so
# `--help` and a command's `--help` do not load the others (nor scipy, onnx, onnxruntime: the command modules
# import those in `run`).
COMMANDS = {
    "fixture": ("fixture", "write the test model repository and the rank cases of the server's end-to-end tests"),
    "generate-criteo": (
        "generate_criteo",
        "write synthetic Criteo-format rows whose labels come from a hidden teacher model",
    ),
    "train-deepfm": ("train_deepfm", "train DeepFM on Criteo-format data; held-out AUC and log loss"),
    "train-lightgcn": (
        "train_lightgcn",
        "train LightGCN with BPR on user-item interactions (the Gowalla split format)",
    ),
    "export": ("export", "write a repository version from a training run (fp32, fp16 or int8 tables; fp32 graph)"),
    "quantize": ("quantize", "re-encode a version's tables and replace its fp32 graph by INT8 QDQ"),
    "index": ("index", "build the IVF index of a LightGCN version's items; name it in [recall.index]"),
    "check": ("check", "validate a repository with the server's rules; compare precisions on held-out data"),
    "report": ("report", "render docs/model-quality.md from the demo's quality.json"),
    "demo": ("demo", "train, export, quantize and check the demo models; write models/demo and the quality report"),
    "synth": ("synth", "write a benchmark model of realistic size (random weights), its requests and offline scores"),
    "publish": ("publish", "upload a version's tier = \"redis\" tables to a Redis Cluster, then its completion marker"),
    "update": ("update", "write new values for rows of a published version and announce them to the servers"),
    "demo-cases": ("demo_cases", "write held-out rank requests and offline scores for the demo's DeepFM models"),
}


def command_module(name: str) -> ModuleType:
    """The module of command `name` (imported now if it was not)."""
    return importlib.import_module(f"{__name__}.{COMMANDS[name][0]}")


class _CommandParser(argparse.ArgumentParser):
    """A command's parser, whose options are added from its module when it first parses."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        command = self.prog.rsplit(" ", 1)[-1]
        if not getattr(self, "_options_added", False):
            self._options_added = True
            command_module(command).add_arguments(self)
            # SUPPRESS: given after the command, it overrides the one before; absent, it leaves that one alone.
            _add_file_mode(self, argparse.SUPPRESS)
        return super().parse_known_args(args, namespace)


def _file_mode(text: str) -> int:
    try:
        return files.parse_file_mode(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from e


def _add_file_mode(parser: argparse.ArgumentParser, default: object) -> None:
    parser.add_argument(
        "--file-mode",
        type=_file_mode,
        default=default,
        metavar="MODE",
        help="octal mode of every file written, whatever the umask (default 644: readable by the serving user, "
        "uid 65532 in the container image); directories get it plus x where it grants r (755)",
    )


def main(argv: list[str] | None = None) -> None:
    """Parse `argv` and run the chosen command."""
    parser = argparse.ArgumentParser(prog="python -m recserve_models", description="The recserve model toolchain.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    _add_file_mode(parser, files.DEFAULT_FILE_MODE)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", parser_class=_CommandParser)
    for name, (_, summary) in COMMANDS.items():
        commands.add_parser(name, help=summary, description=summary)
    args = parser.parse_args(argv)
    files.set_file_mode(args.file_mode)
    command_module(args.command).run(args)
