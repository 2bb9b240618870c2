#!/usr/bin/env bash
# Model versions swapped while serving, measured (docs/deploy.md, "Swapping versions while serving"): the demo
# DeepFM in two versions (fp32 and int8) with 1 GiB of tables each, swapped SWAPS times through the repository
# API while recload drives rank and recall open loop at LOAD of the server's saturation; a checker compares every
# answer with the answer of the version that gave it; the server's resident memory is sampled. Writes the
# "Swapping versions under load" section of docs/benchmarks.md and exits non-zero when a request failed or an
# answer differed. scripts/swap_under_load.py does the work.
#
# Usage: scripts/swap-under-load.sh             (release build, about 5 minutes)
#        scripts/swap-under-load.sh --short     (CI: debug build, small tables, 2 swaps, no doc; under a minute)
# Environment: SWAPS [20] LOAD [0.7] TABLE_GIB [1] DURATION_S [30]
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh

work=$root/target/swap-under-load
rm -rf "$work"
mkdir -p "$work"
if [ "${1:-}" = "--short" ]; then
  cargo build --quiet -p recserve -p recload --bins
  bin=$root/target/debug
  exec python scripts/swap_under_load.py --recserve "$bin/recserve" --recload "$bin/recload" --work "$work" \
    --table-bytes $((16 << 20)) --swaps 2 --load 0.3 --duration 3 --saturation-s 2 \
    --default-deadline-ms 60000 --json "$work/report.json"
fi
cargo build --release --quiet -p recserve -p recload --bins
bin=$root/target/release
pin=()
[ "$(nproc)" -ge 2 ] && pin=(--pin)
python scripts/swap_under_load.py --recserve "$bin/recserve" --recload "$bin/recload" --work "$work" \
  --table-bytes "$(python -c "print(int(${TABLE_GIB:-1} * 2**30))")" --swaps "${SWAPS:-20}" --load "${LOAD:-0.7}" \
  --duration "${DURATION_S:-30}" "${pin[@]}" --doc docs/benchmarks.md --json "$work/report.json"
echo "swap-under-load: report in $work/report.json; docs/benchmarks.md updated" >&2
