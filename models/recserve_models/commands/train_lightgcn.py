"""The `train-lightgcn` command: LightGCN with BPR (`lightgcn.run_training`) on a split in the Gowalla format."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..lightgcn import RUN_JSON, RUN_TENSORS, InteractionsError, TrainConfig, run_training
from ._options import require_training_options


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `train-lightgcn` command's options."""
    d = TrainConfig()
    parser.add_argument("--data", type=Path, required=True, help="directory with train.txt and test.txt")
    parser.add_argument("--out", type=Path, required=True, help="run directory to write")
    parser.add_argument("--dim", type=int, default=d.dim, help=f"embedding width (default {d.dim})")
    parser.add_argument("--layers", type=int, default=d.layers, help=f"propagation layers K (default {d.layers})")
    parser.add_argument(
        "--epochs", type=int, default=d.epochs, help=f"passes over the interactions (default {d.epochs})"
    )
    parser.add_argument("--batch", type=int, default=d.batch, help=f"triples per step (default {d.batch})")
    parser.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr})")
    parser.add_argument("--reg", type=float, default=d.reg, help=f"L2 weight on layer-0 rows (default {d.reg})")
    parser.add_argument("--seed", type=int, default=d.seed, help=f"seed (default {d.seed})")
    parser.add_argument("--eval-every", type=int, default=0, help="report test metrics every N epochs (0: at the end)")


def config_of(args: argparse.Namespace) -> TrainConfig:
    """The training configuration from the options; exits naming the flag when one is out of range."""
    require_training_options(args, ("dim", "layers", "epochs", "batch"), "reg")
    return TrainConfig(args.dim, args.layers, args.epochs, args.batch, args.lr, args.reg, seed=args.seed)


def run(args: argparse.Namespace) -> None:
    """Run the `train-lightgcn` command."""
    try:
        run_training(args.data, args.out, config_of(args), args.eval_every)
    except InteractionsError as e:
        raise SystemExit(f"train-lightgcn: {e}") from e
    print(f"wrote {args.out / RUN_TENSORS} and {args.out / RUN_JSON}")
