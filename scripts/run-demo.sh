#!/usr/bin/env bash
# Serves the demo model repository on http://localhost:8000 (extra arguments go to `recserve serve`).
# Installs what it needs first (scripts/setup.sh) and builds the server in release mode.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh

# The demo repository is the generated test repository until the trained demo models land in models/demo.
repository=target/test-fixture/repo
if [ ! -d "$repository" ]; then
  python -m recserve_models fixture --out target/test-fixture
fi
exec cargo run --release --bin recserve -- serve --repository "$repository" "$@"
