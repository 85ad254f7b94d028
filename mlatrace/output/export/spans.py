"""OpenTelemetry spans from mlatrace records: the mapping, apart from any transport.

`ProcessSpans` turns one process's records, in file order, into spans on a tracer:
the process span, one span per graph capture (frozen launches, split decisions,
eager breaks and syncs as its events), one span per batch of replays of one graph,
one short span per attention call, findings as events. `build_spans` runs it over a
whole trace into memory; `mlatrace.output.export.otlp` sends what it built, and
`mlatrace.output.export.live` feeds it record batches inside a traced process.

OpenTelemetry is imported here, so this module is only imported lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from mlatrace.kinds import (
    ATTN_CALL,
    ATTN_METADATA,
    CAPTURE_BEGIN,
    CAPTURE_END,
    DISPATCH,
    EAGER_BREAK,
    GRAPH_NODES,
    KERNEL_LAUNCH,
    KERNEL_SKIP,
    KERNEL_SPLIT,
    MARK,
    PROBE_ERROR,
    PROCESS,
    PROCESS_END,
    PROCESS_RANK,
    REPLAY,
    REPLAY_TIME,
    STEADY,
    SYNC,
)
from mlatrace.output.export.otel_setup import (  # noqa: F401  (re-exported: live, otlp)
    MAX_ATTN_SPANS,
    MAX_ATTN_SPANS_LIVE,
    MAX_REPLAY_SPAN_NS,
    MAX_REPLAYS_PER_SPAN,
    SCOPE,
    SPAN_LIMITS_KW,
    FixedIds,
    ProcessIds,
    attr_value,
    attrs_of,
    derive_id,
    make_provider,
    resource_attributes,
    span_limits,
)


class _ReplayBatch:
    """Consecutive replays of one graph on one thread, exported as one span (running totals:
    this runs once per replay record, on the flush thread in live export)."""

    def __init__(self, gid: Any, start: int) -> None:
        self.gid = gid
        self.start = start
        self.end = start
        self.count = 0
        self.n_first: Any = None
        self.n_last: Any = None
        self.gpu_timed = 0
        self.gpu_sum = 0
        self.gpu_max = 0
        self.len_min: Any = None
        self.len_max: Any = None
        self.tokens_max: Any = None
        self.mode: Any = None
        self.steps: Any = None     # a fold of steady steps (a `steady` record): its steps

    def add_fold(self, rec: dict, end: int) -> None:
        """A `steady` record: the replays it stands for, their lengths and tokens as ranges."""
        self.count = rec.get("replays") if type(rec.get("replays")) is int else 0
        self.n_first, self.n_last = rec.get("n_first"), rec.get("n_last")
        self.steps = rec.get("steps")
        self.end = max(self.end, end)
        fields = rec.get("fields") if isinstance(rec.get("fields"), dict) else {}
        same = rec.get("same") if isinstance(rec.get("same"), dict) else {}
        span = (fields.get(ATTN_METADATA) or {}).get("seq_len_max")
        if isinstance(span, list) and len(span) == 2:
            self.len_min, self.len_max = span
        tokens = (fields.get("dispatch") or {}).get("num_tokens")
        if isinstance(tokens, list) and len(tokens) == 2:
            self.tokens_max = tokens[1]
        self.mode = (same.get("dispatch") or {}).get("mode", self.mode)
        gpu = rec.get("gpu_ns") if isinstance(rec.get("gpu_ns"), dict) else {}
        if type(gpu.get("max")) is int:
            self.gpu_max = gpu["max"]

    def add(self, rec: dict, ts: int, meta: dict | None, dispatch: dict | None) -> None:
        self.count += 1
        n = rec.get("n")
        if self.count == 1:
            self.n_first = n
        self.n_last = n
        gpu = rec.get("gpu_ns")
        if type(gpu) is int:
            self.gpu_timed += 1
            self.gpu_sum += gpu
            if gpu > self.gpu_max:
                self.gpu_max = gpu
            ts += gpu
        if ts > self.end:
            self.end = ts
        if meta is not None:
            length = meta.get("seq_len_max")
            if type(length) is int:
                if self.len_min is None or length < self.len_min:
                    self.len_min = length
                if self.len_max is None or length > self.len_max:
                    self.len_max = length
        if dispatch is not None:
            tokens = dispatch.get("num_tokens")
            if type(tokens) is int and (self.tokens_max is None or tokens > self.tokens_max):
                self.tokens_max = tokens
            self.mode = dispatch.get("mode", self.mode)

    def attributes(self) -> dict[str, Any]:
        attrs: dict[str, Any] = {"mlatrace.gid": attr_value(self.gid),
                                 "mlatrace.replay.count": self.count}
        if self.n_first is not None:
            attrs["mlatrace.replay.n_first"] = self.n_first
            attrs["mlatrace.replay.n_last"] = self.n_last
        if self.gpu_timed:
            attrs["mlatrace.replay.gpu_ns.sum"] = self.gpu_sum
            attrs["mlatrace.replay.gpu_ns.max"] = self.gpu_max
            attrs["mlatrace.replay.gpu_ns.timed"] = self.gpu_timed
        if self.len_max is not None:
            attrs["mlatrace.replay.seq_len_max.min"] = self.len_min
            attrs["mlatrace.replay.seq_len_max.max"] = self.len_max
        if self.tokens_max is not None:
            attrs["mlatrace.replay.num_tokens.max"] = self.tokens_max
        if self.mode is not None:
            attrs["mlatrace.dispatch.mode"] = attr_value(self.mode)
        if self.steps is not None:
            attrs["mlatrace.steady.steps"] = attr_value(self.steps)
            if self.gpu_max:
                attrs["mlatrace.steady.gpu_ns.max"] = self.gpu_max
        return attrs


def finding_event(finding: Any) -> tuple[str, dict[str, Any]]:
    """A finding as a span event: named by its id, severity/message/hint as attributes."""
    evidence = [f"{e.file}:{e.seq} {e.kind} {e.what}".strip() for e in getattr(finding, "evidence", [])]
    attrs = {
        "mlatrace.finding.id": finding.id,
        "mlatrace.finding.name": getattr(finding, "name", "") or "",
        "mlatrace.finding.severity": finding.severity,
        "mlatrace.finding.message": finding.message,
        "mlatrace.finding.hint": getattr(finding, "hint", "") or "",
    }
    if evidence:
        attrs["mlatrace.finding.evidence"] = evidence
    if getattr(finding, "gid", None) is not None:
        attrs["mlatrace.gid"] = attr_value(finding.gid)
    return finding.id, attrs


class ProcessSpans:
    """Spans of one traced process, built record by record in file order."""

    def __init__(self, tracer: trace_api.Tracer, ids: FixedIds, header: dict, *,
                 where: ProcessIds | None = None, findings: Sequence[Any] = (),
                 max_attn_spans: int = MAX_ATTN_SPANS) -> None:
        self.tracer = tracer
        self.max_attn_spans = max_attn_spans
        self.header = header
        self.wall_ns = int(header.get("wall_ns") or 0)
        self.last_ts = self.wall_ns + int(header.get("t") or 0)
        self.counts: dict[str, int] = {}
        self.open: dict[Any, Any] = {}          # gid -> open capture span
        self.ctx: dict[Any, SpanContext] = {}   # gid -> capture span context (open or ended)
        self.stacks: dict[Any, list[Any]] = {}  # tid -> open capture gids, innermost last
        self.meta: dict[Any, dict] = {}         # tid -> latest attn.metadata
        self.dispatch: dict[Any, dict] = {}     # tid -> latest dispatch
        self.batches: dict[tuple[Any, Any], _ReplayBatch] = {}
        self.attn_spans = 0
        self.attn_calls = 0
        self.end_rec: dict | None = None
        self.spans = 0
        self.closed = False
        self.findings_by_gid: dict[Any, list[Any]] = {}
        self.findings_left: list[Any] = []
        for f in findings:
            if getattr(f, "gid", None) is not None:
                self.findings_by_gid.setdefault(f.gid, []).append(f)
            else:
                self.findings_left.append(f)

        where = where or ProcessIds()
        parent = None
        if where.trace_id and where.parent_span_id:
            parent = trace_api.set_span_in_context(trace_api.NonRecordingSpan(SpanContext(
                where.trace_id, where.parent_span_id, is_remote=True,
                trace_flags=TraceFlags(TraceFlags.SAMPLED))))
        else:
            ids.next_trace_id = where.trace_id
        ids.next_span_id = where.span_id
        pid, rank = header.get("pid"), header.get("rank")
        name = f"process {pid}" + (f" rank {rank}" if rank is not None else "")
        attrs = {"mlatrace.rank": rank, "mlatrace.probes": attr_value(header.get("probes") or None),
                 "mlatrace.run_id": header.get("run_id"),
                 # span times are this host's wall clock; hosts' clocks are not aligned
                 "mlatrace.clock": f"wall clock of host {header.get('host')} at process "
                                   "start + monotonic offsets (not aligned across hosts)"}
        self.process = tracer.start_span(
            name, context=parent, kind=SpanKind.INTERNAL, start_time=self.last_ts,
            attributes={k: v for k, v in attrs.items() if v is not None})
        self.spans += 1
        self.process_ctx = trace_api.set_span_in_context(self.process)

    # -- helpers ---------------------------------------------------------------------------

    def _ts(self, rec: dict) -> int:
        ts = self.wall_ns + int(rec.get("t") or 0)
        self.last_ts = max(self.last_ts, ts)
        return ts

    def _capture_of(self, rec: dict) -> Any:
        """The open capture span a record belongs to: its gid's, else its thread's innermost."""
        gid = rec.get("gid")
        if gid is not None and gid in self.open:
            return self.open[gid]
        stack = self.stacks.get(rec.get("tid"))
        return self.open.get(stack[-1]) if stack else None

    def _context_of_gid(self, gid: Any) -> Any:
        if gid is not None and gid in self.open:
            return trace_api.set_span_in_context(self.open[gid])
        if gid is not None and gid in self.ctx:
            return trace_api.set_span_in_context(trace_api.NonRecordingSpan(self.ctx[gid]))
        return self.process_ctx

    def _add_findings(self, span: Any, findings: Sequence[Any], ts: int) -> None:
        for f in findings:
            name, attrs = finding_event(f)
            span.add_event(name, attrs, timestamp=ts)
            if f.severity == "error":
                span.set_status(Status(StatusCode.ERROR, f"{f.id} {getattr(f, 'name', '')}".strip()))

    # -- records ---------------------------------------------------------------------------

    def feed(self, rec: dict) -> None:
        """Take the next record of this process (unknown kinds become events, never errors)."""
        kind = rec.get("k")
        counts = self.counts
        counts[kind] = counts.get(kind, 0) + 1
        if kind == REPLAY:  # the per-step kinds first: they are most of a trace
            self._replay(rec)
            return
        if kind == REPLAY_TIME and self._replay_time(rec):
            return
        if kind == STEADY:
            self._steady(rec)
            return
        if kind == ATTN_METADATA or kind == DISPATCH:
            ts = self.wall_ns + (rec.get("t") or 0)
            if ts > self.last_ts:
                self.last_ts = ts
            (self.meta if kind == ATTN_METADATA else self.dispatch)[rec.get("tid")] = rec
            return
        handler = _HANDLERS.get(kind)
        if handler is not None:
            handler(self, rec)
        elif kind != PROCESS and isinstance(kind, str):  # a kind this version does not know
            ts = self._ts(rec)
            span = self._capture_of(rec) or self.process
            span.add_event(kind, attrs_of(rec), timestamp=ts)

    def _capture_begin(self, rec: dict) -> None:
        ts, gid, tid = self._ts(rec), rec.get("gid"), rec.get("tid")
        parent = rec.get("parent")
        if parent is not None:
            context = self._context_of_gid(parent)
        else:
            stack = self.stacks.get(tid)
            context = self._context_of_gid(stack[-1]) if stack else self.process_ctx
        self._end_batches(lambda key: key[1] == gid)
        src, mode = rec.get("src"), rec.get("mode")
        name = "graph.capture" + "".join(f" {p}" for p in (src, mode) if p)
        attrs = attrs_of(rec, "mlatrace.graph.", skip=("gid",))
        attrs["mlatrace.gid"] = attr_value(gid)
        span = self.tracer.start_span(name, context=context, kind=SpanKind.INTERNAL,
                                      start_time=ts, attributes=attrs)
        self.spans += 1
        self.open[gid] = span
        self.ctx[gid] = span.get_span_context()
        self.stacks.setdefault(tid, []).append(gid)

    def _capture_end(self, rec: dict) -> None:
        ts, gid = self._ts(rec), rec.get("gid")
        span = self.open.pop(gid, None)
        for stack in self.stacks.values():
            if gid in stack:
                stack.remove(gid)
        if span is None:
            return
        span.set_attributes(attrs_of(rec, "mlatrace.graph.", skip=("gid",)))
        self._add_findings(span, self.findings_by_gid.pop(gid, []), ts)
        span.end(end_time=ts)

    def _nodes(self, rec: dict) -> None:
        ts, gid = self._ts(rec), rec.get("gid")
        kernels = rec.get("kernels") or []
        span = self.open.get(gid)
        ended = span is None
        if ended:  # the debug dump is read after capture end: an instant child of the capture
            span = self.tracer.start_span(GRAPH_NODES, context=self._context_of_gid(gid),
                                          start_time=ts, attributes={"mlatrace.gid": attr_value(gid)})
            self.spans += 1
        span.set_attribute("mlatrace.graph.kernels", len(kernels))
        for kernel in kernels:
            if isinstance(kernel, dict):
                span.add_event("graph.node", attrs_of(kernel, "mlatrace.kernel."), timestamp=ts)
        if ended:
            span.end(end_time=ts)

    def _capture_event(self, rec: dict) -> None:
        """Launches, split decisions, syncs, breaks and skips: events of the capture they froze into."""
        ts = self._ts(rec)
        span = self._capture_of(rec)
        if span is not None:
            span.add_event(rec["k"], attrs_of(rec), timestamp=ts)
        elif rec["k"] == SYNC:  # an eager sync still matters (MLT004 on the decode path)
            self.process.add_event("sync", attrs_of(rec), timestamp=ts)

    def _process_event(self, rec: dict) -> None:
        self.process.add_event(rec["k"], attrs_of(rec), timestamp=self._ts(rec))

    def _attn_call(self, rec: dict) -> None:
        ts, gid = self._ts(rec), rec.get("gid")
        self.attn_calls += 1
        if self.attn_spans >= self.max_attn_spans:
            return
        self.attn_spans += 1
        stack = self.stacks.get(rec.get("tid"))
        if gid is None and stack:
            gid = stack[-1]
        context = self._context_of_gid(gid)
        op = rec.get("op")
        span = self.tracer.start_span(f"attn.call {op}" if op else ATTN_CALL, context=context,
                                      start_time=ts, attributes=attrs_of(rec))
        self.spans += 1
        span.end(end_time=ts)

    def _replay(self, rec: dict) -> None:
        ts, gid, tid = self.wall_ns + (rec.get("t") or 0), rec.get("gid"), rec.get("tid")
        if ts > self.last_ts:
            self.last_ts = ts
        key = (tid, gid)
        batch = self.batches.get(key)
        if batch is not None and (batch.count >= MAX_REPLAYS_PER_SPAN
                                  or ts - batch.start > MAX_REPLAY_SPAN_NS):
            self._end_batch(key)
            batch = None
        if batch is None:
            batch = self.batches[key] = _ReplayBatch(gid, ts)
        batch.add(rec, ts, self.meta.get(tid), self.dispatch.get(tid))

    def _steady(self, rec: dict) -> None:
        """A fold of steady steps: one replay span of the replays it stands for (a fold
        without replays, of eager steps, an event of the process span)."""
        ts = self.wall_ns + (rec.get("t") or 0)
        if ts > self.last_ts:
            self.last_ts = ts
        gid, tid = rec.get("gid"), rec.get("tid")
        if gid is None or not rec.get("replays"):
            self.process.add_event("steady", attrs_of(rec, skip=("pattern", "times")), timestamp=ts)
            return
        key = (tid, gid)
        if key in self.batches:
            self._end_batch(key)
        first = rec.get("t_first")
        batch = self.batches[key] = _ReplayBatch(
            gid, self.wall_ns + (first if type(first) is int else (rec.get("t") or 0)))
        batch.add_fold(rec, ts)
        self._end_batch(key)

    def _replay_time(self, rec: dict) -> bool:
        """A replay's GPU time, read after the replay: into the open span of its graph's replays
        when that span began at or before replay n (its own record may be sampled out); False
        otherwise, and the record becomes an event, as unknown kinds do."""
        batch = self.batches.get((rec.get("tid"), rec.get("gid")))
        gpu, n = rec.get("gpu_ns"), rec.get("n")
        if batch is None or type(gpu) is not int or gpu < 0 or type(n) is not int \
                or not (type(batch.n_first) is int and batch.n_first <= n):
            return False
        self._ts(rec)
        batch.gpu_timed += 1
        batch.gpu_sum += gpu
        batch.gpu_max = max(batch.gpu_max, gpu)
        return True

    def _end_batch(self, key: tuple[Any, Any]) -> None:
        batch = self.batches.pop(key)
        links = [Link(self.ctx[batch.gid])] if batch.gid in self.ctx else None
        span = self.tracer.start_span(REPLAY, context=self.process_ctx, kind=SpanKind.INTERNAL,
                                      start_time=batch.start, attributes=batch.attributes(),
                                      links=links)
        self.spans += 1
        span.end(end_time=batch.end)

    def _end_batches(self, which: Any = None) -> None:
        for key in [k for k in self.batches if which is None or which(k)]:
            self._end_batch(key)

    def _rank(self, rec: dict) -> None:
        self._ts(rec)
        if rec.get("rank") is not None:  # learnt after start: the resource keeps the header's
            self.process.set_attribute("mlatrace.rank", rec["rank"])

    def _process_end(self, rec: dict) -> None:
        self._ts(rec)
        self.end_rec = rec

    # -- closing ---------------------------------------------------------------------------

    def flush(self) -> None:
        """End the open replay batches (live export: at the end of each record batch)."""
        self._end_batches()

    def close(self) -> None:
        """End every open span, the process span last; findings not tied to a graph go on it."""
        if self.closed:
            return
        self.closed = True
        self._end_batches()
        end = self.last_ts
        for gid, span in list(self.open.items()):
            span.set_attribute("mlatrace.graph.incomplete", True)
            self._add_findings(span, self.findings_by_gid.pop(gid, []), end)
            span.end(end_time=end)
        self.open.clear()
        left = self.findings_left + [f for fs in self.findings_by_gid.values() for f in fs]
        self._add_findings(self.process, left, end)
        counts = {f"mlatrace.records.{k}": v for k, v in self.counts.items() if k}
        self.process.set_attributes(counts)
        if self.attn_calls > self.attn_spans:  # past the cap: say how many have no span
            self.process.set_attribute("mlatrace.attn_calls_without_span",
                                       self.attn_calls - self.attn_spans)
        if self.end_rec is not None:
            self.process.set_attributes(attrs_of(self.end_rec, "mlatrace.end."))
        else:
            self.process.set_attribute("mlatrace.end.missing", True)
        self.process.end(end_time=end)


_HANDLERS = {
    CAPTURE_BEGIN: ProcessSpans._capture_begin,
    CAPTURE_END: ProcessSpans._capture_end,
    GRAPH_NODES: ProcessSpans._nodes,
    EAGER_BREAK: ProcessSpans._capture_event,
    KERNEL_LAUNCH: ProcessSpans._capture_event,
    KERNEL_SPLIT: ProcessSpans._capture_event,
    KERNEL_SKIP: ProcessSpans._capture_event,
    SYNC: ProcessSpans._capture_event,
    ATTN_CALL: ProcessSpans._attn_call,
    MARK: ProcessSpans._process_event,
    PROBE_ERROR: ProcessSpans._process_event,
    PROCESS_END: ProcessSpans._process_end,
    PROCESS_RANK: ProcessSpans._rank,
}


def assign_findings(trace: Any, findings: Sequence[Any]) -> dict[str, list[Any]]:
    """Which process file carries each finding: its pid's, else its first evidence file's,
    else the first process's (a finding is never dropped, never carried twice)."""
    procs = [p for p in trace.processes if p.header]
    by_pid = {p.header.get("pid"): p.name for p in procs}
    names = {p.name for p in procs}
    out: dict[str, list[Any]] = {p.name: [] for p in procs}
    for f in findings:
        name = by_pid.get(getattr(f, "pid", None))
        if name is None:
            name = next((e.file for e in getattr(f, "evidence", []) if e.file in names), None)
        if name is None and procs:
            name = procs[0].name
        if name is not None:
            out[name].append(f)
    return out


def build_spans(trace: Any, service_name: str, findings: Sequence[Any] = ()) -> tuple[list, int]:
    """All spans of a trace, in memory: (finished spans, number of processes converted)."""
    memory = InMemorySpanExporter()
    run = getattr(trace, "run", None) or {}
    first = next((p.header for p in trace.processes if p.header), None) or {}
    run_id = run.get("run_id") or first.get("run_id") or str(getattr(trace, "root", ""))
    trace_id = derive_id(128, "export", run_id)
    procs = [p for p in trace.processes if p.header]
    # Span ids by file, not pid: an exec'd image keeps its pid and gets a second file.
    span_of = {p.name: derive_id(64, "export", run_id, p.name) for p in procs}
    first_file: dict[Any, str] = {}
    for p in procs:
        first_file.setdefault(p.header.get("pid"), p.name)
    carried = assign_findings(trace, findings)
    processes = 0
    for proc in procs:
        header = proc.header
        pid, ppid = header.get("pid"), header.get("ppid")
        if first_file[pid] != proc.name:  # a later image of an exec'd process: after the first
            parent_file: str | None = first_file[pid]
        else:
            parent_file = first_file.get(ppid) if ppid != pid else None
        ids = FixedIds()
        provider = make_provider(header, service_name, ids)
        provider.add_span_processor(SimpleSpanProcessor(memory))
        where = ProcessIds(trace_id=trace_id, span_id=span_of[proc.name],
                           parent_span_id=span_of.get(parent_file) if parent_file else None)
        builder = ProcessSpans(provider.get_tracer(SCOPE), ids, header, where=where,
                               findings=carried.get(proc.name, []))
        for rec in proc.records():
            builder.feed(rec)
        builder.close()
        processes += 1
    return list(memory.get_finished_spans()), processes
