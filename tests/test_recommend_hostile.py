"""Hostile recommendation files and hostile `fa4 recommend` inputs (hostile review D5, D7, D10).

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
from toolkit.errors import ToolkitError

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
    assert named in message and "(run toolkit fa4 recommend again)" in message
    assert "known backends" not in message or "backend:" in named
