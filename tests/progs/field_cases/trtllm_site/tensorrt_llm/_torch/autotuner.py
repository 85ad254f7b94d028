"""Stand-in of TensorRT-LLM tensorrt_llm/_torch/autotuner.py: AutoTuner.get(),
choose_one(custom_op, runners, tuning_config, inputs, **kwargs) -> (runner, tactic) and the
autotune() context. Outside tuning mode a shape with no cached profile gets the fallback
tactic -1; in tuning mode the shape is profiled (a toy pick here) and cached."""

from __future__ import annotations

import contextlib


class AutoTuner:
    _instance = None

    def __init__(self) -> None:
        self.profiling_cache: dict = {}
        self.is_tuning_mode = False

    @classmethod
    def get(cls) -> AutoTuner:
        if cls._instance is None:
            cls._instance = AutoTuner()
        return cls._instance

    def choose_one(self, custom_op, runners, tuning_config, inputs, **kwargs):
        key = (custom_op, tuple(tuple(t.shape) for t in inputs))
        if not self.is_tuning_mode:
            runner_id, tactic = self.profiling_cache.get(key, (0, -1))
            return runners[runner_id], tactic
        self.profiling_cache[key] = (0, 3 + inputs[0].shape[0] % 5)   # the profiled best
        return runners[0], self.profiling_cache[key][1]


@contextlib.contextmanager
def autotune(tune_mode: bool = True):
    old = AutoTuner.get().is_tuning_mode
    AutoTuner.get().is_tuning_mode = tune_mode
    try:
        yield
    finally:
        AutoTuner.get().is_tuning_mode = old
