"""Refresh tests/probe_signatures.json: the static signatures of the shipped packs' vLLM,
SGLang and FlashInfer targets, read from the released wheels of every version a pack names
in its `checked` entries ("sglang 0.5.9, 0.5.12, 0.5.13 (PyPI wheels ...)"); never imported,
never copied. One command:

    python tests/make_probe_signatures.py --wheels /tmp/wheels --download

Per named version it uses WHEELS/<dist>-<version>/*.whl (fetched there with
`pip download --no-deps <dist>==<version>` when --download is given and none is there),
unpacks its .py files and dist-info into WHEELS/<dist>-<version>/src, and records every
shipped target of that library. The snapshot keeps one entry per version ("snapshots"),
plus "releases"/"targets" for the newest release of each library.
`tests/test_probe_signatures.py` fails when a pack's target is missing from the snapshot of a
version it names.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

from mlatrace.probe import default_pack_paths
from mlatrace.probe.packs import Pack, load_pack
from mlatrace.probe.source import SIGNATURES_SCHEMA, signatures, source_versions

OUT = Path(__file__).parent / "probe_signatures.json"
DISTS = {"vllm": "vllm", "sglang": "sglang", "flashinfer": "flashinfer-python"}
"""library (as packs name it) -> the PyPI distribution its wheels come from."""
_NAMED = re.compile(r"^(?P<dist>vllm|sglang|flashinfer-python)\s+"
                    r"(?P<versions>\d[\w.]*(?:,\s*\d[\w.]*)*)\s+\(PyPI wheels?\b")


def named_versions(pack: Pack) -> list[tuple[str, str]]:
    """(library, version) of every release wheel a pack's `checked` entries name."""
    library_of = {dist: lib for lib, dist in DISTS.items()}
    found = []
    for entry in pack.checked:
        match = _NAMED.match(entry.strip())
        if match:
            library = library_of[match["dist"]]
            found += [(library, v.strip()) for v in match["versions"].split(",")]
    return found


def _key(version: int | str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.]", str(version)))


def _unpacked(wheels: Path, library: str, version: str, download: bool) -> Path:
    dist = DISTS[library]
    folder = wheels / f"{dist}-{version}"
    src = folder / "src"
    if (src / ".complete").exists():
        return src
    folder.mkdir(parents=True, exist_ok=True)
    found = sorted(folder.glob("*.whl"))
    if not found and download:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                        f"{dist}=={version}", "-d", str(folder)], check=True)
        found = sorted(folder.glob("*.whl"))
    if not found:
        sys.exit(f"{folder}: no wheel of {dist} {version} (give --download)")
    with zipfile.ZipFile(found[0]) as wheel:
        for name in wheel.namelist():
            if name.endswith(".py") or ".dist-info/" in name:
                wheel.extract(name, src)
    (src / ".complete").write_text("")
    return src


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", required=True, type=Path,
                        help="folder of <dist>-<version>/ wheel folders")
    parser.add_argument("--download", action="store_true",
                        help="pip download the named wheels that are not there")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    packs = [load_pack(p) for p in default_pack_paths()]
    wanted = sorted({nv for pack in packs for nv in named_versions(pack)},
                    key=lambda nv: (nv[0], _key(nv[1])))
    snapshots: dict[str, dict] = {}
    for library, version in wanted:
        src = _unpacked(args.wheels, library, version, args.download)
        there = source_versions(src)
        if there.get(library) != version:
            sys.exit(f"{src}: expected {library} {version}, found {there.get(library)}")
        targets = sorted({t for pack in packs for spec in pack.probes for t in spec.targets
                          if t.split(":")[0].split(".")[0] == library})
        snapshots[f"{library} {version}"] = {"targets": signatures(src, targets)}
        print(f"{library} {version}: {len(targets)} targets", file=sys.stderr)
    releases: dict[str, str] = {}
    for library, version in wanted:
        if library not in releases or _key(version) > _key(releases[library]):
            releases[library] = version
    newest: dict[str, dict] = {}
    for library, version in releases.items():
        newest.update(snapshots[f"{library} {version}"]["targets"])
    data = {"schema": SIGNATURES_SCHEMA, "releases": releases, "targets": newest,
            "snapshots": snapshots}
    args.out.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    print(f"wrote {args.out}: {len(snapshots)} versions", file=sys.stderr)


if __name__ == "__main__":
    main()
