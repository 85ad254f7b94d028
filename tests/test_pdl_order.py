"""Stream order through a programmatic dependent launch that never waits (GPU, sm_90+).

The device partition's stage 2 is a PDL secondary of stage 1. With one active split it
exits without `gdc_wait` (`Stage2Config.one_split_no_wait`), so it can finish before
stage 1 does. That is only safe if work launched after stage 2 still sees stage 1's
writes: a reader launched the ordinary way, and a reader that is itself a PDL secondary
of stage 2 and reads after its own `gdc_wait` (what a Triton kernel launched with
`launch_pdl=True` after the decode would do). This test checks both with a slow primary,
a secondary that records what it saw (proof that it overlapped the primary) and the
reader, eagerly and in a CUDA graph.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
triton = pytest.importorskip("triton")
tl = triton.language


def _sm90() -> bool:
    return (torch.cuda.is_available() and torch.version.hip is None
            and torch.cuda.get_device_capability()[0] >= 9)


@triton.jit
def _slow_primary(flag, sink, SPIN: tl.constexpr):
    tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(sink)
    for _ in range(SPIN):
        x = x * 1.0000001 + 1.0
    tl.store(sink, x)
    tl.store(flag, 1)


@triton.jit
def _secondary_without_wait(flag, early, i):
    tl.store(early + i, tl.load(flag, volatile=True))


@triton.jit
def _reader(flag, seen, i, WAIT: tl.constexpr):
    if WAIT:
        tl.extra.cuda.gdc_wait()
    tl.store(seen + i, tl.load(flag, volatile=True))


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an NVIDIA GPU with PDL (sm_90+)")
@pytest.mark.parametrize("reader", ["ordinary", "pdl"])
@pytest.mark.parametrize("mode", ["stream", "graph"])
def test_launch_after_a_non_waiting_pdl_secondary_sees_the_primary_done(mode, reader):
    trials = 16
    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    sink = torch.ones(1, dtype=torch.float32, device="cuda")
    early = torch.full((trials,), -1, dtype=torch.int32, device="cuda")
    seen = torch.full((trials,), -1, dtype=torch.int32, device="cuda")

    def trial(i: int) -> None:
        flag.zero_()
        _slow_primary[(1,)](flag, sink, SPIN=200_000)
        _secondary_without_wait[(1,)](flag, early, i, launch_pdl=True)
        if reader == "pdl":
            _reader[(1,)](flag, seen, i, WAIT=True, launch_pdl=True)
        else:
            _reader[(1,)](flag, seen, i, WAIT=False)

    if mode == "stream":
        for i in range(trials):
            trial(i)
    else:
        trial(0)   # compile outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(trials):
                trial(i)
        early.fill_(-1)
        seen.fill_(-1)
        graph.replay()
    torch.cuda.synchronize()
    # the secondary ran while the primary spun (else this test proves nothing) ...
    assert (early == 0).sum().item() >= trials // 2, early.tolist()
    # ... and the launch after it still waited for the primary
    assert seen.tolist() == [1] * trials
