"""A real torch.cuda.graph capture of Triton split-KV kernels, traced by mlatrace (H200).

Run (from the repo root, on a CUDA machine):

    PYTHONPATH=$PWD python3 -m mlatrace run --out samples/capture_triton -- \\
        python3 samples/gpu_capture_triton.py
    PYTHONPATH=$PWD python3 samples/gpu_capture_triton.py --check samples/capture_triton

What the program does (the seed-002 shape in miniature):
1. eager decode at a long length: the host policy picks NUM_KV_SPLITS=8, so stage 1
   runs on grid (B, 8) and the reduce kernel runs;
2. FULL capture with torch.cuda.graph at the dummy length 1: the policy picks one
   split, stage 1 is captured on grid (B, 1) and the reduce kernel is skipped;
3. a second graph the user builds with keep_graph=True (their choice must hold);
4. the real lengths are copied into the static seq_lens buffer and the graphs are
   replayed REPLAYS times: the kernels read the real length on the device, but the
   frozen one-split grid stays (correct result, no parallelism over the KV length).
torch.cuda.set_sync_debug_mode("error") is on during the capture body and the
replays, so any synchronisation the probes added would raise.

--check reads the trace and asserts: the capture's kernel.launch records (grid,
NUM_KV_SPLITS) carry the capturing gid; a graph.nodes record whose kernel grids
agree with those launches; replays counted (graph.replay n) with no launch events
after capture; the program's sync-debug window stayed silent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

BATCH = 4
HEAD_DIM = 64
BLOCK_N = 64
MAX_SPLITS = 8
MAX_LEN = 8192
REAL_LEN = 6000
REPLAYS = 20
STAGE1 = "_split_kv_decode_stage1_kernel"
REDUCE = "_split_kv_reduce_kernel"
SUMMARY = "gpu_capture_triton.json"


def num_kv_splits(min_kv_seq_len: int) -> int:
    """The legacy host policy: one split per BLOCK_N of the *hinted* length, capped."""
    return max(1, min(MAX_SPLITS, -(-min_kv_seq_len // BLOCK_N)))


def run_program() -> int:
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def _split_kv_decode_stage1_kernel(q_ptr, kv_ptr, seq_lens_ptr, mid_ptr, max_len,
                                       NUM_KV_SPLITS: tl.constexpr, BLOCK_N: tl.constexpr,
                                       HEAD_DIM: tl.constexpr):
        batch = tl.program_id(0)
        split = tl.program_id(1)
        seq_len = tl.load(seq_lens_ptr + batch)          # the real length, read on device
        per_split = tl.cdiv(seq_len, NUM_KV_SPLITS)
        start = split * per_split
        end = tl.minimum(start + per_split, seq_len)
        dims = tl.arange(0, HEAD_DIM)
        q = tl.load(q_ptr + batch * HEAD_DIM + dims)
        acc = tl.zeros([BLOCK_N], dtype=tl.float32)
        for block in range(start, end, BLOCK_N):
            rows = block + tl.arange(0, BLOCK_N)
            mask = rows < end
            kv = tl.load(kv_ptr + (batch * max_len + rows[:, None]) * HEAD_DIM + dims[None, :],
                         mask=mask[:, None], other=0.0)
            acc += tl.sum(kv * q[None, :], axis=1)
        tl.store(mid_ptr + batch * NUM_KV_SPLITS + split, tl.sum(acc, axis=0))

    @triton.jit
    def _split_kv_reduce_kernel(mid_ptr, out_ptr, NUM_KV_SPLITS: tl.constexpr):
        batch = tl.program_id(0)
        splits = tl.arange(0, NUM_KV_SPLITS)
        tl.store(out_ptr + batch, tl.sum(tl.load(mid_ptr + batch * NUM_KV_SPLITS + splits), 0))

    if os.environ.get("MLATRACE_OUT"):
        # keep the raw DOT dumps next to the trace, to check the node parser against them
        os.environ.setdefault("MLATRACE_KEEP_DOT", str(Path(os.environ["MLATRACE_OUT"]) / "dot"))
    device = torch.device("cuda")
    torch.manual_seed(0)
    q = torch.randn(BATCH, HEAD_DIM, device=device)
    kv = torch.randn(BATCH, MAX_LEN, HEAD_DIM, device=device)
    seq_lens = torch.full((BATCH,), 1, dtype=torch.int32, device=device)   # static buffer
    out = torch.zeros(BATCH, device=device)
    mids = {s: torch.zeros(BATCH * s, device=device) for s in (1, MAX_SPLITS)}

    def decode(min_kv_seq_len: int) -> None:
        """Host decisions (split count, grid, whether the reduce exists), then launches."""
        splits = num_kv_splits(min_kv_seq_len)
        mid = mids[splits]
        _split_kv_decode_stage1_kernel[(BATCH, splits)](
            q, kv, seq_lens, mid, MAX_LEN, NUM_KV_SPLITS=splits, BLOCK_N=BLOCK_N,
            HEAD_DIM=HEAD_DIM)
        if splits == 1:
            out.copy_(mid)                    # the "no stage 2" fast path
        else:
            _split_kv_reduce_kernel[(BATCH,)](mid, out, NUM_KV_SPLITS=splits)

    def reference(length: int) -> torch.Tensor:
        return (kv[:, :length, :] * q[:, None, :]).sum(dim=(1, 2))

    summary: dict = {"torch": torch.__version__, "triton": triton.__version__,
                     "device": torch.cuda.get_device_name()}

    # 1. eager at the real length (and warm-up/compile of both specialisations)
    seq_lens.fill_(REAL_LEN)
    decode(REAL_LEN)
    torch.cuda.synchronize()
    summary["eager_ok"] = bool(torch.allclose(out, reference(REAL_LEN), rtol=1e-3, atol=1e-2))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        seq_lens.fill_(1)
        decode(1)                             # compiles NUM_KV_SPLITS=1 outside capture
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()

    # 2. FULL capture at the dummy length 1 (keep_graph left at its default, False)
    sync_error = None
    graph = torch.cuda.CUDAGraph()
    t0 = time.perf_counter()
    try:
        with torch.cuda.graph(graph):
            torch.cuda.set_sync_debug_mode("error")
            decode(1)
        torch.cuda.set_sync_debug_mode(0)
    except Exception as exc:                  # a sync under "error" lands here
        torch.cuda.set_sync_debug_mode(0)
        sync_error = f"capture: {type(exc).__name__}: {exc}"
    summary["capture_ms"] = (time.perf_counter() - t0) * 1e3

    # 3. the user's own keep_graph=True graph: template kept, instantiated on first replay
    user_graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(user_graph):
        decode(1)
    try:
        summary["user_keep_graph_raw_ok"] = bool(user_graph.raw_cuda_graph())
    except Exception as exc:
        summary["user_keep_graph_raw_ok"] = f"{type(exc).__name__}: {exc}"

    # 4. real lengths into the static buffer, then replays (no Python kernel launch)
    host_lens = torch.full((BATCH,), REAL_LEN, dtype=torch.int32).pin_memory()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    try:
        torch.cuda.set_sync_debug_mode("error")
        seq_lens.copy_(host_lens, non_blocking=True)
        for _ in range(REPLAYS):
            graph.replay()
        for _ in range(3):
            user_graph.replay()
        torch.cuda.set_sync_debug_mode(0)
    except Exception as exc:
        torch.cuda.set_sync_debug_mode(0)
        sync_error = (sync_error or "") + f" replay: {type(exc).__name__}: {exc}"
    torch.cuda.synchronize()
    summary["replay_ms"] = (time.perf_counter() - t0) * 1e3
    summary["replay_ok"] = bool(torch.allclose(out, reference(REAL_LEN), rtol=1e-3, atol=1e-2))
    summary["sync_debug"] = sync_error or "silent"
    summary["replays"] = REPLAYS
    summary["batch"] = BATCH
    print(json.dumps(summary, indent=1))
    trace_dir = os.environ.get("MLATRACE_OUT")
    if trace_dir:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        (Path(trace_dir) / SUMMARY).write_text(json.dumps(summary, indent=1) + "\n")
    return 0 if summary["eager_ok"] and summary["replay_ok"] and not sync_error else 1


def load_records(trace_dir: Path) -> list[dict]:
    files = sorted(trace_dir.glob("p*.jsonl"))
    if not files:
        raise SystemExit(f"no p*.jsonl in {trace_dir}")
    records = []
    for path in files:
        records += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return records


def check(trace_dir: Path) -> int:
    """Assert what the issue asks of this trace; print each check; exit 0 when all hold."""
    records = load_records(trace_dir)
    summary_path = trace_dir / SUMMARY
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    failures = 0

    def expect(ok: bool, what: str) -> None:
        nonlocal failures
        failures += 0 if ok else 1
        print(f"{'ok  ' if ok else 'FAIL'} {what}")

    kinds = {r["k"] for r in records}
    expect(not [r for r in records if r["k"] == "probe.error"],
           f"no probe.error ({[r.get('error') for r in records if r['k'] == 'probe.error']})")
    begins = [r for r in records if r["k"] == "graph.capture.begin" and r.get("src") == "torch"]
    ends = {r["gid"]: r for r in records if r["k"] == "graph.capture.end"}
    expect(len(begins) == 2, f"two torch captures (got {len(begins)})")
    if not begins:
        return 1
    gid = begins[0]["gid"]
    launches = [r for r in records if r["k"] == "kernel.launch"]
    eager = [r for r in launches if not r["capturing"]]
    captured = [r for r in launches if r["capturing"] and r["gid"] == gid]
    expect(any(r["name"] == STAGE1 and r["const"].get("NUM_KV_SPLITS") == MAX_SPLITS
               and r["grid"] == [BATCH, MAX_SPLITS, 1] for r in eager),
           f"eager stage 1 at the real length: grid [{BATCH}, {MAX_SPLITS}, 1], "
           f"NUM_KV_SPLITS={MAX_SPLITS}")
    expect(any(r["name"] == REDUCE for r in eager), "eager reduce kernel launched")
    expect([(r["name"], r["grid"], r["const"].get("NUM_KV_SPLITS")) for r in captured]
           == [(STAGE1, [BATCH, 1, 1], 1)],
           f"captured launches in gid {gid}: {[(r['name'], r['grid'], r['const']) for r in captured]}")
    expect(all(r.get("num_warps") for r in captured), "num_warps recorded on captured launches")

    nodes = [r for r in records if r["k"] == "graph.nodes" and r["gid"] == gid]
    expect(len(nodes) == 1, f"one graph.nodes record for gid {gid} (got {len(nodes)})")
    if nodes:
        kernels = nodes[0]["kernels"]
        names = [k["name"] for k in kernels]
        print(f"     graph.nodes: {kernels}  dump {nodes[0].get('dump_ns', 0) / 1e6:.2f} ms"
              + (f"  error {nodes[0]['error']}" if nodes[0].get("error") else ""))
        frozen = [k for k in kernels if STAGE1 in k["name"]]
        expect(len(frozen) == 1 and frozen[0]["grid"] == captured[0]["grid"] if captured else False,
               "graph.nodes grid of stage 1 agrees with the captured launch")
        expect(not any(REDUCE in name for name in names), "no reduce kernel node was captured")
        expect(all(k["block"][0] == 32 * captured[0]["num_warps"] for k in frozen)
               if captured and captured[0].get("num_warps") else True,
               "node block size = 32 x num_warps")

    end_seq = max(ends[b["gid"]]["seq"] for b in begins if b["gid"] in ends)
    replays = [r for r in records if r["k"] == "graph.replay" and r["gid"] == gid]
    # With --replay-sample the records are sampled; process.end holds the exact count.
    end = next((r for r in records if r["k"] == "process.end"), {})
    counted = end.get("replays", {}).get(str(gid), 0)
    expect(bool(replays) and counted == summary.get("replays", REPLAYS),
           f"graph {gid} replayed {counted} times ({len(replays)} replay records kept)")
    expect(not [r for r in launches if r["seq"] > end_seq],
           "no kernel.launch after the captures (replays launch nothing from Python)")
    expect(summary.get("sync_debug") == "silent",
           f"set_sync_debug_mode('error') silent during capture and replay "
           f"({summary.get('sync_debug', 'no summary')})")
    expect(summary.get("user_keep_graph_raw_ok") is True, "user keep_graph=True graph kept")
    expect(summary.get("replay_ok") is True and summary.get("eager_ok") is True,
           "results correct (the frozen one-split grid is slow, not wrong)")
    print(f"kinds: {sorted(kinds)}")
    print(f"{'all checks passed' if not failures else f'{failures} check(s) failed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--check":
        sys.exit(check(Path(sys.argv[2])))
    sys.exit(run_program())
