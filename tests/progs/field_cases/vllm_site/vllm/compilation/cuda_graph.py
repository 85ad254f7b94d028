"""Stand-in of vllm 0.33.0 CUDAGraphWrapper: one graph per batch descriptor of the forward
context, captured on first sight and replayed after (a HostGraph here)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from mlatrace.reference.graph import HostGraph
from vllm.forward_context import get_forward_context


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclass(frozen=True)
class BatchDescriptor:
    num_tokens: int
    num_reqs: int | None = None
    uniform: bool = False


@dataclass
class CUDAGraphEntry:
    batch_descriptor: BatchDescriptor
    cudagraph: Any = None
    output: Any = None


class CUDAGraphWrapper:
    def __init__(self, runnable, vllm_config=None, runtime_mode=CUDAGraphMode.FULL):
        self.runnable = runnable
        self.runtime_mode = runtime_mode
        self.concrete_cudagraph_entries: dict[BatchDescriptor, CUDAGraphEntry] = {}

    def __call__(self, *args, **kwargs):
        context = get_forward_context()
        if context.cudagraph_runtime_mode != self.runtime_mode:
            return self.runnable(*args, **kwargs)
        key = context.batch_descriptor
        entry = self.concrete_cudagraph_entries.setdefault(key, CUDAGraphEntry(key))
        if entry.cudagraph is None:
            graph = HostGraph()
            graph.capture_begin()
            try:
                entry.output = self.runnable(*args, **kwargs)
            finally:
                graph.capture_end()
            entry.cudagraph = graph
            return entry.output
        entry.cudagraph.replay()
        return entry.output
