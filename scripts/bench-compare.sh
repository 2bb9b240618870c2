#!/usr/bin/env bash
# What a change to the server costs or buys: the same measurements of two recserve builds, interleaved round by
# round (A then B in each round), on one model, one server core (recload on CPU 0, the server on CPU 1). In each
# round, for each build: a fresh server; its closed-loop saturation (recload, CLOSED_CONCURRENCY connections);
# fixed-rate open-loop runs at LOW_RATE/s and at SHARES of build A's first saturation (the same offered rates for
# both builds); and `recload ceiling` (the executors' compute path without the server) at CEILING_ROWS-row batches.
# Beside every step: recload's CPU and the machine's steal (scripts/lib/step.py). Prints the median and the worst
# of the rounds per build (never the best) and writes them, with every run's JSON, into RESULTS.
#
# Usage: scripts/bench-compare.sh A_DIR B_DIR [MODEL...]
#   A_DIR, B_DIR   checkouts of the two versions, each with its release build (target/release/recserve and
#                  recload); A is the baseline
#   MODEL          models of REPOSITORY [default: realistic-int8 realistic-fp32]; REPOSITORY is written as
#                  scripts/bench-realistic.sh writes it when missing
# Environment (defaults in brackets): REPOSITORY [target/bench-repo] RESULTS [target/bench-compare] ROUNDS [3]
#   WARMUP [2s] DURATION [10s] LOW_RATE [100] SHARES ["0.5 0.7"] CLOSED_CONCURRENCY [64] CONNECTIONS [256]
#   CANDIDATES [100] CEILING_ROWS [100]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

[ $# -ge 2 ] || { sed -n '2,16p' "$0" >&2; exit 2; }
a_dir=$(cd "$1" && pwd)
b_dir=$(cd "$2" && pwd)
shift 2
models=${*:-realistic-int8 realistic-fp32}
REPOSITORY=${REPOSITORY:-target/bench-repo}
RESULTS=${RESULTS:-$root/target/bench-compare}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2s}
DURATION=${DURATION:-10s}
LOW_RATE=${LOW_RATE:-100}
SHARES=${SHARES:-0.5 0.7}
CLOSED_CONCURRENCY=${CLOSED_CONCURRENCY:-64}
CONNECTIONS=${CONNECTIONS:-256}
CANDIDATES=${CANDIDATES:-100}
CEILING_ROWS=${CEILING_ROWS:-100}

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh
if [ ! -d "$REPOSITORY" ]; then
  echo "bench-compare: writing the realistic models into $REPOSITORY (python -m recserve_models synth --preset realistic --split)" >&2
  python -m recserve_models synth --preset realistic --split --out "$REPOSITORY" >/dev/null
fi
REPOSITORY=$(cd "$REPOSITORY" && pwd)
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
cpu_layout one || exit 1
for dir in "$a_dir" "$b_dir"; do
  for bin in recserve recload; do
    [ -x "$dir/target/release/$bin" ] || { echo "bench-compare: no $dir/target/release/$bin: build it first" >&2; exit 1; }
  done
done
rm -rf "$RESULTS"
mkdir -p "$RESULTS"

timing=(--warmup "$WARMUP" --timeout 2s --connections "$CONNECTIONS" --quiet)
step() { # OUT COMMAND...
  local out=$1; shift
  python scripts/lib/step.py --out "$out.step.json" -- "$@" > /dev/null
}

for model in $models; do
  # A repository of the one model: the server loads only it, recload reads its fields from it.
  repo=$RESULTS/repo-$model
  [ -d "$REPOSITORY/$model" ] || { echo "bench-compare: no model $REPOSITORY/$model" >&2; exit 1; }
  mkdir -p "$repo"
  ln -sfn "$REPOSITORY/$model" "$repo/$model"
  common=(--model "$model" --repository "$repo" --candidates "$CANDIDATES" --seed 1 --pool 1000)
  rates=""
  for round in $(seq "$ROUNDS"); do
    for build in a b; do
      dir=$a_dir; [ $build = b ] && dir=$b_dir
      out=$RESULTS/$model/$build/round-$round
      mkdir -p "$out"
      port=$(free_port)
      url="http://127.0.0.1:$port"
      start_server "$out/server.log" "$url/health/ready" "$dir/target/release/recserve" serve \
        --repository "$repo" --http-addr "127.0.0.1:$port" --grpc-addr "127.0.0.1:$(free_port)" \
        --executors 1 --intra-op-threads 1
      recload=("${on_client[@]}" "$dir/target/release/recload")
      step "$out/closed" "${recload[@]}" run --url "$url" "${common[@]}" "${timing[@]}" --duration "$DURATION" \
        --closed --concurrency "$CLOSED_CONCURRENCY" --json "$out/closed.json"
      if [ -z "$rates" ]; then
        rates=$(python - "$out/closed.json" "$LOW_RATE" "$SHARES" <<'PY'
import json, sys
saturation = json.load(open(sys.argv[1]))["achieved_rps"]
print(" ".join([sys.argv[2]] + [str(round(float(s) * saturation)) for s in sys.argv[3].split()]))
PY
)
        echo "bench-compare: $model: rates $rates (A's first saturation)" >&2
      fi
      for rate in $rates; do
        step "$out/rate-$rate" "${recload[@]}" run --url "$url" "${common[@]}" "${timing[@]}" \
          --duration "$DURATION" --rate "$rate" --json "$out/rate-$rate.json"
      done
      stop_server
      "${on_server[@]}" "$dir/target/release/recload" ceiling --repository "$repo" --model "$model" \
        --candidates "$CANDIDATES" --batch-rows "$CEILING_ROWS" --warmup "$WARMUP" --duration "$DURATION" \
        --seed 1 --json "$out/ceiling.json" > /dev/null
    done
  done
done

python - "$RESULTS" "$a_dir" "$b_dir" "$ROUNDS" <<'PY' | tee "$RESULTS/report.md"
import json, statistics, sys
from pathlib import Path

results, a_dir, b_dir, rounds_run = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]

def most(values):
    return f"{max(values):.2f}" if values else "–"

def load(path):
    return json.loads(path.read_text())

print(f"A = {a_dir}, B = {b_dir}; median / worst of {rounds_run} interleaved rounds; ceiling in requests/s\n")
for model in sorted(p for p in results.iterdir() if p.is_dir() and not p.name.startswith("repo-")):
    print(f"### {model.name}\n")
    print("| step | A median | A worst | B median | B worst | B / A (median) | recload CPU (max) | steal s (max) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    rounds = {b: sorted((model / b).glob("round-*")) for b in ("a", "b")}
    names = {p.name[:-5] for p in rounds["a"][0].glob("*.json") if not p.name.endswith(".step.json")}
    # closed, the fixed rates from the lowest, the ceiling
    steps = sorted(names, key=lambda n: (n == "ceiling", float(n[5:]) if n.startswith("rate-") else -1.0))
    for name in steps:
        for metric, key, higher_is_worse in [("throughput", "achieved_rps", False), ("p50 ms", "p50_ms", True), ("p99 ms", "p99_ms", True)]:
            if name == "ceiling" and metric != "throughput":
                continue
            values, cpu, steal = {}, [], []
            for b in ("a", "b"):
                vs = []
                for r in rounds[b]:
                    d = load(r / f"{name}.json")
                    if name == "ceiling":
                        vs.append(d["batches"][0]["requests_per_s"])
                        continue
                    vs.append(d[key] if key == "achieved_rps" else d["latency_ms"][key])
                    s = load(r / f"{name}.step.json")
                    cpu.append(d["cpu_s"] / d["wall_s"])
                    if s.get("steal_s") is not None:
                        steal.append(s["steal_s"])
                values[b] = vs
            worst = max if higher_is_worse else min
            ma, mb = statistics.median(values["a"]), statistics.median(values["b"])
            print(f"| {name} {metric} | {ma:.4g} | {worst(values['a']):.4g} | {mb:.4g} | {worst(values['b']):.4g} | "
                  f"{mb / ma:.3f} | {most(cpu)} | {most(steal)} |")
    print()
PY
