"""The `quantize` command: a new version from an existing one, with re-encoded tables and/or the INT8 QDQ graph
(`export.quantize_version`, on the encodings of `quantize.py`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import criteo, model_toml
from ..check import CheckError
from ..export import StorageError, quantize_version
from ._options import storage_choice


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `quantize` command's options."""
    parser.add_argument("--model", type=Path, required=True, help="source version directory")
    parser.add_argument("--out", type=Path, required=True, help="version directory to create")
    parser.add_argument(
        "--tables",
        type=storage_choice,
        help="new table storage: fp32, fp16 or int8 for every table (LightGCN: the user, item and history tables), "
        "or TABLE=STORAGE,... for the tables named, the others unchanged, e.g. item=int8 (default: unchanged)",
    )
    parser.add_argument("--graph", choices=("fp32", "int8"), help="DeepFM: int8 replaces an fp32 graph by INT8 QDQ")
    parser.add_argument("--calibration", type=Path, help="calibration rows: a run's calibration.npz, or a Criteo file")
    parser.add_argument("--calibration-rows", type=int, default=4096, help="rows used for calibration (4096)")
    parser.add_argument("--description", help="new description (default: the source's)")


def run(args: argparse.Namespace) -> None:
    """Run the `quantize` command."""
    if args.out.exists():
        raise SystemExit(f"quantize: {args.out} already exists")
    if args.tables is None and args.graph is None:
        raise SystemExit("quantize: nothing to do: give --tables and/or --graph")
    try:
        quantize_version(
            args.model,
            args.out,
            tables_storage=args.tables,
            graph_precision=args.graph,
            calibration=args.calibration,
            calibration_rows=args.calibration_rows,
            description=args.description,
        )
    except StorageError as e:
        raise SystemExit(f"quantize: --tables: {e}") from e
    except (CheckError, model_toml.ModelTomlError, criteo.CriteoError) as e:
        raise SystemExit(f"quantize: {e}") from e
    print(f"wrote {args.out}")
