"""Recommendation (issue 16): the fastest verified backend per GPU and shape, from a measured grid.

Real data: the H200 measurements of issue 16's table (bf16, d128/d64, FA4 4.0.0b36 vs cuDNN and flash
SDPA, forward, TFLOP/s, 2026-12-01), laid out as `toolkit bench` rows. The verification reports are
built here (a passed and a failed FA4 report): what matters to the recommendation is their summary.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from toolkit.attention import formats, recommend
from toolkit.cli import main
from toolkit.knowledge import fa4_pins

ROOT = Path(__file__).resolve().parent.parent
GPU = "NVIDIA H200"
# (seqlen, head_dim, causal) -> {implementation: fwd TFLOP/s}, issue 16's table
ISSUE_TABLE = {
    (4096, 128, False): {"flash-attn-4": 707, "sdpa-cudnn": 668, "sdpa-flash": 344},
    (1024, 128, False): {"flash-attn-4": 573, "sdpa-cudnn": 605, "sdpa-flash": 325},
    (8192, 128, False): {"flash-attn-4": 733, "sdpa-cudnn": 675, "sdpa-flash": 322},
    (4096, 64, False): {"flash-attn-4": 537, "sdpa-cudnn": 477, "sdpa-flash": 300},
    (4096, 128, True): {"flash-attn-4": 630, "sdpa-cudnn": 571, "sdpa-flash": 306},
    (1024, 128, True): {"flash-attn-4": 418, "sdpa-cudnn": 441, "sdpa-flash": 250},
}
FWD_BWD_4096 = {"flash-attn-4": 595, "sdpa-cudnn": 536, "flash-attn-2": 330}  # issue 16: forward+backward, d128, 4 x 4096


def _bench() -> dict:
    rows = []
    for (seqlen, head_dim, causal), values in ISSUE_TABLE.items():
        for name, tflops in values.items():
            rows.append({"implementation": name, "mode": "fwd", "causal": causal, "dtype": "bfloat16",
                         "head_dim": head_dim, "seqlen": seqlen, "status": "ok", "tflops": float(tflops)})
    rows += [{"implementation": name, "mode": "fwd+bwd", "causal": False, "dtype": "bfloat16", "head_dim": 128,
              "seqlen": 4096, "status": "ok", "tflops": float(t)} for name, t in FWD_BWD_4096.items()]
    rows.append({"implementation": "flash-attn-2", "mode": "fwd", "causal": False, "dtype": "bfloat16",
                 "head_dim": 128, "seqlen": 2048, "status": "skipped", "tflops": None})
    return {"gpu": GPU, "gpu_capability": "9.0", "date": "2026-12-01", "command": "toolkit bench gpu-machine",
            "torch": "2.11.0+cu130", "flash_attn_2": {"version": None}, "flash_attn_4": {"version": "4.0.0b36"},
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
    data = recommend.build(_bench(), {"flash-attn-4": _verify()}, fa4_pins.knowledge())
    rules = [recommend.Rule(**r) for r in data["rules"]]
    pick = lambda seqlen, causal=False, d=128: recommend.lookup_rules(rules, "bfloat16", d, causal, "fwd", seqlen)
    assert pick(1024).backend == "sdpa-cudnn" and pick(1024, True).backend == "sdpa-cudnn"
    assert pick(4096).backend == pick(8192).backend == pick(100_000).backend == "flash-attn-4"
    assert pick(4096, True).backend == "flash-attn-4" and pick(4096, d=64).backend == "flash-attn-4"
    assert pick(512).backend == "sdpa-cudnn"  # below the smallest measured seqlen: its band starts at 0
    assert pick(4096).attn_implementation == {"name": "flash_attention_4"}
    assert pick(1024).attn_implementation == {"name": "sdpa", "sdpa_backend": "CUDNN_ATTENTION"}
    assert data["worst_ratio"] == 1.0  # the best measured backend is verified on every shape


def test_bands_with_one_winner_merge():
    data = recommend.build(_bench(), {"flash-attn-4": _verify()}, fa4_pins.knowledge())
    d128 = [r for r in data["rules"] if (r["head_dim"], r["causal"], r["mode"]) == (128, False, "fwd")]
    assert [(r["seqlen_min"], r["seqlen_max"], r["backend"]) for r in d128] == [
        (0, 4095, "sdpa-cudnn"), (4096, None, "flash-attn-4")]


def test_an_unverified_fa4_is_never_recommended_and_the_shortfall_is_reported():
    for report in (_verify(failed=1), _verify(gpu="NVIDIA H100 80GB HBM3")):
        data = recommend.build(_bench(), {"flash-attn-4": report}, fa4_pins.knowledge())
        assert "flash-attn-4" not in data["verified"] and {r["backend"] for r in data["rules"]} == {"sdpa-cudnn"}
        assert data["worst_ratio"] == pytest.approx(477 / 537)  # d64 4096: cuDNN is 0.89x the unverified FA4


def test_issue_targets_are_checked_with_the_committed_fa2_number_when_the_run_has_none():
    data = recommend.build(_bench(), {"flash-attn-4": _verify()}, fa4_pins.knowledge())
    targets = {(t["mode"], t["versus"]): t for t in data["targets"]}
    fwd_fa2 = targets[("fwd", "flash-attn-2")]
    assert fwd_fa2["ratio"] == pytest.approx(707 / 390) and fwd_fa2["met"]
    assert fwd_fa2["versus_source"].startswith("committed FA2 measurement")
    assert targets[("fwd", "sdpa-cudnn")]["ratio"] == pytest.approx(707 / 668) and targets[("fwd", "sdpa-cudnn")]["met"]
    both = targets[("fwd+bwd", "flash-attn-2")]
    assert both["versus_source"] == "this run" and both["ratio"] == pytest.approx(595 / 330) and both["met"]
    assert targets[("fwd+bwd", "sdpa-cudnn")]["ratio"] == pytest.approx(595 / 536)
    assert targets[("fwd+bwd", "sdpa-cudnn")]["met"]  # 1.11 >= 1.05


def test_recommend_verb_writes_what_lookup_reads(tmp_path, capsys):
    (tmp_path / "bench.json").write_text(json.dumps(_bench()))
    (tmp_path / "verify.json").write_text(json.dumps(_verify()))
    out = tmp_path / "recommendation.json"
    assert main(["recommend", "--bench", str(tmp_path / "bench.json"),
                 "--verified", f"flash-attn-4={tmp_path / 'verify.json'}", "--out", str(out)]) == 0
    assert "target met: flash-attn-4 / sdpa-cudnn fwd" in capsys.readouterr().out
    assert recommend.lookup(out, GPU, "bfloat16", 128, False, "fwd", 6000).backend == "flash-attn-4"
    assert recommend.lookup(out, "NVIDIA A100", "bfloat16", 128, False, "fwd", 6000) is None


def test_a_bad_verify_option_or_report_is_one_line(tmp_path, capsys):
    (tmp_path / "bench.json").write_text(json.dumps(_bench()))
    assert main(["recommend", "--bench", str(tmp_path / "bench.json"), "--verified", "flash-attn-4",
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
    data = recommend.build(_bench(), {"flash-attn-4": report}, fa4_pins.knowledge())
    rules = [recommend.Rule(**r) for r in data["rules"]]
    pick = lambda seqlen, causal=False, d=128: recommend.lookup_rules(rules, "bfloat16", d, causal, "fwd", seqlen)
    assert pick(4096, d=64).backend == "flash-attn-4" and pick(4096, True).backend == "flash-attn-4"
    assert pick(4096).backend == pick(8192).backend == "sdpa-cudnn"
    assert data["verified"]["flash-attn-4"]["shapes"] == [["bfloat16", 64, False], ["bfloat16", 64, True],
                                                 ["bfloat16", 128, True]]


H200_RUN = ROOT / "docs" / "results" / "2026-12-01-h200-replica-and-fa4" / "fa4"


def test_the_committed_h200_run_recommends_fa4_where_it_passed_and_is_faster():
    """The real grid and the real (partial) full verification of 2026-12-01: FA4's failures were at head dims
    40 and 80, which the bench grid (64, 128) does not contain, so the grid's shapes are all proven."""
    bench = formats.read_bench(H200_RUN / "bench" / "bench.json")
    report = formats.read_verify(H200_RUN / "verify-fa4-full" / "verify.json")
    data = recommend.build(bench, {"flash-attn-4": report}, fa4_pins.knowledge())
    rules = [recommend.Rule(**r) for r in data["rules"]]
    pick = lambda seqlen, mode="fwd": recommend.lookup_rules(rules, "bfloat16", 128, False, mode, seqlen)
    assert pick(4096).backend == "flash-attn-4" and pick(1024).backend == "sdpa-cudnn"
    shapes = set(map(tuple, data["verified"]["flash-attn-4"]["shapes"]))
    assert ("bfloat16", 80, False) not in shapes and ("bfloat16", 128, False) in shapes
    assert data["worst_ratio"] >= 0.98


def test_recommend_for_a_line_writes_where_doctor_and_modules_read(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    args = ["recommend", "--bench", str(H200_RUN / "bench" / "bench.json"),
            "--verified", f"flash-attn-4={H200_RUN / 'verify-fa4-full' / 'verify.json'}"]
    assert main(args) == 1 and capsys.readouterr().err.startswith("error: recommend: give LINE")
    assert main([*args, "gpu-machine"]) == 0
    written = tmp_path / "reports" / "gpu-machine" / "recommendation.json"
    rec = recommend.read_recommendation(written)
    assert rec.gpu == "NVIDIA H200" and rec.date == "2026-12-01"
    assert any("flash-attn-4 (attn_implementation=flash_attention_4)" in line for line in recommend.summary(rec))


def test_the_parity_report_names_the_recommended_attn_implementation(tmp_path, monkeypatch):
    """The parity model's shape (bf16, head dim 64, causal, seqlen 32) looked up in the real H200 recommendation,
    and the line the report prints; a broken file is named, not a crash."""
    import shutil

    pytest.importorskip("torch")  # toolkit.verify.parity, which holds the parity model's shape, imports it
    from toolkit.verify.command import parity_recommendation
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


# ---------------------------------------------------------------- every verified backend, and verl's lines

HOLD3 = ROOT / "docs" / "results" / "2026-12-01-h200-hold-3"
# verl 0.9.1's keys, read from its wheel's verl/trainer/config/_generated_ppo_trainer.yaml (tests/test_verl_keys.py
# checks the knowledge against that file on PyPI)
VERL_KEYS = ("actor_rollout_ref.model.override_config.attn_implementation",
             "critic.model.override_config.attn_implementation")


def _hold3_reports() -> tuple[dict, dict[str, dict]]:
    """Hold 3's real bench (FA2, FA4 and torch's backends on one H200) and both real verification reports."""
    load = lambda *parts: formats.read_verify(HOLD3.joinpath(*parts))
    return formats.read_bench(HOLD3 / "bench" / "bench.json"), {"flash-attn-4": load("verify-fa4-full", "verify.json"),
                                         "flash-attn-2": load("verify-fa2-smoke", "verify.json")}


def _measured(bench: dict, implementation: str, head_dim: int = 128, seqlen: int = 4096) -> float:
    """A bench row's TFLOP/s at verl's training shape (bf16, causal, forward+backward)."""
    return next(r["tflops"] for r in bench["measurements"] if (r["implementation"], r["dtype"], r["head_dim"],
                r["causal"], r["mode"], r["seqlen"]) == (implementation, "bfloat16", head_dim, True, "fwd+bwd", seqlen))


def test_verl_gets_the_override_lines_and_yaml_of_the_backend_fastest_at_its_training_shape():
    bench, reports = _hold3_reports()
    data = recommend.build(bench, reports, fa4_pins.knowledge())
    verl = data["verl"]
    fa4, fa2 = _measured(bench, "flash-attn-4"), _measured(bench, "flash-attn-2")
    assert fa4 > fa2 and fa4 > _measured(bench, "sdpa-cudnn")  # 555 vs 300 and 512 TFLOP/s on the H200
    assert (verl["backend"], verl["attn_implementation"], verl["verl"]) == ("flash-attn-4", "flash_attention_4", "0.9.1")
    assert verl["shape"] == "bfloat16 d128 causal fwd+bwd seqlen 4096"
    assert verl["overrides"] == [f"{key}=flash_attention_4" for key in VERL_KEYS]
    assert yaml.safe_load(verl["yaml"]) == {
        "actor_rollout_ref": {"model": {"override_config": {"attn_implementation": "flash_attention_4"}}},
        "critic": {"model": {"override_config": {"attn_implementation": "flash_attention_4"}}}}
    assert verl["notes"] == [f"verl's default flash_attention_2 (flash-attn-2) measured {fa2:.0f} TFLOP/s here, "
                             f"{fa2 / fa4:.2f}x the recommended flash-attn-4"]
    assert data["versions"] == {"flash-attn": "2.8.3.post2", "flash-attn-3": None, "flash-attn-4": "4.0.0b36"}


def test_flash_attn_is_recommended_beside_fa4_where_its_report_passed():
    """Every verified backend competes: FA2's smoke report counts for the shapes it passed, FA4's for its own."""
    bench, reports = _hold3_reports()
    data = recommend.build(bench, reports, fa4_pins.knowledge())
    assert {"flash-attn-4", "flash-attn-2"} <= set(data["verified"])
    without_fa2 = recommend.build(bench, {"flash-attn-4": reports["flash-attn-4"]}, fa4_pins.knowledge())
    assert "flash-attn-2" not in without_fa2["verified"]


def test_an_sdpa_kernel_recommended_for_verl_is_sdpa_with_the_caveat_that_torch_picks_the_kernel():
    """The replica run without FA4's report: cuDNN SDPA is the fastest verified at verl's shape, and verl's own
    default was never verified there (no flash-attn report)."""
    bench = formats.read_bench(H200_RUN / "bench" / "bench.json")
    verl = recommend.build(bench, {}, fa4_pins.knowledge())["verl"]
    assert (verl["backend"], verl["attn_implementation"]) == ("sdpa-cudnn", "sdpa")
    assert verl["overrides"] == [f"{key}=sdpa" for key in VERL_KEYS]
    assert any("torch picks the kernel" in note and "CUDNN_ATTENTION" in note for note in verl["notes"])
    assert any("default flash_attention_2 (flash-attn-2) was not verified" in note for note in verl["notes"])


def test_verl_s_shape_is_an_option_and_an_unmeasured_one_says_so(tmp_path, capsys):
    bench, reports = _hold3_reports()
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    args = ["recommend", "--bench", str(tmp_path / "bench.json"), "--out", str(tmp_path / "r.json")]
    for backend, path in (("flash-attn-4", "verify-fa4-full"), ("flash-attn-2", "verify-fa2-smoke")):
        args += ["--verified", f"{backend}={HOLD3 / path / 'verify.json'}"]
    assert main([*args, "--head-dim", "96"]) == 0
    out = capsys.readouterr().out
    assert "verl (bfloat16 d96 causal fwd+bwd seqlen 4096): no verified backend was measured" in out
    assert json.loads((tmp_path / "r.json").read_text())["verl"]["overrides"] == []
    assert main([*args, "--head-dim", "64", "--seqlen", "16384"]) == 0
    out = capsys.readouterr().out.splitlines()
    start = out.index("verl 0.9.1 (bfloat16 d64 causal fwd+bwd seqlen 16384): flash-attn-4, as command-line overrides:")
    assert out[start + 1:start + 3] == [f"  {key}=flash_attention_4" for key in VERL_KEYS]
    assert out[start + 3] == "or in the trainer's YAML:"
    assert yaml.safe_load("\n".join(line[2:] for line in out[start + 4:start + 12]))["critic"]["model"] == {
        "override_config": {"attn_implementation": "flash_attention_4"}}


def test_fa3_is_a_backend_by_knowledge_alone():
    """flash-attn-3 is an entry of knowledge/attention_backends.yaml, nothing in code: its verification report is
    taken, its rows compete and verl is told flash_attention_3. Not an FA3 measurement (none has run yet): hold 3's
    FA4 rows and FA4 report relabelled flash-attn-3, so it must win exactly where FA4 won."""
    bench, reports = _hold3_reports()
    relabel = lambda name: "flash-attn-3" if name == "flash-attn-4" else name
    fa3_bench = {**bench, "flash_attn_3": {"version": "3.0.0b1"},
                 "measurements": [{**r, "implementation": relabel(r["implementation"])} for r in bench["measurements"]]}
    recommend.check_input(recommend.BenchReport, fa3_bench, Path("bench.json"), "bench", "",
                          recommend.attention_backends.names())
    as_fa4 = recommend.build(bench, {"flash-attn-4": reports["flash-attn-4"]}, fa4_pins.knowledge())
    as_fa3 = recommend.build(fa3_bench, {"flash-attn-3": reports["flash-attn-4"]}, fa4_pins.knowledge())
    assert "flash-attn-3" in as_fa3["verified"] and as_fa3["versions"]["flash-attn-3"] == "3.0.0b1"
    bands = lambda data: [(r["dtype"], r["head_dim"], r["causal"], r["mode"], r["seqlen_min"], relabel(r["backend"]))
                          for r in data["rules"]]
    assert bands(as_fa3) == bands(as_fa4) and any(b[-1] == "flash-attn-3" for b in bands(as_fa3))
    assert {r["attn_implementation"]["name"] for r in as_fa3["rules"] if r["backend"] == "flash-attn-3"} == {
        "flash_attention_3"}
    assert as_fa3["verl"]["overrides"] == [f"{key}=flash_attention_3" for key in VERL_KEYS]


def test_the_read_back_recommendation_says_which_backends_were_verified():
    rec = recommend.read_recommendation(HOLD3 / "recommendation.json")
    assert set(rec.verified) == {"sdpa-flash", "sdpa-cudnn", "sdpa-efficient", "sdpa-math", "eager", "flash-attn-4",
                                 "flash-attn-2"}
    assert ("bfloat16", 128, True) in map(tuple, rec.verified["flash-attn-2"].shapes)


# Where no packaged backend is verified, cuDNN SDPA is recommended and each shape below the minimum names the
# backend measured fastest: at each shape another one, never the first or last by name or in the file's order.
UNVERIFIED_FASTEST = {
    4096: {"sdpa-cudnn": 600, "eager": 50, "flash-attn-4": 700, "flash-attn-3": 690, "flash-attn-2": 650, "sdpa-flash": 300},
    8192: {"sdpa-cudnn": 610, "eager": 40, "flash-attn-4": 700, "flash-attn-3": 720, "flash-attn-2": 500, "sdpa-flash": 310},
    1024: {"sdpa-cudnn": 600, "eager": 60, "flash-attn-4": 640, "flash-attn-3": 550, "flash-attn-2": 660, "sdpa-flash": 290},
}


def test_below_min_ratio_names_the_backend_measured_fastest_at_each_shape(tmp_path, capsys):
    rows = [{"implementation": name, "mode": "fwd", "causal": False, "dtype": "bfloat16", "head_dim": 128,
             "seqlen": seqlen, "status": "ok", "tflops": float(tflops)}
            for seqlen, values in UNVERIFIED_FASTEST.items() for name, tflops in values.items()]
    (tmp_path / "bench.json").write_text(json.dumps({**_bench(), "measurements": rows}))
    out = tmp_path / "recommendation.json"
    assert main(["recommend", "--bench", str(tmp_path / "bench.json"), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    below = json.loads(out.read_text())["below_min_ratio"]
    fastest = {seqlen: max(values, key=values.__getitem__) for seqlen, values in UNVERIFIED_FASTEST.items()}
    assert fastest == {4096: "flash-attn-4", 8192: "flash-attn-3", 1024: "flash-attn-2"}
    assert {r["seqlen"]: r["fastest"] for r in below} == fastest
    assert {r["seqlen"]: r["ratio"] for r in below} == pytest.approx(
        {seqlen: values["sdpa-cudnn"] / max(values.values()) for seqlen, values in UNVERIFIED_FASTEST.items()})
    for seqlen, name in fastest.items():
        ratio = UNVERIFIED_FASTEST[seqlen]["sdpa-cudnn"] / UNVERIFIED_FASTEST[seqlen][name]
        assert (f"bfloat16 d128 fwd seqlen {seqlen} ({ratio:.3f}): {name} measured fastest, but no verification "
                f"report of {name} was given") in printed
