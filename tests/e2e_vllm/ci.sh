#!/usr/bin/env bash
# Real vLLM (CPU) end to end, for .ci/run: build or reuse the vLLM venv outside
# the clone, then run the tests marked `vllm` with this checkout's python.
#
# Env: MLATRACE_VLLM_VENV (default /work/vllm-venv), MLATRACE_TINY_MODEL (default
# ~/.cache/mlatrace/tiny-deepseek-v2-mla), PYTHON (default: .venv/bin/python, else python3).
# Cost on a 2-core box: venv ~2-3 min when absent (~4 s when cached), model ~5 s,
# tests ~2 min each (vLLM cold start ~80-110 s, mostly torch.compile warm-up; the
# loaded-shutdown test adds ~10 s of requests).
set -euo pipefail
cd "$(dirname "$0")/../.."
default_venv=/work/vllm-venv
[ -d "$default_venv" ] || [ -w /work ] || default_venv="$HOME/.cache/mlatrace/vllm-venv"
export MLATRACE_VLLM_VENV="${MLATRACE_VLLM_VENV:-$default_venv}"
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
t0=$(date +%s)
bash tests/e2e_vllm/setup_env.sh "$MLATRACE_VLLM_VENV"
"$MLATRACE_VLLM_VENV/bin/python" -c "import vllm, mlatrace" >/dev/null 2>&1 || {
    echo "ci.sh: vLLM venv unusable at $MLATRACE_VLLM_VENV" >&2; exit 1; }
echo "ci.sh: venv ready after $(( $(date +%s) - t0 )) s"
"$PYTHON" -m pytest -q -m vllm -p no:cacheprovider tests/test_vllm_e2e.py tests/test_watch_vllm.py \
    tests/test_field_cases.py
echo "ci.sh: vLLM end to end done in $(( $(date +%s) - t0 )) s"
