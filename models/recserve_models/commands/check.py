"""The `check` command: have the server judge every version of a repository (`recserve check-repository`, through
`check.validate`), compare
precisions on held-out data (`check.compare_deepfm`, `check.compare_lightgcn`), print one line per version and
per compared variant, and exit 1 when the server would refuse a version."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from .. import criteo, files, lightgcn
from ..check import MAX_CANDIDATES, CheckError, Version, compare_deepfm, compare_lightgcn, validate
from ..model_toml import LightGCNToml

JSON_FORMAT_VERSION = 1  # of the `--json` document (models/README.md, "What check --json writes")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `check` command's options."""
    parser.add_argument("repository", type=Path, help="model repository: <repository>/<model>/<version>/model.toml")
    parser.add_argument(
        "--max-candidates", type=int, default=MAX_CANDIDATES, help="the server's --max-candidates (its warm-up batch)"
    )
    parser.add_argument(
        "--deepfm-data",
        type=Path,
        help="held-out rows for DeepFM models: Criteo TSV (mapped through each version's vocabulary.json) or .npz",
    )
    parser.add_argument("--lightgcn-data", type=Path, help="directory with train.txt and test.txt for LightGCN models")
    parser.add_argument(
        "--json", type=Path, help="also write the results as JSON to this file (scripts/recall-check.py reads it)"
    )


def run_check(args: argparse.Namespace) -> dict[str, Any]:
    """Validates (and compares); returns the results. Raises `CheckError` for a repository-level error."""
    validation = validate(args.repository, args.max_candidates)
    result: dict[str, Any] = {
        "format_version": JSON_FORMAT_VERSION,
        "repository": str(args.repository),
        "models": {},
        "warnings": validation.warnings,
    }
    for warning in validation.warnings:
        print(f"check: warning: {warning}", file=sys.stderr)
    for model in validation.models:
        result["models"][model.name] = {
            "served_version": model.served,
            "versions": {
                str(v): "ok" if isinstance(x, Version) else x for v, x in validation.versions[model.name].items()
            },
        }
        for v, x in validation.versions[model.name].items():
            mark = "ok" if isinstance(x, Version) else f"ERROR {x}"
            served = " (served)" if v == model.served else ""
            kind = f" {'lightgcn' if isinstance(x.model, LightGCNToml) else 'deepfm'}" if isinstance(x, Version) else ""
            print(f"{model.name}/{v}{served}{kind}: {mark}")
    if validation.errors:
        return result
    if args.deepfm_data:
        result["deepfm"] = compare_deepfm(validation, args.deepfm_data)
        for row in result["deepfm"]:
            diff = f", max |Δp| {row['max_abs_diff']:.2e}" if "max_abs_diff" in row else ""
            print(f"  {row['variant']}: AUC {row['auc']:.5f}, log loss {row['log_loss']:.5f}{diff}")
    if args.lightgcn_data:
        result["lightgcn"] = compare_lightgcn(validation, args.lightgcn_data)
        for row in result["lightgcn"]:
            skipped = f", {row['skipped_users']} without training items left out" if row["skipped_users"] else ""
            print(
                f"  {row['variant']}: Recall@20 {row['recall@20']:.4f}, NDCG@20 {row['ndcg@20']:.4f} "
                f"({row['test_users']} test users{skipped})"
            )
    return result


def run(args: argparse.Namespace) -> None:
    """Run the `check` command: exit status 1 when any version would be refused by the server. Files that other
    users cannot read are warnings (`Validation.warnings`): exit status 0."""
    try:
        result = run_check(args)
    except (CheckError, criteo.CriteoError, lightgcn.InteractionsError) as e:
        print(f"check: {e}", file=sys.stderr)
        raise SystemExit(1) from e
    if args.json:
        files.write_text(args.json, json.dumps(result, indent=2) + "\n", encoding="utf-8")
    errors = [v for m in result["models"].values() for v in m["versions"].values() if v != "ok"]
    if errors:
        print(f"check: {len(errors)} model version(s) would be refused by the server", file=sys.stderr)
        raise SystemExit(1)
    unreadable = f", but {len(result['warnings'])} path(s) only their owner can read (above)" if result["warnings"] else ""
    print(f"check: every model version in {args.repository} loads{unreadable}")
