"""Reading traces: one process file or a trace directory (`reader`), the runs of several
host directories (`runs`), typed records (`typed`), tailing a live trace (`tail`) and
merging runs (`merge`). The names most callers need are re-exported here."""

from mlatrace.trace.reader import (
    READ_BYTES,
    SCHEMA_MAJOR,
    SCHEMA_NAME,
    Problem,
    ProcessFile,
    RecordChunk,
    Trace,
    TraceError,
    check_schema,
    open_trace,
    steady_problem,
)
from mlatrace.trace.runs import RunInfo, find_runs, open_run

__all__ = ["READ_BYTES", "SCHEMA_MAJOR", "SCHEMA_NAME", "Problem", "ProcessFile", "RecordChunk",
           "RunInfo", "Trace", "TraceError", "check_schema", "find_runs", "open_run", "open_trace",
           "steady_problem"]
