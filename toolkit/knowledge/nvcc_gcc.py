"""The newest gcc an nvcc accepts: one answer for the spec rule (rules.py) and the machine check (machine/checks.py).

nvcc refuses a newer host gcc in its crt/host_config.h (`#if __GNUC__ > 15` ... "unsupported GNU version").
Where that header was read, its number is the cap; otherwise the line's `max_gcc` in
toolkit/knowledge/cuda_lines.yaml, which records the same header of each CUDA release, with its source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.knowledge.facts import Knowledge

CUDA_LINES_FILE = "toolkit/knowledge/cuda_lines.yaml"


@dataclass(frozen=True)
class GccCap:
    """The newest gcc major one nvcc accepts, and the file that says so."""

    max_gcc: int
    source: str

    def accepts(self, gcc_major: int) -> bool:
        return gcc_major <= self.max_gcc


def host_config_cap(host_config_h: str | None) -> int | None:
    """`#if __GNUC__ > 15` in nvcc's crt/host_config.h -> 15 (the check behind 'unsupported GNU version')."""
    if not host_config_h:
        return None
    try:
        match = re.search(
            r"#if\s+__GNUC__\s*>\s*(\d+)", Path(host_config_h).read_text(errors="replace")
        )
    except OSError:
        return None
    return int(match.group(1)) if match else None


def gcc_cap(
    cuda: str | None, kb: Knowledge, header_cap: int | None = None, host_config_h: str | None = None
) -> GccCap | None:
    """The cap of nvcc `cuda` (a line like '12.6'): the header's where it was read (`header_cap`, from
    `host_config_h`), else the knowledge's; None when neither knows this nvcc."""
    if header_cap is not None:
        return GccCap(header_cap, host_config_h or "crt/host_config.h")
    line = kb.cuda_lines.get(cuda or "")
    return GccCap(line.max_gcc, CUDA_LINES_FILE) if line else None


def lines_accepting(gcc_major: int, kb: Knowledge) -> list[str]:
    """The CUDA lines whose nvcc accepts this gcc, oldest first (the knowledge's order)."""
    return [cuda for cuda in kb.cuda_lines if (cap := gcc_cap(cuda, kb)) and cap.accepts(gcc_major)]
