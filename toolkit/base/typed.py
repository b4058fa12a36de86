"""One pydantic TypeAdapter per type, built the first time a value of that type is read: building one costs
milliseconds a type, and every run paid for all of them at import, for files it never read."""

from __future__ import annotations

from typing import Any, TypeVar

import pydantic

T = TypeVar("T")

_BUILT: dict[object, pydantic.TypeAdapter[Any]] = {}


def adapter(kind: type[T]) -> pydantic.TypeAdapter[T]:
    """`kind`'s adapter, built once a process (two threads racing build it twice: harmless)."""
    if kind not in _BUILT:
        _BUILT[kind] = pydantic.TypeAdapter(kind)
    return _BUILT[kind]
