"""Triton kernel launches: name, grid, num_warps and constexprs of every launch.

Two paths, measured and kept both (see the triton_launch pack):

1. ``JITFunction.run`` / ``InterpretedFunction.run`` (signature
   ``(self, *args, grid, warmup, **kwargs)`` in Triton 3.x) are replaced by a thin
   function that calls the original and then records the launch: the grid (a
   callable grid is evaluated on the launch's arguments, exactly as Triton does),
   the constexprs (declared defaults, positional and keyword values) and
   ``num_warps``. This is robust (no frame walking), works under
   ``TRITON_INTERPRET=1`` where Triton's launch hook never fires, and sees
   Gluon kernels, autotuned and heuristics-wrapped kernels (they end in ``run``).
2. ``triton.knobs.runtime.launch_enter_hook`` (a HookChain: we ``.add``, never
   replace; older Triton: a single ``CompiledKernel.launch_enter_hook`` slot,
   chained) catches launches that bypass ``run`` (e.g. Inductor's compiled
   kernels). Its argument carries only name/function/stream; the grid is read
   from the launcher's frame (``gridX``/``grid_0`` locals, found by walking up a
   few frames) and the record degrades to name-only when it is not there.
   Launches already recorded by path 1 are skipped (thread-local flag).

Neither path fires on graph replay: a replay launches nothing from Python.
Nothing here reads device memory: grid values that are not Python ints (a
device scalar) are recorded as None.
"""

from __future__ import annotations

import inspect
import re
import sys
import threading
from typing import Any

from mlatrace import record, settings
from mlatrace.probe import graphs, sampling
from mlatrace.probe.handlers import Handler

DEFAULT_KERNEL_FILTER = r"(?i)(attn|attention|mla|decode|split|reduce|paged|flash|kv|softmax|stage_?[12]|fwd_kernel)"
META_ATTR = "_mlatrace_launch_meta"
_SCALARS = (bool, int, float, str)
_SCALAR_TYPES = frozenset(_SCALARS)

_local = threading.local()


class _LastLaunch(threading.local):
    """Per thread: kernel meta id -> the sampling run of its eager launches."""

    by_kernel: dict | None = None


_last_launch = _LastLaunch()


def _run_of(meta: KernelMeta) -> sampling.RunState:
    """This thread's sampling run of `meta`'s eager launches."""
    by_kernel = _last_launch.by_kernel
    if by_kernel is None:
        by_kernel = _last_launch.by_kernel = {}
    state = by_kernel.get(id(meta))
    if state is None:
        state = by_kernel[id(meta)] = sampling.RunState()
    return state


def kernel_filter(options: dict[str, Any]) -> re.Pattern[str]:
    """The kernel-name regex: MLATRACE_KERNELS, else the pack's option, else the default."""
    pattern = settings.current().kernels or options.get("name_regex") \
        or DEFAULT_KERNEL_FILTER
    return re.compile(pattern)


class KernelMeta:
    """What one kernel's launches need, computed once per kernel object."""

    __slots__ = ("name", "wanted", "arg_names", "constexprs", "defaults", "const_slots")

    def __init__(self, kernel: Any, name_filter: re.Pattern[str]) -> None:
        fn = getattr(kernel, "fn", None)
        self.name = getattr(fn, "__name__", None) or getattr(kernel, "__name__", "?")
        self.wanted = bool(name_filter.search(self.name))
        self.arg_names: list[str] = list(getattr(kernel, "arg_names", None) or [])
        self.constexprs: list[str] = []
        self.defaults: dict[str, Any] = {}
        params = getattr(kernel, "params", None)
        if params:   # JITFunction: KernelParam objects
            for param in params:
                if getattr(param, "is_constexpr", False):
                    self.constexprs.append(param.name)
                default = getattr(param, "default", inspect.Parameter.empty)
                if default is not inspect.Parameter.empty:
                    self.defaults[param.name] = default
        elif fn is not None:   # InterpretedFunction: read the Python signature
            for param in inspect.signature(fn).parameters.values():
                if "constexpr" in str(param.annotation):
                    self.constexprs.append(param.name)
                if param.default is not inspect.Parameter.empty:
                    self.defaults[param.name] = param.default
            if not self.arg_names:
                self.arg_names = list(inspect.signature(fn).parameters)
        # (name, position, default) per constexpr: read without building a dict per launch.
        positions = {name: i for i, name in enumerate(self.arg_names)}
        self.const_slots = tuple((name, positions.get(name, 1 << 30), self.defaults.get(name))
                                 for name in self.constexprs)


def _meta_of(kernel: Any, name_filter: re.Pattern[str]) -> KernelMeta:
    meta = kernel.__dict__.get(META_ATTR) if hasattr(kernel, "__dict__") else None
    if meta is None:
        meta = KernelMeta(kernel, name_filter)
        try:
            setattr(kernel, META_ATTR, meta)
        except Exception:
            pass
    return meta


def _int_or_none(value: Any) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, int) and not hasattr(value, "data_ptr"):
        return int(value)
    return None   # a device scalar or anything else: never read it


def _grid3(grid: Any) -> list[int | None] | None:
    try:
        size = len(grid)
    except TypeError:
        return None
    x = grid[0]
    y = grid[1] if size > 1 else 1
    z = grid[2] if size > 2 else 1
    if type(x) is int and type(y) is int and type(z) is int:
        return [x, y, z]
    return [_int_or_none(x), _int_or_none(y), _int_or_none(z)]


def _bound(meta: KernelMeta, args: tuple, kwargs: dict) -> dict[str, Any]:
    bound = dict(meta.defaults)
    for name, value in zip(meta.arg_names, args, strict=False):
        bound[name] = value
    bound.update(kwargs)
    bound.pop("grid", None)     # run's own keyword arguments, not the kernel's
    bound.pop("warmup", None)
    return bound


def launch_fields(meta: KernelMeta, args: tuple, kwargs: dict, grid: Any
                  ) -> tuple[list[int | None] | None, dict[str, Any]]:
    """(grid[3], constexprs) of one launch, from host values only."""
    if callable(grid):
        grid = grid(_bound(meta, args, kwargs))
    const: dict[str, Any] = {}
    nargs = len(args)
    for name, position, default in meta.const_slots:
        value = kwargs.get(name, default) if position >= nargs else args[position]
        if value is None or type(value) in _SCALAR_TYPES:
            const[name] = value
        else:
            value = getattr(value, "value", None)   # a tl.constexpr wrapper
            const[name] = value if isinstance(value, _SCALARS) else None
    return _grid3(grid), const


def launch_key(meta: KernelMeta, args: tuple, kwargs: dict, grid: Any) -> tuple:
    """What the eager sampling compares of one launch: the grid and the constexprs, raw
    where they are plain (a grid tuple of ints, int constexprs), without building the
    record. Equal keys give equal launch_fields; a callable grid is compared by its value."""
    if type(grid) is not tuple or callable(grid):
        grid3, const = launch_fields(meta, args, kwargs, grid)
        return (None if grid3 is None else tuple(grid3), tuple(const.values()))
    nargs = len(args)
    values = []
    for name, position, default in meta.const_slots:
        value = kwargs.get(name, default) if position >= nargs else args[position]
        if value is not None and type(value) not in _SCALAR_TYPES:
            value = getattr(value, "value", None)   # a tl.constexpr wrapper
            value = ("constexpr", value if isinstance(value, _SCALARS) else None)
        values.append(value)
    for item in grid:
        if type(item) is not int:
            return (tuple(_grid3(grid) or ()), tuple(values))
    return (grid, tuple(values))


def _num_warps(kwargs: dict, kernel: Any) -> Any:
    num_warps = kwargs.get("num_warps")
    if num_warps is None:
        num_warps = getattr(getattr(kernel, "metadata", None), "num_warps", None)
    return num_warps


class TritonRun(Handler):
    """Replaces ``run`` of JITFunction / InterpretedFunction with a recording one."""

    OPTIONS = {"name_regex": str, "launch_hook": bool}

    def __init__(self, spec: Any) -> None:
        super().__init__(spec)
        self.name_filter = kernel_filter(self.options)
        self.hook: LaunchHook | None = None

    def replacement(self, info: Any, runtime: Any) -> Any:
        from mlatrace.probe.engine import STATE

        original = info.func
        name_filter = self.name_filter
        target = info.target
        emit = record.emit
        local = _local
        capturing, current_gid = graphs.capturing, graphs.current_gid
        config = settings.current()
        use_hook = config.triton_launch_hook \
            or bool(self.options.get("launch_hook", False))
        if use_hook and info.attr == "run" \
                and "interpreter" not in info.target and self.hook is None:
            self.hook = LaunchHook(runtime, name_filter)
            self.hook.install()
        # The thread-local "inside run" flag only matters to the launch hook.
        flag = self.hook is not None and self.hook.installed
        sample = config.launch_every
        sampler = sampling.Sampler(runtime.spec.qualname, "kernel.launch", sample) \
            if sample else None
        if sampler is not None:
            runtime.samplers.append(sampler)
        # Launches step aside in steady steps like probed calls (sampling.StepAside),
        # unless every launch is wanted (no sampling) or the launch hook relies on run.
        aside = sampling.step_aside_for(runtime.spec.qualname, "kernel.launch") \
            if sampler is not None and not flag else sampling.Awake()
        seen = aside.seen
        step = graphs.STEP

        def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            # grid and warmup stay in kwargs (keyword-only in Triton's run): the launch's
            # arguments are passed on as they came, not packed into a new dict.
            if aside.asleep == step.value:      # stepped aside for the rest of this step
                aside.unseen += 1
                return original(self, *args, **kwargs)
            if kwargs.get("warmup") or runtime.disabled or not STATE.active:
                return original(self, *args, **kwargs)
            try:
                meta = _meta_of(self, name_filter)
            except Exception as exc:
                runtime.fail(target, exc)
                return original(self, *args, **kwargs)
            if not flag:
                kernel = original(self, *args, **kwargs)
            else:
                local.in_run = True
                try:
                    kernel = original(self, *args, **kwargs)
                finally:
                    local.in_run = False
            grid = kwargs.get("grid")
            if meta.wanted and not runtime.disabled:
                try:
                    if sampler is not None and not capturing():
                        # Eager: the first `sample` identical launches in a row (grid and
                        # constexprs, compared raw), then a sample.run with the run's
                        # exact length; the record is built only when it is kept.
                        key = launch_key(meta, args, kwargs, grid)
                        seen((meta, key))
                        repeat = sampler.keep(_run_of(meta), key, name=meta.name)
                        if repeat:
                            grid3, const = launch_fields(meta, args, kwargs, grid)
                            emit("kernel.launch", name=meta.name, grid=grid3,
                                 num_warps=_num_warps(kwargs, kernel), const=const,
                                 capturing=False, gid=current_gid(), repeat=repeat)
                        return kernel
                    grid3, const = launch_fields(meta, args, kwargs, grid)
                    if capturing():  # what a graph freezes: always recorded
                        emit("kernel.launch", name=meta.name, grid=grid3,
                             num_warps=_num_warps(kwargs, kernel), const=const,
                             capturing=True, gid=current_gid())
                        return kernel
                    emit("kernel.launch", name=meta.name, grid=grid3,
                         num_warps=_num_warps(kwargs, kernel), const=const,
                         capturing=False, gid=current_gid())
                except Exception as exc:
                    runtime.fail(target, exc)
            return kernel

        run.__qualname__ = getattr(original, "__qualname__", "run")
        run.__doc__ = getattr(original, "__doc__", None)
        run.__wrapped__ = original  # type: ignore[attr-defined]
        # Every launch looks `run` up on its class: a stepped-aside step's later
        # launches then run the original itself, not even the wrapper.
        sampling.may_take_off(aside, info.owner, info.attr, run, original)
        return run

    def close(self) -> None:
        if self.hook is not None:
            self.hook.uninstall()
            self.hook = None


class LaunchHook:
    """Triton's launch_enter_hook, for launches that do not go through ``run``."""

    def __init__(self, runtime: Any, name_filter: re.Pattern[str]) -> None:
        self.runtime = runtime
        self.name_filter = name_filter
        self.chain: Any = None
        self.previous: Any = None
        self.slot_owner: Any = None
        self.installed = False

    def __call__(self, metadata: Any) -> None:
        if getattr(_local, "in_run", False) or self.runtime.disabled:
            return
        try:
            data = getattr(metadata, "data", metadata)
            name = data.get("name") if isinstance(data, dict) else None
            if not name or not self.name_filter.search(name):
                return
            record.emit("kernel.launch", name=name, grid=_grid_from_frames(), num_warps=None,
                        const={}, capturing=graphs.capturing(), gid=graphs.current_gid())
        except Exception as exc:
            self.runtime.fail("triton.knobs:runtime.launch_enter_hook", exc)

    def install(self) -> None:
        knobs = sys.modules.get("triton.knobs")
        chain = getattr(getattr(knobs, "runtime", None), "launch_enter_hook", None)
        if chain is not None and hasattr(chain, "add"):
            chain.add(self)
            self.chain = chain
            self.installed = True
            return
        compiler = sys.modules.get("triton.compiler.compiler")
        owner = getattr(compiler, "CompiledKernel", None)
        if owner is not None and hasattr(owner, "launch_enter_hook"):
            previous = owner.launch_enter_hook
            self.previous, self.slot_owner = previous, owner

            def chained(metadata: Any) -> None:
                if previous is not None:
                    previous(metadata)
                self(metadata)

            self.slot_hook = chained
            owner.launch_enter_hook = chained
            self.installed = True

    def uninstall(self) -> None:
        self.installed = False
        if self.chain is not None:
            self.chain.remove(self)
            self.chain = None
        elif self.slot_owner is not None:
            if self.slot_owner.launch_enter_hook is getattr(self, "slot_hook", None):
                self.slot_owner.launch_enter_hook = self.previous
            self.slot_owner = None


def _grid_from_frames(max_depth: int = 6) -> list[int | None] | None:
    """gridX/Y/Z (the launcher) or grid_0/1/2 (JITFunction.run) from a calling frame."""
    frame = sys._getframe(2)
    depth = 0
    while frame is not None and depth < max_depth:
        local_vars = frame.f_locals
        if "gridX" in local_vars:
            return [_int_or_none(local_vars.get(k)) for k in ("gridX", "gridY", "gridZ")]
        if "grid_0" in local_vars:
            return [_int_or_none(local_vars.get(k)) for k in ("grid_0", "grid_1", "grid_2")]
        frame = frame.f_back
        depth += 1
    return None
