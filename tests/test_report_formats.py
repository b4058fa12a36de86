"""The attention reports are typed and versioned (issue 31, item 5): every committed verify, bench and
recommendation file under docs/results/ (schema 1, the old names `flash-attn` and `fa4`) reads through today's
readers with its names mapped, and `toolkit recommend` over the committed results chooses as it did then.

Expected values come from the raw files (json.load), the renames from issue 31's table below, never from the
readers under test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from toolkit.attention import formats, recommend
from toolkit.base.errors import ToolkitError
from toolkit.cli import main

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"
RENAMED = {"flash-attn": "flash-attn-2", "fa4": "flash-attn-4"}  # issue 31's contract


def now(name: str | None) -> str | None:
    return RENAMED.get(name, name) if name is not None else None


def committed(kind: str) -> list[tuple[Path, dict]]:
    found = []
    for path in sorted(RESULTS.rglob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("kind") == kind:
            found.append((path, data))
    return found


@pytest.mark.parametrize(("path", "raw"), committed("bench"), ids=lambda v: str(v)[-60:] if isinstance(v, Path) else "")
def test_every_committed_bench_reads_with_todays_names(path, raw):
    data = formats.read_bench(path)
    written = raw["flash_attn_2"] if raw.get("schema") == 2 else raw["flash_attn"]  # FA2's entry, by either name
    assert data["schema"] == 2 and "flash_attn" not in data and data["flash_attn_2"] == written
    assert [(m["implementation"], m["tflops"], m["seqlen"]) for m in data["measurements"]] == [
        (now(m["implementation"]), m["tflops"], m["seqlen"]) for m in raw["measurements"]]
    assert [t["implementation"] for t in data.get("targets", [])] == [now(t["implementation"])
                                                                        for t in raw.get("targets", [])]


@pytest.mark.parametrize(("path", "raw"), committed("verify"), ids=lambda v: str(v)[-60:] if isinstance(v, Path) else "")
def test_every_committed_verify_report_reads(path, raw):
    data = formats.read_verify(path)
    assert data["schema"] == 2 and data["summary"] == raw["summary"] and data["cases"] == raw["cases"]


@pytest.mark.parametrize(("path", "raw"), committed("attention-recommendation"),
                         ids=lambda v: str(v)[-60:] if isinstance(v, Path) else "")
def test_every_committed_recommendation_reads_with_todays_names(path, raw):
    rec = recommend.read_recommendation(path)
    assert rec.gpu == raw["gpu"] and rec.date == raw["date"][:10] and rec.schema == 2
    assert [(r.seqlen_min, r.backend, r.best_backend, r.tflops) for r in rec.rules] == [
        (r["seqlen_min"], now(r["backend"]), now(r["best_backend"]), r["tflops"]) for r in raw["rules"]]
    assert set(rec.verified) == {now(name) for name in raw["verified"]}


def test_each_kind_has_committed_files():
    assert all(committed(kind) for kind in ("bench", "verify", "attention-recommendation"))


@pytest.mark.parametrize(("run", "bench", "verified"), [
    ("2026-12-01-h200-hold-3", "2026-12-01-h200-hold-3/bench/bench.json",
     {"fa4": "2026-12-01-h200-hold-3/verify-fa4-full/verify.json",
      "flash-attn-2": "2026-12-01-h200-hold-3/verify-fa2-smoke/verify.json"}),
    ("2026-12-02-h200-fa3", "2026-12-02-h200-fa3/bench/bench.json",
     {"flash-attn-3": "2026-12-02-h200-fa3/verify-fa3-full/verify.json",
      "flash-attn-4": "2026-12-01-h200-hold-3/verify-fa4-full/verify.json"}),
])
def test_recommend_over_the_committed_results_chooses_as_then(tmp_path, capsys, run, bench, verified):
    """The committed recommendation of each run, its names mapped, is what `toolkit recommend` says today over the
    same committed bench and verification reports (an old spelling typed on the command line included)."""
    out = tmp_path / "recommendation.json"
    args = ["recommend", "--bench", str(RESULTS / bench), "--out", str(out)]
    for backend, report in verified.items():
        args += ["--verified", f"{backend}={RESULTS / report}"]
    assert main(args) == 0
    err = capsys.readouterr().err
    assert err == ("toolkit recommend: --verified fa4= is now --verified flash-attn-4=; the old spelling still "
                   "works\n" if "fa4" in verified else "")
    then = json.loads((RESULTS / run / "recommendation.json").read_text())
    today = json.loads(out.read_text())
    band = lambda r, name: (r["dtype"], r["head_dim"], r["causal"], r["mode"], r["seqlen_min"], r["seqlen_max"],
                            name(r["backend"]))
    assert [band(r, lambda n: n) for r in today["rules"]] == [band(r, now) for r in then["rules"]]
    assert today["schema"] == 2 and set(today["verified"]) == {now(name) for name in then["verified"]}


@pytest.mark.parametrize("reader", [formats.read_bench, formats.read_verify, recommend.read_recommendation])
@pytest.mark.parametrize("schema", [3, "2", None, 0])
def test_a_schema_this_toolkit_does_not_read_is_one_line_with_the_command(tmp_path, reader, schema):
    path = tmp_path / "report.json"
    path.write_text(json.dumps({"schema": schema, "gpu": "NVIDIA H200", "measurements": [], "rules": []}))
    with pytest.raises(ToolkitError) as caught:
        reader(path)
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{path}: ") and "again" in message
    assert f"schema {schema!r}" in message or schema is None


def test_a_check_updates_recording_says_schema_2_and_a_schema_1_one_still_answers(tmp_path):
    from toolkit.knowledge import upstream

    url = "https://download.pytorch.org/whl/cu130/torch/"
    upstream.record(tmp_path / "rec", {url: b"<html>torch-2.11.0</html>"})
    raw = json.loads((tmp_path / "rec" / "index.json").read_text())
    assert raw["schema"] == 2 and raw["answers"][url]["trimmed"] == "as served"
    assert upstream.recorded_fetch(tmp_path / "rec")(url) == b"<html>torch-2.11.0</html>"
    committed = Path(__file__).resolve().parent / "data" / "upstream"
    old = json.loads((committed / "index.json").read_text())
    assert "schema" not in old  # a schema-1 recording, read as it is
    first = next(iter(old))
    assert upstream.recorded_fetch(committed)(first) == (committed / old[first]["file"]).read_bytes()
    (tmp_path / "rec" / "index.json").write_text(json.dumps({**raw, "schema": 3}))
    with pytest.raises(ToolkitError) as caught:
        upstream.recorded_fetch(tmp_path / "rec")
    assert "schema 3" in str(caught.value) and "--record NEW_DIR" in str(caught.value)
