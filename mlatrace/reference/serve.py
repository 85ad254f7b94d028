"""The reference decode program `mlatrace run` traces: capture at a dummy length, decode long.

    python -m mlatrace.reference.serve --policy legacy --ctx 2048 --steps 8

Builds the engine (`mlatrace.reference.engine`), captures one graph per batch size at
`--capture-len` (default 1, like vLLM's dummy run), then decodes `--steps` steps with
sequence lengths around `--ctx`, growing by one per step, and prints each step's time
and the split count the graph froze next to the one the real length would need.
`--lengths 1024,8192,32768` decodes `--steps` steps at each listed length in turn instead
(one captured graph replayed across lengths, so its replay time follows the work).
`--batch-mix 1,3,8,12` gives each step its batch size in turn (cycled) and
`--capture-sizes 1,2,4,8` the batch sizes captured (default: `--batch`): a batch is
padded up to the smallest captured size that holds it, and one above the largest
captured size runs eagerly, as vLLM's dispatcher does.
`--check` compares every step with a float64 eager reference: the frozen one-split graph
of the legacy policy is still correct, only slow (a performance bug, not a wrong result).
`--bench` prints one JSON line (median step time over the replays; CUDA events on GPU)
for `mlatrace bench overhead`; `--step-delay S` sleeps S seconds after each step (a
server that stays up, for `mlatrace watch`); `--sync-debug` turns torch's sync debug mode to "error"
while steps run, so any device-to-host sync in the step path (probes included) fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator

import torch

from mlatrace.reference import policies
from mlatrace.reference.engine import (
    GRAPH_MODES,
    EngineConfig,
    ReferenceModelRunner,
    unprobed_num_kv_splits,
)

CHECK_TOLERANCE = {torch.float32: 1e-3, torch.bfloat16: 5e-2, torch.float16: 1e-2}
"""Max |out - ref| / max |ref| per step, by engine dtype."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m mlatrace.reference.serve",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="legacy",
                        help="split policy: legacy, bucketed, device or fixed:N")
    parser.add_argument("--ctx", type=int, default=2048, help="KV length of the first step")
    parser.add_argument("--steps", type=int, default=8,
                        help="decode steps after capture (with --lengths: per length)")
    parser.add_argument("--lengths", type=_lengths, default=None, metavar="L1,L2,...",
                        help="KV lengths to decode at in turn, --steps steps each "
                             "(replaces --ctx)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--batch-mix", type=_lengths, default=None, metavar="B1,B2,...",
                        help="batch size of each step in turn, cycled (replaces --batch "
                             "for the steps; default: every step at --batch)")
    parser.add_argument("--capture-sizes", type=_lengths, default=None, metavar="S1,S2,...",
                        help="batch sizes captured (default: --batch); a step pads up to "
                             "the next one, and runs eagerly above the largest")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256, help="model width of the projections")
    parser.add_argument("--capture-len", type=int, default=1,
                        help="dummy sequence length of the capture run (vLLM: 1)")
    parser.add_argument("--capture-hint", type=int, default=None,
                        help="min_kv_seq_len hint used at capture (a representative length such as "
                             "16384 captures enough splits)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--dtype", choices=("auto", "fp32", "bf16"), default="auto",
                        help="auto: fp32 on CPU, bf16 on CUDA")
    parser.add_argument("--backend", choices=("auto", "torch", "triton"), default="auto")
    parser.add_argument("--graph", choices=GRAPH_MODES, default="full")
    parser.add_argument("--check", action="store_true",
                        help="compare every step with a float64 eager reference")
    parser.add_argument("--bench", action="store_true",
                        help="print one JSON line with the median step time")
    parser.add_argument("--warmup", type=int, default=5, help="untimed steps before --bench")
    parser.add_argument("--sync-debug", action="store_true",
                        help='torch.cuda.set_sync_debug_mode("error") while steps run (CUDA)')
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--step-delay", type=float, default=0.0,
                        help="seconds to sleep after each decode step (a long-running server "
                             "for `mlatrace watch`)")
    args = parser.parse_args(argv)
    if args.policy not in policies.POLICIES and not args.policy.startswith("fixed:"):
        parser.error(f"unknown --policy {args.policy!r}")
    if min(args.ctx, args.steps, args.batch, args.heads, args.layers, args.capture_len) < 1:
        parser.error("--ctx, --steps, --batch, --heads, --layers, --capture-len must be >= 1")
    if args.step_delay < 0:
        parser.error("--step-delay must be >= 0")
    largest = max_batch(args)
    if args.ctx - (largest - 1) < 1:
        parser.error("--ctx must be at least --batch (and every --batch-mix size)")
    if args.lengths and min(args.lengths) < largest:
        parser.error("every --lengths value must be at least --batch (and every --batch-mix "
                     "size)")
    return args


def max_batch(args: argparse.Namespace) -> int:
    """The largest batch any step holds."""
    return max(args.batch_mix) if args.batch_mix else args.batch


def step_batch(args: argparse.Namespace, step: int) -> int:
    """Step `step`'s batch size: --batch-mix in turn, else --batch."""
    return args.batch_mix[step % len(args.batch_mix)] if args.batch_mix else args.batch


def capture_sizes(args: argparse.Namespace) -> tuple[int, ...]:
    return tuple(args.capture_sizes) if args.capture_sizes else (args.batch,)


def _lengths(text: str) -> tuple[int, ...]:
    """`1024,8192,32768` -> (1024, 8192, 32768): positive integers, comma-separated."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"lengths must be positive integers: {text!r}")
    return values


def schedule(args: argparse.Namespace, total_steps: int) -> list[list[int]]:
    """Every step's sequence lengths: around --ctx, or --steps steps at each of --lengths
    (warm-up steps, with --bench, at the first length)."""
    if not args.lengths:
        return [step_seq_lens(args.ctx, step_batch(args, step), step)
                for step in range(total_steps)]
    warmup = total_steps - args.steps * len(args.lengths)
    out = [step_seq_lens(args.lengths[0], step_batch(args, step), step)
           for step in range(warmup)]
    for length in args.lengths:
        out += [step_seq_lens(length, step_batch(args, len(out)), step)
                for step in range(args.steps)]
    return out


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("serve: --device cuda but CUDA is not available")
    return torch.device(name)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return {"fp32": torch.float32, "bf16": torch.bfloat16}[name]


@contextlib.contextmanager
def sync_debug(enabled: bool, device: torch.device) -> Iterator[None]:
    """Make any CUDA sync in the block raise (only where asked, only on CUDA)."""
    if not enabled or device.type != "cuda":
        yield
        return
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode(previous)


def step_seq_lens(ctx: int, batch: int, step: int) -> list[int]:
    """Request b of step `step` has ctx - b + step tokens (all grow by one per step)."""
    return [ctx - b + step for b in range(batch)]


def build_runner(args: argparse.Namespace, device: torch.device, total_steps: int
                 ) -> ReferenceModelRunner:
    longest = max(args.lengths) if args.lengths else args.ctx
    max_seq_len = max(longest + total_steps + 1, args.capture_len)
    config = EngineConfig(
        batch_sizes=capture_sizes(args), max_num_reqs=max_batch(args), num_heads=args.heads, num_layers=args.layers,
        hidden_size=args.hidden, max_seq_len=max_seq_len, policy=args.policy,
        backend=args.backend, capture_len=args.capture_len, capture_hint=args.capture_hint,
        graph_mode=args.graph, device=device.type, dtype=resolve_dtype(args.dtype, device),
        seed=args.seed)
    return ReferenceModelRunner(config)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device = resolve_device(args.device)
    warmup = args.warmup if args.bench else 0
    total_steps = warmup + args.steps * (len(args.lengths) if args.lengths else 1)
    runner = build_runner(args, device, total_steps)
    dtype = runner.config.dtype

    # Inputs of every step prepared up front: hidden states on the device, sequence
    # lengths in (pinned) host rows that stay untouched while their copy is in flight.
    gen = torch.Generator().manual_seed(args.seed + 7)
    widest = max_batch(args)
    hidden = torch.randn(total_steps, widest, args.hidden, generator=gen)
    hidden = hidden.to(device=device, dtype=dtype)
    seq_lens = torch.empty(total_steps, widest, dtype=torch.int32,
                           pin_memory=device.type == "cuda")
    batches = [step_batch(args, step) for step in range(total_steps)]
    for step, lens in enumerate(schedule(args, total_steps)):
        seq_lens[step, :len(lens)] = torch.tensor(lens)
    if args.batch_mix:   # each step's rows only (views: the pinned rows stay put)
        hidden = [hidden[step, :b] for step, b in enumerate(batches)]
        seq_lens = [seq_lens[step, :b] for step, b in enumerate(batches)]

    started = time.perf_counter()
    runner.capture_model()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    capture_s = time.perf_counter() - started
    frozen = runner.captured_num_kv_splits(max(capture_sizes(args)))
    if not args.bench:
        print(f"mlatrace reference serve: device={device.type} dtype={str(dtype).removeprefix('torch.')} "
              f"policy={args.policy} graph={args.graph} "
              + (f"batch-mix={','.join(map(str, args.batch_mix))} " if args.batch_mix
                 else f"batch={args.batch} ")
              + f"heads={args.heads} "
              f"layers={args.layers} "
              + (f"lengths={','.join(map(str, args.lengths))} " if args.lengths
                 else f"ctx={args.ctx} ")
              + f"steps={args.steps} "
              f"capture_len={args.capture_len}")
        if args.graph == "none":
            print("eager: no graph captured")
        elif args.graph == "breakable":
            capture = runner.captured_entry(max(capture_sizes(args))).capture
            print(f"captured batch sizes {_sizes(capture_sizes(args))} in {capture_s:.2f} s as "
                  f"{capture.num_graphs} graph segments + {capture.num_eager_breaks} eager MLA "
                  f"calls (split count chosen every step)")
        else:
            print(f"captured batch sizes {_sizes(capture_sizes(args))} in {capture_s:.2f} s; "
                  f"NUM_KV_SPLITS frozen per layer: {frozen}")

    if args.bench:
        return run_bench(args, runner, device, hidden, seq_lens, warmup, frozen)

    step_ms: list[float] = []
    failures = 0
    for step in range(total_steps):
        lens = seq_lens[step]
        t0 = time.perf_counter()
        with sync_debug(args.sync_debug, device):
            out = runner.execute_model(hidden[step], lens)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        step_ms.append((time.perf_counter() - t0) * 1e3)
        batch = int(lens.shape[0])
        padded = runner.cudagraph_dispatcher.padded_size(batch)
        needed = unprobed_num_kv_splits(args.policy, batch, 1, args.heads, int(lens.min()))
        used = used_splits(runner, args, frozen if padded is not None else None)
        line = (f"step {step:3d}  seq_len max {int(lens.max()):7d}  splits used {used:3d} "
                f"(the real length needs {needed:3d})  {step_ms[-1]:8.2f} ms")
        if args.batch_mix:
            line += (f"  batch {batch:3d} " + (
                "eager (graphs off)" if padded is None and args.graph == "none"
                else "eager (above the largest captured size)" if padded is None
                else f"graph of size {padded}" + (f" (+{padded - batch} padding)"
                                                  if padded > batch else "")))
        if args.check:
            ref = runner.reference_output(hidden[step], lens.tolist())
            err = float((out.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30))
            ok = err <= CHECK_TOLERANCE.get(dtype, 1e-2)
            failures += 0 if ok else 1
            line += f"  check rel err {err:.1e} {'ok' if ok else 'FAIL'}"
        print(line, flush=True)
        if args.step_delay > 0:
            time.sleep(args.step_delay)
    print(f"median step {statistics.median(step_ms):.2f} ms over {len(step_ms)} steps")
    if args.check:
        print("check: all steps match the float64 reference" if not failures
              else f"check: {failures} step(s) differ from the float64 reference")
    return 1 if failures else 0


def _sizes(sizes: tuple[int, ...]) -> str:
    return ",".join(map(str, sorted(sizes)))


def used_splits(runner: ReferenceModelRunner, args: argparse.Namespace,
                frozen: dict[int, int] | None) -> int:
    """Split count the last step ran with: frozen in a full graph, else chosen this step."""
    if args.graph == "full" and frozen:
        return max(frozen.values())
    return max(runner.impl.last_num_kv_splits.values())


def run_bench(args: argparse.Namespace, runner: ReferenceModelRunner, device: torch.device,
              hidden: torch.Tensor, seq_lens: torch.Tensor, warmup: int,
              frozen: dict[int, int] | None) -> int:
    """Median step time over many replays; GPU time from CUDA events read after the loop."""
    for step in range(warmup):
        runner.execute_model(hidden[step], seq_lens[step])
    steps = range(warmup, seq_lens.shape[0])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in steps]
        started = time.perf_counter()
        with sync_debug(args.sync_debug, device):
            for (begin, end), step in zip(events, steps, strict=True):
                begin.record()
                runner.execute_model(hidden[step], seq_lens[step])
                end.record()
        torch.cuda.synchronize(device)
        wall_s = time.perf_counter() - started
        step_us = [begin.elapsed_time(end) * 1e3 for begin, end in events]
    else:
        step_us = []
        started = time.perf_counter()
        for step in steps:
            t0 = time.perf_counter()
            runner.execute_model(hidden[step], seq_lens[step])
            step_us.append((time.perf_counter() - t0) * 1e6)
        wall_s = time.perf_counter() - started
    result = {
        "bench": "serve", "device": device.type,
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "policy": args.policy, "graph": args.graph, "batch": args.batch, "heads": args.heads,
        "layers": args.layers, "ctx": args.ctx, "steps": args.steps,
        "sync_debug": bool(args.sync_debug and device.type == "cuda"),
        "frozen_num_kv_splits": frozen and max(frozen.values()),
        "median_step_us": statistics.median(step_us),
        "wall_step_us": wall_s * 1e6 / len(steps),
    }
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
