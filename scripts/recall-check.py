#!/usr/bin/env python3
"""Recall@K and NDCG@K of a *running* recserve, measured through its recall endpoint, beside the toolchain's
offline figures for the same repository.

For every user with test items in a LightGCN split (`train.txt`, `test.txt`: `user item item ...`), it asks the
server for the user's top K (`POST /v1/models/MODEL/recall` with `user_id`, `k`, and the user's training items in
`exclude`), then averages Recall@K = |top K ∩ test| / |test| and NDCG@K (binary relevance, ideal DCG over
min(|test|, K) hits) over those users, exactly as `recserve_models.lightgcn.evaluate` does offline. The offline
figures come from the demo's `quality.json` (`check` rows of the same model). It starts nothing: point it at a
server that serves the model, e.g.

    target/release/recserve serve --repository models/demo --http-addr 127.0.0.1:8000 &
    python3 scripts/recall-check.py --server http://127.0.0.1:8000 --data ../shared/data/gowalla

`--history` also measures users embedded from their training history (`history` instead of `user_id`), beside the
offline "users embedded from history" row. `--compare-history` reports how the two top-K lists of each user
differ (overlap, identical lists, score differences). Exit status: 0 when every server figure agrees with its
offline figure to 4 decimals (|difference| < 0.00005), 1 when one does not, 2 when the check cannot run.

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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse


def read_split(path: Path) -> dict[int, list[int]]:
    """`user item item ...` per line -> {user: [items]}."""
    out: dict[int, list[int]] = {}
    for number, line in enumerate(path.read_text(encoding="ascii").splitlines(), start=1):
        parts = line.split()
        if not parts:
            continue
        try:
            ids = [int(p) for p in parts]
        except ValueError as e:
            raise SystemExit(f"{path}:{number}: expected integers: {e}") from e
        out[ids[0]] = ids[1:]
    return out


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


def metrics(top: list[int], truth: list[int], k: int) -> tuple[float, float]:
    """Recall@k and NDCG@k of one user."""
    relevant = set(truth)
    hits = [1.0 if item in relevant else 0.0 for item in top[:k]]
    dcg = sum(h / math.log2(rank + 2) for rank, h in enumerate(hits))
    ideal = sum(1.0 / math.log2(rank + 2) for rank in range(min(len(truth), k)))
    return sum(hits) / len(truth), dcg / ideal


def offline(quality: Path, variant: str) -> dict | None:
    """The `check` row of `quality.json` named `variant`, if any."""
    if not quality.is_file():
        return None
    rows = json.loads(quality.read_text(encoding="utf-8")).get("check", {}).get("lightgcn", [])
    return next((r for r in rows if r.get("variant") == variant), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--server", default="http://127.0.0.1:8000", help="base URL of a running recserve")
    parser.add_argument("--model", default="lightgcn", help="the recall model's name in the repository")
    parser.add_argument("--data", type=Path, default=Path("../shared/data/gowalla"), help="train.txt and test.txt")
    parser.add_argument(
        "--quality", type=Path, default=Path("models/demo/quality.json"), help="the toolchain's offline figures"
    )
    parser.add_argument("--k", type=int, default=20, help="K of Recall@K and NDCG@K (default 20)")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight (default 8)")
    parser.add_argument("--limit", type=int, default=0, help="only the first N test users (0: all)")
    parser.add_argument("--history", action="store_true", help="also measure users embedded from their history")
    parser.add_argument(
        "--compare-history",
        action="store_true",
        help="compare the user_id and history top K of each user (implies --history)",
    )
    args = parser.parse_args()
    args.history |= args.compare_history
    try:
        train = read_split(args.data / "train.txt")
        test = read_split(args.data / "test.txt")
    except OSError as e:
        print(f"recall-check: cannot read the split in {args.data}: {e}", file=sys.stderr)
        return 2
    users = sorted(u for u, items in test.items() if items)
    if args.limit:
        users = users[: args.limit]
    client = Client(args.server)
    path = f"/v1/models/{args.model}/recall"

    def ask(user: int) -> tuple[int, dict, dict | None]:
        seen = train.get(user, [])
        by_id = client.post(path, {"user_id": user, "k": args.k, "exclude": seen})
        by_history = None
        if args.history:
            by_history = client.post(path, {"history": seen, "k": args.k, "exclude": seen}) if seen else None
        return user, by_id, by_history

    started = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        answers = list(pool.map(ask, users))
    seconds = time.perf_counter() - started
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

    requests = len(users) * (2 if args.history else 1)
    print(f"server {args.server}, model {args.model!r} version {version}, K = {args.k}")
    print(
        f"{len(users)} test users, training items excluded; {requests} recall requests in {seconds:.1f} s "
        f"({requests / seconds:.0f}/s at concurrency {args.concurrency})"
    )
    disagree = False
    rows = [("user_id", args.model)]
    if args.history:
        rows.append(("history", f"{args.model}, users embedded from history"))
    print(f"{'users from':<12} {'Recall@K':>10} {'offline':>10} {'NDCG@K':>10} {'offline':>10}  agree to 4 decimals")
    for key, variant in rows:
        recall_sum, ndcg_sum, count = sums[key]
        if not count:
            continue
        recall, ndcg = recall_sum / count, ndcg_sum / count
        ref = offline(args.quality, variant)
        if ref is None or args.limit or ref.get("test_users") != count or args.k != 20:
            why = "no offline figure" if ref is None else "the offline figure is @20 over every test user"
            print(f"{key:<12} {recall:>10.6f} {'—':>10} {ndcg:>10.6f} {'—':>10}  ({why}: {variant!r})")
            continue
        ok = abs(recall - ref["recall@20"]) < 5e-5 and abs(ndcg - ref["ndcg@20"]) < 5e-5
        disagree |= not ok
        print(
            f"{key:<12} {recall:>10.6f} {ref['recall@20']:>10.6f} {ndcg:>10.6f} {ref['ndcg@20']:>10.6f}  "
            f"{'yes' if ok else 'NO'} (|Δ| {abs(recall - ref['recall@20']):.1e}, {abs(ndcg - ref['ndcg@20']):.1e})"
        )
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
    return 1 if disagree else 0


if __name__ == "__main__":
    sys.exit(main())
