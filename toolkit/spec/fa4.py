"""Compatibility rules for a line's `flash_attn_4:` section, read from knowledge/flash_attn_4.yaml.

Each check takes (spec, kb) like the rules in toolkit/spec/rules.py (whose CHECKS registry names this module) and returns
the problem and its fix as one sentence, or None; all of them run before anything is installed.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet

from toolkit.base.errors import ToolkitError
from toolkit.knowledge import fa4_pins
from toolkit.knowledge.facts import Knowledge
from toolkit.spec.check import Check
from toolkit.spec.envspec import EnvSpec


def _release(spec: EnvSpec) -> fa4_pins.Release | None:
    if spec.flash_attn_4 is None:
        return None
    try:
        return fa4_pins.release(spec.flash_attn_4.version)
    except ToolkitError:
        return None


def section_complete(spec: EnvSpec, kb: Knowledge) -> str | None:
    if spec.merged.get("flash_attn_4") and spec.flash_attn_4 is None:
        return 'flash_attn_4 needs a version (e.g. version: "4.0.0b36")'
    return None


def release_known(spec: EnvSpec, kb: Knowledge) -> str | None:
    if spec.flash_attn_4 is None or _release(spec) is not None:
        return None
    known = ", ".join(fa4_pins.knowledge()["releases"])
    return (
        f"flash-attn-4 {spec.flash_attn_4.version} has no hash-pinned wheels in flash_attn_4.yaml "
        f"(known: {known}; a weekly beta is pinned only once its wheels are read)"
    )


def archs_supported(spec: EnvSpec, kb: Knowledge) -> str | None:
    """FA4 on sm_80 runs the forward only (its backward asserts sm_90+): refused for a training line."""
    rel = _release(spec)
    if rel is None:
        return None
    low = [a for a in spec.archs if int("".join(ch for ch in a if ch.isdigit())) < rel.min_arch]
    if not low:
        return None
    return (
        f"flash-attn-4 {rel.version} needs sm_{rel.min_arch}+ (no backward below it; flash_attn_4.yaml "
        f"min_arch), the line builds for sm_{', sm_'.join(low)} (drop those archs or the flash_attn_4 section)"
    )


def cuda_flavor(spec: EnvSpec, kb: Knowledge) -> str | None:
    """nvidia-cutlass-dsl's libs-cuN flavor: one upstream publishes for the line's CUDA major, and pinned."""
    rel = _release(spec)
    major = spec.cuda.split(".")[0]
    if rel is None:
        return None
    if major not in rel.cuda_majors:
        return (
            f"nvidia-cutlass-dsl for flash-attn-4 {rel.version} comes for CUDA {', '.join(rel.cuda_majors)} "
            f"only, the line is CUDA {spec.cuda} (use a CUDA {' or '.join(rel.cuda_majors)} line)"
        )
    if major not in rel.pinned_cuda_majors:
        return (
            f"flash_attn_4.yaml pins the libs-cu{'/'.join(rel.pinned_cuda_majors)} flavor of nvidia-cutlass-dsl "
            f"only, the line is CUDA {spec.cuda} (pin nvidia-cutlass-dsl-libs-cu{major} there first)"
        )
    return None


def platforms_pinned(spec: EnvSpec, kb: Knowledge | None) -> str | None:
    """The lock pins FA4's compiled wheels per conda platform; a platform without pins cannot be locked."""
    rel = _release(spec)
    unpinned = [p for p in spec.platforms if p not in rel.platforms] if rel else []
    if rel is None or not unpinned:
        return None
    return (
        f"flash-attn-4 {rel.version} is pinned for {', '.join(rel.platforms)} only, the line also locks "
        f"{', '.join(unpinned)} (drop those platforms, or pin that platform's wheels in flash_attn_4.yaml)"
    )


def python_pinned(spec: EnvSpec, kb: Knowledge) -> str | None:
    """The release's Requires-Python, and the interpreter tag its compiled wheels were pinned for."""
    rel = _release(spec)
    if rel is None:
        return None
    if not SpecifierSet(rel.python).contains(spec.python):
        return f"flash-attn-4 {rel.version} needs Python {rel.python}, the line has {spec.python}"
    unfit = [w.file for w in rel.wheels if not fa4_pins.wheel_fits_python(w.file, spec.python)]
    if unfit:
        return (
            f"{len(unfit)} pinned wheels of flash-attn-4 {rel.version} do not run on Python {spec.python}, e.g. "
            f"{unfit[0]} (pin that interpreter's wheels in flash_attn_4.yaml)"
        )
    return None


def beside_flash_attn_2_known(spec: EnvSpec, kb: Knowledge) -> str | None:
    """FA4 beside flash-attn 2.x: both write flash_attn/cute. The toolkit resolves it in one folder (FA2's
    copy gives way, toolkit/fa4/install.py hand_over_cute) only for FA2 versions whose package the knowledge has
    read (beside_flash_attn_2); any other is refused before anything is installed."""
    if spec.flash_attn_4 is None or not spec.flash_attn_4.with_flash_attn_2:
        return None
    known = fa4_pins.knowledge()["beside_flash_attn_2"]
    if spec.flash_attn_version in known:
        return None
    return (
        f"flash-attn-4 beside flash-attn {spec.flash_attn_version}: both install flash_attn/cute and the "
        f"knowledge has not read that FA2's package (beside_flash_attn_2 knows {', '.join(known)}; use one of "
        f"those, or set flash_attn_4.with_flash_attn_2: false for FA4 instead of FA2)"
    )


# (name, field, check), in the order `toolkit check` reports them
CHECKS: tuple[Check, ...] = (
    ("fa4-section-complete", "flash_attn_4", section_complete),
    ("fa4-release-known", "flash_attn_4.version", release_known),
    ("fa4-archs-supported", "archs", archs_supported),
    ("fa4-cuda-flavor", "cuda", cuda_flavor),
    ("fa4-python-pinned", "python", python_pinned),
    ("fa4-platforms-pinned", "platforms", platforms_pinned),
    ("fa4-beside-flash-attn-2-known", "flash_attn_4.with_flash_attn_2", beside_flash_attn_2_known),
)
