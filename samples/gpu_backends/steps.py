"""The host steps of a decode engine around the real upstream kernels, as probe targets.

The GPU drivers (drive.py) cannot import vLLM's TRITON_MLA backend or SGLang's triton
backend on the H200 (they pull in compiled extensions and the server), so the host side of
one decode step lives here, with the names and arguments the shipped packs record:

- `vllm_num_kv_splits` runs vLLM 0.33's own `_compute_num_kv_splits`, read from the wheel's
  `vllm/v1/attention/backends/mla/triton_mla.py` (the function and its two constants,
  compiled from the upstream source by ast; nothing rewritten);
- `fill_metadata` is the metadata build before a step: it copies host sequence lengths into
  the graph's static device buffers, as vLLM's builders and SGLang's replay_prepare do.

`samples/gpu_backends/steps.toml` is the pack that probes them.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path
from typing import Any

_UPSTREAM = Path(os.environ.get("MLATRACE_VENDOR", ".vendor")) / "upstream" / "triton_mla.py"
_WANTED = {"_compute_num_kv_splits", "_MIN_WORK_PER_SPLIT", "_SPLIT_OCCUPANCY_MULTIPLIER"}


def _load_upstream() -> Any:
    import triton

    tree = ast.parse(_UPSTREAM.read_text())
    keep = [node for node in tree.body
            if (isinstance(node, ast.FunctionDef) and node.name in _WANTED)
            or (isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id in _WANTED for t in node.targets))]
    namespace: dict[str, Any] = {"triton": triton}
    exec(compile(ast.Module(body=keep, type_ignores=[]), str(_UPSTREAM), "exec"), namespace)
    return namespace["_compute_num_kv_splits"]


_compute = None


def upstream_num_kv_splits(max_seq_len: int, sm_count: int) -> int:
    """vLLM 0.33's `_compute_num_kv_splits`, unprobed (the drivers' own bookkeeping)."""
    global _compute
    if _compute is None:
        _compute = _load_upstream()
    return _compute(max_seq_len, sm_count)


def vllm_num_kv_splits(max_seq_len: int, sm_count: int) -> int:
    """TritonMLAImpl.forward_mqa's split count decision (probed: host.decision)."""
    return upstream_num_kv_splits(max_seq_len, sm_count)


def fill_metadata(seq_lens_cpu: Any, seq_lens: Any, dummy: bool = False) -> None:
    """Copy the step's host sequence lengths into the static device buffer (in place)."""
    seq_lens[: seq_lens_cpu.numel()].copy_(seq_lens_cpu, non_blocking=True)
