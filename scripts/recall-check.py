#!/usr/bin/env python3
"""Recall@K and NDCG@K of a *running* recserve, measured through its recall endpoint, beside the toolchain's
offline figures for the same repository.

For every test user of a LightGCN split (`train.txt`, `test.txt`: one line per user, `user item item ...`), it asks
the server for the user's top K (`POST /v1/models/MODEL/recall` with `user_id`, `k`, and the user's training items
in `exclude`), then averages Recall@K = |top K ∩ test| / |test| and NDCG@K (binary relevance, ideal DCG over
min(|test|, K) hits) over those users, exactly as `recserve_models.lightgcn.evaluate` does offline. It starts
nothing: point it at a server that serves the model, e.g.

    python -m recserve_models check models/demo --lightgcn-data ../shared/data/gowalla --json target/check.json
    target/release/recserve serve --repository models/demo --http-addr 127.0.0.1:8000 &
    python3 scripts/recall-check.py --server http://127.0.0.1:8000 --data ../shared/data/gowalla \
        --quality target/check.json

`--history` also measures users embedded from their training history (`history` instead of `user_id`), beside the
offline "users embedded from history" row. `--compare-history` reports how the two top-K lists of each user
differ (overlap, identical lists, score differences).

**Which users count** (the rule `check` applies too): the `user_id` figure averages over every test user (a user
with at least one test item); the `history` figure over the test users that also have at least one training item,
since an empty history cannot be embedded (the server refuses it). Both sides print how many users they counted.

**The offline figures** (`--quality`) are the LightGCN rows that `python -m recserve_models check --json` writes
(`{"lightgcn": [...]}`), or the demo's `quality.json`, which holds the same rows under `check`
(`{"check": {"lightgcn": [...]}}`); models/README.md describes the rows. The row of `--model` named like the model
is the `user_id` figure, the row named "MODEL, users embedded from history" the `history` figure.

**Pipelines** (`--pipeline NAME`): the same figures through `POST /v1/recommend/NAME` (recall, then rank, in the
server), beside the toolchain's offline figures of that pipeline: the demo's quality.json holds them under
`ranker.quality` (`python -m recserve_models demo` computes them through the served ranker's own graph), one row
per way of embedding the user (`users_from`: "user table", "history") and number of candidates. Each request sends
`user_id` (or, with `--history`, `history`), `k`, the user's training items in `exclude` and, with
`--send-history`, in `history` beside `user_id` too (a ranker with the `cooccurrence` candidate feature reads
it). The ranker's user side is `--user-field NAME=RULE` (repeatable), RULE one of `user_id` (the user's id; -1,
the unknown user, by history) and `activity` (the bucket of the user's training items, `min(floor(log2(1 + n)),
15)`, as the toolchain's Gowalla ranker reads it).

`--exact` or `--nprobe N` choose how a model with an IVF index searches (`exact` / `nprobe` in every request);
`--tolerance` widens the agreement (the offline figures are exact: 0.002 is issue 16's bound for the index).

Exit status: 0 when every figure measured agrees with its offline figure to 4 decimals (|difference| < 0.00005,
or `--tolerance`);
1 when one does not; 2 when the check cannot run, and also when it has nothing to compare a figure with (no offline
file, no row for the model, a different number of users, `--limit`, K other than 20), unless `--no-compare` asks
only to measure. A check that compares nothing never exits 0.

Standard library only (no numpy), so it runs from any Python 3.11.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

AGREE, DISAGREE, CANNOT_COMPARE = 0, 1, 2
OFFLINE_K = 20  # `check` reports Recall@20 and NDCG@20
TOLERANCE = 5e-5
HISTORY_VARIANT = "{model}, users embedded from history"
USERS_FROM = {"user_id": "user table", "history": "history"}  # the pipeline rows' `users_from`
ACTIVITY_BUCKETS = 16


class CannotCompare(Exception):
    """The measured figures have no offline figure to be compared with; the message says why."""


def read_split(path: Path) -> dict[int, list[int]]:
    """`user item item ...` per line -> {user: [items]}, refused as the toolchain refuses it."""
    out: dict[int, list[int]] = {}
    for number, line in enumerate(path.read_text(encoding="ascii").splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        try:
            ids = [int(p) for p in parts]
        except ValueError as e:
            raise SystemExit(f"{path}:{number}: expected integers: {e}") from e
        if ids[0] in out:
            raise SystemExit(
                f"{path}:{number}: user {ids[0]} has a second line (expected one line per user, "
                "'user item item ...': group a file of 'user item' pairs by user first)"
            )
        out[ids[0]] = ids[1:]
    return out


def counted_users(train: dict[int, list[int]], test: dict[int, list[int]]) -> tuple[list[int], list[int]]:
    """The users each figure averages over: (test users, test users with at least one training item)."""
    users = sorted(u for u, items in test.items() if items)
    return users, [u for u in users if train.get(u)]


@dataclass(frozen=True)
class Figure:
    """Recall@K and NDCG@K averaged over `users` users."""

    recall: float
    ndcg: float
    users: int


def offline_rows(document: object) -> list[dict]:
    """The LightGCN rows of a `check --json` document or of the demo's quality.json (the same rows, under
    `check`); raises `CannotCompare` for a document that holds neither."""
    if isinstance(document, dict):
        if isinstance(document.get("lightgcn"), list):
            return document["lightgcn"]
        inner = document.get("check")
        if isinstance(inner, dict) and isinstance(inner.get("lightgcn"), list):
            return inner["lightgcn"]
    raise CannotCompare(
        "holds no LightGCN figures: expected the output of `python -m recserve_models check --lightgcn-data DIR "
        '--json FILE` ({"lightgcn": [...]}) or the demo\'s quality.json ({"check": {"lightgcn": [...]}})'
    )


def offline_figures(path: Path, model: str, keys: list[str]) -> dict[str, dict]:
    """For each of `keys` (`user_id`, `history`), the offline row of `model` in `path`; raises `CannotCompare`."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CannotCompare(f"--quality {path}: cannot read the offline figures: {e}") from e
    try:
        rows = offline_rows(document)
    except CannotCompare as e:
        raise CannotCompare(f"--quality {path}: {e}") from e
    variants = {"user_id": model, "history": HISTORY_VARIANT.format(model=model)}
    found = {}
    for key in keys:
        row = next((r for r in rows if r.get("variant") == variants[key]), None)
        if row is None:
            known = ", ".join(repr(r.get("variant")) for r in rows) or "none"
            raise CannotCompare(
                f"--quality {path}: no offline figure for {key} of model {model!r} (a row named {variants[key]!r}); "
                f"its rows: {known}"
            )
        found[key] = row
    return found


def pipeline_figures(path: Path, candidates: int, keys: list[str]) -> dict[str, dict]:
    """For each of `keys`, the offline row of a pipeline recalling `candidates` items in the demo's quality.json
    (`ranker.quality`); raises `CannotCompare`."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CannotCompare(f"--quality {path}: cannot read the offline figures: {e}") from e
    rows = document.get("ranker", {}).get("quality") if isinstance(document, dict) else None
    if not isinstance(rows, list):
        raise CannotCompare(
            f"--quality {path}: holds no pipeline figures (the demo's quality.json has them under ranker.quality)"
        )
    found = {}
    for key in keys:
        wanted = USERS_FROM[key]
        row = next((r for r in rows if r.get("users_from") == wanted and r.get("candidates") == candidates), None)
        if row is None:
            raise CannotCompare(
                f"--quality {path}: no offline pipeline figure with users from {USERS_FROM[key]!r} and "
                f"{candidates} candidates"
            )
        found[key] = {**row, "variant": f"{row.get('pipeline')} ({row.get('users_from')})"}
    return found


def user_side(rules: dict[str, str], user: int | None, seen: list[int]) -> dict:
    """The ranking model's `user` of a recommend request: each field by its rule (`--user-field`)."""
    value = {
        "user_id": -1 if user is None else user,
        "activity": min(int(math.floor(math.log2(1 + len(seen)))), ACTIVITY_BUCKETS - 1),
    }
    return {"fields": {name: value[rule] for name, rule in rules.items()}}


def parse_user_fields(specs: list[str]) -> dict[str, str]:
    rules = {}
    for spec in specs:
        name, _, rule = spec.partition("=")
        if not name or rule not in ("user_id", "activity"):
            raise SystemExit(f"--user-field {spec!r}: expected NAME=user_id or NAME=activity")
        rules[name] = rule
    return rules


def compare(
    measured: dict[str, Figure],
    offline: dict[str, dict] | None,
    print_line: Callable[[str], None] = print,
    tolerance: float = TOLERANCE,
) -> int:
    """Prints each measured figure beside its offline row and returns the exit status: `DISAGREE` when a figure
    differs from its offline row by `tolerance` or more, else `CANNOT_COMPARE` when a figure has no offline row, an offline row has no
    measured figure, or the two sides counted different users, else `AGREE`. `offline=None` (`--no-compare`)
    prints the measured figures alone and returns `AGREE`."""
    print_line(
        f"{'users from':<10} {'users':>6} {'offline':>7} {'Recall@K':>10} {'offline':>10} {'NDCG@K':>10} "
        f"{'offline':>10}  {'agree to 4 decimals' if tolerance == TOLERANCE else f'agree within {tolerance:g}'}"
    )
    disagree = cannot = False
    for key in dict.fromkeys([*measured, *(offline or {})]):
        figure, ref = measured.get(key), (offline or {}).get(key)
        if figure is None:
            print_line(f"{key:<10} {'—':>6}  not compared: nothing measured (no test user to ask for)")
            cannot = True
            continue
        mine = f"{figure.recall:>10.6f}", f"{figure.ndcg:>10.6f}"
        if ref is None:
            why = "measured only (--no-compare)" if offline is None else "not compared: no offline figure"
            print_line(f"{key:<10} {figure.users:>6} {'—':>7} {mine[0]} {'—':>10} {mine[1]} {'—':>10}  {why}")
            cannot |= offline is not None
            continue
        recall, ndcg, users = ref.get(f"recall@{OFFLINE_K}"), ref.get(f"ndcg@{OFFLINE_K}"), ref.get("test_users")
        if not isinstance(recall, float) or not isinstance(ndcg, float) or not isinstance(users, int):
            print_line(
                f"{key:<10} {figure.users:>6}  not compared: the offline row {ref.get('variant')!r} lacks "
                f"recall@{OFFLINE_K}, ndcg@{OFFLINE_K} or test_users"
            )
            cannot = True
            continue
        line = f"{key:<10} {figure.users:>6} {users:>7} {mine[0]} {recall:>10.6f} {mine[1]} {ndcg:>10.6f}  "
        if users != figure.users:
            print_line(
                f"{line}not compared: {figure.users} users here, {users} offline (not the same split, or not the "
                "same rule for which users count)"
            )
            cannot = True
            continue
        ok = abs(figure.recall - recall) < tolerance and abs(figure.ndcg - ndcg) < tolerance
        disagree |= not ok
        print_line(
            f"{line}{'yes' if ok else 'NO'} (|Δ| {abs(figure.recall - recall):.1e}, {abs(figure.ndcg - ndcg):.1e})"
        )
    return DISAGREE if disagree else CANNOT_COMPARE if cannot else AGREE


class Client:
    """One keep-alive HTTP connection per thread."""

    def __init__(self, server: str) -> None:
        url = urlparse(server)
        if url.scheme != "http" or not url.hostname:
            raise SystemExit(f"--server {server!r}: expected http://HOST:PORT")
        self.host, self.port = url.hostname, url.port or 80
        self.local = threading.local()

    def post(self, path: str, body: dict) -> dict:
        data = json.dumps(body).encode()
        for attempt in range(2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
            try:
                conn.request("POST", path, body=data, headers={"content-type": "application/json"})
                response = conn.getresponse()
                text = response.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self.local.conn = None
                if attempt:
                    raise
                continue
            if response.status != 200:
                raise SystemExit(f"POST {path} {body if len(data) < 300 else '…'}: {response.status} {text[:500]!r}")
            return json.loads(text)
        raise AssertionError("unreachable")


def pipeline_candidates(server: str, name: str) -> int:
    """The `candidates` of pipeline `name`, from the server's `GET /v1/pipelines`."""
    url = urlparse(server)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port or 80, timeout=30)
    try:
        conn.request("GET", "/v1/pipelines")
        listed = json.loads(conn.getresponse().read())
    except (OSError, http.client.HTTPException, ValueError) as e:
        raise CannotCompare(f"GET {server}/v1/pipelines: {e}") from e
    finally:
        conn.close()
    for pipeline in listed.get("pipelines", []):
        if pipeline.get("name") == name:
            return int(pipeline["candidates"])
    raise CannotCompare(f"the server at {server} has no pipeline {name!r}")


def metrics(top: list[int], truth: list[int], k: int) -> tuple[float, float]:
    """Recall@k and NDCG@k of one user."""
    relevant = set(truth)
    hits = [1.0 if item in relevant else 0.0 for item in top[:k]]
    dcg = sum(h / math.log2(rank + 2) for rank, h in enumerate(hits))
    ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(len(truth), k)))
    return sum(hits) / len(truth), dcg / ideal


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8000", help="base URL of a running recserve")
    parser.add_argument("--model", default="lightgcn", help="the recall model's name in the repository")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/gowalla"), help="train.txt and test.txt")
    parser.add_argument(
        "--quality",
        type=Path,
        default=Path("models/demo/quality.json"),
        help="the offline figures: `check --json` output, or the demo's quality.json (default)",
    )
    parser.add_argument(
        "--no-compare", action="store_true", help="only measure: no offline figures needed, exit status 0"
    )
    parser.add_argument("--k", type=int, default=OFFLINE_K, help=f"K of Recall@K and NDCG@K (default {OFFLINE_K})")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N test users (0: all; with --no-compare)")
    parser.add_argument("--history", action="store_true", help="also measure users embedded from their history")
    parser.add_argument(
        "--compare-history",
        action="store_true",
        help="compare the user_id and history top K of each user (implies --history)",
    )
    parser.add_argument(
        "--pipeline", help="measure the recommend pipeline NAME (POST /v1/recommend/NAME) instead of the recall model"
    )
    parser.add_argument(
        "--send-history",
        action="store_true",
        help="--pipeline by user_id: also send the user's training items as history (for a cooccurrence feature)",
    )
    parser.add_argument(
        "--user-field",
        action="append",
        default=[],
        metavar="NAME=RULE",
        help="--pipeline: the ranker's user field NAME, RULE user_id or activity (repeatable)",
    )
    search = parser.add_mutually_exclusive_group()
    search.add_argument("--exact", action="store_true", help="send `exact: true`: score the whole catalogue")
    search.add_argument("--nprobe", type=int, help="send `nprobe`: lists of the model's IVF index to scan")
    parser.add_argument(
        "--tolerance",
        type=float,
        default=TOLERANCE,
        help=f"largest |difference| from an offline figure that agrees (default {TOLERANCE}, i.e. 4 decimals); e.g. "
        "0.002 for answers served through an IVF index, whose offline figures are exact",
    )
    args = parser.parse_args(argv)
    args.history |= args.compare_history
    rules = parse_user_fields(args.user_field)
    if (args.send_history or rules) and not args.pipeline:
        parser.error("--send-history and --user-field go with --pipeline")
    if args.pipeline and args.compare_history:
        parser.error("--compare-history compares recall lists: not with --pipeline")
    extra: dict = {"exact": True} if args.exact else {"nprobe": args.nprobe} if args.nprobe is not None else {}
    keys = ["user_id", "history"] if args.history else ["user_id"]
    offline: dict[str, dict] = {}
    if not args.no_compare:
        # Everything that makes a comparison impossible is found before the first request.
        why = None
        if args.limit:
            why = f"--limit {args.limit} measures a subset of the test users; the offline figures are over all of them"
        elif args.k != OFFLINE_K:
            why = f"--k {args.k}: the offline figures are @{OFFLINE_K}"
        try:
            if why:
                raise CannotCompare(why)
            if args.pipeline:
                offline = pipeline_figures(args.quality, pipeline_candidates(args.server, args.pipeline), keys)
            else:
                offline = offline_figures(args.quality, args.model, keys)
        except CannotCompare as e:
            print(f"recall-check: nothing to compare with: {e} (--no-compare only measures)", file=sys.stderr)
            return CANNOT_COMPARE
    try:
        train = read_split(args.data / "train.txt")
        test = read_split(args.data / "test.txt")
    except OSError as e:
        print(f"recall-check: cannot read the split in {args.data}: {e}", file=sys.stderr)
        return CANNOT_COMPARE
    users, history_users = counted_users(train, test)
    if args.limit:
        users = users[: args.limit]
        history_users = [u for u in history_users if u <= users[-1]] if users else []
    client = Client(args.server)
    path = f"/v1/recommend/{args.pipeline}" if args.pipeline else f"/v1/models/{args.model}/recall"

    def body(user: int | None, seen: list[int]) -> dict:
        query = {"user_id": user} if user is not None else {"history": seen}
        if args.pipeline:
            query["user"] = user_side(rules, user, seen)
            if user is not None and args.send_history and seen:
                query["history"] = seen
        return {**query, "k": args.k, "exclude": seen, **extra}

    def ask(user: int) -> tuple[int, dict, dict | None]:
        seen = train.get(user, [])
        by_id = client.post(path, body(user, seen))
        by_history = None
        if args.history and seen:
            by_history = client.post(path, body(None, seen))
        return user, by_id, by_history

    started = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        answers = list(pool.map(ask, users))
    seconds = time.perf_counter() - started
    if args.pipeline:
        first = answers[0][1] if answers else {}
        models = (first.get("recall_model"), first.get("ranking_model"))
        version = "; ".join(f"{m['name']} {m['version']}" for m in models if m)
    else:
        version = answers[0][1]["version"] if answers else "?"

    sums = {"user_id": [0.0, 0.0, 0], "history": [0.0, 0.0, 0]}
    overlap, same_list, same_set, diffs, compared = 0.0, 0, 0, [], 0
    for user, by_id, by_history in answers:
        ids = [item["id"] for item in by_id["items"]]
        r, n = metrics(ids, test[user], args.k)
        sums["user_id"][0] += r
        sums["user_id"][1] += n
        sums["user_id"][2] += 1
        if by_history is None:
            continue
        hist = [item["id"] for item in by_history["items"]]
        r, n = metrics(hist, test[user], args.k)
        sums["history"][0] += r
        sums["history"][1] += n
        sums["history"][2] += 1
        if args.compare_history:
            compared += 1
            overlap += len(set(ids) & set(hist)) / args.k
            same_list += ids == hist
            same_set += set(ids) == set(hist)
            scores = {item["id"]: item["score"] for item in by_history["items"]}
            diffs += [item["score"] - scores[item["id"]] for item in by_id["items"] if item["id"] in scores]

    requests = len(users) + (len(history_users) if args.history else 0)
    what = f"pipeline {args.pipeline!r} ({version})" if args.pipeline else f"model {args.model!r} version {version}"
    print(f"server {args.server}, {what}, K = {args.k}")
    print(
        f"{len(users)} test users, training items excluded; {requests} {'recommend' if args.pipeline else 'recall'} "
        f"requests in {seconds:.1f} s "
        f"({requests / max(seconds, 1e-9):.0f}/s at concurrency {args.concurrency})"
    )
    if args.history and len(history_users) < len(users):
        print(f"history: {len(users) - len(history_users)} test users without training items left out")
    measured = {
        key: Figure(sums[key][0] / sums[key][2], sums[key][1] / sums[key][2], sums[key][2])
        for key in keys
        if sums[key][2]
    }
    if extra:
        print(f"search: {extra}")
    status = compare(measured, None if args.no_compare else offline, tolerance=args.tolerance)
    if args.compare_history and compared:
        mean = sum(diffs) / len(diffs) if diffs else float("nan")
        spread = math.sqrt(sum((d - mean) ** 2 for d in diffs) / len(diffs)) if diffs else float("nan")
        print(f"user_id vs history top {args.k}, {compared} users:")
        print(
            f"  mean overlap {overlap / compared:.4f}, identical lists {same_list / compared:.4f}, "
            f"identical sets {same_set / compared:.4f}"
        )
        print(
            f"  score(user_id) − score(history) on items in both lists: mean {mean:.4f}, std {spread:.4f}, "
            f"over {len(diffs)} items"
        )
    if status == CANNOT_COMPARE:
        print("recall-check: a measured figure has nothing to be compared with (see above)", file=sys.stderr)
    return status


if __name__ == "__main__":
    sys.exit(main())
