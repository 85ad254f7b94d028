"""The exit codes of every `mlatrace` command, and the error that ends a command with one.

The codes (README, "Commands and exit codes"):

- 0 `CLEAN` (alias `OK`): the command did what it was asked (a report was made, a check is
  clean, a merge copied the run).
- 1 `FINDINGS` (alias `FAILED`): what the command checks failed: findings at or above the
  threshold (`check`), probe drift (`probes doctor`), a goal missed (`bench`), the OTLP
  endpoint refused the spans (`export`), the demo's report did not find what its policy
  should produce. Takes precedence over 3.
- 2 `UNUSABLE` (alias `USAGE`): bad arguments or config, an unreadable trace or nothing
  usable in it, a file that cannot be written, a missing requirement (a CUDA GPU, torch,
  an optional extra: `require_extra` names the one to install).
- 3 `BLIND`: `check` only, the trace cannot support a clean verdict (analysis/coverage.py).
- `run` passes the traced command's code through: 128+N (`SIGNALLED` + N) when it died of
  signal N, 127 `NOT_FOUND` and 126 `NOT_EXECUTABLE` when it could not be started, as a
  shell says them.

`MlatraceError(message, code)` ends a command: the `mlatrace` group (mlatrace/cli.py) is
the one place that catches it, writes its message as one line on stderr and exits with its
code. Functions that judge several things and go on after one fails (`check` of a
collection of runs) return an `ExitCode` instead.

Stdlib only: the launcher imports it before the traced command starts.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """What a `mlatrace` command exits with (README, "Commands and exit codes")."""

    CLEAN = 0           # done; check: no finding at or above the threshold, and not blind
    OK = 0
    FINDINGS = 1        # check: a finding at or above the threshold (takes precedence over BLIND)
    FAILED = 1          # doctor: drift; bench: a goal missed; export: the endpoint failed
    UNUSABLE = 2        # unreadable trace, unknown schema, bad arguments or config
    USAGE = 2
    BLIND = 3           # check: the trace cannot support a clean verdict (coverage.reasons)
    NOT_EXECUTABLE = 126  # run: CMD was found but cannot be executed
    NOT_FOUND = 127     # run: CMD was not found


SIGNALLED = 128
"""`run`: the traced command died of signal N: exit SIGNALLED + N (as a shell says it)."""


class MlatraceError(Exception):
    """Ends a command with `code` after writing `message` (one line, no traceback) on stderr.

    `message` is the whole line as the user sees it, its prefix included
    (`mlatrace run: ...`, `error: ...`)."""

    def __init__(self, message: str, code: ExitCode = ExitCode.USAGE) -> None:
        super().__init__(message)
        self.message = message
        self.code = code

    def __str__(self) -> str:
        return self.message


EXTRAS = {"otlp": "opentelemetry.exporter.otlp.proto.http", "plot": "matplotlib"}
"""The optional extras of the package (pyproject.toml) and a module each one installs."""


def require_extra(extra: str, what: str) -> None:
    """MlatraceError (exit 2, one line naming the extra) when `extra` is not installed:
    `what` (a command or option) needs it."""
    import importlib.util

    try:
        found = importlib.util.find_spec(EXTRAS[extra]) is not None
    except ImportError:   # a parent package that is absent or broken
        found = False
    if not found:
        raise MlatraceError(f"error: {what} needs the {extra!r} extra: "
                            f"pip install 'mlatrace[{extra}]'")
