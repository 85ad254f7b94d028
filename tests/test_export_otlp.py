"""`mlatrace export --otlp`: a fixture trace sent to a real OTLP/HTTP receiver on 127.0.0.1."""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import pytest
from test_export_support import (
    LENGTHS,
    PYTHON,
    WALL_NS,
    Receiver,
    env_with_repo,
    free_port,
    records_of,
    write_fixture,
)

pytest.importorskip("opentelemetry.exporter.otlp.proto.http")
pytest.importorskip("opentelemetry.proto")


def export(*args: str, env: dict | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "mlatrace.cli", "export", *args], capture_output=True,
                          text=True, env=env or env_with_repo(), timeout=timeout)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, list[dict], str]:
    root = tmp_path_factory.mktemp("otlp") / "trace"
    fixture = write_fixture(root)
    with Receiver() as rx:
        done = export(str(root), "--otlp", rx.url, "--service-name", "fixture-svc")
        spans = list(rx.spans)
    assert done.returncode == 0, done.stderr
    return fixture, spans, done.stdout


def by_name(spans: list[dict], prefix: str) -> list[dict]:
    return [s for s in spans if s["name"].startswith(prefix)]


def test_process_spans_and_resources(exported: tuple) -> None:
    _, spans, stdout = exported
    assert f"sent {len(spans)} spans (2 processes" in stdout
    procs = {s["resource"]["process.pid"]: s for s in by_name(spans, "process ")}
    assert set(procs) == {1000, 1001}
    engine = procs[1001]
    res = engine["resource"]
    assert res["service.name"] == "fixture-svc"
    assert res["host.name"] == "testhost"
    assert res["process.parent_pid"] == 1000
    assert res["process.command_args"] == ["python", "-m", "vllm.engine_core"]
    assert res["mlatrace.rank"] == 0
    assert procs[1000]["resource"]["process.command_args"][-1] == "--api-key=***"  # as recorded
    # One trace for the run; the engine's process span is the child of the API server's.
    assert len({s["trace_id"] for s in spans}) == 1
    assert procs[1000]["parent"] is None
    assert engine["parent"] == procs[1000]["span_id"]
    assert engine["name"] == "process 1001 rank 0"
    # span time = header wall_ns + record t
    assert procs[1000]["start"] == WALL_NS
    assert engine["start"] == WALL_NS + 5_000_000
    assert engine["attrs"]["mlatrace.end.reason"] == "exit"
    assert [e["name"] for e in procs[1000]["events"]] == ["mark"]
    assert procs[1000]["events"][0]["attrs"]["mlatrace.name"] == "server-up"


def test_graph_spans_parentage_and_frozen_decisions(exported: tuple) -> None:
    fixture, spans, _ = exported
    engine = next(s for s in spans if s["name"] == "process 1001 rank 0")
    captures = {s["attrs"]["mlatrace.gid"]: s for s in by_name(spans, "graph.capture")}
    assert set(captures) == {1, 2}
    wrapper, inner = captures[1], captures[2]
    assert wrapper["parent"] == engine["span_id"]
    assert inner["parent"] == wrapper["span_id"]
    assert wrapper["name"] == "graph.capture vllm FULL"
    assert wrapper["attrs"]["mlatrace.graph.key"] == "FULL(num_tokens=1)"
    assert wrapper["attrs"]["mlatrace.graph.mode"] == "FULL"
    assert wrapper["attrs"]["mlatrace.graph.segments"] == 1
    begin = records_of(fixture, "graph.capture.begin", 1001)[0]
    end = [r for r in records_of(fixture, "graph.capture.end", 1001) if r["gid"] == 1][0]
    assert wrapper["start"] == WALL_NS + 5_000_000 + begin["t"]
    assert wrapper["end"] == WALL_NS + 5_000_000 + end["t"]
    names = [e["name"] for e in inner["events"]]
    assert names.count("kernel.split") == 2 and names.count("kernel.launch") == 2
    assert names.count("kernel.skip") == 2
    split = next(e for e in inner["events"] if e["name"] == "kernel.split")
    assert split["attrs"]["mlatrace.num_kv_splits"] == 1
    assert split["attrs"]["mlatrace.min_kv_seq_len"] == 1
    launch = next(e for e in inner["events"] if e["name"] == "kernel.launch")
    assert launch["attrs"]["mlatrace.grid"] == [1, 1, 1]
    assert launch["attrs"]["mlatrace.const.NUM_KV_SPLITS"] == 1
    # The kernel nodes are read after capture end: an instant child span of the capture.
    nodes = by_name(spans, "graph.nodes")
    assert len(nodes) == 1 and nodes[0]["parent"] == inner["span_id"]
    assert nodes[0]["events"][0]["attrs"]["mlatrace.kernel.name"] == "_mla_stage1"
    # Attention calls: one short span each, under the graph they were captured into.
    attn = by_name(spans, "attn.call")
    assert len(attn) == len(records_of(fixture, "attn.call"))
    assert {a["parent"] for a in attn} == {inner["span_id"]}
    assert all(a["name"] == "attn.call forward_mqa" for a in attn)


def test_replays_batched_per_graph(exported: tuple) -> None:
    fixture, spans, _ = exported
    engine = next(s for s in spans if s["name"] == "process 1001 rank 0")
    captures = {s["attrs"]["mlatrace.gid"]: s for s in by_name(spans, "graph.capture")}
    replays = by_name(spans, "graph.replay")
    assert sum(r["attrs"]["mlatrace.replay.count"] for r in replays) == \
        len(records_of(fixture, "graph.replay"))
    for r in replays:
        gid = r["attrs"]["mlatrace.gid"]
        assert r["parent"] == engine["span_id"]
        assert r["links"] == [captures[gid]["span_id"]]
        assert r["attrs"]["mlatrace.replay.seq_len_max.max"] == max(LENGTHS)
        assert r["attrs"]["mlatrace.replay.gpu_ns.timed"] == r["attrs"]["mlatrace.replay.count"]
        assert r["end"] > r["start"]


def test_findings_arrive_as_events(exported: tuple, tmp_path: Path) -> None:
    pytest.importorskip("mlatrace.analysis")
    from mlatrace.analysis import analyze
    from mlatrace.trace import open_trace

    root = tmp_path / "again"
    write_fixture(root)
    findings = analyze(open_trace(root)).findings
    assert any(f.id == "MLT001" for f in findings)
    _, spans, _ = exported
    events = [(s, e) for s in spans for e in s["events"] if e["name"].startswith("MLT")]
    assert sorted(e["name"] for _, e in events) == sorted(f.id for f in findings)
    span, event = next((s, e) for s, e in events if e["name"] == "MLT001")
    assert span["name"].startswith("graph.capture")  # on the graph the finding names
    assert span["attrs"]["mlatrace.gid"] == next(f.gid for f in findings if f.id == "MLT001")
    assert span["status"] == 2  # STATUS_CODE_ERROR
    attrs = event["attrs"]
    assert attrs["mlatrace.finding.severity"] == "error"
    assert attrs["mlatrace.finding.name"] == "frozen-one-split"
    assert "1 KV split" in attrs["mlatrace.finding.message"]
    assert attrs["mlatrace.finding.hint"]
    assert any(ev.startswith("p1001.jsonl:") for ev in attrs["mlatrace.finding.evidence"])


def test_bare_collector_url_gets_traces_path(tmp_path: Path) -> None:
    write_fixture(tmp_path / "t")
    with Receiver() as rx:
        done = export(str(tmp_path / "t"), "--otlp", rx.url + "/")
        assert done.returncode == 0, done.stderr
        assert rx.requests >= 1 and rx.spans


def test_connection_refused_is_a_clear_failure(tmp_path: Path) -> None:
    write_fixture(tmp_path / "t")
    started = time.monotonic()
    done = export(str(tmp_path / "t"), "--otlp", f"http://127.0.0.1:{free_port()}")
    assert done.returncode == 1
    assert "connection refused" in done.stderr
    assert "sent 0 of" in done.stderr
    assert time.monotonic() - started < 15


def test_timeout_is_a_clear_failure(tmp_path: Path) -> None:
    write_fixture(tmp_path / "t")
    with socket.socket() as silent:  # accepts connections (backlog) and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        env = {**env_with_repo(), "MLATRACE_OTLP_TIMEOUT": "1"}
        started = time.monotonic()
        done = export(str(tmp_path / "t"), "--otlp",
                      f"http://127.0.0.1:{silent.getsockname()[1]}", env=env)
    assert done.returncode == 1
    assert "timeout" in done.stderr
    assert time.monotonic() - started < 15


def test_rejecting_collector_is_a_failure(tmp_path: Path) -> None:
    write_fixture(tmp_path / "t")
    with Receiver(status=400) as rx:
        done = export(str(tmp_path / "t"), "--otlp", rx.url)
    assert done.returncode == 1
    assert "400" in done.stderr


def test_usage_errors(tmp_path: Path) -> None:
    write_fixture(tmp_path / "t")
    assert export(str(tmp_path / "t")).returncode == 2  # no destination
    done = export(str(tmp_path / "nothing"), "--otlp", "http://127.0.0.1:1")
    assert done.returncode == 2 and "does not exist" in done.stderr


def test_grpc_protocol(tmp_path: Path) -> None:
    grpc = pytest.importorskip("grpc")
    pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc")
    from concurrent import futures

    from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

    received: list = []

    class Service(trace_service_pb2_grpc.TraceServiceServicer):
        def Export(self, request, context):  # noqa: N802 - the generated name
            received.extend(s for rs in request.resource_spans for ss in rs.scope_spans
                            for s in ss.spans)
            return trace_service_pb2.ExportTraceServiceResponse()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        fixture = write_fixture(tmp_path / "t")
        done = export(str(tmp_path / "t"), "--otlp", f"127.0.0.1:{port}", "--protocol", "grpc")
    finally:
        server.stop(0)
    assert done.returncode == 0, done.stderr
    names = [s.name for s in received]
    assert names.count("graph.capture vllm FULL") == 1
    assert len([n for n in names if n.startswith("attn.call")]) == \
        len(records_of(fixture, "attn.call"))
