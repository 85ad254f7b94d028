"""Handlers for HF transformers continuous batching (`generate_batch`): the batch shape a
step pads to is its dispatch (graph use reads it, mlatrace.analysis.graph_use)."""

from __future__ import annotations

from typing import Any

from mlatrace import record
from mlatrace.probe import graphs
from mlatrace.probe.handlers import Handler


class PadDispatch(Handler):
    """`ModelRunner.maybe_pad_inputs(num_q_tokens, max_kv_read, use_decode_fast_path)`
    returns the padded (query tokens, KV read) the step's graph is keyed on: one `dispatch`
    per step, mode FULL where that path replays CUDA graphs (the runner's
    `use_cuda_graph_decode` / `use_cuda_graph_varlen`), NONE otherwise. Calls inside a
    probed warm-up (`runner.warmup` records) are not steps and emit nothing."""

    MARKS_STEPS = True     # each call begins a step (sampling.StepAside)

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        graphs.next_step()
        if error is not None or graphs.in_dummy_run():
            return
        if not (isinstance(result, tuple) and len(result) == 2):
            return
        fast = view.arg("use_decode_fast_path")
        runner = view.instance
        graph_on = getattr(runner, "use_cuda_graph_decode" if fast else "use_cuda_graph_varlen",
                           False)
        padded_q, padded_kv = result
        record.emit("dispatch", mode="FULL" if graph_on is True else "NONE",
                    key={"num_tokens": padded_q, "max_kv_read": padded_kv,
                         "decode_fast_path": bool(fast)},
                    num_tokens=view.arg("num_q_tokens"),
                    **({"uniform": True} if fast else {}))   # the decode fast path
