"""The `demo-cases` command: held-out rank requests with the toolchain's offline scores for the committed demo
models, for the server's end-to-end test `tests/demo_models.rs` (test support: `testing.demo_cases`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from .. import files


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `demo-cases` command's options."""
    parser.add_argument("--repository", type=Path, default=Path("models/demo"), help="the demo repository")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")


def run(args: argparse.Namespace) -> None:
    """Run the `demo-cases` command."""
    if not (args.repository / "quality.json").is_file():
        raise SystemExit(f"demo-cases: {args.repository} has no quality.json: is it the demo repository?")
    from ..testing.demo_cases import SIZES, demo_cases  # here: it loads onnxruntime, which --help needs none of

    document = demo_cases(args.repository, SIZES)
    files.mkdir(args.out.parent, exist_ok=True)
    files.write_text(args.out, json.dumps(document) + "\n", encoding="utf-8")
    print(f"wrote {len(document['cases'])} held-out rank cases to {args.out}")
