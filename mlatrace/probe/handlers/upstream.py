"""Host decisions whose value a path expression cannot give as recorded: a torch.dtype (not
plain JSON), or a decision that only the capture's call makes meaningfully.

    handler = "mlatrace.probe.handlers.upstream:HostDecision"
    [probe.options]
    name = "sglang.dsv4.indexer.graph_max_seq_len"  # the record's name
    value = "self.MAX_SEQ_LEN_FOR_CAPTURE"         # self.<attr...> or args.<name>.<attr...>
    text = true                                    # optional: str() of the value (dtypes)
    default = "torch.bfloat16"                     # optional: the value when it reads None
    only_if = "in_capture"                         # optional: record only when this arg is truthy
    [probe.fields]
    inputs.num_reqs = "args.forward_batch.batch_size"
    capturing = "capturing()"
    gid = "gid()"

`value` is read raw (getattr along the dotted path, no calls), after the call returned.
A value that reads None with no `default` means the attribute is not there (renamed
upstream): the handler raises, and the engine reports it once as a probe.error.
"""

from __future__ import annotations

from typing import Any

from mlatrace import record
from mlatrace.probe.handlers import Handler

_MISSING = object()


class HostDecision(Handler):
    """Record one host.decision from a raw attribute path, optionally only at capture."""

    OPTIONS = {"name": str, "value": str, "text": bool, "default": str, "only_if": str}

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.name = str(self.options.get("name", spec.qualname))
        path = str(self.options.get("value", ""))
        root, _, rest = path.partition(".")
        if root == "args":
            arg, _, rest = rest.partition(".")
            self.root: tuple[str, str] = ("args", arg)
        elif root == "self":
            self.root = ("self", "")
        else:
            raise ValueError(f"option value {path!r}: start with self. or args.")
        self.attrs = tuple(part for part in rest.split(".") if part)
        self.text = bool(self.options.get("text", False))
        self.default = self.options.get("default")
        self.only_if = self.options.get("only_if")

    def _value(self, view: Any) -> Any:
        value = view.instance if self.root[0] == "self" else view.arg(self.root[1])
        for attr in self.attrs:
            if value is None:
                return None
            value = getattr(value, attr, None)
        return value

    def after(self, view: Any, info: Any, token: Any, result: Any, error: Any) -> None:
        if error is not None:
            return
        if self.only_if and not view.arg(self.only_if):
            return
        value = self._value(view)
        if value is None:
            if self.default is None:
                raise LookupError(f"{self.name}: {self.options.get('value')} not readable "
                                  "(renamed upstream?); the decision is not recorded")
            value = self.default
        elif self.text:
            value = str(value)
        elif not isinstance(value, (bool, int, float, str)):
            value = str(value)
        fields = self.fields(view)
        out = {"name": self.name, "value": value,
               "inputs": fields.get("inputs") if isinstance(fields.get("inputs"), dict) else {},
               "capturing": fields.get("capturing"), "gid": fields.get("gid")}
        record.emit_fields("host.decision", out)
