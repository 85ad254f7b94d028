"""`mlatrace run --otlp`: live export from every traced process to a real OTLP/HTTP receiver,
and what a dead or silent collector does to the traced program (nothing)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from test_export_support import PYTHON, Receiver, env_with_repo, free_port

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
pytest.importorskip("opentelemetry.proto")

# A traced program that records seed 002's story itself (no probes needed) in a parent, an
# os.fork child (leaves through sys.exit) and multiprocessing spawn and fork children (the fork
# child leaves through os._exit: no atexit).
PROGRAM = '''
import multiprocessing as mp
import os
import sys
import time

from mlatrace import record


def story(tag):
    record.emit("graph.capture.begin", gid=1, parent=None, src="reference", key=tag, mode="FULL")
    record.emit("attn.call", op="forward_mqa", layer=0, capturing=True, gid=1,
                hints={"min_kv_seq_len": 1})
    record.emit("kernel.split", op="mla_gluon", num_kv_splits=1, block_n=64, batch=1, qlen=1,
                nhead=16, min_kv_seq_len=1, policy="legacy", capturing=True, gid=1)
    record.emit("kernel.launch", name="_mla_stage1", grid=[1, 1, 1], num_warps=4,
                const={"NUM_KV_SPLITS": 1, "BLOCK_N": 64}, capturing=True, gid=1)
    record.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1000)
    for i in range(int(os.environ.get("PROG_STEPS", "300"))):
        record.emit("attn.metadata", backend="reference_mla", num_reqs=1, seq_len_min=4096 + i,
                    seq_len_max=4096 + i, seq_len_sum=4096 + i, dummy=False, capturing=False,
                    ptrs={})
        record.emit_replay(1)


if __name__ == "__main__":
    start = time.perf_counter()
    story("main")
    if os.environ.get("PROG_TREE") == "0":
        print(f"program wall {time.perf_counter() - start:.4f} s")
        sys.exit(0)
    child = os.fork()
    if child == 0:
        story("fork")
        sys.exit(0)
    os.waitpid(child, 0)
    for method in ("spawn", "fork"):
        p = mp.get_context(method).Process(target=story, args=(method,))
        p.start()
        p.join()
    print(f"program wall {time.perf_counter() - start:.4f} s")
'''


def run_traced(tmp: Path, name: str, otlp: str | None, cmd: list[str] | None = None,
               timeout: float = 120, tree: bool = True
               ) -> tuple[subprocess.CompletedProcess, Path, float]:
    prog = tmp / "prog.py"
    prog.write_text(PROGRAM)
    out = tmp / name
    args = [PYTHON, "-m", "mlatrace.cli", "run", "--out", str(out)]
    if otlp:
        args += ["--otlp", otlp]
    started = time.monotonic()
    done = subprocess.run([*args, "--", *(cmd or [PYTHON, str(prog)])], capture_output=True,
                          text=True, env={**env_with_repo(), "PROG_TREE": "1" if tree else "0"},
                          timeout=timeout, cwd=tmp)
    return done, out, time.monotonic() - started


def trace_records(out: Path) -> dict[int, list[dict]]:
    procs = {}
    for path in sorted(out.glob("p*.jsonl")):
        recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        procs[recs[0]["pid"]] = recs
    return procs


def assert_spans_match_trace(spans: list[dict], out: Path) -> dict[int, list[dict]]:
    """What each process sent live is what its trace file holds."""
    procs = trace_records(out)
    by_pid: dict[int, list[dict]] = {}
    for s in spans:
        by_pid.setdefault(s["resource"]["process.pid"], []).append(s)
    assert set(by_pid) == set(procs)
    assert len({s["trace_id"] for s in spans}) == 1  # one trace per run
    process_span = {}
    for pid, recs in procs.items():
        mine = by_pid[pid]
        kinds = Counter(r["k"] for r in recs)
        names = Counter(s["name"].split(" ")[0] for s in mine)
        assert names["process"] == 1
        assert names["graph.capture"] == kinds["graph.capture.begin"], pid
        assert names["attn.call"] == kinds["attn.call"], pid
        replays = [s for s in mine if s["name"] == "graph.replay"]
        folded = sum(r["replays"] for r in recs if r["k"] == "steady")  # folds stand for these
        assert sum(s["attrs"]["mlatrace.replay.count"] for s in replays) == \
            kinds["graph.replay"] + folded
        proc = next(s for s in mine if s["name"].startswith("process"))
        process_span[pid] = proc
        ids = {s["span_id"] for s in mine}
        for s in mine:
            if s is not proc:
                assert s["parent"] in ids, s  # every other span hangs under this process
        header = recs[0]
        assert proc["start"] == header["wall_ns"]
        assert proc["resource"]["process.parent_pid"] == header["ppid"]
        assert proc["resource"]["process.command_args"] == header["argv"]
    for pid, recs in procs.items():  # process tree: a traced parent's span is the parent
        ppid = recs[0]["ppid"]
        expected = process_span[ppid]["span_id"] if ppid in procs else None
        assert process_span[pid]["parent"] == expected, pid
    return procs


def program_wall(done: subprocess.CompletedProcess) -> float:
    match = re.search(r"program wall ([0-9.]+) s", done.stdout)
    assert match, done.stdout + done.stderr
    return float(match.group(1))


def test_live_export_from_a_process_tree(tmp_path: Path) -> None:
    with Receiver() as rx:
        done, out, _ = run_traced(tmp_path, "trace", rx.url)
        assert done.returncode == 0, done.stderr
        expected = len(list(out.glob("p*.jsonl")))
        spans = rx.wait_for(lambda s: sum(x["name"].startswith("process") for x in s) >= expected)
    procs = assert_spans_match_trace(spans, out)
    main = min(procs)  # parent, 3 children (+ the spawn resource tracker)
    children = [p for p, recs in procs.items() if recs[0]["ppid"] == main]
    assert len(children) >= 3
    captures = [s for s in spans if s["name"] == "graph.capture reference FULL"]
    assert len(captures) == 4
    for c in captures:
        split = next(e for e in c["events"] if e["name"] == "kernel.split")
        assert split["attrs"]["mlatrace.num_kv_splits"] == 1
    assert "live OTLP export" not in done.stderr


def test_dead_endpoint_never_breaks_or_slows_the_program(tmp_path: Path) -> None:
    base, base_out, base_total = run_traced(tmp_path, "base", None)
    dead, dead_out, dead_total = run_traced(tmp_path, "dead", f"http://127.0.0.1:{free_port()}")
    assert base.returncode == dead.returncode == 0, dead.stderr
    assert "live OTLP export to" in dead.stderr and "connection refused" in dead.stderr
    shape = [sorted(Counter(r["k"] for r in recs).items())
             for recs in trace_records(base_out).values()]
    assert shape == [sorted(Counter(r["k"] for r in recs).items())
                     for recs in trace_records(dead_out).values()]  # the trace is intact
    assert all(recs[-1]["k"] == "process.end" for recs in trace_records(dead_out).values())
    # A program blocked on the exporter would lose its timeout (3 s) per export or process;
    # the margins only absorb the noise of a loaded machine.
    assert program_wall(dead) < 2 * program_wall(base) + 1.0, (program_wall(base),
                                                                 program_wall(dead))
    assert dead_total < 1.5 * base_total + 3.0, (base_total, dead_total)


def test_silent_endpoint_never_hangs_the_program(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        base, _, _ = run_traced(tmp_path, "base", None, tree=False)
        done, out, total = run_traced(tmp_path, "silent",
                                      f"http://127.0.0.1:{silent.getsockname()[1]}", tree=False)
    assert done.returncode == 0, done.stderr
    assert all(recs[-1]["k"] == "process.end" for recs in trace_records(out).values())
    assert program_wall(done) < 2 * program_wall(base) + 1.0, (program_wall(base),
                                                                program_wall(done))
    assert total < 15, total


def test_live_export_of_the_reference_program(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    with Receiver() as rx:
        done, out, _ = run_traced(tmp_path, "ref", rx.url, cmd=[
            PYTHON, "-m", "mlatrace.reference.serve", "--steps", "2", "--ctx", "1024"])
        assert done.returncode == 0, done.stderr
        expected = len(list(out.glob("p*.jsonl")))
        spans = rx.wait_for(lambda s: sum(x["name"].startswith("process") for x in s) >= expected)
    procs = assert_spans_match_trace(spans, out)
    if not any(r["k"] == "graph.capture.begin" for recs in procs.values() for r in recs):
        pytest.xfail("the reference probes recorded no capture yet")
    assert any(s["name"].startswith("graph.capture") for s in spans)


EXEC_PROGRAM = '''
import os
import sys

from mlatrace import record

record.emit("mark", name="before-exec", attrs={})
os.execv(sys.executable, [sys.executable, "-c",
         "from mlatrace import record; record.emit('mark', name='after-exec', attrs={})"])
'''


def test_exec_keeps_pid_and_chains_process_spans(tmp_path: Path) -> None:
    prog = tmp_path / "execs.py"
    prog.write_text(EXEC_PROGRAM)
    with Receiver() as rx:
        done, out, _ = run_traced(tmp_path, "exec", rx.url, cmd=[PYTHON, str(prog)])
        assert done.returncode == 0, done.stderr
        spans = rx.wait_for(lambda s: sum(x["name"].startswith("process") for x in s) >= 2)
    procs = [s for s in spans if s["name"].startswith("process")]
    assert len(procs) == 2 and len(list(out.glob("p*.jsonl"))) == 2
    assert procs[0]["resource"]["process.pid"] == procs[1]["resource"]["process.pid"]
    before = next(s for s in procs if s["events"][0]["attrs"]["mlatrace.name"] == "before-exec")
    after = next(s for s in procs if s is not before)
    assert after["parent"] == before["span_id"] and after["trace_id"] == before["trace_id"]
    # `mlatrace export` of the same trace chains them the same way (span ids by file).
    with Receiver() as rx:
        exported = subprocess.run([PYTHON, "-m", "mlatrace.cli", "export", str(out), "--otlp",
                                   rx.url], capture_output=True, text=True, env=env_with_repo(),
                                  timeout=60)
        assert exported.returncode == 0, exported.stderr
        procs = [s for s in rx.spans if s["name"].startswith("process")]
    first = next(s for s in procs if s["parent"] is None)
    assert [s["parent"] for s in procs if s is not first] == [first["span_id"]]
