"""`probes doctor` resolves a pack's handler on the path a traced process starts with."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HANDLER = '''\
from mlatrace import record
from mlatrace.probe.handlers import Handler


class Checkout(Handler):
    def after(self, view, info, token, result, error):
        record.emit("shop.checkout", total=result)
'''
PACK = '''\
[pack]
name = "shop"
library = "shop"

[[probe]]
name = "checkout"
targets = ["shop:checkout"]
params = ["cart"]
handler = "shop_probes:Checkout"
when = "return"
'''


@pytest.fixture
def shop(tmp_path: Path) -> Path:
    (tmp_path / "shop.py").write_text("def checkout(cart):\n    return sum(cart)\n")
    (tmp_path / "shop_probes.py").write_text(HANDLER)
    (tmp_path / "shop_pack.toml").write_text(PACK)
    return tmp_path


def doctor(cwd: Path, how: list[str], pythonpath: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([*how, "probes", "doctor", "--probes", "shop_pack.toml"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=300)


SCRIPT = Path(sys.executable).parent / "mlatrace"


@pytest.mark.parametrize("how", [[sys.executable, "-m", "mlatrace"], [str(SCRIPT)]],
                         ids=["python -m", "console script"])
def test_a_handler_only_in_the_cwd_is_a_bad_handler_with_the_fix(shop, how):
    if not SCRIPT.exists() and how == [str(SCRIPT)]:
        pytest.skip("no mlatrace console script next to this interpreter")
    done = doctor(shop, how, None)
    assert done.returncode == 2, done.stdout + done.stderr
    line = next(x for x in done.stdout.splitlines() if "shop:checkout" in x)
    assert line.split()[:3] == ["BAD", "HANDLER", "checkout"], line
    assert "run with PYTHONPATH=$PWD" in line and "run with PYTHONPATH=$PWD" in done.stderr
    ok = doctor(shop, how, str(shop))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert any(x.split()[:3] == ["ok", "checkout", "shop:checkout"] for x in ok.stdout.splitlines())
