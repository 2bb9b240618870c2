#!/usr/bin/env bash
# Checks the Helm chart (helm/recserve) and the Dockerfiles offline, with no cluster, helm CLI or container
# engine: lints and renders the chart with every value set in helm/recserve/ci/, validates each rendered
# manifest against the Kubernetes 1.30 schemas, runs the real server (`recserve check-config`, then `recserve
# serve`) with the arguments, environment and config file the chart renders, parses the dashboard's and the
# Prometheus adapter's PromQL with promtool and evaluates it on a real Prometheus scraping a real server under a
# short load (helm/tests/test_prometheus.py), and lints the Dockerfiles with hadolint.
#
# Installs helm/requirements.txt into .venv-helm (kept apart from .venv: the Helm SDK and the Kubernetes schemas
# are 350 MB the other tests do not need). Needs promtool and prometheus (scripts/test.sh installs them) and builds
# the server.
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=helm/requirements.txt
stamp=.venv-helm/.requirements.sha256
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ ! -x .venv-helm/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "check-helm: installing helm/requirements.txt into .venv-helm (helm-python-sdk, kubernetes-validate, ...)" >&2
  rm -rf .venv-helm
  python3 -m venv .venv-helm
  # Every dependency is pinned in the file: --no-deps and `pip check` make a missing pin an error.
  .venv-helm/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -r "$requirements"
  .venv-helm/bin/python -m pip check --disable-pip-version-check >/dev/null
  echo "$want" > "$stamp"
fi

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh
if [ -z "${RECSERVE_TEST_FIXTURE:-}" ]; then
  export RECSERVE_TEST_FIXTURE="$PWD/target/test-fixture"
  [ -d "$RECSERVE_TEST_FIXTURE/repo" ] || python -m recserve_models fixture --out "$RECSERVE_TEST_FIXTURE"
fi

cargo build --quiet --bin recserve
export RECSERVE_BIN="$PWD/target/debug/recserve"

cd helm
exec ../.venv-helm/bin/python -m pytest -q "$@"
