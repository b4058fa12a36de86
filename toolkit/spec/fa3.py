"""Compatibility rules for a line's `flash_attn_3:` section, read from knowledge/flash_attn_3.yaml.

Each check takes (spec, kb) like the rules in toolkit/spec/rules.py (whose CHECKS registry names this module) and returns the
problem and its fix as one sentence, or None; all of them run before anything is fetched or compiled.
"""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from toolkit.base.errors import ToolkitError
from toolkit.knowledge import fa3_pins
from toolkit.knowledge.facts import Knowledge
from toolkit.spec.check import Check
from toolkit.spec.envspec import EnvSpec

KNOWLEDGE = "toolkit/knowledge/flash_attn_3.yaml"


def _commit(spec: EnvSpec) -> fa3_pins.Fa3Commit | None:
    if spec.flash_attn_3 is None:
        return None
    try:
        return fa3_pins.commit(spec.flash_attn_3.commit)
    except ToolkitError:
        return None


def _profile(spec: EnvSpec) -> fa3_pins.Profile | None:
    if spec.flash_attn_3 is None:
        return None
    try:
        return fa3_pins.profile(spec.flash_attn_3.profile)
    except ToolkitError:
        return None


def section_complete(spec: EnvSpec, kb: Knowledge) -> str | None:
    if spec.merged.get("flash_attn_3") and spec.flash_attn_3 is None:
        return (
            f"flash_attn_3 needs both commit and profile (e.g. commit: {next(iter(_known('commits')))}, "
            f"profile: hopper-training)"
        )
    return None


def _known(section: str) -> list[str]:
    return list(fa3_pins.knowledge()[section])


def commit_known(spec: EnvSpec, kb: Knowledge) -> str | None:
    if spec.flash_attn_3 is None or _commit(spec) is not None:
        return None
    return (
        f"FlashAttention-3 commit {spec.flash_attn_3.commit} is not pinned in {KNOWLEDGE} (use one of "
        f"{', '.join(_known('commits'))}, or pin that commit's archives there first)"
    )


def profile_known(spec: EnvSpec, kb: Knowledge) -> str | None:
    if spec.flash_attn_3 is None or _profile(spec) is not None:
        return None
    return (
        f"no FlashAttention-3 profile {spec.flash_attn_3.profile!r} in {KNOWLEDGE} "
        f"(use one of {', '.join(_known('profiles'))})"
    )


def archs_have_sm90(spec: EnvSpec, kb: Knowledge) -> str | None:
    """hopper/setup.py compiles sm_90a (wgmma, TMA) whatever it is asked: a line without 90 has no GPU for it."""
    found = _commit(spec)
    if found is None or {found.required_arch, found.required_arch + "a"} & set(spec.archs):
        return None
    return (
        f"FlashAttention-3 runs on sm_{found.required_arch}a only (Hopper), the line builds for "
        f'sm_{", sm_".join(spec.archs)} (add "{found.required_arch}" to archs or drop flash_attn_3)'
    )


def archs_cover_profile(spec: EnvSpec, kb: Knowledge) -> str | None:
    """A profile that keeps the sm_80 kernels compiles them for nothing on a line without arch 80."""
    chosen = _profile(spec)
    if chosen is None or not chosen.sm80 or "80" in spec.archs:
        return None
    return (
        f'FlashAttention-3 profile {chosen.name} compiles sm_80 kernels too, the line has no arch 80 (add "80" '
        f"to archs, or pick a profile with FLASH_ATTENTION_DISABLE_SM80 such as hopper-full)"
    )


def cuda_supported(spec: EnvSpec, kb: Knowledge) -> str | None:
    """Offline, setup.py builds with the line's own nvcc only for CUDA 12.8 and 13.0+ (else it downloads one)."""
    found = _commit(spec)
    if found is None or any(SpecifierSet(s).contains(spec.cuda) for s in found.cuda):
        return None
    return (
        f"FlashAttention-3 at {found.commit[:12]} builds with the line's own nvcc only for CUDA "
        f"{' or '.join(found.cuda)} (other releases make its setup.py download nvcc 12.6 and ptxas 12.8); "
        f"the line is CUDA {spec.cuda} (use a CUDA 12.8 or 13.x line)"
    )


def torch_in_range(spec: EnvSpec, kb: Knowledge) -> str | None:
    found = _commit(spec)
    if found is None or SpecifierSet(found.torch).contains(Version(spec.torch_version).public):
        return None
    return (
        f"FlashAttention-3 at {found.commit[:12]} is known to build its stable-ABI wheel for torch "
        f"{found.torch}, the line has torch {spec.torch_version} (use such a torch, or widen torch in "
        f"{KNOWLEDGE} after a build against it)"
    )


def python_supported(spec: EnvSpec, kb: Knowledge) -> str | None:
    found = _commit(spec)
    if found is None or SpecifierSet(found.python).contains(spec.python):
        return None
    return f"FlashAttention-3 at {found.commit[:12]} needs Python {found.python}, the line has {spec.python}"


def beside_flash_attn_2(spec: EnvSpec, kb: Knowledge) -> str | None:
    """FA3 beside FA2 in one environment: only where the knowledge has read FA2's top-level names."""
    if spec.flash_attn_3 is None or not spec.flash_attn_3.with_flash_attn_2:
        return None
    theirs = fa3_pins.fa2_top_level(spec.flash_attn_version)
    ours = fa3_pins.installs()[0]
    if theirs is not None and not set(theirs) & set(ours):
        return None
    clash = (
        f"both install {', '.join(sorted(set(theirs) & set(ours)))}"
        if theirs
        else "its top-level names are unread"
    )
    return (
        f"FlashAttention-3 beside flash-attn {spec.flash_attn_version}: {clash} (use a flash-attn 2.x listed "
        f"in {KNOWLEDGE} beside_flash_attn_2, or set flash_attn_3.with_flash_attn_2: false)"
    )


# (name, field, check), in the order `toolkit check` reports them
CHECKS: tuple[Check, ...] = (
    ("fa3-section-complete", "flash_attn_3", section_complete),
    ("fa3-commit-known", "flash_attn_3.commit", commit_known),
    ("fa3-profile-known", "flash_attn_3.profile", profile_known),
    ("fa3-archs-have-sm90", "archs", archs_have_sm90),
    ("fa3-archs-cover-profile", "archs", archs_cover_profile),
    ("fa3-cuda-supported", "cuda", cuda_supported),
    ("fa3-torch-in-range", "torch.version", torch_in_range),
    ("fa3-python-supported", "python", python_supported),
    ("fa3-beside-flash-attn-2", "flash_attn_3.with_flash_attn_2", beside_flash_attn_2),
)
