"""What the frameworks that pick an attention backend accept: transformers' `attn_implementation` names and verl's
attention settings and flash-attn routing (knowledge/attention_backends.yaml `transformers`, `verl`).

Read here, in the knowledge wing, because `toolkit knowledge check-updates` judges them against the newest
releases; toolkit/attention/backends.py (the backends themselves) hands `verl` on to the attention wing.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

from toolkit.knowledge import files as knowledge_files

FILE = "attention_backends.yaml"


@dataclass(frozen=True)
class PinnedFile:
    """A file on PyPI by url and sha256: what env/download.py's cache fetches (its Pin)."""

    url: str
    filename: str
    sha256: str
    size: int


@dataclass(frozen=True)
class VerlFlashAttn:
    """How verl's pyproject asks for flash-attn: the extra that pins it and the uv index it routes it through."""

    extra: str
    pin: str
    index: str  # [tool.uv.sources] flash-attn = {index = ...}; "" where it comes from PyPI
    index_url: str


@dataclass(frozen=True)
class Transformers:
    """The transformers release whose `attn_implementation` names the backends were read from."""

    version: str
    attn_implementations: tuple[str, ...]  # AttentionInterface's names there (and "eager")


@dataclass(frozen=True)
class Verl:
    version: str  # the verl release these facts were read from
    default_attn_implementation: str  # what verl uses when the config names none
    models: tuple[str, ...]  # config sections that take an override_config
    override_key: str
    trainer_config: str  # the wheel's generated trainer config (the test checks the keys there)
    wheel: PinnedFile  # the release's wheel on PyPI, which holds trainer_config
    flash_attn: tuple[VerlFlashAttn, ...]  # each extra of verl's that pins flash-attn

    def keys(self) -> list[str]:
        """`actor_rollout_ref.model.override_config.attn_implementation`, one per model section."""
        return [f"{model}.{self.override_key}" for model in self.models]


@cache
def verl() -> Verl:
    return knowledge_files.typed(
        FILE,
        lambda data: Verl(
            str(data["verl"]["version"]),
            data["verl"]["default_attn_implementation"],
            tuple(data["verl"]["models"]),
            data["verl"]["override_key"],
            data["verl"]["trainer_config"],
            _pinned(data["verl"]["wheel"]),
            tuple(
                VerlFlashAttn(str(e["extra"]), str(e["pin"]), str(e["index"]), str(e["index_url"]))
                for e in data["verl"]["flash_attn"]
            ),
        ),
    )


@cache
def transformers() -> Transformers:
    return knowledge_files.typed(
        FILE,
        lambda data: Transformers(
            str(data["transformers"]["version"]),
            tuple(str(n) for n in data["transformers"]["attn_implementations"]),
        ),
    )


def _pinned(entry: dict[str, Any]) -> PinnedFile:
    return PinnedFile(
        str(entry["url"]), str(entry["file"]), str(entry["sha256"]), int(entry["size"])
    )
