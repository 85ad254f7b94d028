"""Print the installed vLLM's probe targets: where they live and their signatures.

Usage: VENV/bin/python tests/e2e_vllm/inspect_vllm.py > signatures.md

Feeds tests/e2e_vllm/NOTES.md, so the probe packs are written against the
real vLLM rather than a guess. Classes that define forward_mqa or an MLA
metadata builder are found by parsing the sources (ast, no import), then
imported one by one: modules that need a GPU stack report why they don't
import instead of failing the whole listing.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import sys
from pathlib import Path

FIXED = [
    "vllm.v1.attention.backends.mla.cpu_mla:CPUMLAImpl.forward_mqa",
    "vllm.v1.attention.backends.mla.cpu_mla:CPUMLABackend.get_builder_cls",
    "vllm.model_executor.layers.attention.mla_attention:MLACommonImpl.forward_mqa",
    "vllm.model_executor.layers.attention.mla_attention:MLAAttention.forward",
    "vllm.model_executor.layers.attention.mla_attention:MLAAttention.forward_impl",
    "vllm.model_executor.layers.attention.mla_attention:MLACommonMetadataBuilder.__init__",
    "vllm.model_executor.layers.attention.mla_attention:MLACommonMetadataBuilder.build",
    "vllm.model_executor.layers.attention.mla_attention:MLACommonMetadataBuilder._build_decode",
    "vllm.model_executor.layers.attention.mla_attention:MLACommonMetadataBuilder.build_for_cudagraph_capture",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._dummy_run",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.capture_model",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner.execute_model",
    "vllm.v1.worker.gpu_model_runner:GPUModelRunner._build_attention_metadata",
    "vllm.v1.worker.cpu_model_runner:CPUModelRunner._dummy_run",
    "vllm.v1.worker.cpu_model_runner:CPUModelRunner.capture_model",
    "vllm.v1.worker.cpu_model_runner:CPUModelRunner.warming_up_model",
    "vllm.v1.worker.cpu_worker:CPUWorker.__init__",
    "vllm.v1.worker.cpu_worker:CPUWorker.init_device",
    "vllm.v1.worker.cpu_worker:CPUWorker.compile_or_warm_up_model",
    "vllm.v1.worker.gpu_worker:Worker.compile_or_warm_up_model",
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner._dummy_run",
    "vllm.v1.worker.gpu.model_runner:GPUModelRunner.capture_model",
    "vllm.compilation.cuda_graph:CUDAGraphWrapper.__init__",
    "vllm.compilation.cuda_graph:CUDAGraphWrapper.__call__",
    "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper.__init__",
    "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper.__call__",
    "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper._capture",
    "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphWrapper._replay",
    "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphCapture.__init__",
    "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphCapture.add_eager",
    "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphCapture.replay",
    "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphCapture._begin_segment",
    "vllm.compilation.breakable_cudagraph:BreakableCUDAGraphCapture._end_segment",
    "vllm.v1.cudagraph_dispatcher:CudagraphDispatcher.dispatch",
    "vllm.v1.worker.gpu.cudagraph_utils:CudaGraphManager.dispatch",
    "vllm.v1.attention.backends.rocm_aiter_fa:AiterFlashAttentionImpl.forward",
    "vllm.v1.attention.backends.rocm_aiter_fa:AiterFlashAttentionMetadataBuilder.build",
    "vllm.distributed.parallel_state:get_tensor_model_parallel_rank",
    "vllm.distributed.parallel_state:get_tensor_model_parallel_world_size",
    "vllm.distributed.parallel_state:get_world_group",
    "vllm.distributed.parallel_state:init_distributed_environment",
    "vllm.distributed.parallel_state:initialize_model_parallel",
]


def resolve(target: str) -> tuple[object | None, str]:
    """Import module:Qual.name; return (object, error)."""
    mod_name, qual = target.split(":")
    try:
        obj: object = importlib.import_module(mod_name)
    except Exception as exc:  # noqa: BLE001 - report, go on
        return None, f"import failed: {type(exc).__name__}: {str(exc)[:120]}"
    for part in qual.split("."):
        try:
            obj = inspect.getattr_static(obj, part) if isinstance(obj, type) else getattr(obj, part)
        except AttributeError:
            return None, f"missing attribute {part!r}"
        if isinstance(obj, (staticmethod, classmethod)):
            obj = obj.__func__
    return obj, ""


def source_signature(target: str) -> str | None:
    """The def line of module:Class.method read from source (for modules that don't import here)."""
    import vllm

    mod_name, qual = target.split(":")
    base = Path(vllm.__file__).parent.joinpath(*mod_name.split(".")[1:])
    path = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
    if not path.exists():
        return None
    node: ast.AST = ast.parse(path.read_text(errors="replace"))
    for part in qual.split("."):
        body = getattr(node, "body", [])
        match = [n for n in body if isinstance(n, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                 and n.name == part]
        if not match:
            return None
        node = match[0]
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    ret = f" -> {ast.unparse(node.returns)}" if node.returns else ""
    return f"({ast.unparse(node.args)}){ret} — source `{path.name}:{node.lineno}`"


def describe(target: str) -> str:
    obj, err = resolve(target)
    if obj is None:
        src = source_signature(target) if err.startswith("import failed") else None
        if src:
            return f"- `{target}{src}` (from source; {err})"
        return f"- `{target}`: **{err}**"
    try:
        sig = str(inspect.signature(obj))  # type: ignore[arg-type]
    except (TypeError, ValueError):
        sig = "(?)"
    where = ""
    inner = inspect.unwrap(obj)  # type: ignore[arg-type]
    try:
        src = inspect.getsourcefile(inner)  # type: ignore[arg-type]
        line = inspect.getsourcelines(inner)[1]  # type: ignore[arg-type]
        where = f" — defined in `{Path(src).name}:{line}`, `{inner.__qualname__}`"  # type: ignore[union-attr]
    except (TypeError, OSError):
        pass
    if inner is not obj:
        where += f" (decorated: wrapper from `{getattr(obj, '__module__', '?')}`)"
    return f"- `{target}{sig}`{where}"


def scan(vllm_dir: Path, method: str, base_hint: str | None = None) -> list[str]:
    """module:Class.method for every class whose body defines method (or whose name has base_hint)."""
    found = []
    for path in sorted(vllm_dir.rglob("*.py")):
        text = path.read_text(errors="replace")
        if method not in text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        mod = ".".join(("vllm",) + path.relative_to(vllm_dir).with_suffix("").parts)
        for node in tree.body:
            if not isinstance(node, ast.ClassDef):
                continue
            if base_hint is not None and base_hint not in node.name:
                continue
            names = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
            if method in names:
                found.append(f"{mod}:{node.name}.{method}")
    return found


def main() -> int:
    import vllm

    vllm_dir = Path(vllm.__file__).parent
    print(f"# vLLM {vllm.__version__} at {vllm_dir}\n")
    print("## Fixed targets\n")
    for target in FIXED:
        print(describe(target))
    print("\n## Every class defining forward_mqa\n")
    for target in scan(vllm_dir, "forward_mqa"):
        print(describe(target))
    print("\n## MLA metadata builders (classes named *Builder defining build or _build_decode)\n")
    for method in ("build", "_build_decode"):
        for target in scan(vllm_dir, method, base_hint="Builder"):
            if "mla" in target.lower() or "MLA" in target:
                print(describe(target))
    return 0


if __name__ == "__main__":
    sys.exit(main())
