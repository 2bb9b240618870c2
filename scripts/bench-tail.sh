#!/usr/bin/env bash
# The tail at fixed shares of saturation, where its time goes inside the server, and what each change or setting
# does to it (docs/benchmarks.md, "The tail at 50% and 70% of saturation"). recserve on CPU 1 (`--executors 1
# --intra-op-threads 1`), recload on CPU 0.
#
# First the first variant's closed-loop saturation (64 in flight, 10 s, the median of 3 runs), which sets the
# rates of every variant, so they are compared at equal load; from the same runs, the server's own costs per
# request (its executor's and its I/O threads' CPU, recserve_thread_cpu_seconds_total) feed
# `scripts/tail-model.py`, whose p99 at each rate is the one-core bound. Then ROUNDS rounds; in each, every variant
# in turn is started fresh (A B C, A B C, ...) and run open loop at each of SHARES × saturation (Poisson arrivals,
# 256 connections, 2 s timeout, 2 s warm-up, DURATION). Per run: the client's p50 / p99 (recload), recload's CPU,
# the machine's steal over the run, and from the server (its /metrics before and after, and
# /debug/slow-requests after): the mean of each stage over all requests and over the slowest 1%, each thread
# role's CPU per request and run-queue wait, the mean batch and why batches closed. The report gives every figure
# per variant as the median / worst of the rounds, and is written to OUT/report.md and, with --doc, between its
# markers in docs/benchmarks.md.
#
# Usage: scripts/bench-tail.sh [--doc] VARIANT...    VARIANT: NAME[@BINARY][:SERVER FLAGS[:RECLOAD FLAGS]]
#   e.g. scripts/bench-tail.sh "before@/tmp/before/recserve" "now" "rows::--body rows" "nice-0:--executor-niceness 0"
#   BINARY: a recserve binary (default: this tree's release build, built first) - an earlier commit's build
#   measures what a change bought. RECLOAD FLAGS go to every `recload run` of the variant (default: the columnar
#   body, `--body columnar`; a binary without that form needs `--body rows`).
# Environment: REPOSITORY [target/bench-repo] MODEL [realistic-int8] SHARES ["0.5 0.7"] ROUNDS [3] DURATION [15s]
#   OUT [target/bench-tail] SECTION [MODEL] (the doc section's name) CLOSED_CONCURRENCY [64] (requests in flight of
#   the saturation runs: fewer for requests that cost many milliseconds, so that their queue stays within the
#   server's latency budget instead of being refused as predicted late and sent again at once)
# Writes REPOSITORY first if missing (`synth --preset realistic --split`). Takes about
# (1 + ROUNDS × variants × shares) × 20 s, plus 40 s of saturation runs: 12 minutes for 4 variants, 3 rounds.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
doc_args=()
if [ "${1:-}" = "--doc" ]; then doc_args=(--doc docs/benchmarks.md); shift; fi
[ "$#" -gt 0 ] || set -- now
# shellcheck source=env.sh
source scripts/env.sh
REPOSITORY=${REPOSITORY:-target/bench-repo}
MODEL=${MODEL:-realistic-int8}
SHARES=${SHARES:-0.5 0.7}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-15s}
OUT=${OUT:-target/bench-tail}
SECTION=${SECTION:-$MODEL}
CLOSED_CONCURRENCY=${CLOSED_CONCURRENCY:-64}
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
# recload on CPU 0, recserve on CPU 1.
cpu_layout one || { echo "bench-tail: needs 2 CPUs" >&2; exit 1; }
command_line="ROUNDS=$ROUNDS DURATION=$DURATION MODEL=$MODEL SHARES=\"$SHARES\""
[ "$CLOSED_CONCURRENCY" = 64 ] || command_line+=" CLOSED_CONCURRENCY=$CLOSED_CONCURRENCY"
command_line+=" scripts/bench-tail.sh"
[ ${#doc_args[@]} = 0 ] || command_line+=" --doc"
for v in "$@"; do command_line+=" \"$v\""; done

if [ ! -d "$REPOSITORY/$MODEL" ]; then
  python -m recserve_models synth --preset realistic --split --out "$REPOSITORY" >&2
fi
cargo build --release --quiet -p recserve -p recload --bins
rm -rf "$OUT"
mkdir -p "$OUT"

# Parses VARIANT into name, binary, server_flags, recload_flags.
parse() {
  local spec=$1 head rest
  head=${spec%%:*}
  rest=""; [ "$head" = "$spec" ] || rest=${spec#*:}
  name=${head%%@*}
  binary="$root/target/release/recserve"; [ "$name" = "$head" ] || binary=${head#*@}
  server_flags=${rest%%:*}
  recload_flags="--body columnar"; [ "$server_flags" = "$rest" ] || recload_flags=${rest#*:}
  [[ $name =~ ^[a-z0-9-]+$ ]] || { echo "bench-tail: variant name $name: use lowercase letters, digits and '-'" >&2; exit 2; }
  [ -x "$binary" ] || { echo "bench-tail: $binary is not an executable" >&2; exit 2; }
}

start() { # VARIANT LOG
  parse "$1"
  local port
  port=$(free_port)
  url=http://127.0.0.1:$port
  # shellcheck disable=SC2086
  start_server "$2" "$url/health/ready" "$binary" serve --repository "$REPOSITORY" --http-addr "127.0.0.1:$port" \
    --grpc-addr "127.0.0.1:$(free_port)" --executors 1 --intra-op-threads 1 --slow-requests 5000 $server_flags
}

run() { # PREFIX RECLOAD-ARGS...: one step, with the server's /metrics around it
  local prefix=$1; shift
  # shellcheck disable=SC2086
  python scripts/lib/step.py --out "$prefix.step.json" --metrics "$url/metrics" --prom "$prefix" -- \
    "${on_client[@]}" "$root/target/release/recload" run --url "$url" --model "$MODEL" --repository "$REPOSITORY" \
    --quiet --json "$prefix.json" $recload_flags "$@" > /dev/null
}

# Saturation: the first variant's, which sets every variant's rates, and the costs per request of the bound.
start "$1" "$OUT/saturation.log"
for i in 1 2 3; do
  run "$OUT/closed-$i" --closed --concurrency "$CLOSED_CONCURRENCY" --warmup 2s --duration 10s
done
stop_server
saturation=$(python - "$OUT" <<'EOF'
import json, statistics, sys
runs = [json.load(open(f"{sys.argv[1]}/closed-{i}.json")) for i in (1, 2, 3)]
failed = sum(r["requests"]["errors"] for r in runs)
if failed:
    # The saturation counts answers only; failures (refusals sent again at once) spend the server's CPU too.
    print(f"bench-tail: {failed} of {sum(r['requests']['sent'] for r in runs)} closed-loop requests failed: "
          "the saturation is not the server's (lower CLOSED_CONCURRENCY)", file=sys.stderr)
print(statistics.median(r["achieved_rps"] for r in runs))
EOF
)
echo "bench-tail: closed-loop saturation (median of 3): $(printf '%.0f' "$saturation")/s" >&2

for round in $(seq "$ROUNDS"); do
  for variant in "$@"; do
    parse "$variant"
    start "$variant" "$OUT/$name-$round.log"
    for share in $SHARES; do
      rate=$(python -c "print(round($saturation * $share))")
      prefix=$OUT/$name-$share-$round
      run "$prefix" --rate "$rate" --connections 256 --timeout 2s --warmup 2s --duration "$DURATION"
      scrape "$url/debug/slow-requests" "$prefix.slow.json"
      python - "$prefix.json" "$prefix.step.json" <<'EOF' >&2
import json, sys
r, s = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
l = r["latency_ms"]
print(f"bench-tail: {sys.argv[1].rsplit('/', 1)[1][:-5]}: offered {r['offered_rps']:.0f}/s, "
      f"p50 {l['p50_ms']:.2f} ms, p99 {l['p99_ms']:.2f} ms, {r['requests']['errors']} failed, "
      f"recload CPU {100 * r['cpu_s'] / r['wall_s']:.0f}%, steal {s['steal_s']:.2f} s")
EOF
    done
    stop_server
  done
done

variants=""
for v in "$@"; do parse "$v"; variants+="$name|$binary|$server_flags|$recload_flags"$'\n'; done
VARIANTS=$variants COMMAND_LINE=$command_line SATURATION=$saturation SHARES=$SHARES ROUNDS=$ROUNDS MODEL=$MODEL \
  CLOSED_CONCURRENCY=$CLOSED_CONCURRENCY \
  SECTION=$SECTION DURATION=$DURATION \
  python scripts/bench_tail_report.py --results "$OUT" "${doc_args[@]}"
