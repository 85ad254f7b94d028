#!/usr/bin/env bash
# Re-make the GPU fixtures of samples/gpu_backends/ on a CUDA machine (one device call).
# Before: python samples/gpu_backends/vendor.py /tmp/src .vendor (from the unzipped wheels).
# Usage, from the repo root:  OUT=/tmp/out bash samples/gpu_backends/run.sh
set -u -o pipefail
export PYTHONUNBUFFERED=1 MLATRACE_VENDOR=$PWD/.vendor
OUT=${OUT:-/tmp/mlatrace-gpu-backends}
R=/tmp/gpu-backends-traces
rm -rf "$R"; mkdir -p "$R" "$OUT"
here=$PWD/samples/gpu_backends
trace() {  # name vendor-dir driver-args...
  local name=$1 vendor=$2; shift 2
  echo "=== $name ($(date +%T))"
  PYTHONPATH=$PWD:$MLATRACE_VENDOR/$vendor:$here timeout 60 python3 -m mlatrace run \
    --out "$R/$name" --replay-sample 4 --graph-nodes --probes "$here/steps.toml" -- \
    python3 "$here/drive.py" "$@"
  echo "=== $name rc=$?"
  PYTHONPATH=$PWD python3 -m mlatrace report "$R/$name" | tail -25
}
nvidia-smi --query-gpu=name,driver_version --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
trace vllm_triton_mla_frozen_one vllm vllm --capture one
trace vllm_triton_mla_frozen_max vllm vllm --capture max
trace vllm_triton_mla_bucketed vllm vllm --capture bucket
trace sglang_triton_device_splits sglang sglang
tar czf "$OUT/traces.tgz" -C "$R" .
