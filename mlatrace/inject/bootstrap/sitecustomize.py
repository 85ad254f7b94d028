"""mlatrace bootstrap, imported by every Python process started under `mlatrace run`.

`mlatrace run` puts this directory first on PYTHONPATH, so each interpreter of
the process tree (engine core, TP workers, spawn and forkserver children,
plain subprocesses) imports it at start-up. It starts the recorder and the
probes, then runs whichever `sitecustomize` would have run without us (the
ddtrace pattern). Any failure is reported once on stderr and tracing steps
aside: the traced program always runs.
"""

import os
import sys


def _mlatrace_bootstrap() -> None:
    try:
        try:
            import mlatrace.inject as inject
        except ImportError:
            # Another interpreter than mlatrace's own: find mlatrace where the launcher
            # lives, appended last so it never shadows the program's own packages.
            home = os.environ.get("MLATRACE_HOME")
            if not home:
                raise
            sys.path.append(home)
            import mlatrace.inject as inject
        from mlatrace.settings import Settings

        inject.bootstrap_process(Settings.from_env())
    except Exception as exc:  # never break the traced program
        sys.stderr.write(f"mlatrace: tracing disabled in pid {os.getpid()}: {exc!r}\n")


def _mlatrace_chain_sitecustomize() -> None:
    """Run the sitecustomize that this one shadows, if there is one."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["_mlatrace_chained_sitecustomize"] = module
    spec.loader.exec_module(module)


_mlatrace_bootstrap()
_mlatrace_chain_sitecustomize()
