#!/usr/bin/env bash
# The peer benchmark, in one command: the same DeepFM models (FP32 and INT8) served on this machine by
#   - recserve (release build),
#   - NVIDIA Triton Inference Server 2.51 from the PyPI nvidia-pytriton wheel (Python backend only: a model.py that
#     gathers in numpy and runs onnxruntime, with Triton's dynamic batching on),
#   - FastAPI + uvicorn + onnxruntime (the same numpy gather),
# under the same open-loop load from recload, after checking that the peers' scores equal recserve's. Writes the
# "Peer benchmark" section of docs/benchmarks.md (between its markers) and docs/peers-<precision>.svg.
#
# Usage: loadtest/peers/run.sh [--models DIR] [--fp32-model NAME] [--int8-model NAME] [--results DIR] [--section NAME]
#                              [--whole-box] [--quick]
#   --models DIR    model repository holding the two DeepFM models [default: models/demo (the trained demo models:
#                   deepfm-fp32 and deepfm, its INT8 one), else the generated test repository
#                   target/test-fixture/repo (deepfm-fp32 and deepfm-int8)]
#   --fp32-model, --int8-model NAME   the models of that repository to serve [defaults as above]
#   --results DIR   recload's JSON reports and the Triton model repository [default: target/peers]
#   --section NAME  write a section of its own, "Peer benchmark (NAME)", and docs/peers-NAME-<precision>.svg, beside
#                   the default section (the demo models'): e.g. `--section realistic` for the realistic benchmark
#                   models (`--models target/bench-repo --fp32-model realistic-fp32 --int8-model realistic-int8`)
#   --whole-box     no pinning: each server sized to every CPU of the machine and sharing them with recload (as a
#                   box serving alone would be loaded from elsewhere, minus the generator's share, which every row
#                   shows); without it recload has CPU 0 and the server the others
#   --quick         short runs: a check that the script works end to end, not figures to publish
# Environment (defaults in brackets):
#   BENCH_NOTE            a warning printed above the figures, e.g. "Machine shared with concurrent builds: preliminary"
#   WARMUP [2s] DURATION [8s] MIN_REQUESTS [1000] RATES [50:20000:x1.5] SLA [5ms,20ms] REFINE [3]
#   REPEAT [1]            runs of each SLA's highest passing rate after a sweep (shown beside it: does it hold?)
#   FIXED_RATES ["100 400 1600"] CONNECTIONS [64] CLOSED_CONCURRENCY [16] CANDIDATES [100] TIMEOUT [2s]
#   RECSERVE_FLAGS        extra flags for `recserve serve` and `recload ceiling` (e.g. "--batching off")
#   TRITON_MAX_BATCH [64] most requests Triton's dynamic batcher puts in one execute()
#   PEERS_PYTHON [python3] the interpreter for the peer virtualenv (needs its shared libpython, e.g. pyenv's)
# Installs what it needs: scripts/setup.sh, then the pinned peers (loadtest/peers/requirements.txt) into a
# throwaway virtualenv target/peers-venv. Takes about 25 minutes with the defaults.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

models=""
fp32_model=""
int8_model=""
results=target/peers
section=""
quick=0
whole_box=0
while [ $# -gt 0 ]; do
  case "$1" in
    --models) models=$2; shift 2 ;;
    --fp32-model) fp32_model=$2; shift 2 ;;
    --int8-model) int8_model=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --section) section=$2; shift 2 ;;
    --whole-box) whole_box=1; shift ;;
    --quick) quick=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
# The command as given, with the settings that came from the environment, for the report.
command_line=""
for name in BENCH_NOTE WARMUP DURATION MIN_REQUESTS RATES SLA REFINE FIXED_RATES CONNECTIONS CLOSED_CONCURRENCY \
  CANDIDATES TIMEOUT RECSERVE_FLAGS TRITON_MAX_BATCH PEERS_PYTHON; do
  [ -n "${!name:-}" ] && command_line+="$name=\"${!name}\" "
done
command_line+="loadtest/peers/run.sh${models:+ --models $models}${fp32_model:+ --fp32-model $fp32_model}"
command_line+="${int8_model:+ --int8-model $int8_model}"
[ "$results" = target/peers ] || command_line+=" --results $results"
[ -z "$section" ] || command_line+=" --section $section"
[ $whole_box = 1 ] && command_line+=" --whole-box"
[ $quick = 1 ] && command_line+=" --quick"

if [ $quick = 1 ]; then
  : "${WARMUP:=500ms}" "${DURATION:=2s}" "${MIN_REQUESTS:=200}" "${RATES:=50:20000:x3}" "${REFINE:=1}"
  : "${FIXED_RATES:=100 400}"
fi
WARMUP=${WARMUP:-2s}
DURATION=${DURATION:-8s}
MIN_REQUESTS=${MIN_REQUESTS:-1000}
RATES=${RATES:-50:20000:x1.5}
SLA=${SLA:-5ms,20ms}
REFINE=${REFINE:-3}
REPEAT=${REPEAT:-1}
FIXED_RATES=${FIXED_RATES:-100 400 1600}
CONNECTIONS=${CONNECTIONS:-64}
CLOSED_CONCURRENCY=${CLOSED_CONCURRENCY:-16}
CANDIDATES=${CANDIDATES:-100}
TIMEOUT=${TIMEOUT:-2s}
TRITON_MAX_BATCH=${TRITON_MAX_BATCH:-64}
RECSERVE_FLAGS=${RECSERVE_FLAGS:-}
PEERS_PYTHON=${PEERS_PYTHON:-python3}
precisions="fp32 int8"

log() { echo "peers: $*" >&2; }
die() { echo "peers: error: $*" >&2; exit 1; }
[[ -z $section || $section =~ ^[a-z0-9-]+$ ]] || die "--section $section: use lowercase letters, digits and '-'"

scripts/setup.sh
# shellcheck source=../../scripts/env.sh
source scripts/env.sh

# --- the models ---------------------------------------------------------------------------------------------
if [ -z "$models" ]; then
  if [ -d models/demo/deepfm-fp32 ] && [ -d models/demo/deepfm ]; then
    models=models/demo
    : "${fp32_model:=deepfm-fp32}" "${int8_model:=deepfm}"
  else
    models=target/test-fixture/repo
    [ -d "$models" ] || python -m recserve_models fixture --out target/test-fixture >&2
  fi
fi
fp32_model=${fp32_model:-deepfm-fp32}
int8_model=${int8_model:-deepfm-int8}
declare -A model_of=([fp32]=$fp32_model [int8]=$int8_model)
models=$(cd "$models" && pwd)
# The servers get a repository of just these two models (symbolic links), so that other models in the directory
# (e.g. the demo's LightGCN) play no part.
mkdir -p "$results"
results=$(cd "$results" && pwd)
repo=$results/repo
rm -rf "$repo"
mkdir -p "$repo"
for p in $precisions; do
  name=${model_of[$p]}
  [ -d "$models/$name" ] || die "$models has no model $name (see --help for --models, --$p-model)"
  toml=$(ls -d "$models/$name"/[0-9]*/ | sort -V | tail -n 1)model.toml
  grep -q "^precision = \"$p\"" "$toml" || die "$toml: the dense graph is not $p (see --$p-model)"
  ln -s "$models/$name" "$repo/$name"
done

# --- builds and the peer virtualenv -------------------------------------------------------------------------
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

# --- cores --------------------------------------------------------------------------------------------------
cpus=$(nproc)
sizing() { # N: how each server is sized to N cores
  echo "Each server is sized to its cores: recserve \`--executors $1\` (one ONNX Runtime intra-op thread each)," \
    "Triton \`instance_group { count: $1 }\`, uvicorn \`--workers $1\`; every onnxruntime session uses one intra-op" \
    "thread."
}
if [ $whole_box = 1 ]; then
  client_cpus=""; server_cpus=""; server_cores=$cpus
  client=(); server=()
  pinning="Pinning: none (\`--whole-box\`): each server in turn has all $cpus CPUs and shares them with recload, whose"
  pinning+=" own CPU is shown beside every rate; recserve's in-process ceiling runs on all of them too. $(sizing "$cpus")"
elif [ "$cpus" -ge 2 ]; then
  client_cpus=0
  server_cpus="1-$((cpus - 1))"
  [ "$cpus" -eq 2 ] && server_cpus=1
  server_cores=$((cpus - 1))
  client=(taskset -c "$client_cpus")
  server=(taskset -c "$server_cpus")
  pinning="Pinning (taskset): recload on CPU $client_cpus; each server in turn on CPU $server_cpus"
  pinning+=" ($server_cores core$([ $server_cores = 1 ] || echo s)), alone: one system runs at a time, and recserve's"
  pinning+=" in-process ceiling runs on the same core(s). $(sizing "$server_cores")"
else
  client_cpus=""; server_cpus=""; server_cores=1
  client=(); server=()
  pinning="Pinning: none possible (one CPU): recload and the server share it, so every figure includes the load"
  pinning+=" generator's own work."
fi

# --- servers ------------------------------------------------------------------------------------------------
# shellcheck source=../../scripts/lib/server-process.sh
source "$root/scripts/lib/server-process.sh"

triton_repo=$results/triton-repo
rm -rf "$triton_repo"
for p in $precisions; do
  dir=$triton_repo/${model_of[$p]}
  mkdir -p "$dir/1"
  cat > "$dir/config.pbtxt" <<EOF
name: "${model_of[$p]}"
backend: "python"
max_batch_size: $TRITON_MAX_BATCH
input [ { name: "REQUEST" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ -1 ] } ]
dynamic_batching { }
instance_group [ { kind: KIND_CPU count: $server_cores } ]
parameters: { key: "repository" value: { string_value: "$repo" } }
parameters: { key: "model" value: { string_value: "${model_of[$p]}" } }
parameters: { key: "intra_op_threads" value: { string_value: "1" } }
EOF
  cat > "$dir/1/model.py" <<EOF
# Generated by loadtest/peers/run.sh: the Python backend stub ignores PYTHONPATH, so put the peer virtualenv and
# loadtest/peers on sys.path, then use the model defined in loadtest/peers/triton_model.py.
import sys

sys.path[:0] = ["$site", "$root/loadtest/peers"]
from triton_model import TritonPythonModel  # noqa: E402,F401
EOF
done

start_server() { # SYSTEM → sets server_pid, url, target_args
  local port log
  port=$(free_port)
  log=$results/$1.log
  url=http://127.0.0.1:$port
  case "$1" in
    recserve)
      # shellcheck disable=SC2086
      "${server[@]}" "$recserve_bin" serve --repository "$repo" --http-addr "127.0.0.1:$port" \
        --executors "$server_cores" --intra-op-threads 1 $RECSERVE_FLAGS > "$log" 2>&1 &
      server_pid=$!
      wait_ready "$url/health/ready" "$log"
      target_args=(--url "$url") ;;
    triton)
      LD_LIBRARY_PATH="$libpython_dir:$site/nvidia_pytriton.libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "${server[@]}" "$triton/bin/tritonserver" --model-repository="$triton_repo" \
        --backend-directory="$triton/backends" --http-port "$port" --grpc-port "$(free_port)" \
        --metrics-port "$(free_port)" --log-verbose=0 > "$log" 2>&1 &
      server_pid=$!
      wait_ready "$url/v2/health/ready" "$log"
      target_args=(--url "$url" --envelope kserve-v2-bytes) ;;
    fastapi)
      PEER_REPOSITORY=$repo PEER_MODELS=$fp32_model,$int8_model PEER_INTRA_OP_THREADS=1 \
        "${server[@]}" "$venv/bin/uvicorn" fastapi_server:app --app-dir loadtest/peers --host 127.0.0.1 \
        --port "$port" --workers "$server_cores" --no-access-log --log-level warning > "$log" 2>&1 &
      server_pid=$!
      wait_ready "$url/health/ready" "$log"
      target_args=(--url "$url") ;;
  esac
}

recload() { "${client[@]}" "$recload_bin" "$@"; }

# --- measure ------------------------------------------------------------------------------------------------
systems="recserve triton fastapi"
declare -A names=(
  [recserve]="recserve"
  [triton]="Triton 2.51 (Python backend)"
  [fastapi]="FastAPI + uvicorn"
)
for p in $precisions; do rm -rf "${results:?}/$p"; mkdir -p "$results/$p"; done

triton_version=""
for system in $systems; do
  log "starting $system"
  start_server "$system"
  if [ "$system" = triton ]; then
    triton_version=$(curl -s "$url/v2" | python -c 'import json, sys; print(json.load(sys.stdin)["version"])')
  fi
  for p in $precisions; do
    out=$results/$p/$system
    mkdir -p "$out"
    model=${model_of[$p]}
    common=(--model "$model" --repository "$repo" --candidates "$CANDIDATES" --seed 1 --pool 1000)
    if [ "$system" = recserve ]; then
      recload check "${target_args[@]}" "${common[@]}" --samples 32 --save "$results/$p/scores.json" > /dev/null
    else
      log "$system $model: checking its scores against recserve's"
      recload check "${target_args[@]}" "${common[@]}" --expect "$results/$p/scores.json" --tolerance 1e-5 \
        --json "$out/check.json" || die "$system's scores differ from recserve's: not benchmarking it"
    fi
    timing=(--warmup "$WARMUP" --duration "$DURATION" --timeout "$TIMEOUT" --connections "$CONNECTIONS" --quiet
      --label "${names[$system]}")
    log "$system $model: sweep $RATES, SLA $SLA"
    recload sweep "${target_args[@]}" "${common[@]}" "${timing[@]}" --rates "$RATES" --sla "$SLA" \
      --refine "$REFINE" --repeat "$REPEAT" --min-requests "$MIN_REQUESTS" --json "$out/sweep.json" > "$out/sweep.txt"
    cat "$out/sweep.txt" >&2
    log "$system $model: closed loop, $CLOSED_CONCURRENCY workers"
    [ "$system" = recserve ] && curl -s "$url/metrics" > "$out/metrics-before.prom"
    recload run "${target_args[@]}" "${common[@]}" "${timing[@]}" --closed --concurrency "$CLOSED_CONCURRENCY" \
      --json "$out/closed.json" | sed -n 3p >&2
    if [ "$system" = recserve ]; then
      curl -s "$url/metrics" > "$out/metrics-after.prom"
      python loadtest/peers/batch_stats.py "$model" "$out/metrics-before.prom" "$out/metrics-after.prom" \
        > "$out/batches.json"
    fi
    # Last, as the highest of them overloads the slower systems.
    for rate in $FIXED_RATES; do
      recload run "${target_args[@]}" "${common[@]}" "${timing[@]}" --rate "$rate" \
        --json "$out/fixed-$rate.json" > /dev/null
    done
  done
  stop_server
  if [ "$system" = recserve ]; then
    # The ceiling runs alone on the server's core(s), at one request per batch and at the mean batch recserve ran
    # at saturation (rounded to whole requests), each padded to recserve's bucket for it.
    for p in $precisions; do
      mean=$(python -c 'import json, sys; print(json.load(open(sys.argv[1]))["mean_rows"])' \
        "$results/$p/recserve/batches.json")
      saturated=$(python -c 'import sys; c = int(sys.argv[2]); print(max(c, round(float(sys.argv[1]) / c) * c))' \
        "$mean" "$CANDIDATES")
      rows=$CANDIDATES; [ "$saturated" != "$CANDIDATES" ] && rows="$CANDIDATES,$saturated"
      log "${model_of[$p]}: in-process ceiling at $rows rows per batch (recserve's mean at saturation: $mean rows)"
      # shellcheck disable=SC2086
      "${server[@]}" "$recload_bin" ceiling --repository "$repo" --model "${model_of[$p]}" --candidates "$CANDIDATES" \
        --executors "$server_cores" --intra-op-threads 1 --batch-rows "$rows" --warmup "$WARMUP" \
        --duration "$DURATION" --json "$results/$p/ceiling.json" $RECSERVE_FLAGS >&2
    done
  fi
done

for p in $precisions; do
  "$recload_bin" plot --title "DeepFM ($p), $CANDIDATES candidates per request: latency against throughput" \
    --out "$results/$p/latency.svg" $(for s in $systems; do echo "$results/$p/$s/sweep.json"; done)
  cp "$results/$p/latency.svg" "docs/peers-${section:+$section-}$p.svg"
done

# --- describe the run, write the section --------------------------------------------------------------------
BENCH_NOTE=${BENCH_NOTE:-} COMMAND_LINE=$command_line PINNING=$pinning MODELS=$models CANDIDATES=$CANDIDATES \
FP32_MODEL=$fp32_model INT8_MODEL=$int8_model \
TRITON_VERSION=$triton_version SERVER_CORES=$server_cores FIXED_RATES=$FIXED_RATES TRITON_MAX_BATCH=$TRITON_MAX_BATCH \
VENV_PYTHON=$venv/bin/python ROOT=$root RECSERVE_FLAGS=$RECSERVE_FLAGS python - > "$results/meta.json" <<'EOF'
import json, os, platform, re, subprocess, datetime

def sh(*cmd):
    return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()

lscpu = dict(
    (k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in sh("lscpu").splitlines() if ":" in line)
)
flags = set(lscpu.get("Flags", "").split())
simd = [f for f in ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "amx_int8") if f in flags]
machine = [
    f"CPU: {lscpu.get('Model name', platform.processor())}, {lscpu.get('CPU(s)', '?')} logical CPUs "
    f"({lscpu.get('Thread(s) per core', '?')} thread(s) per core, {lscpu.get('Socket(s)', '?')} socket(s)), "
    f"SIMD: {', '.join(simd) or 'none of avx2/fma/avx512'}",
    f"caches: L2 {lscpu.get('L2 cache', '?')}, L3 {lscpu.get('L3 cache', '?')}; memory "
    f"{round(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30)} GiB; "
    f"{platform.system()} {platform.release()}",
]
pkgs = json.loads(sh(os.environ["VENV_PYTHON"], "-c",
    "import json, importlib.metadata as m; print(json.dumps({p: m.version(p) for p in "
    "('nvidia-pytriton', 'fastapi', 'uvicorn', 'onnxruntime', 'numpy', 'pydantic')}))"))
root = os.environ["ROOT"]
rev = sh("git", "-C", root, "rev-parse", "--short", "HEAD")
dirty = " + uncommitted changes" if sh("git", "-C", root, "status", "--porcelain", "--untracked-files=no") else ""
ort = re.search(r"libonnxruntime\.so\.([\d.]+)", os.environ.get("ORT_DYLIB_PATH", ""))
versions = {
    "recserve": f"{rev}{dirty}",
    "onnxruntime (recserve)": ort.group(1) if ort else "?",
    "tritonserver": os.environ.get("TRITON_VERSION") or "?",
    "rustc": sh("rustc", "--version").split(" ")[1] if sh("rustc", "--version") else "?",
    "python": platform.python_version(),
}
versions.update({f"{k} (peers)" if k in ("onnxruntime", "numpy") else k: v for k, v in pkgs.items()})
cores = int(os.environ["SERVER_CORES"])
flags_note = f" with `{os.environ['RECSERVE_FLAGS']}`" if os.environ.get("RECSERVE_FLAGS") else ""
print(json.dumps({
    "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    "command": os.environ["COMMAND_LINE"],
    "note": os.environ.get("BENCH_NOTE") or None,
    "machine": machine,
    "pinning": os.environ["PINNING"],
    "versions": versions,
    "models_dir": os.path.relpath(models, root) if (models := os.environ["MODELS"]).startswith(root) else models,
    "candidates": int(os.environ["CANDIDATES"]),
    "tolerance": 1e-5,
    "batching": (
        f"recserve{flags_note} batches dynamically with its defaults (a batch closes at 1024 rows or when its oldest "
        "request has waited 500 µs, and runs at its own size on the CPU); Triton's dynamic batcher "
        f"hands the Python model up to {os.environ['TRITON_MAX_BATCH']} queued requests per call, which it scores in "
        "one onnxruntime run; FastAPI scores each request on its own."
    ),
    "precisions": [
        {"name": "fp32", "model": os.environ["FP32_MODEL"]},
        {"name": "int8", "model": os.environ["INT8_MODEL"]},
    ],
    "systems": [
        {"key": "recserve", "name": "recserve",
         "how": f"`recserve serve --executors {cores} --intra-op-threads 1`{flags_note}: axum HTTP, the Rust gather "
                "from memory-mapped safetensors, ONNX Runtime through `ort`, one executor thread per core."},
        {"key": "triton", "name": "Triton 2.51 (Python backend)",
         "how": "tritonserver from the PyPI `nvidia-pytriton` wheel, which bundles only the Python backend (Triton's "
                "native ONNX Runtime backend is not in that build): `loadtest/peers/triton_model.py` receives the same "
                "rank JSON as one BYTES input (KServe v2 binary tensor extension), gathers in numpy from the same "
                "safetensors tables and runs onnxruntime, dynamic batching on."},
        {"key": "fastapi", "name": "FastAPI + uvicorn",
         "how": f"`loadtest/peers/fastapi_server.py` under `uvicorn --workers {cores}` (uvloop, httptools): the same "
                "`/v1` rank request and response, pydantic validation, the same numpy gather and onnxruntime."},
    ],
    "fixed_rates": [float(r) for r in os.environ["FIXED_RATES"].split()],
}, indent=2))
EOF

"$recload_bin" peers-report --results "$results" --doc docs/benchmarks.md ${section:+--section "$section"}
log "done: docs/benchmarks.md (peer-benchmark section${section:+ $section}), docs/peers-${section:+$section-}{fp32,int8}.svg; raw reports in $results"
