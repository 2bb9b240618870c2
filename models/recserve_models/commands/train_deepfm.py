"""The `train-deepfm` command: DeepFM on Criteo-format data (`train_deepfm.run_training`) into a run directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from .. import criteo
from ..train_deepfm import TrainConfig, run_training
from ._options import require_training_options

# The command's validation split: on by default here, where a person trains on a file of any size, while
# `TrainConfig` keeps it off for programs with settings of their own (the demo).
VALIDATION_SHARE = 0.1


def _widths(text: str) -> tuple[int, ...]:
    try:
        widths = tuple(int(w) for w in text.split(",") if w.strip())
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"expected comma-separated widths such as 400,400,400, not {text!r}") from e
    if not widths or min(widths) < 1:
        raise argparse.ArgumentTypeError(f"expected at least one positive width, not {text!r}")
    return widths


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `train-deepfm` command's options."""
    d = TrainConfig()
    parser.add_argument("--train", type=Path, required=True, help="Criteo-format training file (.gz accepted)")
    parser.add_argument(
        "--test", type=Path, help="Criteo-format held-out file (default: the last --holdout of --train)"
    )
    parser.add_argument("--holdout", type=float, default=0.1, help="share of --train held out when there is no --test")
    parser.add_argument("--max-rows", type=int, help="read at most this many rows of --train")
    parser.add_argument("--out", type=Path, required=True, help="run directory to write")
    parser.add_argument("--factors", type=int, default=d.factors, help=f"k, FM factors per field (default {d.factors})")
    parser.add_argument(
        "--hidden", type=_widths, default=d.hidden, help="MLP widths, comma-separated (default 400,400,400)"
    )
    parser.add_argument(
        "--epochs", type=int, default=d.epochs, help=f"passes over the training rows (default {d.epochs})"
    )
    parser.add_argument("--batch", type=int, default=d.batch, help=f"rows per step (default {d.batch})")
    parser.add_argument("--lr", type=float, default=d.lr, help=f"Adam learning rate (default {d.lr})")
    parser.add_argument(
        "--l2", type=float, default=d.l2, help=f"weight decay of the embedding rows read (default {d.l2})"
    )
    parser.add_argument(
        "--min-count",
        type=int,
        default=d.min_count,
        help=f"occurrences a value needs for its own row (default {d.min_count})",
    )
    parser.add_argument("--seed", type=int, default=d.seed, help=f"seed (default {d.seed})")
    parser.add_argument(
        "--validation-share",
        type=float,
        default=VALIDATION_SHARE,
        help="share of the training rows (the last ones, before any held-out rows) kept out of training to choose "
        "the epoch: the run keeps the epoch with the lowest validation log loss; 0: train on every row and keep "
        f"the last epoch (default {VALIDATION_SHARE})",
    )
    parser.add_argument(
        "--patience",
        type=int,
        default=d.patience,
        help=f"stop after this many epochs in a row without a lower validation log loss (default {d.patience})",
    )


def config_of(args: argparse.Namespace) -> TrainConfig:
    """The training configuration from the options; exits naming the flag when one is out of range."""
    require_training_options(args, ("factors", "epochs", "batch", "min_count", "patience"), "l2")
    if not 0 <= args.validation_share < 1:
        raise SystemExit("--validation-share must be at least 0 and below 1")
    return TrainConfig(
        factors=args.factors,
        hidden=tuple(args.hidden),
        epochs=args.epochs,
        batch=args.batch,
        lr=args.lr,
        l2=args.l2,
        min_count=args.min_count,
        seed=args.seed,
        validation_share=args.validation_share,
        patience=args.patience,
    )


def run(args: argparse.Namespace) -> None:
    """Run the `train-deepfm` command."""
    try:
        result = run_training(
            args.train, args.out, config_of(args), test_path=args.test, holdout=args.holdout, max_rows=args.max_rows
        )
    except criteo.CriteoError as e:
        raise SystemExit(f"train-deepfm: {e}") from e
    held, kept = result.info["heldout"], result.info["selection"]["kept_epoch"]
    print(f"wrote {args.out} (epoch {kept}: held-out AUC {held['auc']:.4f}, log loss {held['log_loss']:.4f})")
