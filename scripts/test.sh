#!/usr/bin/env bash
# Runs every test: the Rust unit and end-to-end tests (against a freshly generated test repository), the GPU
# module's tests in a `--features cuda` build (the kernels compile to PTX through NVRTC here, with no GPU), and the
# model toolchain's tests. Installs what they need first (scripts/setup.sh; promtool and the Prometheus server from
# Debian's `prometheus` package, redis-server from Debian's `redis-server` package, when they are missing). The
# tests of the Redis tier run against a real local Redis Cluster (scripts/redis-cluster.sh: 3 masters, 3 replicas)
# that this script starts before the Rust tests and stops by PID when it exits; RECSERVE_TEST_REDIS names its nodes. Tests that need a CUDA device run only where one is
# present (nvidia-smi sees it); elsewhere this prints a SKIPPED line for them, and scripts/gpu-check.sh runs them
# on a GPU machine.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh

if ! command -v promtool >/dev/null || ! command -v prometheus >/dev/null; then
  echo "test: installing Debian's prometheus package: promtool (the /metrics exposition check) and the server (the dashboard queries' test)" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

if ! command -v curl >/dev/null || ! command -v openssl >/dev/null; then
  echo "test: installing Debian's curl and openssl packages: the TLS tests' real client and the Helm test's certificate" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends curl openssl >/dev/null
fi

if ! command -v redis-server >/dev/null || ! command -v redis-cli >/dev/null; then
  echo "test: installing Debian's redis-server package: the Redis Cluster the Redis tier's tests run against" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
redis_dir="$PWD/target/redis-cluster"
scripts/redis-cluster.sh stop "$redis_dir"
rm -rf "$redis_dir"
trap 'scripts/redis-cluster.sh stop "$redis_dir"' EXIT
RECSERVE_TEST_REDIS=$(scripts/redis-cluster.sh start "$redis_dir")
export RECSERVE_TEST_REDIS

export RECSERVE_TEST_FIXTURE="$PWD/target/test-fixture"
rm -rf "$RECSERVE_TEST_FIXTURE"
python -m recserve_models fixture --out "$RECSERVE_TEST_FIXTURE"
# Held-out rank requests and the toolchain's offline scores for the committed demo models (tests/demo_models.rs).
export RECSERVE_DEMO_CASES="$PWD/target/demo-cases.json"
python -m recserve_models demo-cases --repository models/demo --out "$RECSERVE_DEMO_CASES"

# A benchmark model of realistic shape, small (tests/synth_models.rs): `synth --preset realistic` with capped tables.
export RECSERVE_SYNTH_DIR="$PWD/target/synth-small"
rm -rf "$RECSERVE_SYNTH_DIR"
python -m recserve_models synth --preset realistic --max-rows 5000 --requests 8 --split --out "$RECSERVE_SYNTH_DIR" >/dev/null

cargo test --workspace --all-targets
# The CUDA build's own tests: the NVRTC compilation of the kernels (fails, never skips, without libnvrtc), the
# CUDA store's device tests (ignored without a device) and the GPU end-to-end test.
if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  cargo test --features recserve/cuda -p recserve-core -p recserve --lib --test gpu -- --include-ignored
else
  cargo test --features recserve/cuda -p recserve-core -p recserve --lib --test gpu
  ignored=$(cargo test --features recserve/cuda -p recserve-core -p recserve --lib --test gpu -- --list --ignored 2>/dev/null | grep -c ': test$' || true)
  echo "SKIPPED: no CUDA device: ${ignored} GPU device tests not run here (scripts/gpu-check.sh runs them on a GPU machine)"
fi
# The model toolchain's tests, the peer benchmark's scoring (loadtest/peers/rankcore.py) against the fixture, and
# its reporter and steal reader (scripts/test_bench_peers_tail.py), the benchmarks' shared library, and the IVF
# benchmark's catalogues and peer reporting (scripts/test_ivf_bench.py).
python -m pytest -q models/tests loadtest/peers scripts/test_bench_peers_tail.py scripts/test_bench_tail.py \
  scripts/test_bench_lib.py scripts/test_bench_features.py scripts/test_ivf_bench.py
# The shell commands of README.md and docs/*.md, run against servers on the demo and the fixture or checked against
# the --help of the debug binaries `cargo test` just built (target/debug/recserve, target/debug/recload).
python -m pytest -q scripts/test_docs_commands.py
# Model versions swapped under load, in a short form (small tables, 2 swaps): no failed request, every answer
# the one of the version that gave it. The full measurement is `scripts/swap-under-load.sh` (docs/benchmarks.md).
scripts/swap-under-load.sh --short
# The Helm chart and the Dockerfiles, checked offline (installs .venv-helm).
scripts/check-helm.sh
