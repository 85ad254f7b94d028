#!/usr/bin/env bash
# Every GPU measurement of the project in one device call (see samples/GPU_NOTES.md).
# Usage on the H200, from the repo root:  bash samples/gpu_run.sh [steps...]
# (steps: env check capture doctor quicksplits quicktrace splits traces overhead probes
# record cost; the default is "env check capture traces splits overhead probes record")
# Writes $OUT/gpu_log.txt, $OUT/gpu_results.tgz (traces, tables, plots).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mlatrace-gpu}
mkdir -p "$OUT"
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
    cost)  # timed serve traces, whatif, report/diff, the host cost of timing replays
      SERVE="python3 -m mlatrace.reference.serve --graph full --device cuda --ctx 32768 --steps 64 --batch 2 --heads 16 --layers 4 --check --sync-debug"
      for policy in legacy device; do
        run_step "trace_${policy}_timed" 180 python3 -m mlatrace run --out "$R/gpu_serve_${policy}_timed" \
          --replay-sample 4 --replay-timing 8:4 -- $SERVE --policy $policy
      done
      L=$R/gpu_serve_legacy_timed D=$R/gpu_serve_device_timed
      run_step whatif 240 python3 -m mlatrace whatif "$L" --save
      run_step whatif_lengths 240 python3 -m mlatrace whatif "$L" --lengths 8192,32768,100000
      run_step report_legacy 60 python3 -m mlatrace report "$L"
      run_step report_device 60 python3 -m mlatrace report "$D"
      run_step diff 60 python3 -m mlatrace diff "$L" "$D"
      run_step report_json 60 bash -c "python3 -m mlatrace report --json '$L' > '$R/report_legacy.json'"
      BENCH="python3 -m mlatrace.reference.serve --device cuda --policy device --graph full --ctx 16384 --batch 4 --heads 16 --layers 8 --hidden 1024 --warmup 20 --bench --steps 400 --sync-debug"
      for t in off 8:64 1000000:1 off 8:64 1000000:1; do
        run_step "timing_cost_$t" 120 python3 -m mlatrace run --out "$R/cost_${t//:/_}_$RANDOM" \
          --replay-timing "$t" -- $BENCH
      done
      rm -rf "$R"/cost_*
      run_step pytest_gpu_timing 300 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_replay_timing_gpu.py ;;
  esac
done
ls -la "$OUT" | tee -a "$LOG"
