"""torch_sync: host reads of device memory recorded as `sync` (MLT004), cheaply."""

from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")

from mlatrace.probe.packs import shipped_pack_dir  # noqa: E402

PACK = shipped_pack_dir() / "torch_sync.toml"


@pytest.fixture
def traced(traced_with):
    return traced_with([PACK])


def test_inherited_tensor_methods_are_patched_and_restored(traced):
    assert "item" in torch.Tensor.__dict__      # patched on the Python class
    assert torch.tensor(3).item() == 3          # CPU tensor: no sync, nothing recorded
    assert torch.arange(3).tolist() == [0, 1, 2]
    records = traced()
    assert not [r for r in records if r["k"] in ("sync", "probe.error")]
    assert "item" not in torch.Tensor.__dict__  # inherited from TensorBase again
    assert torch.tensor(5).item() == 5


def test_cuda_synchronize_is_recorded_with_its_call_site(traced):
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    else:
        with pytest.raises((AssertionError, RuntimeError)):  # no CUDA here: torch says so
            torch.cuda.synchronize()
    syncs = [r for r in traced() if r["k"] == "sync"]
    assert [s["op"] for s in syncs] == ["synchronize"]
    assert syncs[0]["capturing"] is False and syncs[0]["gid"] is None
    # (a file below the working directory is named relative to it)
    assert os.path.abspath(syncs[0]["where"].rsplit(":", 1)[0]) == __file__


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_item_of_a_cuda_tensor_is_a_sync(traced):
    value = torch.ones(4, device="cuda").sum().item()
    assert value == 4.0
    syncs = [r for r in traced() if r["k"] == "sync"]
    assert [s["op"] for s in syncs] == ["item"]
