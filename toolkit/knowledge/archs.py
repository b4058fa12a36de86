"""Which GPU architectures a CUDA extension (.so / .o) carries, read from its ELF `.nv_fatbin` section.

Why pure Python: checking that a built wheel covers the requested archs must work where there is no
`cuobjdump` (a toolchain of nvcc alone, as NVIDIA's PyPI wheels make one). Where the line's toolchain or PATH
has `cuobjdump`, `cuobjdump_entries` gives the answer from NVIDIA's tool instead, and the tests compare the two
where both exist.

Fatbin container layout (little endian), as laid out by nvcc's `fatbinary` and checked here against
objects compiled by nvcc 13.0 with several -gencode targets (tests/test_build.py):
  container header, 16 bytes: u32 magic 0xBA55ED50, u16 version, u16 header size, u64 payload size;
  then entries, each: u16 kind (1 PTX, 2 ELF/cubin), u16 ?, u32 entry header size, u64 payload size,
  u32 compressed size, u32 ?, u16 minor, u16 major, u32 sm number (80, 90, 120 ...),
  u32 name offset, u32 name length, u64 flags (0x100000: arch-specific `a`, 0x200000: family `f`).
A linked library holds one container per object, each 8-byte aligned, in the same section.
"""

from __future__ import annotations

import re
import shutil
import struct
from dataclasses import dataclass
from pathlib import Path

from toolkit.base.children import run_tied
from toolkit.base.errors import ToolkitError
from toolkit.knowledge.facts import arch_number

FATBIN_MAGIC = 0xBA55ED50
KIND_NAMES = {1: "ptx", 2: "elf"}
FLAG_ARCH_SPECIFIC = 0x100000  # sm_90a
FLAG_FAMILY_SPECIFIC = 0x200000  # sm_100f
CONTAINER_HEADER = struct.Struct("<IHHQ")
ENTRY_HEADER = struct.Struct("<HHIQIIHHIIIQ")


@dataclass(frozen=True, order=True)
class FatbinEntry:
    kind: str  # "elf" (a cubin: runs on that sm) or "ptx" (JIT-compiled by the driver)
    arch: str  # "90", "90a", "100f"


def _section(data: bytes, name: bytes) -> bytes | None:
    """Bytes of one named section of a 64-bit little-endian ELF file, or None when absent."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(index: int) -> tuple[int, int, int]:
        name_off, _type, _flags, _addr, offset, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + index * shentsize
        )
        return name_off, offset, size

    _, strtab_off, _ = header(shstrndx)
    for index in range(shnum):
        name_off, offset, size = header(index)
        end = data.index(b"\0", strtab_off + name_off)
        if data[strtab_off + name_off : end] == name:
            return data[offset : offset + size]
    return None


def parse_fatbin(section: bytes) -> list[FatbinEntry]:
    """Every (kind, arch) entry in a `.nv_fatbin` section (one or more concatenated containers)."""
    entries: list[FatbinEntry] = []
    pos = 0
    while pos + CONTAINER_HEADER.size <= len(section):
        magic, _version, header_size, payload_size = CONTAINER_HEADER.unpack_from(section, pos)
        if magic != FATBIN_MAGIC:
            pos += 8  # alignment padding between containers
            continue
        entry_pos, end = pos + header_size, pos + header_size + payload_size
        while entry_pos + ENTRY_HEADER.size <= end:
            kind, _, entry_header, size, _, _, _, _, sm, _, _, flags = ENTRY_HEADER.unpack_from(
                section, entry_pos
            )
            suffix = (
                "a" if flags & FLAG_ARCH_SPECIFIC else "f" if flags & FLAG_FAMILY_SPECIFIC else ""
            )
            entries.append(FatbinEntry(KIND_NAMES.get(kind, f"kind{kind}"), f"{sm}{suffix}"))
            entry_pos += entry_header + size
        pos = (end + 7) // 8 * 8
    return sorted(set(entries))


def fatbin_entries(path: Path) -> list[FatbinEntry]:
    """The archs compiled into one object or shared library; [] when it has no device code."""
    try:
        data = Path(path).read_bytes()
        section = _section(data, b".nv_fatbin")
    except (OSError, ValueError, struct.error) as exc:
        raise ToolkitError(
            f"{path}: cannot read its ELF sections ({exc}; is it a complete CUDA extension?)"
        ) from None
    return parse_fatbin(section) if section else []


def cubin_archs(path: Path) -> set[str]:
    """The sm targets with machine code (cubins) in the file: what runs without JIT."""
    return {entry.arch for entry in fatbin_entries(path) if entry.kind == "elf"}


def cuobjdump_entries(path: Path, search_path: str | None = None) -> list[FatbinEntry] | None:
    """The same entries from NVIDIA's cuobjdump, found on `search_path` (a line's PATH: its toolchain's own
    first) or PATH; None where there is none or it cannot read the file. The `arch =` line of each
    `Fatbin elf code:` / `Fatbin ptx code:` block of `-res-usage`, not `--list-elf`, whose cubin names drop the
    family suffix (an sm_100f cubin is listed as k.1.sm_100.cubin by cuobjdump 13.2)."""
    tool = shutil.which("cuobjdump", path=search_path)
    if tool is None:
        return None
    done = run_tied(
        [tool, "-res-usage", str(path)], capture_output=True, text=True, errors="replace"
    )
    if done.returncode != 0:
        return None
    found = re.findall(
        r"^Fatbin (elf|ptx) code:\n(?:.*\n)*?arch = sm_(\d+[af]?)$", done.stdout, re.MULTILINE
    )
    return sorted({FatbinEntry(kind, arch) for kind, arch in found})


def cuobjdump_archs(path: Path, search_path: str | None = None) -> set[str] | None:
    """The cubin archs cuobjdump names (None without cuobjdump)."""
    entries = cuobjdump_entries(path, search_path)
    return None if entries is None else {e.arch for e in entries if e.kind == "elf"}


def compiled_entries(path: Path, search_path: str | None = None) -> list[FatbinEntry]:
    """cuobjdump's answer where the toolchain or PATH has it (NVIDIA's reading of its own format), else the
    pure-Python reader's; an empty answer from the tool is an output format we do not know."""
    from_tool = cuobjdump_entries(path, search_path)
    return from_tool if from_tool else fatbin_entries(path)


@dataclass(frozen=True)
class ArchCoverage:
    """A build's device code against the archs it declares: a cubin for each declared arch is required
    (missing: refused), anything more is said (extra cubins, PTX the driver would JIT) but not refused."""

    declared: tuple[str, ...]
    cubins: tuple[str, ...]
    ptx: tuple[str, ...]

    @classmethod
    def of(cls, declared: tuple[str, ...], entries: list[FatbinEntry]) -> ArchCoverage:
        def archs(kind: str) -> tuple[str, ...]:
            return tuple(
                sorted(
                    {e.arch for e in entries if e.kind == kind}, key=lambda a: (arch_number(a), a)
                )
            )

        return cls(tuple(declared), archs("elf"), archs("ptx"))

    @property
    def missing(self) -> list[str]:
        return [arch for arch in self.declared if arch not in self.cubins]

    @property
    def extra(self) -> list[str]:
        return [arch for arch in self.cubins if arch not in self.declared]

    def summary(self) -> str:
        """One line: the declared archs found, then what the build holds beyond them (said, not refused)."""
        extra = ([f"sm_{', sm_'.join(self.extra)} (not declared)"] if self.extra else []) + (
            [
                f"PTX compute_{', compute_'.join(self.ptx)} (the driver JIT-compiles it for newer GPUs)"
            ]
            if self.ptx
            else []
        )
        found = f"sm_{', sm_'.join(self.declared)} as declared"
        return f"{found}; also {'; '.join(extra)}" if extra else f"{found}, nothing else"
