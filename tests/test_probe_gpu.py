"""The probes on a real CUDA graph capture of Triton kernels (GPU), and its saved trace (CPU).

On a CUDA machine `test_capture_triton_on_gpu` runs samples/gpu_capture_triton.py under
`mlatrace run` and its checker. Everywhere, `test_saved_capture_trace` runs the same
checker on the trace saved from the H200 (samples/capture_triton), once it exists.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import REPO

SAMPLE = REPO / "samples" / "gpu_capture_triton.py"
SAVED = REPO / "samples" / "capture_triton"


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def _env() -> dict:
    return {**os.environ,
            "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


@pytest.mark.gpu
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA GPU")
def test_capture_triton_on_gpu(tmp_path):
    out = tmp_path / "capture_triton"
    run = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out), "--",
                          sys.executable, str(SAMPLE)], env=_env(), capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    check = subprocess.run([sys.executable, str(SAMPLE), "--check", str(out)], env=_env(),
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert check.returncode == 0, check.stdout


def test_saved_capture_trace():
    assert any(SAVED.glob("p*.jsonl")), f"{SAVED} is a committed fixture"
    check = subprocess.run([sys.executable, str(SAMPLE), "--check", str(SAVED)], env=_env(),
                           capture_output=True, text=True, timeout=120, cwd=REPO)
    assert check.returncode == 0, check.stdout


def test_parse_real_h200_dot_dump():
    """The DOT text torch 2.11 wrote on the H200 (kept under samples/) parses to the launch."""
    from mlatrace.probe.graph_nodes import parse_dot

    dot = (SAVED / "dot" / "p467-g1.dot").read_text()
    kernels = parse_dot(dot)
    assert kernels == [{"name": "_split_kv_decode_stage1_kernel", "grid": [4, 1, 1],
                        "block": [128, 1, 1], "smem": 16}]
