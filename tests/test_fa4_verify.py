"""FA4 verification (issue 16): the shared cases, reference and criterion through FA4's API.

No GPU here: the suite runs against tests/fa4_double (a TEST DOUBLE of flash_attn.cute with FA4's
real signatures, see its docstring). What is checked: which cases the knowledge lists for sm_90, that
unlisted ones are reported "unsupported" (never dropped), that the adapter maps FA2's conventions to
FA4's (window -1 -> None, varlen keywords, paged KV through page_table) and that a broken kernel fails.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.torch, pytest.mark.slow]

sys.path.insert(0, str(Path(__file__).parent / "fa4_double"))
from flash_attn.cute import Fa4Double  # noqa: E402
from test_verify import small  # noqa: E402

from toolkit.knowledge import fa4_pins  # noqa: E402
from toolkit.verify import fa4 as verify_fa4  # noqa: E402
from toolkit.verify import report  # noqa: E402
from toolkit.verify.cases import Case  # noqa: E402
from toolkit.verify.command import main as verify_main  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
KNOWLEDGE = fa4_pins.knowledge()


def test_features_of_a_case_use_the_knowledge_names():
    case = Case("varlen", "bfloat16", 128, 300, 300, nheads_k=2, causal=True, window=(64, 0), softcap=30.0)
    assert verify_fa4.case_features(case) == {"varlen", "gqa", "causal", "sliding_window", "softcap", "backward"}
    listed = set(KNOWLEDGE["features"])
    assert {"causal", "sliding_window", "gqa", "softcap", "varlen", "backward", "paged_kv", "fp8"} <= listed
    assert all(facts["source"] in KNOWLEDGE["sources"] for facts in KNOWLEDGE["features"].values())


@pytest.mark.parametrize("case,reason", [
    (Case("func", "bfloat16", 128, 512, 512), ""),
    (Case("func", "bfloat16", 59, 256, 256), "head dim 59 not listed for sm90"),
    (Case("func", "float16", 128, 256, 256, alibi=True), "not listed for sm90 in flash_attn_4.yaml: alibi"),
    (Case("func", "bfloat16", 64, 256, 256, dropout_p=0.17), "dropout"),
    (Case("qkvpacked", "float16", 96, 256, 256), "packed_api"),
    (Case("kvcache", "bfloat16", 128, 1, 512, nheads_k=2, new_tokens=1), "kv_append"),
    (Case("kvcache", "bfloat16", 128, 1, 512, nheads_k=2), ""),
    (Case("func", "bfloat16", 128, 256, 512, nheads_k=2, deterministic=True), "deterministic"),
])
def test_which_cases_are_listed_for_sm90(case, reason):
    got = verify_fa4.unsupported_reason(case, KNOWLEDGE, 90)
    assert (got == "") if reason == "" else (reason in got)


def test_the_sm90_backward_lists_only_head_dims_whose_dq_is_right():
    """flash_attn_4.yaml bwd_sm90_padding: every case the H200 run of 2026-12-01 failed (dq at head dims 40/80)
    is unsupported in the backward now, its forward still listed; every case that passed stays listed."""
    import json

    run = ROOT / "docs" / "results" / "2026-12-01-h200-replica-and-fa4" / "fa4" / "verify-fa4-full" / "verify.json"
    results = json.loads(run.read_text())["cases"]
    failed = [r for r in results if r["status"] == "failed"]
    passed = [r for r in results if r["status"] == "passed"]
    assert failed and passed
    cases = {c.name: c for c in verify_fa4.fa4_cases("full")}
    assert all("backward" in verify_fa4.unsupported_reason(cases[r["name"]], KNOWLEDGE, 90) for r in failed)
    assert all(verify_fa4.unsupported_reason(cases[r["name"]], KNOWLEDGE, 90) == "" for r in passed)
    assert {cases[r["name"]].head_dim for r in failed} == {40, 80}
    assert verify_fa4.unsupported_reason(Case("kvcache", "bfloat16", 80, 1, 512), KNOWLEDGE, 90) == ""  # forward only


def test_sm80_has_no_backward_and_sm100_no_head_dim_256():
    assert "backward" in verify_fa4.unsupported_reason(Case("func", "bfloat16", 128, 512, 512), KNOWLEDGE, 80)
    assert "head dim 160" in verify_fa4.unsupported_reason(Case("func", "bfloat16", 160, 512, 512), KNOWLEDGE, 100)
    assert verify_fa4.unsupported_reason(Case("kvcache", "bfloat16", 128, 1, 512), KNOWLEDGE, 90) == ""


def test_the_fa4_smoke_level_reaches_every_listed_sm90_feature():
    runnable = [c for c in verify_fa4.fa4_cases("smoke") if not verify_fa4.unsupported_reason(c, KNOWLEDGE, 90)]
    reached = set().union(*(verify_fa4.case_features(c) for c in runnable))
    listed = {name for name, passes in verify_fa4.listed_features(KNOWLEDGE, 90).items()}
    assert reached == listed == {"causal", "sliding_window", "gqa", "softcap", "varlen", "backward", "paged_kv"}
    assert len({c.name for c in verify_fa4.fa4_cases("smoke")}) == len(verify_fa4.fa4_cases("smoke"))


def _cpu(case: Case) -> Case:
    """CPU-sized, keeping the head dim a multiple of 8 and kv-cache lengths a multiple of a page."""
    shrunk = small(case)
    head_dim = min(case.head_dim, 32) if case.head_dim % 8 == 0 else case.head_dim
    seqlen_k = 64 if case.api == "kvcache" else shrunk.seqlen_k
    return replace(shrunk, head_dim=head_dim, seqlen_k=seqlen_k)


def test_a_correct_kernel_passes_every_listed_case_and_the_rest_are_unsupported():
    chosen = [_cpu(c) for c in verify_fa4.fa4_cases("smoke")]
    results = verify_fa4.run_fa4_suite(Fa4Double(), chosen, "cpu", 90, KNOWLEDGE)
    statuses = {r.name: r.status for r in results}
    assert len(results) == len(chosen)
    assert set(statuses.values()) == {"passed", "unsupported"}, [(r.name, r.message) for r in results
                                                                 if r.status not in ("passed", "unsupported")]
    unsupported = [r for r in results if r.status == "unsupported"]
    assert unsupported and all(r.message for r in unsupported)
    paged = [r for r in results if r.api == "kvcache" and r.status == "passed"]
    assert paged and all({c.name for c in r.checks} == {"out"} for r in paged)


def test_a_kernel_that_ignores_the_window_fails():
    chosen = [Case("func", "float16", 32, 64, 64, window=(8, 4)), Case("varlen", "bfloat16", 32, 48, 48, window=(6, 0))]
    results = verify_fa4.run_fa4_suite(Fa4Double(broken_window=True), chosen, "cpu", 90, KNOWLEDGE)
    assert any(r.status == "failed" for r in results)


def test_unsupported_counts_in_the_report_but_does_not_fail_it(tmp_path):
    chosen = [_cpu(c) for c in verify_fa4.fa4_cases("smoke")[:4]]
    results = verify_fa4.run_fa4_suite(Fa4Double(), chosen, "cpu", 90, KNOWLEDGE)
    environment = {"date": "2026-12-01T00:00:00+00:00", "hostname": "h", "command": "c", "python": "p",
                   "torch": "t", "cuda": None, "gpu": None, "gpu_capability": None,
                   "flash_attn": {"version": "4.0.0b36", "path": None, "extension": None}}
    data = report.build_report("gpu-machine", "fa4-smoke", environment, results, [], 1.0)
    assert data["summary"]["unsupported"] == 1 and report.passed(data)
    json_path, xml_path = report.write_reports(data, tmp_path)
    assert 'skipped="1"' in xml_path.read_text()
    assert "1 unsupported" in report.summary_line(json.loads(json_path.read_text()), tmp_path)


def test_the_adapter_passes_fa4_conventions():
    seen = {}

    class Recorder:
        def flash_attn_func(self, q, k, v, **kwargs):
            seen.update(kwargs)
            return q, None

    backend = verify_fa4.Fa4Backend(Recorder())
    q = torch.zeros(1, 4, 2, 8)
    assert backend.flash_attn_func(q, q, q, causal=True, window_size=(16, -1)) is q
    assert seen["window_size"] == (16, None) and seen["causal"] is True
    with pytest.raises(NotImplementedError, match="no dropout"):
        backend.flash_attn_func(q, q, q, dropout_p=0.1)
    assert verify_fa4.page_size_for(800) == 32 and verify_fa4.page_size_for(1024) == 128


def test_measure_writes_the_report_as_it_goes_and_exits_by_the_listed_cases(monkeypatch, tmp_path, capsys):
    from toolkit.verify import machine

    chosen = [_cpu(c) for c in verify_fa4.fa4_cases("smoke")[:5]]
    monkeypatch.setattr(machine, "require_cuda", lambda what: torch)
    monkeypatch.setattr(verify_fa4, "DEVICE", "cpu")
    monkeypatch.setattr(verify_fa4, "fa4_cases", lambda level: chosen)
    monkeypatch.setattr(verify_fa4, "import_fa4", lambda: (Fa4Double(), ""))
    written = []
    real_write = report.write_reports
    monkeypatch.setattr(report, "write_reports", lambda data, d: written.append(data["level"]) or real_write(data, d))
    assert verify_main(["gpu-machine", "--impl", "flash-attn-4", "--report-dir", str(tmp_path), "--arch", "90"]) == 0
    assert written == [f"fa4-smoke (partial: {i} of 5)" for i in range(1, 6)] + ["fa4-smoke"]
    data = json.loads((tmp_path / "verify.json").read_text())
    assert data["arch"] == 90 and data["flash_attn"]["package"] == "flash-attn-4 (flash_attn.cute)"
    assert data["summary"]["passed"] == 4 and data["summary"]["unsupported"] == 1
    assert "4 passed, 0 failed, 0 errors, 1 unsupported" in capsys.readouterr().out
    monkeypatch.setattr(verify_fa4, "import_fa4", lambda: (None, "ModuleNotFoundError: No module named 'cutlass'"))
    assert verify_main(["gpu-machine", "--impl", "flash-attn-4", "--report-dir", str(tmp_path / "broken"),
                        "--arch", "90"]) == 1
    broken = json.loads((tmp_path / "broken" / "verify.json").read_text())
    assert "No module named 'cutlass'" in broken["summary"]["setup_error"]


def test_parity_without_transformers_is_an_error_and_fa4_rows_say_unsupported():
    """This machine has no transformers: the parity harness reports its setup error, and the FA4 rows say why
    they did not run (on the GPU machine the image's transformers decides)."""
    pytest.importorskip("torch")
    from toolkit.verify import parity

    if parity.transformers_names("flash_attention_4") == "":
        pytest.skip("this transformers registers flash_attention_4: the rows would run")
    rows = parity.run_implementation_parity("cpu", verify_fa4.ATTN_IMPLEMENTATION)
    statuses = {r.name: r.status for r in rows}
    assert statuses["no-padding/flash_attention_4"] == statuses["padding/flash_attention_4"] == "unsupported"
    assert all(r.message for r in rows if r.status == "unsupported")
