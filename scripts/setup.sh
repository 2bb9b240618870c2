#!/usr/bin/env bash
# Installs what building, running and testing recserve needs besides Rust, without touching the system Python:
#   .venv/  numpy, onnx, onnxruntime (its libonnxruntime.so is what the server loads), safetensors, scipy,
#           pytest,
#           NVRTC (nvidia-cuda-nvrtc, kernels/requirements.txt), which compiles the CUDA kernels in tests, and
#           tritonclient, the KServe v2 client the end-to-end tests drive the server with (tests/requirements.txt)
# Idempotent: re-running is quick once the requirements have not changed. Prints nothing on success unless
# something was installed. Source scripts/env.sh afterwards for ORT_DYLIB_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."

requirements=(models/requirements.txt kernels/requirements.txt tests/requirements.txt)
stamp=.venv/.requirements.sha256
want=$(cat "${requirements[@]}" | sha256sum | cut -d' ' -f1)
if [ ! -x .venv/bin/python ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python requirements into .venv (numpy, onnx, onnxruntime, safetensors, scipy, pytest, NVRTC, tritonclient)" >&2
  python3 -m venv .venv
  .venv/bin/python -m pip install --quiet --disable-pip-version-check "${requirements[@]/#/-r}"
  echo "$want" > "$stamp"
fi
