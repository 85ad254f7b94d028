"""The README's "Write your own pack" example, run as written, and what the pack checks catch.

The files and commands are taken from README.md itself, so the example cannot drift from
what works. Then the same pack with a mistyped option, an option of the wrong type, a
`versions` range the installed library is outside of, `--no-pack`, and the same pack found
through a `mlatrace.packs` entry point of an installed (dist-info on the path) distribution.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mlatrace.probe.packs import OptionError, PackError, load_pack, shipped_pack_paths

REPO = Path(__file__).resolve().parent.parent
SECTION = "## Write your own pack"


def readme_blocks() -> dict[str, str]:
    """The fenced blocks of the README section, by their first line (a file name comment,
    or 'bash')."""
    text = (REPO / "README.md").read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", len(SECTION))]
    blocks = {}
    for lang, body in re.findall(r"^```(\w+)\n(.*?)^```", section, re.S | re.M):
        first = body.splitlines()[0]
        name = first[2:].strip() if first.startswith("# ") and lang != "bash" else lang
        blocks[name] = body
    return blocks


@pytest.fixture
def shop(tmp_path: Path, monkeypatch) -> Path:
    """The example's three files in a folder, which is also on this process's sys.path
    (where the pack's handler is importable, its options are checked at load)."""
    blocks = readme_blocks()
    for name in ("shop.py", "shop_probes.py", "shop_pack.toml"):
        (tmp_path / name).write_text(blocks[name])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for module in ("shop", "shop_probes"):
        sys.modules.pop(module, None)


def sh(script: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a bash script with this interpreter first on PATH and this checkout importable."""
    environ = {**os.environ, **(env or {}),
               "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    # the console script, as a user runs it (`python -m` would put the cwd on the path)
    script_path = Path(sys.executable).parent / "mlatrace"
    prelude = ("" if script_path.exists()
               else 'mlatrace() { python -m mlatrace "$@"; }\n')
    return subprocess.run(["bash", "-c", prelude + script], cwd=cwd, env=environ,
                          capture_output=True, text=True, timeout=240)


def trace_records(trace: Path) -> list[dict]:
    return [json.loads(line) for path in sorted(trace.glob("p*.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]


def traced_checkout(cwd: Path, *flags: str, env: dict | None = None
                    ) -> tuple[subprocess.CompletedProcess, list[dict]]:
    """mlatrace run [flags] -- python -c <a checkout that prints its total>."""
    out = cwd / f"trace-{len(list(cwd.glob('trace-*')))}"
    done = sh(f"PYTHONPATH=$PWD:$PYTHONPATH mlatrace run --out {out} {' '.join(flags)} -- "
              "python -c \"import shop; print('total', shop.checkout([3, 4], coupon='X'))\"",
              cwd, env)
    return done, trace_records(out)


def set_option(pack: Path, line: str) -> None:
    text = pack.read_text()
    pack.write_text(text.replace('currency = "EUR"\n', line + "\n"))


def installed(where: Path, name: str, version: str, entry_points: str = "") -> None:
    """A distribution as pip leaves it: a dist-info folder on the path."""
    info = where / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    if entry_points:
        (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))


def test_the_readme_example_runs_as_written(shop):
    script = readme_blocks()["bash"]
    done = sh(script, shop)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"^\s+ok\s+checkout\s+shop:checkout$", done.stdout, re.M), done.stdout
    printed = done.stdout.strip().splitlines()[-1]
    for text in ("'k': 'shop.checkout'", "'total': 2", "'currency': 'EUR'", "'items': 2",
                 "'coupon': True"):
        assert text in printed, printed


def test_a_mistyped_option_is_named_by_doctor_and_reported_by_run(shop):
    pack = shop / "shop_pack.toml"
    set_option(pack, 'currncy = "EUR"')
    line = pack.read_text().splitlines().index('currncy = "EUR"') + 1
    with pytest.raises(OptionError) as caught:
        load_pack(pack)
    assert str(caught.value).startswith(f"{pack}:{line}: probe 'checkout': unknown option "
                                        "'currncy'")
    assert "did you mean 'currency'?" in str(caught.value)

    doctor = sh("PYTHONPATH=$PWD:$PYTHONPATH mlatrace probes doctor --probes shop_pack.toml", shop)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert doctor.stdout.splitlines()[0].endswith("-> 1 pack problem"), doctor.stdout
    assert f"PROBLEM shop_pack.toml:{line}: probe 'checkout': unknown option 'currncy'" in doctor.stdout

    done, records = traced_checkout(shop, "--probes", "shop_pack.toml")
    assert done.returncode == 0 and "total 2" in done.stdout, done.stdout + done.stderr
    errors = [r for r in records if r["k"] == "probe.error"]
    assert len(errors) == 1 and "unknown option 'currncy'" in errors[0]["error"], errors
    assert not [r for r in records if r["k"] == "shop.checkout"]
    assert any(r["k"] == "process" and "reference" in r.get("probes", []) for r in records)


def test_an_option_of_the_wrong_type_is_named_by_doctor(shop):
    set_option(shop / "shop_pack.toml", "currency = 1")
    doctor = sh("PYTHONPATH=$PWD:$PYTHONPATH mlatrace probes doctor --probes shop_pack.toml", shop)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "option 'currency' must be str, not int (1)" in doctor.stdout


def test_a_version_range_that_does_not_match_is_reported_and_the_pack_left_out(shop):
    installed(shop, "shop", "0.5")          # the pack says versions = ">=1.0"
    doctor = sh("PYTHONPATH=$PWD:$PYTHONPATH mlatrace probes doctor --probes shop_pack.toml", shop)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "shop: shop 0.5; versions >=1.0: MISMATCH: run leaves it out" in doctor.stdout
    assert "pack 'shop' is for shop >=1.0; installed: 0.5" in doctor.stdout

    done, records = traced_checkout(shop, "--probes", "shop_pack.toml")
    assert done.returncode == 0 and "total 2" in done.stdout, done.stdout + done.stderr
    errors = [r for r in records if r["k"] == "probe.error"]
    assert len(errors) == 1 and "installed: 0.5" in errors[0]["error"], errors
    assert not [r for r in records if r["k"] == "shop.checkout"]


def test_no_pack_and_the_environment_variable_turn_a_pack_off(shop):
    done, records = traced_checkout(shop, "--probes", "shop_pack.toml")
    assert [r["total"] for r in records if r["k"] == "shop.checkout"] == [2], done.stderr
    for flags, env in ((("--probes", "shop_pack.toml", "--no-pack", "shop"), None),
                       (("--probes", "shop_pack.toml"), {"MLATRACE_DISABLE_PACKS": "x,shop"})):
        done, records = traced_checkout(shop, *flags, env=env)
        assert done.returncode == 0 and "total 2" in done.stdout, done.stdout + done.stderr
        assert not [r for r in records if r["k"] in ("shop.checkout", "probe.error")]
        header = next(r for r in records if r["k"] == "process")
        assert "shop" not in header["probes"] and "reference" in header["probes"]


def test_a_pack_declared_by_an_installed_distribution_is_found(shop):
    """The README's entry-point declaration: no --probes needed for list, doctor or run."""
    with (shop / "shop_probes.py").open("a") as f:
        f.write('\nfrom pathlib import Path\nPACK = Path(__file__).with_name("shop_pack.toml")\n')
    installed(shop, "shop", "1.2", """
        [mlatrace.packs]
        shop = shop_probes:PACK
    """)
    listed = sh("PYTHONPATH=$PWD:$PYTHONPATH mlatrace probes list", shop)
    assert listed.returncode == 0, listed.stdout + listed.stderr
    assert f"\nshop  (shop)  {shop / 'shop_pack.toml'}" in listed.stdout
    doctor = sh("PYTHONPATH=$PWD:$PYTHONPATH mlatrace probes doctor", shop)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "shop: shop 1.2; versions >=1.0: ok" in doctor.stdout
    done, records = traced_checkout(shop)
    assert [r["total"] for r in records if r["k"] == "shop.checkout"] == [2], done.stderr


def test_an_entry_point_that_gives_no_pack_is_a_problem_not_a_crash(shop):
    installed(shop, "brokenpack", "1.0", """
        [mlatrace.packs]
        broken = no_such_module_xyz:PACK
    """)
    doctor = sh("PYTHONPATH=$PWD:$PYTHONPATH mlatrace probes doctor", shop)
    assert doctor.returncode == 1, doctor.stdout + doctor.stderr
    assert "entry point broken = no_such_module_xyz:PACK (brokenpack): cannot load" \
        in doctor.stdout
    done, records = traced_checkout(shop, "--probes", "shop_pack.toml")
    assert done.returncode == 0 and "total 2" in done.stdout, done.stdout + done.stderr
    assert [r["total"] for r in records if r["k"] == "shop.checkout"] == [2]
    assert any("no_such_module_xyz" in r["error"] for r in records if r["k"] == "probe.error")


def test_shipped_handlers_declare_every_option_the_shipped_packs_use(tmp_path):
    """Every shipped pack loads with its options checked, and a typo in one is caught."""
    for path in shipped_pack_paths():
        load_pack(path)
    sglang = next(p for p in shipped_pack_paths() if p.name == "sglang.toml")
    text = sglang.read_text()
    assert 'key_after = "' in text
    bad = tmp_path / "sglang.toml"
    bad.write_text(text.replace('key_after = "', 'key_aftr = "'))
    with pytest.raises(OptionError, match=r"unknown option 'key_aftr' .* did you mean "
                                          r"'key_after'\?"):
        load_pack(bad)
    assert 'versions = ">=0.5.14"' in text
    bad.write_text(text.replace('versions = ">=0.5.14"', 'versions = "0.32 or later"', 1))
    with pytest.raises(PackError, match=r"sglang.toml:\d+: versions entry '0.32 or later' "
                                        r"is not a PEP 440 range"):
        load_pack(bad)
