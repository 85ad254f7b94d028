"""Make tests/probe_signatures.json: the static signatures of the shipped packs' vLLM,
SGLang and FlashInfer targets, read from the released wheels (never imported, never copied).

    pip download --no-deps vllm==0.33.0 sglang==0.5.23 flashinfer-python==0.7.4 -d /tmp/wheels
    mkdir -p /tmp/src && for w in /tmp/wheels/*.whl; do unzip -q -o "$w" -d /tmp/src; done
    python tests/make_probe_signatures.py /tmp/src > tests/probe_signatures.json
"""

from __future__ import annotations

import json
import sys

from mlatrace.probe import default_pack_paths
from mlatrace.probe.packs import load_pack
from mlatrace.probe.source import SIGNATURES_SCHEMA, signatures, source_versions

RELEASES = {"vllm": "0.33.0", "sglang": "0.5.23", "flashinfer": "0.7.4"}


def main(src: str) -> None:
    packs = [load_pack(p) for p in default_pack_paths()]
    targets = sorted({t for pack in packs for spec in pack.probes for t in spec.targets
                      if t.split(".")[0].split(":")[0] in RELEASES})
    found = signatures(src, targets)
    there = source_versions(src)
    for name, version in RELEASES.items():
        if there.get(name) != version:
            sys.exit(f"{src}: expected {name} {version}, found {there.get(name)}")
    json.dump({"schema": SIGNATURES_SCHEMA, "releases": RELEASES, "targets": found},
              sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1])
