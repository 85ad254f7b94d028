"""Folding steady steps loses nothing a rule, a count or a cost reads.

Each reference program runs under `mlatrace run` (real subprocesses, CPU) with folding
off (`--fold 0`) and on (the default, 10 s). The traces must give the same findings,
the same exact counts in process.end and the same coverage, and the folded trace must be
smaller. Then one unfolded trace is folded again offline by the recorder's own folder,
so that both traces hold the same measurements (timings, pointers): the whole report,
field by field, must then be the same, except the evidence's seqs and the records the
file holds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import finding_keys, run_env

pytest.importorskip("torch")

from mlatrace.analysis import analyze  # noqa: E402
from mlatrace.output.report import report_dict  # noqa: E402
from mlatrace.record import fold  # noqa: E402
from mlatrace.trace import open_trace  # noqa: E402

SERVE = ["--device", "cpu", "--ctx", "2048", "--steps", "14", "--batch", "2", "--layers", "2",
         "--hidden", "32", "--heads", "2"]
ROOT = Path(__file__).resolve().parents[1]
CASES = [
    ("--policy", "legacy"),
    ("--policy", "bucketed"),
    ("--policy", "device"),
    ("--policy", "legacy", "--graph", "breakable"),
    ("--policy", "bucketed", "--graph", "breakable"),
    ("--policy", "device", "--graph", "none"),
]


def _env() -> dict[str, str]:
    return run_env()


def traced_serve(out: Path, options: list[str], *args: str) -> list[dict]:
    cmd = [sys.executable, "-m", "mlatrace", "run", "--out", str(out), *options, "--",
           sys.executable, "-m", "mlatrace.reference.serve", *SERVE, *args]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (path,) = out.glob("p*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def without_steady(counts: dict) -> dict:
    return {k: n for k, n in counts.items() if k != "steady"}


def comparable(report: dict) -> Any:
    """The report without what differs by construction: seqs of evidence (a folded record's
    evidence is its `steady` record), the records the file holds and its steady records (the
    records it stands for are the same)."""
    def strip(value: Any, key: str = "") -> Any:
        if isinstance(value, dict) and key in ("lengths", "gpu_times") and "buckets" in value:
            # a fold keeps its points' count and extremes, not each point's time
            return {k: value[k] for k in ("points", "min", "max")}
        if isinstance(value, dict):
            return {k: strip(v, k) for k, v in value.items()
                    if k not in ("seq", "seqs", "trace", "records_read", "evidence")
                    and k not in ("written", "steady")}
        if isinstance(value, list):
            return [strip(v, key) for v in value]
        return value
    return strip(report)


# the first case in the default run, every case in the `slow` run (.ci/run runs both)
ALL_CASES = [pytest.param(c, id=" ".join(c), marks=() if i == 0 else pytest.mark.slow)
             for i, c in enumerate(CASES)]


@pytest.mark.parametrize("args", ALL_CASES)
def test_fold_on_and_off_give_the_same_findings_counts_and_coverage(tmp_path, args):
    full = traced_serve(tmp_path / "off", ["--fold", "0"], *args)
    folded = traced_serve(tmp_path / "on", [], *args)

    assert finding_keys(tmp_path / "off") == finding_keys(tmp_path / "on")
    end_off, end_on = full[-1], folded[-1]
    assert end_on["k"] == "process.end" and end_on["fold_s"] == 10.0
    assert "folded" not in end_off
    assert without_steady(end_on["counts"]) == end_off["counts"]
    assert end_on["replays"] == end_off["replays"]
    # every record the program made is written, sampled or folded
    written: dict[str, int] = {}
    for rec in folded[1:-1]:
        written[rec["k"]] = written.get(rec["k"], 0) + 1
    for kind, n in end_on["counts"].items():
        assert (written.get(kind, 0) + end_on["sampled"].get(kind, 0)
                + end_on["folded"].get(kind, 0)) == n, kind
    steady = [r for r in folded if r["k"] == "steady"]
    assert steady, "a steady decode loop folds"
    assert end_on["folded"] and len(folded) < len(full)
    cov_off = analyze(open_trace(tmp_path / "off")).coverage
    cov_on = analyze(open_trace(tmp_path / "on")).coverage
    assert without_steady(cov_on.records) == cov_off.records
    assert cov_on.blind == cov_off.blind and cov_on.reasons == cov_off.reasons
    for r in steady:    # the replays a fold stands for are the exact n range
        if r["gid"] is not None:
            assert r["n_last"] - r["n_first"] + 1 == r["replays"]


@pytest.mark.parametrize("args", [
    pytest.param(CASES[0], id="full legacy"),
    pytest.param(CASES[3], id="breakable legacy", marks=pytest.mark.slow),
    pytest.param(CASES[5], id="eager device", marks=pytest.mark.slow)])
def test_the_same_trace_folded_gives_the_same_report_field_by_field(tmp_path, args):
    rows = traced_serve(tmp_path / "off", ["--fold", "0"], *args)
    (tmp_path / "on").mkdir()
    name = next((tmp_path / "off").glob("p*.jsonl")).name
    refolded = fold.refold(rows, interval_s=0.5)
    assert sum(r["k"] == "steady" for r in refolded) >= 1
    (tmp_path / "on" / name).write_text("".join(json.dumps(r) + "\n" for r in refolded))
    reports = [comparable(report_dict(str(tmp_path / d), analyze(open_trace(tmp_path / d))))
               for d in ("off", "on")]
    for key in reports[0]:
        assert reports[0][key] == reports[1][key], key


def test_a_malformed_steady_record_is_reported_with_file_and_line(tmp_path):
    rows = traced_serve(tmp_path / "t", [], "--policy", "legacy")
    path = next((tmp_path / "t").glob("p*.jsonl"))
    lines = path.read_text().splitlines()
    index = next(i for i, r in enumerate(rows) if r["k"] == "steady")
    bad = dict(rows[index], steps=-1)
    lines[index] = json.dumps(bad)
    path.write_text("\n".join(lines) + "\n")
    trace = open_trace(tmp_path / "t")
    result = analyze(trace)
    problems = [str(p) for p in result.model.problems]
    assert any(f"{path.name}:{index + 1}: malformed steady record" in p for p in problems), \
        problems
    assert [f.id for f in result.findings] == ["MLT001"]   # the rest of the trace is read


def test_max_mb_0_keeps_captures_changes_folds_and_says_what_it_left_out(tmp_path):
    cmd = [sys.executable, "-m", "mlatrace", "run", "--max-mb", "0", "--out",
           str(tmp_path / "cap"), "--", sys.executable, "-m", "mlatrace.reference.serve",
           *SERVE, "--policy", "legacy"]
    done = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--max-mb 0" in done.stderr
    path = next((tmp_path / "cap").glob("p*.jsonl"))
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    end = rows[-1]
    assert end["k"] == "process.end" and end["cap"]["reached"]
    left = end["cap"]["left_out"]
    assert left and all(kind not in left for kind in ("graph.capture.begin", "steady"))
    assert {r["k"] for r in rows} & set(left) == set()
    assert [f.id for f in analyze(open_trace(tmp_path / "cap")).findings] == ["MLT001"]
    text = subprocess.run([sys.executable, "-m", "mlatrace", "report", str(tmp_path / "cap")],
                          env=_env(), capture_output=True, text=True).stdout
    assert "size cap of 0.0 MB reached" in text


def test_a_process_killed_inside_a_fold_is_said_to_have_lost_its_last_interval(tmp_path):
    out = tmp_path / "killed"
    cmd = [sys.executable, "-m", "mlatrace", "run", "--fold", "3600", "--out", str(out), "--",
           sys.executable, "-m", "mlatrace.reference.serve", *SERVE[:4], "--steps", "100000",
           *SERVE[6:], "--policy", "device", "--step-delay", "0.01"]
    child = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        files: list[Path] = []
        while time.monotonic() < deadline:   # until replays were written and folding began
            files = list(out.glob("p*.jsonl"))
            if files and files[0].read_text().count('"graph.replay"') >= 2:
                time.sleep(1.0)
                break
            time.sleep(0.2)
        assert files, "the traced program never wrote its file"
        os.kill(int(files[0].name[1:].split(".")[0]), signal.SIGKILL)   # the program itself
    finally:
        child.wait(60)
    (path,) = out.glob("p*.jsonl")
    text = path.read_text()
    assert '"steady"' not in text and '"process.end"' not in text
    report = subprocess.run([sys.executable, "-m", "mlatrace", "report", str(out)],
                            env=_env(), capture_output=True, text=True).stdout
    assert "steady steps are folded" in report and "3600 s interval" in report


def test_a_pointer_change_inside_steady_steps_ends_the_fold_and_is_found(tmp_path):
    """A buffer that moves for one step (MLT003) is written in full between two folds,
    and the folded trace gives the same findings as the unfolded one."""
    rows = traced_serve(tmp_path / "off", ["--fold", "0"], "--policy", "device")
    path = next((tmp_path / "off").glob("p*.jsonl"))
    metadata = [i for i, r in enumerate(rows) if r["k"] == "attn.metadata"
                and not r.get("capturing") and not r.get("dummy")]
    moved = metadata[len(metadata) // 2]
    rows[moved]["ptrs"] = {**rows[moved]["ptrs"], "seq_info": 4096}
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    refolded = fold.refold([dict(r) for r in rows], interval_s=60.0)
    (tmp_path / "on").mkdir()
    (tmp_path / "on" / path.name).write_text("".join(json.dumps(r) + "\n" for r in refolded))

    assert "MLT003" in {f[0] for f in finding_keys(tmp_path / "off")}
    assert finding_keys(tmp_path / "on") == finding_keys(tmp_path / "off")
    kinds = [r["k"] for r in refolded]
    written = next(i for i, r in enumerate(refolded) if r.get("ptrs", {}).get("seq_info") == 4096)
    assert "steady" in kinds[:written] and "steady" in kinds[written:]
    assert refolded[written]["k"] == "attn.metadata"


def test_a_full_disk_says_so_once_and_never_stops_the_program(tmp_path, capfd):
    from mlatrace import record

    recorder = record.Recorder(str(tmp_path), fold_s=10.0)
    recorder.started()
    real_fd = recorder._fd
    recorder._fd = os.open("/dev/full", os.O_WRONLY)   # every write: ENOSPC
    try:
        recorder.add("mark", {"name": "a", "attrs": {}})
        recorder.flush()
        recorder.add("mark", {"name": "b", "attrs": {}})   # tracing stopped: a no-op
        recorder.flush()
        recorder.close()
    finally:
        os.close(real_fd)
    err = capfd.readouterr().err
    assert err.count("cannot write") == 1 and "tracing stopped, the program goes on" in err
    assert "No space left" in recorder.write_error and not recorder.enabled


def _recorded(tmp_path: Path, name: str, records: list, fold_s: float) -> list[dict]:
    """The records of `records` as a Recorder (folding after fold_s, 0: off) writes them."""
    from mlatrace import record

    recorder = record.Recorder(str(tmp_path / name), fold_s=fold_s)
    recorder.started()
    for kind, fields in records:
        recorder.add(kind, dict(fields))
    recorder.close()
    (path,) = (tmp_path / name).glob("p*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_marks_and_syncs_on_an_idle_or_folding_thread_write_what_take_writes(tmp_path):
    """Recorder.add's short path for a kind the fold never holds on an idle thread
    (a mark, a sync, with nothing held or folding) writes what Folder.take writes: the
    recorder folding as it goes and refold() of the same records written unfolded give
    the same records in the same order, folds included."""
    steps = [[("dispatch", {"mode": "FULL", "key": "b4", "num_tokens": 4}),
              ("graph.replay", {"gid": 1, "n": n})] for n in range(1, 19)]
    sync = ("sync", {"op": "item", "capturing": False, "site": "engine.py:9"})
    records: list = [("mark", {"name": "start", "attrs": {}}), sync,
                     ("mark", {"name": "idle", "attrs": {"n": 1}})]
    for n, step in enumerate(steps):
        if n in (7, 8):     # inside the step learnt after the break, then a held one
            records += [step[0], ("mark", {"name": f"in step {n}", "attrs": {}}), step[1]]
            continue
        records += step
        if n == 5:
            records += [("mark", {"name": "mid-fold", "attrs": {}}), sync,
                        ("mark", {"name": "after the break", "attrs": {}})]
    records += [sync, ("mark", {"name": "end", "attrs": {}})]

    def comparable(rows: list[dict]) -> list[tuple]:
        return [(r["k"], {k: v for k, v in r.items()
                          if k not in ("t", "seq", "tid", "t_first", "t_last", "dur_ns", "k")})
                for r in rows if r["k"] not in ("process", "process.end")]

    folded = _recorded(tmp_path, "on", records, 3600.0)
    unfolded = _recorded(tmp_path, "off", records, 0)
    assert [r["k"] for r in folded].count("steady") >= 2
    assert comparable(folded) == comparable(fold.refold(unfolded, interval_s=3600.0))


def _folder_run(steps: list[list[tuple[str, dict]]]) -> tuple[list, dict]:
    """Feed steps of (kind, fields) to a Folder; what it wrote (in full or folded) and
    what it counted as folded."""
    from mlatrace.record import fold

    written: list = []
    folded: dict = {}

    def count(kind: str, n: int) -> None:
        folded[kind] = folded.get(kind, 0) + n

    folder = fold.Folder(3600.0, lambda kind, fields, tid: written.append((kind, fields)),
                         count)
    t = 0
    for step in steps:
        for kind, fields in step:
            t += 1
            fields = dict(fields, t=t)
            if not folder.take(kind, fields, t, 1):
                written.append((kind, fields))
    folder.close_all()
    return written, folded


def _replay_step(n: int, gids: tuple = (1, 2, 3)) -> list:
    return [("dispatch", {"key": "b4", "mode": "FULL"}),
            *[("graph.replay", {"gid": gid, "n": n}) for gid in gids]]


def test_held_replays_fold_and_a_new_gid_among_them_ends_the_fold():
    steps = [_replay_step(n) for n in range(1, 11)]
    written, folded = _folder_run(steps)
    kinds = [kind for kind, _ in written]
    # the first step and the last (held when the process ends) in full, steps 2-9 folded
    assert kinds.count("graph.replay") == 6 and kinds.count("steady") == 3
    assert folded == {"dispatch": 8, "graph.replay": 24}
    steady = [fields for kind, fields in written if kind == "steady"]
    assert [(s["gid"], s["n_first"], s["n_last"], s["replays"]) for s in steady] == \
        [(1, 2, 9, 8), (2, 2, 9, 8), (3, 2, 9, 8)]

    # the 7th step replays graph 4 in the place of graph 2: the fold ends there, the
    # changed step is written in full, and the replay of graph 4 is in it
    changed = steps[:6] + [_replay_step(7, (1, 4, 3))] + steps[7:]
    written, folded = _folder_run(changed)
    replays = [fields["gid"] for kind, fields in written if kind == "graph.replay"]
    # in full: the first step, the changed one, the one after it, the last (held)
    assert replays == [1, 2, 3, 1, 4, 3, 1, 2, 3, 1, 2, 3]
    assert folded["graph.replay"] == 3 * (5 + 1)   # steps 2-6, then 9
    assert sum(1 for kind, _ in written if kind == "steady") == 6


def test_a_replay_with_more_fields_or_while_capturing_is_never_held():
    for extra in ({"capturing": True}, {"stream": 7}):
        steps = [_replay_step(n) for n in range(1, 6)]
        steps[3] = [steps[3][0], ("graph.replay", {"gid": 1, "n": 4, **extra}), *steps[3][2:]]
        written, _ = _folder_run(steps)
        assert any(kind == "graph.replay" and extra.items() <= fields.items()
                   for kind, fields in written)


def _call_step(n: int, ptr: int = 7) -> list:
    return [("attn.metadata", {"backend": "ref", "seq_len_max": 100 + n, "repeat": 1,
                               "ptrs": {"seq_info": ptr}}),
            ("attn.call", {"op": "fwd", "layer": 0, "hints": {"min_kv_seq_len": 100 + n},
                           "shapes": {"q": [4, 16, 512]}, "dtype": "torch.bfloat16",
                           "repeat": 1}),
            ("graph.replay", {"gid": 1, "n": n})]


def test_same_gives_what_split_gives_or_leaves_it_to_split():
    """fold.same (a held step's records compared with the template's as they came) agrees
    with split wherever it answers: the moving numbers when the keys are equal, None
    when they differ."""
    first = _call_step(1)[1][1]
    snapshot = ("attn.call", list(first.items()))
    for other, equal in [(_call_step(5)[1][1], True),
                         (dict(first, layer=1), False),
                         (dict(first, shapes={"q": [4, 16, 256]}), False),
                         (dict(first, dtype=None), False),
                         (dict(first, hints={"min_kv_seq_len": "x"}), False),
                         (dict(first, repeat=True), False)]:
        ranged = fold.same("attn.call", other, snapshot)
        key, split_ranged = fold.split("attn.call", other)
        assert (key == fold.split("attn.call", first)[0]) is equal
        assert ranged == (split_ranged if equal else None)


def _inline_hold(folder: Any, clock: list) -> Any:
    """Folder.hold as a generated probe runs it (fold_inline.hold_lines, compiled here as
    keyed_lines splices it in), on thread 1, t from `clock`."""
    from mlatrace import kinds
    from mlatrace.record import fold_inline

    programs = {}
    for marks_step in (False, True):
        source = ("def hold(kind, last, moving):\n"
                  + "".join(f"    {line}\n" for line in fold_inline.hold_lines(marks_step,
                                                                              "return True"))
                  + "    return False\n")
        namespace = {"folder": folder, "recorder": type("R", (), {"t0": 0})(),
                     "clock": lambda: clock[0], "thread_id": lambda: 1,
                     "step_kinds": kinds.STEP}
        exec(source, namespace)  # noqa: S102
        programs[marks_step] = namespace["hold"]

    def hold(kind: str, key: Any, base: dict, moving: dict, t: int, tid: int) -> bool:
        assert tid == 1 and fold_inline.holds(kind)
        clock[0] = t
        return programs[kind in kinds.STEP](kind, (None, key, base), moving)

    return hold


@pytest.mark.parametrize("path", ["Folder.hold", "inline"])
def test_a_record_held_without_being_built_is_written_in_full_when_its_step_breaks(path):
    """Folder.hold, and its steps as a generated probe runs them in its own frame
    (fold_inline): a probe's call that repeats its last record but for the numbers the
    fold keeps in ranges joins the held step unbuilt; a change later in the step writes
    it in full (the last record's fields, its own numbers and time), as take() would."""
    written: list = []
    folder = fold.Folder(3600.0, lambda kind, fields, tid: written.append((kind, dict(fields))),
                         lambda kind, n: None)
    hold = folder.hold if path == "Folder.hold" else _inline_hold(folder, [0])
    t = 0
    last: dict = {}

    def take(kind: str, fields: dict) -> None:
        nonlocal t
        t += 1
        fields = dict(fields, t=t)
        if not folder.take(kind, fields, t, 1):
            written.append((kind, dict(fields)))
        last[kind] = (folder.key_of_last(1, fields), fields)

    for n in (1, 2, 3):                     # learnt, then held: a fold opens
        for kind, fields in _call_step(n):
            take(kind, fields)
    assert [kind for kind, _ in written] == ["attn.metadata", "attn.call", "graph.replay"]
    for kind, fields in _call_step(4)[:2]:  # step 4: both records held without being built
        t += 1
        key, base = last[kind]
        moving = {name: value for name, value in fold.split(kind, fields)[1].items()}
        assert hold(kind, key, base, moving, t, 1)
    take("graph.replay", {"gid": 2, "n": 1})    # a new graph: the step breaks
    held = [(kind, fields) for kind, fields in written[3:] if kind != "steady"]
    assert held[0] == ("attn.metadata", {**_call_step(4)[0][1], "t": held[0][1]["t"]})
    assert held[1] == ("attn.call", {**_call_step(4)[1][1], "t": held[1][1]["t"]})
    assert held[2][0] == "graph.replay" and held[2][1]["gid"] == 2


def _timed_mlt008_rows(tmp_path: Path, steps: int) -> list[dict]:
    """A synthetic FULL wrapper capture (gid 1) around a torch graph (gid 2) that froze an
    attention kernel at one CTA, replayed `steps` times at growing lengths, each torch
    replay timed (graph.replay.time, before its replay record, as the host timer writes
    it): MLT008, with its costs read from the replay times."""
    from synth import SynthProcess

    p = SynthProcess(tmp_path / "synth", 101, argv=["python", "engine.py"])
    p.emit("device", index=0, name="NVIDIA H200", arch="sm_90", sms=132)
    p.emit("graph.capture.begin", gid=1, parent=None, src="vllm", key="FULL(num_tokens=1)",
           mode="FULL", device=0)
    p.emit("graph.capture.begin", gid=2, parent=1, src="torch", key=None, mode=None, device=0)
    p.emit("attn.call", op="decode_attention_fwd", backend="x", capturing=True, gid=2,
           hints={}, ptrs={})
    p.emit("kernel.launch", name="_fwd_grouped_kernel", grid=[1, 1, 1], const={},
           capturing=True, gid=2)
    p.emit("graph.capture.end", gid=2, segments=1, eager_breaks=0, dur_ns=1000)
    p.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=2000)
    p.emit("graph.nodes", gid=2, kernels=[{"name": "_fwd_grouped_kernel", "grid": [1, 1, 1],
                                           "block": [128, 1, 1], "smem": 0}], dump_ns=1000)
    for i in range(1, steps + 1):
        p.emit("dispatch", mode="FULL", key="FULL(num_tokens=1)", num_tokens=1)
        p.emit("attn.metadata", backend="x", num_reqs=1, seq_len_min=1000 + 50 * i,
               seq_len_max=1000 + 50 * i, seq_len_sum=1000 + 50 * i, capturing=False, ptrs={})
        p.emit("graph.replay.time", gid=2, n=i, gpu_ns=90_000 + 7_000 * i + 300 * (i % 5),
               via="cuda-event")
        p.emit("graph.replay", gid=2, n=i)
        p.emit("graph.replay", gid=1, n=i)
    p.write()
    (path,) = (tmp_path / "synth").glob("p*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


def _report_of(tmp_path: Path, name: str, rows: list[dict]) -> tuple[dict, Any]:
    (tmp_path / name).mkdir()
    (tmp_path / name / "p101.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = analyze(open_trace(tmp_path / name))
    return comparable(report_dict(str(tmp_path / name), result)), result


@pytest.mark.parametrize("max_times", [fold.MAX_TIMES, 4])
def test_replay_times_held_in_folds_give_the_same_mlt008_and_costs(tmp_path, monkeypatch,
                                                                    max_times):
    """Timed replays inside a fold write no record of their own: the fold holds them
    (the `times` of its first steady record, written when it closes; a fold closes when
    a graph holds MAX_TIMES of them) and the report, MLT008 and its cost are those of
    the unfolded trace, the wrapper's time (the sum of its torch replays') included."""
    monkeypatch.setattr(fold, "MAX_TIMES", max_times)
    rows = _timed_mlt008_rows(tmp_path, 60)
    refolded = fold.refold([dict(r) for r in rows], interval_s=3600)
    (tmp_path / "synth" / "p101.jsonl").unlink()
    kinds = [r["k"] for r in refolded]
    steady = [r for r in refolded if r["k"] == "steady"]
    held = sum(len(v) for r in steady for v in r.get("times", {}).values())
    # only the times of steps before the first fold opened are written as records
    assert kinds.count("graph.replay.time") + held == 60 and held >= 50
    if max_times == 4:
        assert len({r["fold"] for r in steady}) >= held // 4
        assert all(len(v) <= 4 for r in steady for v in r.get("times", {}).values())
    off, off_result = _report_of(tmp_path, "off", rows)
    on, on_result = _report_of(tmp_path, "on", refolded)
    for key in off:
        assert off[key] == on[key], key
    (f_off,), (f_on,) = off_result.findings, on_result.findings
    assert f_off.id == f_on.id == "MLT008"
    assert (f_off.message, f_off.details, f_off.cost) == (f_on.message, f_on.details, f_on.cost)
    assert f_on.cost["timed"] == 60
    wrapper = {g["gid"]: g for g in on["graphs"]}[1]["replays"]
    assert wrapper["gpu_ns"]["samples"] == 60     # the torch replays' times, summed per n
    coverage = [r.coverage.records for r in (off_result, on_result)]
    assert without_steady(coverage[1]) == coverage[0]


def test_replay_times_folded_give_the_same_cost_and_whatif_cases(tmp_path):
    """A real traced run (CPU host graphs, every replay timed): the unfolded trace and
    the same trace folded give the same MLT001 cost and the same whatif cases."""
    from mlatrace.output import whatif

    rows = traced_serve(tmp_path / "off", ["--fold", "0", "--replay-timing", "1:1"],
                        "--policy", "legacy")
    refolded = fold.refold(rows, interval_s=0.5)
    assert any(r.get("times") for r in refolded if r["k"] == "steady")
    (tmp_path / "on").mkdir()
    name = next((tmp_path / "off").glob("p*.jsonl")).name
    (tmp_path / "on" / name).write_text("".join(json.dumps(r) + "\n" for r in refolded))
    results = [analyze(open_trace(tmp_path / d)) for d in ("off", "on")]
    costs = [[(f.id, f.cost) for f in r.findings] for r in results]
    assert costs[0] == costs[1] and ("MLT001", costs[0][0][1]) in costs[0]
    assert costs[0][0][1]["timed"] == costs[0][0][1]["replays"]
    cases = [[dataclasses.asdict(c) for c in whatif.cases(r.model, r.findings)] for r in results]
    assert cases[0] == cases[1] and cases[0]


def _dispatch_step(n: int, mode: str = "FULL") -> list:
    return [("dispatch", {"mode": mode, "key": {"num_tokens": 4}, "num_tokens": 1 + n % 3,
                          "uniform": True, "num_reqs": 1 + n % 2}),
            ("graph.replay", {"gid": 1, "n": n}), ("graph.replay", {"gid": 2, "n": n})]


@pytest.mark.parametrize("path", ["Folder.hold", "inline"])
def test_a_dispatch_held_with_hold_and_replays_held_by_replay_write_what_take_writes(path):
    """A handler's dispatch held without its record (Folder.hold with the numbers split
    gives it, or its steps in a generated probe's frame) and replays held by
    Folder.replay (Recorder.add_replay's path) give the records, folds and counts that
    take() of every record gives, a change included."""
    steps = [_dispatch_step(n) for n in range(1, 30)]
    steps[17] = _dispatch_step(18, "PIECEWISE")      # a change: the fold breaks there
    expected = _folder_run(steps)

    written: list = []
    folded: dict = {}
    folder = fold.Folder(3600.0, lambda kind, fields, tid: written.append((kind, fields)),
                         lambda kind, n: folded.__setitem__(kind, folded.get(kind, 0) + n))
    hold = folder.hold if path == "Folder.hold" else _inline_hold(folder, [0])
    t, last, held = 0, None, 0
    for step in steps:
        for kind, fields in step:
            t += 1
            if kind == "graph.replay":
                assert not folder.hold(kind, ("graph.replay", fields["gid"]), fields,
                                       {}, t, 1)      # replays: not through hold
                if folder.replay(fields["gid"], fields["n"], t, 1):
                    held += 1
                    continue
            elif last is not None and {k: v for k, v in last[1].items() if k != "t"} | {
                    "num_tokens": 0, "num_reqs": 0} == fields | {"num_tokens": 0, "num_reqs": 0}:
                moving = {"num_tokens": fields["num_tokens"], "num_reqs": fields["num_reqs"]}
                if hold(kind, last[0], last[1], moving, t, 1):
                    held += 1
                    continue
            fields = dict(fields, t=t)
            if not folder.take(kind, fields, t, 1):
                written.append((kind, fields))
            if kind == "dispatch":
                key = folder.key_of_last(1, fields)
                last = None if key is None else (key, fields)
    folder.close_all()
    assert held > 40
    assert (written, folded) == expected
