"""Stand-in of vllm 0.33.0 vllm/forward_context.py: the context the graph wrapper reads."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

_current: list = []


@dataclass
class ForwardContext:
    attn_metadata: Any
    cudagraph_runtime_mode: Any
    batch_descriptor: Any


def is_forward_context_available() -> bool:
    return bool(_current)


def get_forward_context() -> ForwardContext:
    return _current[-1]


@contextlib.contextmanager
def set_forward_context(attn_metadata, vllm_config=None, cudagraph_runtime_mode=None,
                        batch_descriptor=None, **kwargs):
    _current.append(ForwardContext(attn_metadata, cudagraph_runtime_mode, batch_descriptor))
    try:
        yield
    finally:
        _current.pop()
