"""The `generate-criteo` command: synthetic Criteo-format rows (`criteo.generate`) and their `.json` description."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..criteo import GeneratorConfig, generate


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `generate-criteo` command's options."""
    d = GeneratorConfig()
    parser.add_argument("--out", type=Path, required=True, help="file to write (gzip when it ends in .gz)")
    parser.add_argument("--rows", type=int, required=True, help="rows to write")
    parser.add_argument(
        "--split", choices=("train", "test"), default="train", help="which stream of rows (independent of each other)"
    )
    parser.add_argument("--seed", type=int, default=d.seed, help=f"seed of the data and the teacher (default {d.seed})")
    parser.add_argument("--vocab-scale", type=float, default=d.vocab_scale, help="multiplies the Kaggle cardinalities")
    parser.add_argument(
        "--max-vocab", type=int, default=d.max_vocab, help=f"caps each field's vocabulary ({d.max_vocab})"
    )
    parser.add_argument("--zipf", type=float, default=d.zipf, help=f"Zipf exponent of the ids (default {d.zipf})")
    parser.add_argument(
        "--positive-rate", type=float, default=d.positive_rate, help=f"share of clicks (default {d.positive_rate})"
    )


def config_of(args: argparse.Namespace) -> GeneratorConfig:
    """The generator's parameters from the options; exits naming the flag when one is out of range."""
    if args.rows < 1 or args.max_vocab < 1 or args.vocab_scale <= 0:
        raise SystemExit("--rows and --max-vocab must be at least 1 and --vocab-scale positive")
    if args.zipf <= 1.0 or not 0.0 < args.positive_rate < 1.0:
        raise SystemExit("--zipf must be above 1 and --positive-rate strictly between 0 and 1")
    return GeneratorConfig(
        seed=args.seed,
        vocab_scale=args.vocab_scale,
        max_vocab=args.max_vocab,
        zipf=args.zipf,
        positive_rate=args.positive_rate,
    )


def run(args: argparse.Namespace) -> None:
    """Run the `generate-criteo` command."""
    stats = generate(config_of(args), args.split, args.rows, args.out)
    print(
        f"wrote {args.rows} rows to {args.out}: positive rate {stats['positive_rate']:.4f}, "
        f"teacher AUC {stats['teacher_auc']:.4f} (the best any model can reach on these rows)"
    )
