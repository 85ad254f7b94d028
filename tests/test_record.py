"""Recorder behaviour in-process: sampling, bounded memory, mark, header."""

from __future__ import annotations

import time
from pathlib import Path

import mlatrace
from mlatrace import record
from mlatrace.trace import open_trace


def read_one(out: Path) -> tuple[list[dict], object]:
    trace = open_trace(out)
    (proc,) = trace.processes
    return list(proc.records()), proc


def test_mark_header_and_end(tmp_path: Path) -> None:
    record.start(str(tmp_path), run_id="r1")
    mlatrace.mark("step", n=1, label="warmup")
    record.stop()
    records, proc = read_one(tmp_path)
    header, mark, end = records
    assert header["k"] == "process" and header["run_id"] == "r1"
    assert header["versions"]["python"] and header["versions"]["mlatrace"] == mlatrace.__version__
    assert mark["k"] == "mark" and mark["attrs"] == {"n": 1, "label": "warmup"}
    assert end["k"] == "process.end" and end["events"] == 1 and end["dropped"] == 0
    assert not record.active()


def test_emit_is_noop_without_recorder() -> None:
    assert not record.active()
    record.emit("mark", name="x")
    record.emit_replay(1)


def test_replay_sampling_keeps_exact_counts(tmp_path: Path) -> None:
    record.start(str(tmp_path), replay_sample=4)
    for _ in range(100):
        record.emit_replay(7, src="torch")
    for _ in range(3):
        record.emit_replay(8, src="torch")
    record.stop()
    records, proc = read_one(tmp_path)
    kept = [r for r in records if r["k"] == "graph.replay" and r["gid"] == 7]
    # first 4, then every 4th: n = 1..4, 8, 12, ..., 100
    assert [r["n"] for r in kept] == [1, 2, 3, 4, *range(8, 101, 4)]
    assert proc.end["replays"] == {"7": 100, "8": 3}
    assert proc.end["sampled_out"] == 100 - len(kept)
    assert proc.gaps == 0  # sampling is not dropping


def test_bounded_queue_drops_and_counts(tmp_path: Path) -> None:
    recorder = record.start(str(tmp_path))
    recorder.max_pending = 10
    with recorder._write_lock:  # the disk "cannot drain" while we hold the writer
        for i in range(50):
            record.emit("mark", name="m", attrs={"i": i})
        assert recorder.dropped == 40
    record.stop()
    records, proc = read_one(tmp_path)
    marks = [r for r in records if r["k"] == "mark"]
    assert len(marks) == 10 and proc.end["dropped"] == 40
    # The next accepted record after drops shows the gap.
    record.start(str(tmp_path / "b")).max_pending = 2
    rec = record.current()
    with rec._write_lock:
        for i in range(5):
            record.emit("mark", name="m", attrs={"i": i})
    rec.max_pending = 100
    record.emit("mark", name="after")
    record.stop()
    records, proc = read_one(tmp_path / "b")
    assert proc.gaps == 1 and proc.dropped == 3


def test_background_flush_without_exit(tmp_path: Path) -> None:
    record.start(str(tmp_path))
    mlatrace.mark("early")
    deadline = time.monotonic() + 5
    path = next(tmp_path.glob("p*.jsonl"))
    while '"early"' not in path.read_text() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert '"early"' in path.read_text()  # on disk before exit: a SIGKILL keeps it
    record.stop()


def test_unencodable_field_does_not_lose_the_record(tmp_path: Path) -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    record.start(str(tmp_path))
    record.emit("mark", name="odd", attrs={"obj": Opaque(), "t": (1, 2)})
    record.stop()
    records, _ = read_one(tmp_path)
    assert records[1]["attrs"] == {"obj": "<opaque>", "t": [1, 2]}
