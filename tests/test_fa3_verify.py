"""FlashAttention-3's verification and bench column (issue 25 item 2), the CPU side.

What runs here: which cases a profile's switches leave in (expected values read by hand from hopper/setup.py,
flash_api_stable.cpp and flash_attn_interface.py at the pinned commit, cited in flash_attn_3.yaml), the FP8
tolerance against torch's own e4m3 facts and against an emulation of FA3's FP8 forward, the refusals, and the
bench's FA3 and FP8 rows through the report and recommendation code. The `gpu` test runs the real FA3.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.torch

from toolkit.attention import formats, recommend  # noqa: E402
from toolkit.cli import main  # noqa: E402
from toolkit.knowledge import fa3_pins  # noqa: E402
from toolkit.verify import bench, fa3  # noqa: E402
from toolkit.verify.cases import FP8, Case  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KNOWLEDGE = fa3_pins.knowledge()
# a real bench of the H200 (FA2, FA4, torch's SDPA kernels), docs/results/2026-12-01-h200-hold-3
RECORDED_BENCH = ROOT / "docs/results/2026-12-01-h200-hold-3/bench/bench.json"


def reasons(profile: str, level: str = "smoke", arch: int = 90) -> dict[str, str]:
    p = fa3_pins.profile(profile)
    return {c.name: fa3.unsupported_reason(c, p, arch, KNOWLEDGE) for c in fa3.fa3_cases(level)}


def test_hopper_training_runs_what_its_switches_leave_in():
    """hopper-training keeps bf16/fp16 fwd+bwd at the 64 and 128 kernels, local, softcap, varlen and the
    appending KV cache; it drops FP8, the 96/192/256 kernels, split-KV and paged KV (flash_attn_3.yaml)."""
    got = reasons("hopper-training")
    runs = sorted(name for name, why in got.items() if not why)
    assert runs == sorted([
        "func-bf16-d128-q512-k512", "func-fp16-d64-q113-k203-causal", "func-bf16-d80-q128-k217-softcap50",
        "func-bf16-d128-q256-k512-gqa6:2-deterministic", "qkvpacked-fp16-d96-q256-k256-causal",
        "varlen-bf16-d128-q300-k300-causal", "kvcache-bf16-d128-q1-k512-gqa6:2-causal-new1",
        "func-bf16-d128-q256-k512-gqa6:2", "func-fp16-d64-q512-k512-mqa6:1-causal",
        "kvcache-bf16-d128-q1-k512-gqa6:2-causal", "kvcache-fp16-d64-q64-k1024",
        "func-bf16-d128-q512-k512-causal-window128,0", "varlen-bf16-d64-q300-k300-gqa6:2-softcap30"])
    assert "not a multiple of 8" in got["func-bf16-d59-q256-k256"]  # flash_api_stable.cpp:922
    assert "built: [64, 128]" in got["func-bf16-d256-q256-k256-window64,32"]
    assert got["func-fp16-d128-q256-k256-causal-alibi"].startswith("FA3 has no alibi")
    assert got["func-bf16-d64-q256-k256-dropout0.17"].startswith("FA3 has no dropout")
    assert got["kvpacked-fp16-d128-q256-k512-mqa6:1"].startswith("FA3 has no kvpacked")
    assert all(got[c.name].endswith("FLASH_ATTENTION_DISABLE_FP8") for c in fa3.fp8_cases("smoke"))


def test_a_head_dim_runs_on_the_smallest_kernel_left_in():
    """round_up_headdim (flash_api_stable.cpp:557-575): 96 runs on the 128 kernel when the 96 one is out."""
    kernels = KNOWLEDGE["verification"]["head_dim_kernels"]
    training = set(fa3_pins.profile("hopper-training").switches)
    assert [fa3.head_dim_kernel(d, training, kernels) for d in (32, 64, 72, 96, 128, 136, 256)] == \
        [64, 64, 128, 128, 128, None, None]
    assert [fa3.head_dim_kernel(d, set(), kernels) for d in (72, 96, 136, 256)] == [96, 96, 192, 256]


def test_the_smallest_profile_takes_only_bf16_forward_at_128():
    """hdim128-bf16-fwd: no backward, no fp16, only the 128 kernel; the cache call (forward only) runs."""
    runs = sorted(name for name, why in reasons("hdim128-bf16-fwd").items() if not why)
    assert runs == ["kvcache-bf16-d128-q1-k512-gqa6:2-causal", "kvcache-bf16-d128-q1-k512-gqa6:2-causal-new1"]
    assert "backward (FLASH_ATTENTION_DISABLE_BACKWARD)" in reasons("hdim128-bf16-fwd")["func-bf16-d128-q512-k512"]


def test_fp8_runs_only_on_sm90_with_a_profile_that_keeps_it():
    assert not any(reasons("hopper-full")[c.name] for c in fa3.fp8_cases("smoke"))
    on_a100 = reasons("full", arch=80)
    assert all("FP8 needs sm_90" in on_a100[c.name] for c in fa3.fp8_cases("smoke"))
    assert on_a100["func-bf16-d128-q512-k512"] == ""  # the full profile keeps the sm_80 kernels
    assert "builds no kernel for sm_80" in reasons("hopper-full", arch=80)["func-bf16-d128-q512-k512"]
    assert "builds no kernel for sm_100" in reasons("full", arch=100)["func-bf16-d128-q512-k512"]


def test_fp8_cases_are_forward_only_and_valid():
    for case in fa3.fp8_cases("full"):
        assert case.problem() is None and not case.backward and "backward" not in fa3.case_features(case)
    assert Case("varlen", FP8, 128, 64, 64).problem() == "FP8 cases call flash_attn_func only"


def test_the_e4m3_bound_comes_from_the_format():
    """The knowledge's e4m3 facts against torch's own: eps 2^-3 (so round to nearest: u = 2^-4), smallest normal
    2^-6, subnormal spacing eps * smallest normal = 2^-9; FA3 scales P by 2^8 (softmax.h Max_offset)."""
    info = torch.finfo(torch.float8_e4m3fn)
    bound = fa3.Fp8Bound.from_knowledge(KNOWLEDGE)
    assert bound.unit_roundoff == info.eps / 2 == 2.0 ** -4
    fp8 = KNOWLEDGE["verification"]["fp8"]
    assert 2.0 ** fp8["min_normal_exponent"] == info.smallest_normal
    assert 2.0 ** fp8["subnormal_exponent"] == info.eps * info.smallest_normal
    assert bound.subnormal_weight_error == 2 * (info.eps * info.smallest_normal / 2) / 2 ** 8
    assert bound.weight_error == pytest.approx(2 / 15)  # 2u / (1 - u) at u = 1/16



def test_each_term_of_the_e4m3_bound_is_what_the_formats_allow():
    """Each term of the elementwise bound alone (the others zeroed), against published unit roundoffs: e4m3's
    2^-4 (OCP OFP8 rev. 1.0: 3 mantissa bits, round to nearest) on the weights, bf16's (torch.finfo: eps / 2) on
    the output FA3 writes, e4m3's subnormal half-spacing 2^-10 per key over the row sum of at least 2^8."""
    bound = fa3.Fp8Bound.from_knowledge(KNOWLEDGE)
    out_ref = torch.tensor([[1.0, -3.0, 0.5, 1000.0]])
    weighted = torch.tensor([[2.0, 0.25, 7.0, 0.0]])
    zeros = torch.zeros_like(out_ref)
    bf16_u = torch.finfo(torch.bfloat16).eps / 2
    assert bf16_u == 2.0 ** -8
    assert torch.equal(bound.elementwise(zeros, out_ref, 0.0, 512), bf16_u * out_ref.abs())
    e4m3_u = 2.0 ** -4
    assert torch.allclose(bound.elementwise(weighted, zeros, 0.0, 512), 2 * e4m3_u / (1 - e4m3_u) * weighted,
                          rtol=1e-6, atol=0)
    per_key = 2 * 2.0 ** -10 / 2.0 ** 8  # renormalised: the row sum moves by as much as the weights
    assert torch.equal(bound.elementwise(zeros, zeros, 3.0, 512), torch.full_like(out_ref, 512 * per_key * 3.0))


def test_the_output_term_covers_bf16s_own_rounding_and_no_less():
    """torch's rounding to bf16 of values halfway between two bf16 numbers just above a power of two (1 + 2^-8
    rounds to 1, an error of 2^-8) stays within the output term and exceeds half of it: the term is bf16's
    rounding, no looser and no tighter."""
    bound = fa3.Fp8Bound.from_knowledge(KNOWLEDGE)
    exact = torch.tensor([1 + 2.0 ** -8, -(2 + 2.0 ** -7), 0.5 + 2.0 ** -9, 1.2345678, -77.77], dtype=torch.float64)
    error = (exact.to(torch.bfloat16).double() - exact).abs()
    zeros = torch.zeros_like(exact)
    term = bound.elementwise(zeros, exact, 0.0, 1)
    assert bool((error <= term).all())
    assert bool((error[:3] > term[:3] / 2).all())


class Fp8Emulation:
    """NOT FlashAttention-3: a torch emulation of its FP8 forward as hopper/softmax.h and flash_fwd_kernel_sm90.h
    describe it (scores of the descaled e4m3 inputs in fp32; P = 2^(s - max + 8) rounded to e4m3; row sum of the
    unrounded P; output in bf16), to show that the derived bound holds for that arithmetic and that a kernel
    which drops a descale factor fails it. `skip_v_descale` is that broken kernel."""

    def __init__(self, skip_v_descale: bool = False):
        self.skip_v_descale = skip_v_descale

    def flash_attn_func(self, q, k, v, causal=False, window_size=(-1, -1), softcap=0.0, q_descale=None,
                        k_descale=None, v_descale=None):
        from toolkit.verify import reference

        heads = q.shape[2]
        qf, kf = fa3.descaled(q, q_descale, heads), fa3.descaled(k, k_descale, k.shape[2])
        vf = v.float() if self.skip_v_descale else fa3.descaled(v, v_descale, v.shape[2])
        group = heads // k.shape[2]
        scores = torch.einsum("bthd,bshd->bhts", qf, kf.repeat_interleave(group, dim=2)) / q.shape[-1] ** 0.5
        allowed = reference.allowed_mask(q.shape[0], q.shape[1], k.shape[1], causal=causal, window=window_size)
        scores = scores.masked_fill(~allowed, float("-inf"))
        p = torch.exp2((scores - scores.amax(-1, keepdim=True)) * 1.4426950408889634 + 8)
        rounded = p.to(torch.float8_e4m3fn).float()
        out = torch.einsum("bhts,bshd->bthd", rounded, vf.repeat_interleave(group, dim=2))
        return (out / p.sum(-1).transpose(1, 2)[..., None]).to(torch.bfloat16)


@pytest.mark.parametrize("case", fa3.fp8_cases("smoke"), ids=lambda c: c.name)
def test_fp8_emulation_meets_both_checks_and_a_dropped_descale_fails(case):
    bound = fa3.Fp8Bound.from_knowledge(KNOWLEDGE)
    checks = fa3.check_fp8(Fp8Emulation(), case, "cpu", bound)
    assert [c.passed for c in checks] == [True, True], [c.summary() for c in checks]
    assert 0 < checks[1].error < 1  # the bound is not vacuous: the emulation's error is measured against it
    broken = fa3.run_fp8_case(Fp8Emulation(skip_v_descale=True), case, "cpu", bound)
    assert broken.status == "failed" and "e4m3 bound" in broken.message


def test_the_adapter_passes_fa3s_own_keywords_and_refuses_what_its_api_lacks():
    """FA2's signatures in, flash_attn_interface's keywords out (its flash_attn_func at the pin: softmax_scale,
    causal, window_size, softcap, deterministic; flash_attn_with_kvcache without the last two)."""
    seen = {}

    class Recorder:
        def flash_attn_func(self, q, k, v, **kwargs):
            seen["func"] = kwargs
            return q

        def flash_attn_varlen_func(self, q, k, v, cu_q, cu_k, max_q, max_k, **kwargs):
            seen["varlen"] = (max_q, max_k, kwargs)
            return q, None

        def flash_attn_with_kvcache(self, q, k_cache, v_cache, **kwargs):
            seen["kvcache"] = kwargs
            return q

    backend = fa3.Fa3Backend(Recorder())
    q = torch.zeros(1, 4, 2, 8)
    assert backend.flash_attn_func(q, q, q, causal=True, window_size=(16, -1), softcap=5.0) is q
    assert seen["func"] == {"softmax_scale": None, "causal": True, "window_size": (16, -1), "softcap": 5.0,
                            "deterministic": False}
    assert backend.flash_attn_varlen_func(q, q, q, None, None, 3, 4, deterministic=True) is q
    assert seen["varlen"][:2] == (3, 4) and seen["varlen"][2]["deterministic"] is True
    assert backend.flash_attn_with_kvcache(q, q, q, cache_seqlens=q, causal=True) is q
    assert set(seen["kvcache"]) == {"k", "v", "cache_seqlens", "causal", "window_size", "softcap"}
    with pytest.raises(NotImplementedError, match="flash_attn_interface has no dropout"):
        backend.flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(NotImplementedError, match="flash_attn_interface has no flash_attn_kvpacked_func"):
        backend.flash_attn_kvpacked_func(q, torch.stack([q, q], dim=2))


def test_without_fa3_installed_the_import_is_a_one_line_finding():
    pytest.importorskip("toolkit")  # the dev venv never holds FA3
    if fa3.import_fa3()[0] is not None:
        pytest.skip("flash_attn_interface is installed here")
    module, why = fa3.import_fa3()
    assert module is None and why.startswith("ModuleNotFoundError") and "flash_attn_interface" in why
    assert fa3.fa3_version() is None


def test_verify_flash_attn_3_refuses_a_line_without_fa3(capsys, tmp_path):
    code = main(["verify", "gpu-machine", "--impl", "flash-attn-3", "--envs", str(ROOT / "envs"),
                 "--report-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1
    assert "gpu-machine.yaml: the line builds no FlashAttention-3 (add a flash_attn_3: section" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message; this machine has a GPU")
@pytest.mark.parametrize("level", ["smoke", "parity"])
def test_verify_flash_attn_3_of_an_fa3_line_stops_at_the_gpu_gate(capsys, tmp_path, level):
    """Every level, transformers parity included (issue 34 item 5: it was refused as "no parity for FA3 yet"),
    gets as far as the GPU."""
    code = main(["verify", "gpu-machine-fa3", "--impl", "flash-attn-3", "--level", level, "--python",
                 sys.executable, "--envs", str(ROOT / "envs"), "--report-dir", str(tmp_path)])
    assert code == 1
    assert capsys.readouterr().err == ("error: no CUDA GPU visible (torch.cuda.is_available() is False): "
                                       "run verification on a GPU machine\n")


def test_fa3_parity_is_transformers_flash_attention_3_beside_sdpa_and_eager():
    """The parity level of FA3's suite asks transformers for attn_implementation "flash_attention_3" (the name
    transformers registers: ALL_ATTENTION_FUNCTIONS), checks no kernel case, and reports apart."""
    assert fa3.cases("parity") == [] and "parity" in fa3.WITH_PARITY and fa3.refusal("parity") == ""
    assert fa3.ATTN_IMPLEMENTATION == "flash_attention_3"
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from toolkit.verify import parity

    assert "flash_attention_3" in ALL_ATTENTION_FUNCTIONS, transformers.__version__
    assert parity.transformers_names("flash_attention_3") == ""
    rows = parity.run_implementation_parity("cpu", "flash_attention_3")
    statuses = {r.name: r.status for r in rows}
    # no FA3 (and no GPU) here: transformers refuses the model, a finding of each scenario; sdpa and eager run
    assert {name for name, status in statuses.items() if status == "passed"} == {
        f"{scenario}/{impl}" for scenario in ("no-padding", "padding") for impl in ("sdpa", "eager")}
    assert statuses["no-padding/flash_attention_3"] == statuses["padding/flash_attention_3"] == "error"


def test_parity_with_a_name_transformers_does_not_register_says_unsupported_with_why():
    pytest.importorskip("transformers")
    from toolkit.verify import parity

    why = parity.transformers_names("flash_attention_99")
    assert why == "this transformers does not register attn_implementation 'flash_attention_99'"
    rows = [r for r in parity.run_implementation_parity("cpu", "flash_attention_99")
            if r.name.endswith("/flash_attention_99")]
    assert [(r.name, r.status, r.message) for r in rows] == [
        ("no-padding/flash_attention_99", "unsupported", why), ("padding/flash_attention_99", "unsupported", why)]


# ---------------------------------------------------------------- bench


def test_bench_has_an_fa3_column_and_fp8_shapes_only_for_fa3_forward():
    """No FA3 here: its rows are skipped with the reason; an FP8 shape is FA3's forward alone (both masks)."""
    grid = bench.shapes(tokens=64, seqlens=(32,), head_dims=(64,), dtypes=("float32", FP8))
    rows = bench.run_bench({}, grid, "cpu", lambda fn: 1.0, implementations=("flash-attn-3", "eager"))
    fp32 = [(r.implementation, r.mode, r.causal, r.status) for r in rows if r.dtype == "float32"]
    assert sorted(fp32) == sorted((i, m, c, "skipped" if i == "flash-attn-3" else "ok")
                                  for i in ("flash-attn-3", "eager") for m in bench.MODES for c in (False, True))
    assert [(r.implementation, r.mode, r.causal, r.variant, r.status) for r in rows if r.dtype == FP8] == \
        [("flash-attn-3", "fwd", causal, variant.name, "skipped") for causal in (False, True)
         for variant in bench.FP8_VARIANTS]
    assert all(r.reason == "flash_attn_interface (flash-attn-3) is not installed in this environment"
               for r in rows if r.implementation == "flash-attn-3")


def test_fp8_tflops_are_counted_as_bf16s():
    shape = bench.Shape(FP8, head_dim=128, seqlen=4096, batch=4, nheads=16)
    assert bench.attention_flops(shape, False, "fwd") == 4 * 4 * 16 * 4096 ** 2 * 128


def with_fa3_rows(data: dict) -> dict:
    """The recorded H200 bench with FA3 rows added. NOT measured: FA3's rows are FA2's recorded rows relabelled
    (TFLOP/s x 1.5, an invented figure so FA3 is fastest somewhere), and FP8 rows at 2x that; only the shape of
    the report (columns, versions, FP8 rows) is under test."""
    data = copy.deepcopy(data)
    fa2 = [m for m in data["measurements"] if m["implementation"] == "flash-attn-2"]
    fa3_rows = [{**m, "implementation": "flash-attn-3", "tflops": m["tflops"] and m["tflops"] * 1.5} for m in fa2]
    fp8_rows = [{**m, "dtype": FP8, "tflops": m["tflops"] and m["tflops"] * 2} for m in fa3_rows
                if m["dtype"] == "bfloat16" and m["mode"] == "fwd"]
    data["measurements"] += fa3_rows + fp8_rows
    data["flash_attn_3"] = {"version": "3.0.0+test", "path": None, "build_flags": None, "fp8": "test"}
    for key in ("peak", "targets"):
        data.pop(key, None)
    return data


def test_finish_shows_fa3_and_fp8_rows_beside_the_others(tmp_path):
    from rich.console import Console

    data = with_fa3_rows(formats.read_bench(RECORDED_BENCH))
    (tmp_path / "bench.json").write_text(json.dumps(data))
    console = Console(record=True, width=400)
    bench.finish(tmp_path, console, {})
    text = console.export_text()
    assert "flash-attn-3 3.0.0+test" in text  # the title names its version, as FA4's
    fp8_lines = [line for line in text.splitlines() if FP8 in line]
    assert len(fp8_lines) == sum(1 for m in data["measurements"] if m["dtype"] == FP8)  # one line per shape
    cells = [cell.strip() for cell in fp8_lines[0].split("│")[1:-1]]
    fa3_column = 5 + bench.IMPLEMENTATIONS.index("flash-attn-3")
    assert [i for i, cell in enumerate(cells) if cell.isdigit() and i >= 5] == [fa3_column]  # FA3's cell alone
    assert (tmp_path / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_recommend_takes_fa3_rows_but_makes_no_fp8_rule(tmp_path):
    data = with_fa3_rows(formats.read_bench(RECORDED_BENCH))
    checked = recommend.check_input(recommend.BenchReport, data, tmp_path / "bench.json", "bench", "fix",
                                    recommend.attention_backends.names())
    fa3_shapes = {(m["dtype"], m["head_dim"], m["causal"]) for m in data["measurements"]
                  if m["implementation"] == "flash-attn-3" and m["dtype"] != FP8}
    report = {"gpu": data["gpu"], "level": "fa3-full", "summary": {"passed": 1},
              "cases": [{"status": "passed", "params": {"dtype": d, "head_dim": h, "causal": c}}
                        for d, h, c in fa3_shapes | {(FP8, 128, False)}]}
    out = recommend.build(checked, {"flash-attn-3": report}, {})
    assert {r["dtype"] for r in out["rules"]} == {"bfloat16", "float16"}
    assert "flash-attn-3" in {r["backend"] for r in out["rules"]}  # 1.5x FA2's recorded figure wins somewhere
    assert not any(r["dtype"] == FP8 for r in out["shape_ratios"] + out["below_min_ratio"])
    assert out["versions"]["flash-attn-3"] == "3.0.0+test"


@pytest.mark.gpu
def test_fa3_smoke_on_a_gpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU here: FA3's kernels run on sm_90 only")
    module, why = fa3.import_fa3()
    if module is None:
        pytest.skip(f"FlashAttention-3 is not installed here ({why}); build envs/gpu-machine-fa3.yaml")
    profile = fa3_pins.profile("hopper-training")
    major, minor = torch.cuda.get_device_capability()
    results = fa3.run_fa3_suite(module, fa3.fa3_cases("smoke"), "cuda", major * 10 + minor, profile, KNOWLEDGE)
    assert [r.name for r in results if r.status in ("failed", "error")] == []


# ---------------------------------------------------------------- FP8 at the paper's ratio (issue 34 item 4)

H200_FA3_BENCH = ROOT / "docs/results/2026-12-02-h200-fa3/bench/bench.json"  # the real H200 run with FA3's FP8


def fp8_rows(figures: dict[tuple[int, int], float], bf16: dict[int, float]) -> dict:
    """A bench of FA3's FP8 forward at `figures` ((head dim, seqlen) -> TFLOP/s) beside FA3's bf16 at `bf16`
    (seqlen -> TFLOP/s, d128) and a slower cuDNN row, non-causal, on an H200."""
    def row(implementation, dtype, head_dim, seqlen, tflops, variant=""):
        return {"implementation": implementation, "mode": "fwd", "causal": False, "dtype": dtype,
                "head_dim": head_dim, "seqlen": seqlen, "status": "ok", "tflops": tflops, "variant": variant}
    rows = [row("flash-attn-3", FP8, d, s, t, "descale-random") for (d, s), t in figures.items()]
    rows += [row("flash-attn-3", "bfloat16", 128, s, t) for s, t in bf16.items()]
    rows += [row("sdpa-cudnn", "bfloat16", 128, s, t - 40) for s, t in bf16.items()]
    return {"gpu": "NVIDIA H200", "measurements": rows}


def test_the_papers_fp8_figures_meet_every_gate_at_the_ratios_issue_34_quotes():
    """The FA3 paper's FP8 forward (d128: 918 / 974 / 1008 at 4k / 8k / 16k; d256 1151-1171) against the H200's
    best bf16 (FA3 723 / 709 / 726, docs/results/2026-12-02-h200-fa3): issue 34 says 1.27x / 1.37x / 1.39x."""
    gates = bench.fp8_gates("NVIDIA H200")
    assert [(g.head_dim, g.causal, g.min_seqlen, g.max_seqlen, g.min_ratio, g.min_tflops) for g in gates] == [
        (128, False, 4096, 4096, 1.20, None), (128, False, 8192, None, 1.30, None),
        (256, False, 4096, None, None, 1100)]
    assert bench.fp8_gates("NVIDIA H100 80GB HBM3") == gates and bench.fp8_gates("NVIDIA A100-SXM4-80GB") == []
    paper = {(128, 4096): 918, (128, 8192): 974, (128, 16384): 1008,
             (256, 4096): 1151, (256, 8192): 1160, (256, 16384): 1171}
    results = bench.evaluate_fp8_gates(fp8_rows(paper, {4096: 723, 8192: 709, 16384: 726}), gates)
    ratios = [(r["seqlen"], round(r["ratio"], 2)) for r in results if r["ratio"] is not None]
    assert ratios == [(4096, 1.27), (8192, 1.37), (16384, 1.39)]
    assert [r["fp8_tflops"] for r in results if r["min_tflops"]] == [1151, 1160, 1171]
    assert all(r["met"] for r in results) and len(results) == 6
    assert results[0]["fp8_row"] == "flash-attn-3 descale-random" and results[0]["bf16_row"] == "flash-attn-3"


def test_the_h200_fp8_run_misses_the_gates_from_8192_as_its_readme_says():
    """docs/results/2026-12-02-h200-fa3 (README: FP8 890 / 917 / 934 against 723 / 709 / 726: 1.23, 1.29, 1.29):
    4096 meets its 1.20, 8192 and 16384 miss 1.30; that bench had no d256, so the d256 gate does not apply."""
    data = formats.read_bench(H200_FA3_BENCH)
    results = bench.evaluate_fp8_gates(data, bench.fp8_gates(data["gpu"]))
    judged = [(r["seqlen"], round(r["fp8_tflops"]), round(r["ratio"], 2), r["met"]) for r in results
              if r["not_applicable"] is None]
    assert judged == [(4096, 890, 1.23, True), (8192, 917, 1.29, False), (16384, 934, 1.29, False)]
    (d256,) = [r for r in results if r["not_applicable"]]
    assert d256["gate"] == "FP8 >= 1100 TFLOP/s at d256 non-causal seqlen >= 4096" and not d256["met"]


def test_finish_prints_each_fp8_gate_met_or_missed_and_exits_1_on_a_miss(tmp_path):
    from rich.console import Console

    data = formats.read_bench(H200_FA3_BENCH)
    for key in ("peak", "targets"):
        data.pop(key, None)
    (tmp_path / "bench.json").write_text(json.dumps(data))
    console = Console(record=True, width=400)
    assert bench.finish(tmp_path, console, {}) == 1
    lines = [line for line in console.export_text().splitlines() if line.startswith("FP8 gate")]
    assert lines[0] == ("FP8 gate met: FP8 / best bf16 >= 1.20 at d128 non-causal seqlen 4096: seqlen 4096: "
                        "FP8 890 (flash-attn-3) / best bf16 723 (flash-attn-3) = 1.23")
    assert [line.split(":")[0] for line in lines] == ["FP8 gate met", "FP8 gate MISSED", "FP8 gate MISSED",
                                                      "FP8 gate not applicable"]
    assert len(json.loads((tmp_path / "bench.json").read_text())["fp8_gates"]) == 4


class Fa3Fp8Double:
    """flash_attn_interface's flash_attn_func as the bench calls it, recording what it was given."""

    def __init__(self):
        self.calls = []

    def flash_attn_func(self, q, k, v, causal=False, q_descale=None, k_descale=None, v_descale=None):
        self.calls.append({"v_stride": v.stride(), "descale": (q_descale, k_descale, v_descale)})
        return q.to(torch.bfloat16)


@pytest.mark.parametrize("vcolmajor", [False, True])
def test_fp8_rows_are_timed_at_unit_and_random_descales_and_column_major_v_where_the_build_has_it(
        monkeypatch, vcolmajor):
    column = bench.PACKAGED["flash-attn-3"]
    flags = {bench.VCOLMAJOR_FLAG: vcolmajor, "FLASHATTENTION_DISABLE_FP8": False}
    monkeypatch.setitem(bench.PACKAGED, "flash-attn-3",
                        dataclasses.replace(column, build_flags=lambda: flags))
    double = Fa3Fp8Double()
    (shape,) = bench.shapes(tokens=64, seqlens=(32,), head_dims=(64,), dtypes=(FP8,))
    rows = bench.run_bench({"flash-attn-3": double}, [shape], "cpu", lambda fn: (fn(), 1.0)[1],
                           implementations=("flash-attn-3", "eager"))
    assert [(r.implementation, r.causal, r.variant) for r in rows] == [
        ("flash-attn-3", causal, v) for causal in (False, True) for v in ("descale-1", "descale-random", "v-colmajor")]
    statuses = {r.variant: r.status for r in rows}
    assert statuses == {"descale-1": "ok", "descale-random": "ok", "v-colmajor": "ok" if vcolmajor else "skipped"}
    if not vcolmajor:
        assert "FLASHATTENTION_ENABLE_VCOLMAJOR off" in rows[2].reason
    by_variant = dict(zip([r.variant for r in rows if r.status == "ok"], double.calls))
    ones = by_variant["descale-1"]["descale"]
    assert all(bool((d == 1).all()) and d.shape == (shape.batch, shape.nheads) for d in ones)
    drawn = by_variant["descale-random"]["descale"]
    assert all(d.shape == (shape.batch, shape.nheads) and bool(((d >= 0) & (d < 2)).all()) and not bool((d == 1).all())
               for d in drawn)
    # (batch, seqlen, heads, dim): the plain V is dim-contiguous; the column-major one seqlen-contiguous
    assert by_variant["descale-1"]["v_stride"][-1] == 1
    if vcolmajor:
        assert by_variant["v-colmajor"]["v_stride"][1] == 1 and by_variant["v-colmajor"]["v_stride"][-1] != 1
