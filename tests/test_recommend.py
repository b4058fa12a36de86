"""Recommendation (issue 16): the fastest verified backend per GPU and shape, from a measured grid.

Real data: the H200 measurements of issue 16's table (bf16, d128/d64, FA4 4.0.0b36 vs cuDNN and flash
SDPA, forward, TFLOP/s, 2026-12-01), laid out as `toolkit bench` rows. The verification reports are
built here (a passed and a failed FA4 report): what matters to the recommendation is their summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.attention import recommend
from toolkit.cli import main
from toolkit.knowledge import fa4_pins

ROOT = Path(__file__).resolve().parent.parent
GPU = "NVIDIA H200"
# (seqlen, head_dim, causal) -> {implementation: fwd TFLOP/s}, issue 16's table
ISSUE_TABLE = {
    (4096, 128, False): {"fa4": 707, "sdpa-cudnn": 668, "sdpa-flash": 344},
    (1024, 128, False): {"fa4": 573, "sdpa-cudnn": 605, "sdpa-flash": 325},
    (8192, 128, False): {"fa4": 733, "sdpa-cudnn": 675, "sdpa-flash": 322},
    (4096, 64, False): {"fa4": 537, "sdpa-cudnn": 477, "sdpa-flash": 300},
    (4096, 128, True): {"fa4": 630, "sdpa-cudnn": 571, "sdpa-flash": 306},
    (1024, 128, True): {"fa4": 418, "sdpa-cudnn": 441, "sdpa-flash": 250},
}
FWD_BWD_4096 = {"fa4": 595, "sdpa-cudnn": 536, "flash-attn": 330}  # issue 16: forward+backward, d128, 4 x 4096


def _bench() -> dict:
    rows = []
    for (seqlen, head_dim, causal), values in ISSUE_TABLE.items():
        for name, tflops in values.items():
            rows.append({"implementation": name, "mode": "fwd", "causal": causal, "dtype": "bfloat16",
                         "head_dim": head_dim, "seqlen": seqlen, "status": "ok", "tflops": float(tflops)})
    rows += [{"implementation": name, "mode": "fwd+bwd", "causal": False, "dtype": "bfloat16", "head_dim": 128,
              "seqlen": 4096, "status": "ok", "tflops": float(t)} for name, t in FWD_BWD_4096.items()]
    rows.append({"implementation": "flash-attn", "mode": "fwd", "causal": False, "dtype": "bfloat16",
                 "head_dim": 128, "seqlen": 2048, "status": "skipped", "tflops": None})
    return {"gpu": GPU, "gpu_capability": "9.0", "date": "2026-12-01", "command": "toolkit bench gpu-machine",
            "torch": "2.11.0+cu130", "flash_attn": {"version": None}, "flash_attn_4": {"version": "4.0.0b36"},
            "measurements": rows}


def _case(status: str, head_dim: int, causal: bool, dtype: str = "bfloat16") -> dict:
    return {"name": f"func-d{head_dim}", "status": status,
            "params": {"api": "func", "dtype": dtype, "head_dim": head_dim, "causal": causal}}


def _verify(failed: int = 0, gpu: str = GPU) -> dict:
    """A verification report whose passed cases cover the bench grid's shapes; `failed` breaks them all."""
    cases = [_case("passed", d, c) for d in (64, 128) for c in (False, True)]
    cases += [_case("failed", d, c) for d in (64, 128) for c in (False, True)][:4 * failed]
    return {"gpu": gpu, "level": "fa4-smoke", "date": "2026-12-01", "cases": cases,
            "summary": {"passed": 4, "failed": 4 * failed, "error": 0, "unsupported": 6, "setup_error": ""}}


def test_cudnn_wins_short_sequences_and_fa4_long_ones_when_fa4_is_verified():
    data = recommend.build(_bench(), {"fa4": _verify()}, fa4_pins.knowledge())
    rules = [recommend.Rule(**r) for r in data["rules"]]
    pick = lambda seqlen, causal=False, d=128: recommend.lookup_rules(rules, "bfloat16", d, causal, "fwd", seqlen)
    assert pick(1024).backend == "sdpa-cudnn" and pick(1024, True).backend == "sdpa-cudnn"
    assert pick(4096).backend == pick(8192).backend == pick(100_000).backend == "fa4"
    assert pick(4096, True).backend == "fa4" and pick(4096, d=64).backend == "fa4"
    assert pick(512).backend == "sdpa-cudnn"  # below the smallest measured seqlen: its band starts at 0
    assert pick(4096).attn_implementation == {"name": "flash_attention_4"}
    assert pick(1024).attn_implementation == {"name": "sdpa", "sdpa_backend": "CUDNN_ATTENTION"}
    assert data["worst_ratio"] == 1.0  # the best measured backend is verified on every shape


def test_bands_with_one_winner_merge():
    data = recommend.build(_bench(), {"fa4": _verify()}, fa4_pins.knowledge())
    d128 = [r for r in data["rules"] if (r["head_dim"], r["causal"], r["mode"]) == (128, False, "fwd")]
    assert [(r["seqlen_min"], r["seqlen_max"], r["backend"]) for r in d128] == [
        (0, 4095, "sdpa-cudnn"), (4096, None, "fa4")]


def test_an_unverified_fa4_is_never_recommended_and_the_shortfall_is_reported():
    for report in (_verify(failed=1), _verify(gpu="NVIDIA H100 80GB HBM3")):
        data = recommend.build(_bench(), {"fa4": report}, fa4_pins.knowledge())
        assert "fa4" not in data["verified"] and {r["backend"] for r in data["rules"]} == {"sdpa-cudnn"}
        assert data["worst_ratio"] == pytest.approx(477 / 537)  # d64 4096: cuDNN is 0.89x the unverified FA4


def test_issue_targets_are_checked_with_the_committed_fa2_number_when_the_run_has_none():
    data = recommend.build(_bench(), {"fa4": _verify()}, fa4_pins.knowledge())
    targets = {(t["mode"], t["versus"]): t for t in data["targets"]}
    fwd_fa2 = targets[("fwd", "flash-attn")]
    assert fwd_fa2["ratio"] == pytest.approx(707 / 390) and fwd_fa2["met"]
    assert fwd_fa2["versus_source"].startswith("committed FA2 measurement")
    assert targets[("fwd", "sdpa-cudnn")]["ratio"] == pytest.approx(707 / 668) and targets[("fwd", "sdpa-cudnn")]["met"]
    both = targets[("fwd+bwd", "flash-attn")]
    assert both["versus_source"] == "this run" and both["ratio"] == pytest.approx(595 / 330) and both["met"]
    assert targets[("fwd+bwd", "sdpa-cudnn")]["ratio"] == pytest.approx(595 / 536)
    assert targets[("fwd+bwd", "sdpa-cudnn")]["met"]  # 1.11 >= 1.05


def test_recommend_verb_writes_what_lookup_reads(tmp_path, capsys):
    (tmp_path / "bench.json").write_text(json.dumps(_bench()))
    (tmp_path / "verify.json").write_text(json.dumps(_verify()))
    out = tmp_path / "recommendation.json"
    assert main(["recommend", "--bench", str(tmp_path / "bench.json"),
                 "--verified", f"fa4={tmp_path / 'verify.json'}", "--out", str(out)]) == 0
    assert "target met: fa4 / sdpa-cudnn fwd" in capsys.readouterr().out
    assert recommend.lookup(out, GPU, "bfloat16", 128, False, "fwd", 6000).backend == "fa4"
    assert recommend.lookup(out, "NVIDIA A100", "bfloat16", 128, False, "fwd", 6000) is None


def test_a_bad_verify_option_or_report_is_one_line(tmp_path, capsys):
    (tmp_path / "bench.json").write_text(json.dumps(_bench()))
    assert main(["recommend", "--bench", str(tmp_path / "bench.json"), "--verified", "fa4",
                 "--out", str(tmp_path / "r.json")]) == 1
    assert main(["recommend", "--bench", str(tmp_path / "missing.json"), "--out", str(tmp_path / "r.json")]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 2 and "expected BACKEND=PATH" in err[0] and "unreadable JSON report" in err[1]


def test_a_json_that_is_not_a_bench_report_is_one_line(tmp_path, capsys):
    (tmp_path / "bench.json").write_text(json.dumps({"measurements": [{"status": "ok"}]}))
    assert main(["recommend", "--bench", str(tmp_path / "bench.json"), "--out", str(tmp_path / "r.json")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a `toolkit bench` report" in err and not (tmp_path / "r.json").exists()


def test_a_backend_counts_only_for_the_shapes_its_report_proved():
    """FA4 wrong at head dim 128 (a failed case there) stays recommended at head dim 64 only."""
    report = _verify()
    report["cases"].append(_case("failed", 128, False))
    data = recommend.build(_bench(), {"fa4": report}, fa4_pins.knowledge())
    rules = [recommend.Rule(**r) for r in data["rules"]]
    pick = lambda seqlen, causal=False, d=128: recommend.lookup_rules(rules, "bfloat16", d, causal, "fwd", seqlen)
    assert pick(4096, d=64).backend == "fa4" and pick(4096, True).backend == "fa4"
    assert pick(4096).backend == pick(8192).backend == "sdpa-cudnn"
    assert data["verified"]["fa4"]["shapes"] == [["bfloat16", 64, False], ["bfloat16", 64, True],
                                                 ["bfloat16", 128, True]]


H200_RUN = ROOT / "docs" / "results" / "2026-12-01-h200-replica-and-fa4" / "fa4"


def test_the_committed_h200_run_recommends_fa4_where_it_passed_and_is_faster():
    """The real grid and the real (partial) full verification of 2026-12-01: FA4's failures were at head dims
    40 and 80, which the bench grid (64, 128) does not contain, so the grid's shapes are all proven."""
    bench = json.loads((H200_RUN / "bench" / "bench.json").read_text())
    report = json.loads((H200_RUN / "verify-fa4-full" / "verify.json").read_text())
    data = recommend.build(bench, {"fa4": report}, fa4_pins.knowledge())
    rules = [recommend.Rule(**r) for r in data["rules"]]
    pick = lambda seqlen, mode="fwd": recommend.lookup_rules(rules, "bfloat16", 128, False, mode, seqlen)
    assert pick(4096).backend == "fa4" and pick(1024).backend == "sdpa-cudnn"
    shapes = set(map(tuple, data["verified"]["fa4"]["shapes"]))
    assert ("bfloat16", 80, False) not in shapes and ("bfloat16", 128, False) in shapes
    assert data["worst_ratio"] >= 0.98


def test_recommend_for_a_line_writes_where_doctor_and_modules_read(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["recommend", "--bench", str(H200_RUN / "bench" / "bench.json"),
            "--verified", f"fa4={H200_RUN / 'verify-fa4-full' / 'verify.json'}"]
    assert main(args) == 1 and capsys.readouterr().err.startswith("error: recommend: give LINE")
    assert main([*args, "gpu-machine"]) == 0
    written = tmp_path / "reports" / "gpu-machine" / "recommendation.json"
    rec = recommend.read_recommendation(written)
    assert rec.gpu == "NVIDIA H200" and rec.date == "2026-12-01"
    assert any("fa4 (attn_implementation=flash_attention_4)" in line for line in recommend.summary(rec))


def test_the_parity_report_names_the_recommended_attn_implementation(tmp_path, monkeypatch):
    """The parity model's shape (bf16, head dim 64, causal, seqlen 32) looked up in the real H200 recommendation,
    and the line the report prints; a broken file is named, not a crash."""
    import shutil

    from toolkit.verify import parity_recommendation
    from toolkit.verify.report import recommended_line

    monkeypatch.chdir(tmp_path)
    assert parity_recommendation("gpu-machine") is None
    target = tmp_path / "reports" / "gpu-machine" / "recommendation.json"
    target.parent.mkdir(parents=True)
    shutil.copy(H200_RUN / "recommendation-per-shape.json", target)
    found = parity_recommendation("gpu-machine")
    data = json.loads(target.read_text())
    rule = recommend.lookup_rules([recommend.Rule(**r) for r in data["rules"]], "bfloat16", 64, True, "fwd", 32)
    assert rule is not None and found["backend"] == rule.backend
    assert found["attn_implementation"] == rule.attn_implementation and found["gpu"] == "NVIDIA H200"
    line = recommended_line({"recommended": found})
    assert line.startswith("recommended attention for bfloat16 d64 causal fwd seqlen 32 on NVIDIA H200")
    assert f"attn_implementation={rule.attn_implementation['name']}" in line
    target.write_text("{}")
    assert "not a recommendation" in recommended_line({"recommended": parity_recommendation("gpu-machine")})
