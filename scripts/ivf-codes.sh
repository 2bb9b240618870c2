#!/usr/bin/env bash
# int8 against pq4 codes of the IVF index on one catalogue, in interleaved rounds: builds both indexes (through
# scripts/ivf-bench.sh, build time and peak RSS in target/ivf-bench/ITEMS[-pq4]/build.log), then ROUNDS times runs
# scripts/ivf-bench.sh (one round of the easy catalogue, SKIP_PEERS=1, pinned to one core) for int8 then pq4,
# recording the load average and the
# steal time of each run beside it, and prints QPS at recall@100 0.90 / 0.95 / 0.99 (median and worst of the
# rounds; in each round the QPS of the smallest swept nprobe that reaches the recall), index size and build time
# (scripts/ivf-codes-summary.py).
#
#   scripts/ivf-codes.sh [ITEMS] [NLIST]      (defaults 1000000 2048)
#
# Environment: ROUNDS (3), NPROBES (the sweep), and those of scripts/ivf-bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
items=${1:-1000000}
nlist=${2:-2048}
rounds=${ROUNDS:-3}
export NPROBES=${NPROBES:-1,2,3,4,6,8,12,16,24,32,48,64,96,128,192,256}
out=target/ivf-bench/codes-${items}
mkdir -p "$out"
steal() { awk '/^cpu /{print $9}' /proc/stat; }
for round in $(seq 1 "$rounds"); do
    for codes in int8 pq4; do
        before=$(steal)
        load=$(cut -d' ' -f1-3 /proc/loadavg)
        CODES=$codes SKIP_PEERS=1 ROUNDS=1 scripts/ivf-bench.sh "$items" "$nlist" easy >"$out/$codes-$round.log" 2>&1
        suffix=$([[ $codes == int8 ]] || echo "-$codes")
        cp "target/ivf-bench/${items}${suffix}/round-1-recserve.json" "$out/$codes-$round.json"
        echo "round $round $codes: load average $load, steal $(($(steal) - before)) ticks over the run" | tee -a "$out/load.txt"
    done
done
python3 scripts/ivf-codes-summary.py "$out" "$rounds" target/ivf-bench/"$items"/build.log target/ivf-bench/"$items"-pq4/build.log
