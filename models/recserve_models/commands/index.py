"""The `index` command: build the IVF index of a LightGCN version's item table into the version directory and
name it in `model.toml`'s `[recall.index]` (`ivf.build_index`)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from .. import files, ivf, model_toml
from ..model_toml import IndexSpec, LightGCNToml
from ..progress import to_stderr
from ..repository import MODEL_TOML, TableError, load_tables, values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `index` command's options."""
    parser.add_argument("version", type=Path, help="a LightGCN version directory (holds model.toml)")
    parser.add_argument("--nlist", type=int, required=True, help="lists (k-means centroids), e.g. 4 x sqrt(items)")
    parser.add_argument(
        "--codes",
        choices=ivf.CODES,
        default="int8",
        help="how items are coded in the lists: int8 (row-wise, 1 byte a value) or pq4 (4-bit product quantization "
        "of the residual to the list's centroid, fast scan; 4 bits per sub-quantizer) (int8)",
    )
    parser.add_argument(
        "--pq-m", type=int, help="pq4: sub-quantizers, even and dividing dim (default: dim / 2 when that is even)"
    )
    parser.add_argument(
        "--nprobe", type=int, help="lists a query scans unless it asks otherwise (default: nlist / 64, at least 1)"
    )
    parser.add_argument(
        "--max-candidates", type=int, help="the most candidates a query re-ranks (default: the server's, 10000)"
    )
    parser.add_argument(
        "--sample", type=int, help="items k-means trains on, drawn at random (default: 64 x nlist, all if fewer)"
    )
    parser.add_argument("--iterations", type=int, default=10, help="k-means iterations (10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample and the initial centroids (0)")
    parser.add_argument("--file", default=ivf.INDEX_FILE, help=f"file name in the version directory ({ivf.INDEX_FILE})")


def run(args: argparse.Namespace) -> None:
    """Run the `index` command."""
    path = args.version / MODEL_TOML
    try:
        model = model_toml.read(path)
    except model_toml.ModelTomlError as e:
        raise SystemExit(f"index: {e}") from e
    if not isinstance(model, LightGCNToml):
        raise SystemExit(f"index: {path} is not a lightgcn model: only recall models have an item catalogue")
    nprobe = args.nprobe if args.nprobe is not None else max(1, args.nlist // 64)
    if not 1 <= nprobe <= args.nlist:
        raise SystemExit(f"index: --nprobe must be from 1 to --nlist ({args.nlist}), not {nprobe}")
    if args.max_candidates is not None and args.max_candidates < 1:
        raise SystemExit("index: --max-candidates must be at least 1")
    try:
        # Mapped, not read: a 10M × 64 fp32 catalogue is 2.56 GB, and the builder reads it in blocks.
        table = load_tables(args.version, model, mapped=True)[model.recall.item_table]
    except TableError as e:
        raise SystemExit(f"index: {e}") from e
    report = to_stderr("index")
    sample = args.sample if args.sample is not None else 64 * args.nlist
    try:
        built = ivf.build_index(
            args.version,
            model,
            table.stored,
            table.stored if table.spec.storage == "fp32" else values(table),
            args.nlist,
            sample,
            args.iterations,
            args.seed,
            report,
            args.file,
            args.codes,
            args.pq_m,
        )
    except ivf.IndexError_ as e:
        raise SystemExit(f"index: {e}") from e
    index = IndexSpec(args.file, nprobe, args.max_candidates, args.codes)
    updated = dataclasses.replace(model, recall=dataclasses.replace(model.recall, index=index))
    files.write_text(path, model_toml.to_toml(updated), encoding="utf-8")
    print(
        f"wrote {built.path}: {built.items} items in {built.nlist} lists (largest {built.largest_list}), k-means on "
        f"{built.trained_on} items, {args.codes} codes, {built.bytes} bytes, {built.seconds:.1f} s; [recall.index] nprobe = {nprobe}"
    )
