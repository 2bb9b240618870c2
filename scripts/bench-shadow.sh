#!/usr/bin/env bash
# Whether a shadow version slows the version that answers (issue 34; docs/versions.md): the realistic benchmark
# ranker (`synth --preset realistic`, its INT8 graph) served as two versions of one model (`realistic/1` and
# `realistic/2`, the same files), `[models.realistic] versions = { latest = 2 }`, without and with
# `shadow = { version = 1, percent = PERCENT }` (version 2 answers every request either way), through
# scripts/bench-tail.sh: saturation of the first variant, then ROUNDS interleaved rounds at SHARES of it, p50 / p99
# median and worst, recload's CPU and the steal, one server core. Also prints how many copies the shadow scored
# and refused (recserve_shadow_requests_total, from the runs' /metrics).
#
# Usage: scripts/bench-shadow.sh [--doc]      (--doc: writes the "shadow" section of docs/benchmarks.md)
# Environment: PERCENT [100] ROUNDS [3] SHARES ["0.5 0.7"] DURATION [15s] OUT [target/bench-shadow]
#   SOURCE [target/bench-repo/realistic-int8] (written by `synth --preset realistic --split` if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
PERCENT=${PERCENT:-100}
OUT=${OUT:-target/bench-shadow}
SOURCE=${SOURCE:-target/bench-repo/realistic-int8}
if [ ! -d "$SOURCE" ]; then
  # shellcheck source=env.sh
  source scripts/env.sh
  python -m recserve_models synth --preset realistic --split --out "$(dirname "$SOURCE")" >&2
fi
version=$(find "$SOURCE" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort -n | tail -1)
rm -rf "$OUT"
mkdir -p "$OUT/repo/realistic"
for v in 1 2; do ln -s "$(realpath "$SOURCE/$version")" "$OUT/repo/realistic/$v"; done
printf '[models.realistic]\nversions = { latest = 2 }\n' > "$OUT/no-shadow.toml"
printf '[models.realistic]\nversions = { latest = 2 }\nshadow = { version = 1, percent = %s }\n[models.realistic.traffic]\n2 = 1\n' \
  "$PERCENT" > "$OUT/shadow.toml"
REPOSITORY=$OUT/repo MODEL=realistic OUT=$OUT/runs SECTION=${SECTION:-shadow} \
  scripts/bench-tail.sh "$@" "no-shadow:--config $PWD/$OUT/no-shadow.toml" "shadow:--config $PWD/$OUT/shadow.toml"
python - "$OUT/runs" <<'PY'
import sys
from pathlib import Path

sys.path.insert(0, "scripts/lib")
import bench

for prom in sorted(Path(sys.argv[1]).glob("shadow-*.after.prom")):
    before = bench.samples(Path(str(prom).replace(".after.", ".before.")).read_text())
    after = bench.samples(prom.read_text())
    counts = {o: bench.total(after, "recserve_shadow_requests_total", outcome=o)
              - bench.total(before, "recserve_shadow_requests_total", outcome=o)
              for o in ("scored", "refused", "unfit", "failed")}
    print(f"{prom.name.removesuffix('.after.prom')}: shadow copies " + ", ".join(f"{o} {n:.0f}" for o, n in counts.items()))
PY
