"""Stage the upstream files the GPU backend drivers import, into a git-ignored folder.

Never committed: the files come from the wheels (`pip download --no-deps vllm==0.33.0
sglang==0.5.23 -d /tmp/wheels`, unzipped into /tmp/src) and are copied unmodified. The
closure is computed statically from module-level imports (ast), so nothing is imported here.

SGLang's Triton decode module pulls `sglang.srt.utils` (a package whose __init__ imports
most of the server), `sglang/__init__.py` (the whole frontend) and the package inits of
`sglang.kernels`, `sglang.kernels.ops` (they import every kernel group) and
`sglang.kernels.ops.attention` (it registers the group, through msgspec). Those five
package inits are replaced by the stubs written below, and only those: every other file
is the wheel's own.

    python samples/gpu_backends/vendor.py /tmp/src .vendor
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

ENTRIES = {
    "vllm": ["vllm.v1.attention.ops.triton_decode_attention"],
    "sglang": ["sglang.kernels.ops.attention.decode_attention",
               "sglang.kernels.ops.attention.metadata"],
}

# module -> stub source; the only files not copied from the wheel
STUBS = {
    "sglang": '"""Stub: the wheel\'s sglang/__init__.py imports the whole frontend."""\n',
    "sglang.kernels": '"""Stub: the wheel\'s __init__ builds the registry of every kernel group."""\n',
    "sglang.kernels.ops": '"""Stub: the wheel\'s __init__ imports every op group (activation, gemm, ...)."""\n',
    "sglang.kernels.ops.attention": '"""Stub: the wheel\'s __init__ registers the group in the kernel registry (msgspec)."""\n',
    "sglang.srt.utils": '''"""Stub of sglang.srt.utils: the four helpers decode_attention.py imports,
as sglang 0.5.23 srt/utils/common.py defines them for CUDA (is_hip: torch.version.hip)."""
import functools

import torch


def is_hip() -> bool:
    return torch.version.hip is not None


def is_gfx95_supported() -> bool:
    return False


def is_gfx1250_supported() -> bool:
    return False


@functools.lru_cache(maxsize=8)
def get_device_core_count(device_id: int = 0) -> int:
    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(device_id).multi_processor_count
    return 0
''',
}


def _file_of(src: Path, module: str) -> Path | None:
    base = src.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _top_level_imports(tree: ast.Module, module: str, is_pkg: bool) -> set[str]:
    out: set[str] = set()
    stack = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue  # typing-only imports never run
        if isinstance(node, (ast.If, ast.Try)):
            stack += node.body + node.orelse + getattr(node, "finalbody", [])
            for handler in getattr(node, "handlers", []):
                stack += handler.body
        elif isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = module.split(".")
                base = parts if is_pkg else parts[:-1]
                base = base[:len(base) - (node.level - 1)]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            out.add(name)
            out |= {f"{name}.{a.name}" for a in node.names}
    return out


def closure(src: Path, roots: list[str], top: str) -> dict[str, Path]:
    found: dict[str, Path] = {}
    todo = list(roots)
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for i in range(1, len(parts) + 1):  # parent packages too
            name = ".".join(parts[:i])
            if name in found or name in STUBS or name.split(".")[0] != top:
                continue
            path = _file_of(src, name)
            if path is None:
                continue
            found[name] = path
            tree = ast.parse(path.read_text())
            todo += sorted(_top_level_imports(tree, name, path.name == "__init__.py"))
    return found


def main(src_dir: str, out_dir: str) -> None:
    src, out = Path(src_dir), Path(out_dir)
    for top, roots in ENTRIES.items():
        dest_root = out / top
        if dest_root.exists():
            shutil.rmtree(dest_root)
        files = closure(src, roots, top)
        for _name, path in sorted(files.items()):
            dest = dest_root / path.relative_to(src)
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, dest)
        for name, text in STUBS.items():
            if name.split(".")[0] != top:
                continue
            dest = dest_root / Path(*name.split(".")) / "__init__.py"
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(text)
        # namespace-less parents (sglang/srt has no __init__.py in the wheel) stay so
        print(f"{top}: {len(files)} modules copied, stubs: "
              f"{[n for n in STUBS if n.split('.')[0] == top]}")
    upstream = out / "upstream"  # read by steps.py (ast), never imported
    upstream.mkdir(parents=True, exist_ok=True)
    shutil.copy2(src / "vllm/v1/attention/backends/mla/triton_mla.py", upstream / "triton_mla.py")
    for info in src.glob("vllm-*.dist-info"):
        dest = out / "vllm" / info.name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(info, dest)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
