"""Compatibility knowledge (CUDA lines, torch releases, flash-attn releases), read from data files.

The facts live in toolkit/knowledge/*.yaml with their sources; this module only types them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from toolkit.knowledge import files as knowledge_files


@dataclass(frozen=True)
class CudaLine:
    version: str  # "12.6"
    max_gcc: int
    min_driver: str
    archs: tuple[str, ...]
    torch_index: str | None  # None: PyTorch ships no wheels for the line
    conda_channels: tuple[str, ...]

    @property
    def tag(self) -> str:
        """The wheel-index tag of the line: 12.6 -> cu126."""
        return "cu" + self.version.replace(".", "")


@dataclass(frozen=True)
class TorchRelease:
    minor: str  # "2.7"
    cuda: tuple[str, ...]
    experimental: tuple[str, ...]
    python: tuple[str, ...]
    pypi: str | None = None  # the CUDA release PyPI's own Linux wheels of the minor are built with


@dataclass(frozen=True)
class FlashAttnRequirement:
    versions: SpecifierSet
    min_cuda: str
    min_torch: str
    archs: tuple[str, ...] | None  # what its setup.py can compile; None: not recorded


@dataclass(frozen=True)
class NvccBuild:
    """One published build of conda-forge's cuda-nvcc-impl and the host gcc its run_constrained allows."""

    version: str  # "12.4.131"
    numbers: tuple[int, ...]  # build numbers sharing this constraint
    gcc: str  # gcc_impl_<plat> constraint as the recipe writes it, e.g. ">=6,<13"
    commit: str  # cuda-nvcc-impl-feedstock commit whose recipe made it

    def allows(self, gcc_major: int) -> bool:
        """gcc N.0 stands for the major: a bound like <13.3a0 still admits gcc 13."""
        return SpecifierSet(self.gcc).contains(Version(f"{gcc_major}.0"), prereleases=True)


@dataclass(frozen=True)
class NvccPackaging:
    """What a line's nvcc package lets the conda solver install beside it; builds empty: not known."""

    channel: str
    builds: tuple[NvccBuild, ...]

    def allowed_gcc(self, gcc_major: int) -> bool:
        return any(b.allows(gcc_major) for b in self.builds)


@dataclass(frozen=True)
class PypiLine:
    """A CUDA release whose toolchain comes from NVIDIA's PyPI wheels (pypi_cuda.yaml, the `pypi` kind)."""

    cuda: str  # "13.2"
    cuda_toolkit: str  # the cuda-toolkit meta wheel, "13.2.2"
    components: dict[
        str, str
    ]  # wheel name -> the version the meta wheel's extras pin (==<version>.*)
    pins: dict[str, str]  # floating components -> the specifier that keeps them this release's
    symlinks: dict[str, str]  # link under cuda_home -> its target, relative to the link's directory
    torch: tuple[
        str, ...
    ]  # every torch whose PyPI wheels pin this cuda_toolkit, oldest first; () none

    def pairs_with(self, torch: str) -> bool:
        return any(Version(torch) == Version(paired) for paired in self.torch)


@dataclass(frozen=True)
class PypiCuda:
    """pypi_cuda.yaml: the lines, what every line shares, and why CUDA 12 cannot be one."""

    lines: dict[str, PypiLine]  # by cuda-toolkit release; a CUDA release may have several
    cuda_home: str  # relative to site-packages
    extras: tuple[str, ...]  # the cuda-toolkit extras a flash-attn build installs
    platforms: tuple[str, ...]  # the platforms the wheels were read for
    cuda_12: str

    @property
    def cudas(self) -> list[str]:
        """The CUDA releases with a pypi line, in the file's order."""
        return list(dict.fromkeys(line.cuda for line in self.lines.values()))

    def releases(self, cuda: str) -> list[PypiLine]:
        return [line for line in self.lines.values() if line.cuda == cuda]

    def release(self, cuda_toolkit: str) -> PypiLine | None:
        """The line of a cuda-toolkit wheel's version ('13.0.3.0' is 13.0.3); None: unknown or not a version."""
        try:
            wanted = Version(cuda_toolkit)
        except InvalidVersion:
            return None
        return next(
            (line for line in self.lines.values() if Version(line.cuda_toolkit) == wanted), None
        )

    def line(self, cuda: str, torch: str) -> PypiLine | None:
        """The cuda-toolkit release of CUDA `cuda` whose torch is `torch`: the one a pypi spec locks."""
        return next((line for line in self.releases(cuda) if line.pairs_with(torch)), None)


@dataclass(frozen=True)
class Knowledge:
    cuda_lines: dict[str, CudaLine]
    torch_releases: dict[str, TorchRelease]
    fa_requirements: tuple[FlashAttnRequirement, ...]
    fa_released: tuple[str, ...]
    fa_min_arch: int
    nvcc_packaging: dict[str, NvccPackaging]
    pypi: PypiCuda
    ran_archs: dict[
        int, tuple[str, ...]
    ]  # arch number -> the GPUs of this project that ran its kernels

    def never_ran(self, archs: tuple[str, ...]) -> list[str]:
        """The archs no GPU of this project has run kernels of: their cubins are checked, not run."""
        return [arch for arch in archs if arch_number(arch) not in self.ran_archs]

    def torch_lines(self, cuda: str) -> list[str]:
        """Torch minors with a wheel for this CUDA line, oldest first."""
        return [r.minor for r in self.torch_releases.values() if cuda in r.cuda]

    def fa_requirement(self, version: str) -> FlashAttnRequirement | None:
        for req in self.fa_requirements:
            if req.versions.contains(Version(version), prereleases=True):
                return req
        return None


@cache
def load_knowledge() -> Knowledge:
    requirements, released, min_arch = knowledge_files.typed("flash_attn_2.yaml", _flash_attn)
    return Knowledge(
        cuda_lines=knowledge_files.typed("cuda_lines.yaml", _cuda_lines),
        torch_releases=knowledge_files.typed("torch_releases.yaml", _torch_releases),
        fa_requirements=requirements,
        fa_released=released,
        fa_min_arch=min_arch,
        nvcc_packaging=knowledge_files.typed("conda_forge_nvcc.yaml", _nvcc_packaging),
        pypi=knowledge_files.typed("pypi_cuda.yaml", _pypi_cuda),
        ran_archs=knowledge_files.typed(
            "gpus.yaml", lambda data: {int(a): tuple(f["gpus"]) for a, f in data["ran"].items()}
        ),
    )


def _cuda_lines(data: dict) -> dict[str, CudaLine]:
    return {
        version: CudaLine(
            version=version,
            max_gcc=int(facts["max_gcc"]),
            min_driver=facts["min_driver"],
            archs=tuple(facts["archs"]),
            torch_index=facts["torch_index"],
            conda_channels=tuple(facts["conda_channels"]),
        )
        for version, facts in data["lines"].items()
    }


def _torch_releases(data: dict) -> dict[str, TorchRelease]:
    return {
        minor: TorchRelease(
            minor=minor,
            cuda=tuple(facts["cuda"]),
            experimental=tuple(facts.get("experimental", ())),
            python=tuple(facts["python"]),
            pypi=facts.get("pypi"),
        )
        for minor, facts in data["releases"].items()
    }


def _pypi_cuda(data: dict) -> PypiCuda:
    lines = {
        str(release): PypiLine(
            cuda=str(facts["cuda"]),
            cuda_toolkit=str(release),
            components={str(k): str(v) for k, v in facts["components"].items()},
            pins={str(k): str(v) for k, v in facts["pins"].items()},
            symlinks={str(k): str(v) for k, v in facts["symlinks"].items()},
            torch=tuple(str(t) for t in facts["torch"]),
        )
        for release, facts in data["lines"].items()
    }
    return PypiCuda(
        lines=lines,
        cuda_home=str(data["cuda_home"]),
        extras=tuple(data["extras"]),
        platforms=tuple(data["platforms"]),
        cuda_12=str(data["cuda_12"]),
    )


def _flash_attn(data: dict) -> tuple[tuple[FlashAttnRequirement, ...], tuple[str, ...], int]:
    """(the requirements per version range, the released versions, the lowest sm any release builds)."""
    requirements = tuple(
        FlashAttnRequirement(
            SpecifierSet(r["versions"]),
            r["min_cuda"],
            r["min_torch"],
            tuple(r["archs"]) if "archs" in r else None,
        )
        for r in data["requirements"]
    )
    return requirements, tuple(data["released"]), int(data["min_arch"])


def _nvcc_packaging(data: dict) -> dict[str, NvccPackaging]:
    return {
        version: NvccPackaging(
            facts["channel"],
            tuple(
                NvccBuild(b["version"], tuple(b["numbers"]), b["gcc"], b["commit"])
                for b in facts["builds"]
            ),
        )
        for version, facts in data["lines"].items()
    }


def minor_of(version: str) -> str:
    """'2.7.1+cu126' -> '2.7'; '2' -> '2.0' (the same version, PEP 440)."""
    release = (*Version(version).release, 0)
    return f"{release[0]}.{release[1]}"


def arch_number(arch: str) -> int:
    """'90a' -> 90, '100f' -> 100."""
    return int(arch.rstrip("af"))
