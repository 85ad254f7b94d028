"""`mlatrace watch`: the tailing reader, the incremental model and the live finding log.

The traces are real files written piece by piece (cut mid-line on purpose) while the
reader follows them; the incremental result is compared with `report`'s batch analysis
of the same files, on every fixture under samples/ and tests/fixtures/.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from synth import SEQ_INFO_PTR, SynthProcess, mla_decode, write_run

from mlatrace.analysis import analyze, analyze_model
from mlatrace.analysis.builder import IncrementalBuilder
from mlatrace.output.report import report_dict
from mlatrace.output.watch import LiveRun, newest_run
from mlatrace.trace import open_trace
from mlatrace.trace import tail as tail_mod
from mlatrace.trace.tail import TailReader

TRACE_DIRS = sorted({p.parent for base in (REPO / "samples", REPO / "tests" / "fixtures")
                     for p in base.rglob("p*.jsonl")})


def _comparable(data: dict) -> dict:
    """A report dict without what legitimately differs: the path and the problems' order."""
    out = dict(data)
    out.pop("trace")
    out["problems"] = sorted(json.dumps(p, sort_keys=True) for p in data["problems"])
    return out


def _follow_piecewise(src: Path, dst: Path, seed: int, cuts: int = 7,
                      check_prefixes: bool = True) -> LiveRun:
    """Copy src's files into dst in random pieces (interleaved, cut anywhere, mid-line
    too), polling a LiveRun after each piece; at piece ends that fall on line boundaries
    in every file, the live findings must equal a batch analysis of the same prefix."""
    rng = random.Random(seed)
    dst.mkdir(parents=True)
    files = sorted(src.glob("p*.jsonl"))
    data = {f.name: f.read_bytes() for f in files}
    plans = {}
    for name, blob in data.items():
        points = sorted(rng.sample(range(1, len(blob)), min(cuts, max(0, len(blob) - 1))))
        plans[name] = [0, *points, len(blob)]
    live = LiveRun([dst])
    written = {name: 0 for name in data}
    steps = [(name, i) for name, plan in plans.items() for i in range(1, len(plan))]
    order: list[tuple[str, int]] = []
    pending = {name: 1 for name in data}
    while pending:  # interleave files, each in its own order
        name = rng.choice(sorted(pending))
        order.append((name, pending[name]))
        pending[name] += 1
        if pending[name] == len(plans[name]):
            del pending[name]
    assert len(order) == len(steps)
    for name, i in order:
        with (dst / name).open("ab") as f:
            f.write(data[name][plans[name][i - 1]:plans[name][i]])
        written[name] = plans[name][i]
        live.poll()
        live.refresh()
        at_lines = all(data[n][:w].endswith(b"\n") for n, w in written.items() if w)
        if check_prefixes and at_lines and rng.random() < 0.5:
            prefix = dst.parent / f"prefix-{name}-{i}"
            prefix.mkdir()
            for n, w in written.items():
                if w:
                    (prefix / n).write_bytes(data[n][:w])
            batch = analyze(open_trace(prefix), live.config)
            assert [f.to_dict() for f in live.analysis.findings] == \
                [f.to_dict() for f in batch.findings], f"{src.name}: prefix after {name} piece {i}"
            shutil.rmtree(prefix)
    for side in ("run.json", "whatif.json"):  # written beside the trace after the run
        if (src / side).exists():
            shutil.copy(src / side, dst / side)
    return live


@pytest.mark.parametrize("trace_dir", TRACE_DIRS, ids=lambda p: str(p.relative_to(REPO)))
def test_incremental_equals_report_on_every_fixture(trace_dir: Path, tmp_path: Path) -> None:
    assert len(TRACE_DIRS) >= 10  # the fixtures and the recorded GPU traces are all here
    live = _follow_piecewise(trace_dir, tmp_path / "live", seed=len(trace_dir.name))
    final = live.close()
    batch = analyze(open_trace(trace_dir), live.config)
    assert [f.to_dict() for f in final.findings] == [f.to_dict() for f in batch.findings]
    assert _comparable(report_dict("x", final)) == _comparable(report_dict("x", batch))
    # every finding of the final report was shown live before the end, none left resolved
    assert {lf.finding.id for lf in live.findings() if lf.active} == \
        {f.id for f in final.findings}


def test_tail_holds_a_partial_line_until_it_completes(tmp_path: Path) -> None:
    proc = SynthProcess(tmp_path, 5)
    proc.emit("mark", name="a", attrs={})
    proc.emit("mark", name="b", attrs={})
    blob = ("\n".join(proc.lines) + "\n").encode()
    path = tmp_path / "p5.jsonl"
    cut = blob.index(b'"name":"b"')
    path.write_bytes(blob[:cut])
    tail = TailReader([tmp_path])
    got = [r for _p, chunks in tail.poll() for recs in chunks for r in recs]
    assert [r["k"] for r in got] == ["process", "mark"]
    assert tail.problems == []  # a writer mid-flush is not a problem
    with path.open("ab") as f:
        f.write(blob[cut:])
    got = [r for _p, chunks in tail.poll() for recs in chunks for r in recs]
    assert [(r["k"], r.get("name")) for r in got] == [("mark", "b")]
    assert tail.poll() == [] and tail.problems == []


def _spy_tail_reads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The byte counts of every read the tail makes from now on (its `open` spied on)."""
    reads: list[int] = []
    real_open = open

    class Spy:
        def __init__(self, f):  # noqa: ANN001
            self.f = f

        def __enter__(self):  # noqa: ANN204
            return self

        def __exit__(self, *exc):  # noqa: ANN002, ANN204
            self.f.close()

        def seek(self, n: int) -> None:
            self.f.seek(n)

        def read(self, n: int) -> bytes:
            data = self.f.read(n)
            reads.append(len(data))
            return data

    monkeypatch.setattr(tail_mod, "open", lambda p, mode: Spy(real_open(p, mode)), raising=False)
    return reads


def test_tail_reads_only_new_bytes_and_finds_new_files_and_host_dirs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = SynthProcess(tmp_path, 10)
    first.write(end=False)
    reads = _spy_tail_reads(monkeypatch)
    tail = TailReader([tmp_path])
    assert [sum(map(len, c)) for _p, c in tail.poll()] == [1]
    size = (tmp_path / "p10.jsonl").stat().st_size
    assert reads == [size]
    assert tail.poll() == [] and reads == [size]   # nothing new: not even opened
    line = json.dumps({"k": "mark", "t": 5, "seq": 1, "tid": 1, "name": "x"}) + "\n"
    with (tmp_path / "p10.jsonl").open("a") as f:
        f.write(line)
    (tmp_path / "host-b").mkdir()
    SynthProcess(tmp_path / "host-b", 11).write(end=False)
    got = {p.name: sum(map(len, c)) for p, c in tail.poll()}
    assert got == {"p10.jsonl": 1, "host-b/p11.jsonl": 1}
    assert reads[1] == len(line)  # only the appended line of p10 was read


def test_tail_reports_bad_lines_as_the_batch_reader_does(tmp_path: Path) -> None:
    src = REPO / "tests" / "fixtures" / "garbage_line"
    dst = tmp_path / "t"
    live = _follow_piecewise(src, dst, seed=3, check_prefixes=False)
    live.close()
    batch = open_trace(src)
    for proc in batch.processes:
        list(proc.records())
    assert sorted(map(str, live.tail.problems)) == sorted(map(str, batch.problems))
    assert any(":11:" in str(p) for p in live.tail.problems)  # file:line, line 11 (1-based)


def test_truncated_last_line_is_held_while_running_and_reported_at_close(tmp_path: Path) -> None:
    shutil.copytree(REPO / "tests" / "fixtures" / "truncated_last_line", tmp_path / "t")
    live = LiveRun([tmp_path / "t"])
    live.poll()
    live.refresh()
    assert live.model.problems == []
    live.close()
    assert [p.reason.split(":")[0] for p in live.model.problems] == \
        ["truncated line (process killed mid-write?)"]


def _feed_lines(live: LiveRun, path: Path, lines: list[str], stop) -> None:  # noqa: ANN001
    """Append lines one by one, refreshing after each, until stop(live) holds."""
    with path.open("a") as f:
        for line in lines:
            f.write(line + "\n")
            f.flush()
            live.poll()
            live.refresh()
            if stop(live):
                return
    raise AssertionError("never reached")


def _follow_until_mlt001_resolved(src: Path, dst: Path) -> LiveRun:
    """Copy src's p1000.jsonl into dst line by line under a LiveRun: until MLT001 shows
    (asserted active), then until it is no longer active. Returns the live run."""
    lines = (src / "p1000.jsonl").read_text().splitlines()
    dst.mkdir()
    live = LiveRun([dst])
    _feed_lines(live, dst / "p1000.jsonl", lines,
                lambda lv: any(lf.finding.id == "MLT001" for lf in lv.findings()))
    assert live.findings()[0].active
    done = sum(1 for _ in (dst / "p1000.jsonl").open())
    _feed_lines(live, dst / "p1000.jsonl", lines[done:], lambda lv: not lv.findings()[0].active)
    return live


def test_a_finding_contradicted_by_an_eager_call_is_shown_resolved(tmp_path: Path) -> None:
    # a breakable capture: the one-split decision seen while capturing is re-made eagerly,
    # with the real length, right after the first replay
    src = mla_decode(tmp_path / "src", policy="legacy", breakable=True)
    live = _follow_until_mlt001_resolved(src, tmp_path / "live")
    logged = live.findings()[0]
    assert logged.resolved_why == "no longer holds on later records"
    live.close()
    assert analyze(open_trace(src)).findings == []  # and the report agrees


def _recaptured_trace(root: Path) -> Path:
    write_run(root)
    proc = SynthProcess(root, 1000)

    def capture(wrapper: int, torch_gid: int, hint: int, splits: int) -> None:
        proc.emit("graph.capture.begin", gid=wrapper, parent=None, src="vllm",
                  key="FULL(num_tokens=1)", mode="FULL")
        proc.emit("graph.capture.begin", gid=torch_gid, parent=wrapper, src="torch")
        proc.emit("attn.call", op="forward_mqa", layer=0, capturing=True, gid=torch_gid,
                  hints={"min_kv_seq_len": hint}, ptrs={"seq_info": SEQ_INFO_PTR})
        proc.emit("kernel.split", op="mla_gluon", num_kv_splits=splits, block_n=64, batch=1,
                  qlen=1, nhead=16, min_kv_seq_len=hint, policy="legacy", capturing=True,
                  gid=torch_gid)
        proc.emit("graph.capture.end", gid=torch_gid)
        proc.emit("graph.capture.end", gid=wrapper)

    def step(wrapper: int, torch_gid: int, length: int) -> None:
        proc.emit("attn.metadata", backend="reference_mla", num_reqs=1, seq_len_min=length,
                  seq_len_max=length, seq_len_sum=length, capturing=False)
        proc.replay(wrapper)
        proc.replay(torch_gid)

    capture(1, 2, hint=1, splits=1)
    step(1, 2, 50000)
    capture(3, 4, hint=16384, splits=16)  # the same batch descriptor, captured at a real length
    step(3, 4, 50001)
    proc.write()
    return root


def test_a_finding_whose_graph_is_captured_again_is_shown_resolved(tmp_path: Path) -> None:
    src = _recaptured_trace(tmp_path / "src")
    dst = tmp_path / "live"
    live = _follow_until_mlt001_resolved(src, dst)
    assert live.findings()[0].resolved_why == "captured again as gid 3, without it"
    shutil.copy(src / "p1000.jsonl", dst / "p1000.jsonl")  # the rest of the run
    final = live.close()
    # the one-split replay did happen: the report keeps the finding, the view marks it resolved
    assert [f.to_dict() for f in final.findings] == \
        [f.to_dict() for f in analyze(open_trace(src)).findings]
    mlt001 = [lf for lf in live.findings() if lf.finding.id == "MLT001"]
    assert len(mlt001) == 1 and not mlt001[0].active


def test_batch_and_incremental_builders_are_one_code_path(tmp_path: Path) -> None:
    src = mla_decode(tmp_path / "t", policy="legacy", ranks=2)
    trace = open_trace(src)
    inc = IncrementalBuilder(root=str(src))
    for proc in trace.processes:
        records = list(proc.records())
        for i in range(0, len(records), 3):   # odd pieces, snapshots in between
            inc.feed(proc, records[i:i + 3])
            inc.snapshot(trace.problems, trace.processes)
    live = analyze_model(inc.snapshot(trace.problems, trace.processes))
    assert report_dict("x", live) == report_dict("x", analyze(open_trace(src)))


def test_newest_run_picks_the_latest_start(tmp_path: Path) -> None:
    for name, start in (("a", 5), ("b", 9), ("c", 7)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "run.json").write_text(json.dumps({"start_ns": start}))
    (tmp_path / "empty").mkdir()
    assert newest_run(tmp_path) == [tmp_path / "b"]
    # a run over two hosts: run.json above the host directories, one run_id (found as
    # report finds it); the tailing reader follows the host directories from the top one
    multi = tmp_path / "d"
    for host in ("h1", "h2"):
        (multi / host).mkdir(parents=True)
        (multi / host / "p100.jsonl").write_text(json.dumps(
            {"k": "process", "t": 0, "seq": 0, "schema": "mlatrace/1", "pid": 100,
             "host": host, "run_id": "R", "wall_ns": 10}) + "\n")
    (multi / "run.json").write_text(json.dumps({"start_ns": 11, "run_id": "R"}))
    assert newest_run(tmp_path) == [multi]
    assert newest_run(multi / "h2") == [multi / "h2"]
    assert newest_run(tmp_path / "c") == [tmp_path / "c"]
    assert newest_run(tmp_path / "empty") == []


def _watch(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env_path = str(REPO)
    return subprocess.run([sys.executable, "-m", "mlatrace", "watch", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd,
                          env={**__import__("os").environ, "PYTHONPATH": env_path})


def test_watch_once_cli(tmp_path: Path) -> None:
    shutil.copytree(REPO / "tests" / "fixtures" / "legacy_tp2", tmp_path / "mlatrace-trace" / "r1")
    proc = _watch("--once", cwd=tmp_path)   # default dir: the newest run of ./mlatrace-trace
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "following mlatrace-trace/r1" in proc.stderr
    assert "MLT001 frozen-one-split" in out and "active" in out
    assert "p1000.jsonl" in out and "p1001.jsonl" in out and "ended (exit)" in out
    assert "FULL(num_tokens=1)" in out and "0 probe errors" in out
    missing = _watch("--once", str(tmp_path / "nothing"))
    assert missing.returncode == 2 and "no trace here" in missing.stderr


# -- live programs -------------------------------------------------------------------------
SERVE = [sys.executable, "-m", "mlatrace.reference.serve", "--policy", "legacy", "--graph",
         "full", "--device", "cpu", "--ctx", "2048", "--batch", "1", "--layers", "1",
         "--steps", "400", "--step-delay", "0.1"]


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}


def _start_traced(out: Path, cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "mlatrace", "run", "--out", str(out), "--",
                             *cmd], env=_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def _stop(proc: subprocess.Popen) -> None:
    """End a `mlatrace run` launcher and its command: the command runs in a session of
    its own, so SIGTERM to the launcher (which forwards it to the whole tree) first."""
    import os
    import signal

    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def _snapshot(out: Path) -> dict:
    proc = subprocess.run([sys.executable, "-m", "mlatrace", "watch", "--once", "--json",
                           str(out)], capture_output=True, text=True, timeout=120, env=_env())
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def _poll_until(what, timeout_s: float = 240.0):  # noqa: ANN001, ANN202
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(1.0)
    raise AssertionError("timed out")


@pytest.mark.slow
def test_watch_once_shows_mlt001_while_the_reference_server_runs(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    server = _start_traced(out, SERVE)
    try:
        def with_mlt001() -> dict | None:
            if not out.exists():
                return None
            snap = _snapshot(out)
            return snap if any(f["id"] == "MLT001" for f in snap["findings"]) else None

        snap = _poll_until(with_mlt001)
        assert server.poll() is None, "the program ended before the snapshot"
        assert not snap["finished"] and snap["run"]["end_ns"] is None
        assert [p["state"] for p in snap["processes"]] == ["running"]
        mlt001 = next(f for f in snap["findings"] if f["id"] == "MLT001")
        assert mlt001["status"] == "active" and "froze mla_gluon at 1 KV split" in mlt001["message"]
        # the text snapshot says the same, with the graph and its replays
        text = subprocess.run([sys.executable, "-m", "mlatrace", "watch", "--once", str(out)],
                              capture_output=True, text=True, timeout=120, env=_env()).stdout
        assert "running for" in text and "MLT001 frozen-one-split" in text
        assert "num_tokens=1" in text and "skipped" in text  # key and stage 2 frozen
    finally:
        _stop(server)


def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30,
                          check=True).stdout


@pytest.mark.slow
def test_watch_in_a_terminal_updates_and_survives_a_sigkill(tmp_path: Path) -> None:
    import os
    import signal
    import time

    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (apt-get install tmux): the terminal test needs it")
    out = tmp_path / "trace"
    server = _start_traced(out, SERVE)
    session = f"mlatrace-watch-{os.getpid()}"
    try:
        _poll_until(lambda: list(out.glob("p*.jsonl")), 120)
        script = tmp_path / "watch.sh"
        script.write_text(f"sleep 1\ncd {tmp_path}\nexport PYTHONPATH={REPO}\n"
                          f"{sys.executable} -m mlatrace watch {out}\necho WATCH-EXIT $?\n"
                          f"{sys.executable} -m mlatrace watch {out}\necho SECOND-EXIT $?\n"
                          "sleep 120\n")
        _tmux("new-session", "-d", "-s", session, "-x", "200", "-y", "70", f"bash {script}")
        # no client is attached: without a manual size, tmux may shrink the window to 80x24
        _tmux("set-option", "-t", session, "window-size", "manual")
        _tmux("resize-window", "-t", session, "-x", "200", "-y", "70")

        def pane() -> str:
            return _tmux("capture-pane", "-p", "-t", session, "-S", "-", "-E", "-")

        def showing(*texts: str):  # noqa: ANN202
            def check() -> str | None:
                text = pane()
                return text if all(t in text for t in texts) else None
            return check

        first = _poll_until(showing("replays", "MLT001"))
        time.sleep(2.5)
        second = pane()
        assert second != first, "the view did not update"
        assert "running for" in second
        # Ctrl-C: the view ends with the final report of what was read; the program goes on
        _tmux("send-keys", "-t", session, "C-c")
        stopped = _poll_until(showing("WATCH-EXIT"), 60)
        assert "WATCH-EXIT 0" in stopped and "final report (interrupted" in stopped, stopped[-3000:]
        assert server.poll() is None
        # SIGKILL the traced program mid-run: the second view ends cleanly, final report shown
        time.sleep(4)  # the second view starts and catches up
        pid = json.loads((next(out.glob("p*.jsonl"))).open().readline())["pid"]
        os.kill(pid, signal.SIGKILL)
        final = _poll_until(showing("SECOND-EXIT"), 60)
        assert "SECOND-EXIT 0" in final, final[-3000:]
        assert "Traceback" not in final, final[-3000:]
        after = final[final.index("WATCH-EXIT"):]
        assert "final report" in after and "MLT001" in after
        assert "exit code 137" in after  # the launcher saw its command die of SIGKILL
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=30)
        _stop(server)


@pytest.mark.slow
def test_run_watch_sends_the_output_to_a_log_and_prints_the_final_report(tmp_path: Path) -> None:
    out = tmp_path / "trace"
    cmd = [*SERVE[:SERVE.index("--steps")], "--steps", "6", "--step-delay", "0"]
    proc = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--watch", "--out", str(out),
                           "--", *cmd, "--check"], capture_output=True, text=True, timeout=300,
                          env=_env())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = (out / "cmd.log").read_text()
    assert "check: all steps match the float64 reference" in log   # the command's own output
    assert "check: all steps" not in proc.stdout                   # ... is not on the screen
    assert f"command output: {out / 'cmd.log'}" in proc.stdout
    assert "final report" in proc.stdout and "MLT001 frozen-one-split" in proc.stdout


def test_a_backlog_is_read_in_chunks_and_caught_up(tmp_path: Path) -> None:
    src = mla_decode(tmp_path / "src", policy="legacy", replay_lens=tuple(range(9000, 9400)))
    live = LiveRun([src])
    live.tail.chunk = 4096
    assert live.poll() > 0 and live.tail.behind
    from mlatrace.output.watch import catch_up

    catch_up(live)
    assert not live.tail.behind
    assert [f.to_dict() for f in live.close().findings] == \
        [f.to_dict() for f in analyze(open_trace(src)).findings]


def test_a_backlog_poll_takes_more_while_behind_and_reads_a_piece_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a backlog remains each poll takes twice the last one's bytes (up to
    MAX_GROWTH chunks), read a piece of READ_BYTES at a time; once caught up, a poll
    takes one chunk again."""
    src = mla_decode(tmp_path / "src", policy="legacy", replay_lens=tuple(range(9000, 9400)))
    path = next(src.glob("p*.jsonl"))
    blob = path.read_bytes()
    half = blob.index(b"\n", len(blob) // 2) + 1
    path.write_bytes(blob[:half])
    reads = _spy_tail_reads(monkeypatch)
    monkeypatch.setattr(tail_mod, "READ_BYTES", 1000)
    live = LiveRun([src])
    live.tail.chunk = 4096
    takes = []
    while live.poll() or live.tail.behind:
        takes.append(live.tail.pending)
    assert takes[:4] == [4096, 8192, 16384, 4096 * tail_mod.MAX_GROWTH]
    assert max(takes) == 4096 * tail_mod.MAX_GROWTH and sum(takes) == half
    assert max(reads) == 1000 and sum(reads) == half   # each byte read once, a piece at a time
    with path.open("ab") as f:
        f.write(blob[half:])
    live.poll()
    assert live.tail.pending == 4096 and live.tail.behind   # caught up: one chunk first
    assert [f.to_dict() for f in live.close().findings] == \
        [f.to_dict() for f in analyze(open_trace(src)).findings]


def test_a_feed_worker_reads_its_own_files(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """A poll fed over forked workers: the watch process reads only the files it feeds
    itself; a worker reads its own, and the watch goes on from where the worker stopped."""
    from mlatrace.analysis import parallel
    from mlatrace.output.watch import state

    src = mla_decode(tmp_path / "src", policy="legacy", replay_lens=tuple(range(9000, 9300)),
                     ranks=2)
    opened: list[str] = []   # in this process only: a forked worker appends to its own copy
    real_open = open

    def spy(p: Path, mode: str):  # noqa: ANN202
        opened.append(Path(p).name)
        return real_open(p, mode)

    monkeypatch.setattr(tail_mod, "open", spy, raising=False)
    monkeypatch.setattr(state, "FEED_PARALLEL_MIN_BYTES", 0)
    ran: list[int | None] = []
    feed = parallel.feed_parallel
    monkeypatch.setattr(parallel, "feed_parallel", lambda *a: ran.append(feed(*a)) or ran[-1])
    live = LiveRun([src])
    live.tail.chunk = 4096
    while live.poll():
        pass
    assert len(ran) > 3 and all(n is not None for n in ran)
    assert len(set(opened)) == 1   # the file the watch feeds itself, never the worker's
    assert all(t.offset == t.proc.path.stat().st_size for t in live.tail.files.values())
    batch = analyze(open_trace(src), live.config)
    assert _comparable(report_dict("x", live.close())) == _comparable(report_dict("x", batch))


def test_refreshes_while_catching_up_are_fewer(tmp_path: Path) -> None:
    """The follow loop shows new records within POLL_S once caught up, but only every
    BACKLOG_REFRESH_S while a backlog remains; with nothing new, every IDLE_REFRESH_S."""
    from mlatrace.output.watch import BACKLOG_REFRESH_S, IDLE_REFRESH_S, POLL_S, refresh_due

    live = LiveRun([tmp_path])
    assert POLL_S < BACKLOG_REFRESH_S < IDLE_REFRESH_S
    assert refresh_due(live, True, POLL_S) and not refresh_due(live, True, POLL_S / 2)
    live.tail.behind = True
    assert not refresh_due(live, True, POLL_S) and refresh_due(live, True, BACKLOG_REFRESH_S)
    assert not refresh_due(live, False, BACKLOG_REFRESH_S)
    assert refresh_due(live, False, IDLE_REFRESH_S)


MULTI_PROCESS_DIRS = [d for d in TRACE_DIRS if len(list(d.glob("p*.jsonl"))) >= 2]


@pytest.mark.parametrize("trace_dir", MULTI_PROCESS_DIRS,
                         ids=lambda p: str(p.relative_to(REPO)))
def test_a_backlog_fed_over_forked_workers_equals_the_report(
        trace_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every poll that brings records of several processes goes to the parallel feed
    (forked workers continue the builders of their pids and hand them back)."""
    from mlatrace.analysis import parallel
    from mlatrace.output.watch import state

    ran: list[int | None] = []
    feed = parallel.feed_parallel
    monkeypatch.setattr(parallel, "feed_parallel", lambda *a: ran.append(feed(*a)) or ran[-1])
    serial, forked = LiveRun([trace_dir]), LiveRun([trace_dir])
    serial.tail.chunk = forked.tail.chunk = 4096   # a backlog: every file in several polls
    while True:
        monkeypatch.setattr(state, "FEED_PARALLEL_MIN_BYTES", 1 << 40)
        added = serial.poll()
        monkeypatch.setattr(state, "FEED_PARALLEL_MIN_BYTES", 0)
        assert forked.poll() == added
        assert _comparable(report_dict("x", forked.refresh())) == \
            _comparable(report_dict("x", serial.refresh()))
        if not added:
            break
    assert any(n is not None for n in ran)  # the workers really ran
    batch = analyze(open_trace(trace_dir), forked.config)
    assert _comparable(report_dict("x", forked.close())) == \
        _comparable(report_dict("x", batch))


def test_bad_lines_fed_over_forked_workers_are_named_as_the_report_names_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Line numbers carry over from a worker's poll to the next (the reader's state comes
    back with its builders): bad lines late in a file fed by workers are reported at the
    lines the batch reader names."""
    from mlatrace.output.watch import state

    src = mla_decode(tmp_path / "src", policy="legacy", replay_lens=tuple(range(9000, 9300)),
                     ranks=2)
    for path in sorted(src.glob("p*.jsonl")):
        lines = path.read_bytes().split(b"\n")
        lines[len(lines) // 2] = b'{"k": "graph.replay", "seq": '        # not JSON
        lines[len(lines) * 3 // 4] = b'{"k": "graph.replay", "t": "x", "seq": 1}'  # bad field
        path.write_bytes(b"\n".join(lines))
    monkeypatch.setattr(state, "FEED_PARALLEL_MIN_BYTES", 0)
    live = LiveRun([src])
    live.tail.chunk = 4096   # many polls, each fed over a worker
    while live.poll():
        pass
    batch = analyze(open_trace(src), live.config)
    assert len(batch.problems) == 4
    assert sorted(map(str, live.close().problems)) == sorted(map(str, batch.problems))


def test_a_feed_worker_that_dies_is_made_up_for(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """A forked feed worker killed mid-feed hands nothing back: the watch process feeds
    its records itself, and the result is the report's."""
    import os
    import signal

    from mlatrace.analysis import parallel
    from mlatrace.output.watch import state

    trace_dir = MULTI_PROCESS_DIRS[0]
    feed_bucket = parallel._feed_bucket
    children: list[int] = []

    def dying(index: int) -> tuple[bytes, int]:
        children.append(os.getpid())
        os.kill(os.getpid(), signal.SIGKILL)   # in the forked worker
        return feed_bucket(index)

    monkeypatch.setattr(parallel, "_feed_bucket", dying)
    monkeypatch.setattr(state, "FEED_PARALLEL_MIN_BYTES", 0)
    ran: list[int | None] = []
    feed = parallel.feed_parallel
    monkeypatch.setattr(parallel, "feed_parallel", lambda *a: ran.append(feed(*a)) or ran[-1])
    live = LiveRun([trace_dir])
    while live.poll():
        pass
    assert ran and all(n is not None for n in ran)   # the parallel path ran, and fed it all
    assert children == []                            # the kills happened in the children only
    batch = analyze(open_trace(trace_dir), live.config)
    assert _comparable(report_dict("x", live.close())) == _comparable(report_dict("x", batch))


def test_watch_coverage_is_the_reports(tmp_path: Path) -> None:
    """The view's coverage line and --json coverage are analysis.coverage's judgement."""
    from rich.console import Console

    from mlatrace.output.watch.view import render, snapshot_dict

    proc = SynthProcess(tmp_path, 7)
    proc.emit("probe.error", probe="vllm.attn", target="vllm.x.forward", reason="drift",
              error="signature drift: forward(self, q)")
    proc.write(end=False)
    live = LiveRun([tmp_path])
    live.poll()
    live.refresh()
    batch = analyze(open_trace(tmp_path)).coverage
    snap = snapshot_dict(live)["coverage"]
    running = live.processes()[0].state == "running"  # pid 7 may be alive on this host:
    expected = [r for r in batch.reasons               # then it is not a killed process
                if not (running and r.startswith("process killed"))]
    assert snap["blind"] and snap["reasons"] == expected
    assert snap["packs"] == ["reference"] and snap["attached"] is None  # no process.end yet
    assert snap["probe_errors"] == [{"file": "p7.jsonl", "probe": "vllm.attn",
                                     "target": "vllm.x.forward",
                                     "error": "signature drift: forward(self, q)"}]
    console = Console(width=200, record=True, color_system=None)
    console.print(render(live))
    text = console.export_text()
    assert "probe errors: 1" in text and f"blind so far: {batch.reasons[0]}" in text


_NO_MSGSPEC_CHILD = """
import json, sys
sys.modules["msgspec"] = None   # import msgspec raises ImportError: the stdlib-json reader
from mlatrace.analysis import analyze
from mlatrace.output.report import report_dict
from mlatrace.trace import open_trace, typed
from mlatrace.output.watch import LiveRun
assert typed.decode_records is None
out = {}
for path in sys.argv[1:]:
    live = LiveRun([__import__("pathlib").Path(path)])
    while live.poll() or live.tail.behind:
        pass
    out[path] = [report_dict("x", live.close()), report_dict("x", analyze(open_trace(path)))]
print(json.dumps(out, default=str))
"""


def test_without_msgspec_the_stdlib_reader_gives_the_same_reports(tmp_path: Path) -> None:
    """msgspec absent (the H200 image): records are read with the stdlib's json, the typed
    kinds turned into Records; the watch and report give the reports msgspec's reader gives."""
    proc = subprocess.run([sys.executable, "-c", _NO_MSGSPEC_CHILD, *map(str, TRACE_DIRS)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    reports = json.loads(proc.stdout)

    def same(data: dict) -> dict:  # the decoder's own words after "not JSON: " differ
        for problem in data["problems"]:
            problem["reason"] = problem["reason"].split(": ")[0]
        return _comparable(data)

    for trace_dir in TRACE_DIRS:
        live, batch = reports[str(trace_dir)]
        expected = json.loads(json.dumps(report_dict("x", analyze(open_trace(trace_dir))),
                                         default=str))
        assert same(batch) == same(expected), trace_dir
        assert same(live) == same(expected), trace_dir
