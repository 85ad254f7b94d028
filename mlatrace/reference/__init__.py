"""AITER-style reference decode path: MLA split-KV decode, PA-v1 decode, split policies.

Lazy exports, so that `mlatrace.reference.policies` (pure Python) imports without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["MlaConfig", "Stage1Config", "Stage2Config", "mla_gluon", "paged_attention_v1",
           "policies"]

_EXPORTS = {
    "MlaConfig": ("mlatrace.reference.kernel_config", "MlaConfig"),
    "Stage1Config": ("mlatrace.reference.kernel_config", "Stage1Config"),
    "Stage2Config": ("mlatrace.reference.kernel_config", "Stage2Config"),
    "mla_gluon": ("mlatrace.reference.mla", "mla_gluon"),
    "paged_attention_v1": ("mlatrace.reference.paged_attention", "paged_attention_v1"),
    "policies": ("mlatrace.reference.policies", None),
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'mlatrace.reference' has no attribute {name!r}")
    module_name, attr = _EXPORTS[name]
    module = importlib.import_module(module_name)
    return module if attr is None else getattr(module, attr)
