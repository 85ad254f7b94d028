"""The OpenTelemetry set-up every mlatrace export shares: limits, deterministic ids, the
resource of a process, attribute values. Imported lazily, as `mlatrace.output.export.spans` is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

SCOPE = "mlatrace"
# A replay span covers at most this many replays of one graph on one thread, or this long:
# one span per replay would flood a collector (a decode server replays thousands per second).
MAX_REPLAYS_PER_SPAN = 256
MAX_REPLAY_SPAN_NS = 1_000_000_000
# Eager attention calls are one per layer per step; past this many per process they are counted.
MAX_ATTN_SPANS = 20_000
MAX_ATTN_SPANS_LIVE = 2_000  # live: each span costs flush-thread time while the program runs
# A capture freezes one launch per kernel per layer: the SDK's default of 128 events is too few.
SPAN_LIMITS_KW = {"max_events": 8192, "max_span_attributes": 256, "max_event_attributes": 256}


def span_limits() -> SpanLimits:
    """Limits large enough for a capture's frozen launches (overridable by OTEL_* env)."""
    return SpanLimits(**SPAN_LIMITS_KW)


def derive_id(bits: int, *parts: object) -> int:
    """A stable non-zero id from parts, so processes of one run share a trace without talking."""
    digest = hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).digest()
    value = int.from_bytes(digest[: bits // 8], "big")
    return value or 1


class FixedIds(RandomIdGenerator):
    """Random ids, except the next trace/span id when one is set (the process span's)."""

    def __init__(self) -> None:
        self.next_trace_id: int | None = None
        self.next_span_id: int | None = None

    def generate_trace_id(self) -> int:
        value, self.next_trace_id = self.next_trace_id, None
        return value or super().generate_trace_id()

    def generate_span_id(self) -> int:
        value, self.next_span_id = self.next_span_id, None
        return value or super().generate_span_id()


def attr_value(value: Any) -> Any:
    """An OpenTelemetry attribute value: primitives and homogeneous lists as is, the rest as JSON."""
    if value is None:
        return None
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)) and value:
        kinds = {type(v) for v in value}
        if len(kinds) == 1 and kinds <= {bool, int, float, str}:
            return list(value)
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def attrs_of(rec: dict, prefix: str = "mlatrace.", skip: Iterable[str] = ()) -> dict[str, Any]:
    """A record's own fields (not k/t/seq/tid) as prefixed attributes; dicts one level flat."""
    out: dict[str, Any] = {}
    skipped = {"k", "t", "seq", "tid", *skip}
    for key, value in rec.items():
        if key in skipped:
            continue
        if isinstance(value, dict):
            for sub, inner in value.items():
                v = attr_value(inner)
                if v is not None:
                    out[f"{prefix}{key}.{sub}"] = v
        else:
            v = attr_value(value)
            if v is not None:
                out[f"{prefix}{key}"] = v
    return out


def resource_attributes(header: dict, service_name: str) -> dict[str, Any]:
    """Semantic-convention resource attributes of a traced process, from its header."""
    attrs: dict[str, Any] = {"service.name": service_name}
    pid = header.get("pid")
    fields = {
        "host.name": header.get("host"),
        "process.pid": pid,
        "process.parent_pid": header.get("ppid"),
        "process.command_args": [str(a) for a in header.get("argv") or []] or None,
        "service.instance.id": f"{header.get('host')}:{pid}" if pid is not None else None,
        "mlatrace.rank": header.get("rank"),
        "mlatrace.world_size": header.get("world_size"),
        "mlatrace.schema": header.get("schema"),
    }
    versions = header.get("versions") or {}
    if versions.get("python"):
        fields["process.runtime.name"] = "cpython"
        fields["process.runtime.version"] = str(versions["python"])
    for name, version in versions.items():
        if version is not None and name != "python":
            fields[f"mlatrace.version.{name}"] = str(version)
    device = header.get("device") or {}
    for name, value in device.items():
        fields[f"mlatrace.device.{name}"] = attr_value(value)
    attrs.update({k: v for k, v in fields.items() if v is not None})
    return attrs


def make_provider(header: dict, service_name: str, ids: FixedIds) -> TracerProvider:
    """One provider per traced process: the resource (pid, host, rank) is per process."""
    return TracerProvider(resource=Resource.create(resource_attributes(header, service_name)),
                          id_generator=ids, span_limits=span_limits(), shutdown_on_exit=False)


@dataclass
class ProcessIds:
    """Where a process span sits: its trace, its own id, and its traced parent's span id."""

    trace_id: int | None = None
    span_id: int | None = None
    parent_span_id: int | None = None
