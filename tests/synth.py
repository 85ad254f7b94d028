"""Synthetic `mlatrace/1` traces: hand-made scenarios for the tests.

Each scenario writes what the probes would record for one well-known story (seed 002's
frozen one-split MLA decode, AITER PA v1 replayed past capture, a mixed prefill+decode
FULL graph, ...), so that every rule has a positive and a negative case without a GPU.

    python tests/synth.py OUT_DIR     # writes every scenario under OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from mlatrace.decisions import bucketed_splits, legacy_splits

SEQ_INFO_PTR = 137855956567552
BLOCK_N = 64


class SynthProcess:
    """Collects one process's records (k/t/seq/tid filled in) and writes p<pid>.jsonl."""

    def __init__(self, root: Path, pid: int, *, ppid: int = 1, rank: int | None = 0,
                 world_size: int = 1, argv: list[str] | None = None,
                 schema: str = "mlatrace/1") -> None:
        self.root, self.pid = Path(root), pid
        self.seq = 0
        self.t = 0
        self.lines: list[str] = []
        self.replays: dict[int, int] = {}
        self.emit("process", schema=schema, pid=pid, ppid=ppid, host="synth", argv=argv or
                  ["python", "-m", "vllm.entrypoints.cli.main", "serve", "synth"], rank=rank,
                  world_size=world_size, wall_ns=0, versions={"python": "3.11", "mlatrace": "0.1.0"},
                  device={"name": "synthetic", "arch": "none"}, probes=["reference"])

    def emit(self, kind: str, tid: int = 1, **fields: Any) -> int:
        record = {"k": kind, "t": self.t, "seq": self.seq, "tid": tid, **fields}
        self.lines.append(json.dumps(record, separators=(",", ":")))
        seq = self.seq
        self.seq += 1
        self.t += 1000
        return seq

    def replay(self, gid: int, tid: int = 1, **fields: Any) -> int:
        self.replays[gid] = self.replays.get(gid, 0) + 1
        return self.emit("graph.replay", tid=tid, gid=gid, n=self.replays[gid], **fields)

    def write(self, end: bool = True, reason: str = "exit") -> Path:
        if end:
            self.emit("process.end", events=self.seq + 1, dropped=0, probe_errors=0, reason=reason,
                      replays={str(g): n for g, n in self.replays.items()})
        self.root.mkdir(parents=True, exist_ok=True)
        path = self.root / f"p{self.pid}.jsonl"
        path.write_text("\n".join(self.lines) + "\n")
        return path


def write_run(root: Path, argv: list[str] | None = None) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "run.json").write_text(json.dumps({
        "schema": "mlatrace/1", "argv": argv or ["mlatrace", "run", "--", "python", "synth"],
        "start_ns": 0, "end_ns": 1, "exit_code": 0, "mlatrace": "0.1.0"}, indent=1) + "\n")


def mla_decode(root: str | Path, *, policy: str = "legacy", capture_len: int = 1,
               replay_lens: tuple[int, ...] = (100001, 100002, 100003), nhead: int = 16,
               ranks: int = 1, ptr_drift: bool = False, breakable: bool = False,
               gpu_ns: bool = False) -> Path:
    """Seed 002: a FULL wrapper capture (torch graph inside) of forward_mqa -> mla_gluon."""
    root = Path(root)
    write_run(root)
    for rank in range(ranks):
        proc = SynthProcess(root, 1000 + rank, rank=rank, world_size=ranks)
        proc.emit("attn.metadata", backend="rocm_aiter_mla", num_reqs=1, seq_len_min=capture_len,
                  seq_len_max=capture_len, seq_len_sum=capture_len, dummy=True, capturing=False,
                  ptrs={"seq_info": SEQ_INFO_PTR})
        proc.emit("graph.capture.begin", gid=1, parent=None, src="vllm", key="FULL(num_tokens=1)",
                  mode="FULL")
        proc.emit("graph.capture.begin", gid=2, parent=1, src="torch", key=None, mode=None)
        splits = _splits(policy, capture_len, nhead)
        for layer in range(2):
            # a breakable capture runs MLA eagerly between segments, under the wrapper's gid
            proc.emit("attn.call", op="forward_mqa", layer=layer, capturing=True,
                      gid=1 if breakable else 2, hints={"min_kv_seq_len": capture_len},
                      ptrs={"seq_info": SEQ_INFO_PTR}, shapes={"q": [1, nhead, 576]}, dtype="bf16")
            _mla_kernels(proc, policy, splits, capture_len, nhead, capturing=True,
                         gid=1 if breakable else 2)
        proc.emit("graph.capture.end", gid=2, segments=1, eager_breaks=0, dur_ns=5000)
        proc.emit("graph.capture.end", gid=1, segments=1 + breakable, eager_breaks=2 * breakable,
                  dur_ns=9000)
        nodes = [{"name": "_mla_stage1", "grid": [1, 1, splits], "block": [128, 1, 1], "smem": 0}]
        if splits > 1:
            nodes.append({"name": "_mla_stage2", "grid": [1, nhead, 1], "block": [64, 1, 1],
                          "smem": 0})
        proc.emit("graph.nodes", gid=2, kernels=nodes)
        for i, length in enumerate(replay_lens):
            proc.emit("dispatch", mode="FULL", key="FULL(num_tokens=1)", num_tokens=1)
            ptr = SEQ_INFO_PTR + (4096 if ptr_drift and i > 0 else 0)
            proc.emit("attn.metadata", backend="rocm_aiter_mla", num_reqs=1, seq_len_min=length,
                      seq_len_max=length, seq_len_sum=length, dummy=False, capturing=False,
                      ptrs={"seq_info": ptr})
            extra = {"gpu_ns": 20_000_000 + 1000 * i} if gpu_ns else {}
            proc.replay(1, **extra)
            proc.replay(2, **extra)
            if breakable:  # the eager MLA call between segments re-decides with the real length
                for layer in range(2):
                    run_splits = _splits(policy, length, nhead)
                    proc.emit("attn.call", op="forward_mqa", layer=layer, capturing=False, gid=None,
                              hints={"min_kv_seq_len": length}, ptrs={"seq_info": ptr})
                    _mla_kernels(proc, policy, run_splits, length, nhead, capturing=False, gid=None)
        proc.write()
    return root


def _splits(policy: str, length: int, nhead: int) -> int:
    if policy == "legacy":
        return legacy_splits(length, nhead=nhead, block_n=BLOCK_N)
    if policy == "bucketed":
        return bucketed_splits(length)
    return 16  # device: a fixed launch budget independent of length


def _mla_kernels(proc: SynthProcess, policy: str, splits: int, length: int, nhead: int, *,
                 capturing: bool, gid: int | None) -> None:
    proc.emit("kernel.split", op="mla_gluon", num_kv_splits=splits, block_n=BLOCK_N,
              regime="small_head", batch=1, qlen=1, nhead=nhead, min_kv_seq_len=length,
              policy=policy, capturing=capturing, gid=gid)
    proc.emit("kernel.launch", name="_mla_stage1", grid=[1, 1, splits], num_warps=4,
              const={"NUM_KV_SPLITS": splits, "BLOCK_N": BLOCK_N}, capturing=capturing, gid=gid)
    if splits == 1:
        proc.emit("kernel.skip", name="_mla_stage2", reason="num_kv_splits_is_1")
    else:
        proc.emit("kernel.launch", name="_mla_stage2", grid=[1, nhead, 1], num_warps=4,
                  const={"NUM_KV_SPLITS": splits}, capturing=capturing, gid=gid)


def pa_v1(root: str | Path, *, capture_max: int = 1024,
          replay_lens: tuple[int, ...] = (512, 2048, 4096)) -> Path:
    """Seed 000: AITER paged_attention_v1 captured with max_seq_len, replayed at other lengths."""
    root = Path(root)
    write_run(root)
    proc = SynthProcess(root, 2000)
    proc.emit("graph.capture.begin", gid=1, parent=None, src="vllm", key="FULL(num_tokens=8)",
              mode="FULL")
    for layer in range(2):
        proc.emit("attn.call", op="paged_attention_v1", layer=layer, capturing=True, gid=1,
                  hints={"max_seq_len": capture_max}, ptrs={"block_tables": 0x7000},
                  shapes={"query": [8, 32, 128]}, dtype="bf16")
    proc.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1000)
    for length in replay_lens:
        proc.emit("attn.metadata", backend="rocm_aiter_fa", num_reqs=8, seq_len_min=length // 2,
                  seq_len_max=length, seq_len_sum=8 * length, dummy=False, capturing=False,
                  ptrs={"block_tables": 0x7000})
        proc.replay(1)
    proc.write()
    return root


def mixed_full(root: str | Path, *, mode: str = "FULL", both: bool = True,
               decode_visible: bool = True, num_prefills: int | None = None) -> Path:
    """Seeds 001/004: AITER FA backend calling both prefill and decode kernels per layer.

    decode_visible=False: the decode kernel is a torch op no probe sees; the backend
    forward says how many prefills/decodes the captured batch held (vllm_rocm_fa pack).
    """
    root = Path(root)
    write_run(root)
    proc = SynthProcess(root, 3000)
    proc.emit("graph.capture.begin", gid=1, parent=None, src="vllm", key=f"{mode}(num_tokens=64)",
              mode=mode)
    for layer in range(3):
        counts = {} if num_prefills is None else {"num_prefills": num_prefills, "num_decodes": 4}
        proc.emit("attn.call", op="forward", backend="rocm_aiter_fa", layer=layer, capturing=True,
                  gid=1, hints={"max_seq_len": 10240}, ptrs={}, shapes={}, dtype="bf16", **counts)
        if both:
            proc.emit("attn.call", op="flash_attn_varlen_func", layer=layer, capturing=True, gid=1,
                      hints={}, ptrs={}, shapes={}, dtype="bf16")
        if decode_visible:
            proc.emit("attn.call", op="paged_attention_v1", layer=layer, capturing=True, gid=1,
                      hints={"max_seq_len": 10240}, ptrs={}, shapes={}, dtype="bf16")
    proc.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1000)
    for length in (100, 200):
        proc.emit("attn.metadata", backend="rocm_aiter_fa", num_reqs=4, seq_len_min=10,
                  seq_len_max=length, seq_len_sum=4 * length, dummy=False, capturing=False, ptrs={})
        proc.replay(1)
    proc.write()
    return root


def host_syncs(root: str | Path, *, in_capture: bool = True, in_step: bool = True) -> Path:
    """A `.item()` inside capture and another on the decode step path between replays."""
    root = Path(root)
    write_run(root)
    proc = SynthProcess(root, 4000)
    proc.emit("graph.capture.begin", gid=1, parent=None, src="vllm", key="FULL(num_tokens=1)",
              mode="FULL")
    if in_capture:
        proc.emit("sync", op="item", capturing=True, gid=1, where=["builder.py:120 build"])
    proc.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1000)
    proc.emit("sync", op="item", capturing=False, gid=None, where=["warmup.py:10"])  # before replays: fine
    for length in (1000, 1001, 1002):
        proc.emit("attn.metadata", backend="x", num_reqs=1, seq_len_min=length, seq_len_max=length,
                  seq_len_sum=length, dummy=False, capturing=False, ptrs={})
        if in_step:
            proc.emit("sync", op="item", capturing=False, gid=None, where=["builder.py:88 min"])
        proc.replay(1)
    proc.write()
    return root


def hint_only(root: str | Path, *, hint: int = 1, replay_len: int = 2000) -> Path:
    """MLT006: a length hint captured at a dummy value; no split decision recorded."""
    root = Path(root)
    write_run(root)
    proc = SynthProcess(root, 5000)
    proc.emit("graph.capture.begin", gid=1, parent=None, src="vllm", key="FULL(num_tokens=2)",
              mode="FULL")
    proc.emit("attn.call", op="mla_decode_fwd", layer=0, capturing=True, gid=1,
              hints={"min_kv_seq_len": hint}, ptrs={}, shapes={}, dtype="bf16")
    proc.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=1000)
    for length in (replay_len, replay_len + 1):
        proc.emit("attn.metadata", backend="x", num_reqs=2, seq_len_min=length,
                  seq_len_max=length + 5, seq_len_sum=2 * length, dummy=False, capturing=False,
                  ptrs={})
        proc.replay(1)
    proc.write()
    return root


SCENARIOS = {
    "mla_legacy": lambda d: mla_decode(d, policy="legacy"),
    "mla_legacy_tp2": lambda d: mla_decode(d, policy="legacy", ranks=2, gpu_ns=True),
    "mla_legacy_short": lambda d: mla_decode(d, policy="legacy", replay_lens=(100, 200, 300)),
    "mla_device": lambda d: mla_decode(d, policy="device"),
    "mla_device_tp2": lambda d: mla_decode(d, policy="device", ranks=2, gpu_ns=True),
    "mla_bucketed_long": lambda d: mla_decode(d, policy="bucketed", capture_len=16384),
    "mla_bucketed_breakable": lambda d: mla_decode(d, policy="bucketed", breakable=True),
    "mla_legacy_hint128": lambda d: mla_decode(d, policy="legacy", capture_len=128),
    "mla_ptr_drift": lambda d: mla_decode(d, policy="device", ptr_drift=True),
    "pa_v1_beyond": lambda d: pa_v1(d, capture_max=1024),
    "pa_v1_at_max": lambda d: pa_v1(d, capture_max=8192),
    "mixed_full": lambda d: mixed_full(d),
    "mixed_piecewise": lambda d: mixed_full(d, mode="PIECEWISE"),
    "decode_only_full": lambda d: mixed_full(d, both=False),
    "host_syncs": lambda d: host_syncs(d),
    "no_syncs": lambda d: host_syncs(d, in_capture=False, in_step=False),
    "hint_only": lambda d: hint_only(d),
    "hint_at_len": lambda d: hint_only(d, hint=2000),
}


def write_all(out: str | Path) -> list[Path]:
    out = Path(out)
    return [make(out / name) for name, make in SCENARIOS.items()]


if __name__ == "__main__":  # pragma: no cover
    for path in write_all(sys.argv[1] if len(sys.argv) > 1 else "synth-traces"):
        print(path)
