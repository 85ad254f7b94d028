"""graph.nodes from torch's get_graph_data() where it can give grids, else from the DOT dump.

The shipped torch_cuda_graph pack runs on classes shaped like each torch generation (the
CPU box has no CUDA to capture with): torch 2.11 (no get_graph_data), torch 2.13 (the
method, no grid dims), torch with pytorch#196018 (grid/block dims) and with the
lifecycle hooks of pytorch#187749 (nodes read at instantiate, keep_graph left alone).
The installed torch's own get_graph_data is run too, and the H200 run of both sources on
one capture is tests/test_graph_data_gpu.py.
"""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from mlatrace.probe import graph_data

SHIPPED = Path(__file__).resolve().parent.parent / "probes" / "torch_cuda_graph.toml"
KERNEL = {"name": "_fwd_grouped_kernel_stage1", "grid": [1, 1, 1], "block": [128, 1, 1],
          "smem": 63488}
COMBINE = {"name": "_fwd_kernel_stage2", "grid": [1, 16, 1], "block": [128, 1, 1], "smem": 0}

SOURCE = '''
DOT = ('digraph dot {\\n'
       '"graph_0_node_0"[label="{KERNEL | {ID | 0 | _fwd_grouped_kernel_stage1'
       '\\\\<\\\\<\\\\<\\\\{1,1,1\\\\},128,63488\\\\>\\\\>\\\\>}"];\\n'
       '"graph_0_node_1"[label="{KERNEL | {ID | 1 | _fwd_kernel_stage2'
       '\\\\<\\\\<\\\\<\\\\{1,16,1\\\\},128,0\\\\>\\\\>\\\\>}"];\\n}\\n')
NODES = [("_fwd_grouped_kernel_stage1", (1, 1, 1), (128, 1, 1), 63488),
         ("_fwd_kernel_stage2", (1, 16, 1), (128, 1, 1), 0)]
GRID_DIMS = @GRID_DIMS@
HOOKS = @HOOKS@
RAISE = @RAISE@


class _Base:
    def __init__(self, keep_graph=False):
        self.keep_graph = keep_graph
        self.instantiated = False
        self.captured = False
        self.hooks = []
        self.data_calls = 0

    def enable_debug_mode(self):
        self.keep_graph = True

    def capture_begin(self, pool=None, capture_error_mode="global"):
        pass

    def capture_end(self):
        self.captured = True
        if not self.keep_graph:
            self.instantiate()
            self.template = False      # torch frees the template of a keep_graph=False graph

    def _template(self):
        return self.captured and (self.keep_graph or getattr(self, "template", True))

    def debug_dump(self, path):
        if self._template():
            with open(path, "w") as handle:
                handle.write(DOT)

    def get_graph_data(self):
        self.data_calls += 1
        if RAISE:
            raise RuntimeError("get_graph_data requires the cuda.bindings package")
        if not (self._template() and self.instantiated):
            raise RuntimeError("keep_graph must be True and the graph instantiated")
        nodes = [{"index": 0, "node_type": "memset", "kernel_name": None}]
        for i, (name, grid, block, smem) in enumerate(NODES, 1):
            node = {"index": i, "node_type": "kernel", "kernel_name": name}
            if GRID_DIMS:
                node.update(grid_dim=grid, block_dim=block, shared_mem_bytes=smem)
            nodes.append(node)
        return {"exec_graph_id": 7, "nodes": nodes}

    def instantiate(self):
        self.instantiated = True
        self.template = True           # alive while the post-instantiate hooks run
        for hook in self.hooks:
            hook(self)

    def replay(self):
        if not self.instantiated:
            self.instantiate()


class Graph(_Base):
    def __new__(cls, keep_graph=False):
        return super().__new__(cls)

    def capture_begin(self, pool=None, capture_error_mode="global"):
        super().capture_begin(pool, capture_error_mode)

    def capture_end(self):
        super().capture_end()

    def replay(self):
        super().replay()


if HOOKS:
    def register_post_instantiate_hook(self, hook):
        self.hooks.append(hook)
    Graph.register_post_instantiate_hook = register_post_instantiate_hook
'''


def _graph_module(tmp_path: Path, monkeypatch, *, grid_dims: bool, hooks: bool = False,
                  raise_: bool = False) -> tuple[object, Path]:
    name = f"gd_target_{uuid.uuid4().hex[:8]}"
    source = SOURCE.replace("@GRID_DIMS@", str(grid_dims)).replace("@HOOKS@", str(hooks))
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(source.replace("@RAISE@", str(raise_))))
    monkeypatch.syspath_prepend(str(tmp_path))
    pack = tmp_path / f"pack_{name}.toml"
    pack.write_text(SHIPPED.read_text().replace("torch.cuda.graphs:CUDAGraph", f"{name}:Graph"))
    return name, pack


def _capture(traced_with, name: str, pack: Path, keep_graph: bool = False,
             replays: int = 1) -> tuple[list[dict], object]:
    graph_data.reset()
    records = traced_with([pack])
    mod = importlib.import_module(name)
    graph = mod.Graph(keep_graph=keep_graph)
    graph.capture_begin()
    graph.capture_end()
    for _ in range(replays):
        graph.replay()
    rows = records()
    sys.modules.pop(name, None)
    assert not [r for r in rows if r["k"] == "probe.error"]
    return [r for r in rows if r["k"] == "graph.nodes"], graph


def test_torch_with_grid_dims_gives_the_nodes_and_says_so(tmp_path, monkeypatch, traced_with):
    name, pack = _graph_module(tmp_path, monkeypatch, grid_dims=True)
    [nodes], graph = _capture(traced_with, name, pack)
    assert nodes["source"] == "torch" and "source_why" not in nodes
    assert nodes["kernels"] == [KERNEL, COMBINE]          # the memset node is not a kernel
    assert graph.data_calls == 1 and graph.instantiated


def test_the_same_nodes_from_dot_when_get_graph_data_has_no_grid_dims(tmp_path, monkeypatch,
                                                                      traced_with):
    # torch 2.13: get_graph_data() names kernels but gives no grid: DOT, and why
    name, pack = _graph_module(tmp_path, monkeypatch, grid_dims=False)
    [nodes], _ = _capture(traced_with, name, pack)
    assert nodes["source"] == "dot" and "196018" in nodes["source_why"]
    assert nodes["kernels"] == [KERNEL, COMBINE]
    assert graph_data.why_dot() == nodes["source_why"]


def test_a_failing_get_graph_data_falls_back_once(tmp_path, monkeypatch, traced_with):
    name, pack = _graph_module(tmp_path, monkeypatch, grid_dims=True, raise_=True)
    graph_data.reset()
    records = traced_with([pack])
    mod = importlib.import_module(name)
    graphs = [mod.Graph() for _ in range(3)]
    for graph in graphs:
        graph.capture_begin()
        graph.capture_end()
    rows = [r for r in records() if r["k"] == "graph.nodes"]
    sys.modules.pop(name, None)
    assert [r["source"] for r in rows] == ["dot"] * 3
    assert all("cuda.bindings" in r["source_why"] for r in rows)
    assert [g.data_calls for g in graphs] == [1, 0, 0], "detection once per process"
    assert all(r["kernels"] == [KERNEL, COMBINE] for r in rows)


def test_a_users_keep_graph_true_graph_is_not_instantiated_for_the_data(tmp_path, monkeypatch,
                                                                       traced_with):
    name, pack = _graph_module(tmp_path, monkeypatch, grid_dims=True)
    graph_data.reset()
    records = traced_with([pack])
    mod = importlib.import_module(name)
    graph = mod.Graph(keep_graph=True)
    graph.capture_begin()
    graph.capture_end()
    assert not graph.instantiated, "left to the user, as torch does"
    [nodes] = [r for r in records() if r["k"] == "graph.nodes"]
    sys.modules.pop(name, None)
    assert nodes["source"] == "dot" and "not instantiated" in nodes["source_why"]
    assert nodes["kernels"] == [KERNEL, COMBINE]


@pytest.mark.parametrize("keep_graph", [False, True])
def test_lifecycle_hooks_read_nodes_at_instantiate_without_forcing_keep_graph(
        tmp_path, monkeypatch, traced_with, keep_graph):
    name, pack = _graph_module(tmp_path, monkeypatch, grid_dims=True, hooks=True)
    [nodes], graph = _capture(traced_with, name, pack, keep_graph=keep_graph, replays=2)
    assert graph.keep_graph is keep_graph, "keep_graph as the user chose it"
    assert len(graph.hooks) == 1
    assert nodes["source"] == "torch" and nodes["kernels"] == [KERNEL, COMBINE]
    assert graph.data_calls == 1


def test_a_graph_captured_again_gets_its_own_nodes_once(tmp_path, monkeypatch, traced_with):
    # torch keeps a graph's hooks across reset(): the first capture's hook must not write
    # the second capture's nodes under the first gid
    name, pack = _graph_module(tmp_path, monkeypatch, grid_dims=True, hooks=True)
    graph_data.reset()
    records = traced_with([pack])
    mod = importlib.import_module(name)
    graph = mod.Graph()
    for _ in range(2):
        graph.capture_begin()
        graph.capture_end()
    graph.instantiate()     # a re-instantiation: no third record
    rows = records()
    sys.modules.pop(name, None)
    begins = [r["gid"] for r in rows if r["k"] == "graph.capture.begin"]
    assert [r["gid"] for r in rows if r["k"] == "graph.nodes"] == begins
    assert len(graph.hooks) == 2 and len(set(begins)) == 2


def test_lifecycle_hooks_with_dot_when_no_grid_dims(tmp_path, monkeypatch, traced_with):
    name, pack = _graph_module(tmp_path, monkeypatch, grid_dims=False, hooks=True)
    [nodes], graph = _capture(traced_with, name, pack)
    assert graph.keep_graph is False
    assert nodes["source"] == "dot" and nodes["kernels"] == [KERNEL, COMBINE]


def test_graph_data_dict_without_grid_dims_or_nodes_is_refused_with_a_reason():
    assert graph_data.kernels_from_graph_data({"nodes": [
        {"node_type": "kernel", "kernel_name": "k"}]})[1].endswith("(pytorch#196018)")
    assert graph_data.kernels_from_graph_data(None) == (
        None, "get_graph_data() returned no node list")
    kernels, why = graph_data.kernels_from_graph_data({"nodes": [
        {"node_type": "kernel", "kernel_name": "k", "grid_dim": (2, 1, 1),
         "block_dim": (64, 1, 1)},
        {"node_type": "kernel", "kernel_name": None, "grid_dim": None, "block_dim": None}]})
    assert why is None and kernels == [{"name": "k", "grid": [2, 1, 1], "block": [64, 1, 1],
                                        "smem": 0}]


# -- the installed torch ------------------------------------------------------------------
def test_installed_torch_feature_detection():
    """What this box's torch offers, and what mlatrace picks with it."""
    torch = pytest.importorskip("torch")
    cls = torch.cuda.CUDAGraph
    if not hasattr(cls, "get_graph_data"):
        pytest.skip(f"torch {torch.__version__} has no CUDAGraph.get_graph_data "
                    "(pytorch#183165): DOT is the only source")
    assert graph_data.has_instantiate_hook(cls) == hasattr(cls, "register_post_instantiate_hook")

    class Shaped:   # an instance the real method can run on without CUDA
        pass

    shaped = Shaped()
    shaped.get_graph_data = lambda: cls.get_graph_data(shaped)
    kernels, why = graph_data.from_torch(shaped)
    try:
        import cuda.bindings  # noqa: F401
        bindings = True
    except ImportError:
        bindings = False
    if bindings:
        pytest.skip("cuda.bindings installed: get_graph_data needs a CUDA graph to read "
                    "(tests/test_graph_data_gpu.py)")
    # torch's own check: no cuda.bindings here, so DOT, with torch's reason on the record
    assert kernels is None and "cuda.bindings" in why
