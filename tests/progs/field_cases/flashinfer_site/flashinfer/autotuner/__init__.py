from flashinfer.autotuner.autotuner import AutoTuner, TunableRunner, autotune  # noqa: F401
