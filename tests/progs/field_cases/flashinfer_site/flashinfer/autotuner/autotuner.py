"""Stand-in of flashinfer-python 0.7.4 flashinfer/autotuner/autotuner.py: AutoTuner.get(),
choose_one(custom_op, runners, tuning_config, inputs, **kwargs) -> (runner, tactic), keyed on
the batch bucket of the inputs only (the tuning config's dynamic spec sweeps dim 0), and the
autotune() context that profiles (a toy pick: the runner fastest at the profiled length)."""

from __future__ import annotations

import contextlib


class TunableRunner:
    pass


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
        key = (custom_op, inputs[0].shape[0])
        if self.is_tuning_mode:
            profile_len = tuning_config["profile_seq_len"]
            best = min(range(len(runners)), key=lambda i: runners[i].cost(profile_len))
            self.profiling_cache[key] = (best, 0)
        runner_id, tactic = self.profiling_cache.get(key, (0, -1))
        return runners[runner_id], tactic


@contextlib.contextmanager
def autotune(tune_mode: bool = True):
    old = AutoTuner.get().is_tuning_mode
    AutoTuner.get().is_tuning_mode = tune_mode
    try:
        yield
    finally:
        AutoTuner.get().is_tuning_mode = old
