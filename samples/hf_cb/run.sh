#!/usr/bin/env bash
# HF transformers continuous batching with CUDA graphs under `mlatrace run`, on the H200.
# Usage from the repo root: OUT=/tmp/out bash samples/hf_cb/run.sh
# Writes $OUT/hf_cb.log (driver, report, check), $OUT/hf_cb_report.json, $OUT/hf_cb.tgz.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mlatrace-hf-cb}
mkdir -p "$OUT"
LOG=$OUT/hf_cb.log
T=/tmp/hf_cb_trace
rm -rf "$T"
{ python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__, torch.cuda.get_device_name())"
  timeout 170 python3 -m mlatrace run --out "$T" -- python3 samples/hf_cb/hf_cb_drive.py
  echo "run rc=$?"
  python3 -m mlatrace report "$T"
  python3 -m mlatrace check "$T" --fail-on warning; echo "check rc=$?"
} >"$LOG" 2>&1
python3 -m mlatrace report "$T" --json > "$OUT/hf_cb_report.json" 2>>"$LOG"
tar czf "$OUT/hf_cb.tgz" -C "$T" .
