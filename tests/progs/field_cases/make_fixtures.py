"""Make the field cases' traces: python tests/progs/field_cases/make_fixtures.py [NAME ...]

Each case is a small program run under `mlatrace run` with the shipped packs. The cases
with vLLM in the path (`vllm=True`) drive the real vLLM CPU build in the vLLM venv
(tests/e2e_vllm/setup_env.sh; MLATRACE_VLLM_VENV, default /work/vllm-venv), capturing
through the reference HostGraph where a CUDA graph cannot be made (vllm_cpu_graph.py).
Libraries that do not install here (AITER, TensorRT-LLM, FlashInfer, SGLang) are stand-ins:
the names and signatures the packs target, under <lib>_site/ with the release's dist-info,
so the packs apply as they would to the real library, on the HostGraph. The bad and the healthy variant
of a case differ by MLATRACE_CASE_VARIANT (read by the program or the stand-ins; recorded in
the trace header's env). The traces land in tests/fixtures/<name>/; tests/test_field_cases.py
keeps their verdicts and re-runs the programs. docs/backends.md lists what each case shows.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
VLLM_VENV = Path(os.environ.get("MLATRACE_VLLM_VENV", "/work/vllm-venv"))
# what tests/e2e_vllm/run_e2e.py gives vLLM's CPU build: offline, a 1 GiB KV cache
VLLM_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


@dataclass(frozen=True)
class Case:
    name: str           # the fixture folder, named after the upstream thread
    program: str        # under tests/progs/field_cases/
    sites: tuple[str, ...]  # the stand-in library folders put on PYTHONPATH
    variant: str = ""   # MLATRACE_CASE_VARIANT
    exit_code: int = 0  # the program's own exit code (a failed capture exits 1)
    vllm: bool = False  # runs the real vLLM CPU build, in VLLM_VENV


CASES = (
    Case("sglang_26019_triton_splits_not_refreshed", "sglang_26019.py", ("sglang_site",),
         "skip_replay_splits"),
    Case("sglang_26019_triton_splits_per_replay", "sglang_26019.py", ("sglang_site",)),
    Case("vllm_53658_dummy_seq_lens_past_max_model_len", "vllm_53658.py", (), vllm=True),
    Case("vllm_53658_dummy_seq_lens_bounded_sizes", "vllm_53658.py", (), "bounded", vllm=True),
    Case("aiter_3773_topk_decode_stride_full_width", "aiter_3773.py", ("aiter_site",),
         vllm=True),
    Case("aiter_3773_topk_decode_one_block", "aiter_3773.py", ("aiter_site",), "one_block",
         vllm=True),
    Case("vllm_36611_flashmla_fp8_sched_meta_outside_graph", "vllm_36611.py", (), vllm=True),
    Case("vllm_36611_flashmla_fp8_sched_meta_persistent", "vllm_36611.py", (), "persistent",
         vllm=True),
    Case("flashinfer_4002_fa2_no_split_padded_grid", "flashinfer_4002.py", ("flashinfer_site",)),
    Case("flashinfer_4002_fa2_no_split_exact_grid", "flashinfer_4002.py", ("flashinfer_site",),
         "exact_grid"),
    Case("trtllm_7285_autotuner_fallback_in_capture", "trtllm_7285.py", ("trtllm_site",)),
    Case("trtllm_7285_autotuner_tuned_graph_sizes", "trtllm_7285.py", ("trtllm_site",),
         "tune_graph_sizes"),
    Case("flashinfer_4390_mla_decode_runner_per_graph", "flashinfer_4390.py",
         ("flashinfer_site",), vllm=True),
    Case("flashinfer_4390_mla_decode_explicit_backend", "flashinfer_4390.py",
         ("flashinfer_site",), "heads_96", vllm=True),
    Case("trtllm_16706_t5_bias_from_capture", "trtllm_16706.py", ("trtllm_site",)),
    Case("trtllm_16706_t5_bias_rebuilt", "trtllm_16706.py", ("trtllm_site",), "rebuild"),
)


def run_case(case: Case, out: Path) -> subprocess.CompletedProcess:
    """Run one case under `mlatrace run` into `out` (replaced)."""
    shutil.rmtree(out, ignore_errors=True)
    python = str(VLLM_VENV / "bin" / "python") if case.vllm else sys.executable
    paths = [str(ROOT), *(str(HERE / s) for s in case.sites), *([str(HERE)] if case.vllm else [])]
    env = {**os.environ, **(VLLM_ENV if case.vllm else {}),
           "PYTHONPATH": os.pathsep.join(paths), "MLATRACE_CASE_VARIANT": case.variant}
    env.pop("MLATRACE_OUT", None)
    proc = subprocess.run([python, "-m", "mlatrace", "run", "--out", str(out), "--",
                           python, str(HERE / case.program)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    if proc.returncode != case.exit_code:
        raise RuntimeError(f"{case.name}: exit {proc.returncode}\n{proc.stderr[-2000:]}")
    return proc


def main(names: list[str]) -> None:
    for case in CASES:
        if not names or case.name in names:
            run_case(case, FIXTURES / case.name)
            print(case.name)


if __name__ == "__main__":
    main(sys.argv[1:])
