"""End to end: `mlatrace run -- vllm serve` on a real vLLM (CPU), then check the trace.

Usage (with the vLLM venv's python; see setup_env.sh and make_tiny_model.py):

    /work/vllm-venv/bin/python tests/e2e_vllm/run_e2e.py --model /work/tiny-mla \
        --out /tmp/e2e-trace [--json result.json] [--no-trace]

Starts the server under `mlatrace run` (or plainly with --no-trace), waits for
/health, sends a few completions of different prompt lengths one at a time to
127.0.0.1, stops the server with SIGTERM sent to the mlatrace process, and
checks the trace with mlatrace's own reader. Prints one line per check and
exits 0 when all pass, 1 otherwise. --json writes the requests, timings and
check results for the pytest wrapper and docs/testing.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Prompts of clearly different lengths; token counts are taken from the server's usage.
PROMPTS = [
    "Hello",
    "The number 12 comes after 11 and before 13.",
    "Beautiful is better than ugly. Explicit is better than implicit. Simple is better "
    "than complex. Complex is better than complicated. Flat is better than nested. "
    "Sparse is better than dense. Readability counts.",
]
MAX_TOKENS = 8
HOST = "127.0.0.1"


@dataclass
class Request:
    prompt: str
    prompt_tokens: int
    completion_tokens: int
    latency_s: float


@dataclass
class Result:
    ok: bool = False
    exit_code: int | None = None
    ready_s: float | None = None
    stop_s: float | None = None
    total_s: float | None = None
    requests: list[Request] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)
    server_log: str = ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def server_env(tmp: Path, extra: list[str] = ()) -> dict[str, str]:
    """Offline, loopback-only, small KV cache, caches in a temp dir; `extra` NAME=VALUE."""
    env = dict(os.environ)
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_HOST_IP=HOST,
               VLLM_CPU_KVCACHE_SPACE="1", VLLM_NO_USAGE_STATS="1", DO_NOT_TRACK="1",
               TMPDIR=str(tmp), VLLM_CACHE_ROOT=str(tmp / "vllm-cache"))
    # The server's processes import the same mlatrace as this script (a worktree's, say),
    # and nothing else from the caller's PYTHONPATH.
    import mlatrace

    env["PYTHONPATH"] = str(Path(mlatrace.__file__).resolve().parent.parent)
    env.update(item.split("=", 1) for item in extra)
    return env


def serve_cmd(venv: Path, model: Path, port: int, extra: list[str]) -> list[str]:
    return [str(venv / "bin" / "vllm"), "serve", str(model), "--host", HOST, "--port", str(port),
            "--dtype", "bfloat16", "--max-model-len", "512", *extra]


def http_json(url: str, body: dict[str, Any] | None = None, timeout: float = 60.0) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - loopback only
        raw = resp.read()
    return json.loads(raw) if raw else None


def wait_ready(proc: subprocess.Popen, port: int, timeout_s: float) -> bool:
    """Poll /health until 200, the process dies, or the timeout passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2)  # noqa: S310
            return True
        except (urllib.error.URLError, ConnectionError, OSError):
            time.sleep(0.5)
    return False


def complete(port: int, model: Path, prompt: str, max_tokens: int) -> Request:
    t0 = time.monotonic()
    out = http_json(f"http://{HOST}:{port}/v1/completions",
                    {"model": str(model), "prompt": prompt, "max_tokens": max_tokens,
                     "temperature": 0.0, "ignore_eos": True})
    usage = out["usage"]
    return Request(prompt, int(usage["prompt_tokens"]), int(usage["completion_tokens"]),
                   time.monotonic() - t0)


def load(port: int, model: Path, requests: int, concurrency: int,
         max_tokens: int) -> list[Request]:
    """`requests` completions from `concurrency` clients at once (a loaded server)."""
    from concurrent.futures import ThreadPoolExecutor

    prompts = [f"{PROMPTS[i % len(PROMPTS)]} ({i})" for i in range(requests)]
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return list(pool.map(lambda p: complete(port, model, p, max_tokens), prompts))


def paced_load(port: int, model: Path, duration_s: float, rate: float, concurrency: int,
               max_tokens: int) -> list[Request]:
    """Completions from `concurrency` clients for `duration_s`, at `rate` requests a second
    in all (each client waits for its slot, so the load is bounded and ends on time)."""
    from concurrent.futures import ThreadPoolExecutor

    start = time.monotonic()
    interval = concurrency / rate

    def client(index: int) -> list[Request]:
        done: list[Request] = []
        n = 0
        while True:
            slot = start + (n + index / concurrency) * interval
            if slot - start >= duration_s:
                return done
            time.sleep(max(0.0, slot - time.monotonic()))
            done.append(complete(port, model, f"{PROMPTS[(index + n) % len(PROMPTS)]} ({n})",
                                 max_tokens))
            n += 1

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        return [r for batch in pool.map(client, range(concurrency)) for r in batch]


def stop(proc: subprocess.Popen, timeout_s: float = 60.0, signum: int = signal.SIGTERM) -> int:
    """SIGTERM the launcher (it forwards to the server's group); SIGKILL the group as a last resort."""
    proc.send_signal(signum)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


# ---------------------------------------------------------------- trace checks


def expected_seq_lens(req: Request) -> set[int]:
    """KV lengths a request's steps see: the prefill (P) then each decode (P+1 .. P+G-1)."""
    p, g = req.prompt_tokens, req.completion_tokens
    return set(range(p, p + g))


def wait_for_outlived(out: Path, timeout_s: float = 60.0) -> None:
    """Wait for the processes run.json says outlived the command (a resource tracker still
    cleaning up when the launcher ended): their process.end comes when they end."""
    try:
        pids = json.loads((out / "run.json").read_text()).get("outlived") or []
    except (OSError, ValueError):
        return
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline and _running(pid):
            time.sleep(0.1)


def _running(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:][:1] != "Z"


def check_trace(out: Path, requests: list[Request], exit_code: int | None,
                loaded: bool = False) -> tuple[list[dict], dict]:
    """What the end-to-end test asserts on a trace directory; returns (checks, facts).

    `loaded`: the requests overlapped (--load), so per-request step counts are not
    checked; every process must end with process.end instead."""
    from mlatrace.trace import open_trace

    checks: list[dict[str, Any]] = []
    facts: dict[str, Any] = {}

    def check(name: str, ok: bool, detail: str = "") -> None:
        checks.append({"name": name, "ok": bool(ok), "detail": detail})

    trace = open_trace(out)
    run = trace.run or {}
    launcher_pid = run.get("launcher_pid")
    procs: dict[int, dict[str, Any]] = {}
    for pf in trace.processes:
        kinds: dict[str, int] = {}
        calls: list[dict] = []
        metas: list[dict] = []
        errors: list[dict] = []
        dummy = 0
        for rec in pf.records():
            k = rec.get("k")
            kinds[k] = kinds.get(k, 0) + 1
            if k == "attn.call":
                calls.append(rec)
            elif k == "attn.metadata":
                metas.append(rec)
            elif k == "steady" and isinstance(rec.get("pattern"), list):
                # folded steps: their metadata at both ends of its ranges
                for entry in rec["pattern"]:
                    if entry.get("k") == "attn.metadata":
                        for end in (0, 1):
                            metas.append({**entry.get("same", {}), **{
                                name: span[end] for name, span in entry.get("range", {}).items()
                                if "." not in name}})
            elif k == "probe.error":
                errors.append(rec)
            if "dummy_run" in str(k) or (k == "mark" and "dummy_run" in str(rec.get("name"))):
                dummy += 1
        header = pf.header or {}
        procs[pf.pid or -1] = {"file": pf.name, "ppid": header.get("ppid"),
                               "argv": header.get("argv") or [], "rank": header.get("rank"),
                               "kinds": kinds, "calls": calls, "metas": metas, "errors": errors,
                               "dummy": dummy, "end": pf.end, "gaps": pf.gaps,
                               "dropped": pf.dropped, "probes": header.get("probes")}
    facts["processes"] = {pid: {k: v for k, v in p.items() if k not in ("calls", "metas")}
                          for pid, p in procs.items()}
    check("trace readable without problems", not trace.problems,
          "; ".join(str(p) for p in trace.problems[:5]))

    # Process lineage: launcher -> API server -> EngineCore -> Worker.
    def argv_has(p: dict, text: str) -> bool:
        return any(text in str(a) for a in p["argv"])

    api = [pid for pid, p in procs.items() if argv_has(p, "serve") and p["ppid"] == launcher_pid]
    check("one API server process (vllm serve, child of the launcher)", len(api) == 1,
          f"launcher {launcher_pid}; candidates {api}")
    engine: list[int] = []
    worker: list[int] = []
    if len(api) == 1:
        engine = [pid for pid, p in procs.items()
                  if p["ppid"] == api[0] and argv_has(p, "--multiprocessing-fork")]
        check("one EngineCore process (spawn child of the API server)", len(engine) == 1,
              f"candidates {engine}")
    if len(engine) == 1:
        worker = [pid for pid, p in procs.items()
                  if p["ppid"] == engine[0] and argv_has(p, "--multiprocessing-fork")]
        check("one Worker process (spawn child of EngineCore)", len(worker) == 1,
              f"candidates {worker}")
    others = {pid: p["argv"] for pid, p in procs.items() if pid not in api + engine + worker}
    check("no other multiprocessing spawn child (helpers only: resource tracker, "
          "model registry probe, inductor .so checks)",
          not any(argv_has({"argv": a}, "--multiprocessing-fork") for a in others.values()),
          f"{len(others)} helper processes")
    facts["lineage"] = {"launcher": launcher_pid, "api": api, "engine": engine, "worker": worker,
                        "helpers": {pid: " ".join(map(str, a))[:120] for pid, a in others.items()}}
    # vLLM 0.32 SIGKILLs EngineCore and its Worker at shutdown (default
    # --shutdown-timeout 0), so only the API server is sure to write process.end;
    # the recorder's periodic flush must still have kept every record.
    if len(api) == 1:
        check("API server file ends with process.end", procs[api[0]]["end"] is not None, "")
    facts["process_end"] = {pid: (p["end"] or {}).get("reason") for pid, p in procs.items()}
    if loaded:
        # The Worker is SIGKILLed ~20 ms after its SIGTERM: its process.end is the one
        # mlatrace writes when the SIGTERM arrives.
        check("every process ends with process.end",
              all(p["end"] is not None for p in procs.values()),
              "; ".join(f"pid {pid} {p['file']} ({' '.join(map(str, p['argv']))[:60]}): none"
                        for pid, p in procs.items() if p["end"] is None))
    lost = {pid: (p["gaps"], p["dropped"]) for pid, p in procs.items() if p["gaps"] or p["dropped"]}
    check("no record lost (no seq gaps, nothing dropped)", not lost, f"(gaps, dropped) {lost}")

    errors = [(pid, e) for pid, p in procs.items() for e in p["errors"]]
    check("no probe.error", not errors,
          "; ".join(f"pid {pid}: {e.get('probe')} {e.get('target')}: {e.get('error')}"
                    for pid, e in errors[:5]))
    check("exit status passed through (run.json and launcher agree)",
          exit_code is not None and run.get("exit_code") == exit_code,
          f"launcher rc {exit_code}, run.json exit_code {run.get('exit_code')}, "
          f"signal {run.get('signal')}")

    w = procs.get(worker[0]) if len(worker) == 1 else None
    if w is None:
        return checks, facts
    calls = [c for c in w["calls"] if c.get("op") == "forward_mqa"]
    decode_steps = sum(max(r.completion_tokens - 1, 0) for r in requests)
    layers = sorted({str(c.get("layer")) for c in calls})
    facts["worker"] = {"forward_mqa_calls": len(calls), "layers": layers,
                       "decode_steps_expected": decode_steps,
                       "first_call": calls[0] if calls else None,
                       "metadata_records": len(w["metas"]),
                       "first_metadata": w["metas"][0] if w["metas"] else None,
                       "dummy_run_records": w["dummy"], "kinds": w["kinds"]}
    check("attn.call op=forward_mqa from the Worker", bool(calls),
          f"{len(calls)} calls; decode steps {decode_steps} x layers")
    if not loaded:
        check("forward_mqa count = decode steps x layers",
              len(calls) == decode_steps * max(len(layers), 1),
              f"{len(calls)} calls, {decode_steps} decode steps, layers {layers}")
    check("forward_mqa records carry the layer name",
          bool(calls) and all(c.get("layer") and "layers." in str(c.get("layer")) for c in calls),
          f"layers {layers}")
    check("forward_mqa records carry shapes",
          bool(calls) and all(isinstance(c.get("shapes"), dict) and c["shapes"] for c in calls),
          f"first shapes {calls[0].get('shapes') if calls else None}")
    check("forward_mqa records capturing=false",
          bool(calls) and all(c.get("capturing") is False for c in calls), "")
    other_calls = [pid for pid, p in procs.items() if pid not in worker and p["calls"]]
    check("no attn.call outside the Worker", not other_calls, f"pids {other_calls}")

    metas = [m for m in w["metas"] if not m.get("dummy")]
    check("attn.metadata records present in the Worker", bool(metas), f"{len(metas)} records")
    if loaded:
        longest = max((r.prompt_tokens + r.completion_tokens - 1 for r in requests), default=0)
        top = max((int(m["seq_len_max"]) for m in metas if m.get("seq_len_max") is not None),
                  default=None)
        check("the longest request's last decode step is in the trace (metadata seq_len_max)",
              top == longest, f"seen {top}, expected {longest}")
    else:
        seen = {int(m["seq_len_max"]) for m in metas
                if m.get("num_reqs") == 1 and m.get("seq_len_max") is not None}
        want = set().union(*(expected_seq_lens(r) for r in requests)) if requests else set()
        facts["seq_lens"] = {"seen": sorted(seen), "expected": sorted(want)}
        check("metadata seq lens = prompt tokens + generated tokens",
              want <= seen and seen <= want,
              f"missing {sorted(want - seen)}, unexpected {sorted(seen - want)}")
        steps = sum(r.completion_tokens for r in requests)  # one prefill + (G-1) decodes each
        check("one attn.metadata per engine step (one KV-cache group)", len(metas) == steps,
              f"{len(metas)} records for {steps} steps")
    check("metadata single-request records are consistent (min = max = sum)",
          all(m.get("seq_len_min") == m.get("seq_len_max") == m.get("seq_len_sum")
              for m in metas if m.get("num_reqs") == 1), "")
    check("_dummy_run seen in the Worker", w["dummy"] > 0, f"{w['dummy']} records")
    return checks, facts


def run_report(out: Path) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, "-m", "mlatrace", "report", str(out)],
                          capture_output=True, text=True, timeout=120)
    return proc.returncode, proc.stdout + proc.stderr


# ---------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True, help="trace directory (must not hold a trace)")
    ap.add_argument("--venv", type=Path, default=Path(sys.prefix))
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-trace", action="store_true", help="plain vllm serve (no mlatrace)")
    ap.add_argument("--ready-timeout", type=float, default=600.0)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--settle", type=float, default=0.0,
                    help="seconds to wait after the last response before SIGTERM")
    ap.add_argument("--load", type=int, default=0, metavar="N",
                    help="instead of the three prompts, send N requests from --concurrency "
                         "clients, then SIGTERM at once (checks every process's process.end)")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=0.0, metavar="S",
                    help="paced load for S seconds at --rate requests/s from --concurrency clients")
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--trace-arg", action="append", default=[],
                    help="extra `mlatrace run` option (repeatable), e.g. --trace-arg=--fold=0")
    ap.add_argument("--stop-signal", choices=["TERM", "INT"], default="TERM",
                    help="signal sent to stop the server (INT: as Ctrl-C does)")
    ap.add_argument("--server-env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment variable of the server (repeatable), e.g. "
                         "--server-env=VLLM_LOG_STATS_INTERVAL=1")
    ap.add_argument("--keep-log", type=Path, default=None,
                    help="copy the server's whole log there (--json keeps its last 20 KB)")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="extra vllm serve argument (repeatable), e.g. --serve-arg=--attention-backend=CPU_MLA")
    args = ap.parse_args(argv)

    res = Result()
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="mlatrace-e2e-") as tmp_s:
        tmp = Path(tmp_s)
        port = free_port()
        cmd = serve_cmd(args.venv, args.model, port, args.serve_arg)
        if not args.no_trace:
            cmd = [str(args.venv / "bin" / "python"), "-m", "mlatrace", "run", "--out",
                   str(args.out), *args.trace_arg, "--", *cmd]
        log_path = tmp / "server.log"
        with log_path.open("wb") as log:
            proc = subprocess.Popen(cmd, env=server_env(tmp, args.server_env), stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                if not wait_ready(proc, port, args.ready_timeout):
                    print(f"server not ready (rc {proc.poll()})", file=sys.stderr)
                else:
                    res.ready_s = round(time.monotonic() - t_start, 1)
                    if args.duration:
                        res.requests = paced_load(port, args.model, args.duration, args.rate,
                                                  args.concurrency, args.max_tokens)
                    elif args.load:
                        res.requests = load(port, args.model, args.load, args.concurrency,
                                            args.max_tokens)
                    else:
                        for prompt in PROMPTS:
                            res.requests.append(complete(port, args.model, prompt,
                                                         args.max_tokens))
                    time.sleep(args.settle)
            finally:
                t_stop = time.monotonic()
                res.exit_code = stop(proc, signum=signal.Signals[f"SIG{args.stop_signal}"])
                res.stop_s = round(time.monotonic() - t_stop, 1)
        res.server_log = log_path.read_text(errors="replace")[-20000:]
        if args.keep_log is not None:
            args.keep_log.write_text(log_path.read_text(errors="replace"))
    res.total_s = round(time.monotonic() - t_start, 1)
    for r in res.requests[:10]:
        print(f"request: {r.prompt_tokens} prompt + {r.completion_tokens} generated tokens, "
              f"{r.latency_s * 1000:.0f} ms")
    if len(res.requests) > 10:
        print(f"... {len(res.requests) - 10} more requests")
    print(f"server ready {res.ready_s} s, stopped in {res.stop_s} s, rc {res.exit_code}, "
          f"total {res.total_s} s")

    if res.ready_s is None:
        print(res.server_log[-5000:], file=sys.stderr)
        res.checks.append({"name": "server became ready", "ok": False, "detail": ""})
    elif not args.no_trace:
        wait_for_outlived(args.out)
        res.checks, res.facts = check_trace(args.out, res.requests, res.exit_code,
                                            loaded=bool(args.load or args.duration))
        rc, text = run_report(args.out)
        res.facts["report"] = text
        res.checks.append({"name": "mlatrace report exits 0", "ok": rc == 0, "detail": f"rc {rc}"})
    res.ok = all(c["ok"] for c in res.checks) and res.ready_s is not None
    for c in res.checks:
        print(f"{'PASS' if c['ok'] else 'FAIL'}  {c['name']}" + (f"  [{c['detail']}]" if c["detail"] else ""))
    if args.json:
        args.json.write_text(json.dumps(asdict(res), indent=2, default=str))
    return 0 if res.ok else 1


if __name__ == "__main__":
    sys.exit(main())
