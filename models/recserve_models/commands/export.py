"""The `export` command: a repository version from a `train-deepfm` or `train-lightgcn` run (`export.py`),
validated with `check`'s rules before it returns."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..check import CheckError, check_version
from ..export import DEFAULT_ITEM_FIELDS, StorageError, describe_storages, export_deepfm, export_lightgcn
from ..lightgcn import LightGCNRun
from ..model_toml import read
from ..repository import MODEL_TOML
from ..train_deepfm import DeepFMRun
from ._options import storage_choice


def _fields(text: str) -> tuple[str, ...]:
    return tuple(name.strip() for name in text.split(",") if name.strip())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `export` command's options."""
    parser.add_argument("--run", type=Path, required=True, help="a train-deepfm or train-lightgcn run directory")
    parser.add_argument(
        "--out", type=Path, required=True, help="version directory to create (<repo>/<model>/<version>)"
    )
    parser.add_argument(
        "--storage",
        type=storage_choice,
        default="fp32",
        help="table storage: fp32, fp16 or int8 for every table (LightGCN: the user, item and history tables), or "
        "TABLE=STORAGE,... for the tables named, the others fp32, e.g. item=int8 (default fp32)",
    )
    parser.add_argument(
        "--item-fields",
        type=_fields,
        default=DEFAULT_ITEM_FIELDS,
        help="DeepFM: comma-separated item-side fields (default C20..C26); the others are user-side",
    )
    parser.add_argument("--item-id-field", help="DeepFM: the item-side field a candidate's id feeds (default none)")
    parser.add_argument("--description", default="", help="free text for model.toml")


def run(args: argparse.Namespace) -> None:
    """Run the `export` command."""
    if args.out.exists():
        raise SystemExit(f"export: {args.out} already exists")
    kind = _run_kind(args.run)
    try:
        if kind == "deepfm":
            export_deepfm(
                DeepFMRun.load(args.run),
                args.out,
                args.storage,
                item_fields=args.item_fields,
                item_id_field=args.item_id_field,
                description=args.description,
            )
        else:
            export_lightgcn(LightGCNRun.load(args.run), args.out, args.storage, args.description)
        check_version(args.out)
    except StorageError as e:
        raise SystemExit(f"export: --storage: {e}") from e
    except CheckError as e:
        raise SystemExit(f"export: the written version would be refused: {e}") from e
    storages = {t.name: t.storage for t in read(args.out / MODEL_TOML).tables}
    print(f"wrote {args.out} ({kind}, {describe_storages(storages)})")


def _run_kind(directory: Path) -> str:
    path = directory / "training.json"
    try:
        kind = json.loads(path.read_text(encoding="utf-8")).get("kind")
    except (OSError, ValueError) as e:
        raise SystemExit(f"export: {path}: not a training run: {e}") from e
    if kind not in ("deepfm", "lightgcn"):
        raise SystemExit(f"export: {path}: unknown kind {kind!r}")
    return kind
