#!/usr/bin/env bash
# Re-make the GPU fixtures of samples/gpu_backends/ on a CUDA machine (one device call).
# Before: python samples/gpu_backends/vendor.py /tmp/src .vendor (from the unzipped wheels,
# their *.dist-info too: without vllm's, vLLM's platform detection fails and drive.py exits 1);
# for the PyPI engine, its wheel in .whl/ (pip download --no-deps gpuopt-runtime==0.1.1).
# Usage, from the repo root:  OUT=/tmp/out bash samples/gpu_backends/run.sh [quick|extra|nopack]
# (quick: only the traces of engines no pack knows; extra: only the capture cost and the
# PyPI engine; nopack: only the frozen vLLM trace without the vLLM pack, the graph.nodes
# sources on one capture and the GPU tests of both)
# Writes $OUT/traces.tgz (re-packed after each trace, so a run cut short keeps what it
# made) and $OUT/capture_cost.jsonl; the log is what it prints.
set -u -o pipefail
export PYTHONUNBUFFERED=1 MLATRACE_VENDOR=$PWD/.vendor COLUMNS=200
OUT=${OUT:-/tmp/mlatrace-gpu-backends}
R=/tmp/gpu-backends-traces
rm -rf "$R"; mkdir -p "$R" "$OUT"
here=$PWD/samples/gpu_backends
# every replay timed (CUDA events, no sync): MLT008 reads how replay time grows
timing=(--replay-timing 1:1)
pack() { tar czf "$OUT/traces.tgz" -C "$R" .; }
report() {
  PYTHONPATH=$PWD python3 -m mlatrace check "$R/$1"
  PYTHONPATH=$PWD python3 -m mlatrace report "$R/$1" | grep -A14 "kernels (attention" | head -16
  pack
}
trace() {  # name vendor-dir driver-args...
  local name=$1 vendor=$2; shift 2
  echo "=== $name ($(date +%T))"
  # RUN_OPTS: more `mlatrace run` options (e.g. --no-pack NAME)
  PYTHONPATH=$PWD:$MLATRACE_VENDOR/$vendor:$here timeout 90 python3 -m mlatrace run \
    --out "$R/$name" --replay-sample 4 "${timing[@]}" ${RUN_OPTS:-} --probes "$here/steps.toml" -- \
    python3 "$here/drive.py" "$@"
  echo "=== $name rc=$?"
  report "$name"
}
serve() {  # name serve-args...
  local name=$1; shift
  echo "=== $name ($(date +%T))"
  PYTHONPATH=$PWD timeout 150 python3 -m mlatrace run --out "$R/$name" "${timing[@]}" -- \
    python3 -m mlatrace.reference.serve --device cuda "$@"
  echo "=== $name rc=$?"
  report "$name"
}
nvidia-smi --query-gpu=name,driver_version --format=csv
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
stage=${1:-all}
nopack() {  # the frozen trace without the vLLM pack: the Triton launch probe and the graph
  RUN_OPTS="--no-pack vllm_triton_mla" trace vllm_triton_mla_frozen_one_nopack vllm vllm \
    --capture one --decide own
  echo "=== graph.nodes sources ($(date +%T))"
  PYTHONPATH=$PWD python3 "$here/graph_sources.py" --json "$OUT/graph_sources.json"
  echo "=== gpu tests ($(date +%T))"
  PYTHONPATH=$PWD python3 -m pytest -q -rs -p no:cacheprovider -m gpu \
    tests/test_graph_data_gpu.py tests/test_probe_gpu.py 2>&1 | tail -15
  pack
}
if [ "$stage" = nopack ]; then nopack; exit 0; fi
if [ "$stage" != extra ]; then
# engines no pack knows: the split from the driver's own host code, no decision probe
trace vllm_triton_mla_own_one vllm vllm --capture one --decide own
trace vllm_triton_mla_own_bucketed vllm vllm --capture bucket --decide own
trace sglang_triton_device_splits sglang sglang --batch 1
trace sglang_triton_device_splits_b16 sglang sglang --batch 16
serve reference_legacy_lengths --policy legacy --lengths 1024,8192,32768,100000 --steps 4 \
  --batch 1 --heads 16 --layers 2
serve reference_device_lengths --policy device --lengths 1024,8192,32768,100000 --steps 4 \
  --batch 1 --heads 16 --layers 2
[ "${1:-}" = quick ] && exit 0
trace vllm_triton_mla_frozen_one vllm vllm --capture one
trace vllm_triton_mla_frozen_max vllm vllm --capture max
trace vllm_triton_mla_bucketed vllm vllm --capture bucket
nopack
fi
# what recording kernel nodes costs per capture (70 captures of 600 nodes, as a vLLM start-up)
echo "=== capture cost ($(date +%T))"
cost=$here/capture_cost.py
{ python3 "$cost" | sed 's/^{/{"arm": "untraced", /'
  PYTHONPATH=$PWD python3 -m mlatrace run --out /tmp/cc-off --no-graph-nodes -- python3 "$cost" \
    | sed 's/^{/{"arm": "traced, --no-graph-nodes", /'
  PYTHONPATH=$PWD python3 -m mlatrace run --out /tmp/cc-on -- python3 "$cost" \
    | sed 's/^{/{"arm": "traced, kernel nodes (default)", /'
  python3 - <<'EOF'
import glob, json, statistics
ns = [r["dump_ns"] for f in glob.glob("/tmp/cc-on/p*.jsonl") for r in map(json.loads, open(f))
      if r["k"] == "graph.nodes"]
print(json.dumps({"arm": "graph.nodes dump_ns", "graphs": len(ns),
                  "dump_ms_median": round(statistics.median(ns) / 1e6, 3) if ns else None}))
EOF
} | tee "$OUT/capture_cost.jsonl"
# one such graph's DOT dump, to time the parse of it off the GPU
MLATRACE_KEEP_DOT=/tmp/cc-dot PYTHONPATH=$PWD python3 -m mlatrace run --out /tmp/cc-dot-trace -- \
  python3 "$cost" --graphs 1 >/dev/null
dot=$(ls /tmp/cc-dot/*.dot 2>/dev/null | head -1); [ -n "$dot" ] && gzip -c "$dot" > "$OUT/graph600.dot.gz"
# a PyPI engine no pack knows, end to end (its wheel carried in .whl/)
if ls .whl/gpuopt_runtime-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/gpuopt_runtime-*.whl
  echo "=== pypi_gpuopt_runtime ($(date +%T))"
  PYTHONPATH=$PWD:/tmp/site timeout 150 python3 -m mlatrace run --out "$R/pypi_gpuopt_runtime" \
    "${timing[@]}" -- python3 samples/pypi_engine/gpuopt_drive.py
  echo "=== pypi_gpuopt_runtime rc=$?"
  report pypi_gpuopt_runtime
fi
pack
