#!/usr/bin/env bash
# Tracing cost with folding on (the default), one device call: the in-process A/B of
# `mlatrace bench overhead --in-process` (breakable and eager), then separate processes,
# breakable, alternating untraced and traced runs, one JSON line per run (a timeout keeps
# the rounds that ran). Usage on the H200 from the repo root: OUT=... bash samples/gpu_fold_bench.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mlatrace-fold}
ROUNDS=${ROUNDS:-10}
mkdir -p "$OUT"
python3 -c "import torch; print(torch.__version__, torch.cuda.get_device_name())" > "$OUT/env.txt" 2>&1
timeout 170 python3 -m mlatrace bench overhead --in-process --graph breakable,none \
  --json-out "$OUT/bench-overhead-fold-ab-h200.json" > "$OUT/ab.log" 2>&1
echo "ab rc=$?" >> "$OUT/ab.log"
read -r -a CMD < <(python3 -c "from mlatrace.bench.overhead_bench import mode_command; print(' '.join(mode_command('breakable', True, 200)))")
end=$((SECONDS + ${SEP_S:-250}))
for i in $(seq 1 "$ROUNDS"); do
  [ "$SECONDS" -lt "$end" ] || break
  line=$("${CMD[@]}" 2>>"$OUT/sep.err" | grep '^{' | tail -1)
  echo "{\"round\": $i, \"arm\": \"untraced\", \"result\": ${line:-null}}" >> "$OUT/separate.jsonl"
  rm -rf /tmp/fold-t
  line=$(python3 -m mlatrace run --out /tmp/fold-t -- "${CMD[@]}" 2>>"$OUT/sep.err" | grep '^{' | tail -1)
  bytes=$(cat /tmp/fold-t/p*.jsonl | wc -c)
  echo "{\"round\": $i, \"arm\": \"traced\", \"trace_bytes\": $bytes, \"result\": ${line:-null}}" >> "$OUT/separate.jsonl"
done
python3 - "$OUT/separate.jsonl" > "$OUT/separate-summary.txt" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {"untraced": [], "traced": []}
for r in rows:
    if r["result"]:
        by[r["arm"]].append(r["result"]["median_step_us"])
u, t = by["untraced"], by["traced"]
print("rounds", min(len(u), len(t)), "untraced", u, "traced", t)
if u and t:
    print("median untraced %.1f traced %.1f ratio %.4f" % (statistics.median(u), statistics.median(t),
          statistics.median(t) / statistics.median(u)))
    pairs = [b / a for a, b in zip(u, t)]
    print("median of per-round ratios %.4f" % statistics.median(pairs))
PY
cat "$OUT/separate-summary.txt"; tail -20 "$OUT/ab.log"
