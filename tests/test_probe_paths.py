"""The probe path language: what expressions read, what they refuse, and where errors point."""

from __future__ import annotations

import enum
import textwrap
from collections import namedtuple

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from mlatrace.probe import graphs
from mlatrace.probe.packs import PackError, load_pack
from mlatrace.probe.paths import CallView, PathError, compile_expr, compile_fields, plain


class Meta:
    def __init__(self) -> None:
        self.seq_lens_cpu = torch.tensor([5, 9, 2], dtype=torch.int32)
        self.decode = None
        self.table = {"a": [10, 20]}


def view(*args, result=None, instance=None, **kwargs) -> CallView:
    names = ["q", "meta", "layer"]
    return CallView(instance, args, kwargs, {n: i for i, n in enumerate(names)},
                    {"layer": 3}, result)


def ev(text: str, v: CallView):
    evaluator, _ = compile_expr(text)
    return evaluator(v)


def test_paths_read_args_self_result_items_and_defaults():
    q = torch.zeros(2, 16, 576)
    v = view(q, Meta(), result=("out", None), instance=Meta())
    assert ev("args.layer", v) == 3                      # default of the real target
    assert ev("shape(args.q)", v) == [2, 16, 576]
    assert ev("dtype(args.q)", v) == "torch.float32"
    assert ev("ptr(args.q)", v) == q.data_ptr()
    assert ev("len(args.meta.seq_lens_cpu)", v) == 3
    assert ev("args.meta.table['a'][1]", v) == 20
    assert ev('args.meta.table["a"][0]', v) == 10
    assert ev("result[0]", v) == "out"
    assert ev("len(self.table)", v) == 1
    assert ev("'forward_mqa'", v) == "forward_mqa" and ev("16384", v) == 16384
    assert ev("true", v) is True and ev("null", v) is None and ev("1.5", v) == 1.5


def test_missing_data_yields_none_never_raises():
    v = view(None, Meta())
    assert ev("args.meta.decode.min_kv_seq_len", v) is None
    assert ev("args.meta.nothing", v) is None
    assert ev("args.meta.table['zz']", v) is None
    assert ev("args.meta.table['a'][7]", v) is None
    assert ev("shape(args.q)", v) is None and ev("ptr(args.meta)", v) is None
    assert ev("args.not_a_param", v) is None


def test_alternatives_take_the_first_value_that_is_not_none():
    v = view(None, Meta())
    assert ev("args.meta.decode.min_kv_seq_len | 1", v) == 1
    assert ev("max(args.meta.missing | args.meta.seq_lens_cpu)", v) == 9
    assert ev("args.q | args.meta.decode | null", v) is None


def test_reductions_read_host_tensors_lists_and_arrays():
    v = view([4, 1, 7], np.array([3, 8]), torch.tensor([2, 6], dtype=torch.int64))
    assert (ev("min(args.q)", v), ev("max(args.q)", v), ev("sum(args.q)", v)) == (1, 7, 12)
    assert (ev("min(args.meta)", v), ev("max(args.meta)", v), ev("sum(args.meta)", v)) == (3, 8, 11)
    assert (ev("min(args.layer)", v), ev("max(args.layer)", v)) == (2, 6)
    assert ev("sum(args.layer)", v) == 8 and isinstance(ev("sum(args.layer)", v), int)
    assert ev("min(args.q)", view([], None)) is None


def test_reductions_never_read_a_tensor_that_is_not_on_the_host():
    # A meta-device tensor stands in for a CUDA one: same API, no data to read.
    device_tensor = torch.empty(4, dtype=torch.int32, device="meta")
    v = view(device_tensor, None)
    assert ev("min(args.q)", v) is None and ev("max(args.q)", v) is None
    assert ev("sum(args.q)", v) is None
    assert ev("shape(args.q)", v) == [4] and ev("dtype(args.q)", v) == "torch.int32"


def test_capture_state_functions_follow_the_thread_stack():
    graphs.reset()
    v = view(None, None)
    assert (ev("capturing()", v), ev("gid()", v), ev("dummy()", v)) == (False, None, False)
    graphs.push_capture(41)
    graphs.push_capture(42, "torch")
    assert (ev("capturing()", v), ev("gid()", v)) == (True, 42)
    graphs.push_eager()
    assert (ev("capturing()", v), ev("gid()", v)) == (False, None)
    assert graphs.parent_gid() == 42 and graphs.enclosing_gid(("torch",)) == 41
    graphs.reset()


def test_plain_turns_values_into_json_and_never_keeps_tensors():
    class Mode(enum.Enum):
        FULL = 2

    Key = namedtuple("Key", "num_tokens uniform")
    assert plain(Mode.FULL) == "FULL"
    assert plain(Key(8, True)) == {"num_tokens": 8, "uniform": True}
    assert plain(torch.zeros(3)) is None
    assert plain(torch.tensor(7)) == 7           # a 0-d host tensor is a number
    assert plain(torch.empty((), device="meta")) is None
    assert plain(np.int64(5)) == 5 and plain(object()) is None
    assert plain({"a": (1, torch.zeros(1))}) == {"a": [1, None]}


def test_nested_fields_make_nested_records():
    extract, uses_result = compile_fields(
        {"op": "'x'", "hints": {"n": "len(args.q)"}, "out": "result"}, lambda n, e: "f:1")
    assert uses_result
    assert extract(view([1, 2], None, result=3)) == {"op": "x", "hints": {"n": 2}, "out": 3}


@pytest.mark.parametrize("text, reason", [
    ("eval(args.x)", "unknown function eval()"),
    ("args", "expected ."),
    ("os.system", "a path starts with args.<name>, self or result"),
    ("args.q +1", "unexpected character '+'"),
    ("min(args.q", "expression ends early"),
    ("args.q[x]", "an index is an int or a quoted key"),
    ("args.q extra", "unexpected 'extra'"),
    ("", "empty expression"),
])
def test_bad_expressions_are_rejected(text, reason):
    with pytest.raises(PathError, match=reason.replace("(", r"\(").replace(")", r"\)")
                       .replace("[", r"\[").replace("+", r"\+").replace(".", r"\.")):
        compile_expr(text)


def test_bad_expression_in_a_pack_points_at_its_file_and_line(tmp_path):
    path = tmp_path / "bad.toml"
    path.write_text(textwrap.dedent('''\
        [pack]
        name = "bad"

        [[probe]]
        name = "ok"
        targets = ["m:f"]
        kind = "mark"
        [probe.fields]
        fine = "len(args.x)"

        [[probe]]
        name = "broken"
        targets = ["m:g"]
        kind = "mark"
        [probe.fields]
        a = "args.x"
        b = "__import__(args.x)"
        '''))
    with pytest.raises(PackError) as info:
        load_pack(path)
    assert str(info.value).startswith(f"{path}:17: field 'b': unknown function __import__()")


@pytest.mark.parametrize("body, where, reason", [
    ('[[probe]]\nname = "p"\nkind = "mark"\n', 4, "needs target(s)"),
    ('[[probe]]\nname = "p"\ntargets = ["nomodule"]\nkind = "mark"\n', 4,
     "is not 'module:Qualified.name'"),
    ('[[probe]]\nname = "p"\ntargets = ["m:f"]\nkind = "mark"\nwhen = "later"\n', 4,
     "when must be one of"),
    ('[[probe]]\nname = "p"\ntargets = ["m:f"]\nkind = "mark"\n[probe.fields]\nr = "result"\n',
     4, 'reads result but has when = "call"'),
    ('[[probe]\n', 4, "invalid TOML"),
])
def test_invalid_packs_say_where(tmp_path, body, where, reason):
    path = tmp_path / "p.toml"
    path.write_text('[pack]\nname = "p"\n\n' + body)
    with pytest.raises(PackError) as info:
        load_pack(path)
    assert str(info.value).startswith(f"{path}:{where}:") and reason in str(info.value)


@given(st.lists(st.integers(min_value=-2**40, max_value=2**40), min_size=1, max_size=40))
def test_reductions_agree_with_python_on_lists_and_host_tensors(values):
    tensor = torch.tensor(values, dtype=torch.int64)
    for source in (values, tensor):
        v = view(source, None)
        assert ev("min(args.q)", v) == min(values)
        assert ev("max(args.q)", v) == max(values)
        assert ev("sum(args.q)", v) == sum(values)


def test_graph_node_dump_parsing():
    """DOT text as cudaGraphDebugDotPrint writes it: record labels with escaped <<< >>>."""
    from mlatrace.probe.graph_nodes import parse_dot

    dot = textwrap.dedent(r'''
        digraph dot {
        subgraph cluster_1 {
        "graph_1_node_0"[style="solid" shape="record" label="{
        KERNEL
        | {ID | 0 | _split_kv_decode_stage1_kernel\<\<\<\{4,1,1\},\{128,1,1\},0\>\>\>}
        | {demangled | _split_kv_decode_stage1_kernel\<\<\<\{4,1,1\},\{128,1,1\},0\>\>\>}
        }"];
        "graph_1_node_1"[style="solid" shape="record" label="{MEMCPY | {ID | 1}}"];
        "graph_1_node_2" [label="_mla_decode_stage1_kernel<<<{1,7},128,0>>>"];
        "graph_1_node_3" [label="void at::native::fill_kernel(float*)<<<{2},{256},16>>>"];
        }
        }''')
    assert parse_dot(dot) == [
        {"name": "_split_kv_decode_stage1_kernel", "grid": [4, 1, 1], "block": [128, 1, 1],
         "smem": 0},
        {"name": "_mla_decode_stage1_kernel", "grid": [1, 7, 1], "block": [128, 1, 1],
         "smem": 0},
        {"name": "fill_kernel", "grid": [2, 1, 1], "block": [256, 1, 1], "smem": 16},
    ]
    assert parse_dot("digraph dot {}") == []


# --- compiled for a target (FieldsProgram.bind): the same values as by name -------------

BOUND_EXPRESSIONS = [
    "args.q", "args.layer", "args.meta", "args.not_a_param", "shape(args.q)", "dtype(args.q)",
    "ptr(args.q)", "len(args.q)", "len(args.meta.seq_lens_cpu)", "args.meta.table['a'][1]",
    "args.meta.table['zz']", "args.meta.decode.min_kv_seq_len", "args.meta.decode.__class__",
    "args.meta.__class__.__name__", "args.meta.nothing | 5", "args.q | args.meta | null",
    "max(args.meta.missing | args.meta.seq_lens_cpu)", "min(args.meta.seq_lens_cpu)",
    "sum(args.q)", "isnone(args.meta.decode)", "notnone(args.q)", "shape(args.meta)",
    "dtype(args.meta.seq_lens_cpu)", "ptr(args.meta)", "len(shape(args.q))",
    "shape(args.q) | 1", "result[0]", "result", "self.table", "len(self.table)", "self",
    "capturing()", "gid()", "dummy()", "layer()", "gid() | 7", "'lit'", "3", "1.5", "null",
]


def _calls():
    """(args, kwargs) of calls to f(q, meta, layer=3): positional, keyword, defaulted."""
    q = torch.zeros(2, 16, 576)
    yield (q, Meta(), 5), {}
    yield (q,), {"meta": Meta()}
    yield (), {"q": [4, 1, 7], "meta": Meta(), "layer": 9}
    yield (None, None), {}
    yield ((1, 2),), {}
    yield (q, Meta()), {"extra": 1}


@pytest.mark.parametrize("text", BOUND_EXPRESSIONS)
def test_bound_expressions_agree_with_evaluation_by_name(text):
    names = {"q": 0, "meta": 1, "layer": 2}
    program, _ = compile_fields({"v": text, "n": {"v": text}}, lambda n, e: "f:1")
    direct = program.bind(names, {"layer": 3}, 0)
    shifted = program.bind(names, {"layer": 3}, 1)        # a method: self sits in args[0]
    instance = Meta()
    for args, kwargs in _calls():
        expected = program(CallView(instance, args, kwargs, names, {"layer": 3}, ("r", 1)))
        assert direct(instance, args, kwargs, ("r", 1)) == expected, (text, args, kwargs)
        assert shifted(instance, (instance, *args), kwargs, ("r", 1)) == expected
        assert expected["n"] == {"v": expected["v"]}


def test_a_none_met_along_a_path_stops_it_even_for_attributes_none_has():
    # None has __class__; the walk must still stop at the None, as evaluation by name does.
    program, _ = compile_fields({"c": "args.meta.decode.__class__"}, lambda n, e: "f:1")
    assert program.bind({"meta": 0}, {}, 0)(None, (Meta(),), {}, None) == {"c": None}


def test_bound_fields_keep_the_declared_key_order_and_fresh_nested_dicts():
    fields = {"op": "'x'", "state": {"gid": "gid()", "n": "len(args.q)"}, "layer": "args.layer",
              "capturing": "capturing()", "hints": {"n": "len(args.q)"}, "empty": {}}
    program, _ = compile_fields(fields, lambda n, e: "f:1")
    extract = program.bind({"q": 0, "layer": 1}, {}, 0)
    first = extract(None, ([1, 2], 4), {}, None)
    second = extract(None, ([1], 4), {}, None)
    assert list(first) == ["op", "state", "layer", "capturing", "hints", "empty"]
    assert first == {"op": "x", "state": {"gid": None, "n": 2}, "layer": 4, "capturing": False,
                     "hints": {"n": 2}, "empty": {}}
    assert second["hints"] == {"n": 1} and first["hints"] == {"n": 2}
    assert first["empty"] is not second["empty"]
