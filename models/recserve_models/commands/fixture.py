"""The `fixture` command: the test repository, its rank, recall and recommend cases and the check/loader parity
cases (`testing.fixture`, test support) in `--out`; refuses to replace what is there without `--force`."""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from .. import files
from ..testing import fixture_recall
from ..testing.fixture import SEED, VERSIONS, build, outputs


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `fixture` command's options."""
    parser.add_argument("--out", type=Path, required=True, help="directory to write repo/ and cases.json into")
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed of every random choice (default {SEED})")
    parser.add_argument(
        "--force", action="store_true", help="replace an existing repo/, cases.json and check-cases/ in --out"
    )


def run(args: argparse.Namespace) -> None:
    """Run the `fixture` command."""
    out: Path = args.out
    existing = [path for path in outputs(out) if path.exists()]
    if existing and not args.force:
        raise SystemExit(f"{existing[0]} already exists: remove it, choose another --out, or pass --force")
    for path in existing:
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    files.mkdir(out, exist_ok=True)
    build(out, args.seed)
    print(
        f"wrote {out / 'repo'} ({len(VERSIONS)} model versions), {out / 'cases.json'} and "
        f"{out / 'check-cases'} (repositories for the check/loader parity test)"
    )
    print(
        f"wrote the recall and recommend fixture: {out / fixture_recall.CASES_FILE}, {out / fixture_recall.CONFIG_FILE}"
    )
