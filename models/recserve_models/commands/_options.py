"""Checks on option values shared by several commands, with messages that name the flag."""

from __future__ import annotations

import argparse


def require_training_options(args: argparse.Namespace, counts: tuple[str, ...], penalty: str) -> None:
    """Exits when one of the `counts` options is below 1, `--lr` is not positive or `--<penalty>` is negative."""
    for name in counts:
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if args.lr <= 0 or getattr(args, penalty) < 0:
        raise SystemExit(f"--lr must be positive and --{penalty} non-negative")
