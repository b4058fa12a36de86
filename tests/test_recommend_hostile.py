"""Hostile recommendation files and hostile `toolkit recommend` inputs (hostile review D5, D7, D10).

Every file here starts from real data: the H200 recommendation the toolkit wrote on 2026-12-01
(docs/results/2026-12-01-h200-replica-and-fa4/fa4/recommendation-per-shape.json) and the bench and FA4
verification reports of hold 3 (docs/results/2026-12-01-h200-hold-3). Only the one field each test
names is changed, as a hand edit or a damaged run would change it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.attention import recommend
from toolkit.base.errors import ToolkitError
from toolkit.cli import main

ROOT = Path(__file__).resolve().parent.parent
WRITTEN = ROOT / "docs" / "results" / "2026-12-01-h200-replica-and-fa4" / "fa4" / "recommendation-per-shape.json"
HOLD3 = ROOT / "docs" / "results" / "2026-12-01-h200-hold-3"


def _written() -> dict:
    return json.loads(WRITTEN.read_text())


def _refusal(tmp_path: Path, data: object) -> str:
    """The reader's one-line refusal of `data` as a recommendation file."""
    path = tmp_path / "recommendation.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ToolkitError) as caught:
        recommend.read_recommendation(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def _with_rule(index: int, field: str, value: object) -> dict:
    data = _written()
    data["rules"][index][field] = value
    return data


def test_the_committed_recommendation_reads_back():
    rec = recommend.read_recommendation(WRITTEN)
    assert rec.gpu == "NVIDIA H200" and rec.date == "2026-12-01" and len(rec.rules) == len(_written()["rules"])


# D5: a rule whose backend or attn_implementation has the wrong JSON type is a ToolkitError, not a traceback
@pytest.mark.parametrize(("field", "value"), [
    ("attn_implementation", ["x"]), ("attn_implementation", "sdpa"), ("attn_implementation", None),
    ("backend", ["fa4"]), ("backend", {"fa4": 1}), ("best_backend", ["fa4"]), ("best_backend", None),
    ("tflops", "fast"), ("causal", "yes"), ("head_dim", True), ("head_dim", 12.5), ("seqlen_max", "x")])
def test_a_rule_of_the_wrong_type_is_one_line_naming_the_field(tmp_path, field, value):
    assert f"rules[0].{field}:" in _refusal(tmp_path, _with_rule(0, field, value))


@pytest.mark.parametrize("data", [[1, 2], None, "rules", {"gpu": "NVIDIA H200", "rules": {"a": 1}},
                                  {"gpu": "NVIDIA H200", "rules": [1]}, {"gpu": "NVIDIA H200"}])
def test_a_file_of_another_shape_is_one_line(tmp_path, data):
    _refusal(tmp_path, data)


def test_doctor_and_modules_see_a_toolkit_error(tmp_path, monkeypatch):
    """What doctor_facts, modules and the parity report call: read_if_any raises only ToolkitError, and
    for_parity turns it into its `error` entry."""
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "recommendation.json"
    path.write_text(json.dumps(_with_rule(0, "attn_implementation", ["x"])))
    with pytest.raises(ToolkitError):
        recommend.read_if_any(path)
    assert "rules[0].attn_implementation" in recommend.for_parity(path, 64, 32)["error"]


# D10: the refusal names the field that is wrong, not the rule's (valid) backend
@pytest.mark.parametrize(("edit", "named"), [
    (lambda d: d["rules"][3]["attn_implementation"].__setitem__("sdpa_backend", "]]"),
     "rules[3].attn_implementation.sdpa_backend: ']]' is not a name"),
    (lambda d: d["rules"][3]["attn_implementation"].__setitem__("module", "x"), "rules[3].attn_implementation.module"),
    (lambda d: d["rules"][2].__setitem__("seqlen_min", "0"), "rules[2].seqlen_min:"),
    (lambda d: d["rules"][2].__setitem__("seqlen_min", 0.5), "rules[2].seqlen_min:"),
    (lambda d: d["rules"][2].__setitem__("seqlen_min", -1), "rules[2].seqlen_min:"),
    (lambda d: d["rules"][1].__setitem__("dtype", "float32"), "rules[1].dtype:"),
    (lambda d: d["rules"][1].__setitem__("mode", "bwd"), "rules[1].mode:"),
    (lambda d: d["rules"][1].__setitem__("backend", "sdpa-magic"), "rules[1].backend: 'sdpa-magic' is not a backend"),
    (lambda d: d["rules"][1].__setitem__("tflops", 1e999), "rules[1].tflops:"),
    (lambda d: d["rules"][1].pop("backend"), "rules[1].backend: field required"),
    (lambda d: d["rules"][1].__setitem__("extra", 1), "rules[1].extra:"),
    (lambda d: d.__setitem__("gpu", "H200 ) os.exit(4) -- ( exec \"id\""), "gpu: "),
    (lambda d: d.__setitem__("gpu", ["H200"]), "gpu: "),
    (lambda d: d.__setitem__("date", "2026-12-0]"), "date: "),
])
def test_the_refusal_names_the_bad_field(tmp_path, edit, named):
    data = _written()
    edit(data)
    message = _refusal(tmp_path, data)
    assert named in message and "(run toolkit recommend again)" in message
    assert "known backends" not in message or "backend:" in named


# D7: `toolkit recommend` checks its bench and verify inputs, writes nothing its own reader refuses, never NaN
def _bench() -> dict:
    return json.loads((HOLD3 / "bench" / "bench.json").read_text())


def _verify() -> dict:
    return json.loads((HOLD3 / "verify-fa4-full" / "verify.json").read_text())


def _every(rows: list[dict], field: str, value: object) -> None:
    for row in rows:
        row[field] = value


def _recommend(tmp_path: Path, capsys, bench: dict, verify: dict, backend: str = "flash-attn-4") -> tuple[int, str, Path]:
    """Runs the verb on the two reports as files; (exit code, stderr, the output path)."""
    (tmp_path / "bench.json").write_text(json.dumps(bench))
    (tmp_path / "verify.json").write_text(json.dumps(verify))
    out = tmp_path / "out" / "recommendation.json"
    code = main(["recommend", "--bench", str(tmp_path / "bench.json"),
                 "--verified", f"{backend}={tmp_path / 'verify.json'}", "--out", str(out)])
    return code, capsys.readouterr().err, out


def test_the_real_hold_3_reports_give_a_file_the_reader_takes(tmp_path, capsys):
    code, err, out = _recommend(tmp_path, capsys, _bench(), _verify())
    assert code == 0 and err == "" and "NaN" not in out.read_text()
    rec = recommend.read_recommendation(out)
    assert rec.gpu == "NVIDIA H200" and rec.date == "2026-12-01" and rec.rules


@pytest.mark.parametrize(("edit", "where", "named"), [
    (lambda b, v: [c["params"].__setitem__("head_dim", "x") for c in v["cases"]], "verify", "cases[0].params.head_dim"),
    (lambda b, v: [c["params"].__setitem__("head_dim", float("inf")) for c in v["cases"]], "verify",
     "cases[0].params.head_dim"),
    (lambda b, v: [c["params"].__setitem__("causal", "no") for c in v["cases"]], "verify", "cases[0].params.causal"),
    (lambda b, v: v["cases"][5].pop("params"), "verify", "cases[5].params: field required"),
    (lambda b, v: v.__setitem__("cases", {"a": 1}), "verify", "cases:"),
    (lambda b, v: v.__setitem__("summary", ["passed"]), "verify", "summary:"),
    (lambda b, v: _every(b["measurements"], "head_dim", "abc"), "bench", "measurements[0].head_dim"),
    (lambda b, v: _every(b["measurements"], "head_dim", 0), "bench", "measurements[0].head_dim"),
    (lambda b, v: _every(b["measurements"], "seqlen", True), "bench", "measurements[0].seqlen"),
    (lambda b, v: _every(b["measurements"], "tflops", float("nan")), "bench", "measurements[0].tflops"),
    (lambda b, v: _every(b["measurements"], "tflops", float("inf")), "bench", "measurements[0].tflops"),
    (lambda b, v: b["measurements"][7].__setitem__("tflops", -3.0), "bench", "measurements[7].tflops"),
    (lambda b, v: b["measurements"][7].__setitem__("tflops", "700"), "bench", "measurements[7].tflops"),
    (lambda b, v: b["measurements"][2].__setitem__("dtype", "float8"), "bench", "measurements[2].dtype"),
    (lambda b, v: b["measurements"][2].__setitem__("mode", "bwd"), "bench", "measurements[2].mode"),
    (lambda b, v: b["measurements"][2].__setitem__("status", ["ok"]), "bench", "measurements[2].status"),
    (lambda b, v: b["measurements"][1].__setitem__("implementation", 'fa4"); os.execute("id'), "bench",
     "measurements[1].implementation"),
    (lambda b, v: b["measurements"][1].pop("causal"), "bench", "measurements[1].causal: field required"),
    (lambda b, v: b.__setitem__("gpu", "H200 ) os.exit(4) -- ( exec \"id\""), "bench", "gpu: "),
    (lambda b, v: b.__setitem__("gpu", None), "bench", "gpu: "),
    (lambda b, v: b.__setitem__("date", "yesterday"), "bench", "date: "),
    (lambda b, v: b.__setitem__("torch", float("nan")), "bench", "torch: "),
    (lambda b, v: b.__setitem__("flash_attn_4", {"version": float("nan")}), "bench", "flash_attn_4.version"),
    (lambda b, v: b.__setitem__("measurements", None), "bench", "measurements: "),
])
def test_a_malformed_input_is_one_line_naming_file_and_field_and_nothing_is_written(tmp_path, capsys, edit, where,
                                                                                     named):
    bench, verify = _bench(), _verify()
    edit(bench, verify)
    code, err, out = _recommend(tmp_path, capsys, bench, verify)
    assert code == 1 and err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"error: {tmp_path / f'{where}.json'}: ") and named in err, err
    assert not out.exists() and not out.parent.exists()


def test_a_verify_report_for_a_backend_the_knowledge_does_not_name_is_refused(tmp_path, capsys):
    code, err, out = _recommend(tmp_path, capsys, _bench(), _verify(), backend="fa5")
    assert code == 1 and err.count("\n") == 1 and "--verified 'fa5'=PATH" in err and "flash-attn-4" in err and not out.exists()


def test_a_row_that_prints_badly_leaves_no_file(tmp_path, capsys, monkeypatch):
    """The summary is printed only after the file is checked; whatever fails before the write leaves none:
    here build() itself is made to produce what the reader refuses (a backend name of its own)."""
    real = recommend.build

    def hostile_build(*args):
        data = real(*args)
        data["rules"][0]["attn_implementation"] = {"name": "x]] os.exit(1) --[["}
        return data

    monkeypatch.setattr(recommend, "build", hostile_build)
    code, err, out = _recommend(tmp_path, capsys, _bench(), _verify())
    assert code == 1 and "rules[0].attn_implementation.name" in err and not out.exists()


def test_finite_tflops_whose_ratio_overflows_give_one_line_and_no_nan_file(tmp_path, capsys):
    """1e300 over 1e-300 is inf in Python: issue 16's target ratio (fa4 / sdpa-cudnn, fwd d128 4096) would
    be written as `Infinity`; the write refuses non-finite floats instead."""
    bench = _bench()
    for row in bench["measurements"]:
        if (row["mode"], row["head_dim"], row["seqlen"], row["causal"]) == ("fwd", 128, 4096, False):
            row["tflops"] = {"fa4": 1e300, "sdpa-cudnn": 1e-300}.get(row["implementation"], row["tflops"])
    code, err, out = _recommend(tmp_path, capsys, bench, _verify())
    assert code == 1 and err.count("\n") == 1 and "not finite" in err and not out.exists()


@pytest.mark.parametrize("through", ["--out", "LINE"])
def test_an_output_that_is_a_folder_is_one_line_and_the_folder_is_kept(tmp_path, capsys, monkeypatch, through):
    """`--out DIR` (or reports/LINE/recommendation.json being a folder): one line naming it, its files untouched."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bench.json").write_text(json.dumps(_bench()))
    folder = tmp_path / "out" if through == "--out" else tmp_path / "reports" / "gpu-machine" / "recommendation.json"
    folder.mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    target = ["--out", str(folder)] if through == "--out" else ["gpu-machine"]
    assert main(["recommend", "--bench", str(tmp_path / "bench.json"), *target]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    shown = folder if through == "--out" else folder.relative_to(tmp_path)
    assert err.startswith(f"error: {shown}: a folder, where the recommendation JSON file goes (name a file with --out")
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted(["bench.json", "notes.txt", *(
        [folder.name] if through == "--out" else ["reports", "gpu-machine", "recommendation.json"])])
    assert (folder / "notes.txt").read_text() == "mine\n"
