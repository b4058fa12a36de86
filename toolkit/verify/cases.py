"""The verification cases: which API, precision, shape and feature each one exercises, per level.

`smoke` touches every API and feature once (well under 30 s on an H200); `full` crosses head dims,
precisions, masks and shapes the way upstream's test grid does, at sizes an fp32 reference handles
quickly (sequence lengths up to 2048), so the level stays under five minutes on one H200.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import itertools
import zlib
from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from types import ModuleType
from typing import Any

APIS = ("func", "qkvpacked", "kvpacked", "varlen", "kvcache")
DTYPES = ("float16", "bfloat16")
# Head dims 32..256 as upstream tests them, including ones that are not powers of two (and 59, 111:
# not multiples of 8, which flash-attn pads internally).
HEAD_DIMS = (32, 40, 59, 64, 80, 96, 111, 128, 160, 192, 224, 256)
FP8 = "float8_e4m3fn"  # an FP8 input (forward only; its output is bf16), for a suite that adds FP8 cases
SHORT_DTYPE = {"float16": "fp16", "bfloat16": "bf16", FP8: "fp8"}


@dataclass(frozen=True)
class Case:
    """One call of one flash-attn API, with everything needed to rebuild its inputs from its seed."""

    api: str
    dtype: str
    head_dim: int
    seqlen_q: int
    seqlen_k: int
    batch: int = 2
    nheads: int = 6
    nheads_k: int = 6
    causal: bool = False
    window: tuple[int, int] = (-1, -1)
    softcap: float = 0.0
    alibi: bool = False
    dropout_p: float = 0.0
    deterministic: bool = False
    new_tokens: int = 0  # kvcache: tokens appended to the cache by the call

    @property
    def backward(self) -> bool:
        return (
            self.api != "kvcache" and self.dtype != FP8
        )  # kvcache and the FP8 forward have no backward

    @property
    def name(self) -> str:
        parts = [
            self.api,
            SHORT_DTYPE[self.dtype],
            f"d{self.head_dim}",
            f"q{self.seqlen_q}",
            f"k{self.seqlen_k}",
        ]
        if self.nheads_k != self.nheads:
            parts.append(
                ("mqa" if self.nheads_k == 1 else "gqa") + f"{self.nheads}:{self.nheads_k}"
            )
        flags = [
            ("causal", self.causal),
            (f"window{self.window[0]},{self.window[1]}", self.window != (-1, -1)),
            (f"softcap{self.softcap:g}", self.softcap > 0),
            ("alibi", self.alibi),
            (f"dropout{self.dropout_p:g}", self.dropout_p > 0),
            ("deterministic", self.deterministic),
            (f"new{self.new_tokens}", self.new_tokens > 0),
        ]
        return "-".join(parts + [flag for flag, on in flags if on])

    @property
    def seed(self) -> int:
        """Stable across runs and machines, different for every case."""
        return zlib.crc32(self.name.encode())

    def params(self) -> dict:
        return asdict(self)

    def problem(self) -> str | None:
        """Why flash-attn cannot take this combination at all (a case generator bug), or None."""
        rules = [
            (self.api not in APIS, f"unknown api {self.api!r}"),
            (self.dtype not in (*DTYPES, FP8), f"unknown dtype {self.dtype!r}"),
            (self.dtype == FP8 and self.api != "func", "FP8 cases call flash_attn_func only"),
            (self.nheads % self.nheads_k != 0, "nheads must be a multiple of nheads_k"),
            (
                self.api == "qkvpacked"
                and (self.nheads_k != self.nheads or self.seqlen_q != self.seqlen_k),
                "qkvpacked needs equal heads and lengths",
            ),
            (
                self.softcap > 0 and self.dropout_p > 0,
                "softcap and dropout are not supported together",
            ),
            (
                self.api == "kvcache" and (self.dropout_p > 0 or self.deterministic),
                "kvcache has no dropout/backward",
            ),
            (self.api != "kvcache" and self.new_tokens > 0, "new_tokens is for kvcache"),
            (self.new_tokens >= self.seqlen_k, "the cache must have room for the new tokens"),
            (max(self.window) >= self.seqlen_k, "window sides must be shorter than seqlen_k"),
        ]
        return next((message for broken, message in rules if broken), None)


def _variants(base: Case, **axes: Iterable[Any]) -> list[Case]:
    """Every combination of the given field values applied to `base` (Any: each axis is a field of its own type,
    which `replace` checks by name)."""
    names = list(axes)
    return [
        replace(base, **dict(zip(names, values))) for values in itertools.product(*axes.values())
    ]


def smoke_cases() -> list[Case]:
    """Each API and each feature once, in both precisions."""
    return [
        Case("func", "bfloat16", 128, 512, 512),
        Case("func", "float16", 64, 113, 203, causal=True),
        Case("func", "bfloat16", 59, 256, 256),
        Case("func", "bfloat16", 256, 256, 256, window=(64, 32)),
        Case("func", "bfloat16", 80, 128, 217, softcap=50.0),
        Case("func", "float16", 128, 256, 256, causal=True, alibi=True),
        Case("func", "bfloat16", 64, 256, 256, dropout_p=0.17),
        Case("func", "bfloat16", 128, 256, 512, nheads_k=2, deterministic=True),
        Case("qkvpacked", "float16", 96, 256, 256, causal=True),
        Case("kvpacked", "float16", 128, 256, 512, nheads_k=1),
        Case("varlen", "bfloat16", 128, 300, 300, causal=True),
        Case("kvcache", "bfloat16", 128, 1, 512, nheads_k=2, causal=True, new_tokens=1),
    ]


def full_cases() -> list[Case]:
    """The full grid: head dims x precisions x masks, then shapes, GQA, each feature and each API."""
    both = {"dtype": DTYPES}
    cases = _variants(
        Case("func", "float16", 64, 113, 203), **both, head_dim=HEAD_DIMS, causal=(False, True)
    )
    cases += _variants(
        Case("func", "float16", 128, 1024, 1024),
        **both,
        head_dim=(64, 128, 256),
        causal=(False, True),
    )
    shapes = [
        (1, 239),
        (97, 97),
        (128, 217),
        (256, 512),
        (512, 256),
        (1023, 1024),
        (1024, 1023),
        (2048, 2048),
    ]
    cases += [
        replace(c, seqlen_q=sq, seqlen_k=sk)
        for sq, sk in shapes
        for c in _variants(Case("func", "float16", 128, 1, 1), **both, causal=(False, True))
    ]
    cases += _variants(
        Case("func", "float16", 128, 256, 512), **both, nheads_k=(1, 2), causal=(False, True)
    )
    cases += _variants(
        Case("func", "float16", 64, 512, 512, window=(128, 64)),
        **both,
        head_dim=(64, 128, 256),
        causal=(False, True),
    )
    cases += _variants(
        Case("func", "float16", 64, 113, 203, window=(50, 20)), **both, causal=(False, True)
    )
    cases += _variants(
        Case("func", "float16", 64, 256, 512, softcap=50.0),
        **both,
        head_dim=(64, 128, 256),
        causal=(False, True),
    )
    cases += _variants(
        Case("func", "float16", 64, 256, 256, alibi=True),
        **both,
        head_dim=(64, 128),
        causal=(False, True),
    )
    cases += _variants(
        Case("func", "float16", 64, 512, 512, dropout_p=0.17),
        **both,
        head_dim=(64, 128, 256),
        causal=(False, True),
    )
    cases += _variants(
        Case("func", "float16", 128, 512, 512, dropout_p=0.17, window=(128, 64)), **both
    )
    cases += _variants(
        Case("func", "float16", 64, 512, 512, deterministic=True),
        **both,
        head_dim=(64, 128, 256),
        causal=(False, True),
    )
    cases += _variants(
        Case("qkvpacked", "float16", 64, 512, 512),
        **both,
        head_dim=(32, 64, 128, 256),
        causal=(False, True),
    )
    cases += _variants(
        Case("qkvpacked", "float16", 64, 97, 97, dropout_p=0.17), **both, head_dim=(64, 128)
    )
    cases += _variants(
        Case("kvpacked", "float16", 64, 113, 203),
        **both,
        head_dim=(64, 128),
        nheads_k=(6, 2, 1),
        causal=(False, True),
    )
    cases += _variants(
        Case("varlen", "float16", 64, 256, 256),
        **both,
        head_dim=(32, 59, 64, 128, 256),
        causal=(False, True),
    )
    cases += _variants(
        Case("varlen", "float16", 128, 113, 203), **both, causal=(False, True), nheads_k=(6, 2)
    )
    cases += _variants(
        Case("varlen", "float16", 128, 512, 512),
        **both,
        causal=(False, True),
        window=((100, 50),),
        alibi=(False, True),
    )
    cases += _variants(Case("varlen", "float16", 128, 256, 256, softcap=50.0), **both)
    cases += _variants(
        Case("varlen", "float16", 64, 512, 512, dropout_p=0.17), **both, causal=(False, True)
    )
    cases += _variants(Case("varlen", "float16", 128, 384, 384, deterministic=True), **both)
    cases += _variants(
        Case("kvcache", "float16", 64, 1, 512, nheads_k=2),
        **both,
        head_dim=(64, 128, 256),
        causal=(False, True),
        new_tokens=(0, 1),
    )
    cases += _variants(
        Case("kvcache", "float16", 128, 64, 800),
        **both,
        causal=(False, True),
        nheads_k=(6, 1),
        new_tokens=(0, 16),
    )
    cases += _variants(
        Case("kvcache", "float16", 59, 3, 1024, window=(256, 0), causal=True, new_tokens=3), **both
    )
    return cases


LEVELS = {"smoke": smoke_cases, "full": full_cases}


# ---------------------------------------------------------------- what the suites judged by the knowledge share


PACKED_APIS = ("qkvpacked", "kvpacked")


def case_features(case: Case) -> set[str]:
    """The knowledge's feature names a case exercises (the implementation files' `features`, plus ones some lack)."""
    flags = {
        "causal": case.causal,
        "sliding_window": case.window != (-1, -1),
        "gqa": case.nheads_k != case.nheads,
        "softcap": case.softcap > 0,
        "varlen": case.api == "varlen",
        "backward": case.backward,
        "paged_kv": case.api == "kvcache",
        "kv_append": case.new_tokens > 0,
        "alibi": case.alibi,
        "dropout": case.dropout_p > 0,
        "deterministic": case.deterministic,
        "packed_api": case.api in PACKED_APIS,
    }
    return {name for name, on in flags.items() if on}


def extra_cases() -> list[Case]:
    """Listed features the shared smoke level reaches only combined with one an implementation may lack:
    GQA without the deterministic backward, paged KV without the cache append, a window with causal."""
    return [
        Case("func", "bfloat16", 128, 256, 512, nheads_k=2),
        Case("func", "float16", 64, 512, 512, nheads_k=1, causal=True),
        Case("kvcache", "bfloat16", 128, 1, 512, nheads_k=2, causal=True),
        Case("kvcache", "float16", 64, 64, 1024, causal=False),
        Case("func", "bfloat16", 128, 512, 512, window=(128, 0), causal=True),
        Case("varlen", "bfloat16", 64, 300, 300, nheads_k=2, softcap=30.0),
    ]


def level_with_extras(level: str, more: list[Case] | None = None) -> list[Case]:
    """The level's cases, then the extra combinations and `more`, each name once (the suites judged by the knowledge)."""
    seen, cases = set(), []
    for case in LEVELS[level]() + extra_cases() + (more or []):
        if case.name not in seen:
            seen.add(case.name)
            cases.append(case)
    return cases


def import_finding(module: str) -> tuple[ModuleType | None, str]:
    """The module, or why it does not import (not installed, built for another torch, a missing `cutlass`):
    a finding for the report, one line."""
    try:
        return importlib.import_module(module), ""
    except Exception as exc:
        return None, f"{type(exc).__name__}: {exc}"[:500]


def installed_version(distribution: str) -> str | None:
    """A distribution's version by its wheel name (the modules' own __version__ can say otherwise)."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
