"""Redaction of argv and environment before anything reaches a trace file.

A trace is shared in bug reports and CI artifacts, so secrets must never be
written: flag values of secret-looking options become `***`, and only an
allow-list of environment variables is recorded at all.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence

from mlatrace.settings import PREFIX

REDACTED = "***"
# Matched against the dash/underscore-separated parts of a name, so that
# --hf-token and VLLM_API_KEY are secret but --max-num-batched-tokens and
# --tokenizer (which a serving engineer needs to see) are not.
SECRET_PARTS = {"token", "key", "apikey", "secret", "password", "passwd", "pwd",
                "credential", "credentials", "auth"}
SECRET_SUBSTRINGS = ("secret", "password", "passwd")
_SECRET_FLAGS = {"--api-key", "--hf-token", "--token"}
_ALLOWED_ENV_EXACT = {
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
}
_ALLOWED_ENV_PREFIXES = (PREFIX, "VLLM_", "SGLANG_")
# A value that looks like a credential even where its flag name does not say so.
_SECRET_VALUE = re.compile(r"^(sk-|hf_|ghp_|gho_|xox[bap]-|AKIA)[A-Za-z0-9_\-]{6,}")


def is_secret_name(name: str) -> bool:
    """True when an option or variable name suggests its value is a secret."""
    lowered = name.lower().lstrip("-")
    if any(word in lowered for word in SECRET_SUBSTRINGS):
        return True
    parts = re.split(r"[-_.]", lowered)
    return any(part in SECRET_PARTS or part.endswith(("token", "key")) for part in parts)


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Copy of argv with the values of secret flags (and secret-looking values) replaced."""
    out: list[str] = []
    redact_next = False
    for arg in argv:
        if redact_next:
            out.append(REDACTED)
            redact_next = False
            continue
        if arg.startswith("-") and "=" in arg:
            flag, _, value = arg.partition("=")
            if flag in _SECRET_FLAGS or is_secret_name(flag):
                out.append(f"{flag}={REDACTED}")
                continue
            out.append(f"{flag}={REDACTED}" if _SECRET_VALUE.match(value) else arg)
            continue
        if arg.startswith("-") and (arg in _SECRET_FLAGS or is_secret_name(arg)):
            out.append(arg)
            redact_next = True
            continue
        out.append(REDACTED if _SECRET_VALUE.match(arg) else arg)
    return out


def allowed_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment variables a trace may record: an allow-list, minus secret names;
    a path below the working directory as a path relative to it (`relative_to_cwd`)."""
    kept: dict[str, str] = {}
    for name, value in environ.items():
        if name in _ALLOWED_ENV_EXACT or name.startswith(_ALLOWED_ENV_PREFIXES):
            kept[name] = (REDACTED if is_secret_name(name) or _SECRET_VALUE.match(value)
                          else relative_to_cwd(value))
    return kept


def relative_to_cwd(value: str, cwd: str | None = None) -> str:
    """`value` with each absolute path below the working directory (or a list of them,
    os.pathsep-separated) made relative to it: a trace names the files of a checkout the
    same on every machine. Other values are kept as they are."""
    if os.sep not in value:
        return value
    base = (cwd or os.getcwd()).rstrip(os.sep) + os.sep
    parts = value.split(os.pathsep)
    if not any(p.startswith(base) or p == base[:-1] for p in parts):
        return value
    return os.pathsep.join("." if p == base[:-1] else p[len(base):] if p.startswith(base)
                           else p for p in parts)
