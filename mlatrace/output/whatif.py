"""`mlatrace whatif TRACE`: what a frozen split costs, measured with the reference kernel here.

For every MLA graph of the trace whose finding involves a frozen split count (MLT001, or
an MLT006/MLT007 finding on ``num_kv_splits`` / ``num_splits``), it takes the shapes the
trace captured (batch, heads, dtype, layers, frozen split count, replay lengths) and
runs the reference ``mla_gluon`` (``mlatrace.reference``) on this machine's GPU at those
shapes, once with the frozen split and once with the device policy (split derived on the
device from the runtime length), each captured in a CUDA graph and replayed. It prints
length -> frozen us -> device-policy us -> saving per call, per step (x layers) and per
output token (per step / batch). The figures are those of the reference kernel on this
GPU, not of the traced program's kernel.

``--save`` writes them to ``whatif.json`` in the trace directory, schema
``mlatrace.whatif/1``; ``report`` then adds an estimate to each such finding's cost
(``mlatrace.analysis.cost``):

    {"schema": "mlatrace.whatif/1", "trace": str, "device_name": str, "kernel": str,
     "graphs": [{"pid", "rank", "gid", "key", "finding", "batch", "heads", "dtype",
                 "layers", "frozen_splits", "replay_len_min", "replay_len_max",
                 "rows": [{"len", "frozen_us", "device_us", "device_splits",
                           "saving_call_us", "saving_step_us", "saving_token_us"}]}]}

Exit codes: 0 done (also when no graph qualifies), 2 unreadable trace, bad arguments, or
no CUDA GPU here (one line saying which GPU it needs).
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from mlatrace.analysis import Analysis, Finding
from mlatrace.analysis.cost import WHATIF_FILE, WHATIF_SCHEMA
from mlatrace.analysis.model import TraceModel
from mlatrace.exitcodes import MlatraceError

NEEDS_GPU = ("mlatrace whatif: needs an NVIDIA CUDA GPU to run the reference mla_gluon "
             "(Triton; its Gluon stage 1 on Hopper, e.g. H100/H200), and none is available here")
SPLIT_DECISIONS = ("num_kv_splits", "num_splits")
DEFAULT_REPLAYS = 50
ROUNDS = 3
DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
          "bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}


@dataclass
class Case:
    """One graph to measure: the shapes the trace captured."""

    pid: int | None
    rank: int | None
    gid: int
    key: Any
    finding: str
    batch: int
    heads: int
    dtype: str
    layers: int
    frozen_splits: int
    replay_len_min: int | None
    replay_len_max: int


def frozen_splits_of(finding: Finding) -> int | None:
    """The frozen split count a finding is about, or None when it is not about a split."""
    d = finding.details
    if finding.id == "MLT001":
        return d.get("num_kv_splits") if isinstance(d.get("num_kv_splits"), int) else 1
    if finding.id in ("MLT006", "MLT007"):
        named = " ".join(str(d.get(k) or "") for k in ("value", "name", "decision"))
        captured = d.get("captured")
        if any(name in named for name in SPLIT_DECISIONS) and isinstance(captured, int) \
                and not isinstance(captured, bool):
            return captured
    return None


def cases(model: TraceModel, findings: list[Finding]) -> list[Case]:
    """One case per (process, graph) whose finding involves a frozen split."""
    out: dict[tuple, Case] = {}
    for f in findings:
        splits = frozen_splits_of(f)
        graph = model.graph(f.pid, f.gid)
        if splits is None or graph is None or (f.pid, f.gid) in out:
            continue
        replayed = model.replay_graph(graph) or graph
        longest = replayed.replays.seq_len_max
        if longest is None:
            continue
        batch = heads = None
        dtype, layers = "bf16", set()
        decision_count = 0
        for g in model.subtree(graph):
            for d in g.splits:
                batch, heads = batch or d.batch, heads or d.nhead
                decision_count += d.count
            for call in g.calls:
                shape = call.shapes.get("q_nope")
                if isinstance(shape, list) and len(shape) == 3:
                    batch, heads = batch or shape[0], heads or shape[1]
                if call.extra.get("dtype") in DTYPES:
                    dtype = DTYPES[call.extra["dtype"]]
                if call.op == "forward_mqa" and call.layer is not None:
                    layers.add(call.layer)
        if not batch or not heads:
            continue
        out[(f.pid, f.gid)] = Case(
            pid=f.pid, rank=f.rank, gid=f.gid, key=model.effective_key(graph), finding=f.id,
            batch=batch, heads=heads, dtype=dtype, layers=len(layers) or decision_count or 1,
            frozen_splits=splits, replay_len_min=replayed.replays.seq_len_min_min,
            replay_len_max=longest)
    return list(out.values())


def lengths_of(case: Case) -> list[int]:
    """Replay lengths to measure: the shortest and the longest (and a middle one when far)."""
    top = case.replay_len_max
    low = case.replay_len_min if case.replay_len_min and case.replay_len_min > 0 else top
    picks = {top}
    if top >= 1.1 * low:
        picks.add(low)
    if top >= 4 * low:
        picks.add(int(math.sqrt(low * top)))
    return sorted(picks)


def measure(case: Case, lengths: list[int], replays: int) -> list[dict]:
    """Per length: us per call with the frozen split and with the device policy (CUDA)."""
    import torch

    from mlatrace.reference import policies
    from mlatrace.reference.mla import D_LATENT, D_ROPE, KV_ROW, mla_gluon

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[case.dtype]
    device = torch.device("cuda")
    torch.manual_seed(0)
    rows = []
    for length in lengths:
        slots = case.batch * length
        kv_c = torch.randn(slots, KV_ROW, device=device, dtype=dtype)
        page_table = torch.randperm(slots, device=device).to(torch.int32).view(case.batch, length)
        seq_info = torch.full((case.batch,), length, dtype=torch.int32, device=device)
        q_nope = torch.randn(case.batch, case.heads, D_LATENT, device=device, dtype=dtype)
        q_pe = torch.randn(case.batch, case.heads, D_ROPE, device=device, dtype=dtype)
        inputs = (q_nope, q_pe, kv_c, page_table, seq_info, 1.0 / math.sqrt(KV_ROW), length)
        times = {label: _graph_call_us(mla_gluon, inputs, policy, dtype, replays)
                 for label, policy in (("frozen", f"fixed:{case.frozen_splits}"),
                                       ("device", "device"))}
        device_splits = policies.num_kv_splits("device", case.batch, 1, case.heads, length)
        saving = times["frozen"] - times["device"]
        rows.append({
            "len": length, "frozen_us": round(times["frozen"], 2),
            "device_us": round(times["device"], 2), "device_splits": device_splits,
            "saving_call_us": round(saving, 2), "saving_step_us": round(saving * case.layers, 2),
            "saving_token_us": round(saving * case.layers / case.batch, 2)})
        del kv_c, page_table
        torch.cuda.empty_cache()
    return rows


def _graph_call_us(mla_gluon: Any, inputs: tuple, policy: str, dtype: Any,
                   replays: int) -> float:
    """Capture one mla_gluon call with `policy` in a CUDA graph; us per replay."""
    import torch

    from mlatrace.reference.mla import D_LATENT

    q_nope, q_pe, kv_c, page_table, seq_info, scale, length = inputs
    o = torch.empty(q_nope.shape[0], q_nope.shape[1], D_LATENT, dtype=dtype,
                    device=q_nope.device)

    def call() -> None:
        mla_gluon(q_nope, q_pe, kv_c, o, page_table, seq_info, scale,
                  min_kv_seq_len=length, policy=policy)

    call()                                   # compile outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return _replay_us(graph, replays)


def _replay_us(graph: Any, replays: int) -> float:
    """Mean us per replay: the fastest of ROUNDS rounds of `replays` replays (CUDA events)."""
    import torch

    for _ in range(3):
        graph.replay()
    best = math.inf
    for _ in range(ROUNDS):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        best = min(best, begin.elapsed_time(end) * 1e3 / replays)
    return best


def render(data: dict, out: Any = sys.stdout) -> None:
    """The table per graph, with the disclaimer first."""
    print(f"mlatrace whatif: {data['trace']}", file=out)
    print(f"These figures come from the reference kernel ({data['kernel']}) on this GPU "
          f"({data['device_name']}), at the shapes the trace captured; they are not timings "
          f"of the traced program's own kernel.", file=out)
    for g in data["graphs"]:
        lens = (f"{g['replay_len_min']}..{g['replay_len_max']}" if g["replay_len_min"]
                else str(g["replay_len_max"]))
        rank = "-" if g["rank"] is None else g["rank"]
        print(f"\ngraph gid {g['gid']} (pid {g['pid']}, rank {rank}, key {g['key']}, "
              f"{g['finding']}): batch {g['batch']}, {g['heads']} heads, {g['dtype']}, "
              f"{g['layers']} layers, frozen NUM_KV_SPLITS {g['frozen_splits']}, "
              f"replay lengths {lens}", file=out)
        header = ("length", "frozen us", "device us", "(splits)", "saving/call us",
                  "saving/step us", "saving/token us")
        print("  " + "  ".join(f"{h:>15s}" for h in header), file=out)
        for r in g["rows"]:
            cells = (r["len"], r["frozen_us"], r["device_us"], r["device_splits"],
                     r["saving_call_us"], r["saving_step_us"], r["saving_token_us"])
            print("  " + "  ".join(f"{c:>15}" for c in cells), file=out)


def cuda_device_name() -> str | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    return torch.cuda.get_device_name()


def main(trace: str, device: str = "cuda", save: bool = False,
         lengths: list[int] | None = None, replays: int = DEFAULT_REPLAYS,
         as_json: bool = False) -> int:
    """`mlatrace whatif`; `lengths`: the KV lengths to measure (positive; cli.Lengths
    checks them), None for the replays' shortest and longest."""
    from mlatrace.output.report import Unusable, load, resolve_config

    explicit = lengths
    try:
        _trace, result = load(trace, resolve_config(None))
    except Unusable as exc:
        raise MlatraceError(f"mlatrace whatif: {exc}") from exc
    found = cases(result.model, result.findings)
    if not found:
        print(f"mlatrace whatif: no MLA graph in {trace} has a finding on a frozen split; "
              "nothing to measure")
        return 0
    name = cuda_device_name() if device == "cuda" else None
    if name is None:
        raise MlatraceError(NEEDS_GPU)
    data = whatif_dict(trace, result, found, name, explicit, replays)
    if save:
        path = Path(trace) / WHATIF_FILE
        path.write_text(json.dumps(data, indent=1) + "\n")
    if as_json:
        sys.stdout.write(json.dumps(data, indent=1) + "\n")
    else:
        render(data)
        if save:
            print(f"\nsaved to {Path(trace) / WHATIF_FILE} (report shows it as each finding's "
                  "cost estimate)")
    return 0


def whatif_dict(trace: str, result: Analysis, found: list[Case], device_name: str,
                explicit: list[int] | None, replays: int) -> dict:
    import triton

    graphs = []
    for case in found:
        rows = measure(case, explicit or lengths_of(case), replays)
        graphs.append({**asdict(case), "rows": rows})
    return {"schema": WHATIF_SCHEMA, "trace": str(trace), "device_name": device_name,
            "kernel": f"mlatrace.reference mla_gluon, Triton {triton.__version__}, "
                      f"replayed from a CUDA graph", "graphs": graphs}
