#!/usr/bin/env bash
# Cold start of the Criteo-sized benchmark model (`synth --preset criteo-kaggle`: 33.8M rows of int8 tables,
# 0.84 GB, MLP 400×3, INT8 graph, random weights) with `--preload on` (the default) and `--preload off`, its table
# file dropped from the page cache first (cold) or read into it first (warm): ready time, RSS at ready, the first
# requests one at a time, a closed-loop run with RSS under load, and the same first requests again.
# recserve on CPU 1 (`--executors 1 --intra-op-threads 1`), the clients on CPU 0. scripts/cold_start.py does the
# measuring; its JSON and the servers' logs land in target/bench-cold-start/.
#
# Usage: scripts/bench-cold-start.sh   (about 5 minutes; writes the model into $REPOSITORY first if missing, ~4 min)
# Environment: REPOSITORY [target/bench-repo] ROUNDS [2] DURATION [10s] FIRST [100] CONCURRENCY [8]
set -euo pipefail
cd "$(dirname "$0")/.."

REPOSITORY=${REPOSITORY:-target/bench-repo}
model=criteo-kaggle-int8
results=target/bench-cold-start

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh
[ "$(nproc)" -ge 2 ] || { echo "bench-cold-start: needs 2 CPUs: the clients on CPU 0, recserve on CPU 1" >&2; exit 1; }
command -v fincore >/dev/null || { echo "bench-cold-start: needs fincore (util-linux)" >&2; exit 1; }

if [ ! -d "$REPOSITORY/$model" ]; then
  echo "bench-cold-start: writing the Criteo-sized model into $REPOSITORY (synth --preset criteo-kaggle)" >&2
  python -m recserve_models synth --preset criteo-kaggle --out "$REPOSITORY" >/dev/null
fi
cargo build --release --quiet -p recserve -p recload --bins
rm -rf "$results"
python scripts/cold_start.py --recserve target/release/recserve --recload target/release/recload \
  --repository "$REPOSITORY" --model "$model" --requests "$REPOSITORY/criteo-kaggle-requests.jsonl" \
  --out "$results" --rounds "${ROUNDS:-2}" --duration "${DURATION:-10s}" --first "${FIRST:-100}" \
  --concurrency "${CONCURRENCY:-8}"
