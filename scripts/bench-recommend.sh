#!/usr/bin/env bash
# What a recommend call costs with the ranker's candidate features: the demo pipeline (`POST /v1/recommend/demo`,
# LightGCN recalls 100 Gowalla items, the ranker ranks them) of a BEFORE demo repository against the AFTER one,
# the same users, open loop at RATE, rounds interleaved (BEFORE then AFTER in each round, each on a freshly
# started server). recload on CPU 0, the server on CPU 1. Every request is a Gowalla training user by `user_id`
# with its training items (at most HISTORY_LEN) in `exclude`, and in `history` too where the side's ranker takes
# the `cooccurrence` candidate feature (which reads it); the ranker's user fields come from its model.toml
# (`user`: the user id; `activity`: the bucket of the history's length, fixed at ACTIVITY for every request).
# Beside every run: recload's CPU and the machine's steal (scripts/lib/step.py), and the server's own mean time per
# pipeline stage over the run (recserve_pipeline_stage_duration_seconds: recall, features, rank), which isolates
# what computing the candidate features costs from the rest. Prints the median and the worst of the rounds per
# side (never the best) and writes them, with every run's JSON, into RESULTS.
#
# Usage: scripts/bench-recommend.sh [BEFORE-REV]
#   BEFORE-REV  the git revision whose models/demo is BEFORE [default: 5d77fdb, the demo before issue 33's
#               candidate features]; AFTER is models/demo of the working tree. Both are served by this tree's
#               target/release/recserve. Needs release builds (cargo build --release -p recserve -p recload --bins)
#               and the Gowalla split (DATA).
# Environment (defaults in brackets): DATA [../shared/data/gowalla] RESULTS [target/bench-recommend] ROUNDS [3]
#   WARMUP [2s] DURATION [10s] RATE [200] CONNECTIONS [32] HISTORY_LEN [200] ACTIVITY [6]
set -euo pipefail
cd "$(dirname "$0")/.."
before_rev=${1:-5d77fdb}
DATA=${DATA:-../shared/data/gowalla}
RESULTS=${RESULTS:-$PWD/target/bench-recommend}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2s}
DURATION=${DURATION:-10s}
RATE=${RATE:-200}
CONNECTIONS=${CONNECTIONS:-32}
HISTORY_LEN=${HISTORY_LEN:-200}
ACTIVITY=${ACTIVITY:-6}

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh
[ -f "$DATA/train.txt" ] || { echo "bench-recommend: no Gowalla split in $DATA (train.txt): set DATA" >&2; exit 1; }
for bin in recserve recload; do
  [ -x "target/release/$bin" ] || { echo "bench-recommend: no target/release/$bin: build it first" >&2; exit 1; }
done
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
cpu_layout one || exit 1
rm -rf "$RESULTS"
mkdir -p "$RESULTS/before" "$RESULTS/after"
git archive "$before_rev" models/demo | tar -x -C "$RESULTS/before"
mkdir -p "$RESULTS/after/models"
cp -r models/demo "$RESULTS/after/models/"

# The recload flags a side's ranker needs: its user fields, and the history when it takes `cooccurrence`.
side_flags() { # DEMO-DIR
  python - "$1" "$ACTIVITY" <<'PY'
import sys, tomllib
from pathlib import Path

demo, activity = Path(sys.argv[1]), int(sys.argv[2])
config = tomllib.loads((demo / "recserve.toml").read_text())["pipelines"]["demo"]
ranker = max((demo / config["ranking_model"]).iterdir(), key=lambda p: int(p.name))
spec = tomllib.loads((ranker / "model.toml").read_text())
users = [f["name"] for f in spec["fields"] if f["side"] == "user"]
flags = ["--exclude-known"]
if "cooccurrence" in spec.get("ranking", {}).get("candidate_features", []):
    flags.append("--send-history")
fields = {}
for name in users:
    if name == "user":
        flags += ["--user-id-field", "user"]
    elif name == "activity":
        fields["activity"] = activity
    else:
        sys.exit(f"bench-recommend: the ranker's user field {name!r} has no rule here")
if fields:
    import json
    flags += ["--body-extra", json.dumps({"user": {"fields": fields}})]
print("\n".join(flags))
PY
}

for round in $(seq "$ROUNDS"); do
  for side in before after; do
    demo=$RESULTS/$side/models/demo
    mapfile -t flags < <(side_flags "$demo")
    http=$(free_port)
    start_server "$RESULTS/$side/server-$round.log" "http://127.0.0.1:$http/health/ready" target/release/recserve \
      serve --repository "$demo" --config "$demo/recserve.toml" --http-addr "127.0.0.1:$http" --executors 1 \
      --intra-op-threads 1
    out=$RESULTS/$side/round-$round
    python scripts/lib/step.py --out "$out.step.json" --metrics "http://127.0.0.1:$http/metrics" --prom "$out" \
      -- "${on_client[@]}" target/release/recload run \
      --url "http://127.0.0.1:$http" --workload recommend --pipeline demo --dataset "$DATA/train.txt" \
      --history-len "$HISTORY_LEN" --k 10 "${flags[@]}" --seed 1 --pool 1000 --rate "$RATE" \
      --connections "$CONNECTIONS" --warmup "$WARMUP" --duration "$DURATION" --timeout 2s --quiet \
      --json "$out.json" > /dev/null
    echo "$side: ${flags[*]}" > "$RESULTS/$side/flags.txt"
    stop_server
  done
done

python - "$RESULTS" "$ROUNDS" "$RATE" "$before_rev" <<'PY' | tee "$RESULTS/report.md"
import statistics, sys
from pathlib import Path

sys.path.insert(0, "scripts/lib")
import bench

STAGE = "recserve_pipeline_stage_duration_seconds"


def stage_ms(prefix: Path, stage: str) -> float:
    """The server's mean time of `stage` over one run, in ms, from its /metrics before and after."""
    before, after = (bench.samples(Path(f"{prefix}.{w}.prom").read_text()) for w in ("before", "after"))
    took = bench.total(after, f"{STAGE}_sum", stage=stage) - bench.total(before, f"{STAGE}_sum", stage=stage)
    count = bench.total(after, f"{STAGE}_count", stage=stage) - bench.total(before, f"{STAGE}_count", stage=stage)
    return 1e3 * took / count


results, rounds, rate, rev = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
print(f"POST /v1/recommend/demo, open loop at {rate}/s; median (worst) of {rounds} interleaved rounds; "
      f"before: models/demo at {rev}, after: models/demo of the working tree\n")
print("| side | recload flags | ok / sent | p50 ms | p99 ms | server recall / features / rank, mean ms | "
      "recload CPU (max) | steal s (max) |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
for side in ("before", "after"):
    runs = sorted(r for r in (results / side).glob("round-*.json") if not r.name.endswith(".step.json"))
    r = bench.Rounds.of(runs)
    flags = (results / side / "flags.txt").read_text().split(": ", 1)[1].strip()
    stages = " / ".join(
        f"{statistics.median(stage_ms(run.with_suffix(''), stage) for run in runs):.3f}"
        for stage in ("recall", "features", "rank")
    )
    print(f"| {side} | `{flags}` | {r.cells()} | {stages} | {r.load_cells()} |")
PY
