"""Command line: `python -m recserve_models <command> [options]`; `--help` lists the commands.

Each command lives in its own module, which provides `add_arguments(parser)` and `run(args)`.
"""

from __future__ import annotations

import argparse

from . import check, criteo, demo, export, fixture, lightgcn, report, train_deepfm

COMMANDS = {
    "fixture": (fixture, "write the test model repository and the rank cases of the server's end-to-end tests"),
    "generate-criteo": (criteo, "write synthetic Criteo-format rows whose labels come from a hidden teacher model"),
    "train-deepfm": (train_deepfm, "train DeepFM on Criteo-format data; held-out AUC and log loss"),
    "train-lightgcn": (lightgcn, "train LightGCN with BPR on user-item interactions (the Gowalla split format)"),
    "export": (export, "write a repository version from a training run (fp32, fp16 or int8 tables; fp32 graph)"),
    "quantize": (export.Quantize, "re-encode a version's tables and replace its fp32 graph by INT8 QDQ"),
    "check": (check, "validate a repository with the server's rules; compare precisions on held-out data"),
    "report": (report, "render docs/model-quality.md from the demo's quality.json"),
    "demo": (demo, "train, export, quantize and check the demo models; write models/demo and the quality report"),
    "demo-cases": (demo.DemoCases, "write held-out rank requests and offline scores for the demo's DeepFM models"),
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
