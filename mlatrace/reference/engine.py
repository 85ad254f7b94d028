"""A small MLA decode engine shaped like vLLM's, so the production probes find seed 002 in it.

The names are vLLM's on purpose (the `reference` probe pack targets them):
`ReferenceMLAMetadataBuilder.build` copies host sequence lengths into the static
`seq_info` buffer, `ReferenceMLAImpl.forward_mqa` calls `mla_gluon` with the metadata's
`min_kv_seq_len` hint, `ReferenceModelRunner._dummy_run` / `capture_model` capture one
graph per batch size at a dummy length (default 1, like vLLM), and `CUDAGraphWrapper`
captures on the first call per `BatchDescriptor` and replays afterwards.

Graph modes:
- "full": one graph per batch size. The MLA split count is frozen at capture: with the
  legacy policy captured at length 1 every replay runs one KV split (seed 002).
- "breakable": each layer's MLA call is an eager break between captured graph segments
  (the seed's final design: parent graphs + eager MLA calls), so the host picks the split
  count from the real length every step.
- "none": eager, every step.

On CUDA the graphs are `torch.cuda.CUDAGraph`; elsewhere `graph.HostGraph`, which records
the launches made during capture and replays them with their host decisions frozen.

The model: `num_layers` x (q projection -> MLA decode over a paged KV cache -> output
projection with residual). The KV cache is filled once with random rows at scattered
(permuted) slots and each step attends over the first `seq_len` pages of its request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import math
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from mlatrace.reference import graph, policies
from mlatrace.reference.layout import D_LATENT, D_ROPE, KV_ROW
from mlatrace.reference.mla import mla_gluon, mla_reference

GRAPH_MODES = ("full", "breakable", "none")


def unprobed_num_kv_splits(policy: str, batch: int, qlen: int, nhead: int,
                           min_kv_seq_len: int) -> int:
    """The split count mla_gluon picks, for introspection and display.

    Calls the policy past any probe wrapper: the `reference` pack records each call of
    `policies.num_kv_splits` as a `kernel.split`, and only mla_gluon's own call is one.
    """
    return inspect.unwrap(policies.num_kv_splits)(policy, batch, qlen, nhead, min_kv_seq_len)


class CUDAGraphMode:
    """The runtime modes the forward context carries (a subset of vLLM's enum)."""

    NONE = "NONE"
    FULL = "FULL"


class BatchDescriptor(NamedTuple):
    """Key of one captured graph, as in vLLM: padded token count and uniform decode."""

    num_tokens: int
    uniform: bool = True


# ---------------------------------------------------------------------------------------
# Forward context: what the step's attention reads at call time (also at eager breaks).
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class ForwardContext:
    attn_metadata: ReferenceMLAMetadata | None
    batch_descriptor: BatchDescriptor | None
    cudagraph_runtime_mode: str


_forward_state = threading.local()


def get_forward_context() -> ForwardContext | None:
    return getattr(_forward_state, "context", None)


@contextlib.contextmanager
def set_forward_context(attn_metadata: ReferenceMLAMetadata | None,
                        batch_descriptor: BatchDescriptor | None = None,
                        cudagraph_runtime_mode: str = CUDAGraphMode.NONE
                        ) -> Iterator[ForwardContext]:
    previous = get_forward_context()
    context = ForwardContext(attn_metadata, batch_descriptor, cudagraph_runtime_mode)
    _forward_state.context = context
    try:
        yield context
    finally:
        _forward_state.context = previous


# ---------------------------------------------------------------------------------------
# Attention metadata and its builder
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class ReferenceMLAMetadata:
    """Decode metadata like vLLM's AiterMLADecodeMetadata: device views plus a host hint.

    `min_kv_seq_len` defaults to 1 exactly like AiterMLADecodeMetadata; it is only a host
    hint for the split policy, the kernels read the real lengths from `seq_info`.
    """

    seq_info: torch.Tensor
    page_table: torch.Tensor
    num_reqs: int
    seq_lens_cpu: torch.Tensor
    max_seq_len: int
    min_kv_seq_len: int = 1
    dummy: bool = False


class ReferenceMLAMetadataBuilder:
    """Owns the static `seq_info` and `page_table` buffers every graph reads."""

    def __init__(self, max_num_reqs: int, max_pages: int, device: torch.device,
                 capture_hint: int | None = None) -> None:
        self.device = device
        self.capture_hint = capture_hint
        self.seq_info = torch.zeros(max_num_reqs, dtype=torch.int32, device=device)
        self.page_table = torch.zeros(max_num_reqs, max_pages, dtype=torch.int32, device=device)

    def build(self, seq_lens_cpu: torch.Tensor | Sequence[int],
              block_table_cpu: torch.Tensor | None = None, *,
              dummy: bool = False) -> ReferenceMLAMetadata:
        """Copy host lengths (and a new page table) into the static buffers; no device read.

        `seq_lens_cpu` must stay unchanged until the asynchronous copy has run (vLLM keeps
        it in a pinned CpuGpuBuffer; the serve program keeps one pinned row per step).
        `min_kv_seq_len` is the real minimum from the host lengths, or for a dummy run
        the capture hint when one is set (seed 002's first fix was a hint of 16384).
        """
        if not isinstance(seq_lens_cpu, torch.Tensor):
            seq_lens_cpu = torch.tensor(list(seq_lens_cpu), dtype=torch.int32)
        num_reqs = int(seq_lens_cpu.shape[0])
        self.seq_info[:num_reqs].copy_(seq_lens_cpu, non_blocking=True)
        if block_table_cpu is not None:
            self.page_table[:num_reqs].copy_(block_table_cpu, non_blocking=True)
        min_kv_seq_len = int(seq_lens_cpu.min())
        if dummy and self.capture_hint is not None:
            min_kv_seq_len = self.capture_hint
        return ReferenceMLAMetadata(
            seq_info=self.seq_info[:num_reqs], page_table=self.page_table[:num_reqs],
            num_reqs=num_reqs, seq_lens_cpu=seq_lens_cpu,
            max_seq_len=int(seq_lens_cpu.max()), min_kv_seq_len=min_kv_seq_len, dummy=dummy)


# ---------------------------------------------------------------------------------------
# Attention layer and impl
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class ReferenceMLALayer:
    """What vLLM passes as `layer` to forward_mqa: an index, a name, and this layer's cache."""

    layer_idx: int
    layer_name: str
    impl: ReferenceMLAImpl
    kv_cache: torch.Tensor


class ReferenceMLAImpl:
    """The MLA backend impl: forward_mqa hands the host hint to mla_gluon, like vLLM's AITER MLA."""

    def __init__(self, num_heads: int, policy: str = "legacy", backend: str = "auto") -> None:
        if policy not in policies.POLICIES and not policy.startswith("fixed:"):
            raise ValueError(f"unknown policy {policy!r}")
        self.num_heads = num_heads
        self.policy = policy
        self.backend = backend
        self.scale = 1.0 / math.sqrt(KV_ROW)
        # Introspection for tests and the serve program (never read by probes).
        self.num_calls = 0
        self.last_num_kv_splits: dict[int, int] = {}

    def forward_mqa(self, q: tuple[torch.Tensor, torch.Tensor], kv_c_and_k_pe_cache: torch.Tensor,
                    attn_metadata: ReferenceMLAMetadata, layer: ReferenceMLALayer
                    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Decode attention for one layer; returns (o [batch, heads, 512], None)."""
        q_nope, q_pe = q
        batch, num_heads, _ = q_nope.shape
        o = torch.empty(batch, num_heads, D_LATENT, dtype=q_nope.dtype, device=q_nope.device)
        mla_gluon(q_nope, q_pe, kv_c_and_k_pe_cache, o, attn_metadata.page_table,
                  attn_metadata.seq_info, self.scale, min_kv_seq_len=attn_metadata.min_kv_seq_len,
                  policy=self.policy, backend=self.backend)
        self.num_calls += 1
        self.last_num_kv_splits[layer.layer_idx] = unprobed_num_kv_splits(
            self.policy, batch, 1, num_heads, attn_metadata.min_kv_seq_len)
        return o, None


# ---------------------------------------------------------------------------------------
# Breakable capture: graph segments with eager calls between them
# ---------------------------------------------------------------------------------------


def _new_graph(device: torch.device) -> Any:
    return torch.cuda.CUDAGraph() if device.type == "cuda" else graph.HostGraph()


class BreakableCUDAGraphCapture:
    """Capture context whose eager breaks end a graph segment, run eagerly, and start the next.

    `segments` holds ("graph", g) and ("eager", fn) in order; `replay()` replays the graphs
    and calls the eager functions, which read the forward context of the current step.
    """

    _state = threading.local()

    def __init__(self, device: torch.device, pool: Any = None) -> None:
        self.device = device
        self.pool = pool
        self.segments: list[tuple[str, Any]] = []
        self._graph: Any = None
        self._stream_context: Any = None

    @classmethod
    def current(cls) -> BreakableCUDAGraphCapture | None:
        return getattr(cls._state, "capture", None)

    @property
    def num_graphs(self) -> int:
        return sum(1 for kind, _ in self.segments if kind == "graph")

    @property
    def num_eager_breaks(self) -> int:
        return sum(1 for kind, _ in self.segments if kind == "eager")

    def __enter__(self) -> BreakableCUDAGraphCapture:
        if self.device.type == "cuda":
            # Capture needs a side stream, as torch.cuda.graph uses; eager breaks run on it too.
            torch.cuda.synchronize(self.device)
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            self._stream_context = torch.cuda.stream(stream)
            self._stream_context.__enter__()
        BreakableCUDAGraphCapture._state.capture = self
        self._begin_segment()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._end_segment()
        finally:
            BreakableCUDAGraphCapture._state.capture = None
            if self._stream_context is not None:
                stream = torch.cuda.current_stream(self.device)
                self._stream_context.__exit__(*exc)
                torch.cuda.current_stream(self.device).wait_stream(stream)
                self._stream_context = None

    def _begin_segment(self) -> None:
        self._graph = _new_graph(self.device)
        self._graph.capture_begin(pool=self.pool)

    def _end_segment(self) -> None:
        self._graph.capture_end()
        self.segments.append(("graph", self._graph))
        self._graph = None

    def add_eager(self, fn: Callable[[], Any]) -> Any:
        """End the current segment, run `fn` eagerly now and at every replay, start a new one."""
        self._end_segment()
        self.segments.append(("eager", fn))
        result = fn()
        self._begin_segment()
        return result

    def replay(self) -> None:
        for kind, item in self.segments:
            if kind == "graph":
                item.replay()
            else:
                item()


def eager_break_during_capture(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Make `fn` a break point of a breakable capture (eager at capture and at every replay)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        capture = BreakableCUDAGraphCapture.current()
        if capture is None:
            return fn(*args, **kwargs)
        return capture.add_eager(functools.partial(fn, *args, **kwargs))

    return wrapper


def _copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)


@eager_break_during_capture
def unified_mla_attention(q_nope: torch.Tensor, q_pe: torch.Tensor, output: torch.Tensor,
                          layer: ReferenceMLALayer) -> None:
    """The attention op of one layer; reads this step's metadata from the forward context."""
    context = get_forward_context()
    if context is None or context.attn_metadata is None:
        raise RuntimeError("unified_mla_attention called outside set_forward_context")
    o, _ = layer.impl.forward_mqa((q_nope, q_pe), layer.kv_cache, context.attn_metadata, layer)
    graph.launch(_copy_into, output, o)


# ---------------------------------------------------------------------------------------
# CUDAGraphWrapper: capture on first call per batch descriptor, replay afterwards
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class CUDAGraphEntry:
    batch_descriptor: BatchDescriptor
    cudagraph: Any = None                      # torch.cuda.CUDAGraph | HostGraph (FULL)
    capture: BreakableCUDAGraphCapture | None = None   # breakable
    output: Any = None
    input_addresses: list[int] | None = None
    num_kv_splits: dict[int, int] | None = None        # per layer, as captured (introspection)
    replay_count: int = 0


class CUDAGraphWrapper:
    """vLLM-like wrapper: FULL capture (or breakable capture) per BatchDescriptor, then replay."""

    def __init__(self, runnable: Callable[..., Any], runtime_mode: str = CUDAGraphMode.FULL, *,
                 breakable: bool = False, device: torch.device | None = None,
                 on_captured: Callable[[CUDAGraphEntry], None] | None = None) -> None:
        self.runnable = runnable
        self.runtime_mode = runtime_mode
        self.breakable = breakable
        self.device = device if device is not None else torch.device("cpu")
        self.graph_pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None
        self.concrete_cudagraph_entries: dict[BatchDescriptor, CUDAGraphEntry] = {}
        self.on_captured = on_captured

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        context = get_forward_context()
        if (context is None or context.batch_descriptor is None
                or context.cudagraph_runtime_mode != self.runtime_mode):
            return self.runnable(*args, **kwargs)
        key = context.batch_descriptor
        entry = self.concrete_cudagraph_entries.get(key)
        if entry is None:
            entry = self.concrete_cudagraph_entries[key] = CUDAGraphEntry(key)
            return self._capture(entry, *args, **kwargs)
        return self._replay(entry)

    def _capture(self, entry: CUDAGraphEntry, *args: Any, **kwargs: Any) -> Any:
        entry.input_addresses = [a.data_ptr() for a in args if isinstance(a, torch.Tensor)]
        if self.breakable:
            entry.capture = BreakableCUDAGraphCapture(self.device, pool=self.graph_pool)
            with entry.capture:
                entry.output = self.runnable(*args, **kwargs)
        elif self.device.type == "cuda":
            entry.cudagraph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(entry.cudagraph, pool=self.graph_pool):
                entry.output = self.runnable(*args, **kwargs)
        else:
            entry.cudagraph = graph.HostGraph()
            with graph.graph(entry.cudagraph):
                entry.output = self.runnable(*args, **kwargs)
        if self.on_captured is not None:
            self.on_captured(entry)
        return entry.output

    def _replay(self, entry: CUDAGraphEntry) -> Any:
        if entry.capture is not None:
            entry.capture.replay()
        else:
            entry.cudagraph.replay()
        entry.replay_count += 1
        return entry.output


class CudagraphDispatcher:
    """Picks the runtime mode and batch descriptor of a step, like vLLM's dispatcher: a
    batch is padded up to the smallest captured size that holds it and replays that graph;
    one above the largest captured size runs eagerly (mode NONE, its own size)."""

    def __init__(self, captured_sizes: Sequence[int], graphs_enabled: bool) -> None:
        self.captured_sizes = sorted(set(captured_sizes))
        self.graphs_enabled = graphs_enabled

    def padded_size(self, num_tokens: int, uniform_decode: bool = True) -> int | None:
        """The captured size a batch of `num_tokens` replays at, or None (eager)."""
        if not (self.graphs_enabled and uniform_decode):
            return None
        for size in self.captured_sizes:
            if size >= num_tokens:
                return size
        return None

    def dispatch(self, num_tokens: int, uniform_decode: bool = True
                 ) -> tuple[str, BatchDescriptor]:
        padded = self.padded_size(num_tokens, uniform_decode)
        if padded is not None:
            return CUDAGraphMode.FULL, BatchDescriptor(num_tokens=padded, uniform=uniform_decode)
        return CUDAGraphMode.NONE, BatchDescriptor(num_tokens=num_tokens, uniform=uniform_decode)


# ---------------------------------------------------------------------------------------
# Model and runner
# ---------------------------------------------------------------------------------------


@dataclasses.dataclass
class EngineConfig:
    batch_sizes: tuple[int, ...] = (2,)
    num_heads: int = 16
    num_layers: int = 2
    hidden_size: int = 256
    max_seq_len: int = 4096
    policy: str = "legacy"
    backend: str = "auto"
    capture_len: int = 1
    capture_hint: int | None = None
    graph_mode: str = "full"
    device: str = "cpu"
    dtype: torch.dtype = torch.float32
    seed: int = 0
    num_warmups: int = 1
    max_num_reqs: int | None = None    # the largest batch a step may hold (default: the
                                       # largest captured size; above it a step runs eagerly)


def _project(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> None:
    torch.matmul(x, weight, out=out)


def _residual_project(residual: torch.Tensor, x: torch.Tensor, weight: torch.Tensor,
                      out: torch.Tensor) -> None:
    torch.addmm(residual, x, weight, out=out)


class ReferenceModel:
    """num_layers x (q projections -> MLA decode -> output projection + residual)."""

    def __init__(self, config: EngineConfig, impl: ReferenceMLAImpl, num_slots: int) -> None:
        device = torch.device(config.device)
        gen = torch.Generator().manual_seed(config.seed)
        heads, hidden = config.num_heads, config.hidden_size

        def weight(rows: int, cols: int) -> torch.Tensor:
            w = torch.randn(rows, cols, generator=gen) / math.sqrt(rows)
            return w.to(device=device, dtype=config.dtype)

        self.num_heads = heads
        self.hidden_size = hidden
        self.w_q_nope = [weight(hidden, heads * D_LATENT) for _ in range(config.num_layers)]
        self.w_q_pe = [weight(hidden, heads * D_ROPE) for _ in range(config.num_layers)]
        self.w_o = [weight(heads * D_LATENT, hidden) for _ in range(config.num_layers)]
        self.layers = [
            ReferenceMLALayer(
                layer_idx=i, layer_name=f"model.layers.{i}.self_attn.attn", impl=impl,
                kv_cache=torch.randn(num_slots, KV_ROW, generator=gen).to(device=device,
                                                                         dtype=config.dtype))
            for i in range(config.num_layers)]

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """One decode step; every device op goes through graph.launch so HostGraph can record it."""
        batch = hidden_states.shape[0]
        like = dict(dtype=hidden_states.dtype, device=hidden_states.device)
        h = hidden_states
        for layer in self.layers:
            i = layer.layer_idx
            q_nope = torch.empty(batch, self.num_heads, D_LATENT, **like)
            q_pe = torch.empty(batch, self.num_heads, D_ROPE, **like)
            graph.launch(_project, h, self.w_q_nope[i], q_nope.view(batch, -1))
            graph.launch(_project, h, self.w_q_pe[i], q_pe.view(batch, -1))
            attn_out = torch.empty(batch, self.num_heads, D_LATENT, **like)
            unified_mla_attention(q_nope, q_pe, attn_out, layer)
            h_next = torch.empty(batch, self.hidden_size, **like)
            graph.launch(_residual_project, h, attn_out.view(batch, -1), self.w_o[i], h_next)
            h = h_next
        return h

    def reference_forward(self, hidden_states: torch.Tensor, page_table: torch.Tensor,
                          seq_lens: Sequence[int], sm_scale: float) -> torch.Tensor:
        """The same step in float64 with naive attention (host lengths): the exact answer."""
        h = hidden_states.double()
        batch = h.shape[0]
        for layer in self.layers:
            i = layer.layer_idx
            q_nope = (h @ self.w_q_nope[i].double()).view(batch, self.num_heads, D_LATENT)
            q_pe = (h @ self.w_q_pe[i].double()).view(batch, self.num_heads, D_ROPE)
            o, _ = mla_reference(q_nope, q_pe, layer.kv_cache.double(), page_table,
                                 list(seq_lens), sm_scale)
            h = h + o.view(batch, -1) @ self.w_o[i].double()
        return h


class ReferenceModelRunner:
    """Captures one graph per batch size at a dummy length, then decodes steps (vLLM-shaped)."""

    def __init__(self, config: EngineConfig) -> None:
        if config.graph_mode not in GRAPH_MODES:
            raise ValueError(f"graph mode must be one of {GRAPH_MODES}, got {config.graph_mode!r}")
        if not 1 <= config.capture_len <= config.max_seq_len:
            raise ValueError("capture_len must be in 1..max_seq_len")
        self.config = config
        self.device = torch.device(config.device)
        self.max_num_reqs = max(max(config.batch_sizes), config.max_num_reqs or 0)
        max_pages = config.max_seq_len
        num_slots = self.max_num_reqs * max_pages
        gen = torch.Generator().manual_seed(config.seed + 1)
        # Scattered pages: request b's token t lives at a random slot (page size 1).
        self.page_table_cpu = torch.randperm(num_slots, generator=gen).to(torch.int32).view(
            self.max_num_reqs, max_pages)
        self.impl = ReferenceMLAImpl(config.num_heads, config.policy, config.backend)
        self.model = ReferenceModel(config, self.impl, num_slots)
        self.attn_metadata_builder = ReferenceMLAMetadataBuilder(
            self.max_num_reqs, max_pages, self.device, capture_hint=config.capture_hint)
        self.attn_metadata_builder.page_table.copy_(self.page_table_cpu)
        self.input_hidden = torch.zeros(self.max_num_reqs, config.hidden_size,
                                        dtype=config.dtype, device=self.device)
        self.cudagraph_batch_sizes = sorted(config.batch_sizes)
        self.cudagraph_dispatcher = CudagraphDispatcher(self.cudagraph_batch_sizes,
                                                        config.graph_mode != "none")
        self.wrapper: CUDAGraphWrapper | None = None
        if config.graph_mode != "none":
            self.wrapper = CUDAGraphWrapper(
                self.model.forward, CUDAGraphMode.FULL, breakable=config.graph_mode == "breakable",
                device=self.device, on_captured=self._remember_captured_splits)

    def _remember_captured_splits(self, entry: CUDAGraphEntry) -> None:
        entry.num_kv_splits = dict(self.impl.last_num_kv_splits)

    def _model_callable(self) -> Callable[[torch.Tensor], torch.Tensor]:
        return self.wrapper if self.wrapper is not None else self.model.forward

    def _dummy_run(self, batch_size: int, cudagraph_runtime_mode: str = CUDAGraphMode.NONE,
                   capture_len: int | None = None) -> torch.Tensor:
        """A step on dummy metadata: every request at `capture_len` tokens (default 1)."""
        seq_len = self.config.capture_len if capture_len is None else capture_len
        seq_lens = torch.full((batch_size,), seq_len, dtype=torch.int32)
        attn_metadata = self.attn_metadata_builder.build(seq_lens, dummy=True)
        descriptor = BatchDescriptor(num_tokens=batch_size, uniform=True)
        with set_forward_context(attn_metadata, descriptor, cudagraph_runtime_mode):
            return self._model_callable()(self.input_hidden[:batch_size])

    def capture_model(self) -> None:
        """Warm up eagerly, then capture one graph per batch size (largest first, as vLLM)."""
        if self.wrapper is None:
            return
        for batch_size in sorted(self.cudagraph_batch_sizes, reverse=True):
            if self.device.type == "cuda":
                side = torch.cuda.Stream(self.device)
                side.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(side):
                    for _ in range(self.config.num_warmups):
                        self._dummy_run(batch_size, CUDAGraphMode.NONE)
                torch.cuda.current_stream(self.device).wait_stream(side)
            else:
                for _ in range(self.config.num_warmups):
                    self._dummy_run(batch_size, CUDAGraphMode.NONE)
            self._dummy_run(batch_size, CUDAGraphMode.FULL)

    def execute_model(self, hidden_states: torch.Tensor,
                      seq_lens_cpu: torch.Tensor | Sequence[int]) -> torch.Tensor:
        """One decode step: fill the static buffers, then replay (or run eagerly).

        A batch smaller than the captured size it dispatches to is padded, as vLLM pads:
        the padding requests have length 1 and their rows of the output are dropped."""
        batch = int(hidden_states.shape[0])
        if batch > self.max_num_reqs:
            raise ValueError(f"batch {batch} above max_num_reqs {self.max_num_reqs}")
        self.input_hidden[:batch].copy_(hidden_states, non_blocking=True)
        padded = self.cudagraph_dispatcher.padded_size(batch) or batch
        if padded > batch:
            if not isinstance(seq_lens_cpu, torch.Tensor):
                seq_lens_cpu = torch.tensor(list(seq_lens_cpu), dtype=torch.int32)
            seq_lens_cpu = torch.cat([seq_lens_cpu.to(torch.int32),
                                      torch.ones(padded - batch, dtype=torch.int32)])
        attn_metadata = self.attn_metadata_builder.build(seq_lens_cpu)
        mode, descriptor = self.cudagraph_dispatcher.dispatch(batch, uniform_decode=True)
        with set_forward_context(attn_metadata, descriptor, mode):
            return self._model_callable()(self.input_hidden[:padded])[:batch]

    def reference_output(self, hidden_states: torch.Tensor, seq_lens: Sequence[int]) -> torch.Tensor:
        """Float64 answer of one step with these inputs (for --check and tests)."""
        batch = int(hidden_states.shape[0])
        return self.model.reference_forward(hidden_states, self.page_table_cpu[:batch].to(
            self.device), seq_lens, self.impl.scale)

    # -- introspection (tests, serve output) ---------------------------------------------

    def captured_entry(self, batch_size: int) -> CUDAGraphEntry | None:
        if self.wrapper is None:
            return None
        return self.wrapper.concrete_cudagraph_entries.get(BatchDescriptor(batch_size, True))

    def captured_num_kv_splits(self, batch_size: int) -> dict[int, int] | None:
        """Split count per layer frozen in the graph of `batch_size` (None: not captured)."""
        entry = self.captured_entry(batch_size)
        return None if entry is None else entry.num_kv_splits

    def captured_launch_names(self, batch_size: int) -> list[str]:
        """Names of the launches a host graph recorded (CPU full mode only)."""
        entry = self.captured_entry(batch_size)
        if entry is None or not isinstance(entry.cudagraph, graph.HostGraph):
            return []
        return entry.cudagraph.launch_names()
