#!/usr/bin/env bash
# Every GPU measurement of the project in one device call (see samples/GPU_NOTES.md).
# Usage on the H200, from the repo root:  bash samples/gpu_run.sh [steps...]
# Writes $OUT/gpu_log.txt, $OUT/gpu_results.tgz (traces, tables, plots).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mlatrace-gpu}
R=/tmp/mlatrace-gpu-results   # tarred into $OUT after every step (a timeout keeps what ran)
mkdir -p "$R"
LOG=$OUT/gpu_log.txt
steps=${*:-"env check capture traces splits overhead probes record"}
run_step() {  # name timeout cmd...
  local name=$1 limit=$2; shift 2
  echo "=== $name ($(date +%T)) : $*" | tee -a "$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  echo "=== $name rc=$? ($(date +%T))" | tee -a "$LOG"
  tar czf "$OUT/gpu_results.tgz" -C "$R" . 2>>"$LOG"
}
for step in $steps; do
  case $step in
    env) run_step env 60 bash -c 'nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv; python3 -c "import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())"' ;;
    check) run_step gpu_check 240 python3 -m mlatrace.reference.gpu_check --out "$R/gpu_check" ;;
    capture) run_step capture_triton 120 python3 -m mlatrace run --out "$R/capture_triton" --replay-sample 8 -- python3 samples/gpu_capture_triton.py
             run_step capture_check 60 python3 samples/gpu_capture_triton.py --check "$R/capture_triton" ;;
    doctor) run_step doctor 60 python3 -m mlatrace probes doctor ;;
    quicksplits) run_step bench_splits_quick 240 python3 -m mlatrace bench splits --quick --out "$R/splits_quick" ;;
    quicktrace) run_step trace_quick 120 python3 -m mlatrace run --out "$R/serve_quick" --replay-sample 4 -- \
          python3 -m mlatrace.reference.serve --policy legacy --device cuda --ctx 8192 --steps 16 --check ;;
    splits) run_step bench_splits 420 python3 -m mlatrace bench splits --out "$R/splits" ;;
    traces)  # legacy in a FULL graph (the bug), bucketed in a breakable capture (the seed's fix),
             # device in a FULL graph (safe to capture once)
      for pg in legacy:full bucketed:breakable device:full; do
        policy=${pg%%:*} graph=${pg##*:}
        run_step "trace_$policy" 180 python3 -m mlatrace run --out "$R/serve_$policy" --replay-sample 4 -- \
          python3 -m mlatrace.reference.serve --policy "$policy" --graph "$graph" --device cuda --ctx 32768 --steps 64 --batch 2 --heads 16 --layers 4 --check
      done ;;
    overhead) run_step bench_overhead 300 python3 -m mlatrace bench overhead ;;
    probes) run_step bench_probes 180 python3 -m mlatrace bench probes ;;
    record) run_step bench_record 180 python3 -m mlatrace bench record ;;
  esac
done
ls -la "$OUT" | tee -a "$LOG"
