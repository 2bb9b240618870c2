#!/usr/bin/env bash
# The device check: everything about the GPU path that needs a real GPU, in one run of a few minutes.
#
#   scripts/gpu-check.sh build   On a development machine (Rust, no GPU needed): builds the `--features cuda` test
#                                executables in release mode and copies them, stripped, with the generated test
#                                fixture, into target/gpu-check/ (carry that directory to the GPU machine).
#   scripts/gpu-check.sh [run]   On the GPU machine, from the repository root (no Rust needed): runs them and
#                                writes the report to $OUT/gpu-check.txt when OUT is set, else to
#                                target/gpu-check/gpu-check.txt.
#
# The run needs: an NVIDIA driver (libcuda), NVRTC (libnvrtc.so.13 or .12 on the library path, from the CUDA
# toolkit or a nvidia-cuda-nvrtc wheel; looked for in the usual places), and an ONNX Runtime library (ORT_DYLIB_PATH,
# .venv, or the `onnxruntime` Python package). It runs:
#   1. the kernels' NVRTC compilation and the GPU unit tests (PTX for compute_75/80/90, target choice);
#   2. the device tests: GPU gather == reference bit for bit for fp32/fp16/int8, dims 1..200, 1..200 shards,
#      default-row and reject tables; mixed storage; gathering into device memory on every lane;
#   3. the gather throughput figures (rows/s, GB/s, against a device-to-device copy and the memory interface's
#      peak, with the CPU store on the same batches);
#   4. the ranking path end to end with `--device cuda` (tests/gpu.rs) and the whole e2e suite (tests/rank.rs) with
#      `--device auto`, which picks the GPU; the dense network runs on the CPU execution provider unless the ONNX
#      Runtime library is a GPU build.
# Exit status: non-zero when any step fails; every step runs regardless, and the report says which failed.
set -uo pipefail
cd "$(dirname "$0")/.."

pack=target/gpu-check

build() {
  set -e
  scripts/setup.sh
  # shellcheck source=env.sh
  source scripts/env.sh
  rm -rf "$pack"
  mkdir -p "$pack/bin"
  python -m recserve_models fixture --out "$pack/test-fixture" >/dev/null
  local json
  json=$(mktemp)
  cargo test --release --features recserve/cuda --no-run -p recserve-core -p recserve --lib --test gpu --test rank \
    --message-format=json-render-diagnostics >"$json"
  python - "$json" "$pack/bin" <<'PY'
import json, shutil, sys
names = {"recserve_core": "core-lib-tests", "gpu": "gpu-e2e", "rank": "rank-e2e"}
found = {}
for line in open(sys.argv[1]):
    msg = json.loads(line)
    if msg.get("reason") == "compiler-artifact" and msg.get("executable") and msg["profile"]["test"]:
        name = names.get(msg["target"]["name"])
        if name:
            shutil.copy(msg["executable"], f"{sys.argv[2]}/{name}")
            found[name] = msg["executable"]
missing = set(names.values()) - set(found)
if missing:
    sys.exit(f"gpu-check build: no executable for {sorted(missing)}")
PY
  rm -f "$json"
  strip "$pack"/bin/*
  du -sh "$pack" "$pack"/bin/* "$pack/test-fixture"
  echo "gpu-check: built $pack; carry it to the GPU machine and run scripts/gpu-check.sh there"
}

find_ort() {
  if [ -n "${ORT_DYLIB_PATH:-}" ] && [ -f "$ORT_DYLIB_PATH" ]; then echo "$ORT_DYLIB_PATH"; return; fi
  local lib
  lib=$(ls .venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n 1)
  if [ -n "$lib" ]; then echo "$lib"; return; fi
  for py in python3 python; do
    lib=$("$py" -c 'import glob, os, onnxruntime as o
print(sorted(glob.glob(os.path.join(os.path.dirname(o.__file__), "capi", "libonnxruntime.so*")))[-1])' 2>/dev/null) \
      && [ -n "$lib" ] && { echo "$lib"; return; }
  done
}

find_nvrtc_dir() {
  local dir
  if ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so'; then return; fi
  local path=${LD_LIBRARY_PATH:-}
  for dir in ${path//:/ }; do
    ls "$dir"/libnvrtc.so* >/dev/null 2>&1 && return
  done
  for dir in /usr/local/cuda/lib64 /usr/local/cuda-*/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
    .venv/lib/python3*/site-packages/nvidia/cu*/lib /usr/lib/python3*/site-packages/nvidia/cu*/lib \
    /usr/local/lib/python3*/site-packages/nvidia/cu*/lib /usr/local/lib/python3*/dist-packages/nvidia/cu*/lib \
    "$HOME"/.local/lib/python3*/site-packages/nvidia/cu*/lib; do
    if ls "$dir"/libnvrtc.so* >/dev/null 2>&1; then echo "$dir"; return; fi
  done
  local py
  for py in python3 python; do
    dir=$("$py" -c 'import glob, os, site
for s in site.getsitepackages() + [site.getusersitepackages()]:
    for d in sorted(glob.glob(os.path.join(s, "nvidia", "*", "lib"))):
        if glob.glob(os.path.join(d, "libnvrtc.so*")): print(d); raise SystemExit' 2>/dev/null) \
      && [ -n "$dir" ] && { echo "$dir"; return; }
  done
}

run() {
  local out_dir="${OUT:-$pack}"
  mkdir -p "$out_dir"
  local report="$out_dir/gpu-check.txt"
  if [ ! -x "$pack/bin/core-lib-tests" ]; then
    echo "gpu-check: $pack/bin is missing; run scripts/gpu-check.sh build on a machine with Rust first" >&2
    exit 2
  fi
  local ort nvrtc_dir
  ort=$(find_ort)
  nvrtc_dir=$(find_nvrtc_dir)
  if [ -n "$nvrtc_dir" ]; then export LD_LIBRARY_PATH="$nvrtc_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
  export ORT_DYLIB_PATH="$ort"
  export RECSERVE_TEST_FIXTURE="$PWD/$pack/test-fixture"
  export RUST_LOG="${RUST_LOG:-info}"
  local failed=()
  step() {
    local name=$1
    shift
    echo
    echo "=== $name: $*"
    local start=$SECONDS
    if "$@"; then
      echo "=== $name: ok ($((SECONDS - start)) s)"
    else
      echo "=== $name: FAILED ($((SECONDS - start)) s)"
      failed+=("$name")
    fi
  }
  {
    echo "recserve gpu-check, $(date -u +%Y-%m-%dT%H:%M:%SZ), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
    echo "host: $(uname -srm), $(nproc) CPUs"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1 || echo "nvidia-smi: not available"
    echo "ONNX Runtime library: ${ort:-not found}"
    echo "NVRTC directory: ${nvrtc_dir:-system library path}"
    local bin="$pack/bin"
    step "kernels and GPU unit tests" "$bin/core-lib-tests" gpu:: --test-threads 1
    step "device tests (parity)" "$bin/core-lib-tests" --ignored --exact \
      gpu::cuda::device_tests::gpu_gather_equals_the_reference_for_every_storage_dim_shard_layout_and_oov_case \
      gpu::cuda::device_tests::mixed_storage_tables_and_rejected_ids \
      gpu::cuda::device_tests::gathers_into_device_memory_on_every_lane --test-threads 1 --nocapture
    step "gather throughput" "$bin/core-lib-tests" --ignored --exact \
      gpu::cuda::device_tests::device_gather_throughput --nocapture
    step "ranking end to end, --device cuda" "$bin/gpu-e2e" --ignored --nocapture --test-threads 1
    step "e2e suite, --device auto" "$bin/rank-e2e" --test-threads 1
    echo
    if [ ${#failed[@]} -eq 0 ]; then
      echo "gpu-check: all steps passed"
    else
      echo "gpu-check: FAILED steps: ${failed[*]}"
    fi
    [ ${#failed[@]} -eq 0 ]
  } 2>&1 | tee "$report"
  local status=${PIPESTATUS[0]}
  echo "gpu-check: report in $report"
  exit "$status"
}

case "${1:-run}" in
  build) build ;;
  run) run ;;
  *) echo "usage: scripts/gpu-check.sh [build|run]" >&2; exit 2 ;;
esac
