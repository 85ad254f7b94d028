"""In one traced process: decode step time with the probes at work vs without them.

    mlatrace bench overhead --in-process --graph breakable,none
    (each mode runs: mlatrace run -- python -m mlatrace.bench.overhead_ab --graph G)

Runs the reference engine (the shapes of `mlatrace bench overhead`) and alternates
blocks of steps with the probes at work and without them, so both halves share the
process, its caches and the machine's state; a host whose speed drifts between runs
moves both halves alike. Without them means, by `--baseline`:

- `unpatched` (default): every patch taken off, the originals back where the probes
  were (`probe.engine.Engine.patches`): the traced/untraced ratio of `bench overhead`,
  wrappers included, in one process;
- `passthrough`: the wrappers stay and pass every call straight through
  (`probe.engine.STATE.active`): what the probes' work costs beyond bare wrappers.

Prints one JSON line: median GPU time (CUDA events) and wall time (host clock over each
block, synchronised at its ends) per step, each half (`active_*`, `off_*`), and the main
thread's CPU time per step.

`--passthrough GLOB,...` passes through only the probes whose names match (fnmatch, e.g.
`triton_launch.*` or `reference.forward_mqa`) in the off half, the others staying at work
in both: what those probes alone cost per step, beyond their wrappers.

`--count-entries` counts Python function entries (`sys.setprofile` "call" events of the
stepping thread) instead of timing: the mean per step over each half's blocks, each block after
SETTLE_STEPS uncounted steps (the probes at work in the first half of the blocks, then
unpatched), and `entries_added`, their difference (a timing-free
figure of what the probes run per step; tests/test_bench_overhead.py bounds it).

`--host-only` replaces the device work (the torch stage bodies and projections) by
no-ops, so that what is left is the step's Python, where the probes' share shows on a
CPU box.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import statistics
import sys
import time
from typing import Any

import torch

from mlatrace.probe import engine
from mlatrace.reference import serve

SETTLE_STEPS = 4      # --count-entries: steps run uncounted after each switch
# --count-entries: steps before the first block, past the first whole-step look of the
# step-aside (sampling.StepAside), after which its probes settle again once
WARMUP_COUNTED = 100


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--graph", default="breakable")
    parser.add_argument("--policy", default=None)
    parser.add_argument("--blocks", type=int, default=40)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--ctx", default="16384")
    parser.add_argument("--host-only", action="store_true")
    parser.add_argument("--layers", type=int, default=16,
                        help="decoder layers of the model (16; 32 and 61 are real shapes)")
    parser.add_argument("--passthrough", default="",
                        help="comma-separated globs of probe names passed through in the off "
                             "half (default: every probe)")
    parser.add_argument("--baseline", choices=("unpatched", "passthrough"), default="unpatched",
                        help="the off half: the originals back in place of every patch, or "
                             "the wrappers passing calls through")
    parser.add_argument("--count-entries", action="store_true",
                        help="count Python function entries per step in each half "
                             "(sys.setprofile) instead of timing the steps")
    options = parser.parse_args()
    if options.host_only:
        from mlatrace.reference import engine as reference_engine
        from mlatrace.reference import mla

        mla.stage1_torch = mla.stage2_torch = lambda **kwargs: None
        reference_engine._project = lambda *args, **kwargs: None
        reference_engine._residual_project = lambda *args, **kwargs: None
    if not engine.STATE.active:
        raise SystemExit("mlatrace.bench.overhead_ab: run it under `mlatrace run` "
                         "(no probes installed)")
    policy = options.policy or ("bucketed" if options.graph == "breakable" else "device")
    args = serve.parse_args(["--device", options.device, "--graph", options.graph,
                             "--policy", policy, "--ctx", options.ctx, "--batch", "4",
                             "--heads", "16", "--layers", str(options.layers), "--hidden", "1024"])
    device = serve.resolve_device(args.device)
    warmup = WARMUP_COUNTED if options.count_entries else 20
    total = warmup + options.blocks * (options.block + SETTLE_STEPS)
    runner = serve.build_runner(args, device, total)
    dtype = runner.config.dtype
    hidden = torch.randn(total, 4, 1024).to(device=device, dtype=dtype)
    lens = torch.empty(total, 4, dtype=torch.int32, pin_memory=device.type == "cuda")
    for step in range(total):
        lens[step] = torch.tensor(serve.step_seq_lens(int(options.ctx), 4, step))
    runner.capture_model()
    for step in range(warmup):
        runner.execute_model(hidden[step], lens[step])
    cuda = device.type == "cuda"
    chosen = _chosen_runtimes(options.passthrough)
    unpatch = options.baseline == "unpatched" and chosen is None
    halves: dict[bool, dict[str, list[float]]] = {
        active: {"gpu": [], "wall": [], "cpu": [], "entries": []} for active in (True, False)}
    step = warmup
    for block in range(options.blocks):
        # counting: every block with the probes at work first (a count drifts with no
        # clock; switching back and forth would count the steps that re-settle)
        active = block < options.blocks // 2 if options.count_entries else block % 2 == 0
        if unpatch:
            _set_patched(active)
        elif chosen is None:
            engine.STATE.active = active
        else:
            for runtime, disabled in chosen:
                runtime.disabled = disabled or not active
        if cuda:
            torch.cuda.synchronize(device)
            events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                      for _ in range(options.block)]
        started, cpu_started = time.perf_counter(), time.thread_time()
        if options.count_entries:
            for _ in range(SETTLE_STEPS):      # the steps right after a switch: uncounted
                runner.execute_model(hidden[step], lens[step])
                step += 1
            halves[active]["entries"].append(
                _count_entries(runner, hidden, lens, step, options.block))
            step += options.block
            continue
        for index in range(options.block):
            if cuda:
                events[index][0].record()
            runner.execute_model(hidden[step], lens[step])
            if cuda:
                events[index][1].record()
            step += 1
        if cuda:
            torch.cuda.synchronize(device)
        halves[active]["wall"].append((time.perf_counter() - started) / options.block * 1e6)
        halves[active]["cpu"].append((time.thread_time() - cpu_started) / options.block * 1e6)
        if cuda:
            halves[active]["gpu"] += [a.elapsed_time(b) * 1e3 for a, b in events]
    engine.STATE.active = True
    if unpatch:
        _set_patched(True)
    for runtime, disabled in chosen or ():
        runtime.disabled = disabled
    result = {"bench": "overhead_ab", "graph": options.graph, "policy": policy,
              "baseline": "unpatched" if unpatch else "passthrough",
              "passthrough": [runtime.spec.qualname for runtime, _ in chosen]
              if chosen is not None else "all",
              "device": device.type, "block": options.block, "blocks": options.blocks,
              "layers": options.layers}
    for label, active in (("active", True), ("off", False)):    # off: per "baseline"
        for clock in ("gpu", "wall", "cpu"):
            values = halves[active][clock]
            result[f"{label}_{clock}_us"] = statistics.median(values) if values else None
    if options.count_entries:
        for label, active in (("active", True), ("off", False)):
            counted = halves[active]["entries"]
            result[f"{label}_entries"] = sum(counted) / (len(counted) * options.block)
            result[f"{label}_entries_blocks"] = [n / options.block for n in counted]
        result["entries_added"] = result["active_entries"] - result["off_entries"]
    for clock in ("gpu", "wall", "cpu"):
        if result[f"off_{clock}_us"]:
            result[f"ratio_{clock}"] = result[f"active_{clock}_us"] / result[f"off_{clock}_us"]
    print(json.dumps(result))
    return 0


def _count_entries(runner: Any, hidden: torch.Tensor, lens: torch.Tensor, step: int,
                   steps: int) -> int:
    """Python function entries (sys.setprofile "call" events) of this thread over
    `steps` steps from `step` (the flush thread's work, which runs when its timer says,
    is left out: the count is the same on every run)."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        for index in range(step, step + steps):
            runner.execute_model(hidden[index], lens[index])
    finally:
        sys.setprofile(None)
    return count


_unpatched: list[tuple[Any, str, Any, Any]] = []   # (site, attr, replacement, original)


def _set_patched(patched: bool) -> None:
    """Every patch of the installed engine in place (True) or taken off (False), on its
    owner and in every module that imported the replacement by name.

    Wrappers a stepped-aside probe took off for the rest of a step are put back first,
    so that each owner holds either the replacement or the original. Putting the patches
    back restores exactly the sites taken off (a module that holds the original under
    the same name, as imported before the probes, keeps it)."""
    from mlatrace import probe
    from mlatrace.probe import graphs, sampling

    graphs.put_back_wrappers()
    if patched:
        while _unpatched:
            site, attr, replacement, original = _unpatched.pop()
            holds = (site.__dict__.get(attr) if isinstance(site, type)
                     else getattr(site, attr, None))
            if holds is original:
                setattr(site, attr, replacement)
        return
    installed = probe.installed()
    for patch in installed.patches if installed is not None else ():
        if patch.replacement is patch.original:
            continue
        for owner, attr in [(patch.owner, patch.attr),
                            *sampling.imported_as(patch.attr, patch.replacement, patch.owner)]:
            holds = (owner.__dict__.get(attr) if isinstance(owner, type)
                     else getattr(owner, attr, None))
            if holds is patch.replacement:
                setattr(owner, attr, patch.original)
                _unpatched.append((owner, attr, patch.replacement, patch.original))


def _chosen_runtimes(globs: str) -> list[tuple[engine.ProbeRuntime, bool]] | None:
    """The probes --passthrough names, each with its own disabled flag (None: every probe)."""
    patterns = [glob.strip() for glob in globs.split(",") if glob.strip()]
    if not patterns:
        return None
    from mlatrace import probe

    installed = probe.installed()
    runtimes = installed.runtimes if installed is not None else []
    chosen = [(runtime, runtime.disabled) for runtime in runtimes
              if any(fnmatch.fnmatchcase(runtime.spec.qualname, glob) for glob in patterns)]
    if not chosen:
        raise SystemExit(f"mlatrace.bench.overhead_ab: --passthrough {globs!r} names no "
                         "installed probe")
    return chosen


if __name__ == "__main__":
    raise SystemExit(main())
