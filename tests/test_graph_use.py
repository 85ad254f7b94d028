"""Graph use and MLT009 graph-underused, on the reference engine under `mlatrace run`.

The reference serve program captures a graph per `--capture-sizes` size and gives its steps
the batch sizes of `--batch-mix` in turn: a batch pads up to the next captured size and
one above the largest runs eagerly, as vLLM's dispatcher does. Real subprocesses, CPU.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import run_env

pytest.importorskip("torch")

from mlatrace.analysis import analyze  # noqa: E402
from mlatrace.analysis.graph_use import key_size, key_uniform  # noqa: E402
from mlatrace.output.report import report_dict  # noqa: E402
from mlatrace.trace import open_trace  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SERVE = ["--device", "cpu", "--ctx", "64", "--layers", "1", "--hidden", "32", "--heads", "2",
         "--steps", "15"]


def _env() -> dict[str, str]:
    return run_env()


def mlatrace(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlatrace", *args], env=_env(), cwd=cwd,
                          capture_output=True, text=True, timeout=600)


def serve(out: Path, *args: str, run_options: tuple[str, ...] = ()) -> str:
    proc = mlatrace("run", "--out", str(out), *run_options, "--", sys.executable, "-m",
                    "mlatrace.reference.serve", *SERVE, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def report_json(trace: Path) -> dict[str, Any]:
    proc = mlatrace("report", str(trace), "--json")
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def eager_mix(tmp_path_factory) -> Path:
    """Batches 1,3,4,6,8 over captures of 1,2,4: 6 and 8 run eagerly (6 of 15 steps)."""
    out = tmp_path_factory.mktemp("gu") / "eager"
    serve(out, "--batch-mix", "1,3,4,6,8", "--capture-sizes", "1,2,4")
    return out


@pytest.fixture(scope="module")
def covered_mix(tmp_path_factory) -> Path:
    """The same mix over captures of 1,2,4,8: every step replays a graph."""
    out = tmp_path_factory.mktemp("gu") / "covered"
    serve(out, "--batch-mix", "1,3,4,6,8", "--capture-sizes", "1,2,4,8")
    return out


def test_a_batch_above_the_largest_capture_runs_eagerly_and_mlt009_says_what_to_add(eager_mix):
    data = report_json(eager_mix)
    (proc,) = data["graph_use"]["processes"]
    assert proc["steps_from"] == "dispatch" and proc["graphs_on"]
    assert (proc["steps"], proc["replayed"], proc["eager"]) == (15, 9, 6)
    assert (proc["decode_steps"], proc["decode_eager"]) == (15, 6)
    assert proc["captured_sizes"] == [1, 2, 4] and proc["largest_captured"] == 4
    (eager,) = proc["eager_steps"]
    assert eager["reason"] == "above largest capture"
    assert (eager["steps"], eager["real_min"], eager["real_max"], eager["sizes"]) == (6, 6, 8,
                                                                                      [6, 8])
    by_size = {r["size"]: r for r in proc["sizes"]}
    # size 4 replays batches 3 and 4 (3 steps each): 3 padding tokens of 24
    assert (by_size[4]["steps"], by_size[4]["real_min"], by_size[4]["real_max"]) == (6, 3, 4)
    assert (by_size[4]["padding_tokens"], by_size[4]["tokens"]) == (3, 24)
    assert by_size[1]["padding_tokens"] == 0 and by_size[1]["steps"] == 3
    assert [g["size"] for g in proc["never_replayed"]] == [2]
    (finding,) = [f for f in data["findings"] if f["id"] == "MLT009"]
    assert finding["severity"] == "warning" and finding["name"] == "graph-underused"
    assert "6 of 15 decode steps (40%) ran eagerly" in finding["message"]
    assert "up to 8" in finding["message"] and finding["details"]["add_sizes"] == [8]
    assert finding["evidence"] and finding["evidence"][0]["kind"] == "dispatch"

    text = mlatrace("report", str(eager_mix))
    assert text.returncode == 0
    section = text.stdout[text.stdout.index("graph use"):]
    assert "15 steps, 9 replayed a graph, 6 eager" in section
    assert "eager: 6 steps, above the largest capture (4), real 6..8" in section
    assert "size 2 FULL: never replayed" in section
    assert re.search(r"size 4 FULL: 6 steps, real 3\.\.4 \(mean 3\.5\), padding 3 tokens", section)
    check = mlatrace("check", str(eager_mix), "--fail-on", "warning")
    assert check.returncode == 1 and re.search(r"^MLT009 warning", check.stdout, re.M), check.stdout


def test_captures_that_cover_the_mix_replay_every_step_and_mlt009_stays_quiet(covered_mix):
    data = report_json(covered_mix)
    (proc,) = data["graph_use"]["processes"]
    assert (proc["steps"], proc["replayed"], proc["eager"]) == (15, 15, 0)
    assert proc["eager_steps"] == [] and proc["never_replayed"][0]["size"] == 2
    by_size = {r["size"]: r for r in proc["sizes"]}
    # size 8 replays batches 6 (2 padding tokens each) and 8, three steps each
    assert (by_size[8]["steps"], by_size[8]["padding_tokens"], by_size[8]["tokens"]) == (6, 6, 48)
    assert proc["padding_tokens"] == 3 + 6 and proc["replayed_tokens"] == 3 + 24 + 48
    assert not [f for f in data["findings"] if f["id"] == "MLT009"]
    assert mlatrace("check", str(covered_mix), "--fail-on", "warning").returncode == 0


def test_padding_above_its_share_fires_mlt009_with_the_bucket_edges_to_move(tmp_path):
    out = tmp_path / "padded"
    lines = serve(out, "--batch-mix", "1,2,3", "--capture-sizes", "8")
    assert "graph of size 8 (+7 padding)" in lines
    data = report_json(out)
    (proc,) = data["graph_use"]["processes"]
    assert proc["eager"] == 0 and proc["padding_tokens"] == 15 * 8 - 5 * 6
    assert proc["padding_share"] == pytest.approx(90 / 120)
    (finding,) = [f for f in data["findings"] if f["id"] == "MLT009"]
    assert "padding took 90 of 120 replayed tokens (75%)" in finding["message"]
    assert "size 8 replayed real sizes 1..3" in finding["message"]
    assert finding["details"]["add_sizes"] == [2, 3]
    # a config raising the share keeps it quiet (and check says the config's key)
    (tmp_path / "mlatrace.toml").write_text("graph_padding_share = 0.8\n")
    assert mlatrace("check", str(out), "--fail-on", "warning", cwd=tmp_path).returncode == 0
    (tmp_path / "mlatrace.toml").write_text("graph_padding_share = 1.5\n")
    bad = mlatrace("check", str(out), cwd=tmp_path)
    assert bad.returncode == 2 and "mlatrace.toml:1: graph_padding_share" in bad.stderr


def _strip_seqs(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_seqs(v) for k, v in value.items() if k not in ("seq", "file", "pid")}
    if isinstance(value, list):
        return [_strip_seqs(v) for v in value]
    return value


def test_folded_steps_give_the_same_graph_use_as_every_step_written(tmp_path):
    """Batches 5..8 all pad to 8: the key stays, the real size moves inside the fold, whose
    dispatch sum gives the exact padding."""
    args = ("--batch-mix", "5,6,7,8", "--capture-sizes", "4,8", "--steps", "40")
    serve(tmp_path / "off", *args, run_options=("--fold", "0"))
    serve(tmp_path / "on", *args, run_options=("--fold", "0.05"))
    rows = [json.loads(line) for line in next((tmp_path / "on").glob("p*.jsonl")).open()]
    patterns = [e for r in rows if r["k"] == "steady" for e in r.get("pattern", ())
                if e["k"] == "dispatch"]
    assert patterns and all("sum" in e for e in patterns), "dispatch folds carry their sum"
    assert any(e["range"]["num_tokens"][0] < e["range"]["num_tokens"][1] for e in patterns)
    views = [report_dict(str(tmp_path / d), analyze(open_trace(tmp_path / d)))["graph_use"]
             for d in ("off", "on")]
    assert _strip_seqs(views[0]) == _strip_seqs(views[1])
    (proc,) = views[0]["processes"]
    assert proc["sizes"][-1]["size"] == 8 and proc["padding_tokens"] == 10 * (3 + 2 + 1 + 0)


def test_html_draws_steps_and_padding_per_captured_size_and_diff_compares(eager_mix,
                                                                          covered_mix,
                                                                          tmp_path):
    page = tmp_path / "page.html"
    assert mlatrace("report", str(eager_mix), "--html", str(page)).returncode == 0
    html = page.read_text()
    section = html[html.index('<section id="graph-use"'):]
    section = section[:section.index("</section>")]
    assert '<svg class="chart chart-graph-steps"' in section
    assert '<svg class="chart chart-graph-padding"' in section
    assert "above largest capture, real sizes 6..8" in section
    assert section.count('class="bar"') == 3 + 1 + 2   # sizes 1, 2, 4 and eager; padding 1, 4
    from test_html_report import CHROMIUM, chromium
    if CHROMIUM:
        dom = chromium(tmp_path, page, "--dump-dom")
        assert 'data-loaded="1"' in dom and 'data-errors="0"' in dom
        assert 'id="graph-use"' in dom

    diff = mlatrace("diff", str(eager_mix), str(covered_mix), "--json")
    assert diff.returncode == 0, diff.stderr
    use = json.loads(diff.stdout)["graph_use"]
    totals = {t["field"]: (t["a"], t["b"]) for t in use["totals"]}
    assert totals["eager"] == (6, 0) and totals["replayed"] == (9, 15)
    assert {"reason": "above largest capture", "a": 6, "b": 0} in use["eager"]
    assert any(s["size"] == 8 and s["a"] is None and s["b"]["steps"] == 6 for s in use["sizes"])
    text = mlatrace("diff", str(eager_mix), str(covered_mix))
    assert "eager (above largest capture): 6 -> 0 steps" in text.stdout


@pytest.mark.parametrize("key, size, uniform", [
    ({"num_tokens": 8, "num_reqs": None, "uniform": False}, 8, False),
    ("FULL(num_tokens=24, uniform=True)", 24, True),
    ("num_tokens=2, uniform=true", 2, True),
    ({"cg_mode": "FULL", "num_tokens": 32, "num_reqs": 32, "uniform_token_count": 1}, 32, None),
    (128, 128, None),
    (None, None, None),
])
def test_batch_descriptors_as_engines_write_them_give_their_size(key, size, uniform):
    assert key_size(key) == size and key_uniform(key) == uniform


HF_CB = ROOT / "samples" / "hf_cb" / "transformers_cb_h200"


def test_hf_transformers_continuous_batching_on_the_h200_lists_the_graphs_it_set():
    """samples/hf_cb: transformers 5.17 `generate_batch` with CUDA graphs on the H200, no
    pack for it: graph use lists the torch graphs transformers says it set (its log,
    kept in measured_h200.json), the steps each replayed, and the two never replayed."""
    measured = json.loads((HF_CB.parent / "measured_h200.json").read_text())
    data = report_dict(str(HF_CB), analyze(open_trace(HF_CB)))
    (proc,) = data["graph_use"]["processes"]
    assert proc["steps_from"] == "replays" and proc["eager_share"] is None
    captures = [c for row in proc["sizes"] for c in row["captures"]]
    assert len(captures) == measured["graphs_set"] == 3
    assert [(c["gid"], c["replays"]) for c in captures] == [(1, 0), (2, 61), (3, 0)]
    assert [g["gid"] for g in proc["never_replayed"]] == [1, 3]
    assert proc["steps"] == 61 and not [f for f in data["findings"] if f["id"] == "MLT009"]


def test_the_text_section_keeps_ten_bucket_lines_and_sums_the_rest():
    from mlatrace.output.report_graph_use import MAX_LINES, process_lines

    def row(size: int, steps: int) -> dict[str, Any]:
        return {"size": size, "modes": ["FULL"], "captures": [{"gid": size}], "replays": steps,
                "steps": steps, "real_min": size - 1, "real_max": size, "real_mean": size - 0.5,
                "padding_tokens": steps // 2, "padding_share": 0.1, "tokens": size * steps}

    sizes = [row(8 * i, 100 - i if i != 30 else 0) for i in range(1, 41)]
    entry = {"file": "p1.jsonl", "rank": 0, "steps": 5000, "steps_from": "dispatch",
             "replayed": 4000, "eager": 1000, "decode_eager": 1000, "decode_steps": 5000,
             "eager_share": 0.2, "graphs_on": True, "padding_share": 0.1, "padding_tokens": 9,
             "replayed_tokens": 90, "largest_captured": 320, "breakable": [],
             "eager_steps": [{"reason": "above largest capture", "steps": 1000,
                              "decode_steps": 1000, "real_min": 321, "real_max": 400}],
             "sizes": sizes}
    head, *lines = process_lines(entry)
    assert len(lines) == MAX_LINES and head.startswith("p1.jsonl (rank 0): 5000 steps")
    assert lines[-1].strip() == "eager: 1000 steps, above the largest capture (320), real 321..400"
    assert lines[-2].strip() == ("... 32 more sizes: 2346 steps, 1 never replayed "
                                 "(--json has them all)")
    assert [line.split(":")[0].strip() for line in lines[:3]] == [
        "size 8 FULL", "size 16 FULL", "size 24 FULL"]    # the busiest, in size order


VENV = Path(os.environ.get("MLATRACE_VLLM_VENV", "/work/vllm-venv"))


@pytest.mark.slow
def test_transformers_continuous_batching_steps_are_dispatches_with_their_padded_shape(tmp_path):
    """The transformers_cb pack on the real transformers (the vLLM venv's, CPU): each step of
    `generate_batch` is a `dispatch` with its real query tokens; on CPU no graph backend
    exists, so every step is eager with the reason `graphs off`."""
    python = VENV / "bin" / "python"
    if not python.exists() or subprocess.run([str(python), "-c", "import transformers"],
                                             capture_output=True).returncode:
        pytest.skip(f"no transformers in {VENV}")
    out = tmp_path / "hf"
    env = dict(_env(), PYTHONPATH=str(ROOT))
    proc = subprocess.run([str(python), "-m", "mlatrace", "run", "--out", str(out), "--",
                           str(python), str(ROOT / "samples" / "hf_cb" / "hf_cb_drive.py"),
                           "--device", "cpu", "--requests", "2", "--new-tokens", "3"],
                          env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (proc_use,) = report_json(out)["graph_use"]["processes"]
    # one prefill of both prompts, then 2 decode steps of 2 tokens (the first new token
    # comes from the prefill)
    assert proc_use["steps_from"] == "dispatch" and not proc_use["graphs_on"]
    assert proc_use["steps"] == proc_use["eager"] == 3
    (eager,) = proc_use["eager_steps"]
    assert eager["reason"] == "graphs off" and eager["real_min"] == 2
    assert [r["steps"] for r in proc_use["eager_sizes"] if r["size"] == 2] == [2]
