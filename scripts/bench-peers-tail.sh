#!/usr/bin/env bash
# The peer benchmark, in one command (docs/benchmarks.md, "Peer benchmark"): the same DeepFM model, as an FP32 and
# an INT8 graph, served on this machine by
#   - recserve (release build), on the model's plain graph, and again on its split graph (an extra row: the split
#     is recserve's own advantage, not the peers' model),
#   - NVIDIA Triton 2.51 from the PyPI nvidia-pytriton wheel (Python backend: loadtest/peers/triton_model.py reads
#     the compact request as tensors, gathers in numpy and scores a whole dynamic batch in one onnxruntime run),
#     its dynamic batcher tuned first (below),
#   - FastAPI + uvicorn (uvloop, httptools; loadtest/peers/fastapi_server.py: async, orjson, the columnar body),
# each alone on the server's core(s), under the same open-loop load from recload on its own core. First, per
# precision: recserve's closed-loop saturation (the median of SATURATION_RUNS runs), which sets the shared load
# points; then Triton's tuning step: each max_batch_size × max_queue_delay_microseconds of TRITON_MAX_BATCHES ×
# TRITON_DELAYS_US at TUNE_SHARES of Triton's own closed-loop saturation, TUNE_REPEATS times each, and the setting
# with the lowest median p99 is the one benchmarked. Then ROUNDS rounds; in each, every system in turn (recserve,
# Triton, FastAPI, recserve split) is started fresh, its scores are checked against recserve's (first round), and
# measured: fixed-rate runs at LOW_RATE/s and at SHARES of recserve's saturation, oha at the same shares as a
# cross-check generator, and `recload sweep` for the highest rate at p99 ≤ 5 ms and ≤ 20 ms. Beside every step:
# recload's (or oha's) CPU, the machine's steal time over the step, and for recserve its /metrics before and after.
# The report (median and worst of the rounds, never the best) is written by scripts/bench_peers_tail_report.py
# into DOC between the section's markers, and to RESULTS/report.md.
#
# Usage: scripts/bench-peers-tail.sh [--preset realistic|criteo-kaggle] [--repository DIR] [--results DIR]
#                                    [--section NAME] [--doc FILE] [--whole-box] [--quick]
#   --preset NAME       the models: NAME-fp32, NAME-int8 and their -split versions [default: realistic]
#   --repository DIR    where they are; written there with `python -m recserve_models synth --preset NAME --split`
#                       when missing [default: target/bench-repo]
#   --results DIR       every report, log and scrape [default: target/peers-tail/SECTION]
#   --section NAME      the section's name in DOC [default: the preset, with -box for --whole-box]
#   --doc FILE          the document the section is written into [default: docs/benchmarks.md; with --quick a copy
#                       of it in RESULTS, so a check never replaces published figures]
#   --whole-box         no pinning: each server sized to every CPU and sharing them with recload, whose own CPU is
#                       shown beside every step; without it recload has CPU 0 and each server the others
#   --quick             one round of short steps, two Triton settings: a check that everything works end to end,
#                       not figures to publish
# Environment (defaults in brackets): ROUNDS [3] WARMUP [2s] DURATION [15s] (each fixed-rate run) LOW_RATE [100]
#   SHARES ["0.5 0.7"] (of recserve's saturation) CONNECTIONS [256] TIMEOUT [2s] CANDIDATES [100]
#   SATURATION_RUNS [3] CLOSED_CONCURRENCY [64] RATES [100:20000:x1.5] SWEEP_DURATION [8s] MIN_REQUESTS [1000]
#   REFINE [3] OHA_DURATION [15s] TRITON_MAX_BATCHES ["4 16 64"] TRITON_DELAYS_US ["0 200 1000"]
#   TUNE_SHARES ["0.5 0.8"] TUNE_DURATION [10s] TUNE_REPEATS [2] RECSERVE_FLAGS (extra `recserve serve` flags)
#   RECSERVE_BODY [columnar] (rows for a recserve without the columnar /v1 form) BENCH_NOTE (printed above the
#   figures) PEERS_PYTHON [python3] (the peers' interpreter; Triton's stub needs its shared libpython, e.g. pyenv's)
# Installs what it needs: scripts/setup.sh, the pinned peers (loadtest/peers/requirements.txt) into
# target/peers-venv, and oha 1.16 into target/oha (`cargo +stable install`, ~5 minutes the first time).
# Takes about 2 hours with the defaults (3 rounds of 4 systems × 2 precisions, ~4 minutes each, plus ~15 minutes
# of Triton tuning); --whole-box as long again; --quick about 12 minutes once everything is built.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

preset=realistic
repository=target/bench-repo
results=""
section=""
doc=""
whole_box=0
quick=0
while [ $# -gt 0 ]; do
  case "$1" in
    --preset) preset=$2; shift 2 ;;
    --repository) repository=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --section) section=$2; shift 2 ;;
    --doc) doc=$2; shift 2 ;;
    --whole-box) whole_box=1; shift ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench-peers-tail: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
log() { echo "bench-peers-tail: $*" >&2; }
die() { echo "bench-peers-tail: error: $*" >&2; exit 1; }
[[ $preset =~ ^(realistic|criteo-kaggle)$ ]] || die "--preset $preset: realistic or criteo-kaggle"
: "${section:=$preset$([ $whole_box = 1 ] && echo -box)}"
[[ $section =~ ^[a-z0-9-]+$ ]] || die "--section $section: use lowercase letters, digits and '-'"
: "${results:=target/peers-tail/$section}"

# The command as given, with the settings that came from the environment, for the report.
settings="ROUNDS WARMUP DURATION LOW_RATE SHARES CONNECTIONS TIMEOUT CANDIDATES SATURATION_RUNS CLOSED_CONCURRENCY
  RATES SWEEP_DURATION MIN_REQUESTS REFINE OHA_DURATION TRITON_MAX_BATCHES TRITON_DELAYS_US TUNE_SHARES TUNE_DURATION
  TUNE_REPEATS RECSERVE_FLAGS RECSERVE_BODY BENCH_NOTE PEERS_PYTHON"
command_line=""
for name in $settings; do
  [ -n "${!name:-}" ] && command_line+="$name=\"${!name}\" "
done
command_line+="scripts/bench-peers-tail.sh"
[ "$preset" = realistic ] || command_line+=" --preset $preset"
[ "$repository" = target/bench-repo ] || command_line+=" --repository $repository"
[ "$results" = "target/peers-tail/$section" ] || command_line+=" --results $results"
[ "$section" = "$preset$([ $whole_box = 1 ] && echo -box)" ] || command_line+=" --section $section"
[ -z "$doc" ] || command_line+=" --doc $doc"
[ $whole_box = 1 ] && command_line+=" --whole-box"
[ $quick = 1 ] && command_line+=" --quick"

if [ $quick = 1 ]; then
  : "${ROUNDS:=1}" "${WARMUP:=500ms}" "${DURATION:=3s}" "${SATURATION_RUNS:=1}" "${RATES:=100:20000:x3}"
  : "${SWEEP_DURATION:=2s}" "${MIN_REQUESTS:=200}" "${REFINE:=1}" "${OHA_DURATION:=3s}"
  : "${TRITON_MAX_BATCHES:=4 64}" "${TRITON_DELAYS_US:=0}" "${TUNE_DURATION:=2s}" "${TUNE_REPEATS:=1}"
fi
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-2s}
DURATION=${DURATION:-15s}
LOW_RATE=${LOW_RATE:-100}
SHARES=${SHARES:-0.5 0.7}
CONNECTIONS=${CONNECTIONS:-256}
TIMEOUT=${TIMEOUT:-2s}
CANDIDATES=${CANDIDATES:-100}
SATURATION_RUNS=${SATURATION_RUNS:-3}
CLOSED_CONCURRENCY=${CLOSED_CONCURRENCY:-64}
RATES=${RATES:-100:20000:x1.5}
SWEEP_DURATION=${SWEEP_DURATION:-8s}
MIN_REQUESTS=${MIN_REQUESTS:-1000}
REFINE=${REFINE:-3}
OHA_DURATION=${OHA_DURATION:-15s}
TRITON_MAX_BATCHES=${TRITON_MAX_BATCHES:-4 16 64}
TRITON_DELAYS_US=${TRITON_DELAYS_US:-0 200 1000}
TUNE_SHARES=${TUNE_SHARES:-0.5 0.8}
TUNE_DURATION=${TUNE_DURATION:-10s}
TUNE_REPEATS=${TUNE_REPEATS:-2}
RECSERVE_FLAGS=${RECSERVE_FLAGS:-}
RECSERVE_BODY=${RECSERVE_BODY:-columnar}
PEERS_PYTHON=${PEERS_PYTHON:-python3}
SPLIT_TOLERANCE=2e-2
precisions="fp32 int8"
systems="recserve triton fastapi recserve-split"

scripts/setup.sh
# shellcheck source=env.sh
source scripts/env.sh

# --- the models ---------------------------------------------------------------------------------------------
declare -A model_of=([fp32]=$preset-fp32 [int8]=$preset-int8)
declare -A split_of=([fp32]=$preset-fp32-split [int8]=$preset-int8-split)
if [ ! -d "$repository/${model_of[int8]}" ] || [ ! -d "$repository/${split_of[int8]}" ]; then
  log "writing the $preset models into $repository (synth --preset $preset --split)"
  python -m recserve_models synth --preset "$preset" --split --out "$repository" >&2
fi
repository=$(cd "$repository" && pwd)
mkdir -p "$results"
results=$(cd "$results" && pwd)
# Each server gets a repository of the one model it serves (a symbolic link), so that nothing else loads.
repos=$results/repos
rm -rf "$repos"
for p in $precisions; do
  for name in "${model_of[$p]}" "${split_of[$p]}"; do
    [ -d "$repository/$name" ] || die "$repository has no model $name (see --preset, --repository)"
    toml=$(ls -d "$repository/$name"/[0-9]*/ | sort -V | tail -n 1)model.toml
    grep -q "^precision = \"$p\"" "$toml" || die "$toml: the dense graph is not $p"
    mkdir -p "$repos/$name"
    ln -s "$repository/$name" "$repos/$name/$name"
  done
done

# --- builds, the peers' virtualenv, oha ---------------------------------------------------------------------
log "building recserve and recload (release)"
cargo build --release --quiet -p recserve -p recload --bins
recserve_bin=$root/target/release/recserve
recload_bin=$root/target/release/recload

venv=$root/target/peers-venv
requirements=loadtest/peers/requirements.txt
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ ! -x "$venv/bin/python" ] || [ "$(cat "$venv/.requirements.sha256" 2>/dev/null)" != "$want" ]; then
  log "installing the peers into $venv (pinned: $requirements)"
  rm -rf "$venv"
  "$PEERS_PYTHON" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
  echo "$want" > "$venv/.requirements.sha256"
fi
py_version=$("$venv/bin/python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
libpython_dir=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_config_var("LIBDIR"))')
triton=$site/pytriton/tritonserver
stub=$triton/python_backend_stubs/$py_version/triton_python_backend_stub
[ -x "$stub" ] || die "nvidia-pytriton has no Python backend stub for Python $py_version (set PEERS_PYTHON)"
[ -e "$libpython_dir/libpython$py_version.so.1.0" ] || die "no shared libpython$py_version in $libpython_dir: \
Triton's Python stub needs one (a pyenv-built Python has it; set PEERS_PYTHON)"
cp "$stub" "$triton/backends/python/"

oha_bin=$root/target/oha/bin/oha
if ! "$oha_bin" --version 2>/dev/null | grep -q '^oha 1\.16\.'; then
  log "installing oha 1.16 into target/oha (cargo +stable install oha --locked; a few minutes)"
  cargo +stable install oha --version '~1.16' --locked --root "$root/target/oha" >&2
fi

# --- cores --------------------------------------------------------------------------------------------------
# shellcheck source=lib/server-process.sh
source scripts/lib/server-process.sh
if [ $whole_box = 1 ]; then
  cpu_layout none
  pinning="none (\`--whole-box\`): each server in turn has all $server_cores CPUs and shares them with recload"
elif [ "$(nproc)" -ge 2 ]; then
  cpu_layout rest
  pinning="recload (and oha) on CPU 0; each server in turn alone on CPU $server_cpus"
else
  die "needs 2 CPUs: the load generator on one, the server on the other (or --whole-box)"
fi

# --- servers ------------------------------------------------------------------------------------------------

# The Triton model directory of MODEL with max_batch_size MAX_BATCH and max_queue_delay_microseconds DELAY.
triton_repo() { # MODEL MAX_BATCH DELAY → prints the repository
  local dir=$results/triton/$1-mb$2-d$3
  rm -rf "$dir"
  mkdir -p "$dir/$1/1"
  read -r users items dense < <("$venv/bin/python" - "$repos/$1/$1" <<'EOF'
import sys
from pathlib import Path
sys.path.insert(0, "loadtest/peers")
import tomllib
from rankcore import highest_version
_, d = highest_version(Path(sys.argv[1]))
spec = tomllib.loads((d / "model.toml").read_text())
sides = [f["side"] for f in spec["fields"]]
print(sides.count("user"), sides.count("item"), len(spec.get("ranking", {}).get("dense_features", [])))
EOF
)
  local dense_input=""
  [ "$dense" -gt 0 ] && dense_input="{ name: \"user_dense\" data_type: TYPE_FP32 dims: [ $dense ] },"
  cat > "$dir/$1/config.pbtxt" <<EOF
name: "$1"
backend: "python"
max_batch_size: $2
input [
  { name: "user_categorical" data_type: TYPE_INT64 dims: [ $users ] },
  $dense_input
  { name: "item_categorical" data_type: TYPE_INT64 dims: [ -1, $items ] allow_ragged_batch: true }
]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { max_queue_delay_microseconds: $3 }
instance_group [ { kind: KIND_CPU count: $server_cores } ]
parameters: { key: "repository" value: { string_value: "$repos/$1" } }
parameters: { key: "model" value: { string_value: "$1" } }
parameters: { key: "intra_op_threads" value: { string_value: "1" } }
EOF
  cat > "$dir/$1/1/model.py" <<EOF
# Generated by scripts/bench-peers-tail.sh: the Python backend stub ignores PYTHONPATH, so put the peer virtualenv
# and loadtest/peers on sys.path, then use the model defined in loadtest/peers/triton_model.py.
import sys

sys.path[:0] = ["$site", "$root/loadtest/peers"]
from triton_model import TritonPythonModel  # noqa: E402,F401
EOF
  echo "$dir"
}

# Starts SYSTEM serving MODEL (for Triton: from the repository TRITON_REPO) → sets server_pid, url, target.
start_system() { # SYSTEM MODEL [TRITON_REPO]
  local port log
  port=$(free_port)
  log=$results/logs/$1-$2.log
  mkdir -p "$results/logs"
  url=http://127.0.0.1:$port
  case "$1" in
    recserve*)
      # shellcheck disable=SC2086
      start_server "$log" "$url/health/ready" "$recserve_bin" serve --repository "$repos/$2" \
        --http-addr "127.0.0.1:$port" --grpc-addr "127.0.0.1:$(free_port)" --executors "$server_cores" \
        --intra-op-threads 1 $RECSERVE_FLAGS
      target=(--url "$url" --body "$RECSERVE_BODY") ;;
    triton)
      start_server "$log" "$url/v2/health/ready" \
        env LD_LIBRARY_PATH="$libpython_dir:$site/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$triton/bin/tritonserver" --model-repository="$3" --backend-directory="$triton/backends" \
        --http-port "$port" --grpc-port "$(free_port)" --metrics-port "$(free_port)" --log-verbose=0
      target=(--url "$url" --envelope kserve-v2-grouped-batched) ;;
    fastapi)
      start_server "$log" "$url/health/ready" \
        env PEER_REPOSITORY="$repos/$2" PEER_MODELS="$2" PEER_INTRA_OP_THREADS=1 \
        "$venv/bin/uvicorn" fastapi_server:app --app-dir loadtest/peers --host 127.0.0.1 --port "$port" \
        --workers "$server_cores" --loop uvloop --http httptools --no-access-log --log-level warning
      target=(--url "$url" --body columnar) ;;
  esac
}

# Runs one load-generator step, recording its CPU and the machine's steal (and recserve's /metrics) beside it.
step() { # OUT-PREFIX COMMAND...
  local out=$1; shift
  local scrape=()
  [[ $system == recserve* ]] && scrape=(--metrics "$url/metrics" --prom "$out")
  python scripts/lib/step.py --out "$out.step.json" "${scrape[@]}" -- "$@"
}


# --- measure ------------------------------------------------------------------------------------------------
declare -A label=(
  [recserve]="recserve"
  [triton]="Triton 2.51 (Python backend)"
  [fastapi]="FastAPI + uvicorn"
  [recserve-split]="recserve, split graph (extra row)"
)
declare -A saturation triton_setting
for p in $precisions; do rm -rf "${results:?}/$p"; mkdir -p "$results/$p"; done
common_of() { # MODEL
  common=(--model "$1" --repository "$repos/$1" --candidates "$CANDIDATES" --seed 1 --pool 1000)
}
timing=(--warmup "$WARMUP" --timeout "$TIMEOUT" --connections "$CONNECTIONS" --quiet)

for p in $precisions; do
  model=${model_of[$p]}
  common_of "$model"
  # recserve's closed-loop saturation sets every system's load points.
  system=recserve
  start_system recserve "$model"
  mkdir -p "$results/$p/saturation"
  for i in $(seq "$SATURATION_RUNS"); do
    step "$results/$p/saturation/closed-$i" "${on_client[@]}" "$recload_bin" run "${target[@]}" "${common[@]}" \
      "${timing[@]}" --duration "${DURATION}" --closed --concurrency "$CLOSED_CONCURRENCY" \
      --json "$results/$p/saturation/closed-$i.json" > /dev/null
  done
  stop_server
  saturation[$p]=$(python - $(seq -f "$results/$p/saturation/closed-%g.json" "$SATURATION_RUNS") <<'EOF'
import json, statistics, sys
print(round(statistics.median(json.load(open(f))["achieved_rps"] for f in sys.argv[1:]), 1))
EOF
)
  log "$model: recserve's closed-loop saturation ${saturation[$p]}/s (median of $SATURATION_RUNS)"

  # Triton's tuning step, at shares of its own saturation with the setting of the most throughput.
  system=triton
  tuning=$results/$p/triton-tuning
  mkdir -p "$tuning"
  start_system triton "$model" "$(triton_repo "$model" 64 0)"
  step "$tuning/closed" "${on_client[@]}" "$recload_bin" run "${target[@]}" "${common[@]}" "${timing[@]}" \
    --duration "$TUNE_DURATION" --closed --concurrency "$CLOSED_CONCURRENCY" --json "$tuning/closed.json" > /dev/null
  stop_server
  triton_saturation=$(json_field "$tuning/closed.json" achieved_rps)
  for max_batch in $TRITON_MAX_BATCHES; do
    for delay in $TRITON_DELAYS_US; do
      start_system triton "$model" "$(triton_repo "$model" "$max_batch" "$delay")"
      for share in $TUNE_SHARES; do
        rate=$(python -c "print(max(1, round($triton_saturation * $share)))")
        for i in $(seq "$TUNE_REPEATS"); do
          out=$tuning/mb$max_batch-d$delay-$share-$i
          step "$out" "${on_client[@]}" "$recload_bin" run "${target[@]}" "${common[@]}" "${timing[@]}" \
            --duration "$TUNE_DURATION" --rate "$rate" --json "$out.json" > /dev/null
        done
      done
      stop_server
    done
  done
  triton_setting[$p]=$(python - "$tuning" <<'EOF'
import json, pathlib, re, statistics, sys
scores = {}
for f in pathlib.Path(sys.argv[1]).glob("mb*-d*-*.json"):
    if f.name.endswith(".step.json"):
        continue
    m = re.match(r"mb(\d+)-d(\d+)-", f.name)
    r = json.load(open(f))
    failed = r["requests"]["errors"] > 0.001 * max(1, r["requests"]["scheduled"])
    p99 = float("inf") if failed or not r["latency_ms"] else r["latency_ms"]["p99_ms"]
    scores.setdefault((int(m[1]), int(m[2])), []).append(p99)
best = min(scores, key=lambda k: (statistics.median(scores[k]), k))
print(*best)
EOF
)
  log "$model: Triton's setting (max_batch_size, max_queue_delay_microseconds): ${triton_setting[$p]}"
done

for round in $(seq "$ROUNDS"); do
  for p in $precisions; do
    for system in $systems; do
      model=${model_of[$p]}
      [ "$system" = recserve-split ] && model=${split_of[$p]}
      common_of "$model"
      out=$results/$p/round-$round/$system
      mkdir -p "$out"
      log "round $round, $p: $system ($model)"
      if [ "$system" = triton ]; then
        read -r max_batch delay <<< "${triton_setting[$p]}"
        start_system triton "$model" "$(triton_repo "$model" "$max_batch" "$delay")"
      else
        start_system "$system" "$model"
      fi
      if [ "$round" = 1 ]; then
        if [ "$system" = recserve ]; then
          "$recload_bin" check "${target[@]}" "${common[@]}" --samples 32 --save "$results/$p/scores.json" > /dev/null \
            || die "recserve refused its own requests (a recserve without the columnar /v1 form? RECSERVE_BODY=rows)"
        else
          # The split version's INT8 graph is quantized on its own (its user part apart), so its scores differ from
          # the plain graph's by up to ~0.01 (8.2e-3 over 200 requests of the realistic model): its check tells the
          # same model from another (scores spread over 0 to 1).
          tolerance=1e-5
          [ "$system" = recserve-split ] && tolerance=$SPLIT_TOLERANCE
          "$recload_bin" check "${target[@]}" "${common[@]}" --expect "$results/$p/scores.json" \
            --tolerance "$tolerance" --json "$results/$p/check-$system.json" >&2 \
            || die "$system's scores differ from recserve's"
        fi
      fi
      labelled=(--label "${label[$system]}")
      rates=("$LOW_RATE:low")
      for share in $SHARES; do
        rates+=("$(python -c "print(max(1, round(${saturation[$p]} * $share)))"):$share")
      done
      "$recload_bin" bodies "${target[@]}" "${common[@]}" --out "$out/oha-bodies" > "$out/oha-bodies.json"
      mapfile -t oha_args < <(python - "$out/oha-bodies.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
for name, value in d["headers"]:
    print("-H"); print(f"{name}: {value}")
print("-Z" if d["lines"] else "-D"); print(d["file"]); print(d["url"])
EOF
)
      for point in "${rates[@]}"; do
        rate=${point%%:*} name=${point#*:}
        step "$out/fixed-$name" "${on_client[@]}" "$recload_bin" run "${target[@]}" "${common[@]}" "${timing[@]}" \
          "${labelled[@]}" --duration "$DURATION" --rate "$rate" --json "$out/fixed-$name.json" > /dev/null
        [ "$name" = low ] && continue
        step "$out/oha-$name" "${on_client[@]}" "$oha_bin" -q "$rate" --latency-correction -c "$CONNECTIONS" \
          -z "$OHA_DURATION" -w -t "$TIMEOUT" -m POST --no-tui --output-format json -o "$out/oha-$name.json" \
          "${oha_args[@]}"
      done
      # Only the SLA answers are reported: no overloaded steps past the knee (they would also set the generator's
      # busiest-step CPU that the report shows).
      step "$out/sweep" "${on_client[@]}" "$recload_bin" sweep "${target[@]}" "${common[@]}" "${timing[@]}" \
        "${labelled[@]}" --duration "$SWEEP_DURATION" --rates "$RATES" --sla 5ms,20ms --refine "$REFINE" \
        --past-knee 0 --min-requests "$MIN_REQUESTS" --json "$out/sweep.json" > "$out/sweep.txt"
      stop_server
    done
  done
done

# --- describe the run, write the report ---------------------------------------------------------------------
saturations=$(for p in $precisions; do echo "$p=${saturation[$p]}"; done)
settings_of_triton=$(for p in $precisions; do echo "$p=${triton_setting[$p]}"; done)
BENCH_NOTE=${BENCH_NOTE:-} COMMAND_LINE=$command_line PINNING=$pinning REPOSITORY=$repository PRESET=$preset \
  SERVER_CORES=$server_cores VENV_PYTHON=$venv/bin/python ROOT=$root OHA_VERSION="$("$oha_bin" --version)" \
  SATURATIONS=$saturations TRITON_SETTINGS=$settings_of_triton ROUNDS=$ROUNDS SHARES=$SHARES LOW_RATE=$LOW_RATE \
  RECSERVE_BODY=$RECSERVE_BODY RECSERVE_FLAGS=$RECSERVE_FLAGS CONNECTIONS=$CONNECTIONS TIMEOUT=$TIMEOUT \
  WARMUP=$WARMUP DURATION=$DURATION SWEEP_DURATION=$SWEEP_DURATION RATES=$RATES MIN_REQUESTS=$MIN_REQUESTS \
  REFINE=$REFINE OHA_DURATION=$OHA_DURATION TUNE_SHARES=$TUNE_SHARES TUNE_REPEATS=$TUNE_REPEATS \
  TUNE_DURATION=$TUNE_DURATION SATURATION_RUNS=$SATURATION_RUNS CLOSED_CONCURRENCY=$CLOSED_CONCURRENCY \
  CANDIDATES=$CANDIDATES SPLIT_TOLERANCE=$SPLIT_TOLERANCE QUICK=$quick python scripts/bench_peers_tail_report.py describe > "$results/meta.json"

if [ -z "$doc" ] && [ $quick = 1 ]; then
  doc=$results/benchmarks.md
  cp docs/benchmarks.md "$doc"
fi
python scripts/bench_peers_tail_report.py report --results "$results" --section "$section" \
  --doc "${doc:-docs/benchmarks.md}"
log "done: ${doc:-docs/benchmarks.md} (section $section), $results/report.md; raw reports in $results"
