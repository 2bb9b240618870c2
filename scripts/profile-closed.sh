#!/usr/bin/env bash
# Where a server build spends its CPU at saturation: for each build directory, in turn and ROUNDS times
# (interleaved), a fresh server on CPU 1 under recload's closed loop (CLOSED_CONCURRENCY connections) on CPU 0,
# sampled by `perf record` (cpu-clock, PERF_HZ) for PROFILE of the run's middle. Prints per run the throughput,
# the samples (a saturated core gives about PERF_HZ x PROFILE), the share of each library (ONNX Runtime, recserve,
# kernel, libc) and of the server's layers (the connection layer, hyper, tokio's timers, the request decoders,
# the gather), and writes each run's `perf report` into RESULTS. Throughput per sample is the server's CPU per
# request: two builds that differ by X% in it spend X% more or less CPU on each request.
#
# Usage: scripts/profile-closed.sh MODEL DIR...
#   DIR  checkouts with their release build (target/release/recserve and recload); MODEL a model of REPOSITORY
# Environment (defaults in brackets): REPOSITORY [target/bench-repo] RESULTS [target/profile-closed] ROUNDS [2]
#   WARMUP [2s] DURATION [14s] PROFILE [8] PERF_HZ [1999] CLOSED_CONCURRENCY [64] CANDIDATES [100]
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 2 ] || { sed -n '2,12p' "$0" >&2; exit 2; }
model=$1
shift
REPOSITORY=${REPOSITORY:-target/bench-repo}
RESULTS=${RESULTS:-$PWD/target/profile-closed}
ROUNDS=${ROUNDS:-2}
WARMUP=${WARMUP:-2s}
DURATION=${DURATION:-14s}
PROFILE=${PROFILE:-8}
PERF_HZ=${PERF_HZ:-1999}
CLOSED_CONCURRENCY=${CLOSED_CONCURRENCY:-64}
CANDIDATES=${CANDIDATES:-100}
command -v perf > /dev/null || { echo "profile-closed: needs perf (apt-get install linux-perf)" >&2; exit 1; }
# shellcheck source=env.sh
source scripts/env.sh
[ -d "$REPOSITORY/$model" ] || { echo "profile-closed: no model $REPOSITORY/$model (scripts/bench-compare.sh writes it)" >&2; exit 1; }
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
cpu_layout one || exit 1
rm -rf "$RESULTS"
mkdir -p "$RESULTS"
repo=$RESULTS/repo
mkdir -p "$repo"
ln -sfn "$(cd "$REPOSITORY/$model" && pwd)" "$repo/$model"

for round in $(seq "$ROUNDS"); do
  i=0
  for dir in "$@"; do
    i=$((i + 1))
    dir=$(cd "$dir" && pwd)
    out=$RESULTS/build-$i-round-$round
    port=$(free_port)
    start_server "$out.server.log" "http://127.0.0.1:$port/health/ready" "$dir/target/release/recserve" serve \
      --repository "$repo" --http-addr "127.0.0.1:$port" --grpc-addr "127.0.0.1:$(free_port)" \
      --executors 1 --intra-op-threads 1
    "${on_client[@]}" "$dir/target/release/recload" run --url "http://127.0.0.1:$port" --model "$model" \
      --repository "$repo" --candidates "$CANDIDATES" --seed 1 --pool 1000 --warmup "$WARMUP" --timeout 2s \
      --duration "$DURATION" --closed --concurrency "$CLOSED_CONCURRENCY" --quiet --json "$out.closed.json" > /dev/null &
    load=$!
    sleep 4
    perf record -F "$PERF_HZ" -p "$server_pid" -o "$out.perf.data" -- sleep "$PROFILE" > /dev/null 2>&1
    wait "$load"
    stop_server
    perf report -i "$out.perf.data" --no-children --sort dso,sym --stdio 2> /dev/null | grep '%' > "$out.report.txt"
    python - "$out" "$dir" <<'PY'
import json, re, sys
out, build = sys.argv[1], sys.argv[2]
rps = json.load(open(out + ".closed.json"))["achieved_rps"]
rows = []
for line in open(out + ".report.txt"):
    m = re.match(r"\s*([\d.]+)%\s+(\S+)\s+\[.\]\s+(.*)", line)
    if m:
        rows.append((float(m.group(1)), m.group(2), m.group(3)))
def share(pred):
    return sum(p for p, dso, sym in rows if pred(dso, sym))
libs = {
    "onnxruntime": share(lambda d, s: "onnxruntime" in d),
    "recserve": share(lambda d, s: d == "recserve"),
    "kernel": share(lambda d, s: "kernel" in d),
    "libc": share(lambda d, s: d.startswith("libc")),
}
layers = {
    "connections": share(lambda d, s: "server::connections" in s),
    "hyper": share(lambda d, s: "hyper" in s),
    "tokio timers": share(lambda d, s: "tokio::time" in s or "tokio::runtime::time" in s),
    "decoders": share(lambda d, s: "rank_body" in s or "api::kserve" in s),
    "gather": share(lambda d, s: "gather" in s.lower()),
}
print(f"{build} {out.rsplit('/', 1)[1]}: {rps:.0f} requests/s; "
      + ", ".join(f"{k} {v:.1f}%" for k, v in libs.items()) + "; "
      + ", ".join(f"{k} {v:.2f}%" for k, v in layers.items()))
PY
    grep -m1 'of event' < <(perf report -i "$out.perf.data" --stdio 2> /dev/null) || true
  done
done
