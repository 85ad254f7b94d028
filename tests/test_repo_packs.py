"""Every TOML pack in the repository loads through the real loader and applies here."""

from __future__ import annotations

from pathlib import Path

import pytest

from mlatrace.probe.packs import load_pack, version_problem

ROOT = Path(__file__).resolve().parent.parent


def repo_packs() -> list[Path]:
    """The pack files under probes/, samples/ and tests/: TOML files with a [pack] table."""
    found = []
    for top in ("probes", "samples", "tests"):
        for path in sorted((ROOT / top).rglob("*.toml")):
            if any(line.strip() == "[pack]" for line in path.read_text().splitlines()):
                found.append(path)
    return found


def test_the_repository_has_packs_outside_probes() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in repo_packs()}
    assert "samples/gpu_backends/steps.toml" in names
    assert sum(n.startswith("probes/") for n in names) >= 10


@pytest.mark.parametrize("path", repo_packs(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_pack_loads(path: Path) -> None:
    pack = load_pack(path)
    assert pack.probes, f"{path}: no probe"
    if pack.library == "mlatrace":  # a pack of this tree applies to this tree
        assert version_problem(pack) is None, version_problem(pack)
