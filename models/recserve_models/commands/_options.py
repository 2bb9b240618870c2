"""Checks on option values shared by several commands, with messages that name the flag."""

from __future__ import annotations

import argparse

from ..export import STORAGES


def require_training_options(args: argparse.Namespace, counts: tuple[str, ...], penalty: str) -> None:
    """Exits when one of the `counts` options is below 1, `--lr` is not positive or `--<penalty>` is negative."""
    for name in counts:
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be at least 1")
    if args.lr <= 0 or getattr(args, penalty) < 0:
        raise SystemExit(f"--lr must be positive and --{penalty} non-negative")


def storage_choice(text: str) -> str | dict[str, str]:
    """`--storage` / `--tables`: one storage for every table (`int8`), or `TABLE=STORAGE` pairs (`item=int8`)."""
    if "=" not in text:
        if text not in STORAGES:
            raise argparse.ArgumentTypeError(
                f"expected {', '.join(STORAGES)}, or TABLE=STORAGE pairs such as item=int8, not {text!r}"
            )
        return text
    choice: dict[str, str] = {}
    for pair in text.split(","):
        name, _, storage = (part.strip() for part in pair.partition("="))
        if not name or storage not in STORAGES:
            raise argparse.ArgumentTypeError(
                f"{pair.strip()!r}: expected TABLE=STORAGE with a storage of {', '.join(STORAGES)}, such as item=int8"
            )
        if name in choice:
            raise argparse.ArgumentTypeError(f"table {name!r} is named twice")
        choice[name] = storage
    return choice
