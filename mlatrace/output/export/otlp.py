"""Sending spans to an OTLP collector, for `mlatrace export --otlp` and live export.

The spans come from `mlatrace.output.export.spans`; this module is the transport: the
exporter for a URL and protocol, a connect check that says at once why nothing
listens, chunked sends, and one clear phrase for why an export failed.

OpenTelemetry is imported here, so this module is only imported lazily.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from mlatrace import settings
from mlatrace.output.export.spans import build_spans

DEFAULT_TIMEOUT_S = 5.0
CHUNK = 512


def traces_url(url: str) -> str:
    """The OTLP/HTTP traces URL: a bare collector address gets the standard /v1/traces path."""
    parsed = urlparse(url if "://" in url else f"http://{url}")
    if parsed.path in ("", "/"):
        return parsed._replace(path="/v1/traces").geturl()
    return parsed.geturl()


def make_exporter(url: str, protocol: str = "http/protobuf",
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> SpanExporter:
    """The OTLP span exporter for a URL and protocol, with a short timeout."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        # host:port means plaintext, as collectors listen by default (the exporter would
        # otherwise read the host as a URL scheme and try TLS)
        return OTLPSpanExporter(endpoint=url if "://" in url else f"http://{url}",
                                timeout=timeout_s)
    if protocol != "http/protobuf":
        raise ValueError(f"unknown OTLP protocol {protocol!r} (http/protobuf or grpc)")
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return OTLPSpanExporter(endpoint=traces_url(url), timeout=timeout_s)


class _Captured(logging.Handler):
    """Keeps the OTLP exporters' log lines: the only place they say why an export failed."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.messages.append(record.getMessage())
        except Exception:  # noqa: BLE001 - a bad log call must not hide the export result
            self.messages.append(str(record.msg))


_EXPORTER_LOGGERS = ("opentelemetry.exporter", "opentelemetry.sdk")


def failure_reason(messages: Sequence[str], timeout_s: float) -> str:
    """One clear phrase for why an export failed, from the exporter's log lines."""
    text = " ".join(messages)
    lowered = text.lower()
    if "connection refused" in lowered or "statuscode.unavailable" in lowered:
        return "connection refused (is a collector listening there?)"
    if "timed out" in lowered or "timeout" in lowered or "deadline" in lowered:
        return f"no answer within {timeout_s:g} s (timeout)"
    if "name or service not known" in lowered or "nodename nor servname" in lowered:
        return "unknown host"
    for line in reversed(messages):
        if "code:" in line or "reason" in line:
            return line.strip()[:300]
    return (messages[-1].strip()[:300] if messages else "the exporter reported failure")


@dataclass
class ExportResult:
    """What an export sent: span counts, and the error when the endpoint refused or timed out."""

    spans: int
    sent: int
    processes: int
    error: str | None = None


def connect_error(url: str, timeout_s: float) -> str | None:
    """Why nothing accepts TCP connections at the URL's host and port, or None when it does.

    The exporters retry a refused connection for seconds with back-off; one connect says
    at once whether a collector listens there.
    """
    import socket

    parsed = urlparse(url if "://" in url else f"http://{url}")
    try:
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        with socket.create_connection((parsed.hostname or "localhost", port), timeout=timeout_s):
            return None
    except ConnectionRefusedError:
        return "connection refused (is a collector listening there?)"
    except TimeoutError:
        return f"no answer within {timeout_s:g} s (timeout)"
    except socket.gaierror:
        return "unknown host"
    except (OSError, ValueError) as exc:
        return f"cannot connect: {getattr(exc, 'strerror', None) or exc}"


def send(spans: Sequence[Any], url: str, protocol: str, timeout_s: float) -> tuple[int, str | None]:
    """Send spans in chunks; stop at the first failed chunk. Returns (spans sent, error)."""
    error = connect_error(url, timeout_s)
    if error:
        return 0, error
    captured = _Captured()
    saved = []
    for name in _EXPORTER_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, logger.propagate))
        logger.addHandler(captured)
        logger.propagate = False
    sent = 0
    try:
        exporter = make_exporter(url, protocol, timeout_s)
        try:
            for start in range(0, len(spans), CHUNK):
                chunk = spans[start:start + CHUNK]
                if exporter.export(chunk) is not SpanExportResult.SUCCESS:
                    error = failure_reason(captured.messages, timeout_s)
                    break
                sent += len(chunk)
        finally:
            exporter.shutdown()
    finally:
        for logger, propagate in saved:
            logger.removeHandler(captured)
            logger.propagate = propagate
    return sent, error


def export_trace(trace: Any, url: str, *, protocol: str = "http/protobuf",
                 service_name: str = "mlatrace", findings: Sequence[Any] = (),
                 timeout_s: float | None = None) -> ExportResult:
    """Convert a whole trace to spans and send them; the result says what failed and why."""
    if timeout_s is None:
        timeout_s = settings.current().otlp_timeout or DEFAULT_TIMEOUT_S
    spans, processes = build_spans(trace, service_name, findings)
    sent, error = send(spans, url, protocol, timeout_s)
    return ExportResult(spans=len(spans), sent=sent, processes=processes, error=error)
