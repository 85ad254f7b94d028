"""The launcher's `run.json` as the readers expect it: one msgspec Struct with the types of
its fields (docs/trace-format.md, "run.json"). A field of the wrong type is one problem
(`run.json:1: field ... must be ...`) and the rest of the run is kept; fields a newer
launcher adds are accepted. Without msgspec (the H200 image) the reader skips these
checks and reads the fields leniently, as every consumer of run.json does.
"""

from __future__ import annotations

from typing import Annotated, Any

import msgspec

Count = Annotated[int, msgspec.Meta(ge=0)]


class RunInfo(msgspec.Struct, kw_only=True):
    """run.json's fields (all optional to the reader: a hand-made one may name few)."""

    schema: str | None = None
    run_id: str | None = None
    argv: list[str] = []
    cwd: str | None = None
    start_ns: Count | None = None
    end_ns: Count | None = None
    exit_code: int | None = None
    signal: int | None = None
    launcher_pid: int | None = None
    host: str | None = None
    mlatrace: str | None = None
    env: dict[str, str] = {}
    options: dict[str, Any] = {}
    forwarded_signals: list[str] = []
    process_files: Count | None = None
    outlived: list[int] = []
    abnormal_end: str | None = None
    error: str | None = None


def run_problem(run: Any) -> str | None:
    """Why `run` (run.json, decoded) is not a RunInfo, or None."""
    if not isinstance(run, dict):
        return f"not a JSON object ({type(run).__name__})"
    try:
        msgspec.convert(run, RunInfo)
    except msgspec.ValidationError as exc:
        text = str(exc)
        where, _, at = text.partition(" - at `$.")
        field = at.rstrip("`") if at else "?"
        return f"field {field}: {where[0].lower() + where[1:]}"
    return None
