"""A host decision whose value the program does not hand to Python, evaluated by the formula
the analyser knows (mlatrace.decisions.KNOWN) from the target's arguments.

Most decision probes need no handler: ``kind = "host.decision"`` with ``value = "result"`` (or
an argument) and ``inputs.*`` fields records the decision the target returns. This handler is
for decisions made inside compiled code, such as FA3's split count, whose inputs are visible
on the Python side::

    handler = "mlatrace.probe.handlers.decision:Decision"
    [probe.options]
    formula = "vllm.flash_attn.num_splits"   # a key of decisions.KNOWN; also the record's name
    unless_input = "max_num_splits"          # optional: record nothing when this input is truthy
    require = ["num_reqs"]                   # optional: inputs that must be readable
    [probe.fields]
    inputs.seq_len_max = "args.max_seq_len"
    capturing = "capturing()"
    gid = "gid()"

The record carries ``valid`` when the formula gives the range of inputs its value holds for.
An input named in ``require`` that reads as None (an argument or attribute renamed upstream)
makes the handler raise: the engine reports it once as a ``probe.error`` and disables the
probe, so the coverage says the decision went unrecorded instead of staying silent.
"""

from __future__ import annotations

from typing import Any

from mlatrace import decisions, record
from mlatrace.probe.handlers import Handler


class Decision(Handler):
    """Record a host.decision computed by a known formula from the recorded inputs."""

    OPTIONS = {"formula": str, "name": str, "unless_input": str, "require": list[str]}

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.formula = str(self.options.get("formula", ""))
        entry = decisions.known(self.formula)
        if entry is None:
            raise ValueError(f"unknown decision formula {self.formula!r} (known: "
                             f"{', '.join(sorted(decisions.KNOWN))})")
        self.entry = entry
        self.name = str(self.options.get("name", self.formula))
        self.unless = self.options.get("unless_input")
        self.require = tuple(self.options.get("require", ()))

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        fields = self.fields(view)
        inputs = fields.get("inputs") if isinstance(fields.get("inputs"), dict) else {}
        if self.unless and inputs.get(self.unless):
            return
        missing = [name for name in self.require if inputs.get(name) is None]
        if missing:
            raise LookupError(f"{self.name}: inputs not readable: {', '.join(missing)} "
                              "(renamed upstream?); the decision is not recorded")
        value = fields.get("value")
        if value is None:
            value = self.entry.compute(inputs)
        if value is None:
            return
        out = {"name": self.name, "value": value, "inputs": inputs,
               "capturing": fields.get("capturing"), "gid": fields.get("gid")}
        valid = self.entry.valid(value, inputs)
        if valid:
            out["valid"] = valid
        record.emit_fields("host.decision", out)
