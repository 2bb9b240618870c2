#!/usr/bin/env bash
# The IVF index at 10M × 64 (issue 16), in one run: generates the synthetic catalogue (scripts/ivf-synthetic.py)
# and builds its index (`python -m recserve_models index`, build time and peak RSS from /usr/bin/time) unless
# they are already under target/, then on one core (pinned) measures recserve's index against exact search
# in-process (examples/ivf_bench.rs: latency of single queries and batches, recall@100, memory) and Faiss on the
# same vectors, queries and lists (scripts/ivf-faiss.py, faiss-cpu in a throwaway virtualenv target/venv-faiss),
# and writes docs/ivf-vs-faiss.svg. Figures go to stdout and target/ivf-bench/.
#
#   scripts/ivf-bench.sh [ITEMS] [NLIST]      (defaults 10000000 8192; e.g. 1000000 2048 to iterate)
#
# Environment: CORE (the core to pin to, default the last one), QUERIES (1000), NPROBES (the sweep), SKIP_FAISS=1.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/env.sh >/dev/null
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh

items=${1:-10000000}
nlist=${2:-8192}
core=${CORE:-$(($(nproc) - 1))}
queries=${QUERIES:-1000}
nprobes=${NPROBES:-1,2,4,8,16,32,64,128,256}
version=target/ivf-${items}
out=target/ivf-bench/${items}
mkdir -p "$out"

if [[ ! -f $version/model.toml ]]; then
    nice -n 19 python scripts/ivf-synthetic.py models/demo/lightgcn/1 "$version" "$items" 0.3
fi
if ! grep -q '^\[recall.index\]' "$version/model.toml"; then
    nice -n 19 /usr/bin/time -v python -m recserve_models index "$version" --nlist "$nlist" 2> >(tee "$out/build.log" >&2)
fi
grep -E 'Elapsed|Maximum resident|User time|System time' "$out/build.log" 2>/dev/null || true

nice -n 19 cargo build --release --example ivf_bench
echo "== recserve in-process, pinned to core $core"
pin "$core" target/release/examples/ivf_bench "$version" --queries "$queries" --nprobe "$nprobes" \
    --exact-queries "${EXACT_QUERIES:-100}" --json "$out/recserve.json" --truth "$out/truth.u32" | tee "$out/recserve.md"

if [[ ${SKIP_FAISS:-0} != 1 ]]; then
    if [[ ! -x target/venv-faiss/bin/python ]]; then
        python3 -m venv target/venv-faiss
        target/venv-faiss/bin/pip install -q "faiss-cpu==1.15.1" "numpy<3"
    fi
    echo "== Faiss, same vectors, queries and lists, pinned to core $core (builds on every core first)"
    CORE=$core target/venv-faiss/bin/python scripts/ivf-faiss.py "$version" "$out/recserve.json" "$out/truth.u32" \
        docs/ivf-vs-faiss.svg "$out/faiss.json" | tee "$out/faiss.md"
fi
