"""Marks an event every 10 ms until killed (SIGKILL / SIGTERM tests)."""

import os
import sys
import time

import mlatrace

print(os.getpid(), flush=True)
for i in range(100000):
    mlatrace.mark("tick", i=i, argv=sys.argv[1:])
    time.sleep(0.01)
