"""The same graph.nodes from every source on one real capture (GPU), and the source
mlatrace's feature detection picks on that machine's torch.

samples/gpu_backends/graph_sources.py captures the graph and reads it; its H200 result is
in docs/generic-detection.md ("graph.nodes: torch's graph data or the DOT dump").
"""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "samples" / "gpu_backends"))


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not _cuda(), reason="needs a CUDA GPU")]


@pytest.fixture(scope="module")
def found():
    import graph_sources

    return graph_sources.sources()


def test_dot_reads_the_captured_kernels(found):
    assert found["dot_error"] is None
    grids = {tuple(k["grid"]) for k in found["dot"] if "scale_rows" in k["name"]}
    assert grids == {(4, 2, 1)}, found["dot"]
    assert len(found["dot"]) >= 3          # fill, GEMM, softmax and the Triton kernel


def test_detection_picks_torch_exactly_when_it_gives_grids(found):
    if found["torch_source"] is not None:
        assert found["chosen"] == "torch" and found["chosen_why"] is None
    else:
        assert found["chosen"] == "dot" and found["chosen_why"] == found["torch_why"]
        assert found["chosen_kernels"] == found["dot"]


def test_the_driver_params_agree_with_the_dot_parse(found):
    if found["driver"] is None:
        pytest.skip(f"no second reading of the template here: {found['driver_why']}")
    assert found["same_driver"] is True, (found["driver"], found["dot"])


def test_torch_graph_data_agrees_with_the_dot_parse(found):
    if found["torch_source"] is None:
        pytest.skip(f"torch {found['torch']}: {found['torch_why']}")
    assert found["same_torch"] is True, (found["torch_source"], found["dot"])
