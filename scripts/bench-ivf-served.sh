#!/usr/bin/env bash
# A 10M-item recall model served under load (issue 36, item 5): the synthetic catalogue of scripts/ivf-bench.sh
# (ITEMS × 64, CATALOGUE easy or hard) with its IVF index (CODES int8 or pq4), served at NPROBE lists a query, through
# scripts/bench-tail.sh twice: single users (`/v1` recall, one user a call) and batches of BATCH users a call
# (`recload --users-per-request`, the KServe v2 endpoint), each against its own closed-loop saturation (64 single
# calls in flight, BATCH_CONCURRENCY [8] batched ones), then ROUNDS rounds at SHARES of it: p50 / p99 median and worst, recload's CPU, the steal, the server's
# costs per call; one server core (`--executors 1 --intra-op-threads 1`), recload on the other. Then the batch's
# speed-up: users a second at saturation, batched against single.
#
# Generates the catalogue and builds its index when missing (as ivf-bench.sh does, into the same directories:
# target/ivf[-hard]-ITEMS[-pq4]); recall@100 at NPROBE over 1,000 users against exact search comes from
# examples/ivf_bench.rs, which also proves the served index answers exactly over what it probes (its tests).
#
# Usage: scripts/bench-ivf-served.sh [--doc]   (--doc: writes the sections "ivf-served-single" and
#   "ivf-served-batch" of docs/benchmarks.md)
# Environment: ITEMS [10000000] NLIST [8192] CATALOGUE [hard] CODES [int8] NPROBE [96] BATCH [32] ROUNDS [3]
#   SHARES ["0.5 0.7"] DURATION [15s] SEED [11] OUT [target/bench-ivf-served]
set -euo pipefail
cd "$(dirname "$0")/.."
ITEMS=${ITEMS:-10000000}
NLIST=${NLIST:-8192}
CATALOGUE=${CATALOGUE:-hard}
CODES=${CODES:-int8}
NPROBE=${NPROBE:-96}
BATCH=${BATCH:-32}
SEED=${SEED:-11}
OUT=${OUT:-target/bench-ivf-served}
doc=()
if [ "${1:-}" = "--doc" ]; then doc=(--doc); shift; fi
# shellcheck source=env.sh
source scripts/env.sh >/dev/null

suffix=$([[ $CODES == int8 ]] || echo "-$CODES")
case $CATALOGUE in
  easy) version=target/ivf-${ITEMS}${suffix}; spread=0.3 ;;
  hard) version=target/ivf-hard-${ITEMS}${suffix}; spread=${HARD_SPREAD:-0.45} ;;
  *) echo "bench-ivf-served: CATALOGUE must be easy or hard, not $CATALOGUE" >&2; exit 2 ;;
esac
if [[ ! -f $version/model.toml ]]; then
  nice -n 19 python scripts/ivf-synthetic.py models/demo/lightgcn/1 "$version" "$ITEMS" "$spread" \
    --catalogue "$CATALOGUE" --seed "$SEED"
fi
if ! grep -q '^\[recall.index\]' "$version/model.toml"; then
  nice -n 19 python -m recserve_models index "$version" --nlist "$NLIST" --codes "$CODES"
fi
users=$(python - "$version/model.toml" <<'PY'
import sys, tomllib
spec = tomllib.load(open(sys.argv[1], "rb"))
user = spec["recall"]["user_table"]
print(next(t["rows"] for t in spec["tables"] if t["name"] == user))
PY
)

# The version served: the catalogue's files, its model.toml with the index's nprobe set to NPROBE.
rm -rf "$OUT"
model=ivf-$CATALOGUE
served=$OUT/repo/$model/1
mkdir -p "$served"
for f in "$version"/*.safetensors; do ln -s "$(realpath "$f")" "$served/$(basename "$f")"; done
python - "$version/model.toml" "$served/model.toml" "$NPROBE" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
index = text.index("[recall.index]")
head, rest = text[:index], text[index:]
rest, n = re.subn(r"(?m)^nprobe = \d+$", f"nprobe = {sys.argv[3]}", rest, count=1)
if not n:
    rest = rest.replace("[recall.index]\n", f"[recall.index]\nnprobe = {sys.argv[3]}\n", 1)
open(sys.argv[2], "w").write(head + rest)
PY

echo "bench-ivf-served: $version ($CODES codes, nprobe $NPROBE): recall@100 over 1,000 users against exact search" >&2
cargo build --release --quiet --example ivf_bench
target/release/examples/ivf_bench "$served" --queries 1000 --exact-queries 1 --nprobe "$NPROBE" \
  --json "$OUT/recall.json" | tee "$OUT/recall.md" >&2

common="--workload recall --users $users --k 100"
REPOSITORY=$OUT/repo MODEL=$model OUT=$OUT/single SECTION=ivf-served-single \
  scripts/bench-tail.sh "${doc[@]}" "single::$common"
# 8 calls of BATCH users in flight at saturation: 64, the single users' figure, queue a second of work, over the
# server's latency budget, so nearly every call would be refused as predicted late (HTTP 429) and sent again.
REPOSITORY=$OUT/repo MODEL=$model OUT=$OUT/batch SECTION=ivf-served-batch CLOSED_CONCURRENCY=${BATCH_CONCURRENCY:-8} \
  scripts/bench-tail.sh "${doc[@]}" "batch-$BATCH::$common --users-per-request $BATCH"
python - "$OUT" "$BATCH" <<'PY'
import json, statistics, sys
out, batch = sys.argv[1], int(sys.argv[2])
sat = {k: statistics.median(json.load(open(f"{out}/{k}/closed-{i}.json"))["achieved_rps"] for i in (1, 2, 3))
       for k in ("single", "batch")}
print(f"bench-ivf-served: saturation, users a second (median of 3 closed-loop runs): single {sat['single']:,.0f}, "
      f"batches of {batch} {batch * sat['batch']:,.0f} ({sat['batch']:,.1f} calls/s): "
      f"{batch * sat['batch'] / sat['single']:.2f}x")
PY
