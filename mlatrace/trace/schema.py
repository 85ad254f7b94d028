"""The machine-readable schema of `mlatrace/1`, made from the declarations the writer and
the reader use: the kinds and their properties (mlatrace/kinds.py), the fields every
record carries, the fields the reader decodes into typed records (trace/typed.py), and
the kinds whose fields it checks (trace/validate.py, with each check's rule).

`python -m mlatrace.trace.schema` prints it (nothing checked in to go stale: adding a kind
changes it with kinds.py). Readers accept kinds and fields a schema does not name
(docs/trace-format.md, "Compatibility rules").
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from mlatrace import SCHEMA, kinds
from mlatrace.trace import typed, validate

PROPERTIES = {
    "step": "written once per decode step: where a step starts (folding, sampling)",
    "folds": "folding may stand it for a `steady` record",
    "fold_passes": "written as it comes inside a fold, never ending it",
    "at_cap": "kept past `run --max-mb`",
    "typed": "decoded as a typed record by the analysis (fields: `typed_fields`)",
    "checked": "the reader checks its fields; a malformed one is a file:line problem and "
               "is skipped (rule: `check`)",
    "built": "read by the analysis (the graph model)",
    "perfetto": "a shape of its own in the Perfetto export (else an instant on its thread)",
    "otlp": "read by the OTLP span builder (else an event of its capture or process span)",
}


def schema() -> dict[str, Any]:
    """The schema as a JSON-ready dict (stable order: the kinds as declared)."""
    flags = [f.name for f in dataclasses.fields(kinds.Kind) if f.type in ("bool", bool)]
    assert sorted(flags) == sorted(PROPERTIES), "describe every Kind property in PROPERTIES"
    out: dict[str, Any] = {}
    for name, kind in kinds.KINDS.items():
        entry: dict[str, Any] = {"doc": kind.doc,
                                 "properties": [f for f in flags if getattr(kind, f)]}
        if kind.typed:
            entry["typed_fields"] = list(typed.RECORD_FIELDS)
        if kind.checked:
            rule = " ".join((validate.CHECKS[name].__doc__ or "").split())
            entry["check"] = rule.split(": why")[0]
        out[name] = entry
    return {"schema": SCHEMA, "common_fields": dict(kinds.COMMON_FIELDS),
            "properties": PROPERTIES, "kinds": out}


def render() -> str:
    return json.dumps(schema(), indent=1) + "\n"


if __name__ == "__main__":
    print(render(), end="")
