"""The `demo` command: the committed demo repository (`--out`) and its quality report, from scratch (`demo.build`)."""

from __future__ import annotations

import argparse
from pathlib import Path



def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `demo` command's options."""
    parser.add_argument("--out", type=Path, required=True, help="the demo repository to write (models/demo)")
    parser.add_argument("--work", type=Path, default=Path("target/demo-work"), help="work directory (target/demo-work)")
    parser.add_argument(
        "--gowalla", type=Path, default=Path("../shared/data/gowalla"), help="Gowalla train.txt/test.txt directory"
    )
    parser.add_argument("--report", type=Path, help="also render docs/model-quality.md here")


def run(args: argparse.Namespace) -> None:
    """Run the `demo` command."""
    if not (args.gowalla / "train.txt").is_file():
        raise SystemExit(f"demo: no Gowalla data in {args.gowalla} (train.txt, test.txt): pass --gowalla DIR")
    from ..demo import build  # here: it loads onnxruntime and scipy, which --help needs none of

    build(args.out, args.work, args.gowalla, args.report)
    print(f"wrote {args.out}")
