#!/usr/bin/env bash
# Runs every test: the Rust unit and end-to-end tests (against a freshly generated test repository) and the
# model toolchain's tests. Installs what they need first (scripts/setup.sh; promtool from Debian's `prometheus`
# package when it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh

if ! command -v promtool >/dev/null; then
  echo "test: installing promtool (Debian package prometheus) for the /metrics exposition check" >&2
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi

export RECSERVE_TEST_FIXTURE="$PWD/target/test-fixture"
rm -rf "$RECSERVE_TEST_FIXTURE"
python -m recserve_models fixture --out "$RECSERVE_TEST_FIXTURE"
# Held-out rank requests and the toolchain's offline scores for the committed demo models (tests/demo_models.rs).
export RECSERVE_DEMO_CASES="$PWD/target/demo-cases.json"
python -m recserve_models demo-cases --repository models/demo --out "$RECSERVE_DEMO_CASES"

cargo test --workspace --all-targets
python -m pytest -q models/tests
