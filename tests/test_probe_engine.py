"""The probe engine on real modules written to a temp dir: lazy, undoable, isolated."""

from __future__ import annotations

import importlib
import json
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

from mlatrace import probe, record
from mlatrace.probe import engine as engine_mod
from mlatrace.probe import graphs
from mlatrace.probe.packs import load_pack

TARGET_SOURCE = '''
import enum

class Mode(enum.Enum):
    FULL = 1

class Impl:
    def forward(self, q, meta, layer=0):
        return q * 2

    @classmethod
    def make(cls, size):
        return [0] * size

    @staticmethod
    def helper(x, y=3):
        return x + y

class Child(Impl):
    pass

def build(seq_lens_cpu, dummy=False):
    return {"n": len(seq_lens_cpu), "mode": Mode.FULL}
'''


@pytest.fixture
def tmp_modules(tmp_path, monkeypatch):
    """A directory on sys.path for throwaway target modules; they are unloaded after."""
    monkeypatch.syspath_prepend(str(tmp_path))
    names: list[str] = []

    def write(source: str, name: str | None = None, package: bool = False) -> str:
        name = name or f"mt_target_{uuid.uuid4().hex[:8]}"
        if package:
            (tmp_path / name).mkdir()
            for sub, text in source.items():  # type: ignore[union-attr]
                (tmp_path / name / sub).write_text(textwrap.dedent(text))
        else:
            (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        importlib.invalidate_caches()
        return name

    yield write
    for name in names:
        for loaded in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
            del sys.modules[loaded]


@pytest.fixture
def trace(tmp_path):
    """A running recorder; read() returns the records written so far (header excluded)."""
    out = tmp_path / "trace"
    recorder = record.start(str(out))
    graphs.reset()

    def read() -> list[dict]:
        recorder.flush() if hasattr(recorder, "flush") else None
        rows = []
        for path in sorted(out.glob("p*.jsonl")):
            rows += [json.loads(line) for line in path.read_text().splitlines() if line]
        return [r for r in rows if r["k"] not in ("process", "process.end")]

    yield read
    probe.uninstall()
    record.stop()


def finish(read) -> list[dict]:
    record.stop()
    return read()


def pack_file(tmp_path: Path, body: str, name: str = "test_pack") -> Path:
    path = tmp_path / f"{name}_{uuid.uuid4().hex[:6]}.toml"
    path.write_text(f'[pack]\nname = "{name}"\nlibrary = "none"\nversions = ["test"]\n'
                    + textwrap.dedent(body))
    return path


def forward_probe(module: str, extra: str = "") -> str:
    return f'''
    [[probe]]
    name = "forward"
    targets = ["{module}:Impl.forward"]
    params = ["self", "q", "meta"]
    kind = "attn.call"
    when = "call"
    {extra}
    [probe.fields]
    op = "'forward'"
    q = "args.q"
    layer = "args.layer"
    n = "len(args.meta)"
    '''


def test_lazy_patching_does_not_import_and_patches_on_import(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    probe.install([pack_file(tmp_path, forward_probe(module))])
    assert module not in sys.modules, "installing must not import the target"
    mod = importlib.import_module(module)
    assert mod.Impl().forward(3, [1, 2]) == 6
    records = finish(trace)
    assert [r for r in records if r["k"] == "attn.call"] == [
        {**records[0], "op": "forward", "q": 3, "layer": 0, "n": 2}]


def test_already_imported_module_is_patched_at_once(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    mod = importlib.import_module(module)
    probe.install([pack_file(tmp_path, forward_probe(module))])
    mod.Impl().forward(5, meta=[], layer=7)
    calls = [r for r in finish(trace) if r["k"] == "attn.call"]
    assert len(calls) == 1 and calls[0]["q"] == 5 and calls[0]["layer"] == 7
    assert calls[0]["n"] == 0


def test_uninstall_restores_the_originals(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    mod = importlib.import_module(module)
    original = mod.Impl.__dict__["forward"]
    probe.install([pack_file(tmp_path, forward_probe(module))])
    assert mod.Impl.__dict__["forward"] is not original
    probe.uninstall()
    assert mod.Impl.__dict__["forward"] is original
    mod.Impl().forward(1, [])
    assert not [r for r in finish(trace) if r["k"] == "attn.call"]


def test_uninstall_before_import_leaves_the_module_alone(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    probe.install([pack_file(tmp_path, forward_probe(module))])
    probe.uninstall()
    mod = importlib.import_module(module)   # the stale post-import hook must do nothing
    assert not hasattr(mod.Impl.__dict__["forward"], "__wrapped__")
    mod.Impl().forward(1, [])
    assert not [r for r in finish(trace) if r["k"] == "attn.call"]


def test_double_install_is_a_no_op(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    pack = pack_file(tmp_path, forward_probe(module))
    assert probe.install([pack]) == ["test_pack"]
    assert probe.install([pack]) == []
    importlib.import_module(module).Impl().forward(1, [])
    assert len([r for r in finish(trace) if r["k"] == "attn.call"]) == 1


def test_classmethod_staticmethod_and_function_targets(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    body = f'''
    [[probe]]
    name = "make"
    targets = ["{module}:Impl.make"]
    params = ["cls", "size"]
    kind = "mark"
    [probe.fields]
    size = "args.size"
    [[probe]]
    name = "helper"
    targets = ["{module}:Impl.helper"]
    params = ["x", "y"]
    kind = "mark"
    when = "return"
    [probe.fields]
    x = "args.x"
    y = "args.y"
    out = "result"
    [[probe]]
    name = "build"
    targets = ["{module}:build"]
    params = ["seq_lens_cpu", "dummy"]
    kind = "attn.metadata"
    when = "return"
    [probe.fields]
    num_reqs = "len(args.seq_lens_cpu)"
    seq_len_max = "max(args.seq_lens_cpu)"
    seq_len_sum = "sum(args.seq_lens_cpu)"
    dummy = "args.dummy"
    mode = "result['mode']"
    '''
    probe.install([pack_file(tmp_path, body)])
    mod = importlib.import_module(module)
    assert mod.Impl.make(2) == [0, 0]
    assert mod.Impl.helper(1) == 4 and mod.Impl().helper(2, y=5) == 7
    assert mod.build([3, 9, 4])["n"] == 3
    records = finish(trace)
    marks = [r for r in records if r["k"] == "mark"]
    assert marks[0]["size"] == 2
    assert [(m["x"], m["y"], m["out"]) for m in marks[1:]] == [(1, 3, 4), (2, 5, 7)]
    meta = [r for r in records if r["k"] == "attn.metadata"][0]
    assert (meta["num_reqs"], meta["seq_len_max"], meta["seq_len_sum"]) == (3, 9, 16)
    assert meta["dummy"] is False and meta["mode"] == "FULL"


def test_inherited_method_is_not_patched_twice(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    body = forward_probe(module).replace(
        f'targets = ["{module}:Impl.forward"]',
        f'targets = ["{module}:Impl.forward", "{module}:Child.forward"]')
    probe.install([pack_file(tmp_path, body)])
    mod = importlib.import_module(module)
    mod.Child().forward(2, [])
    runtime = probe.installed().runtimes[0]
    assert "not overridden" in runtime.skipped[f"{module}:Child.forward"]
    records = finish(trace)
    assert len([r for r in records if r["k"] == "attn.call"]) == 1
    assert not [r for r in records if r["k"] == "probe.error"]


def test_reexported_function_is_patched_once(tmp_modules, trace, tmp_path):
    package = tmp_modules({
        "__init__.py": "from .impl import *\n",
        "impl.py": "__all__ = ['kernel']\ndef kernel(x, max_seq_len):\n    return x\n",
    }, package=True)
    body = f'''
    [[probe]]
    name = "kernel"
    targets = ["{package}.impl:kernel", "{package}:kernel"]
    params = ["x", "max_seq_len"]
    kind = "attn.call"
    [probe.fields.hints]
    max_seq_len = "args.max_seq_len"
    '''
    probe.install([pack_file(tmp_path, body)])
    pkg = importlib.import_module(package)
    assert pkg.kernel is pkg.impl.kernel, "the re-export sees the patched function"
    pkg.kernel(1, 4096)
    calls = [r for r in finish(trace) if r["k"] == "attn.call"]
    assert [c["hints"] for c in calls] == [{"max_seq_len": 4096}]


def test_signature_drift_is_reported_once_and_skipped(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    body = forward_probe(module).replace('params = ["self", "q", "meta"]',
                                         'params = ["self", "query", "meta"]')
    mod = importlib.import_module(module)
    original = mod.Impl.__dict__["forward"]
    probe.install([pack_file(tmp_path, body)])
    assert mod.Impl.__dict__["forward"] is original, "a drifted target is not patched"
    mod.Impl().forward(1, [])
    records = finish(trace)
    errors = [r for r in records if r["k"] == "probe.error"]
    assert len(errors) == 1 and "drift" in errors[0]["error"]
    assert errors[0]["probe"] == "test_pack.forward"
    assert not [r for r in records if r["k"] == "attn.call"]


def test_a_field_reading_a_missing_parameter_is_drift(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    body = forward_probe(module).replace('n = "len(args.meta)"', 'n = "args.num_tokens"')
    probe.install([pack_file(tmp_path, body)])
    importlib.import_module(module)
    errors = [r for r in finish(trace) if r["k"] == "probe.error"]
    assert len(errors) == 1 and "num_tokens" in errors[0]["error"]


def test_missing_target_is_reported(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    body = forward_probe(module).replace("Impl.forward", "Impl.gone")
    probe.install([pack_file(tmp_path, body)])
    importlib.import_module(module)
    errors = [r for r in finish(trace) if r["k"] == "probe.error"]
    assert len(errors) == 1 and "missing" in errors[0]["error"]


def test_failing_probe_is_disabled_after_one_error_and_calls_proceed(tmp_modules, trace,
                                                                     tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    handler_module = tmp_modules('''
        class Boom:
            calls = 0
            def __init__(self, spec):
                self.spec = spec
            def before(self, view, info):
                type(self).calls += 1
                raise RuntimeError("probe bug")
    ''')
    body = forward_probe(module, extra=f'handler = "{handler_module}:Boom"')
    probe.install([pack_file(tmp_path, body)])
    mod = importlib.import_module(module)
    assert [mod.Impl().forward(i, []) for i in range(3)] == [0, 2, 4]
    assert sys.modules[handler_module].Boom.calls == 1, "disabled after the first failure"
    records = finish(trace)
    errors = [r for r in records if r["k"] == "probe.error"]
    assert len(errors) == 1 and "probe bug" in errors[0]["error"]


def test_exceptions_of_the_target_propagate_unchanged(tmp_modules, trace, tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    probe.install([pack_file(tmp_path, forward_probe(module).replace(
        'when = "call"', 'when = "return"'))])
    mod = importlib.import_module(module)
    with pytest.raises(TypeError):
        mod.Impl().forward(None, [])
    assert not [r for r in finish(trace) if r["k"] == "probe.error"]


def test_install_default_finds_the_shipped_packs(monkeypatch):
    monkeypatch.delenv("MLATRACE_PROBES", raising=False)
    names = [load_pack(p).name for p in probe.default_pack_paths()]
    for expected in ("torch_cuda_graph", "triton_launch", "vllm_cudagraph", "vllm_mla",
                     "vllm_rocm_fa", "aiter", "sglang", "reference"):
        assert expected in names


def test_bad_user_pack_is_reported_and_shipped_packs_still_install(tmp_path, monkeypatch,
                                                                   trace):
    bad = tmp_path / "bad.toml"
    bad.write_text('[pack]\nname = "bad"\n[[probe]]\nname = "x"\ntargets = ["m:f"]\n'
                   'kind = "mark"\n[probe.fields]\nv = "eval(args.x)"\n')
    monkeypatch.setenv("MLATRACE_PROBES", str(bad))
    names = probe.install_default()
    assert "torch_cuda_graph" in names and "bad" not in names
    errors = [r for r in finish(trace) if r["k"] == "probe.error"]
    assert len(errors) == 1 and errors[0]["target"] == str(bad)
    assert f"{bad}:8:" in errors[0]["error"]


def test_engine_state_switch_makes_leftover_wrappers_pass_through(tmp_modules, trace,
                                                                  tmp_path):
    module = tmp_modules(TARGET_SOURCE)
    probe.install([pack_file(tmp_path, forward_probe(module))])
    mod = importlib.import_module(module)
    wrapped = mod.Impl.__dict__["forward"]
    probe.uninstall()
    assert engine_mod.STATE.active is False
    mod.Impl.forward = wrapped          # someone kept a reference to our wrapper
    mod.Impl().forward(1, [])
    assert not [r for r in finish(trace) if r["k"] == "attn.call"]


GRAPH_SOURCE = '''
DOT = (\'digraph dot {\\n"graph_0_node_0"[label="{KERNEL | {ID | 0 | \'
       \'_mla_decode_stage1_kernel\\\\<\\\\<\\\\<\\\\{1,7\\\\},128,0\\\\>\\\\>\\\\>}}"];\\n}\\n\')


class _GraphBase:
    """Shaped like torch._C._CUDAGraph: the C++ side takes keep_graph in __init__."""

    def __init__(self, keep_graph=False):
        self.keep_graph = keep_graph
        self.debug = False
        self.instantiated = False
        self.captured = False

    def enable_debug_mode(self):
        self.debug = True

    def capture_begin(self, pool=None, capture_error_mode="global"):
        pass

    def capture_end(self):
        self.captured = True
        if not self.keep_graph:
            self.instantiated = True

    def debug_dump(self, path):
        if self.keep_graph and self.captured:
            with open(path, "w") as handle:
                handle.write(DOT)

    def instantiate(self):
        self.instantiated = True

    def replay(self):
        if not self.instantiated:
            self.instantiate()


class Graph(_GraphBase):
    """Shaped like torch.cuda.graphs.CUDAGraph: Python __new__(cls, keep_graph=False)."""

    def __new__(cls, keep_graph=False):
        return super().__new__(cls)

    def capture_begin(self, pool=None, capture_error_mode="global"):
        super().capture_begin(pool, capture_error_mode)

    def capture_end(self):
        super().capture_end()

    def replay(self):
        super().replay()
'''


def test_graph_handlers_dump_nodes_and_keep_the_users_keep_graph(tmp_modules, trace, tmp_path):
    """The torch_cuda_graph handlers on a class shaped like torch.cuda.CUDAGraph (CPU)."""
    module = tmp_modules(GRAPH_SOURCE)
    shipped = (Path(__file__).resolve().parent.parent / "probes" / "torch_cuda_graph.toml")
    pack = tmp_path / "graph_pack.toml"
    pack.write_text(shipped.read_text().replace("torch.cuda.graphs:CUDAGraph", f"{module}:Graph"))
    probe.install([pack])
    mod = importlib.import_module(module)
    default, kept = mod.Graph(), mod.Graph(keep_graph=True)
    for graph in (default, kept):
        assert graph.keep_graph is True, "built with keep_graph forced on"
        graph.capture_begin()
        assert graph.debug is True
        graph.capture_end()
    assert default.instantiated, "keep_graph=False: instantiated at capture end, as before"
    assert not kept.instantiated, "keep_graph=True: left to replay, as the user asked"
    default.replay()
    kept.replay()
    kept.replay()
    probe.uninstall()
    assert "__init__" not in mod.Graph.__dict__ and mod.Graph().keep_graph is False
    records = finish(trace)
    assert not [r for r in records if r["k"] == "probe.error"]
    begins = [r for r in records if r["k"] == "graph.capture.begin"]
    assert [(b["src"], b["parent"]) for b in begins] == [("torch", None), ("torch", None)]
    nodes = [r for r in records if r["k"] == "graph.nodes"]
    assert [n["gid"] for n in nodes] == [b["gid"] for b in begins]
    assert nodes[0]["kernels"] == [{"name": "_mla_decode_stage1_kernel", "grid": [1, 7, 1],
                                    "block": [128, 1, 1], "smem": 0}]
    replays = [(r["gid"], r["n"]) for r in records if r["k"] == "graph.replay"]
    assert replays == [(begins[0]["gid"], 1), (begins[1]["gid"], 1), (begins[1]["gid"], 2)]


def test_graph_node_dump_off_keeps_graphs_untouched(tmp_modules, trace, tmp_path, monkeypatch):
    monkeypatch.setenv("MLATRACE_GRAPH_NODES", "0")
    module = tmp_modules(GRAPH_SOURCE)
    shipped = (Path(__file__).resolve().parent.parent / "probes" / "torch_cuda_graph.toml")
    pack = tmp_path / "graph_pack.toml"
    pack.write_text(shipped.read_text().replace("torch.cuda.graphs:CUDAGraph", f"{module}:Graph"))
    probe.install([pack])
    mod = importlib.import_module(module)
    graph = mod.Graph()
    assert graph.keep_graph is False and "__init__" not in mod.Graph.__dict__
    graph.capture_begin()
    graph.capture_end()
    records = finish(trace)
    assert [r["k"] for r in records] == ["graph.capture.begin", "graph.capture.end"]


SUPER_SOURCE = '''
class Base:
    def forward(self, q, meta, layer=0):
        return q + 1

class Impl(Base):
    def forward(self, q, meta, layer=0):
        return super().forward(q, meta, layer) * 2
'''


def test_override_calling_super_is_recorded_once(tmp_modules, trace, tmp_path):
    """Like AMXMLAMetadataBuilder.build -> MLACommonMetadataBuilder.build in vLLM 0.32."""
    module = tmp_modules(SUPER_SOURCE)
    body = forward_probe(module).replace(f'targets = ["{module}:Impl.forward"]',
                                         f'targets = ["{module}:Impl.forward", "{module}:Base.forward"]')
    probe.install([pack_file(tmp_path, body)])
    mod = importlib.import_module(module)
    assert mod.Impl().forward(3, [1]) == 8
    assert mod.Base().forward(3, [1]) == 4
    calls = [r for r in finish(trace) if r["k"] == "attn.call"]
    assert len(calls) == 2  # one per outer call, not one per level


RECURSIVE_SOURCE = '''
def chunks(n, size=2):
    return 1 if n <= size else chunks(n - size, size) + 1

class Impl:
    def forward(self, q, meta, layer=0):
        """Doc of forward."""
        return q * 2
'''


def test_function_replacement_looks_like_the_original_and_records_each_call_form(
        tmp_modules, trace, tmp_path):
    import inspect

    module = tmp_modules(RECURSIVE_SOURCE)
    mod = importlib.import_module(module)
    original = mod.Impl.__dict__["forward"]
    body = forward_probe(module) + f'''
    [[probe]]
    name = "chunks"
    targets = ["{module}:chunks"]
    params = ["n", "size"]
    kind = "mark"
    [probe.fields]
    n = "args.n"
    size = "args.size"
    '''
    probe.install([pack_file(tmp_path, body)])
    patched = mod.Impl.__dict__["forward"]
    assert patched is not original and patched.__wrapped__ is original
    assert (patched.__name__, patched.__qualname__, patched.__doc__) == (
        "forward", "Impl.forward", "Doc of forward.")
    assert inspect.signature(mod.Impl.forward) == inspect.signature(original)
    impl = mod.Impl()
    assert impl.forward(1, [1]) == 2
    assert mod.Impl.forward(impl, 2, meta=[1, 2], layer=5) == 4     # through the class
    assert impl.forward(q=3, meta=[]) == 6
    assert mod.chunks(7) == 4                     # recursive: only the outermost call
    records = finish(trace)
    calls = [(r["q"], r["layer"], r["n"]) for r in records if r["k"] == "attn.call"]
    assert calls == [(1, 0, 1), (2, 5, 2), (3, 0, 0)]
    assert [(r["n"], r["size"]) for r in records if r["k"] == "mark"] == [(7, 2)]


def test_written_lines_are_what_the_json_encoder_gives(tmp_modules, tmp_path):
    """Each line is one JSON object holding the emitted fields (as json would encode
    them) plus k, t, seq and tid, which the recorder owns; odd values are encoded as
    the json path does, and a record that cannot be encoded becomes record.error."""
    out = tmp_path / "trace"
    record.start(str(out))
    try:
        record.emit("attn.call", op="forward_mqa", layer=3, capturing=False, gid=None,
                    dtype="torch.float32", hints={"min_kv_seq_len": 1, "f": 1.5e300},
                    ptrs={"seq_info": 2**47}, shapes={"q": [4, 16, 576]}, s="é\n\"x")
        record.emit("mark")                                   # no fields
        record.emit("mark", t=5, attrs={"a": (1, 2)})         # a reserved key: ours wins
        record.emit("odd", attrs={"set": {2, 1}})
        loop: list = []
        loop.append(loop)
        record.emit("mark", attrs=loop)                       # circular: record.error
    finally:
        record.stop()
    (path,) = out.glob("p*.jsonl")
    lines = path.read_text().splitlines()[1:-1]
    parsed = [json.loads(line) for line in lines]
    head = ("k", "t", "seq", "tid")
    assert {k: v for k, v in parsed[0].items() if k not in head} == {
        "op": "forward_mqa", "layer": 3, "capturing": False, "gid": None,
        "dtype": "torch.float32", "hints": {"min_kv_seq_len": 1, "f": 1.5e300},
        "ptrs": {"seq_info": 2**47}, "shapes": {"q": [4, 16, 576]}, "s": "é\n\"x"}
    assert sorted(parsed[1]) == sorted(head)
    assert [p["k"] for p in parsed] == ["attn.call", "mark", "mark", "odd", "record.error"]
    assert parsed[2]["t"] != 5 and parsed[2]["attrs"] == {"a": [1, 2]}
    assert sorted(parsed[3]["attrs"]["set"]) == [1, 2]
    assert parsed[4]["error"].startswith("ValueError('Circular reference detected')")
    assert all(a["t"] <= b["t"] for a, b in zip(parsed, parsed[1:], strict=False))
    assert [p["seq"] for p in parsed] == [1, 2, 3, 4, 5]
