"""Export stage: a trace as OpenTelemetry spans (OTLP) and as a Perfetto timeline.

`mlatrace export TRACE --otlp URL` sends spans to a collector; `--perfetto OUT.json`
writes Chrome trace-event JSON for ui.perfetto.dev. Live export from a traced
process (`mlatrace run --otlp URL`) is `mlatrace.output.export.live`.

Exit codes: 0 exported, 1 the OTLP endpoint failed (refused, timed out, rejected),
2 usage error or unreadable trace. OpenTelemetry is imported only when --otlp is given.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mlatrace.common import plural
from mlatrace.exitcodes import ExitCode, MlatraceError, require_extra


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")


def load_findings(trace: Any) -> list[Any]:
    """The trace's findings, or none (with a warning) when the analysis cannot run."""
    try:
        from mlatrace.analysis import analyze
    except ImportError as exc:
        _say(f"warning: findings not exported (analysis unavailable: {exc})")
        return []
    try:
        return list(analyze(trace).findings)
    except Exception as exc:  # noqa: BLE001 - an export without findings beats no export
        _say(f"warning: findings not exported (analysis failed: {exc!r})")
        return []


def main(trace: str, otlp: str | None = None, protocol: str = "http/protobuf",
         service_name: str = "mlatrace", perfetto: str | None = None) -> int:
    """Run `mlatrace export`: returns the exit code."""
    if not otlp and not perfetto:
        raise MlatraceError("error: nothing to export to: give --otlp URL and/or "
                            "--perfetto OUT.json")
    from mlatrace.trace import TraceError, open_run

    try:
        opened, _run, note = open_run(trace)
    except TraceError as exc:
        raise MlatraceError(f"error: {exc}") from exc
    if note:
        _say(f"note: {note}")
    if service_name == "mlatrace":  # the default: the standard variable may name the service
        service_name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    findings = load_findings(opened)
    processes = sum(1 for p in opened.processes if p.header)
    code = ExitCode.OK
    if perfetto:
        from mlatrace.output.export import perfetto as perfetto_mod

        try:
            events = perfetto_mod.write(opened, perfetto, findings)
        except OSError as exc:
            raise MlatraceError(f"error: cannot write {perfetto}: "
                                f"{exc.strerror or exc}") from exc
        print(f"perfetto: wrote {events} events ({plural(processes, 'process', 'processes')}, {plural(len(findings), 'finding')}) "
              f"to {perfetto}; open it in https://ui.perfetto.dev")
    if otlp:
        require_extra("otlp", "mlatrace export --otlp")
        from mlatrace.output.export import otlp as otlp_mod

        try:
            result = otlp_mod.export_trace(opened, otlp, protocol=protocol,
                                           service_name=service_name, findings=findings)
        except ValueError as exc:  # a URL or protocol the exporter cannot use
            raise MlatraceError(f"error: {exc}") from exc
        if result.error:
            _say(f"error: OTLP export to {otlp} ({protocol}) failed: {result.error}; "
                 f"sent {result.sent} of {result.spans} spans")
            code = ExitCode.FAILED
        else:
            print(f"otlp: sent {result.sent} spans "
                  f"({plural(result.processes, 'process', 'processes')}, "
                  f"{plural(len(findings), 'finding')}) to {otlp} ({protocol})")
    problems = sorted({str(p) for p in opened.problems})
    if problems:
        _say(f"warning: {len(problems)} unreadable lines skipped, e.g. {problems[0]}")
    return code


__all__ = ["load_findings", "main"]
