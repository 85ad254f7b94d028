"""`check` verdicts that must never be a false OK: suppressions, collections of runs,
nothing attached, killed processes."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from mlatrace.cli import main

FIXTURES = Path(__file__).parent / "fixtures"


def check(*args: str):
    return CliRunner().invoke(main, ["check", *[str(a) for a in args]])


def test_mistyped_allow_entry_is_a_config_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n\n[tool.mlatrace]\nallow = [{rulle = "MLT004"}]\n')
    result = check(FIXTURES / "legacy_one_split")
    assert result.exit_code == 2, result.output
    assert f"{pyproject}:5" in result.output and "'rulle'" in result.output
    assert "did you mean 'rule'" in result.output
    pyproject.write_text('[tool.mlatrace]\nallow = [{rule = "MLT001", kee = "x"}]\n')
    result = check(FIXTURES / "legacy_one_split")
    assert result.exit_code == 2 and "'kee'" in result.output, result.output
    pyproject.write_text('[tool.mlatrace]\nallow = [{key = "x"}]\n')
    result = check(FIXTURES / "legacy_one_split")
    assert result.exit_code == 2 and "names no rule" in result.output, result.output
    pyproject.write_text('[tool.mlatrace]\nallow = [{rule = "MLT042"}]\n')
    assert check(FIXTURES / "legacy_one_split").exit_code == 2


def test_check_says_what_was_suppressed(tmp_path):
    cfg = tmp_path / "mlatrace.toml"
    cfg.write_text('allow = [{rule = "MLT004"}, {rule = "MLT001", rank = 0}]\n')
    result = check(FIXTURES / "legacy_one_split", "--config", cfg)
    assert result.exit_code == 0, result.output
    assert ('suppressed: 1 finding by allow entry {rule = "MLT001", rank = 0} '
            f"({cfg})") in result.output
    assert "MLT004" not in result.output.split("suppressed:")[1].split("\n")[0]


def _collection(tmp_path: Path) -> Path:
    """A folder holding a clean run and a failing run (different run_ids)."""
    import json
    import shutil

    root = tmp_path / "runs"
    for name, run_id, start in (("clean", "aaaa00000001", 2), ("failing", "bbbb00000002", 1)):
        dest = root / name
        shutil.copytree(FIXTURES / ("device_healthy" if name == "clean" else "legacy_one_split"),
                        dest)
        info = json.loads((dest / "run.json").read_text())
        info.update(run_id=run_id, start_ns=start)  # the clean run is the newest
        (dest / "run.json").write_text(json.dumps(info))
    return root


def test_check_judges_every_run_of_a_collection(tmp_path):
    root = _collection(tmp_path)
    result = check(root)
    assert result.exit_code == 1, result.output
    assert "run aaaa00000001: OK (exit 0)" in result.output
    assert "run bbbb00000002: FAILED (exit 1)" in result.output
    result = check(root / "clean", root / "failing")
    assert result.exit_code == 1, result.output
    assert check(root / "clean").exit_code == 0
    junit = tmp_path / "j.xml"
    assert check(root, "--junit", junit).exit_code == 1
    assert junit.read_text().count("<testsuite ") == 2
    assert check(root, "--run", "aaaa00000001").exit_code == 0


def test_merge_refuses_different_runs(tmp_path):
    root = _collection(tmp_path)
    result = CliRunner().invoke(main, ["merge", str(root), "-o", str(tmp_path / "m")])
    assert result.exit_code == 2 and "2 different runs" in result.output, result.output
    assert not (tmp_path / "m").exists()
    result = CliRunner().invoke(main, ["merge", str(root), "-o", str(tmp_path / "m"),
                                       "--run", "bbbb00000002"])
    assert result.exit_code == 0, result.output


def _run(out: Path, *cmd: str, opts: tuple = ()) -> int:
    import os
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(out), *opts,
                           "--", *cmd], env=dict(os.environ), timeout=120,
                          capture_output=True).returncode


def test_nothing_attached_is_blind(tmp_path):
    import sys

    out = tmp_path / "pass"
    assert _run(out, sys.executable, "-c", "pass") == 0
    result = check(out)
    assert result.exit_code == 3, result.output
    assert "blind: no probe attached in any process of the run" in result.output


def test_user_pack_that_saw_nothing_is_blind(tmp_path):
    import sys

    mod = tmp_path / "shopmod.py"
    mod.write_text("def checkout(n):\n    return n\n")
    pack = tmp_path / "shop.toml"
    pack.write_text('[pack]\nname = "shop"\nlibrary = "shopmod"\n\n[[probe]]\nname = "checkout"\n'
                    'targets = ["shopmod_typo:checkout"]\nparams = ["n"]\nkind = "shop.checkout"\n')
    prog = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import shopmod, json; json.dumps(1)"
    out = tmp_path / "typo"
    assert _run(out, sys.executable, "-c", prog, opts=("--probes", str(pack))) == 0
    result = check(out, "--expect", "process")
    assert result.exit_code == 3, result.output
    assert "pack shop (--probes): none of its targets attached" in result.output
    pack.write_text(pack.read_text().replace("shopmod_typo", "shopmod"))
    out = tmp_path / "uncalled"
    assert _run(out, sys.executable, "-c", prog, opts=("--probes", str(pack))) == 0
    result = check(out)
    assert result.exit_code == 3, result.output
    assert "pack shop (--probes): attached, but none of its probes was called" in result.output
    out = tmp_path / "called"
    assert _run(out, sys.executable, "-c", prog + "; shopmod.checkout(3)",
                opts=("--probes", str(pack))) == 0
    result = check(out)
    assert result.exit_code == 0, result.output


def test_killed_process_is_blind_unless_a_finding(tmp_path):
    import sys

    out = tmp_path / "killed"
    code = _run(out, sys.executable, "-c",
                "import os, signal, time; time.sleep(0.5); os.kill(os.getpid(), signal.SIGKILL)")
    assert code == 137
    result = check(out)
    assert result.exit_code == 3, result.output
    assert "process killed: coverage unknown" in result.output
    report = CliRunner().invoke(main, ["report", str(out)])
    assert "process killed: coverage unknown" in report.output, report.output
    assert "older mlatrace" not in report.output


def test_doctor_says_a_mistyped_module_is_not_on_the_path(tmp_path):
    import os
    import subprocess
    import sys

    pack = tmp_path / "shop.toml"
    pack.write_text('[pack]\nname = "shop"\nlibrary = "shopmod"\n\n[[probe]]\nname = "checkout"\n'
                    'targets = ["shopmod_typo:checkout"]\nparams = ["n"]\nkind = "shop.checkout"\n')
    run = subprocess.run([sys.executable, "-m", "mlatrace", "probes", "doctor", "--probes",
                          str(pack)], capture_output=True, text=True, env=dict(os.environ),
                         timeout=300)
    assert run.returncode == 1, run.stdout + run.stderr
    line = next(x for x in run.stdout.splitlines() if "shopmod_typo:checkout" in x
                and x.strip().startswith("NOT FOUND"))
    assert "no module 'shopmod_typo' on the path" in line


def test_mistyped_names_are_refused_with_a_did_you_mean(tmp_path):
    import subprocess
    import sys

    from mlatrace.analysis.coverage import ExpectError, expect_kinds

    cfg = tmp_path / "mlatrace.toml"
    cfg.write_text('fail_on = "error"\ndisabel = ["MLT004"]\n')
    result = check(FIXTURES / "legacy_one_split", "--config", cfg)
    assert result.exit_code == 2 and f"{cfg}:2: unknown key 'disabel'" in result.output
    assert "did you mean 'disable'?" in result.output
    cfg.write_text("long_len_factr = 8\n")
    result = check(FIXTURES / "legacy_one_split", "--config", cfg)
    assert result.exit_code == 2 and "did you mean 'long_len_factor'?" in result.output
    result = check(FIXTURES / "legacy_one_split", "--expect", "atn.call")
    assert result.exit_code == 2 and "did you mean 'attn.call'?" in result.output, result.output
    assert expect_kinds("shop.checkout") == ("shop.checkout",)  # a user pack's own kind
    assert expect_kinds("graph.replay.time") == ("graph.replay.time",)
    try:
        expect_kinds("grahps")
    except ExpectError as exc:
        assert "did you mean 'graphs'?" in str(exc)
    run = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(tmp_path / "t"),
                          "--no-pack", "nosuchpack", "--no-pack", "vllm_mal", "--", sys.executable,
                          "-c", "pass"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--no-pack nosuchpack: no such pack" in run.stderr, run.stderr
    run = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--out", str(tmp_path / "u"),
                          "--no-pack", "vllm_mal", "--", sys.executable, "-c", "pass"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "did you mean 'vllm_mla'?" in run.stderr, run.stderr
    helped = subprocess.run([sys.executable, "-m", "mlatrace", "run", "--help"],
                            capture_output=True, text=True, timeout=120,
                            env={**__import__("os").environ, "COLUMNS": "200"}).stdout
    launch = helped[helped.index("--launch-sample"):helped.index("--sample ")]
    assert "(8)" not in launch and "--sample's N" in launch, launch
