"""recserve's batch sizes over a run, from two scrapes of its /metrics (before and after).

    python batch_stats.py MODEL BEFORE.prom AFTER.prom
        →  {"batches", "rows", "mean_rows", "padding_rows", "execution_seconds"}

`recserve_batch_rows` counts the request rows of each executed batch (before padding to its bucket);
`recserve_batch_padding_rows_total` the rows added to reach the bucket; `recserve_batch_execution_seconds` the time
executors spent gathering and running batches (how busy they were). loadtest/peers/run.sh measures the in-process
ceiling at the mean batch size found here, so that serving efficiency compares like with like.
"""

from __future__ import annotations

import json
import re
import sys


def scrape(path: str, model: str) -> dict[str, float]:
    values = {}
    wanted = {
        "recserve_batch_rows_sum": "rows",
        "recserve_batch_rows_count": "batches",
        "recserve_batch_padding_rows_total": "padding_rows",
        "recserve_batch_execution_seconds_sum": "execution_seconds",
    }
    for line in open(path, encoding="utf-8"):
        m = re.match(r'^(\w+)\{([^}]*)\}\s+(\S+)$', line.strip())
        if m and m.group(1) in wanted and f'model="{model}"' in m.group(2):
            values[wanted[m.group(1)]] = float(m.group(3))
    return values


def main() -> None:
    model, before, after = sys.argv[1:4]
    a, b = scrape(before, model), scrape(after, model)
    delta = {k: b.get(k, 0.0) - a.get(k, 0.0) for k in ("rows", "batches", "padding_rows", "execution_seconds")}
    if delta["batches"] <= 0:
        sys.exit(f"batch_stats.py: no batch of model {model!r} was executed between the two scrapes")
    print(json.dumps({
        "batches": int(delta["batches"]),
        "rows": int(delta["rows"]),
        "mean_rows": delta["rows"] / delta["batches"],
        "padding_rows": int(delta["padding_rows"]),
        "execution_seconds": delta["execution_seconds"],
    }))


if __name__ == "__main__":
    main()
