"""`mlatrace run -- vllm serve` against a real vLLM on CPU.

Needs the vLLM venv built by tests/e2e_vllm/setup_env.sh (default
/work/vllm-venv, or MLATRACE_VLLM_VENV); skipped when it is absent. The run
itself happens in that venv (tests/e2e_vllm/run_e2e.py), because vLLM and
its torch live there; the report is then read back with this environment's
mlatrace, the light install a CI box analyses traces with.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "e2e_vllm"
VENV = Path(os.environ.get("MLATRACE_VLLM_VENV", "/work/vllm-venv"))
MODEL = Path(os.environ.get("MLATRACE_TINY_MODEL",
                            Path.home() / ".cache" / "mlatrace" / "tiny-deepseek-v2-mla"))

pytestmark = [pytest.mark.vllm, pytest.mark.slow]


def _venv_vllm_version() -> str | None:
    """The venv's vLLM version, or None when there is no usable vLLM venv."""
    python = VENV / "bin" / "python"
    if not python.exists():
        return None
    proc = subprocess.run([str(python), "-c",
                           "import importlib.metadata as m; print(m.version('vllm'))"],
                          capture_output=True, text=True, timeout=60)
    return proc.stdout.strip() if proc.returncode == 0 else None


@pytest.fixture(scope="module")
def vllm_venv() -> Path:
    version = _venv_vllm_version()
    if version is None:
        pytest.skip(f"no vLLM venv at {VENV} (build it: bash tests/e2e_vllm/setup_env.sh {VENV}; "
                    "or set MLATRACE_VLLM_VENV)")
    return VENV


@pytest.fixture(scope="module")
def tiny_model(vllm_venv: Path) -> Path:
    subprocess.run([str(vllm_venv / "bin" / "python"), str(HERE / "make_tiny_model.py"),
                    str(MODEL)], check=True, timeout=600)
    return MODEL


def _run_e2e(vllm_venv: Path, model: Path, out: Path, *options: str) -> dict:
    """Serve `model` traced into `out` with run_e2e.py (in the vLLM venv); its result,
    after asserting that every check it made passed."""
    result_path = out.parent / "result.json"
    proc = subprocess.run([str(vllm_venv / "bin" / "python"), str(HERE / "run_e2e.py"),
                           "--model", str(model), "--out", str(out), *options,
                           "--json", str(result_path)],
                          capture_output=True, text=True, timeout=1200)
    print(proc.stdout)
    assert result_path.exists(), proc.stdout + proc.stderr[-5000:]
    result = json.loads(result_path.read_text())
    failed = [c for c in result["checks"] if not c["ok"]]
    assert not failed and proc.returncode == 0, (
        "failed checks:\n" + "\n".join(f"  {c['name']}: {c['detail']}" for c in failed)
        + "\n--- run_e2e output ---\n" + proc.stdout[-5000:] + proc.stderr[-3000:])
    return result


def test_vllm_serve_traced_end_to_end(vllm_venv: Path, tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "trace"
    # run_e2e's checks count each record (one metadata per step, calls = steps x layers):
    # folding off here; test_vllm_serve_folded_gives_the_same_analysis covers folding on
    result = _run_e2e(vllm_venv, tiny_model, out, "--trace-arg=--fold=0")

    # The three requests' lengths really differ, and the server answered each fully.
    lengths = [r["prompt_tokens"] for r in result["requests"]]
    assert len(set(lengths)) == len(lengths) == 3
    assert all(r["completion_tokens"] == 8 for r in result["requests"])

    # `mlatrace report` from this (light) environment: processes, the MLA calls, no findings.
    report = subprocess.run([sys.executable, "-m", "mlatrace", "report", "-v", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stdout + report.stderr
    text = report.stdout
    assert "forward_mqa" in text, f"the report does not show the MLA calls:\n{text}"
    proc = subprocess.run([sys.executable, "-m", "mlatrace", "report", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    data = json.loads(proc.stdout)
    lineage = result["facts"]["lineage"]
    reported = {p["pid"] for p in data["processes"]}
    for pid in lineage["api"] + lineage["engine"] + lineage["worker"]:
        assert int(pid) in reported, f"process {pid} missing from the report: {sorted(reported)}"
    assert data["findings"] == [], data["findings"]

    # Coverage: the worker's MLA probes attached, nothing failed, and `check` is clean
    # (exit 0: neither findings nor blind).
    coverage = data["coverage"]
    assert not coverage["blind"], coverage["reasons"]
    assert coverage["probe_errors"] == [] and coverage["probes_attached"] > 0
    attached = {pack for p in coverage["processes"] for pack in p["packs_attached"] or []}
    assert {"vllm_mla", "vllm_cudagraph"} <= attached, attached
    assert coverage["engines"].get("vllm"), coverage["engines"]
    check = subprocess.run([sys.executable, "-m", "mlatrace", "check", str(out), "--expect",
                            "attn.call", "--expect", "attn.metadata"],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0, check.stdout + check.stderr


def test_loaded_vllm_server_writes_every_process_end(vllm_venv: Path, tiny_model: Path,
                                                     tmp_path: Path) -> None:
    """32 requests of 48 tokens from 16 clients, then SIGTERM to `mlatrace run` at once.

    vLLM's API server SIGTERMs EngineCore and SIGKILLs its process tree ~20 ms later
    (shutdown timeout 0): before mlatrace wrote process.end when SIGTERM arrived, the
    Worker (and often EngineCore) had none under this load."""
    out = tmp_path / "trace"
    result = _run_e2e(vllm_venv, tiny_model, out, "--load", "32", "--concurrency", "16",
                      "--max-tokens", "48")
    assert len(result["requests"]) == 32
    assert all(r["completion_tokens"] == 48 for r in result["requests"])
    ends = result["facts"]["process_end"]
    lineage = result["facts"]["lineage"]
    assert all(ends[str(pid)] for pid in lineage["api"] + lineage["engine"] + lineage["worker"])
    report = subprocess.run([sys.executable, "-m", "mlatrace", "report", str(out)],
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0 and "no process.end" not in report.stdout, report.stdout


def test_vllm_serve_folded_gives_the_same_analysis(vllm_venv: Path, tiny_model: Path,
                                                   tmp_path: Path) -> None:
    """A loaded serve traced with folding off (16 requests of 32 tokens from 4 clients),
    each process file folded again by the recorder's folder: the whole report, field by
    field, is the same (but evidence seqs and record counts of the files). A second serve
    traced with folding on gives the same findings and verdict, and folds its decode steps."""
    from mlatrace.record.fold import refold

    off = tmp_path / "off"
    _run_e2e(vllm_venv, tiny_model, off, "--load", "16", "--concurrency", "4",
             "--max-tokens", "32", "--trace-arg=--fold=0")
    refolded = tmp_path / "refolded"
    refolded.mkdir()
    steady = 0
    for path in off.iterdir():
        if path.name.endswith(".jsonl"):
            rows = [json.loads(line) for line in path.read_text().splitlines()]
            rows = refold(rows, interval_s=1.0)
            steady += sum(r["k"] == "steady" for r in rows)
            (refolded / path.name).write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            (refolded / path.name).write_bytes(path.read_bytes())
    assert steady, "the worker's decode steps fold"

    def report(out: Path) -> dict:
        proc = subprocess.run([sys.executable, "-m", "mlatrace", "report", "--json", str(out)],
                              capture_output=True, text=True, timeout=300)
        return json.loads(proc.stdout)

    def comparable(value: object) -> object:
        if isinstance(value, dict):
            return {k: comparable(v) for k, v in value.items()
                    if k not in ("seq", "seqs", "trace", "evidence", "steady", "written")
                    and not (k == "records" and isinstance(v, int))}
        if isinstance(value, list):
            return [comparable(v) for v in value]
        return value

    a, b = comparable(report(off)), comparable(report(refolded))
    for key in a:
        assert a[key] == b[key], key

    on = tmp_path / "on"
    _run_e2e(vllm_venv, tiny_model, on, "--load", "16", "--concurrency", "4",
             "--max-tokens", "32")
    data = report(on)
    assert data["findings"] == report(off)["findings"]
    assert not data["coverage"]["blind"], data["coverage"]["reasons"]
    assert data["coverage"]["records"].get("steady"), "the decode steps fold"


METRICS_ROW = re.compile(r"\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([A-Z_]+)\s*\|\s*(\d+)\s*\|")


def _cudagraph_metrics(log: str) -> dict[tuple[int, int, str], int]:
    """vLLM's `--cudagraph-metrics` tables (one per stats interval), summed: (unpadded
    tokens, padded tokens, runtime mode) -> steps."""
    out: dict[tuple[int, int, str], int] = {}
    for line in log.splitlines():
        if "cuda_graph.py" not in line:
            continue
        match = METRICS_ROW.search(line)
        if match:
            unpadded, padded, _paddings, mode, count = match.groups()
            key = (int(unpadded), int(padded), mode.removeprefix("CUDAGraphMode."))
            out[key] = out.get(key, 0) + int(count)
    return out


def test_vllm_graph_use_agrees_with_vllms_own_cudagraph_metrics(vllm_venv: Path,
                                                                tiny_model: Path,
                                                                tmp_path: Path) -> None:
    """12 requests from 4 clients under `--cudagraph-metrics` (logged every second): the
    steps graph use counts per size and mode, with their padding, are vLLM's own counts.
    vLLM's CPU platform captures nothing (capture sizes emptied, mode NONE), so every step
    is eager with the reason "graphs off" and no MLT009 is due."""
    out = tmp_path / "trace"
    log = tmp_path / "server.log"
    _run_e2e(vllm_venv, tiny_model, out, "--load", "12", "--concurrency", "4",
             "--max-tokens", "12", "--settle", "3", "--serve-arg=--cudagraph-metrics",
             "--server-env=VLLM_LOG_STATS_INTERVAL=1", "--keep-log", str(log))
    vllm_counts = _cudagraph_metrics(log.read_text(errors="replace"))
    assert vllm_counts, "vLLM logged no CUDAGraph stats"
    proc = subprocess.run([sys.executable, "-m", "mlatrace", "report", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    data = json.loads(proc.stdout)
    (worker,) = data["graph_use"]["processes"]      # only the Worker dispatches
    ours: dict[tuple[int, int, str], int] = {}
    for row in worker["eager_sizes"]:
        ours[(row["size"], row["size"], "NONE")] = row["steps"]
    for row in worker["sizes"]:
        for mode in row["modes"]:
            if row["steps"]:
                ours[(row["real_min"], row["size"], mode)] = row["steps"]
    if any(mode != "NONE" for *_, mode in vllm_counts):   # a platform that captures
        graph_steps = sum(n for (_u, _p, mode), n in vllm_counts.items() if mode != "NONE")
        assert worker["replayed"] == graph_steps
        assert worker["padding_tokens"] == sum((p - u) * n for (u, p, mode), n
                                               in vllm_counts.items() if mode != "NONE")
    else:
        assert ours == vllm_counts, (ours, vllm_counts)
        assert worker["steps"] == sum(vllm_counts.values()) == worker["eager"]
        assert not worker["graphs_on"] and worker["sizes"] == []
        assert [r["reason"] for r in worker["eager_steps"]] == ["graphs off"]
        assert worker["warmup_dispatches"] == 1      # the profile run's dummy step
    assert not [f for f in data["findings"] if f["id"] == "MLT009"]
