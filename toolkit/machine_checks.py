"""Can this machine build flash-attn? The checks `toolkit build`'s preflight and `toolkit doctor` share.

Each check turns the toolchain fingerprint into a Finding with one policy: preflight refuses a build on
every `fail` (one line each) and prints every `warn`; doctor shows each finding as a row. The policy for
a torch/nvcc CUDA mismatch is torch's own (torch/utils/cpp_extension.py `_check_cuda_version`): across
CUDA majors it raises, within a major it only logs a warning and builds.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from toolkit.fingerprint import Fingerprint
from toolkit.knowledge import load_knowledge, minor_of

CUDA_LINES_FILE = "toolkit/knowledge/cuda_lines.yaml"


@dataclass(frozen=True)
class Finding:
    """One verdict on the machine: ok | warn | fail, the file or tool it is about, what is wrong, the fix."""

    status: str
    where: str
    message: str
    fix: str = ""

    def line(self) -> str:
        """The house one-line form, `where: problem (fix)`, as preflight reports it."""
        return f"{self.where}: {self.message}" + (f" ({self.fix})" if self.fix else "")


def host_gcc_cap(host_config_h: str | None) -> int | None:
    """`#if __GNUC__ > 15` in nvcc's crt/host_config.h -> 15 (the check behind 'unsupported GNU version')."""
    if not host_config_h:
        return None
    try:
        match = re.search(r"#if\s+__GNUC__\s*>\s*(\d+)", Path(host_config_h).read_text(errors="replace"))
    except OSError:
        return None
    return int(match.group(1)) if match else None


def cuda_tag(cuda: str) -> str:
    """'12.6' -> 'cu126', the tag of torch's wheel index."""
    return "cu" + cuda.replace(".", "")


def torch_vs_nvcc(fp: Fingerprint) -> Finding | None:
    """torch's CUDA against nvcc's, judged as torch's cpp_extension judges them when flash-attn builds."""
    torch, have = fp.torch, fp.nvcc_line
    if not torch or not torch.cuda or not have:
        return None
    want = minor_of(torch.cuda)
    where = f"{torch.path}/version.py"
    if have == want:
        return Finding("ok", where, f"torch {torch.version} and nvcc both CUDA {have}")
    fix = (f"use a CUDA {want} nvcc (conda cuda-nvcc {want}.*, or CUDA_HOME of a {want} toolkit), "
           f"or torch's {cuda_tag(have)} build")
    built = f"torch {torch.version} built for CUDA {torch.cuda}, nvcc is {have}"
    if have.split(".")[0] != want.split(".")[0]:
        return Finding("fail", where, f"{built}: torch refuses to build extensions across CUDA majors", fix)
    return Finding("warn", where, f"{built}: torch builds with a warning within a CUDA major; the line's lock "
                                  f"keeps them equal", fix)


def gcc_vs_nvcc(fp: Fingerprint, host_cap: int | None) -> Finding | None:
    """The host gcc against the newest one nvcc accepts: its crt/host_config.h where read (`host_cap`),
    else the line's cap in toolkit/knowledge/cuda_lines.yaml."""
    if not fp.gcc_major or not fp.cxx_path:
        return None
    line = load_knowledge().cuda_lines.get(fp.nvcc_line or "")
    cap, source = (host_cap, fp.host_config_h) if host_cap else (line.max_gcc if line else None, CUDA_LINES_FILE)
    if cap is None:
        return Finding("ok", fp.cxx_path, f"{fp.gcc_version} at {fp.cxx_path}")
    if int(fp.gcc_major) > cap:
        return Finding("fail", fp.cxx_path, f"gcc {fp.gcc_version} is newer than nvcc {fp.nvcc_line} accepts "
                                            f"(max gcc {cap}, per {source})",
                       f"use gcc <= {cap}: conda gxx {cap}.*, or CC=gcc-{cap} CXX=g++-{cap}")
    return Finding("ok", fp.cxx_path, f"{fp.gcc_version} (nvcc {fp.nvcc_line} accepts <= {cap})")
