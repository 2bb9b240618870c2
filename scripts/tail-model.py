#!/usr/bin/env python3
"""What latency one server core allows at a given load, from measured costs: a discrete-event model of recserve's
request path on one core, used to tell how much of a measured p99 is queueing that no implementation on that
core avoids, and how much is the server's to remove (docs/benchmarks.md, "p99 at 70% of saturation").

The model: Poisson arrivals at RATE; each request costs DECODE ms of transport on arrival and ENCODE ms when its
answer is sent, both taking the core before inference (recserve's executors run at a lower priority); one
executor that, when free, takes every queued request (at most MAX_BATCH) as one batch costing EXEC ms per
request; no other overhead (no wake-up latency, no cache effects, no padding). So its figures are a lower bound
for a server with these costs on one core.

Usage: scripts/tail-model.py --exec-ms 1.40 --decode-ms 0.22 --encode-ms 0.09 --rate 300,400,500
"""

from __future__ import annotations

import argparse
import collections
import random


def simulate(rate: float, exec_s: float, decode_s: float, encode_s: float, max_batch: int, n: int, seed: int):
    """Latencies (s) of `n` requests, from arrival to the answer's last transport work."""
    rng = random.Random(seed)
    arrivals, t = [], 0.0
    for _ in range(n):
        t += rng.expovariate(rate)
        arrivals.append(t)
    now, i = 0.0, 0
    transport: collections.deque = collections.deque()  # [remaining, kind, request], FIFO, before inference
    queued: list[int] = []
    batch: list[int] | None = None
    batch_left = 0.0
    latencies: list[float] = []
    while i < n or transport or queued or batch:
        next_arrival = arrivals[i] if i < n else float("inf")
        if transport:
            left, kind, request = transport[0]
            if now + left <= next_arrival:
                now += left
                transport.popleft()
                if kind == "decode":
                    queued.append(request)
                else:
                    latencies.append(now - arrivals[request])
            else:
                transport[0] = [left - (next_arrival - now), kind, request]
                now = next_arrival
                transport.append([decode_s, "decode", i])
                i += 1
            continue
        if batch is None and queued:
            batch, queued = queued[:max_batch], queued[max_batch:]
            batch_left = exec_s * len(batch)
        if batch is not None:
            if now + batch_left <= next_arrival:
                now += batch_left
                transport.extend([encode_s, "encode", r] for r in batch)
                batch = None
            else:
                batch_left -= next_arrival - now
                now = next_arrival
                transport.append([decode_s, "decode", i])
                i += 1
            continue
        now = max(now, next_arrival)
        transport.append([decode_s, "decode", i])
        i += 1
    return sorted(latencies)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--exec-ms", type=float, required=True, help="inference (gather + ONNX Runtime) per request")
    p.add_argument("--decode-ms", type=float, required=True, help="transport per request before it is queued")
    p.add_argument("--encode-ms", type=float, required=True, help="transport per request after its batch")
    p.add_argument("--rate", required=True, help="offered rates, requests/s, comma-separated")
    p.add_argument("--max-batch", type=int, default=10, help="requests per batch at most [10: 1024 rows of 100]")
    p.add_argument("--requests", type=int, default=200_000)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    per_request = a.exec_ms + a.decode_ms + a.encode_ms
    print(f"one core, {per_request:.3f} ms per request: saturation {1000 / per_request:.0f}/s")
    for rate in (float(r) for r in a.rate.split(",")):
        lat = simulate(rate, a.exec_ms / 1e3, a.decode_ms / 1e3, a.encode_ms / 1e3, a.max_batch, a.requests, a.seed)
        q = lambda f: 1e3 * lat[min(len(lat) - 1, int(f * len(lat)))]  # noqa: E731
        print(
            f"{rate:8.0f}/s ({rate * per_request / 10:.0f}% of the core): p50 {q(0.5):.2f} ms, p99 {q(0.99):.2f} ms, "
            f"p99.9 {q(0.999):.2f} ms"
        )


if __name__ == "__main__":
    main()
