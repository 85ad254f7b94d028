"""Marks an event every 10 ms until killed (SIGKILL / SIGTERM tests).

SLEEPER_SIGTERM=handler installs the program's own SIGTERM handler (raises SystemExit,
as vLLM's engine core does); =reset installs one, then resets SIGTERM to the default;
=slow installs one (for SIGINT too) that takes 30 s to shut down (a parent SIGKILLs it first, as vLLM's
API server does to its Worker).
"""

import os
import signal
import sys
import time

import mlatrace


def on_sigterm(signum, frame):
    mlatrace.mark("own_handler_ran")
    raise SystemExit(0)


def slow_shutdown(signum, frame):
    mlatrace.mark("shutting_down")
    time.sleep(30)
    raise SystemExit(0)


mode = os.environ.get("SLEEPER_SIGTERM", "")
if mode == "slow":
    signal.signal(signal.SIGTERM, slow_shutdown)
    signal.signal(signal.SIGINT, slow_shutdown)
if mode in ("handler", "reset"):
    signal.signal(signal.SIGTERM, on_sigterm)
    assert signal.getsignal(signal.SIGTERM) is on_sigterm  # the program sees its own handler
if mode == "reset":
    assert signal.signal(signal.SIGTERM, signal.SIG_DFL) is on_sigterm
print(os.getpid(), flush=True)
for i in range(100000):
    mlatrace.mark("tick", i=i, argv=sys.argv[1:])
    time.sleep(0.01)
