#!/usr/bin/env bash
# Serving efficiency and the user-side gather on a benchmark model of realistic size (`synth --preset realistic
# --split`: 26 fields × 16 factors, fp32 tables of up to 1M rows, 254 MiB, MLP 429→400→400→400→1, random weights),
# its INT8 and FP32 graphs, whole and split into a user and an item part, and the demo DeepFM (models/demo/deepfm),
# one server core. For each graph:
#   1. recserve's open-loop saturation: recload offers OVERLOAD × its closed-loop saturation (Poisson arrivals);
#      what it answers is the saturation throughput; the mean batch it executed is read from /metrics;
#   2. the in-process ceiling (`recload ceiling`, recserve's own gather + ONNX Runtime code, no server, the split
#      graph run as the server runs it) on the server's core at that batch size (rounded to whole requests) and at
#      one request per batch;
#   efficiency = 1 ÷ 2. recload's own CPU use is measured for every load run (user + system time ÷ wall time).
# Then the user-side gather (`--gather-user-once on|off`) side by side: the ceiling at 1000-row batches of 100- and
# 1000-candidate requests, on and off alternated ROUNDS times, and the server's open-loop saturation with each.
# Writes the "Realistic model" section of docs/benchmarks.md (between its markers); reports in target/bench-realistic/.
#
# Usage: scripts/bench-realistic.sh            (about 12 minutes; writes target/bench-repo first if missing)
# Environment: REPOSITORY [target/bench-repo] DURATION [8s] WARMUP [2s] OVERLOAD [1.3] ROUNDS [2]
#   CONNECTIONS [1024] recload's connections in open loop: more than the server's queue (256 requests), so that
#                      overload is refused by the server's admission (429) instead of waiting in recload's pool
#   BENCH_NOTE [a line printed above the figures, e.g. that the CPU was shared]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

REPOSITORY=${REPOSITORY:-target/bench-repo}
DURATION=${DURATION:-8s}
WARMUP=${WARMUP:-2s}
OVERLOAD=${OVERLOAD:-1.3}
ROUNDS=${ROUNDS:-2}
CONNECTIONS=${CONNECTIONS:-1024}
results=$root/target/bench-realistic

log() { echo "bench-realistic: $*" >&2; }
die() { echo "bench-realistic: error: $*" >&2; exit 1; }

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh

if [ ! -d "$REPOSITORY/realistic-int8-split" ]; then
  log "writing the realistic model into $REPOSITORY (python -m recserve_models synth --preset realistic --split)"
  rm -rf "$REPOSITORY"
  python -m recserve_models synth --preset realistic --split --out "$REPOSITORY" >/dev/null
fi
# The demo DeepFM beside it: where it lives.
repository_of() { if [ "$1" = deepfm ]; then echo models/demo; else echo "$REPOSITORY"; fi; }
rm -rf "$results"
mkdir -p "$results"

log "building recserve and recload (release)"
cargo build --release --quiet -p recserve -p recload --bins
recserve_bin=$root/target/release/recserve
recload_bin=$root/target/release/recload

# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
# recload on CPU 0, recserve on CPU 1.
cpu_layout one || die "needs 2 CPUs"
start_recserve() { # LOG MODEL FLAGS... → server_pid, url
  local log=$1 model=$2 port
  shift 2
  mkdir -p "$results/repo-$model"
  ln -sfn "$(cd "$(repository_of "$model")/$model" && pwd)" "$results/repo-$model/$model"
  port=$(free_port)
  url=http://127.0.0.1:$port
  start_server "$log" "$url/health/ready" "$recserve_bin" serve --repository "$results/repo-$model" \
    --http-addr "127.0.0.1:$port" --grpc-addr "127.0.0.1:$(free_port)" --executors 1 --intra-op-threads 1 "$@"
}
# recload run on CPU 0, timed: OUT.json and OUT.time ("user system wall" seconds of recload itself).
load() { # OUT MODEL ARGS...
  local out=$1 model=$2
  shift 2
  /usr/bin/time -f '%U %S %e' -o "$out.time" "${on_client[@]}" "$recload_bin" run --url "$url" --model "$model" \
    --repository "$results/repo-$model" --quiet --json "$out.json" "$@" >&2
}
ceiling() { # OUT MODEL ROWS CANDIDATES FLAGS...
  local out=$1 model=$2 rows=$3 candidates=$4
  shift 4
  "${on_server[@]}" "$recload_bin" ceiling --repository "$(repository_of "$model")" --model "$model" --batch-rows "$rows" \
    --candidates "$candidates" --warmup "$WARMUP" --duration "$DURATION" --json "$out.json" \
    --executors 1 --intra-op-threads 1 "$@" >&2
}
batch_rows() { # METRICS-BEFORE METRICS-AFTER → mean rows per executed batch between them
  python - "$1" "$2" <<'EOF'
import sys
sys.path.insert(0, "scripts/lib")
import bench
a, b = (bench.samples(open(path).read()) for path in sys.argv[1:3])
rows, count = (bench.total(b, name) - bench.total(a, name) for name in ("recserve_batch_rows_sum", "recserve_batch_rows_count"))
print(rows / count)
EOF
}

# saturate DIR MODEL CANDIDATES FLAGS...: closed loop, then open loop at OVERLOAD × that; metrics around the latter.
saturate() {
  local dir=$1 model=$2 candidates=$3 closed rate
  shift 3
  mkdir -p "$dir"
  start_recserve "$dir/recserve.log" "$model" "$@"
  load "$dir/closed" "$model" --candidates "$candidates" --closed --concurrency 64 --warmup "$WARMUP" \
    --duration "$DURATION"
  closed=$(json_field "$dir/closed.json" achieved_rps)
  rate=$(python -c "print(max(1, round($closed * $OVERLOAD)))")
  log "$model, $candidates candidates $*: open loop at $rate/s ($OVERLOAD × closed-loop $closed/s)"
  scrape "$url/metrics" "$dir/metrics-before.txt"
  load "$dir/open" "$model" --candidates "$candidates" --rate "$rate" --connections "$CONNECTIONS" --timeout 2s \
    --warmup "$WARMUP" --duration "$DURATION"
  scrape "$url/metrics" "$dir/metrics-after.txt"
  stop_server
  batch_rows "$dir/metrics-before.txt" "$dir/metrics-after.txt" > "$dir/batch-rows.txt"
}

# --- serving efficiency, INT8 and FP32 ------------------------------------------------------------------------
for model in realistic-int8 realistic-fp32 realistic-int8-split realistic-fp32-split deepfm; do
  dir=$results/$model
  saturate "$dir" "$model" 100
  rows=$(python -c "print(max(100, round(float(open('$dir/batch-rows.txt').read()) / 100) * 100))")
  log "$model: ceiling at $rows and 100 rows per batch"
  ceiling "$dir/ceiling" "$model" "$rows,100" 100
done

# --- the user-side gather, on and off, side by side -------------------------------------------------------------
for round in $(seq "$ROUNDS"); do
  for c in 100 1000; do
    for mode in on off; do
      log "user side $mode, $c candidates, round $round: ceiling at 1000-row batches"
      ceiling "$results/user-$mode-c$c-r$round" realistic-int8 1000 "$c" --gather-user-once "$mode"
    done
  done
done
for c in 100 1000; do
  for mode in on off; do
    saturate "$results/server-user-$mode-c$c" realistic-int8 "$c" --gather-user-once "$mode"
  done
done

python scripts/bench_realistic_report.py --results "$results" --repository "$REPOSITORY" --rounds "$ROUNDS" \
  --overload "$OVERLOAD" --connections "$CONNECTIONS" --doc docs/benchmarks.md --note "${BENCH_NOTE:-}"
log "done: docs/benchmarks.md (realistic model section); reports in $results"
