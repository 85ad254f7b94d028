"""Host-side values of the path language: what ptr(), shape(), len(), min(), max(), sum()
and dtype() read, and plain(), the JSON-safe copy of a value. Nothing here reads device
memory: reductions apply to lists, tuples and host (CPU) arrays only.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any


def is_tensor(value: Any) -> bool:
    return hasattr(value, "data_ptr") and hasattr(value, "device")


def on_host(value: Any) -> bool:
    """True for objects whose values can be read without touching a device."""
    if isinstance(value, (list, tuple, range)):
        return True
    is_cpu = getattr(value, "is_cpu", None)     # a tensor's own flag: no device object
    if type(is_cpu) is bool:
        return is_cpu
    device = getattr(value, "device", None)
    if device is None:
        return hasattr(value, "__array_interface__")
    return getattr(device, "type", device) == "cpu"


def ptr_of(value: Any) -> int | None:
    data_ptr = getattr(value, "data_ptr", None)
    if data_ptr is None:
        return None
    try:
        return int(data_ptr())
    except Exception:
        return None


def shape_of(value: Any) -> list[int] | None:
    shape = getattr(value, "shape", None)
    if shape is None:
        return None
    # torch.Size and numpy shapes are tuples of Python ints.
    return list(shape) if isinstance(shape, tuple) else None


def len_of(value: Any) -> int | None:
    if value is None:
        return None
    try:
        shape = getattr(value, "shape", None)
        if isinstance(shape, tuple) and shape:
            return int(shape[0])        # an array's length (Tensor.__len__ is Python)
        return len(value)
    except Exception:
        return None


_SMALL = 256


def _small_host_ints(value: Any) -> list | None:
    """A 1-D host tensor of at most _SMALL ints as a list (one copy), else None."""
    shape = getattr(value, "shape", None)
    if not isinstance(shape, tuple) or len(shape) != 1 or shape[0] > _SMALL:
        return None
    items = value.tolist()
    return items if all(type(item) is int for item in items) else None


def reducer(name: str) -> Callable[[Any], Any]:
    builtin = {"min": min, "max": max, "sum": sum}[name]

    def apply(value: Any) -> Any:
        if value is None or not on_host(value):
            return None
        try:
            if isinstance(value, (list, tuple, range)):
                return builtin(value) if len(value) else None
            # A few host values (sequence lengths per request): one copy to a list
            # costs a fraction of a tensor reduction and its .item().
            items = _small_host_ints(value)
            if items is not None:
                return builtin(items) if items else None
            if len_of(value) == 0:
                return None
            return plain(getattr(value, name)())
        except Exception:
            return None

    return apply


def host_values_key(value: Any) -> Any:
    """What min/max/sum/len of a host sequence depend on, read once for a probe's key:
    its values (a tuple), else (the value's type, min, max, sum, len) as the fields read
    them. Equal keys give equal reductions."""
    if type(value) is tuple or type(value) is range:
        return value
    if type(value) is list:
        return tuple(value)
    try:
        if value is not None and on_host(value):
            items = _small_host_ints(value)
            if items is not None:
                return tuple(items)
    except Exception:
        pass
    return (type(value), FUNC_IMPL["min"](value), FUNC_IMPL["max"](value),
            FUNC_IMPL["sum"](value), len_of(value))


def dtype_of(value: Any) -> str | None:
    dtype = getattr(value, "dtype", None)
    return None if dtype is None else str(dtype)


FUNC_IMPL: dict[str, Callable[[Any], Any]] = {
    "ptr": ptr_of,
    "shape": shape_of,
    "len": len_of,
    "min": reducer("min"),
    "max": reducer("max"),
    "sum": reducer("sum"),
    "dtype": dtype_of,
    "isnone": lambda value: value is None,
    "notnone": lambda value: value is not None,
}


SCALAR_TYPES = frozenset((type(None), bool, int, float, str))


def plain(value: Any) -> Any:
    """A JSON-safe copy of value; tensors and unknown objects become None (never read)."""
    if type(value) in SCALAR_TYPES:
        return value
    if type(value) is list:
        for item in value:
            if type(item) not in SCALAR_TYPES:
                break
        else:
            return value
    if isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if is_tensor(value):
        # A 0-d host tensor is a number we may read; anything else stays unread.
        if on_host(value) and getattr(value, "ndim", 1) == 0:
            try:
                return value.item()
            except Exception:
                return None
        return None
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    as_dict = getattr(value, "_asdict", None)
    if as_dict is not None and isinstance(value, tuple):
        return plain(as_dict())     # NamedTuple keys such as vLLM's BatchDescriptor
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    fields = getattr(value, "__dataclass_fields__", None)
    if fields is not None and not isinstance(value, type):
        return {name: plain(getattr(value, name, None)) for name in fields}
    item = getattr(value, "item", None)
    if item is not None and hasattr(value, "dtype") and getattr(value, "ndim", 1) == 0:
        try:
            return item()  # numpy scalar
        except Exception:
            return None
    return None


def shape_plain(value: Any) -> list | None:
    """plain(_shape(value)) without a second walk when the items are ints (the usual)."""
    shape = getattr(value, "shape", None)
    if shape is None or not isinstance(shape, tuple):
        return None
    items = list(shape)
    for item in items:
        if type(item) is not int:
            return plain(items)
    return items


def raw_shape(value: Any) -> tuple | None:
    """The shape as the object holds it (torch.Size, a tuple): compared, never copied."""
    shape = getattr(value, "shape", None)
    return shape if isinstance(shape, tuple) else None


def raw_dtype(value: Any) -> Any:
    """The dtype object itself (str() of it is what a record holds)."""
    return getattr(value, "dtype", None)


def raw_key(value: Any) -> Any:
    """A tuple of scalars as it is (a grid, say; plain() would copy it to a list), else
    plain(value)."""
    if type(value) is tuple:
        for item in value:
            if type(item) not in SCALAR_TYPES:
                return plain(value)
        return value
    return plain(value)
