#!/usr/bin/env bash
# The tail at fixed shares of saturation, and what server settings do to it (docs/benchmarks.md, "p99 at 70% of
# saturation"). recserve on CPU 1 (--executors 1 --intra-op-threads 1), recload on CPU 0. For each variant (a name
# and the extra `recserve serve` flags it runs with): the closed-loop saturation (64 in flight, 10 s), then ROUNDS
# rounds of an open loop at each of SHARES × that saturation (Poisson arrivals, 256 connections, 2 s timeout, 15 s).
# Prints per run the client's p50 / p99 and recload's own CPU and send delay (from recload's report), and from the
# server's /metrics over the run (its 2 s warm-up included): mean queue wait, mean batch (rows and requests), inference per 100 rows, and why
# batches closed. The first variant's saturation sets the rates of every variant, so they are compared at equal load.
#
# Usage: scripts/bench-tail.sh [NAME[:FLAGS]]...   (default: "defaults"; e.g. "no-delay:--max-queue-delay-us 0")
# Environment: REPOSITORY [target/bench-repo] MODEL [realistic-int8-split] SHARES ["0.5 0.7"] ROUNDS [2]
#   OUT [target/bench-tail] (recload's reports and the metrics)
# Writes target/bench-repo first if missing (`synth --preset realistic --split`).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
# shellcheck source=env.sh
source scripts/env.sh
REPOSITORY=${REPOSITORY:-target/bench-repo}
MODEL=${MODEL:-realistic-int8-split}
SHARES=${SHARES:-0.5 0.7}
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-target/bench-tail}
[ "$#" -gt 0 ] || set -- defaults
[ "$(nproc)" -ge 2 ] || { echo "bench-tail: needs 2 CPUs: recload on CPU 0, recserve on CPU 1" >&2; exit 1; }

if [ ! -d "$REPOSITORY/$MODEL" ]; then
  python -m recserve_models synth --preset realistic --split --out "$REPOSITORY" >&2
fi
cargo build --release --quiet -p recserve -p recload --bins
mkdir -p "$OUT"
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh

recload() { taskset -c 0 "$root/target/release/recload" run --url "$url" --model "$MODEL" --repository "$REPOSITORY" "$@"; }
# One line from a recload report and the server's metrics before and after its run.
summary() { # LABEL REPORT METRICS-BEFORE METRICS-AFTER
  python - "$@" <<'EOF'
import json, re, sys
label, report, before, after = sys.argv[1:]
model = json.load(open(report))["workload"]["path"].split("/")[3]
def read(path):
    values = {}
    for line in open(path):
        if line.startswith("#") or f'model="{model}"' not in line:
            continue
        key, value = line.rsplit(" ", 1)
        name = key.split("{")[0]
        if name.startswith("recserve_batches_total"):
            name = "closed on " + re.search(r'reason="(\w+)"', key).group(1)
        elif not name.endswith(("_sum", "_count")):
            continue
        values[name] = values.get(name, 0.0) + float(value)
    return values
a, b = read(before), read(after)
d = {k: v - a.get(k, 0.0) for k, v in b.items()}
def mean(name):
    count = d.get(f"{name}_count", 0.0)
    return d.get(f"{name}_sum", 0.0) / count if count else float("nan")
r = json.load(open(report))
lat = r["latency_ms"]
rows = mean("recserve_batch_rows")
per_request = mean("recserve_request_rows")
closed = ", ".join(f"{k} {v:.0f}" for k, v in sorted(d.items()) if k.startswith("closed on") and v)
print(f"{label}: offered {r['offered_rps']:.0f}/s, achieved {r['achieved_rps']:.0f}/s, "
      f"{r['requests']['errors']} failed · p50 {lat['p50_ms']:.2f} ms, p99 {lat['p99_ms']:.2f} ms · "
      f"recload CPU {100 * r['cpu_s'] / r['wall_s']:.0f}%, send delay p99 {r['send_delay_ms']['p99_ms']:.3f} ms · "
      f"server: queue wait {1e3 * mean('recserve_queue_duration_seconds'):.2f} ms, batch {rows:.0f} rows "
      f"({rows / per_request:.1f} requests), inference {1e5 * mean('recserve_inference_duration_seconds') / rows:.3f} ms "
      f"per 100 rows, {closed}")
EOF
}

saturation=""
for variant in "$@"; do
  name=${variant%%:*}
  flags=""
  [ "$name" = "$variant" ] || flags=${variant#*:}
  port=$(free_port)
  url=http://127.0.0.1:$port
  # shellcheck disable=SC2086
  taskset -c 1 "$root/target/release/recserve" serve --repository "$REPOSITORY" --http-addr "127.0.0.1:$port" \
    --grpc-addr "127.0.0.1:$(free_port)" --executors 1 --intra-op-threads 1 $flags > "$OUT/$name.log" 2>&1 &
  server_pid=$!
  wait_ready "$url/health/ready" "$OUT/$name.log"
  recload --closed --concurrency 64 --warmup 2s --duration 10s --quiet --json "$OUT/$name-closed.json" > /dev/null
  achieved=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["achieved_rps"])' "$OUT/$name-closed.json")
  : "${saturation:=$achieved}"
  echo "$name (${flags:-no extra flags}): closed-loop saturation $(printf '%.0f' "$achieved")/s; rates from $(printf '%.0f' "$saturation")/s"
  for round in $(seq "$ROUNDS"); do
    for share in $SHARES; do
      rate=$(python -c "print(round($saturation * $share))")
      run=$OUT/$name-$share-$round
      curl -s "$url/metrics" > "$run-before.prom"
      recload --rate "$rate" --connections 256 --timeout 2s --warmup 2s --duration 15s --quiet --json "$run.json" > /dev/null
      curl -s "$url/metrics" > "$run-after.prom"
      summary "  round $round, $share × saturation" "$run.json" "$run-before.prom" "$run-after.prom"
    done
  done
  stop_server
done
