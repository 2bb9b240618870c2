"""The `report` command: docs/model-quality.md rendered (`report.render`) from the demo's `quality.json`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import files
from ..report import render


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `report` command's options."""
    parser.add_argument("--quality", type=Path, required=True, help="quality.json written by `demo`")
    parser.add_argument("--out", type=Path, required=True, help="markdown file to write (docs/model-quality.md)")


def run(args: argparse.Namespace) -> None:
    """Run the `report` command."""
    try:
        quality = json.loads(args.quality.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise SystemExit(f"report: cannot read {args.quality}: {e}") from e
    files.write_text(args.out, render(quality), encoding="utf-8")
    print(f"wrote {args.out}")
