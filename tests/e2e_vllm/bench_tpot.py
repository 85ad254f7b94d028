"""Time per output token of the tiny-model vLLM CPU server, traced vs untraced.

Usage (with the vLLM venv's python):

    /work/vllm-venv/bin/python tests/e2e_vllm/bench_tpot.py --model /work/tiny-mla \
        [--pairs 2] [--rounds 5] [--max-tokens 64] [--json out.json]

Starts the server `--pairs` times plainly and `--pairs` times under
`mlatrace run`, alternating (A B A B ...) so that drift of a shared machine
hits both alike. Each server gets one warm-up request, then `--rounds` rounds
of the same prompts, one request at a time: each prompt is sent with
max_tokens=1 and with max_tokens=N (ignore_eos), and TPOT is
(latency_N - latency_1) / (N - 1): the decode steps alone, prefill and HTTP
cancelling out. (Streamed chunk times are useless here: at ~3 ms a token the
API server delivers many tokens in one burst.) vLLM's own per-request TPOT
histogram (/metrics) is reported beside it. Prints the median TPOT of each
mode and the ratio. The torch.compile cache is shared between the starts
(--cache-dir) so that start-up is not what varies.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_e2e import HOST, PROMPTS, free_port, serve_cmd, server_env, stop, wait_ready  # noqa: E402


def latency(port: int, model: Path, prompt: str, max_tokens: int) -> float:
    """Seconds for one non-streamed completion of exactly max_tokens tokens."""
    body = json.dumps({"model": str(model), "prompt": prompt, "max_tokens": max_tokens,
                       "temperature": 0.0, "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://{HOST}:{port}/v1/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    with urllib.request.urlopen(req, timeout=120) as resp:  # noqa: S310 - loopback only
        out = json.loads(resp.read())
    elapsed = time.perf_counter() - t0
    if out["usage"]["completion_tokens"] != max_tokens:
        raise RuntimeError(f"asked {max_tokens} tokens, got {out['usage']}")
    return elapsed


SERVER_METRIC = "vllm:request_time_per_output_token_seconds"


def scrape(port: int) -> tuple[float, float]:
    """(sum, count) of vLLM's own per-request TPOT histogram from /metrics."""
    with urllib.request.urlopen(f"http://{HOST}:{port}/metrics", timeout=30) as resp:  # noqa: S310
        text = resp.read().decode()
    total = count = 0.0
    for line in text.splitlines():
        if line.startswith(SERVER_METRIC + "_sum"):
            total += float(line.rsplit(" ", 1)[1])
        elif line.startswith(SERVER_METRIC + "_count"):
            count += float(line.rsplit(" ", 1)[1])
    return total, count


def one_server(args: argparse.Namespace, traced: bool, cache: Path, trace_root: Path,
               index: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="mlatrace-bench-") as tmp_s:
        tmp = Path(tmp_s)
        env = server_env(tmp)
        env["VLLM_CACHE_ROOT"] = str(cache)
        port = free_port()
        cmd = serve_cmd(args.venv, args.model, port, [])
        if traced:
            out = trace_root / f"trace-{index}"
            cmd = [str(args.venv / "bin" / "python"), "-m", "mlatrace", "run", "--out", str(out),
                   "--", *cmd]
        t0 = time.monotonic()
        with (tmp / "server.log").open("wb") as log:
            proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            try:
                if not wait_ready(proc, port, 900):
                    raise RuntimeError((tmp / "server.log").read_text()[-3000:])
                ready = time.monotonic() - t0
                latency(port, args.model, PROMPTS[0], args.max_tokens)  # warm-up
                tpots = []
                sum0, count0 = scrape(port)
                for _ in range(args.rounds):
                    for prompt in PROMPTS:
                        one = latency(port, args.model, prompt, 1)
                        full = latency(port, args.model, prompt, args.max_tokens)
                        tpots.append((full - one) / (args.max_tokens - 1))
                sum1, count1 = scrape(port)
            finally:
                rc = stop(proc)
    return {"traced": traced, "ready_s": round(ready, 1), "rc": rc,
            "tpot_ms": [round(t * 1000, 3) for t in tpots],
            "median_ms": round(statistics.median(tpots) * 1000, 3),
            "server_mean_ms": round((sum1 - sum0) / max(count1 - count0, 1) * 1000, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--venv", type=Path, default=Path(sys.prefix))
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--cache-dir", type=Path, default=None,
                    help="VLLM_CACHE_ROOT shared by all starts (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="mlatrace-bench-root-") as root_s:
        root = Path(root_s)
        cache = args.cache_dir or root / "vllm-cache"
        runs = []
        for i in range(args.pairs):
            for traced in (False, True):
                r = one_server(args, traced, cache, root, i)
                print(f"{'traced  ' if traced else 'untraced'} ready {r['ready_s']:6.1f} s  "
                      f"median TPOT {r['median_ms']:.3f} ms  server mean {r['server_mean_ms']:.3f} ms  "
                      f"rc {r['rc']}", flush=True)
                runs.append(r)
    plain = [t for r in runs if not r["traced"] for t in r["tpot_ms"]]
    traced = [t for r in runs if r["traced"] for t in r["tpot_ms"]]
    summary = {"untraced_median_ms": round(statistics.median(plain), 3),
               "traced_median_ms": round(statistics.median(traced), 3),
               "samples_each": len(plain), "max_tokens": args.max_tokens,
               "prompts": len(PROMPTS), "rounds": args.rounds, "pairs": args.pairs}
    summary["ratio"] = round(summary["traced_median_ms"] / summary["untraced_median_ms"], 3)
    for mode, flag in (("untraced", False), ("traced", True)):
        summary[f"{mode}_server_means_ms"] = [r["server_mean_ms"] for r in runs if r["traced"] is flag]
    summary["server_ratio"] = round(statistics.median(summary["traced_server_means_ms"])
                                    / statistics.median(summary["untraced_server_means_ms"]), 3)
    print(f"TPOT median: untraced {summary['untraced_median_ms']} ms, traced "
          f"{summary['traced_median_ms']} ms, ratio {summary['ratio']} "
          f"({summary['samples_each']} requests x {args.max_tokens} tokens each mode); "
          f"vLLM's own TPOT (median of per-server means): ratio {summary['server_ratio']}")
    if args.json:
        args.json.write_text(json.dumps({"summary": summary, "runs": runs}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
