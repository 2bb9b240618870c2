"""Command line: `python -m recserve_models <command> [options]`; `--help` lists the commands.

Each command lives in its own module, which provides `add_arguments(parser)` and `run(args)`.
"""

from __future__ import annotations

import argparse

from . import fixture

COMMANDS = {
    "fixture": (fixture, "write the test model repository and the rank cases of the server's end-to-end tests"),
}


def main(argv: list[str] | None = None) -> None:
    """Parse `argv` and run the chosen command."""
    parser = argparse.ArgumentParser(prog="python -m recserve_models", description="The recserve model toolchain.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (module, summary) in COMMANDS.items():
        module.add_arguments(commands.add_parser(name, help=summary, description=summary))
    args = parser.parse_args(argv)
    COMMANDS[args.command][0].run(args)


if __name__ == "__main__":
    main()
