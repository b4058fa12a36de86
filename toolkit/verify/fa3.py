"""Verify FlashAttention-3 (flash_attn_interface) with the same cases, fp32 reference and criterion as FA2 and FA4.

FA3's API at the pinned commit (knowledge/flash_attn_3.yaml, sources `interface`) has FA2's functions without
dropout, ALiBi and the kv-packed entry point, so `Fa3Backend` puts it behind FA2's signatures and the unchanged
runner judges bf16 and fp16, forward and backward. Which cases a build can take comes from the line's profile:
the knowledge maps each dtype, feature and head-dim kernel to the FLASH_ATTENTION_DISABLE_* switch that removes
it, and a case that needs something the profile switched off (or the API lacks) is recorded "unsupported" with
that reason, never failed and never skipped silently.

FP8 (e4m3) is forward only. Its inputs are e4m3 values with per-(batch, kv head) descale factors, as upstream's
hopper/test_flash_attn.py calls it; the reference runs on those exact values in fp32. Two checks judge the output:
upstream's rule (at most 2x the error of torch computing the same attention with P rounded to e4m3), and a bound
derived from e4m3's precision alone (`Fp8Bound`), so a kernel is held to what the format allows even where
torch's own FP8 run is loose.

`toolkit verify LINE --impl flash-attn-3` runs it (reports/LINE/flash-attn-3/verify.json by default): a Suite
(toolkit/verify/suite.py) whose build profile is the line's flash_attn_3.profile.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

from toolkit.verify.cases import FP8, Case, import_finding, installed_version, level_with_extras
from toolkit.verify.cases import case_features as shared_features
from toolkit.verify.suite import Device, Fa2Adapter, KvCache, Lengths, Options, Run, Tensor

if TYPE_CHECKING:
    from toolkit.spec.envspec import EnvSpec
    from toolkit.verify.parity import ParityResult
    from toolkit.verify.runner import CaseResult

DEVICE = "cuda"
PACKAGE = "flash-attn-3 (flash_attn_interface)"
LEVEL_PREFIX = "fa3-"
WITH_PARITY: tuple[str, ...] = ("parity",)  # a report of its own: the kernels' levels carry none
ATTN_IMPLEMENTATION = "flash_attention_3"  # transformers' name for FA3 (its parity level)


# ---------------------------------------------------------------- which cases the line's build can take


def case_features(case: Case) -> set[str]:
    """The knowledge's feature names a case exercises: FA4's, with each packed or cache API named on its own
    (FA3 has qkvpacked and a plain KV cache, but no kvpacked; paging is not needed for its cache call)."""
    names = shared_features(case) - {"packed_api", "paged_kv"}
    return names | ({case.api} if case.api in ("qkvpacked", "kvpacked", "kvcache") else set())


def head_dim_kernel(head_dim: int, off: set[str], kernels: dict) -> int | None:
    """The head-dim kernel a head dim runs on: the smallest one left in that is >= it (round_up_headdim)."""
    return next(
        (int(k) for k in sorted(kernels, key=int) if head_dim <= int(k) and kernels[k] not in off),
        None,
    )


def unsupported_reason(case: Case, profile: Any, arch: int, knowledge: dict) -> str:
    """Why the line's FA3 build cannot take this case, or "" when it can. `profile`: knowledge.fa3_pins.Profile."""
    rules, off = knowledge["verification"], set(profile.switches)
    where = f"profile {profile.name} (flash_attn_3.yaml)"
    if arch // 10 != 9 and not (arch // 10 == 8 and profile.sm80 and case.dtype != FP8):
        return f"{where} builds no kernel for sm_{arch}{' (FP8 needs sm_90)' if case.dtype == FP8 else ''}"
    dtype = rules["dtypes"][case.dtype]
    if dtype["switch"] in off:
        return f"{case.dtype} left out by {where}: {dtype['switch']}"
    if case.head_dim % dtype["head_dim_multiple_of"]:
        return (
            f"head dim {case.head_dim} is not a multiple of {dtype['head_dim_multiple_of']} for {case.dtype} "
            f"(FA3 refuses it; flash_attn_3.yaml verification)"
        )
    if head_dim_kernel(case.head_dim, off, rules["head_dim_kernels"]) is None:
        kept = [int(k) for k, switch in rules["head_dim_kernels"].items() if switch not in off]
        return f"head dim {case.head_dim} above every head-dim kernel of {where} (built: {kept})"
    features = case_features(case)
    absent = sorted(features & set(rules["absent"]))
    if absent:
        return f"FA3 has no {', '.join(absent)} (flash_attn_interface.py at the pinned commit)"
    removed = sorted(
        f"{name} ({rules['features'][name]})"
        for name in features
        if rules["features"].get(name) in off
    )
    unknown = sorted(features - set(rules["features"]))
    if unknown:
        return f"flash_attn_3.yaml verification.features does not list {', '.join(unknown)}"
    return f"left out by {where}: {', '.join(removed)}" if removed else ""


def fp8_cases(level: str) -> list[Case]:
    """FP8 forward: both masks, GQA, uneven lengths; `full` adds every head-dim kernel."""
    cases = [
        Case("func", FP8, 128, 512, 512),
        Case("func", FP8, 64, 113, 203, causal=True),
        Case("func", FP8, 128, 256, 512, nheads_k=2, causal=True),
    ]
    if level == "full":
        cases += [
            Case("func", FP8, d, 1024, 1024, causal=causal)
            for d in (64, 96, 128, 192, 256)
            for causal in (False, True)
        ]
    return cases


def fa3_cases(level: str) -> list[Case]:
    """The shared level, FA4's extra combinations (GQA without determinism, a cache without append, ...), FP8."""
    return level_with_extras(level, fp8_cases(level))


# ---------------------------------------------------------------- FP8: the bound e4m3 allows


@dataclass(frozen=True)
class Fp8Bound:
    """How far FA3's FP8 forward may be from the fp32 reference on the same e4m3 inputs (knowledge `fp8`).

    The inputs are exact (the reference reads the very e4m3 values), their products exact in fp32; what rounds
    is P. FA3 scales P to (0, 2^offset] and rounds it to e4m3: relative error <= u = 2^-(mantissa_bits + 1) where
    P >= 2^min_normal_exponent, absolute error <= 2^(subnormal_exponent - 1) below. With weights w_j = P_j / l
    perturbed by at most u relative and renormalised, sum_j |w~_j - w_j| <= 2u / (1 - u); below the normals the
    absolute error over l >= 2^offset is at most 2 * 2^(subnormal_exponent - 1 - offset) per key. So per output
    element |O - O_ref| <= 2u/(1-u) * (W|V|) + seqlen_k * 2^(subnormal_exponent - offset) * max|V| + the bf16
    output's rounding, 2^-8 |O_ref|."""

    unit_roundoff: float
    subnormal_weight_error: float  # per key, after normalisation
    output_roundoff: float = 2.0**-8  # bf16: 7 stored mantissa bits, round to nearest

    @classmethod
    def from_knowledge(cls, knowledge: dict) -> Fp8Bound:
        fp8 = knowledge["verification"]["fp8"]
        return cls(
            2.0 ** -(int(fp8["mantissa_bits"]) + 1),
            2.0 ** (int(fp8["subnormal_exponent"]) - int(fp8["softmax_offset_bits"])),
        )

    @property
    def weight_error(self) -> float:
        return 2 * self.unit_roundoff / (1 - self.unit_roundoff)

    def elementwise(
        self, weighted_abs_v: Tensor, out_ref: Tensor, max_abs_v: float, seqlen_k: int
    ) -> Tensor:
        """The bound for every output element (tensors of the output's shape)."""
        return (
            self.weight_error * weighted_abs_v
            + seqlen_k * self.subnormal_weight_error * max_abs_v
            + self.output_roundoff * out_ref.abs()
        )


def fp8_inputs(case: Case, device: Device) -> tuple[list, list]:
    """([q, k, v] in e4m3, [q, k, v]_descale of shape (batch, nheads_k), fp32 in [0, 2)) as upstream draws them."""
    import torch

    torch.manual_seed(case.seed)
    shapes = [
        (case.batch, case.seqlen_q, case.nheads),
        (case.batch, case.seqlen_k, case.nheads_k),
        (case.batch, case.seqlen_k, case.nheads_k),
    ]
    tensors = [
        torch.randn(*s, case.head_dim, device=device).to(torch.float8_e4m3fn) for s in shapes
    ]
    descales = [torch.rand(case.batch, case.nheads_k, device=device) * 2 for _ in range(3)]
    return tensors, descales


def descaled(x: Tensor, descale: Tensor, heads: int) -> Tensor:
    """The fp32 values FA3 computes with: e4m3 x times its (batch, kv head) descale, spread over query heads."""
    group = heads // descale.shape[1]
    return x.float() * descale.repeat_interleave(group, dim=1)[:, None, :, None]


def fp8_reference(case: Case, tensors: list, descales: list) -> tuple[Any, Any, Any]:
    """(fp32 reference out, W|V| for the bound, torch's run with P rounded to e4m3: upstream's yardstick)."""
    import torch

    from toolkit.verify import reference

    q, k, v = (descaled(x, d, x.shape[2]) for x, d in zip(tensors, descales))
    options: dict[str, Any] = dict(causal=case.causal, window=case.window, softcap=case.softcap)
    out_ref, probs = reference.attention_ref(q, k, v, **options)
    weighted_abs_v, _ = reference.attention_ref(q, k, v.abs(), **options)
    group = case.nheads // case.nheads_k
    rounded = probs.to(torch.float8_e4m3fn).float()
    torch_fp8 = torch.einsum("bhts,bshd->bthd", rounded, v.repeat_interleave(group, dim=2)).to(
        torch.bfloat16
    )
    return out_ref, weighted_abs_v, torch_fp8


def check_fp8(module: Any, case: Case, device: Device, bound: Fp8Bound) -> list:
    from toolkit.verify import criterion

    tensors, descales = fp8_inputs(case, device)
    out = module.flash_attn_func(
        *tensors,
        causal=case.causal,
        window_size=case.window,
        softcap=case.softcap,
        q_descale=descales[0],
        k_descale=descales[1],
        v_descale=descales[2],
    )
    out = out[0] if isinstance(out, tuple) else out
    out_ref, weighted_abs_v, torch_fp8 = fp8_reference(case, tensors, descales)
    v = descaled(tensors[2], descales[2], tensors[2].shape[2])
    allowed = bound.elementwise(weighted_abs_v, out_ref, float(v.abs().max()), case.seqlen_k)
    ratio = float(((out.float() - out_ref).abs() / (allowed + criterion.OUTPUT.epsilon)).max())
    within = criterion.Check(
        "out within the e4m3 bound (error/bound, elementwise)", ratio, 1.0, ratio <= 1.0
    )
    return [criterion.relative_to_torch("out", out, out_ref, torch_fp8, criterion.OUTPUT), within]


# ---------------------------------------------------------------- FA3 behind FA2's signatures


def _out(result: Any) -> Any:
    """FA3's functions give out alone, or (out, lse) where asked for the LSE (and in older commits)."""
    return result[0] if isinstance(result, tuple) else result


class Fa3Backend(Fa2Adapter):
    """flash_attn_interface behind FA2's function signatures (the runner's contract): its own calls."""

    NAME = "flash_attn_interface"

    def func(self, q: Tensor, k: Tensor, v: Tensor, options: Options) -> Tensor:
        return _out(self.module.flash_attn_func(q, k, v, **asdict(options)))

    def qkvpacked(self, qkv: Tensor, options: Options) -> Tensor:
        return _out(self.module.flash_attn_qkvpacked_func(qkv, **asdict(options)))

    def varlen(self, q: Tensor, k: Tensor, v: Tensor, lengths: Lengths, options: Options) -> Tensor:
        return _out(
            self.module.flash_attn_varlen_func(
                q,
                k,
                v,
                lengths.cu_seqlens_q,
                lengths.cu_seqlens_k,
                lengths.max_seqlen_q,
                lengths.max_seqlen_k,
                **asdict(options),
            )
        )

    def kvcache(self, q: Tensor, cache: KvCache, options: Options) -> Tensor:
        """The in-place append at cache_seqlens; FA3's cache call takes no softmax_scale or determinism here."""
        return _out(
            self.module.flash_attn_with_kvcache(
                q,
                cache.k_cache,
                cache.v_cache,
                k=cache.k,
                v=cache.v,
                cache_seqlens=cache.cache_seqlens,
                causal=options.causal,
                window_size=options.window_size,
                softcap=options.softcap,
            )
        )


def run_fa3_suite(
    module: Any,
    cases: list[Case],
    device: Device,
    arch: int,
    profile: Any,
    knowledge: dict,
    on_result: Callable[[CaseResult], None] = lambda result: None,
) -> list[CaseResult]:
    """Cases the build can take through the runner (FP8 through `check_fp8`); the others "unsupported"."""
    import torch

    from toolkit.verify.runner import CaseResult, run_case

    device = torch.device(device)
    torch.set_float32_matmul_precision("highest")
    backend, bound = Fa3Backend(module), Fp8Bound.from_knowledge(knowledge)
    results = []
    for case in cases:
        reason = unsupported_reason(case, profile, arch, knowledge)
        if reason:
            result = CaseResult(
                case.name, case.api, case.params(), "unsupported", 0.0, message=reason
            )
        elif case.dtype == FP8:
            result = run_fp8_case(module, case, device, bound)
        else:
            result = run_case(backend, case, device)
        on_result(result)
        results.append(result)
    return results


def run_fp8_case(module: Any, case: Case, device: Device, bound: Fp8Bound) -> CaseResult:
    """One FP8 case, judged and isolated as runner.run_case judges the others."""
    from toolkit.verify.runner import judged

    return judged(case, lambda: check_fp8(module, case, device, bound))


def import_fa3() -> tuple[ModuleType | None, str]:
    return import_finding("flash_attn_interface")


def fa3_version() -> str | None:
    """The wheel's version (flash_attn_3-3.0.0+<local>): the distribution is flash-attn-3."""
    return installed_version("flash-attn-3")


def build_flags() -> dict | None:
    """The installed build's own switches (flash_attn_config.CONFIG, written by setup.py), for the report."""
    try:
        from flash_attn_config import CONFIG
    except Exception:  # an older build without the module, or none installed
        return None
    return dict(CONFIG.get("build_flags", {}))


# ---------------------------------------------------------------- the Suite (toolkit/verify/suite.py)


def refusal(level: str) -> str:
    return ""


def import_implementation() -> tuple[ModuleType | None, str]:
    return import_fa3()


def _profile(run: Run) -> Any:
    """The knowledge's profile the run names (knowledge.fa3_pins.Profile); the child is handed it as --profile."""
    from toolkit.base.errors import ToolkitError
    from toolkit.knowledge import fa3_pins

    if run.profile is None:
        raise ToolkitError(
            "verifying flash-attn-3 needs the line's build profile: pass --profile NAME "
            "(flash_attn_3.yaml profiles), or run `toolkit verify LINE --impl flash-attn-3`"
        )
    return fa3_pins.profile(run.profile)


def environment(module: ModuleType | None, run: Run) -> dict[str, Any]:
    return {
        "flash_attn": {
            "version": fa3_version(),
            "path": getattr(module, "__file__", None),
            "package": PACKAGE,
            "extension": None,
            "profile": _profile(run).name,
            "build_flags": build_flags(),
        },
        "arch": run.arch,
    }


def cases(level: str) -> list[Case]:
    return [] if level in WITH_PARITY else fa3_cases(level)


def judge(
    module: Any, cases: list[Case], run: Run, on_result: Callable[[CaseResult], None]
) -> object:
    from toolkit.knowledge import fa3_pins

    return run_fa3_suite(
        module, cases, DEVICE, run.arch, _profile(run), fa3_pins.knowledge(), on_result
    )


def parity(level: str) -> list[ParityResult]:
    from toolkit.verify.parity import run_implementation_parity

    return run_implementation_parity(DEVICE, ATTN_IMPLEMENTATION) if level in WITH_PARITY else []


def build_profile(spec: EnvSpec) -> str | None:
    """The FA3 profile a line builds, or a one-line refusal naming its spec file."""
    from toolkit.base.errors import ToolkitError
    from toolkit.base.paths import display_path

    if spec.flash_attn_3 is None:
        raise ToolkitError(
            f"{display_path(spec.path)}: the line builds no FlashAttention-3 (add a flash_attn_3: "
            f"section with commit and profile, like envs/gpu-machine-fa3.yaml)"
        )
    return spec.flash_attn_3.profile
