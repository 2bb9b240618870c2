# Sourced by the other scripts: points the server and the tests at the ONNX Runtime library in .venv, and
# Python at the model toolchain (models/recserve_models).
# shellcheck shell=bash
_recserve_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ORT_DYLIB_PATH=$(ls "$_recserve_root"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n 1)
if [ -z "$ORT_DYLIB_PATH" ]; then
  echo "env.sh: no libonnxruntime.so under .venv; run scripts/setup.sh first" >&2
  return 1
fi
export ORT_DYLIB_PATH
export PATH="$_recserve_root/.venv/bin:$PATH"
export PYTHONPATH="$_recserve_root/models${PYTHONPATH:+:$PYTHONPATH}"
unset _recserve_root
