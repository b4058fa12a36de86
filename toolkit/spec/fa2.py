"""Compatibility rules for a line's flash-attn 2.x (`flash_attn_2.version`, its archs and patches), read from
knowledge/flash_attn_2.yaml and patches.yaml.

Each check takes (spec, kb) like the rules in toolkit/spec/rules.py (whose CHECKS registry names this module)
and returns the problem and its fix as one sentence, or None.
"""

from __future__ import annotations

from packaging.version import Version

from toolkit.knowledge.facts import Knowledge, arch_number
from toolkit.spec import patches
from toolkit.spec.check import Check
from toolkit.spec.envspec import EnvSpec


def archs_supported_by_flash_attn(spec: EnvSpec, kb: Knowledge) -> str | None:
    low = [arch for arch in spec.archs if arch_number(arch) < kb.fa_min_arch]
    if not low:
        return None
    return (
        f"{', '.join('sm_' + a for a in low)} below sm_{kb.fa_min_arch}: FlashAttention-2 needs Ampere or newer "
        f"(drop {'them' if len(low) > 1 else 'it'})"
    )


def archs_built_by_flash_attn(spec: EnvSpec, kb: Knowledge) -> str | None:
    req = kb.fa_requirement(spec.flash_attn_version)
    if not req or req.archs is None:
        return None
    skipped = [arch for arch in spec.archs if arch not in req.archs]
    if not skipped:
        return None
    return (
        f"flash-attn {spec.flash_attn_version}'s setup.py compiles only sm_{', sm_'.join(req.archs)} and silently "
        f"skips {', '.join('sm_' + a for a in skipped)} (drop {'them' if len(skipped) > 1 else 'it'}: sm_80 code "
        f"runs on sm_86/sm_89)"
    )


def flash_attn_released(spec: EnvSpec, kb: Knowledge) -> str | None:
    if spec.flash_attn_version in kb.fa_released:
        return None
    return (
        f"flash-attn {spec.flash_attn_version} is not a released version "
        f"(newest known: {kb.fa_released[-1]}; see toolkit/knowledge/flash_attn_2.yaml)"
    )


def flash_attn_cuda(spec: EnvSpec, kb: Knowledge) -> str | None:
    req = kb.fa_requirement(spec.flash_attn_version)
    if not req or spec.cuda not in kb.cuda_lines or Version(spec.cuda) >= Version(req.min_cuda):
        return None
    fitting = [
        v
        for v in kb.fa_released
        if (r := kb.fa_requirement(v)) and Version(r.min_cuda) <= Version(spec.cuda)
    ]
    advice = f"use flash-attn <= {fitting[-1]}" if fitting else "no flash-attn release supports it"
    return f"flash-attn {spec.flash_attn_version} needs CUDA >= {req.min_cuda} ({advice} for CUDA {spec.cuda})"


def flash_attn_torch(spec: EnvSpec, kb: Knowledge) -> str | None:
    req = kb.fa_requirement(spec.flash_attn_version)
    if not req or Version(spec.torch_version).release >= Version(req.min_torch).release:
        return None
    return (
        f"flash-attn {spec.flash_attn_version} needs torch >= {req.min_torch} (raise torch.version)"
    )


def flash_attn_patch_known(spec: EnvSpec, kb: Knowledge) -> str | None:
    """A build that needs a fix no patch provides would fail deep in the compile: refuse it here."""
    unmet = patches.spec_plan(spec).unmet
    if not unmet:
        return None
    need = unmet[0]
    covered = [
        v
        for v in kb.fa_released
        if not patches.plan("flash-attn", v, spec.torch_version).unmet
        and Version(v) >= Version(spec.flash_attn_version)
    ]
    advice = (
        f"use flash-attn {covered[-1]}, which a patch fixes" if covered else "no patched release"
    )
    return (
        f"flash-attn {spec.flash_attn_version} with torch {spec.torch_version} cannot build: {need.why}; "
        f"no patch in toolkit/knowledge/patches.yaml covers {spec.flash_attn_version} "
        f"({advice}, a torch that is not {need.when.torch}, or add a patch for it)"
    )


# (name, field, check), in the order `toolkit check` reports them
CHECKS: tuple[Check, ...] = (
    ("archs-supported-by-flash-attn", "archs", archs_supported_by_flash_attn),
    ("archs-built-by-flash-attn", "archs", archs_built_by_flash_attn),
    ("flash-attn-released", "flash_attn_2.version", flash_attn_released),
    ("flash-attn-cuda-floor", "flash_attn_2.version", flash_attn_cuda),
    ("flash-attn-torch-floor", "flash_attn_2.version", flash_attn_torch),
    ("flash-attn-patch-known", "flash_attn_2.version", flash_attn_patch_known),
)
