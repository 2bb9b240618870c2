"""The `synth` command: a benchmark model of realistic size with random weights, its requests and its offline
scores (`synth.synth`, presets in `synth.PRESETS`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..synth import PRESETS, SEED, synth


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `synth` command's options."""
    parser.add_argument("--preset", choices=sorted(PRESETS), required=True, help="the model shape")
    parser.add_argument(
        "--out", type=Path, required=True, help="repository to write <preset>-int8/1 and <preset>-fp32/1 into"
    )
    parser.add_argument("--max-rows", type=int, help="cap every table at this many rows (small models for tests)")
    parser.add_argument("--requests", type=int, default=1000, help="rank bodies to write (default 1000)")
    parser.add_argument("--candidates", type=int, help="candidates per request (default: the preset's, 100)")
    parser.add_argument("--cases", type=int, default=8, help="requests scored offline for the end-to-end test (8)")
    parser.add_argument(
        "--split",
        action="store_true",
        help="also write <preset>-int8-split/1 and <preset>-fp32-split/1, whose graph is split into a user part run "
        "once per request and an item part run per candidate (split_graph.py)",
    )
    parser.add_argument("--seed", type=int, default=SEED, help=f"seed of the weights and ids (default {SEED})")


def run(args: argparse.Namespace) -> None:
    """Run the `synth` command."""
    bounds = (
        ("--max-rows", args.max_rows, 1),
        ("--requests", args.requests, 1),
        ("--candidates", args.candidates, 1),
        ("--cases", args.cases, 0),
    )
    for flag, value, least in bounds:
        if value is not None and value < least:
            raise SystemExit(f"{flag} must be at least {least}, got {value}")
    if args.cases > args.requests:
        raise SystemExit(f"--cases ({args.cases}) cannot exceed --requests ({args.requests})")
    try:
        summary = synth(
            PRESETS[args.preset],
            args.out,
            max_rows=args.max_rows,
            count=args.requests,
            cases=args.cases,
            candidates=args.candidates,
            seed=args.seed,
            split=args.split,
        )
    except FileExistsError as e:
        raise SystemExit(f"synth: {e}") from e
    print(json.dumps(summary, indent=2))
