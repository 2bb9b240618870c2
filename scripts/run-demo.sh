#!/usr/bin/env bash
# Serves the demo model repository (models/demo): HTTP on http://localhost:8000, gRPC on :8001 (extra arguments
# go to `recserve serve`). Installs what it needs first (scripts/setup.sh) and builds the server in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh

# The trained demo models: DeepFM (INT8 and FP32) on synthetic Criteo, LightGCN on Gowalla and the DeepFM that
# ranks its items, with the recall → rank pipeline `demo` of models/demo/recserve.toml (models/README.md).
exec cargo run --release --bin recserve -- serve --repository models/demo --config models/demo/recserve.toml "$@"
