"""Captures never replayed and the memory they held: `pool_bytes` on graph.capture.end
(the caching allocator's reserved memory grown during the capture) and graph use's
memory-time of the captures no step replayed.

CPU: a synthetic trace for the analysis, and the shipped torch pack's capture probes on a
torch-shaped class (no CUDA: nothing recorded, CUDA never initialised; a stubbed
allocator: the growth recorded). GPU: three real torch captures, one replayed
(tests/progs/graph_pools.py).
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from synth import SynthProcess, write_run

torch = pytest.importorskip("torch")

from mlatrace.analysis import analyze  # noqa: E402
from mlatrace.output.report import report_dict  # noqa: E402
from mlatrace.output.report_graph_use import graph_use_lines  # noqa: E402
from mlatrace.probe import graph_data  # noqa: E402
from mlatrace.trace import open_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MIB, GIB = 1 << 20, 1 << 30


def _capture(proc: SynthProcess, gid: int, key: str | None, pool: int | None,
             shared: bool = False) -> int:
    """A vLLM-style wrapper capture keyed `key` around the torch capture that measured
    `pool` (a bare torch capture where `key` is None); returns the torch capture's end t."""
    torch_gid = gid + 1 if key is not None else gid
    if key is not None:
        proc.emit("graph.capture.begin", gid=gid, parent=None, src="vllm", key=key, mode="FULL")
    proc.emit("graph.capture.begin", gid=torch_gid, parent=gid if key is not None else None,
              src="torch", key=None, mode=None)
    extra = {} if pool is None else {"pool_bytes": pool, "pool_shared": shared}
    end_t = proc.t
    proc.emit("graph.capture.end", gid=torch_gid, segments=1, eager_breaks=0, dur_ns=1000,
              **extra)
    if key is not None:
        proc.emit("graph.capture.end", gid=gid, segments=1, eager_breaks=0, dur_ns=2000)
    return end_t


def test_captures_never_replayed_hold_their_pool_until_the_process_ends(tmp_path):
    root = tmp_path / "pools"
    write_run(root)
    serve = SynthProcess(root, 7000)
    _capture(serve, 1, "FULL(num_tokens=2)", 3 * GIB // 2)          # replayed below
    _capture(serve, 3, "FULL(num_tokens=1)", 0, shared=True)         # vLLM's shared pool
    bare_end = _capture(serve, 5, None, 512 * MIB)                   # a bare torch graph
    for _ in range(4):
        serve.emit("dispatch", mode="FULL", key="FULL(num_tokens=2)", num_tokens=2)
        serve.replay(1)
        serve.replay(2)
    serve.t = bare_end + 2400 * 10**9        # process.end 40 min after gid 5's capture
    serve.write()
    killed = SynthProcess(root, 7001)        # killed: its last record ends its time
    end = _capture(killed, 1, None, GIB)
    killed.t = end + 60 * 10**9
    killed.emit("mark", name="last words")
    killed.write(end=False)
    unmeasured = SynthProcess(root, 7002)    # a trace without pool_bytes (CPU, older)
    _capture(unmeasured, 1, None, None)
    unmeasured.write()

    view = report_dict(str(root), analyze(open_trace(root)))["graph_use"]
    by_pid = {p["pid"]: p for p in view["processes"]}
    serve_use = by_pid[7000]
    rows = {r["size"] if r["size"] is not None else r["captures"][0]["gid"]: r
            for r in serve_use["sizes"]}
    assert rows[2]["pool_bytes"] == 3 * GIB // 2 and rows[2]["captures"][0]["replays"] == 4
    assert rows[1]["pool_bytes"] == 0 and rows[5]["pool_bytes"] == 512 * MIB
    never = {n["gid"]: n for n in serve_use["never_replayed"]}
    assert set(never) == {3, 5}
    assert (never[3]["pool_bytes"], never[3]["pool_shared"], never[3]["gib_s"]) == (0, True, 0)
    assert never[5]["held_s"] == pytest.approx(2400, abs=1e-3)
    assert never[5]["gib_s"] == pytest.approx(0.5 * 2400, abs=1e-3)
    assert serve_use["pool_bytes"] == 2 * GIB
    assert serve_use["never_replayed_pool_bytes"] == 512 * MIB
    assert serve_use["never_replayed_gib_s"] == pytest.approx(1200, abs=1e-3)
    (gone,) = by_pid[7001]["never_replayed"]
    assert gone["held_s"] == pytest.approx(60, abs=1e-3) and gone["gib_s"] == pytest.approx(60)
    (blind,) = by_pid[7002]["never_replayed"]
    assert blind["pool_bytes"] is None and blind["gib_s"] is None
    assert by_pid[7002]["pool_bytes"] is None and by_pid[7002]["never_replayed_gib_s"] is None
    run = view["run"]
    assert run["pool_bytes"] == 3 * GIB and run["never_replayed_pool_bytes"] == 1536 * MIB
    assert run["never_replayed_gib_s"] == pytest.approx(1260, abs=1e-2)

    lines = graph_use_lines(view)
    assert ("    never replayed: gid 5 held 512 MiB for 40 min; gid 3 (key FULL(num_tokens=1)) "
            "added no memory (a shared pool) (512 MiB in all, 1200 GiB*s)") in lines
    assert "    never replayed: gid 1 held 1.0 GiB for 60 s (60 GiB*s)" in lines
    assert len([line for line in lines if "never replayed: " in line]) == 2   # not p7002's

    from mlatrace.output.html_graph_use import graph_use_section
    html = graph_use_section({"graph_use": view})
    assert "gid 5 (size -, 512 MiB for 40 min)" in html and "; 1200 GiB*s held in all" in html
    assert "<th>memory captured</th>" in html and '<td class="num">1.5 GiB</td>' in html


SHIPPED = ROOT / "probes" / "torch_cuda_graph.toml"
GRAPH_SOURCE = '''
class Graph:
    """torch.cuda.CUDAGraph's probed surface (the capture's allocations: `allocate`)."""

    allocate = None

    def __new__(cls, keep_graph=False):
        return super().__new__(cls)

    def capture_begin(self, pool=None, capture_error_mode="global"):
        pass

    def capture_end(self):
        if Graph.allocate is not None:
            Graph.allocate()

    def replay(self):
        pass
'''


@pytest.fixture
def torch_shaped(tmp_path, monkeypatch):
    """The shipped torch pack retargeted at a torch-shaped Graph class (node dump off)."""
    name = f"pool_target_{os.getpid()}_{len(list(tmp_path.iterdir()))}"
    (tmp_path / f"{name}.py").write_text(GRAPH_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MLATRACE_GRAPH_NODES", "0")
    pack = tmp_path / "pack.toml"
    pack.write_text(SHIPPED.read_text().replace("torch.cuda.graphs:CUDAGraph", f"{name}:Graph"))
    yield name, pack
    sys.modules.pop(name, None)


def _capture_twice(traced_with, name: str, pack: Path) -> list[dict]:
    graph_data.reset()
    records = traced_with([pack])
    mod = importlib.import_module(name)
    first, second = mod.Graph(), mod.Graph()
    first.capture_begin()
    first.capture_end()
    second.capture_begin(pool=("shared", 1))
    second.capture_end()
    rows = records()
    assert not [r for r in rows if r["k"] == "probe.error"], rows
    return [r for r in rows if r["k"] == "graph.capture.end"]


def test_without_cuda_the_capture_probe_records_no_pool_and_never_initialises_cuda(
        torch_shaped, traced_with, monkeypatch):
    assert not torch.cuda.is_initialized()
    inits: list[int] = []

    def lazy_init() -> None:
        inits.append(1)
        raise AssertionError("the probe initialised CUDA")

    monkeypatch.setattr(torch.cuda, "_lazy_init", lazy_init)
    ends = _capture_twice(traced_with, *torch_shaped)
    assert len(ends) == 2
    assert all("pool_bytes" not in e and "pool_shared" not in e for e in ends), ends
    assert inits == [] and not torch.cuda.is_initialized()


def test_with_cuda_the_capture_probe_records_the_reserved_memory_it_added(
        torch_shaped, traced_with, monkeypatch):
    """A stubbed initialised allocator: 20 MiB reserved while the first graph captures,
    none while the second (in a shared pool) does."""
    name, pack = torch_shaped
    reserved = {"bytes": 100 * MIB, "reads": 0}

    def memory_reserved(device=None) -> int:
        assert device == 0
        reserved["reads"] += 1
        return reserved["bytes"]

    grow = iter([20 * MIB, 0])

    def allocate() -> None:
        reserved["bytes"] += next(grow)

    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", memory_reserved)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(
        name="stub", major=9, minor=0, multi_processor_count=132))
    importlib.import_module(name).Graph.allocate = staticmethod(allocate)
    ends = _capture_twice(traced_with, name, pack)
    assert [(e["pool_bytes"], e["pool_shared"]) for e in ends] == [(20 * MIB, False), (0, True)]
    assert reserved["reads"] == 4     # before capture_begin and after capture_end, each


def _cuda() -> bool:
    return torch.cuda.is_available()


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))


@pytest.mark.gpu
@pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")
def test_two_real_captures_one_replayed_on_gpu(tmp_path):
    """tests/progs/graph_pools.py: graphs 1 and 2 in private pools (each reserves a
    segment for its 4-8 MiB tensors), graph 3 in graph 1's pool; graph 1 replayed 5 times;
    the process lives 1.5 s after. Graph use: 2 and 3 never replayed, 2 held its pool
    about 1.5 s."""
    out = tmp_path / "pools"
    run = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out), "--",
                          sys.executable, str(ROOT / "tests" / "progs" / "graph_pools.py"), "1.5"],
                         env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rows = [json.loads(line) for path in out.glob("p*.jsonl") for line in path.open()]
    assert not [r for r in rows if r["k"] == "probe.error"], [
        r for r in rows if r["k"] == "probe.error"]
    ends = {r["gid"]: r for r in rows if r["k"] == "graph.capture.end"}
    assert sorted(ends) == [1, 2, 3]
    assert ends[1]["pool_bytes"] > 0 and ends[2]["pool_bytes"] > 0, ends
    assert [ends[g]["pool_shared"] for g in (1, 2, 3)] == [False, False, True]
    assert ends[3]["pool_bytes"] >= 0

    report = subprocess.run([sys.executable, "-m", "mlatrace", "report", str(out), "--json"],
                            env=_env(), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert report.returncode == 0, report.stderr[-2000:]
    (proc,) = json.loads(report.stdout)["graph_use"]["processes"]
    captures = {c["gid"]: c for row in proc["sizes"] for c in row["captures"]}
    assert captures[1]["replays"] == 5 and captures[1]["pool_bytes"] == ends[1]["pool_bytes"]
    never = {n["gid"]: n for n in proc["never_replayed"]}
    assert sorted(never) == [2, 3]
    assert never[2]["pool_bytes"] == ends[2]["pool_bytes"] and never[2]["held_s"] >= 1.4
    assert never[2]["gib_s"] == pytest.approx(
        ends[2]["pool_bytes"] / GIB * never[2]["held_s"], rel=0.01, abs=1e-3)
    assert proc["never_replayed_pool_bytes"] == ends[2]["pool_bytes"] + ends[3]["pool_bytes"]

    text = subprocess.run([sys.executable, "-m", "mlatrace", "report", str(out)], env=_env(),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert text.returncode == 0
    assert "never replayed: gid 2 held " in text.stdout and " MiB for " in text.stdout, \
        text.stdout
