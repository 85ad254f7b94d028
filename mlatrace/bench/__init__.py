"""Benchmarks behind `mlatrace bench ...`; each module has `main(...) -> int`."""


def gpu_device_present() -> bool:
    """Whether this machine shows a GPU device node (NVIDIA, ROCm, WSL), checked in
    microseconds, before a benchmark spends seconds importing torch to ask CUDA."""
    import glob
    import os

    return bool(glob.glob("/dev/nvidia[0-9]*")) or any(
        os.path.exists(p) for p in ("/dev/kfd", "/dev/dxg"))
