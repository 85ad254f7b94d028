"""A process tree for injection tests: spawn, forkserver, fork and subprocess children."""

import multiprocessing as mp
import os
import subprocess
import sys

import mlatrace


def child(tag: str) -> None:
    mlatrace.mark("child", tag=tag, pid=os.getpid())


if __name__ == "__main__":
    mlatrace.mark("parent", pid=os.getpid())
    for method in ("spawn", "forkserver", "fork"):
        p = mp.get_context(method).Process(target=child, args=(method,))
        p.start()
        p.join()
        assert p.exitcode == 0, (method, p.exitcode)
    subprocess.run([sys.executable, "-c", "import mlatrace; mlatrace.mark('child', tag='subprocess')"],
                   check=True)
    sys.exit(int(os.environ.get("TREE_EXIT", "0")))
