#!/usr/bin/env bash
# The split graph (`synth --split`, `[dense_graph.split]`: the user part once per request, the item part per
# candidate) against the whole graph, on the realistic synth model (26 fields × 16 factors, fp32 tables of up to 1M
# rows, MLP 429→400→400→400→1, random weights), one server core, side by side in one run:
#   1. the in-process ceiling (`recload ceiling`) at 1000-row batches of 100- and 1000-candidate requests, for the
#      plain graph (`realistic-int8`, what `synth` writes without --split), the split version's whole graph
#      (`--split-graph off`) and its parts (`on`), alternated ROUNDS times; FP32 once (plain and split);
#   2. the server's open-loop saturation (recload offers OVERLOAD × its closed-loop saturation) for the plain and
#      the split INT8 versions at 100 and 1000 candidates, with recload's own CPU use (user + system ÷ wall).
# Prints a markdown table (target/bench-split/table.md); reports in target/bench-split/.
#
# Usage: scripts/bench-split.sh   (about 6 minutes; writes target/bench-split-repo first if missing)
# Environment: REPOSITORY [target/bench-split-repo] DURATION [6s] WARMUP [2s] OVERLOAD [1.3] ROUNDS [2]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

REPOSITORY=${REPOSITORY:-target/bench-split-repo}
DURATION=${DURATION:-6s}
WARMUP=${WARMUP:-2s}
OVERLOAD=${OVERLOAD:-1.3}
ROUNDS=${ROUNDS:-2}
results=$root/target/bench-split

log() { echo "bench-split: $*" >&2; }

# shellcheck source=env.sh
source scripts/env.sh
if [ ! -d "$REPOSITORY/realistic-int8-split" ]; then
  log "writing the realistic model and its split versions into $REPOSITORY"
  python -m recserve_models synth --preset realistic --split --requests 200 --out "$REPOSITORY" >/dev/null
fi
rm -rf "$results"
mkdir -p "$results"
cargo build --release --quiet -p recserve -p recload --bins
recserve_bin=$root/target/release/recserve
recload_bin=$root/target/release/recload
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
# recload on CPU 0, recserve on CPU 1.
cpu_layout one
ceiling() { # OUT MODEL CANDIDATES FLAGS...
  local out=$1 model=$2 candidates=$3
  shift 3
  "${on_server[@]}" "$recload_bin" ceiling --repository "$REPOSITORY" --model "$model" --batch-rows 1000 \
    --candidates "$candidates" --warmup "$WARMUP" --duration "$DURATION" --json "$out.json" \
    --executors 1 --intra-op-threads 1 "$@" >&2
}
saturate() { # DIR MODEL CANDIDATES: closed loop, then open loop at OVERLOAD × that, recload timed
  local dir=$1 model=$2 candidates=$3 port url closed rate
  mkdir -p "$dir/repo"
  ln -sfn "$(cd "$REPOSITORY/$model" && pwd)" "$dir/repo/$model"
  port=$(free_port)
  url=http://127.0.0.1:$port
  start_server "$dir/recserve.log" "$url/health/ready" "$recserve_bin" serve --repository "$dir/repo" \
    --http-addr "127.0.0.1:$port" --grpc-addr "127.0.0.1:$(free_port)" --executors 1 --intra-op-threads 1
  "${on_client[@]}" "$recload_bin" run --url "$url" --model "$model" --repository "$dir/repo" --quiet \
    --json "$dir/closed.json" --candidates "$candidates" --closed --concurrency 64 --warmup "$WARMUP" \
    --duration "$DURATION" >&2
  closed=$(json_field "$dir/closed.json" achieved_rps)
  rate=$(python -c "print(max(1, round($closed * $OVERLOAD)))")
  log "$model, $candidates candidates: open loop at $rate/s"
  /usr/bin/time -f '%U %S %e' -o "$dir/open.time" "${on_client[@]}" "$recload_bin" run --url "$url" --model "$model" \
    --repository "$dir/repo" --quiet --json "$dir/open.json" --candidates "$candidates" --rate "$rate" \
    --connections 256 --timeout 2s --warmup "$WARMUP" --duration "$DURATION" >&2
  stop_server
}

for round in $(seq "$ROUNDS"); do
  for c in 100 1000; do
    log "ceiling, $c candidates, round $round"
    ceiling "$results/ceiling-int8-plain-c$c-r$round" realistic-int8 "$c"
    ceiling "$results/ceiling-int8-whole-c$c-r$round" realistic-int8-split "$c" --split-graph off
    ceiling "$results/ceiling-int8-split-c$c-r$round" realistic-int8-split "$c" --split-graph on
  done
done
for c in 100 1000; do
  ceiling "$results/ceiling-fp32-plain-c$c-r1" realistic-fp32 "$c"
  ceiling "$results/ceiling-fp32-split-c$c-r1" realistic-fp32-split "$c" --split-graph on
done
for c in 100 1000; do
  saturate "$results/server-plain-c$c" realistic-int8 "$c"
  saturate "$results/server-split-c$c" realistic-int8-split "$c"
done

python - "$results" "$ROUNDS" "$OVERLOAD" <<'PY' | tee "$results/table.md"
import json, statistics, sys
from pathlib import Path
results, rounds, overload = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def rows_per_s(name, r):
    return json.loads((results / f"{name}-r{r}.json").read_text())["batches"][0]["rows_per_s"]
def median(name, n):
    return statistics.median(rows_per_s(name, r) for r in range(1, n + 1))
print("In-process ceiling, 1000-row batches, one core (rows/s, median of rounds; requests/s = rows/s ÷ candidates):\n")
print("| graph | 100 candidates | 1000 candidates |")
print("| --- | ---: | ---: |")
for precision, n in (("int8", rounds), ("fp32", 1)):
    kinds = ("plain", "whole", "split") if precision == "int8" else ("plain", "split")
    label = {"plain": "plain graph (`synth`)", "whole": "split version, whole graph (`--split-graph off`)",
             "split": "split version, user + item parts (`on`)"}
    base = {c: median(f"ceiling-{precision}-plain-c{c}", n) for c in (100, 1000)}
    for kind in kinds:
        cells = []
        for c in (100, 1000):
            v = median(f"ceiling-{precision}-{kind}-c{c}", n)
            cells.append(f"{v:,.0f} ({v / base[c]:.2f}×)")
        print(f"| {precision.upper()} {label[kind]} | {' | '.join(cells)} |")
print(f"\nServer, INT8, open loop at {overload} × its closed-loop saturation, one server core:\n")
print("| version | candidates | offered req/s | answered req/s | p50 ms | p99 ms | recload CPU |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
for c in (100, 1000):
    for kind in ("plain", "split"):
        d = results / f"server-{kind}-c{c}"
        report = json.loads((d / "open.json").read_text())
        user, system, wall = map(float, (d / "open.time").read_text().split())
        lat = report["latency_ms"]
        print(f"| {kind} | {c} | {report['offered_rps']:,.0f} | "
              f"{report['achieved_rps']:,.0f} | {lat['p50_ms']:.2f} | {lat['p99_ms']:.2f} | "
              f"{(user + system) / wall:.0%} |")
PY
