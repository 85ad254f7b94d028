"""vLLM model runner V2 (vllm_runner_v2 pack): a stand-in `vllm.v1.worker.gpu.cudagraph_utils`
shaped as vllm 0.33.0's (CudaGraphManager.capture looping over descriptors, create_forward_fn
called with warmup True then False, the torch capture around forward_fn, run_fullgraph
replaying self.graphs[desc]; ModelCudaGraphManager calling super()), run in a real traced
process on the reference HostGraph. The records must be the wrapper path's: a vllm capture
keyed by the descriptor with mode FULL enclosing the torch capture, a vllm replay per
run_fullgraph beside its torch replay with the same n, and the dispatch key equal to the
capture key. Also: a vllm outside the pack's range leaves the pack unattached ("other
version"), and the hand-made fixtures per mode keep their verdicts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from mlatrace.analysis import analyze
from mlatrace.trace import open_trace

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures"

STAND_IN = '''
import dataclasses
import enum

from mlatrace.reference.graph import HostGraph


class CUDAGraphMode(enum.Enum):
    NONE = 0
    PIECEWISE = 1
    FULL = 2


@dataclasses.dataclass(frozen=True)
class BatchExecutionDescriptor:
    cg_mode: CUDAGraphMode
    num_tokens: int
    num_reqs: int | None
    uniform_token_count: int | None = None
    max_query_len: int | None = None
    num_active_loras: int = 0
    num_ubatches: int = 1


BUILT = []   # (num_tokens, warmup) of each metadata build


class CudaGraphManager:
    def __init__(self, sizes):
        self.graphs = {}
        self._capture_descs = {CUDAGraphMode.FULL: [
            BatchExecutionDescriptor(CUDAGraphMode.FULL, n, n, 1) for n in sizes]}

    def capture(self, create_forward_fn, progress_bar_desc="Capturing CUDA graphs"):
        for mode in [CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL]:
            for desc in self._capture_descs.get(mode, []):
                forward_fn = create_forward_fn(desc, warmup=True)
                forward_fn(CUDAGraphMode.NONE)
                forward_fn = create_forward_fn(desc, warmup=False)
                graph = HostGraph()
                graph.capture_begin()
                forward_fn(CUDAGraphMode.NONE)
                graph.capture_end()
                self.graphs[desc] = graph

    def dispatch(self, num_reqs, num_tokens, uniform_token_count, num_active_loras,
                 max_query_len=None, num_ubatches=1):
        for desc in self.graphs:
            if desc.num_tokens == num_tokens:
                return desc
        return BatchExecutionDescriptor(CUDAGraphMode.NONE, num_tokens, num_reqs)

    def run_fullgraph(self, desc):
        self.graphs[desc].replay()


class ModelCudaGraphManager(CudaGraphManager):
    def capture(self, model, model_state, input_buffers, *rest, **kw):
        def create_forward_fn(desc, warmup):
            BUILT.append((desc.num_tokens, warmup))
            return lambda cg_mode: model(desc.num_tokens)
        super().capture(create_forward_fn)

    def run_fullgraph(self, desc):
        super().run_fullgraph(desc)
        return desc.num_tokens
'''

DRIVER = '''
from vllm.v1.worker.gpu import cudagraph_utils as cu

manager = cu.ModelCudaGraphManager([4, 8])
manager.capture(lambda n: None, None, None)
for step in range(3):
    for n in (4, 8):
        desc = manager.dispatch(n, n, 1, 0)
        assert manager.run_fullgraph(desc) == n
'''


def _stand_in(root: Path, version: str) -> None:
    pkg = root / "vllm" / "v1" / "worker" / "gpu"
    pkg.mkdir(parents=True)
    for part in (root / "vllm", root / "vllm" / "v1", root / "vllm" / "v1" / "worker", pkg):
        (part / "__init__.py").write_text("")
    (pkg / "cudagraph_utils.py").write_text(STAND_IN)
    info = root / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")


def _run(tmp_path: Path, version: str) -> list[dict]:
    _stand_in(tmp_path / "src", version)
    out = tmp_path / "trace"
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path / 'src'}"}
    proc = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out), "--",
                           sys.executable, "-c", DRIVER], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return [json.loads(line) for p in out.glob("p*.jsonl") for line in p.read_text().splitlines()]


def test_runner_v2_full_graphs_get_the_wrapper_records(tmp_path):
    records = _run(tmp_path, "0.33.0")
    assert not [r for r in records if r["k"] == "probe.error"]
    begins = [r for r in records if r["k"] == "graph.capture.begin"]
    outer = [b for b in begins if b["src"] == "vllm"]
    inner = [b for b in begins if b["src"] == "reference-host"]
    assert [b["key"]["num_tokens"] for b in outer] == [4, 8]
    assert {b["mode"] for b in outer} == {"FULL"} and outer[0]["key"]["cg_mode"] == "FULL"
    assert [b["parent"] for b in inner] == [b["gid"] for b in outer]   # nesting
    for b in outer:   # each vllm capture ends after the torch capture it encloses
        end = next(r for r in records if r["k"] == "graph.capture.end" and r["gid"] == b["gid"])
        child = next(i for i in inner if i["parent"] == b["gid"])
        child_end = next(r for r in records if r["k"] == "graph.capture.end"
                         and r["gid"] == child["gid"])
        assert b["seq"] < child["seq"] < child_end["seq"] < end["seq"]
        assert end["segments"] == 1 and "error" not in end
    replays = [r for r in records if r["k"] == "graph.replay"]
    outer_gids = {b["gid"] for b in outer}
    v2 = [r for r in replays if r["gid"] in outer_gids]
    torch_ = [r for r in replays if r["gid"] not in outer_gids]
    assert len(v2) == len(torch_) == 6          # once per run_fullgraph, not per super() call
    assert sorted(r["n"] for r in v2) == sorted(r["n"] for r in torch_)
    dispatch = [r for r in records if r["k"] == "dispatch"]
    assert dispatch and dispatch[0]["key"] == outer[0]["key"] and dispatch[0]["mode"] == "FULL"
    marks = [r for r in records if r["k"] == "runner.capture_model"]
    assert len(marks) == 1 and marks[0]["runner"] == "ModelCudaGraphManager"


def test_runner_v2_pack_leaves_another_version_alone(tmp_path):
    records = _run(tmp_path, "0.32.0")
    assert not [r for r in records if r["k"] == "graph.capture.begin" and r["src"] == "vllm"]
    end = next(r for r in records if r["k"] == "process.end")
    assert "vllm_runner_v2" not in end["coverage"]["packs"]
    why = next(v for k, v in end["coverage"]["failed_packs"].items() if "vllm_runner_v2" in k)
    assert "is for vllm >=0.33; installed: 0.32.0" in why
    assert why.startswith("other version")
    # another release of the engine is not an error: no probe.error, the run is not blind
    assert not [r for r in records if r["k"] == "probe.error"]
    check = subprocess.run([sys.executable, "-m", "mlatrace", "check", str(tmp_path / "trace")],
                           env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                           text=True, timeout=120)
    assert check.returncode == 0 and "not blind" in check.stdout, check.stdout


def test_static_check_of_another_version_is_other_version_not_drift():
    from mlatrace.probe import default_pack_paths
    from mlatrace.probe.commands import check_static
    from mlatrace.probe.packs import load_pack

    pack = next(load_pack(p) for p in default_pack_paths() if p.stem == "vllm_runner_v2")
    results = check_static([pack], {}, {"vllm": "0.32.0"})
    assert results and {r.status for r in results} == {"other version"}


@pytest.mark.parametrize("name, verdict", [
    ("vllm_runner_v2_full_frozen_one_split", ["MLT001"]),
    ("vllm_runner_v2_full_device_splits", []),
    ("vllm_runner_v2_breakable_piecewise", []),
])
def test_runner_v2_fixtures(name, verdict):
    found = analyze(open_trace(FIXTURES / name)).findings
    assert [f.id for f in found] == verdict
