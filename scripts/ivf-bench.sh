#!/usr/bin/env bash
# recserve's IVF index against exact search and against the peers users pick (issues 16 and 36), in one run per
# catalogue: generates the synthetic catalogue (scripts/ivf-synthetic.py) and builds its index (`python -m
# recserve_models index`, build time and peak RSS from /usr/bin/time) unless they are already under target/,
# builds the peers' indexes on every core, niced (scripts/ivf-peers.py: Faiss IVF-SQ8 and IVF-PQ4 fast scan, each
# with an exact re-rank, and hnswlib and usearch HNSW, in a throwaway virtualenv target/venv-ann with pinned
# versions; hnswlib 0.8.0 compiles from source, so it needs a C++ compiler),
# then measures ROUNDS interleaved rounds on one core (pinned, one thread): in each, recserve in process
# (examples/ivf_bench.rs: single queries and batches of 32, recall@100 against exact search, memory) and then every
# peer on the same vectors, queries and exact answers. Prints QPS at recall@100 0.90 / 0.95 / 0.99 as the median and
# the worst of the rounds, with build time and memory, the load average and steal time of every round and how
# long each phase took, and writes the plot (docs/ivf-vs-faiss.svg for the easy catalogue,
# docs/ivf-vs-faiss-hard.svg for the hard one, at 1M items; docs/ivf-vs-faiss[-hard]-ITEMS.svg at other sizes;
# -pq4 added with CODES=pq4).
# Figures go to stdout and target/ivf-bench/.
#
#   scripts/ivf-bench.sh [ITEMS] [NLIST] [CATALOGUE]    (defaults 10000000 8192 easy; e.g. 1000000 2048 both)
#
# CATALOGUE: `easy` (≈ 244 noisy copies of each trained Gowalla item at 10M; target/ivf-ITEMS), `hard` (overlapping
# anisotropic clusters with heavy-tailed norms; target/ivf-hard-ITEMS), or `both` (easy, then hard). See
# scripts/ivf-synthetic.py for how each is drawn; both are deterministic from the seed.
#
# Environment: CORE (the core to pin to, default the last one), QUERIES (1000), NPROBES (recserve's sweep; default the
# peers', 1 to 1024 by powers of 2, up to NLIST),
# ROUNDS (3), PEERS (a comma list of scripts/ivf-peers.py's peers; default Faiss's two and the two graphs on inner
# product, e.g. PEERS=faiss-sq8,faiss-pq4fs), SKIP_PEERS=1 (recserve only), SEED (11), HARD_SPREAD (the hard
# catalogue's spread, 0.45), CODES (int8 or pq4, recserve's index codes; pq4 goes to target/ivf[-hard]-ITEMS-pq4 and
# target/ivf-bench/[hard-]ITEMS-pq4, the same catalogue generated again from the same seed), CARGO_TARGET_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh >/dev/null
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh

items=${1:-10000000}
nlist=${2:-8192}
catalogue=${3:-easy}
core=${CORE:-$(($(nproc) - 1))}
queries=${QUERIES:-1000}
# The peers' sweep (scripts/ivf-peers.py), up to the index's lists.
nprobes=${NPROBES:-$(for p in 1 2 4 8 16 32 64 128 256 512 1024; do if ((p <= nlist)); then echo "$p"; fi; done | paste -sd,)}
rounds=${ROUNDS:-3}
seed=${SEED:-11}
target_dir=${CARGO_TARGET_DIR:-target}
case $catalogue in
  easy | hard) catalogues=("$catalogue") ;;
  both) catalogues=(easy hard) ;;
  *) echo "ivf-bench.sh: CATALOGUE must be easy, hard or both, not $catalogue" >&2; exit 2 ;;
esac

# The machine's load average and cumulative steal time (seconds; /proc/stat's 8th cpu column, USER_HZ ticks).
machine() { echo "load average $(cut -d' ' -f1-3 /proc/loadavg), steal $(awk '/^cpu /{printf "%.1f", $9 / 100}' /proc/stat) s"; }
phase_started=0
phase() { # NAME: ends the previous phase (printing its wall time to $out/phases.txt) and starts NAME
  local now
  now=$(date +%s)
  if [[ -n ${phase_name:-} ]]; then
    echo "phase $phase_name: $((now - phase_started)) s ($(machine))" | tee -a "$out/phases.txt"
  fi
  phase_name=$1
  phase_started=$now
}

if [[ ${SKIP_PEERS:-0} != 1 && ! -x target/venv-ann/bin/python ]]; then
  python3 -m venv target/venv-ann
  target/venv-ann/bin/pip install -q "faiss-cpu==1.15.1" "hnswlib==0.8.0" "usearch==2.26.0" "numpy==2.4.6"
fi
echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) CPUs," \
  "$(grep -o -w -E 'avx2|avx512f|avx512_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ')"

codes=${CODES:-int8}
# The 1M plots keep their names; other sizes get their own (docs/ivf-vs-faiss-hard-10000000.svg).
plot_items=$([[ $items == 1000000 ]] || echo "-$items")
suffix=$([[ $codes == int8 ]] || echo "-$codes")
for cat in "${catalogues[@]}"; do
  if [[ $cat == easy ]]; then
    version=target/ivf-${items}${suffix}; out=target/ivf-bench/${items}${suffix}; spread=0.3
    plot=docs/ivf-vs-faiss${plot_items}${suffix}.svg
  else
    version=target/ivf-hard-${items}${suffix}; out=target/ivf-bench/hard-${items}${suffix}
    spread=${HARD_SPREAD:-0.45}; plot=docs/ivf-vs-faiss-hard${plot_items}${suffix}.svg
  fi
  mkdir -p "$out"
  rm -f "$out"/round-*.json "$out/phases.txt"
  echo "== $cat catalogue: $items items, nlist $nlist ($version)"
  phase generate
  if [[ -f $version/model.toml ]] && ! grep -q "spread $spread\"" "$version/model.toml"; then
    echo "ivf-bench.sh: $version was generated with another spread ($(grep description "$version/model.toml")); delete it" >&2
    exit 2
  fi
  if [[ ! -f $version/model.toml ]]; then
    nice -n 19 python scripts/ivf-synthetic.py models/demo/lightgcn/1 "$version" "$items" "$spread" \
      --catalogue "$cat" --seed "$seed"
  fi
  phase "recserve index build"
  if ! grep -q '^\[recall.index\]' "$version/model.toml"; then
    nice -n 19 /usr/bin/time -v python -m recserve_models index "$version" --nlist "$nlist" --codes "$codes" \
      2> >(tee "$out/build.log" >&2)
  fi
  grep -E 'Elapsed|Maximum resident|User time|System time' "$out/build.log" 2>/dev/null || true

  phase "cargo build"
  nice -n 19 cargo build --release --example ivf_bench
  phase "exact answers"
  pin "$core" "$target_dir/release/examples/ivf_bench" "$version" --queries "$queries" --nprobe 1 \
    --exact-queries 1 --json "$out/truth-run.json" --truth "$out/truth.u32" >/dev/null
  if [[ ${SKIP_PEERS:-0} != 1 ]]; then
    phase "peer builds (every core)"
    nice -n 15 target/venv-ann/bin/python scripts/ivf-peers.py build "$version" "$out/truth-run.json" "$out"
  fi
  for round in $(seq 1 "$rounds"); do
    phase "round $round"
    echo "== round $round of $rounds, pinned to core $core: $(machine)" | tee -a "$out/load.txt"
    pin "$core" "$target_dir/release/examples/ivf_bench" "$version" --queries "$queries" --nprobe "$nprobes" \
      --exact-queries "${EXACT_QUERIES:-100}" --json "$out/round-$round-recserve.json" | tee "$out/round-$round-recserve.md"
    if [[ ${SKIP_PEERS:-0} != 1 ]]; then
      OMP_NUM_THREADS=1 CORE=$core target/venv-ann/bin/python scripts/ivf-peers.py measure "$version" \
        "$out/truth-run.json" "$out/truth.u32" "$out" "$round"
    fi
    echo "   round $round ended: $(machine)" | tee -a "$out/load.txt"
  done
  phase report
  if [[ ${SKIP_PEERS:-0} != 1 ]]; then
    target/venv-ann/bin/python scripts/ivf-peers.py report "$out" "$plot" \
      "$cat catalogue: $(printf "%'d" "$items") × 64 items, nlist $nlist, top 100, one core, single queries" \
      | tee "$out/report.md"
  fi
  phase ""
done
