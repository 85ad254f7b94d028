"""Shared by the export tests: a real OTLP/HTTP receiver and a small seed-002 fixture trace.

The receiver is a plain http.server on 127.0.0.1 (ephemeral port) that decodes each
ExportTraceServiceRequest with opentelemetry-proto, the way a collector would.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
import threading
import time
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from conftest import REPO

PYTHON = sys.executable


def env_with_repo() -> dict[str, str]:
    """The environment for a `python -m mlatrace.cli` subprocess that finds this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    return env


# -- the receiver ------------------------------------------------------------------------------


def _any_value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which == "array_value":
        return [_any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _any_value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, which) if which else None


def _attrs(kvs: Any) -> dict[str, Any]:
    return {kv.key: _any_value(kv.value) for kv in kvs}


def decode_request(body: bytes) -> list[dict]:
    """Flat span dicts (with their resource's attributes) from one OTLP traces request."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    spans = []
    for rs in request.resource_spans:
        resource = _attrs(rs.resource.attributes)
        for ss in rs.scope_spans:
            for s in ss.spans:
                spans.append({
                    "name": s.name,
                    "trace_id": s.trace_id.hex(),
                    "span_id": s.span_id.hex(),
                    "parent": s.parent_span_id.hex() or None,
                    "start": s.start_time_unix_nano,
                    "end": s.end_time_unix_nano,
                    "attrs": _attrs(s.attributes),
                    "events": [{"name": e.name, "time": e.time_unix_nano,
                                "attrs": _attrs(e.attributes)} for e in s.events],
                    "links": [ln.span_id.hex() for ln in s.links],
                    "status": s.status.code,
                    "resource": resource,
                    "scope": ss.scope.name,
                })
    return spans


class Receiver:
    """An OTLP/HTTP traces endpoint on 127.0.0.1 that keeps every span it is sent."""

    def __init__(self, status: int = 200) -> None:
        self.spans: list[dict] = []
        self.requests = 0
        self.status = status
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                ok = self.path == "/v1/traces" and receiver.status == 200
                if ok:
                    spans = decode_request(body)
                    with receiver.lock:
                        receiver.spans.extend(spans)
                        receiver.requests += 1
                self.send_response(200 if ok else (receiver.status if self.path == "/v1/traces"
                                                   else 404))
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> Receiver:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()

    def wait_for(self, predicate: Any, timeout: float = 10.0) -> list[dict]:
        """The spans once `predicate(spans)` holds (live export arrives in batches)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                spans = list(self.spans)
            if predicate(spans):
                return spans
            time.sleep(0.05)
        with self.lock:
            return list(self.spans)


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- a fixture trace ---------------------------------------------------------------------------

WALL_NS = 1_780_000_000_000_000_000
SEQ_INFO = 0x7D6A00000000
LENGTHS = (100_001, 100_002, 100_003, 100_004)


class _Proc:
    def __init__(self, root: Path, pid: int, ppid: int, rank: int | None, wall_ns: int,
                 argv: list[str]) -> None:
        self.root, self.pid = root, pid
        self.seq = 0
        self.t = 0
        self.lines: list[dict] = []
        self.replays: dict[int, int] = {}
        self.emit("process", schema="mlatrace/1", pid=pid, ppid=ppid, host="testhost", argv=argv,
                  rank=rank, world_size=1 if rank is not None else None, wall_ns=wall_ns,
                  run_id="run-fixture", versions={"python": "3.11.9", "torch": "2.6.0",
                                                  "mlatrace": "0.1.0"},
                  device={"name": "cpu", "arch": None}, probes=["reference"])

    def emit(self, kind: str, tid: int = 11, dt: int = 1000, **fields: Any) -> dict:
        rec = {"k": kind, "t": self.t, "seq": self.seq, "tid": tid, **fields}
        self.lines.append(rec)
        self.seq += 1
        self.t += dt
        return rec

    def replay(self, gid: int, **fields: Any) -> dict:
        self.replays[gid] = self.replays.get(gid, 0) + 1
        return self.emit("graph.replay", gid=gid, n=self.replays[gid], **fields)

    def write(self) -> Path:
        self.emit("process.end", events=self.seq, dropped=0, probe_errors=0, reason="exit",
                  replays={str(g): n for g, n in self.replays.items()})
        path = self.root / f"p{self.pid}.jsonl"
        path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in self.lines))
        return path


def write_fixture(root: Path, *, gpu_ns: bool = True) -> dict[str, Any]:
    """Seed 002 in miniature: an API-server parent and an engine child (rank 0) that captures a
    FULL wrapper graph (gid 1) around a torch graph (gid 2) at min_kv_seq_len=1 (one KV split)
    and replays both at ~100K tokens. Returns what the tests compare against."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "run.json").write_text(json.dumps({
        "schema": "mlatrace/1", "run_id": "run-fixture", "argv": ["mlatrace", "run", "--", "vllm"],
        "start_ns": WALL_NS, "end_ns": WALL_NS + 10**9, "exit_code": 0, "mlatrace": "0.1.0"}))
    api = _Proc(root, 1000, 1, None, WALL_NS, ["python", "-m", "vllm", "serve", "--api-key=***"])
    api.emit("mark", name="server-up", attrs={"port": 8000})
    api.write()

    eng = _Proc(root, 1001, 1000, 0, WALL_NS + 5_000_000, ["python", "-m", "vllm.engine_core"])
    eng.emit("attn.metadata", backend="rocm_aiter_mla", num_reqs=1, seq_len_min=1, seq_len_max=1,
             seq_len_sum=1, dummy=True, capturing=False, ptrs={"seq_info": SEQ_INFO})
    eng.emit("graph.capture.begin", gid=1, parent=None, src="vllm", key="FULL(num_tokens=1)",
             mode="FULL")
    eng.emit("graph.capture.begin", gid=2, parent=1, src="torch", key=None, mode=None)
    for layer in range(2):
        eng.emit("attn.call", op="forward_mqa", layer=layer, capturing=True, gid=2,
                 hints={"min_kv_seq_len": 1}, ptrs={"seq_info": SEQ_INFO},
                 shapes={"q": [1, 16, 576]}, dtype="bf16")
        eng.emit("kernel.split", op="mla_gluon", num_kv_splits=1, block_n=64, regime="small_head",
                 batch=1, qlen=1, nhead=16, min_kv_seq_len=1, policy="legacy", capturing=True,
                 gid=2)
        eng.emit("kernel.launch", name="_mla_stage1", grid=[1, 1, 1], num_warps=4,
                 const={"NUM_KV_SPLITS": 1, "BLOCK_N": 64}, capturing=True, gid=2)
        eng.emit("kernel.skip", name="_mla_stage2", reason="num_kv_splits_is_1")
    eng.emit("graph.capture.end", gid=2, segments=1, eager_breaks=0, dur_ns=5000)
    eng.emit("graph.capture.end", gid=1, segments=1, eager_breaks=0, dur_ns=9000)
    eng.emit("graph.nodes", gid=2, kernels=[{"name": "_mla_stage1", "grid": [1, 1, 1],
                                             "block": [128, 1, 1], "smem": 0}])
    for i, length in enumerate(LENGTHS):
        eng.emit("dispatch", mode="FULL", key="FULL(num_tokens=1)", num_tokens=1)
        eng.emit("attn.metadata", backend="rocm_aiter_mla", num_reqs=1, seq_len_min=length,
                 seq_len_max=length, seq_len_sum=length, dummy=False, capturing=False,
                 ptrs={"seq_info": SEQ_INFO})
        extra = {"gpu_ns": 80_000_000 + i} if gpu_ns else {}
        eng.replay(1, **extra)
        eng.replay(2, dt=100_000_000, **extra)
    eng.emit("sync", op="item", capturing=False, gid=None, where=["runner.py:1 step"], tid=12)
    eng.write()
    return {"procs": {1000: api.lines, 1001: eng.lines}}


def records_of(fixture: dict[str, Any], kind: str, pid: int | None = None) -> list[dict]:
    """The fixture's records of one kind (in one process, or all)."""
    return [r for p, recs in fixture["procs"].items() if pid in (None, p)
            for r in recs if r["k"] == kind]
