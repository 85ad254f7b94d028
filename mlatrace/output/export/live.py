"""Live OTLP export from inside a traced process (`mlatrace run --otlp URL`).

The recorder hands each flushed batch of records to a sink on its background
flush thread; the sink turns them into spans (`mlatrace.output.export.spans.ProcessSpans`)
and a BatchSpanProcessor sends them from its own thread. So the traced
program's hot path never sees OpenTelemetry, and a slow or dead collector only
costs those two threads: export failures are swallowed and counted, reported in
one stderr line when the process ends, and the final flush waits a bounded time
(almost none once the endpoint is known to be failing).

The exporter is built when export starts (OpenTelemetry's import, ~0.3 s, is paid
at process start, not on a step), because a short-lived child may reach its
first flush only at exit, when no new thread may be started. A forked child
builds its own exporter in an at-fork hook (for its own process span) and leaves
the parent's untouched. A child's process span is the child of its traced
parent's, in the parent's trace (MLATRACE_OTLP_PARENT carries the parent's pid and
span to the child, across fork, spawn and exec); processes with no traced parent
share a trace id derived from the run id.
"""

from __future__ import annotations

import atexit
import importlib.util
import logging
import os
import sys
import threading
import time
from typing import Any

from mlatrace import settings
from mlatrace.kinds import PROCESS_END

PARENT_ENV = settings.name_of("otlp_parent")
EXPORT_TIMEOUT_S = 3.0       # per request; a live exporter must give up quickly
SCHEDULE_DELAY_MS = 500      # spans reach the collector within about this much
MAX_QUEUE = 8192             # spans waiting to be sent; beyond, the SDK drops them
FINAL_WAIT_S = 1.0           # at process end, when the endpoint has been answering
FINAL_WAIT_FAILING_S = 0.05  # at process end, when it has not
STUCK_EXPORT_S = 0.5         # an export in flight this long counts as failing
CONNECT_CHECK_S = 0.5        # a TCP connect to the collector before exporting to it again

stats: dict[str, int] = {"batches": 0, "records": 0, "spans": 0, "exported": 0,
                         "export_failures": 0, "failed_spans": 0, "errors": 0}

_config: tuple[str, str] | None = None
_live: Any = None
_hooks = False
_parent: tuple[int, int] | None = None  # (trace id, span id) of our traced parent's process span
_endpoint_failing = False  # inherited by forked children: they start out knowing
_quiet = threading.local()  # set on threads where OpenTelemetry works for us: silence its logs


def start_live_export(endpoint: str, service_name: str = "mlatrace") -> None:
    """Export this process's records as spans to an OTLP/HTTP endpoint while it runs.

    Call after the recorder started. Never raises into the traced program: a missing
    exporter package is reported once on stderr and live export stays off.
    """
    global _config, _hooks, _parent
    try:
        if importlib.util.find_spec("opentelemetry.exporter.otlp.proto.http") is None:
            sys.stderr.write("mlatrace: --otlp needs opentelemetry-exporter-otlp-proto-http "
                             "(pip install 'mlatrace[otlp]') in the traced environment; "
                             f"live export off in pid {os.getpid()}\n")
            return
        from mlatrace import record

        if record.current() is None:
            return
        if service_name == "mlatrace":  # `mlatrace run` has no flag for it: the standard env
            service_name = os.environ.get("OTEL_SERVICE_NAME") or service_name
        _config = (endpoint, service_name)
        _parent = _parent_from_env()
        _start_here()
        if not _hooks:
            _hooks = True
            # Registered after the recorder's own hook, so a forked child's recorder exists.
            os.register_at_fork(after_in_child=_after_fork_in_child)
            atexit.register(_at_exit)
    except Exception:  # noqa: BLE001 - live export is optional; the program is not
        stats["errors"] += 1


def _parent_from_env() -> tuple[int, int] | None:
    """The parent's process span, when our parent (or our image before an exec) exports too.

    PARENT_ENV is "pid:span_id:trace_id" (hex ids), set by every exporting process for the
    processes it starts.
    """
    try:
        pid, span_id, trace_id = (settings.current().otlp_parent or "").split(":")
        if int(pid) in (os.getppid(), os.getpid()):
            return int(trace_id, 16), int(span_id, 16)
    except ValueError:
        pass
    return None


def _start_here() -> None:
    """Build this process's exporter, tell our children where its span is, add our sink."""
    global _live
    from mlatrace import record

    assert _config is not None
    _live = _Live(*_config, header=_recorder_header())
    os.environ[PARENT_ENV] = f"{os.getpid()}:{_live.span_id:016x}:{_live.trace_id:032x}"
    record.add_sink(_sink)


def _recorder_header() -> dict:
    """The header the recorder wrote for this process (pid, wall_ns, argv, rank, run id)."""
    from mlatrace import record

    recorder = record.current()
    return recorder.header() if recorder is not None else {}


def _sink(records: list[dict]) -> None:
    """The recorder's sink: convert a batch of records to spans (flush thread)."""
    live = _live
    if live is None or live.pid != os.getpid():
        return  # an inherited sink in a child that has not rebuilt (or failed to)
    _quiet.on = True
    try:
        live.feed(records)
        from mlatrace import record

        if record.current() is None:
            # The recorder is stopping (`record.stop` clears it before its last flush):
            # os._exit in a multiprocessing child, exec, SIGTERM. No atexit will follow.
            live.finish()
    except Exception:  # noqa: BLE001
        stats["errors"] += 1
    finally:
        _quiet.on = False


def _after_fork_in_child() -> None:
    """A forked child: its recorder is new (without our sink) and its spans are its own.

    The parent's exporter is left alone (its lock may have been held at fork time);
    OpenTelemetry's own fork hook has emptied its queue, so it never sends anything.
    """
    global _parent, _live
    parent, _live = _live, None
    try:
        _parent = (parent.trace_id, parent.span_id) if parent is not None else None
        for key in stats:
            stats[key] = 0
        if _config is not None:
            _start_here()
    except Exception:  # noqa: BLE001
        stats["errors"] += 1


def _at_exit() -> None:
    """Send what is left at exit (the recorder's own exit flush runs after us)."""
    live = _live
    if live is None or live.pid != os.getpid():
        return
    _quiet.on = True
    try:
        from mlatrace import record

        recorder = record.current()
        if recorder is not None:
            recorder.close_folds()  # the steady steps folded so far, as `steady` records
            recorder.flush()  # hands the last batch to our sink
        live.finish()
    except Exception:  # noqa: BLE001
        stats["errors"] += 1
    finally:
        _quiet.on = False


class _QuietFilter(logging.Filter):
    """Drops OpenTelemetry's log lines on our threads (keeping the last), keeps the program's."""

    def __init__(self) -> None:
        super().__init__()
        self.last: str | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(_quiet, "on", False):
            try:
                self.last = record.getMessage()
            except Exception:  # noqa: BLE001
                pass
            return False
        return True


_filter = _QuietFilter()


def _install_filter() -> None:
    for name in ("opentelemetry.exporter.otlp.proto.http.trace_exporter",
                 "opentelemetry.exporter.otlp.common.http", "opentelemetry.sdk._shared_internal",
                 "opentelemetry.sdk.trace", "opentelemetry.sdk.trace.export"):
        logger = logging.getLogger(name)
        if _filter not in logger.filters:
            logger.addFilter(_filter)


def _reachable(url: str) -> bool:
    """Whether something accepts TCP connections at the URL's host and port."""
    from mlatrace.output.export.otlp import connect_error

    error = connect_error(url, CONNECT_CHECK_S)
    if error:
        _filter.last = error
    return error is None


def _make_counting_exporter(inner: Any, endpoint: str) -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        """Wraps the OTLP exporter: counts results, never raises, tells when it is failing."""

        def __init__(self) -> None:
            self.inner = inner
            self.endpoint = endpoint
            self.busy_since: float | None = None
            self.last_ok: bool | None = False if _endpoint_failing else None
            self.closed = False

        def export(self, spans: Any) -> Any:
            global _endpoint_failing
            _quiet.on = True
            self.busy_since = time.monotonic()
            try:
                # Until the collector has answered once, check it listens: the exporter's
                # own retries would spend seconds backing off from a refused connection.
                if self.last_ok is not True and not _reachable(self.endpoint):
                    result = SpanExportResult.FAILURE
                else:
                    result = self.inner.export(spans)
            except Exception:  # noqa: BLE001
                result = SpanExportResult.FAILURE
            finally:
                self.busy_since = None
                _quiet.on = False
            if result is SpanExportResult.SUCCESS:
                stats["exported"] += len(spans)
                self.last_ok = True
            else:
                stats["export_failures"] += 1
                stats["failed_spans"] += len(spans)
                self.last_ok = False
            _endpoint_failing = not self.last_ok
            return result

        def failing(self) -> bool:
            busy = self.busy_since
            stuck = busy is not None and time.monotonic() - busy > STUCK_EXPORT_S
            return self.last_ok is False or stuck

        def shutdown(self) -> None:
            if self.closed:
                return
            self.closed = True
            _quiet.on = True
            try:
                self.inner.shutdown()  # also aborts a retry back-off in progress
            except Exception:  # noqa: BLE001
                pass
            finally:
                _quiet.on = False

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    return CountingExporter()


class _Live:
    """One process's live exporter: provider, batch processor, and the span builder."""

    def __init__(self, endpoint: str, service_name: str, header: dict) -> None:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        from mlatrace.output.export import otlp, spans

        self.pid = os.getpid()
        self.endpoint = endpoint
        self.lock = threading.Lock()
        self.last_seq = -1
        self.finished = False
        _install_filter()
        # One trace per run: the parent's, else one derived from the run id (so that
        # processes of one run that are not each other's children still meet).
        config = settings.current()
        run_id = header.get("run_id") or config.run_id or config.out
        if _parent is not None:
            where = spans.ProcessIds(trace_id=_parent[0], parent_span_id=_parent[1])
        else:
            where = spans.ProcessIds(trace_id=spans.derive_id(128, "live", run_id) if run_id
                                    else None)
        ids = spans.FixedIds()
        provider = spans.make_provider(header, service_name, ids)
        self.exporter = _make_counting_exporter(
            otlp.make_exporter(endpoint, "http/protobuf", EXPORT_TIMEOUT_S), endpoint)
        self.processor = BatchSpanProcessor(self.exporter, max_queue_size=MAX_QUEUE,
                                            schedule_delay_millis=SCHEDULE_DELAY_MS,
                                            max_export_batch_size=512)
        provider.add_span_processor(self.processor)
        self.builder = spans.ProcessSpans(provider.get_tracer(spans.SCOPE), ids, header,
                                         where=where, max_attn_spans=spans.MAX_ATTN_SPANS_LIVE)
        context = self.builder.process.get_span_context()
        self.trace_id, self.span_id = context.trace_id, context.span_id

    def feed(self, records: list[dict]) -> None:
        """Turn one flushed batch into spans; replay batches end with it."""
        ended = False
        with self.lock:
            if self.finished:
                return
            first = records[0].get("seq") if records else None
            if isinstance(first, int) and first <= self.last_seq:  # delivered twice: a sink
                records = [r for r in records  # registered twice (fork hooks)
                           if not isinstance(r.get("seq"), int) or r["seq"] > self.last_seq]
            feed = self.builder.feed
            for rec in records:
                feed(rec)
            if records:
                last = records[-1].get("seq")
                self.last_seq = last if isinstance(last, int) else self.last_seq
                ended = records[-1].get("k") == PROCESS_END
            stats["batches"] += 1
            stats["records"] += len(records)
            self.builder.flush()
        if ended:
            self.finish()

    def finish(self) -> None:
        """End the process span and send what is queued, waiting a bounded time."""
        with self.lock:
            if self.finished:
                return
            self.finished = True
            self.builder.close()
            stats["spans"] += self.builder.spans
        wait = FINAL_WAIT_FAILING_S if self.exporter.failing() else FINAL_WAIT_S
        _bounded_shutdown(self.processor, self.exporter, wait)
        if stats["failed_spans"] or self.exporter.failing():
            reason = (_filter.last or "no answer").replace("\n", " ")
            sys.stderr.write(f"mlatrace: live OTLP export to {self.endpoint} failed in pid "
                             f"{self.pid} ({stats['exported']} of {stats['spans']} spans sent; "
                             f"{reason[:160]}); the trace files are complete\n")


def _bounded_shutdown(processor: Any, exporter: Any, wait: float) -> None:
    """Shut a BatchSpanProcessor down waiting at most `wait` s (its own shutdown has no bound).

    Past the bound, shutting the exporter down aborts its retry back-off, so the worker
    thread ends soon after; it is a daemon thread and never holds the process up.
    """
    try:
        waiter = threading.Thread(target=processor.shutdown, name="mlatrace-otlp-shutdown",
                                  daemon=True)
        waiter.start()
        waiter.join(wait)
        if not waiter.is_alive():
            return
    except RuntimeError:  # no new threads this late in interpreter shutdown
        pass
    exporter.shutdown()
