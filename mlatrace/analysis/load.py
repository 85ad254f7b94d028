"""Opening and analysing a trace for the commands that read one (report, check, diff).

One home for "a trace path in, an Analysis out, or one clear reason why not" and for
finding the rules config, so every command reads traces the same way.
"""

from __future__ import annotations

import sys
from typing import Any

from mlatrace.analysis import Analysis, analyze
from mlatrace.analysis.config import Config, load_config


class Unusable(Exception):
    """The trace cannot be opened or has no readable record at all (exit 2)."""


def load(trace_path: str | list[str], config: Config | None = None,
         rules: list[str] | None = None, run_id: str | None = None) -> tuple[Any, Analysis]:
    """Open and analyse the run at `trace_path` (one or several paths, see
    `mlatrace.trace.open_run`); Unusable when nothing in it can be used. Which run was
    opened, when a parent holds several, is said on stderr."""
    from mlatrace.trace import TraceError, open_run

    paths = [trace_path] if isinstance(trace_path, str) else list(trace_path)
    shown = " ".join(paths)
    try:
        trace, _run, note = open_run(paths, run_id)
    except TraceError as exc:
        raise Unusable(str(exc)) from exc
    except OSError as exc:
        raise Unusable(f"{shown}: {exc.strerror or exc}") from exc
    if note:
        sys.stderr.write(f"note: {note}\n")
    result = analyze(trace, config, rules)
    if not any(p.records for p in result.model.processes):
        reasons = "; ".join(str(p) for p in trace.problems[:5])
        raise Unusable(f"{shown}: no usable records" + (f" ({reasons})" if reasons else ""))
    return trace, result


def resolve_config(config_path: str | None, trace_path: str | None = None,
                   expect: list[str] | None = None) -> Config:
    """--config FILE, else mlatrace.toml / pyproject.toml [tool.mlatrace] in the cwd;
    `expect` (--expect) adds to the config's expectations (ConfigError when unknown)."""
    cfg = load_config(config_path) if config_path else load_config(None)
    if expect:
        from dataclasses import replace

        from mlatrace.analysis import ConfigError, ExpectError
        from mlatrace.analysis.coverage import expect_kinds

        for what in expect:
            try:
                expect_kinds(what)
            except ExpectError as exc:
                raise ConfigError(f"--expect: {exc}") from None
        cfg = replace(cfg, expect=[*cfg.expect, *(e for e in expect if e not in cfg.expect)])
    return cfg
