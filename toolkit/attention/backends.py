"""The attention backends a recommendation may name: knowledge/attention_backends.yaml (verl's settings, read in
toolkit/knowledge/frameworks.py, are handed on from here).

One table, so that a new backend (FA3's `flash-attn-3`) is a knowledge entry: recommend, its reader, doctor
and the verl lines all take their backend names, attn_implementation values and verification kinds from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Literal

from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.frameworks import FILE
from toolkit.knowledge.frameworks import verl as verl  # read below this wing, for check-updates


@dataclass(frozen=True)
class AttentionBackend:
    name: str  # the bench's implementation name
    attn_implementation: str  # transformers' name for it
    verified_by: Literal[
        "report", "torch"
    ]  # a verification report on the GPU, or torch's own (the yardstick)
    sdpa_backend: str | None = None  # the SDPA kernel inside "sdpa" (SDPBackend.X)
    distribution: str | None = None  # the package transformers needs for the name
    bench_field: str | None = None  # bench.json's entry holding the package's version
    formerly: tuple[
        str, ...
    ] = ()  # what it was called before issue 31 (schema 1 files, old command lines)

    def to_json(self) -> dict[Literal["name", "sdpa_backend"], str]:
        """What a recommendation rule stores: transformers' name and, inside sdpa, the kernel."""
        out: dict[Literal["name", "sdpa_backend"], str] = {"name": self.attn_implementation}
        if self.sdpa_backend:
            out["sdpa_backend"] = self.sdpa_backend
        return out


def _backend(name: str, entry: dict[str, Any]) -> AttentionBackend:
    if entry["verified_by"] not in ("report", "torch"):
        raise ValueError(
            f"backends.{name}.verified_by: {entry['verified_by']!r} is not report or torch"
        )
    return AttentionBackend(
        name,
        str(entry["attn_implementation"]),
        entry["verified_by"],
        entry.get("sdpa_backend"),
        entry.get("distribution"),
        entry.get("bench_field"),
        tuple(str(old) for old in entry.get("formerly", ())),
    )


@cache
def backends() -> dict[str, AttentionBackend]:
    return knowledge_files.typed(
        FILE, lambda data: {name: _backend(name, entry) for name, entry in data["backends"].items()}
    )


def names() -> tuple[str, ...]:
    return tuple(backends())


def renamed() -> dict[str, str]:
    """Each earlier name -> the name now (`flash-attn` -> `flash-attn-2`, `fa4` -> `flash-attn-4`): what an old
    file or an old command line says is read as the new name."""
    return {old: name for name, b in backends().items() for old in b.formerly}


def current(name: str) -> str:
    """The name now of an implementation named either way (a name not renamed is returned as it is)."""
    return renamed().get(name, name)


def torch_backends() -> tuple[str, ...]:
    """torch's own kernels: verified wherever the verification yardstick runs."""
    return tuple(name for name, b in backends().items() if b.verified_by == "torch")


def packaged() -> tuple[str, ...]:
    """Backends that need a verification report (`--verified BACKEND=REPORT`)."""
    return tuple(name for name, b in backends().items() if b.verified_by == "report")


def by_attn_implementation(name: str) -> AttentionBackend | None:
    """The backend an attn_implementation value selects by itself (not sdpa, where torch picks the kernel)."""
    return next(
        (b for b in backends().values() if b.attn_implementation == name and not b.sdpa_backend),
        None,
    )
