"""What a new user trips on (issue 39, items 1-12): each test runs the real command."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import MLATRACE, REPO, SAMPLES


def mlatrace(*args: object, timeout: int = 300, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*MLATRACE, *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, **kw)


# -- 7: a --probes pack that does not load is said at start-up --------------------------

def test_run_says_at_start_up_that_a_probes_pack_does_not_load(tmp_path: Path) -> None:
    bad = tmp_path / "badpack.toml"
    bad.write_text('[pack]\nname = "bad"\n\n[[probe]]\nname = "plan"\n'
                   'targets = ["shop:checkout"]\n')
    proc = mlatrace("run", "--out", tmp_path / "t", "--probes", bad, "--",
                    sys.executable, "-c", "print('hello')", timeout=120)
    assert proc.returncode == 0 and "hello" in proc.stdout
    said = [line for line in proc.stderr.splitlines() if "badpack.toml" in line]
    assert len(said) == 1, proc.stderr
    assert said[0].startswith("mlatrace run: --probes ") and "does not load" in said[0]
    assert f"{bad}:4" in said[0] and "needs a kind (or a handler)" in said[0]
    good = mlatrace("run", "--out", tmp_path / "t2", "--probes",
                    SAMPLES.parent / "probes" / "reference.toml", "--", sys.executable, "-c",
                    "pass", timeout=120)
    assert "--probes" not in good.stderr, good.stderr


# -- 8: merge --help says what --run does ------------------------------------------------

def test_merge_help_says_run_is_needed_for_several_runs() -> None:
    proc = mlatrace("merge", "--help")
    text = " ".join(proc.stdout.split())
    assert "default: the newest" not in text
    assert "required when DIRS hold several runs" in text


# -- CPU runs of the reference engine: host-timed replays of a CPU host graph -----------

@pytest.fixture(scope="module")
def cpu_runs(tmp_path_factory) -> dict[str, Path]:
    """legacy (MLT001) and device policy, every few replays timed by the host clock."""
    root = tmp_path_factory.mktemp("cpu")
    runs = {}
    for policy in ("legacy", "device"):
        out = root / policy
        done = mlatrace("run", "--out", out, "--replay-timing", "2:3", "--", sys.executable,
                        "-m", "mlatrace.reference.serve", "--device", "cpu", "--ctx", "512",
                        "--steps", "7", "--layers", "1", "--policy", policy)
        assert done.returncode == 0, done.stderr[-2000:]
        runs[policy] = out
    return runs


def html_of(tmp_path: Path, trace: Path) -> str:
    out = tmp_path / f"{trace.name}.html"
    done = mlatrace("report", trace, "--html", out)
    assert done.returncode == 0, done.stderr
    return out.read_text()


# -- 3: host-timed replays are never called GPU time ------------------------------------

def test_host_timed_replays_are_not_labelled_gpu(tmp_path: Path, cpu_runs) -> None:
    page = html_of(tmp_path, cpu_runs["legacy"])
    assert "host time (CPU host graph) per replay p50 / p90 / max" in page
    assert "replay host time (CPU host graph) distribution" in page
    assert "GPU time" not in page and "GPU per replay" not in page
    diff = mlatrace("diff", cpu_runs["legacy"], cpu_runs["device"], env=dict(
        os.environ, COLUMNS="200"))
    assert diff.returncode == 0, diff.stderr
    assert "replay host time (CPU host graph) p50" in diff.stdout
    assert "gpu p50" not in diff.stdout and " ns " not in diff.stdout
    changes = [c for g in json.loads(mlatrace("diff", "--json", cpu_runs["legacy"],
                                              cpu_runs["device"]).stdout)["graphs"]
               for c in g["changes"] if c["field"] == "gpu p50 ns"]
    assert changes and changes[0]["clock"] == ["host", "host"]


def test_gpu_timed_replays_keep_their_gpu_label(tmp_path: Path) -> None:
    page = html_of(tmp_path, SAMPLES / "gpu_serve_legacy_timed")
    assert "GPU time per replay p50 / p90 / max" in page
    assert "host time (CPU host graph)" not in page


# -- 4: one definition of the replay length range ----------------------------------------

def test_replay_length_range_is_the_same_in_table_caption_and_text(tmp_path: Path) -> None:
    trace = SAMPLES / "gpu_serve_legacy_timed"
    page = html_of(tmp_path, trace)
    row = re.search(r"<td>replay length min\.\.max \(seq_len_max before each replay\)</td>"
                    r"<td>(\d+)\.\.(\d+)</td>", page)
    caption = re.search(r'frozen-headline">captured at seq_len_max \d+, replayed at '
                        r"(\d+)\.\.(\d+)", page)
    text = mlatrace("report", trace, env=dict(os.environ, COLUMNS="200")).stdout
    spark = re.search(r"replayed .* (\d+)\.\.(\d+) \(", text)
    assert row and caption and spark, (bool(row), bool(caption), text[-800:])
    assert row.groups() == caption.groups() == spark.groups() == ("32768", "32831")
    assert "seq_len (min..max before replays)" not in page


# -- 10: nesting explained only where the trace nests, with its own numbers -------------

def test_nesting_note_tells_the_traces_own_nesting(tmp_path: Path) -> None:
    wide = dict(os.environ, COLUMNS="250")
    flat = mlatrace("report", SAMPLES / "capture_triton", env=wide).stdout
    assert "encloses" not in flat and "nested)" not in flat
    one = mlatrace("report", "-v", SAMPLES / "gpu_serve_legacy_timed", env=wide).stdout
    assert "(gid 1>2: capture unit 1 (reference FULL) encloses the graph 2 it captured" in one
    assert "vLLM's wrapper" not in one and "2 to 4" not in one
    assert "graph.capture.begin 2 (1 capture unit, 1 nested)" in one
    assert "capture of gid 2 begins" not in one
    assert "capture of gid 1 begins (the split froze in gid 2, captured inside it)" in one
    assert "graph.capture.begin</td><td class=\"num\">2 (1 capture unit, 1 nested)" in \
        html_of(tmp_path, SAMPLES / "gpu_serve_legacy_timed")
    many = mlatrace("report", SAMPLES / "gpu_serve_bucketed_breakable", env=wide).stdout
    assert ("gid 1>2-6: capture unit 1 (reference FULL, a breakable capture with 4 eager "
            "breaks) encloses the graphs 2-6 it captured") in many


# -- 1: check DIR --html on a collection shows every run ---------------------------------

def test_check_html_of_a_collection_shows_every_run(tmp_path: Path) -> None:
    from test_html_report import CHROMIUM, chromium

    root = tmp_path / "runs"
    for name in ("gpu_serve_legacy", "gpu_serve_device", "gpu_serve_bucketed_breakable"):
        shutil.copytree(SAMPLES / name, root / name)
    page = tmp_path / "ci.html"
    done = mlatrace("check", root, "--html", page)
    assert done.returncode == 1, done.stderr
    verdicts = dict(re.findall(r"^run (\S+): (\w+) \(exit \d\)$", done.stdout, re.M))
    assert len(verdicts) == 3 and sorted(verdicts.values()) == ["FAILED", "OK", "OK"]
    html = page.read_text()
    assert 'id="verdict" class="verdict v-fail" data-exit="1"' in html
    assert "collection of 3 runs, exit 1" in html
    sections = re.findall(r'<section class="run" id="run-\d" data-run="([^"]+)" '
                          r'data-exit="(\d)">(.*?)(?=<section class="run"|<footer)', html, re.S)
    assert {run: int(code) for run, code, _ in sections} == {
        run: 1 if v == "FAILED" else 0 for run, v in verdicts.items()}
    for run, code, body in sections:
        assert f"run {run} " in body and 'class="verdict' in body   # named, with its verdict
        assert 'data-id="MLT004"' in body                            # and its findings
        assert ('data-id="MLT001"' in body) is (code == "1")
    ids = re.findall(r'(?<![\w-])id="([^"]+)"', html)
    assert len(ids) == len(set(ids)), "an id twice: links would jump to another run"
    if CHROMIUM:
        dom = chromium(tmp_path, page, "--dump-dom")
        assert 'data-loaded="1"' in dom and 'data-errors="0"' in dom
        assert dom.count('<section class="run"') == 3
        assert dom.count('<svg class="chart chart-lengths"') == 3


# -- 2: watch's "first seen" is when the evidence was recorded ---------------------------

def test_watch_once_dates_a_finding_by_its_evidence(cpu_runs) -> None:
    import time

    trace = cpu_runs["legacy"]
    run = json.loads((trace / "run.json").read_text())
    time.sleep(max(0.0, run["end_ns"] / 1e9 + 2 - time.time()))  # the watch comes later
    snap = json.loads(mlatrace("watch", "--once", "--json", trace).stdout)
    (finding,) = [f for f in snap["findings"] if f["id"] == "MLT001"]
    assert run["start_ns"] / 1e9 <= finding["first_seen"] <= run["end_ns"] / 1e9, (finding, run)
    text = mlatrace("watch", "--once", trace, env=dict(os.environ, COLUMNS="200")).stdout
    row = next(line for line in text.splitlines() if "MLT001" in line)
    after = re.search(r"\(\+(\d+)s\)", row)
    assert after and int(after.group(1)) <= (run["end_ns"] - run["start_ns"]) / 1e9 + 1, row


def test_record_at_finds_every_record_of_a_file(tmp_path: Path) -> None:
    from mlatrace.trace.seek import record_at

    path = tmp_path / "p1.jsonl"
    path.write_text("".join(json.dumps({"k": "x", "seq": i * 2, "t": i, "pad": "y" * (i % 300)})
                            + "\n" for i in range(5000)) + '{"k": "x", "seq": 10000, "t"')
    assert all(record_at(path, i * 2)["t"] == i for i in range(0, 5000, 7))
    assert record_at(path, 3) is None and record_at(path, 10000) is None
    assert record_at(tmp_path / "missing.jsonl", 0) is None


# -- 11: run --watch at 80x24 keeps severity and the graphs rows on the screen ------------

def _tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, timeout=30,
                          check=True).stdout


def _until(check, timeout_s: float = 180.0):  # noqa: ANN001, ANN202
    import time

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    raise AssertionError("timed out")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_run_watch_at_80x24_keeps_severity_and_graphs_on_screen(tmp_path: Path) -> None:
    out = tmp_path / "trace"      # fits a line, not after the words before it
    session = f"mlatrace-h39-{os.getpid()}"
    script = tmp_path / "w.sh"
    script.write_text(
        f"cd {tmp_path}\nexport PYTHONPATH={REPO} PYTHONUNBUFFERED=1\n"
        f"{sys.executable} -m mlatrace run --watch --out {out} -- {sys.executable} -m "
        "mlatrace.reference.serve --policy legacy --graph full --device cpu --ctx 2048 "
        "--batch 1 --layers 1 --steps 60 --step-delay 0.2\necho RUN-EXIT $?\nsleep 60\n")
    _tmux("new-session", "-d", "-s", session, "-x", "80", "-y", "24", f"bash {script}")
    try:
        _tmux("set-option", "-t", session, "window-size", "manual")
        _tmux("resize-window", "-t", session, "-x", "80", "-y", "24")

        def screen() -> str:   # what is on the 24 lines now
            return _tmux("capture-pane", "-p", "-t", session)

        def showing() -> str | None:
            s = screen()
            return s if "MLT001" in s and "1>2" in s and "running for" in s else None

        def ended() -> str | None:
            s = _tmux("capture-pane", "-p", "-t", session, "-S", "-")
            return s if "RUN-EXIT" in s else None

        live = _until(showing)
        lines = live.splitlines()
        assert len(lines) <= 24
        assert "severity" in live and "not shown at 80 columns: severity" not in live, live
        assert re.search(r"MLT001\s+│\s+error", live), live
        assert "pid " in next(line for line in lines if "1>2" in line)  # the graphs row
        done = _until(ended)
        assert "RUN-EXIT 0" in done, done[-2000:]
        tail = done[done.index("exited with code 0"):].splitlines()
        assert f"  {out}" in tail, done[-1500:]        # where the trace is: one piece
        assert f"  {out}" in tail[2:] or f"  mlatrace report {out}" in tail, done[-1500:]
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, timeout=30)


# -- 12: run --watch's view does not stall for a fold interval ---------------------------

@pytest.mark.slow
def test_run_watch_view_sees_steady_replays_while_the_run_goes_on(tmp_path: Path) -> None:
    import time

    from mlatrace.output.watch import LiveRun

    out = tmp_path / "trace"
    proc = subprocess.Popen(
        [*MLATRACE, "run", "--watch", "--out", str(out), "--", sys.executable, "-m",
         "mlatrace.reference.serve", "--policy", "legacy", "--graph", "full", "--device", "cpu",
         "--ctx", "2048", "--batch", "1", "--layers", "1", "--steps", "50", "--step-delay",
         "0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        _until(lambda: list(out.glob("p*.jsonl")), 120)
        live = LiveRun([out])
        seen: list[tuple[float, int]] = []     # (when, replays the view counts)
        while proc.poll() is None:
            live.poll()
            model = live.refresh().model
            seen.append((time.monotonic(), sum(g.replays.count for g in model.graphs.values()
                                               if g.parent is None)))
            time.sleep(0.25)
        assert proc.returncode == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    header = json.loads(next(out.glob("p*.jsonl")).open().readline())
    assert header["fold_s"] == 1.0          # run --watch folds every second
    steady = [json.loads(line) for line in next(out.glob("p*.jsonl")).open()
              if '"k":"steady"' in line.replace(" ", "")]
    assert len(steady) >= 3, "the steady stretch was not folded"
    moving = [(t, n) for t, n in seen if 0 < n]
    changes = [t for (t, n), (_t0, n0) in zip(moving[1:], moving, strict=False) if n != n0]
    assert len(changes) >= 5, seen
    gaps = [b - a for a, b in zip(changes, changes[1:], strict=False)]
    assert max(gaps) < 4.0, gaps            # never frozen for a 10 s fold


# -- 9: the charts: titled for their unit, notes that match the axes, even ticks ---------

def _charts(page: str) -> list[tuple[str, str, list[str], list[str], str]]:
    """(kind, title, x tick labels, y tick labels, note) of every chart of a page."""
    out = []
    for kind, body in re.findall(r'<svg class="chart chart-([\w-]+)"(.*?)</svg>', page, re.S):
        title = re.search(r'class="ctitle">([^<]*)<', body).group(1)
        xs = re.findall(r'<text x="[\d.]+" y="202" text-anchor="(?:middle|start|end)">([^<]*)<',
                        body)
        ys = re.findall(r'<text x="56" y="[\d.]+" text-anchor="end">([^<]*)<', body)
        notes = " ".join(re.findall(r'class="cnote">([^<]*)<', body))
        out.append((kind, title, xs, ys, notes))
    return out


def test_html_charts_read_right(tmp_path: Path) -> None:
    unit_kinds = {"lengths", "gpu-hist", "gpu-times"}   # a capture unit's charts (graph use
    # draws per process, titled by its file)
    legacy = [c for c in _charts(html_of(tmp_path, SAMPLES / "gpu_serve_legacy_timed"))
              if c[0] in unit_kinds]
    # the unit 1>2's charts are all titled for it, the torch graph that was timed named
    assert {c[1].split(":")[0] for c in legacy} == {"gid 1&gt;2"}, [c[1] for c in legacy]
    assert any("(timed on gid 2 inside it)" in c[1] for c in legacy if c[0] == "gpu-times")
    pages = [legacy] + [_charts(html_of(tmp_path, SAMPLES / "gpu_backends" / name))
                        for name in ("vllm_triton_mla_bucketed", "sglang_triton_device_splits",
                                     "vllm_triton_mla_frozen_one")]
    charts = [c for page in pages for c in page if c[0] in unit_kinds]
    assert {c[0] for c in charts} == unit_kinds
    for kind, title, xs, ys, note in charts:
        assert "time buckets of" not in note, note      # a slice of the axis, said so
        if kind != "gpu-hist" and "not downsampled" not in note:
            assert "slice of the time axis" in note, note
        if kind == "gpu-hist":                           # counts of replays: whole numbers
            assert ys and all(y.isdigit() for y in ys), (title, ys)
        if kind != "gpu-hist" or "log scale" not in " ".join([title, note]):
            decimals = {len(x.split()[0].rstrip("KMG").partition(".")[2]) for x in xs}
            assert len(decimals) == 1 and len(set(xs)) == len(xs), (title, xs)


# -- 5, 6: field paths that resolve to nothing are reported; kind and handler documented -

KV = '''class Attn:
    block_n = 64

    def plan(self, seq_len):
        return seq_len // self.block_n
'''
KV_PACK = '''[pack]
name = "kv"

[[probe]]
name = "plan"
targets = ["kv:Attn.plan"]
params = ["self", "seq_len"]
kind = "kv.plan"
when = "return"
[probe.fields]
block_n = "{path}"
seq_len = "args.seq_len"
splits = "result"
'''
CALLS = "import kv\na = kv.Attn()\nfor i in range(20): a.plan(100 + i)\n"


def _kv(tmp_path: Path, path: str) -> tuple[Path, dict[str, str]]:
    (tmp_path / "kv.py").write_text(KV)
    pack = tmp_path / f"kv-{len(path)}.toml"
    pack.write_text(KV_PACK.format(path=path))
    return pack, dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]),
                      COLUMNS="250")


def test_args_self_of_a_method_is_a_bad_field_for_doctor_and_run(tmp_path: Path) -> None:
    pack, env = _kv(tmp_path, "args.self.block_n")
    doctor = mlatrace("probes", "doctor", "--probes", pack, env=env, cwd=tmp_path)
    assert doctor.returncode == 1, doctor.stdout[-2000:]
    line = next(x for x in doctor.stdout.splitlines() if "kv:Attn.plan" in x and "BAD" in x)
    assert "BAD FIELD" in line and "args.self" in line and "self.<attr>" in line
    out = tmp_path / "t"
    run = mlatrace("run", "--out", out, "--probes", pack, "--", sys.executable, "-c", CALLS,
                   env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    check = mlatrace("check", out, env=env)
    assert check.returncode == 3 and "bad field path" in check.stdout, check.stdout


def test_a_field_null_on_every_call_is_a_probe_problem_in_the_coverage(tmp_path: Path) -> None:
    pack, env = _kv(tmp_path, "self.blokc_n")      # a typo: the attribute is block_n
    doctor = mlatrace("probes", "doctor", "--probes", pack, env=env, cwd=tmp_path)
    assert "BAD FIELD" not in doctor.stdout       # nothing doctor can tell without a call
    out = tmp_path / "t"
    assert mlatrace("run", "--out", out, "--probes", pack, "--", sys.executable, "-c", CALLS,
                    env=env, cwd=tmp_path).returncode == 0
    for command in ("report", "check"):
        text = mlatrace(command, out, env=env).stdout
        assert ("probe problem: kv.plan records: field(s) block_n null in all 20: their "
                "paths resolve to nothing") in text, text
        assert "seq_len" not in text.split("probe problem")[1].split("\n")[0]
    data = json.loads(mlatrace("report", "--json", out, env=env).stdout)
    assert any("block_n null in all 20" in n for n in data["coverage"]["notes"])


def test_probes_doc_has_the_path_language_and_says_when_a_handler_is_needed(
        tmp_path: Path) -> None:
    from mlatrace.probe.packs import PackError, load_pack
    from mlatrace.probe.pathlang.parser import FUNCS

    doc = (REPO / "docs" / "probes.md").read_text()
    paths = doc[doc.index("### Field paths"):]
    for func in FUNCS:
        assert f"`{func}(" in paths, func
    for root in ("`args.NAME`", "`self`", "`result`", "`A \\| B`"):
        assert root in paths, root
    assert "never `args.self`" in paths
    kinds = doc[doc.index("### `kind` and `handler`"):doc.index("### Field paths")]
    assert "Every probe needs a `kind` or a `handler`" in kinds
    assert "optionally a\nhandler" not in doc
    # what the page says holds: neither does not load, a kind alone records
    neither = tmp_path / "neither.toml"
    neither.write_text('[pack]\nname = "n"\n[[probe]]\nname = "plan"\ntargets = ["kv:f"]\n')
    with pytest.raises(PackError, match=r"needs a kind \(or a handler\)"):
        load_pack(neither)
    pack, env = _kv(tmp_path, "self.block_n")
    out = tmp_path / "t"
    assert mlatrace("run", "--out", out, "--probes", pack, "--", sys.executable, "-c", CALLS,
                    env=env, cwd=tmp_path).returncode == 0
    recs = [json.loads(x) for x in next(out.glob("p*.jsonl")).read_text().splitlines()]
    plans = [r for r in recs if r["k"] == "kv.plan"]
    assert len(plans) == 20 and all(r["block_n"] == 64 for r in plans)


@pytest.mark.slow
def test_a_watch_apart_from_the_run_says_how_often_folds_arrive(tmp_path: Path) -> None:
    import io

    from rich.console import Console

    from mlatrace.output.watch import LiveRun
    from mlatrace.output.watch.view import render

    out = tmp_path / "trace"
    proc = subprocess.Popen(
        [*MLATRACE, "run", "--out", str(out), "--", sys.executable, "-m",
         "mlatrace.reference.serve", "--policy", "legacy", "--graph", "full", "--device", "cpu",
         "--ctx", "2048", "--batch", "1", "--layers", "1", "--steps", "400", "--step-delay",
         "0.1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=dict(os.environ, PYTHONPATH=str(REPO)), start_new_session=True)
    try:
        live = LiveRun([out])

        def caption() -> str | None:
            live.poll()
            live.refresh()
            if not live.model.graphs:
                return None
            buf = io.StringIO()
            Console(file=buf, width=200).print(render(live, None, 200))
            return buf.getvalue()

        text = _until(caption, 120)
        assert "steady steps arrive folded, every 10 s" in text, text
    finally:
        import signal

        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(60)
