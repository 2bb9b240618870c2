#!/usr/bin/env bash
# What the protocol costs: the same rank requests to one server over KServe v2 HTTP (binary tensors,
# `--envelope kserve-v2-tensors`) and KServe v2 gRPC (`--envelope kserve-v2-grpc`, raw_input_contents), interleaved
# round by round (HTTP then gRPC in each round), open loop at RATE, recload on CPU 0 and one server on CPU 1
# (`--executors 1 --intra-op-threads 1`), per model. Beside every run: recload's CPU (share of one core) and the
# machine's steal (scripts/lib/step.py). Prints the median and the worst of the rounds per envelope (never the
# best) and writes them, with every run's JSON, into RESULTS.
#
# Usage: scripts/bench-envelopes.sh [MODEL...]
#   MODEL  models of REPOSITORY [default: realistic-int8]; REPOSITORY is written as scripts/bench-realistic.sh
#          writes it when missing. Needs release builds (cargo build --release -p recserve -p recload --bins).
# Environment (defaults in brackets): REPOSITORY [target/bench-repo] RESULTS [target/bench-envelopes] ROUNDS [3]
#   WARMUP [2s] DURATION [10s] RATE [500] CANDIDATES [100] CONNECTIONS [64]
set -euo pipefail
cd "$(dirname "$0")/.."
models=${*:-realistic-int8}
REPOSITORY=${REPOSITORY:-target/bench-repo}
RESULTS=${RESULTS:-$PWD/target/bench-envelopes}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2s}
DURATION=${DURATION:-10s}
RATE=${RATE:-500}
CANDIDATES=${CANDIDATES:-100}
CONNECTIONS=${CONNECTIONS:-64}

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh
if [ ! -d "$REPOSITORY" ]; then
  echo "bench-envelopes: writing the realistic models into $REPOSITORY (python -m recserve_models synth --preset realistic --split)" >&2
  python -m recserve_models synth --preset realistic --split --out "$REPOSITORY" >/dev/null
fi
REPOSITORY=$(cd "$REPOSITORY" && pwd)
for bin in recserve recload; do
  [ -x "target/release/$bin" ] || { echo "bench-envelopes: no target/release/$bin: build it first" >&2; exit 1; }
done
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
cpu_layout one || exit 1
rm -rf "$RESULTS"
mkdir -p "$RESULTS"

for model in $models; do
  [ -d "$REPOSITORY/$model" ] || { echo "bench-envelopes: no model $REPOSITORY/$model" >&2; exit 1; }
  repo=$RESULTS/repo-$model
  mkdir -p "$repo"
  ln -sfn "$REPOSITORY/$model" "$repo/$model"
  http=$(free_port)
  grpc=$(free_port)
  start_server "$RESULTS/$model.server.log" "http://127.0.0.1:$http/health/ready" target/release/recserve serve \
    --repository "$repo" --http-addr "127.0.0.1:$http" --grpc-addr "127.0.0.1:$grpc" --executors 1 \
    --intra-op-threads 1
  for round in $(seq "$ROUNDS"); do
    for envelope in kserve-v2-tensors kserve-v2-grpc; do
      url="http://127.0.0.1:$http"
      [ "$envelope" = kserve-v2-grpc ] && url="http://127.0.0.1:$grpc"
      out=$RESULTS/$model/$envelope/round-$round
      mkdir -p "$(dirname "$out")"
      python scripts/lib/step.py --out "$out.step.json" -- "${on_client[@]}" target/release/recload run \
        --url "$url" --envelope "$envelope" --model "$model" --repository "$repo" --candidates "$CANDIDATES" \
        --seed 1 --pool 1000 --rate "$RATE" --connections "$CONNECTIONS" --warmup "$WARMUP" \
        --duration "$DURATION" --timeout 2s --quiet --json "$out.json" > /dev/null
    done
  done
  stop_server
done

python - "$RESULTS" "$ROUNDS" "$RATE" <<'PY' | tee "$RESULTS/report.md"
import sys
from pathlib import Path

sys.path.insert(0, "scripts/lib")
from bench import Rounds

results, rounds, rate = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
print(f"KServe v2 HTTP (binary tensors) against gRPC, open loop at {rate}/s; median / worst of {rounds} interleaved rounds\n")
print("| model | envelope | ok / sent | p50 ms | p99 ms | recload CPU (max) | steal s (max) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for model in sorted(p for p in results.iterdir() if p.is_dir() and not p.name.startswith("repo-")):
    for envelope in ("kserve-v2-tensors", "kserve-v2-grpc"):
        r = Rounds.under(model / envelope)
        print(f"| {model.name} | {envelope} | {r.cells()} | {r.load_cells()} |")
PY
