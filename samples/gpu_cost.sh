#!/usr/bin/env bash
# Issue 18's GPU measurements in one device call: timed serve traces (legacy, device),
# `mlatrace whatif` on the legacy one, `bench overhead` with replay timing on, the host
# cost of timing every replay, and the GPU tests of replay timing.
# Usage on the H200, from the repo root:  OUT=/some/dir bash samples/gpu_cost.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mlatrace-gpu-cost}
R=/tmp/mlatrace-gpu-cost-results
mkdir -p "$R" "$OUT"
LOG=$OUT/gpu_log.txt
step() {  # name timeout cmd...
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date +%T)) : $*" | tee -a "$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  echo "=== $name rc=$? ($(date +%T))" | tee -a "$LOG"
  tar czf "$OUT/gpu_results.tgz" -C "$R" . 2>>"$LOG"
}
SERVE="python3 -m mlatrace.reference.serve --graph full --device cuda --ctx 32768 --steps 64 --batch 2 --heads 16 --layers 4 --check --sync-debug"
step env 60 bash -c 'nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"'
for policy in legacy device; do
  step "trace_$policy" 180 python3 -m mlatrace run --out "$R/gpu_serve_${policy}_timed" --replay-sample 4 \
    --replay-timing 8:4 -- $SERVE --policy $policy
done
L=$R/gpu_serve_legacy_timed D=$R/gpu_serve_device_timed
step whatif 240 python3 -m mlatrace whatif "$L" --save
step whatif_lengths 240 python3 -m mlatrace whatif "$L" --lengths 8192,32768,100000
step report_legacy 60 python3 -m mlatrace report "$L"
step report_device 60 python3 -m mlatrace report "$D"
step diff 60 python3 -m mlatrace diff "$L" "$D"
step report_json 60 bash -c "python3 -m mlatrace report --json '$L' > '$R/report_legacy.json'"
step bench_overhead 300 python3 -m mlatrace bench overhead
BENCH="python3 -m mlatrace.reference.serve --device cuda --policy device --graph full --ctx 16384 --batch 4 --heads 16 --layers 8 --hidden 1024 --warmup 20 --bench --steps 400 --sync-debug"
for t in off 8:64 1000000:1 off 8:64 1000000:1; do
  step "timing_cost_$t" 120 python3 -m mlatrace run --out "$R/cost_${t//:/_}_$RANDOM" --replay-timing "$t" -- $BENCH
done
step pytest_gpu 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_replay_timing_gpu.py
rm -rf "$R"/cost_*
tar czf "$OUT/gpu_results.tgz" -C "$R" .
ls -la "$OUT" | tee -a "$LOG"
