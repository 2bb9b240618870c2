# Sourced by the other scripts: points the server and the tests at the ONNX Runtime library in .venv, the CUDA
# kernel tests at NVRTC in .venv (LD_LIBRARY_PATH), and Python at the model toolchain (models/recserve_models).
# shellcheck shell=bash
_recserve_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ORT_DYLIB_PATH=$(ls "$_recserve_root"/.venv/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.* 2>/dev/null | head -n 1)
if [ -z "$ORT_DYLIB_PATH" ]; then
  echo "env.sh: no libonnxruntime.so under .venv; run scripts/setup.sh first" >&2
  return 1
fi
export ORT_DYLIB_PATH
_recserve_nvrtc=$(ls -d "$_recserve_root"/.venv/lib/python3*/site-packages/nvidia/cu*/lib 2>/dev/null | head -n 1)
if [ -n "$_recserve_nvrtc" ]; then
  export LD_LIBRARY_PATH="$_recserve_nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
unset _recserve_nvrtc
export PATH="$_recserve_root/.venv/bin:$PATH"
export PYTHONPATH="$_recserve_root/models${PYTHONPATH:+:$PYTHONPATH}"
unset _recserve_root
