"""The one loop every record of every trace goes through (batch, parallel and live):
a process file's records fed to its `ProcessBuilder`'s handlers."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mlatrace.analysis.model import ProcessModel, TraceModel
from mlatrace.analysis.process_builder import ProcessBuilder
from mlatrace.kinds import ALL
from mlatrace.trace import Problem, RecordChunk
from mlatrace.trace.typed import TYPED_KINDS, to_record


def feed_records(builder: ProcessBuilder, handlers: dict[str, Any], records: Iterable[dict],
          problems: list[Problem]) -> int:
    """The one loop every record of every trace goes through (batch, parallel and live).

    Records come a list at a time (a chunk of the reader, read `typed`: those of
    `TYPED_KINDS` as `Record`s, which their handlers read): their kinds are counted in C
    and their handlers looked up in C; the loop only calls those of kinds with one.
    Records of other sources (dicts) go one at a time (`feed_each`).
    """
    if type(records) is not RecordChunk or not records.typed:
        return feed_each(builder, handlers, records, problems)
    kinds, counts = records.kinds, records.counts  # the reader read their kinds already
    builder.proc.kinds.update(counts)
    if not ALL.issuperset(counts):  # a user probe's own kind: are its fields ever set?
        for kind, rec in zip(kinds, records, strict=True):
            if kind not in ALL:
                builder.custom_record(kind, rec)
    for handler, rec in zip(map(handlers.get, kinds), records, strict=True):
        if handler is not None:
            try:
                handler(rec)
            except (AttributeError, TypeError, ValueError, KeyError) as exc:
                problems.append(bad_record(builder, rec, exc))
    if records:
        _note_t(builder.proc, records[-1])
    return len(records)


def feed_each(builder: ProcessBuilder, handlers: dict[str, Any], records: Iterable,
               problems: list[Problem]) -> int:
    """`feed_records` one record at a time: records as dicts (the reader's precise path, tests),
    those of `TYPED_KINDS` made `Record`s first, and records the reader would not hand out."""
    kinds = builder.proc.kinds
    count = 0
    rec = None
    for rec in records:
        count += 1
        try:
            kind = rec.get("k")
            kinds[kind] = kinds.get(kind, 0) + 1
            if type(rec) is dict and type(kind) is str and kind in TYPED_KINDS:
                rec = to_record(rec)
            handler = handlers.get(kind)
            if handler is not None:
                handler(rec)
            elif kind not in ALL and type(kind) is str:
                builder.custom_record(kind, rec)
        except (AttributeError, TypeError, ValueError, KeyError) as exc:
            problems.append(bad_record(builder, rec, exc))
    if count:
        _note_t(builder.proc, rec)
    return count


def _note_t(proc: Any, rec: Any) -> None:
    """Keep the latest `t` read (the end of the time graph use counts memory held over)."""
    t = rec.get("t") if hasattr(rec, "get") else None
    if type(t) is int and (proc.t_last is None or t > proc.t_last):
        proc.t_last = t


def bad_record(builder: ProcessBuilder, rec: Any, exc: Exception) -> Problem:
    seq = rec.get("seq") if isinstance(rec, dict) else None
    return Problem(builder.file, 0, f"record seq {seq}: field of an unexpected type "
                   f"({type(exc).__name__}); skipped")


def stream_process(model: TraceModel, proc_file: Any) -> ProcessModel:
    """One whole file into `model` (a parallel worker's unit of work)."""
    builder = ProcessBuilder(model, proc_file)
    header = getattr(proc_file, "header", None)
    if isinstance(header, dict):
        builder.header(header)
    handlers = builder.handlers()
    builder.proc.records = sum(feed_records(builder, handlers, chunk, model.problems)
                               for chunk in chunks_of(proc_file))
    return builder.finish(proc_file)


def chunks_of(proc_file: Any) -> Iterable[list[dict]]:
    """The records of a process file as the reader's lists, read `typed` (or one list of
    them all)."""
    chunks = getattr(proc_file, "record_chunks", None)
    return chunks(typed=True) if chunks is not None else [list(proc_file.records())]
