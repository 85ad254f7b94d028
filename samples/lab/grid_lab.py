"""Session 6 lab (run 41): what a fixed launch budget costs by itself at 1 token.

Run 40 timed the device partition at 1 token (one active program, the rest exit after
reading seq_info) as one graph node with 16 and 132 programs: 4.81 and 4.96 us, against
one split's single program at 4.67. This times kernels that do no decode work at all
through the same graph timer, with grids of 1, 16 and 132 programs: an empty Triton
kernel, one whose programs read a length word first (what an idle stage-1 program does),
and the same read in a Gluon kernel holding 160 KiB of shared memory (one program per
SM, like stage 1). If the 132-program grids cost about 0.3 us more than one program,
the fixed budget itself is the gap at short lengths, whatever the kernel does.

  python3 samples/lab/grid_lab.py OUT_JSON"""

import json
import sys

import torch
import triton
import triton.language as tl
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from mlatrace.bench import splits_bench as sb


@triton.jit
def _empty(x, READ: tl.constexpr):
    pid = tl.program_id(0)
    if READ:
        v = tl.load(x)
        if pid == 0:
            tl.store(x + 1, v)
    elif pid == 0:
        tl.store(x + 1, 1)


@gluon.jit
def _empty_smem(x):
    layout: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    buf = gl.allocate_shared_memory(
        gl.bfloat16, [5, 64, 256], gl.NVMMASharedLayout.get_default_for([64, 256], gl.bfloat16))
    v = gl.load(x)
    if gl.program_id(0) == 0:
        buf.index(0).store(gl.zeros([64, 256], gl.bfloat16, layout=layout))
        gl.store(x + 1, v)


cfg = sb.Config(lengths=(1,), sweep=(), min_replays=50, max_replays=3000,
                seconds_per_point=0.3, tune=False)
timer = sb.Timer(cfg)
words = [torch.ones(2, dtype=torch.int32, device="cuda") for _ in range(64)]
kernels = {
    "empty": lambda g, w: _empty[(g,)](w, READ=False),
    "read": lambda g, w: _empty[(g,)](w, READ=True),
    "read_smem160k": lambda g, w: _empty_smem[(g,)](w, num_warps=4),
}
rows = {}
for _ in range(2):
    for name, launch in kernels.items():
        for grid in (1, 16, 132):
            us = timer.per_call_us([lambda w=w, g=grid, k=launch: k(g, w) for w in words])["us"]
            key = f"{name}@{grid}"
            rows[key] = min(rows.get(key, 1e9), us)
for key, us in rows.items():
    print(f"{key:>20}: {us:.3f} us per call", flush=True)
with open(sys.argv[1], "w") as f:
    json.dump(rows, f, indent=1)
