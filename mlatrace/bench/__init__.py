"""Benchmarks behind `mlatrace bench ...`; each module has `main(...) -> int`."""
