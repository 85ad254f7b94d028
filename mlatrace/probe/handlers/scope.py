"""A decision whose host inputs belong to the call that encloses it.

Some decisions are made by a function that only sees device tensors (SGLang's
``TritonAttnBackend.get_num_kv_splits(num_kv_splits, seq_lens)``: the split counts are
written on device from ``seq_lens``), while the host copy of the same lengths is an
argument of the caller (``init_forward_metadata_out_graph(forward_batch)``, whose
``forward_batch.seq_lens_cpu`` the engine already holds). Two probes share them:

- ``Scope`` on the caller: its fields, evaluated when it is entered, are the thread's
  scope until it returns (scopes nest; the innermost wins); ``options.name`` names it;
- ``ScopedDecision`` on the decision function: a ``host.decision`` whose ``inputs`` are its
  own fields' inputs plus the enclosing scope's fields (its own win on a clash), with the
  ``valid`` range of a known formula (`mlatrace.decisions`) when one is named. With
  ``options.scope`` it is recorded only inside a scope of that name (aiter's
  ``topk_use_mulblocks`` inside ``top_k_per_row_decode``, not inside the prefill one).

Without ``options.scope``, a decision made outside any scope records its own inputs only.
``options.capturing_only`` records it only while a graph captures: for a decision made per
shape (TensorRT-LLM's autotuner tactic per op and input shape), whose eager calls between
replays are other shapes' and must not read as the graph's decision re-made (MLT007).
Standard library only, no device reads: the scope's fields are the caller's host values.
"""

from __future__ import annotations

import threading
from typing import Any

from mlatrace import decisions, record
from mlatrace.probe import graphs
from mlatrace.probe.handlers import Handler

_local = threading.local()


def _scopes() -> list[tuple[str | None, dict]]:
    stack = getattr(_local, "scopes", None)
    if stack is None:
        stack = _local.scopes = []
    return stack


class Scope(Handler):
    """Open a scope of host values (this probe's fields) for the decisions made inside the call."""

    OPTIONS = {"name": str}

    def before(self, view: Any, info: Any) -> Any:
        stack = _scopes()
        fields = self.fields(view)
        stack.append((self.options.get("name"), {k: v for k, v in fields.items() if v is not None}))
        return len(stack)

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        stack = _scopes()
        if isinstance(token, int) and 0 < token <= len(stack):
            del stack[token - 1:]


class ScopedDecision(Handler):
    """Record a host.decision with the enclosing scope's host values among its inputs."""

    OPTIONS = {"name": str, "formula": str, "scope": str, "capturing_only": bool}

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.name = str(self.options.get("name", spec.qualname))
        formula = self.options.get("formula")
        self.entry = decisions.known(str(formula)) if formula else None
        if formula and self.entry is None:
            raise ValueError(f"unknown decision formula {formula!r}")

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        stack = _scopes()
        wanted = self.options.get("scope")
        outer = next((values for name, values in reversed(stack)
                      if wanted is None or name == wanted), None)
        if wanted is not None and outer is None:
            return  # not inside the named scope: another caller's decision
        if self.options.get("capturing_only") and not graphs.capturing():
            return
        view.result = result   # fields may name the decision's result
        fields = self.fields(view)
        own = fields.get("inputs") if isinstance(fields.get("inputs"), dict) else {}
        inputs = {**(outer or {}), **{k: v for k, v in own.items() if v is not None}}
        value = fields.get("value")
        out = {"name": self.name, "value": value, "inputs": inputs,
               "capturing": fields.get("capturing"), "gid": fields.get("gid")}
        valid = self.entry.valid(value, inputs) if self.entry is not None else None
        if valid:
            out["valid"] = valid
        record.emit_fields("host.decision", out)
