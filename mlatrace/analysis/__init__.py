"""Analysis stage: the graph model of a trace and the findings of its rules.

    result = analyze(open_trace(path), config)
    result.findings            # list[Finding], sorted by severity then id
    result.suppressed          # findings matched by the config's allow-list
    result.model               # TraceModel: processes, graphs, replays
    result.coverage            # Coverage: what the probes saw; .blind, .reasons (coverage.py)

Imports only the standard library (no torch): a CI box analyses traces without a GPU stack.

The package imports its modules on first use of a name (PEP 562): a caller that needs
one of them (the config, the findings) does not load the model, the rules and the trace
reader at start-up.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module of this package that defines it
_EXPORTS = {
    "Analysis": "pipeline", "analyze": "pipeline", "analyze_model": "pipeline",
    "build_model": "builder",
    "Config": "config", "ConfigError": "config", "load_config": "config",
    "Coverage": "coverage", "ExpectError": "coverage",
    "RULES": "rules", "Rule": "rules", "Evidence": "findings", "Finding": "findings",
    "at_or_above": "findings",
    "GraphModel": "model", "TraceModel": "model",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
