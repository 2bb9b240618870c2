#!/usr/bin/env bash
# Dynamic batching, measured: recserve serving one DeepFM with batching off and on, driven open loop by recload at
# the same offered loads up to saturation, plus each mode's closed-loop saturation; then batching on under twice
# its saturation throughput for OVERLOAD_S seconds with a tight default deadline, sampling the server's resident
# memory every second, and a control run at the same rate in which every request is refused. Writes the "Dynamic batching" section of docs/benchmarks.md (between its markers) and
# leaves every recload report under target/bench-batching/.
#
# Usage: scripts/bench-batching.sh            (about 12 minutes)
# Environment: MODEL [deepfm] REPOSITORY [models/demo] CANDIDATES ["100 4"] LOADS [fractions of batching on's
#   saturation: "0.1 0.25 0.5 0.75 1 1.5"] DURATION [8s] WARMUP [2s] CONCURRENCY [64] OVERLOAD_S [60]
#   OVERLOAD_CANDIDATES [100] DEADLINE_MS [50] CONTROL_S [20] BENCH_NOTE [a line printed above the figures]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

MODEL=${MODEL:-deepfm}
REPOSITORY=${REPOSITORY:-models/demo}
CANDIDATES=${CANDIDATES:-100 4}
LOADS=${LOADS:-0.1 0.25 0.5 0.75 1 1.5}
DURATION=${DURATION:-8s}
WARMUP=${WARMUP:-2s}
CONCURRENCY=${CONCURRENCY:-64}
OVERLOAD_S=${OVERLOAD_S:-60}
CONTROL_S=${CONTROL_S:-20}
OVERLOAD_CANDIDATES=${OVERLOAD_CANDIDATES:-100}
DEADLINE_MS=${DEADLINE_MS:-50}
results=$root/target/bench-batching

log() { echo "bench-batching: $*" >&2; }
die() { echo "bench-batching: error: $*" >&2; exit 1; }

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh

[ -d "$REPOSITORY/$MODEL" ] || die "$REPOSITORY has no model $MODEL"
rm -rf "$results"
mkdir -p "$results/repo"
# A repository of just this model, so that the others in the directory take no memory or warm-up time.
ln -s "$(cd "$REPOSITORY/$MODEL" && pwd)" "$results/repo/$MODEL"

log "building recserve and recload (release)"
cargo build --release --quiet -p recserve -p recload --bins
recserve_bin=$root/target/release/recserve
recload_bin=$root/target/release/recload

# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
# recload on CPU 0, the server on the others (one executor per server core, one ONNX Runtime thread each).
cpu_layout rest
if [ -n "$server_cpus" ]; then
  pinning="recload on CPU 0, recserve on CPU $server_cpus ($server_cores core(s)), \`--executors $server_cores --intra-op-threads 1\`"
else
  pinning="no pinning (one CPU): recload and recserve share it"
fi

start_recserve() { # LOG FLAGS... → server_pid, url
  local log=$1 port
  shift
  port=$(free_port)
  url=http://127.0.0.1:$port
  start_server "$log" "$url/health/ready" "$recserve_bin" serve --repository "$results/repo" \
    --http-addr "127.0.0.1:$port" --grpc-addr "127.0.0.1:$(free_port)" --executors "$server_cores" \
    --intra-op-threads 1 "$@" || die "recserve did not start; log: $log"
}
recload() { # ARGS... (workload and target added)
  "${on_client[@]}" "$recload_bin" run --url "$url" --model "$MODEL" --repository "$results/repo" --quiet "$@" >&2
}

# --- batching off and on: saturation, then the same offered loads -------------------------------------------
for c in $CANDIDATES; do
  for mode in on off; do
    dir=$results/c$c-$mode
    mkdir -p "$dir"
    log "$c candidates, batching $mode: closed-loop saturation (concurrency $CONCURRENCY)"
    start_recserve "$dir/recserve.log" --batching "$mode"
    scrape "$url/metrics" "$dir/metrics-before.txt"
    recload --candidates "$c" --closed --concurrency "$CONCURRENCY" --warmup "$WARMUP" --duration "$DURATION" \
      --label "batching $mode" --json "$dir/saturation.json"
    scrape "$url/metrics" "$dir/metrics-saturation.txt"
    if [ "$mode" = on ]; then
      on_saturation=$(json_field "$dir/saturation.json" achieved_rps)
    fi
    for f in $LOADS; do
      rate=$(python -c "print(max(1, round($on_saturation * $f)))")
      log "$c candidates, batching $mode: open loop at $rate/s ($f × batching on's saturation)"
      recload --candidates "$c" --rate "$rate" --connections 256 --timeout 2s --warmup "$WARMUP" \
        --duration "$DURATION" --label "batching $mode" --json "$dir/open-$f.json"
    done
    stop_server
  done
done

# --- overload: twice batching on's saturation, deadline DEADLINE_MS ------------------------------------------
dir=$results/overload
mkdir -p "$dir"
sat=$(json_field "$results/c$OVERLOAD_CANDIDATES-on/saturation.json" achieved_rps)
rate=$(python -c "print(round(2 * $sat))")
log "overload: $rate/s (2 × $sat/s) for $OVERLOAD_S s, default deadline $DEADLINE_MS ms, batching on"
start_recserve "$dir/recserve.log" --batching on --default-deadline-ms "$DEADLINE_MS"
# The server's resident memory every second, the first sample (at ready) before the load starts.
python scripts/lib/bench.py sample-rss "$server_pid" "$dir/rss-kib.txt" --every 1 &
sampler=$!
until [ -s "$dir/rss-kib.txt" ] || ! kill -0 "$sampler" 2>/dev/null; do sleep 0.05; done
recload --candidates "$OVERLOAD_CANDIDATES" --rate "$rate" --connections 512 --timeout 2s --warmup 0s \
  --duration "${OVERLOAD_S}s" --settle-timeout 0s --label "overload" --json "$dir/run.json"
sleep 2
alive=false
kill -0 "$server_pid" 2>/dev/null && curl -sf -o /dev/null "$url/health/ready" && alive=true
scrape "$url/metrics" "$dir/metrics.txt" || true
kill "$sampler" 2>/dev/null || true
wait "$sampler" 2>/dev/null || true
stop_server

# --- control: the same rate with nothing executed ------------------------------------------------------------
# A 1 ms default deadline refuses every request at admission, so no inference runs: what a 429 takes here is the
# floor the transport, the generator and the machine set, to read the overload run's 429 figures against.
dir=$results/control
mkdir -p "$dir"
log "control: $rate/s for $CONTROL_S s, default deadline 1 ms (every request refused)"
start_recserve "$dir/recserve.log" --batching on --default-deadline-ms 1
recload --candidates "$OVERLOAD_CANDIDATES" --rate "$rate" --connections 512 --timeout 2s --warmup 2s \
  --duration "${CONTROL_S}s" --settle-timeout 0s --label "control" --json "$dir/run.json"
scrape "$url/metrics" "$dir/metrics.txt" || true
stop_server

python scripts/bench_batching_report.py --results "$results" --doc docs/benchmarks.md --candidates "$CANDIDATES" \
  --loads "$LOADS" --overload-candidates "$OVERLOAD_CANDIDATES" --deadline-ms "$DEADLINE_MS" \
  --overload-s "$OVERLOAD_S" --alive "$alive" --pinning "$pinning" --concurrency "$CONCURRENCY" \
  --note "${BENCH_NOTE:-}"
log "done: docs/benchmarks.md (dynamic batching section); reports in $results"
