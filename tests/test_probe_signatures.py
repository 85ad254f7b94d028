"""Drift kept current: every release a pack names in `checked` ("vllm 0.33.0 (PyPI wheel...)")
has its snapshot in tests/probe_signatures.json (made by tests/make_probe_signatures.py from
those wheels), and in it every probe of the pack finds a target with its parameters. A
version outside a pack's range is "other version", never drift."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from mlatrace.probe import default_pack_paths
from mlatrace.probe.commands import check_static
from mlatrace.probe.packs import load_pack

HERE = Path(__file__).parent
SNAPSHOT = json.loads((HERE / "probe_signatures.json").read_text())
PACKS = [load_pack(p) for p in default_pack_paths()]


def _maker():
    spec = importlib.util.spec_from_file_location("make_probe_signatures",
                                                  HERE / "make_probe_signatures.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MAKER = _maker()
NAMED = [(pack, lib, version) for pack in PACKS for lib, version in MAKER.named_versions(pack)]


def test_packs_name_the_releases_they_were_checked_against():
    names = {pack.name for pack, _, _ in NAMED}
    for name in ("vllm_runner_v2", "vllm_triton_attn", "sglang_triton", "sglang_dsv4",
                 "sglang_fa3", "flashinfer", "vllm_cudagraph", "sglang_legacy_runner"):
        assert name in names, name


@pytest.mark.parametrize("pack, library, version", NAMED,
                         ids=[f"{p.name}-{v}" for p, _, v in NAMED])
def test_every_probe_finds_its_target_in_the_snapshot_of_each_named_version(pack, library,
                                                                              version):
    snapshot = SNAPSHOT["snapshots"].get(f"{library} {version}")
    assert snapshot is not None, (f"{pack.name} names {library} {version}: refresh with "
                                  "python tests/make_probe_signatures.py --wheels DIR --download")
    results = check_static([pack], snapshot["targets"], {library: version})
    assert not [r for r in results if r.status == "drift"]
    if {r.status for r in results} == {"other version"}:
        pytest.fail(f"{pack.name} names {library} {version} but its range excludes it")
    for spec in pack.probes:
        mine = [r for r in results if r.probe == spec.name
                and r.target.split(".")[0].split(":")[0] == library]
        if not mine:
            continue   # a probe of another library's target (aiter's, torch's)
        assert any(r.status == "ok" for r in mine), (f"{pack.name}.{spec.name}: no target in "
                                                    f"{library} {version}: {mine}")


def test_a_version_outside_the_range_is_other_version_not_drift():
    legacy = next(p for p in PACKS if p.name == "sglang_legacy_runner")
    results = check_static([legacy], SNAPSHOT["snapshots"]["sglang 0.5.23"]["targets"],
                           {"sglang": "0.5.23"})
    assert {r.status for r in results} == {"other version"}
    runner = next(p for p in PACKS if p.name == "sglang")
    results = check_static([runner], SNAPSHOT["snapshots"]["sglang 0.5.13"]["targets"],
                           {"sglang": "0.5.13"})
    assert {r.status for r in results} == {"other version"}


def test_a_target_missing_from_its_versions_snapshot_fails(tmp_path):
    pack = next(p for p in PACKS if p.name == "vllm_runner_v2")
    targets = dict(SNAPSHOT["snapshots"]["vllm 0.33.0"]["targets"])
    gone = "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.run_fullgraph"
    targets[gone] = {"status": "absent", "detail": "run_fullgraph not found in CudaGraphManager"}
    targets["vllm.v1.worker.gpu.cudagraph_utils:ModelCudaGraphManager.run_fullgraph"] = {
        "status": "absent", "detail": "gone"}
    results = check_static([pack], targets, {"vllm": "0.33.0"})
    assert [r.status for r in results if r.probe == "full_replay"] == ["drift", "drift"]


def test_named_versions_parse_the_checked_entries():
    legacy = next(p for p in PACKS if p.name == "sglang_legacy_runner")
    assert MAKER.named_versions(legacy) == [("sglang", "0.5.9"), ("sglang", "0.5.12"),
                                            ("sglang", "0.5.13")]
