"""The first-build schedule: object costs from the committed H200 build records (toolkit/knowledge/object_costs.yaml)
order a build that has no record of its sdist, an earlier record or --order-from still wins, and a broken
knowledge file is one line.

Expected values are read here from the committed files themselves (json and a regex, not the toolkit's readers):
docs/results/2026-11-29-h200-gpu-machine/build-record.json (the measured times) and torch's build.ninja of the
same sdist from two builds on the H200 (docs/results/2026-12-01-h200-hold-3/replica/ and
docs/results/2026-12-01-h200-replica-and-fa4/replica/; the latter written before any record existed, so in
torch's own order, with the shim's seed lines, which are dropped here to give torch's text back). FlashAttention-3:
docs/results/2026-12-02-h200-fa3/build-record.json (the H200's times), its cpu-build/build-record.json (the same
objects on a 2-CPU machine) and cpu-build/build.ninja (written in build.ninja's order, no record existing).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml

from toolkit.base.errors import ToolkitError
from toolkit.build.ninja_shim import ManifestPlan, prepared_manifest
from toolkit.build.timing import schedule_order
from toolkit.env.lockfile import LockedSdist
from toolkit.knowledge import files as knowledge_files
from toolkit.knowledge.files import KNOWLEDGE_DIR
from toolkit.knowledge.object_costs import CostKey, ReleaseCosts, load_object_costs

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "docs" / "results"
MEASURED = RESULTS / "2026-11-29-h200-gpu-machine" / "build-record.json"
ORDERED_NINJA = RESULTS / "2026-12-01-h200-hold-3" / "replica" / "build.ninja"
TORCH_ORDER_NINJA = RESULTS / "2026-12-01-h200-replica-and-fa4" / "replica" / "build.ninja"
FA3_RESULTS = RESULTS / "2026-12-02-h200-fa3"
FA3_MEASURED = FA3_RESULTS / "build-record.json"
FA3_CPU_MACHINE = FA3_RESULTS / "cpu-build" / "build-record.json"
FA3_NINJA = FA3_RESULTS / "cpu-build" / "build.ninja"
FA3_FP8_FWD = RESULTS / "2026-12-05-h100-round5" / "fa3-build-record.json"
EDGE = re.compile(r"^build (\S+\.o): \S+ (\S+)$", re.M)


def measured() -> dict:
    return json.loads(MEASURED.read_text())


def sources_of_objects(ninja: Path, top: str = "flash_attn-2.8.3.post2") -> dict[str, str]:
    """object file name -> source path inside the source's top folder, from a build.ninja."""
    return {Path(obj).name: source.split(f"/{top}/", 1)[1] for obj, source in EDGE.findall(ninja.read_text())}


def torch_manifest(ninja: Path = TORCH_ORDER_NINJA, top: str = "flash_attn-2.8.3.post2") -> tuple[str, str]:
    """A build.ninja written before any record (the shim's seed lines dropped: torch's own text) and its build
    folder."""
    text = ninja.read_text()
    build_dir = re.search(rf"^build (/\S+?)/{re.escape(top)}/", text, re.M).group(1)
    seed = re.compile(r"  (nvcc|nvcc_from_env) = \$\1 -frandom-seed=")
    return "\n".join(line for line in text.split("\n") if not seed.match(line)), build_dir


def sdist_of(record: dict) -> LockedSdist:
    return LockedSdist(**record["sdist"])


def fa2_key(record: dict) -> CostKey:
    return CostKey("fa2", record["sdist"]["sha256"])


def fa3_key(record: dict) -> CostKey:
    """What the record's FlashAttention-3 build pinned: its commit and profile."""
    return CostKey("fa3", record["flash_attn_3"]["commit"], record["flash_attn_3"]["profile"])


def release(profile: str, fa3_profile: str | None = "hopper-training-fp8") -> ReleaseCosts:
    (costs,) = [r for r in load_object_costs().releases
                if r.key.profile == profile and (profile != "fa3" or r.key.fa3_profile == fa3_profile)]
    return costs


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rank correlation (no ties in these records): 1 - 6 sum d^2 / (n (n^2 - 1))."""
    def ranks(values: list[float]) -> list[int]:
        return [sorted(values).index(v) for v in values]

    assert len(set(xs)) == len(xs) and len(set(ys)) == len(ys)
    n = len(xs)
    return 1 - 6 * sum((a - b) ** 2 for a, b in zip(ranks(xs), ranks(ys))) / (n * (n * n - 1))


@pytest.fixture(autouse=True)
def fresh_knowledge():
    load_object_costs.cache_clear()
    yield
    load_object_costs.cache_clear()


def test_the_knowledge_holds_the_committed_records_times_by_source_path():
    record = measured()
    costs = release("fa2")
    names = sources_of_objects(ORDERED_NINJA)
    assert len(record["outputs"]["objects"]) == len(names) == 73
    assert costs.cpu_seconds == {names[o["name"]]: o["seconds"] for o in record["outputs"]["objects"]}
    assert (costs.version, costs.arch) == ("2.8.3.post2", "90")
    assert costs.key == fa2_key(record) and record["inputs"]["archs"] == ["90"]
    assert record["parallelism"]["jobs"] <= record["parallelism"]["cpus"]  # one object per CPU: its own work
    assert "docs/results/2026-11-29-h200-gpu-machine/build-record.json" in load_object_costs().sources[costs.source]
    # the same objects in the other build.ninja of the sdist: names match across build folders
    assert sources_of_objects(TORCH_ORDER_NINJA) == names


def test_fa3_costs_are_the_h200_records_times_keyed_by_commit_and_profile():
    record, other = json.loads(FA3_MEASURED.read_text()), json.loads(FA3_CPU_MACHINE.read_text())
    costs = release("fa3")
    names = sources_of_objects(FA3_NINJA, "flash-attention")
    assert len(record["outputs"]["objects"]) == len(names) == 30
    assert costs.cpu_seconds == {names[o["name"]]: o["seconds"] for o in record["outputs"]["objects"]}
    assert costs.key == fa3_key(record) == fa3_key(other) == CostKey(
        "fa3", "c75d019dea9d910312974417bc28f190dfdda6d9", "hopper-training-fp8")
    assert (costs.version, costs.arch, record["inputs"]["archs"]) == (record["flash_attn_3"]["version"], "90", ["90"])
    # the source says what the figures are: 20 jobs on 16 CPUs, and how far the 2-CPU machine's ranks agree
    assert (record["parallelism"]["jobs"], record["parallelism"]["cpus"]) == (20, 16)
    text = load_object_costs().sources[costs.source]
    assert "docs/results/2026-12-02-h200-fa3/build-record.json" in text and "20 compiles sharing 16 CPUs" in text
    assert "docs/results/2026-12-02-h200-fa3/cpu-build/build-record.json" in text
    theirs = {o["name"]: o["seconds"] for o in other["outputs"]["objects"]}
    ours = {o["name"]: o["seconds"] for o in record["outputs"]["objects"]}
    assert ours.keys() == theirs.keys()
    assert f"Spearman {spearman([ours[n] for n in ours], [theirs[n] for n in ours]):.3f}" in text


def test_fa3_fp8_fwd_costs_are_the_h100_records_times_by_the_sources_setup_py_compiles():
    """The GPU build of profile hopper-fp8-fwd said "estimate: unknown": its own record's times are its costs now,
    each object under the source the hopper-training-fp8 build.ninja gives it where the profiles share it, else
    hopper/instantiations/<object>.cu (hopper/setup.py's sources_fwd_sm90)."""
    record = json.loads(FA3_FP8_FWD.read_text())
    costs = load_object_costs().measured(fa3_key(record))
    assert costs is not None and costs == release("fa3", "hopper-fp8-fwd")
    shared = sources_of_objects(FA3_NINJA, "flash-attention")
    objects = record["outputs"]["objects"]
    assert len(objects) == 10
    expected = {shared.get(o["name"], f"hopper/instantiations/{o['name'].removesuffix('.o')}.cu"): o["seconds"]
                for o in objects}
    assert costs.cpu_seconds == expected
    assert sum(o["name"] in shared for o in objects) == 6
    assert (costs.version, costs.arch, record["inputs"]["archs"]) == (record["flash_attn_3"]["version"], "90", ["90"])
    # every object ran at once on its own CPU: each time is one object's work
    assert len(objects) <= record["parallelism"]["cpus"] and max(o["start_s"] for o in objects) < 0.01
    text = load_object_costs().sources[costs.source]
    assert text.startswith("docs/results/2026-12-05-h100-round5/fa3-build-record.json")
    assert "6 objects the two profiles share" in text
    # a first build of that profile is ordered, and estimated, by them
    order = schedule_order(None, Path("no-records"), sdist_of(record), ("90",), fa3_key(record))
    assert order.kind == "knowledge" and order.source_seconds == expected


def test_costs_for_several_archs_add_up_per_arch():
    costs = release("fa2")
    source = "csrc/flash_attn/src/flash_fwd_split_hdim128_fp16_sm80.cu"
    assert costs.seconds_for(("80", "90", "100", "120"))[source] == pytest.approx(4 * 430.798)
    assert costs.seconds_for(("90",))[source] == 430.798


def test_a_first_build_orders_torchs_build_ninja_longest_first_by_the_knowledge(tmp_path):
    record = measured()
    order = schedule_order(None, tmp_path / "no-records", sdist_of(record), ("90",), fa2_key(record))
    assert order.kind == "knowledge" and order.record_fields()["from_knowledge"].startswith(
        "toolkit/knowledge/object_costs.yaml (flash-attn 2.8.3.post2 fa2")
    manifest, build_dir = torch_manifest()
    text, seeded, ordered, unknown = prepared_manifest(manifest, ManifestPlan(
        build_dir, order.object_seconds, f"{build_dir}/flash_attn-2.8.3.post2", order.source_seconds))
    assert (seeded, ordered, unknown) == (72, 73, 0)  # every object known; flash_api.cpp goes to g++
    by_time = sorted(record["outputs"]["objects"], key=lambda o: -o["seconds"])
    assert [Path(obj).name for obj, _ in EDGE.findall(text)] == [o["name"] for o in by_time]
    before = [Path(obj).name for obj, _ in EDGE.findall(manifest)]
    assert before[0] == "flash_api.o" and before != [o["name"] for o in by_time]  # torch's order is another


def test_a_first_fa3_build_of_the_commit_starts_the_backward_kernels_first(tmp_path):
    """FA3's source is an archive of the commit: whoever made it (another sha256 here), the commit and profile
    find the costs, and build.ninja (setup.py's own, rules running $nvcc_from_env) is ordered by them."""
    record = json.loads(FA3_MEASURED.read_text())
    git_archive = LockedSdist(record["sdist"]["url"], record["sdist"]["filename"], "3" * 64)
    order = schedule_order(None, tmp_path / "no-records", git_archive, ("90",), fa3_key(record))
    assert order.kind == "knowledge" and order.record_fields()["from_knowledge"] == (
        "toolkit/knowledge/object_costs.yaml (flash-attn 3.0.0 fa3 at c75d019dea9d, profile hopper-training-fp8, "
        "measured on sm_90: h200-fa3-2026-12-02)")
    manifest, build_dir = torch_manifest(FA3_NINJA, "flash-attention")
    text, seeded, ordered, unknown = prepared_manifest(manifest, ManifestPlan(
        build_dir, order.object_seconds, f"{build_dir}/flash-attention", order.source_seconds))
    assert (seeded, ordered, unknown) == (29, 30, 0)  # every object known; flash_api_stable.cpp goes to g++
    by_time = [o["name"] for o in sorted(record["outputs"]["objects"], key=lambda o: -o["seconds"])]
    started = [Path(obj).name for obj, _ in EDGE.findall(text)]
    assert started == by_time
    backward = {name for name in started if re.fullmatch(r"flash_bwd_\w+_sm90\.o", name)}
    assert len(backward) == 4 and set(started[:4]) == backward  # the four backward kernels, then the forward ones
    assert [Path(obj).name for obj, _ in EDGE.findall(manifest)][0] == "flash_api_stable.o"  # setup.py's order
    other_profile = CostKey("fa3", record["flash_attn_3"]["commit"], "hopper-training")  # its -D flags differ
    assert schedule_order(None, tmp_path / "no-records", git_archive, ("90",), other_profile).kind == "build.ninja"


def test_order_from_a_committed_fa3_record_matches_by_commit_and_profile_not_archive_bytes(tmp_path):
    """--order-from the H200's FA3 record on a machine whose archive of the same commit has another sha256 (GitHub's
    codeload vs `git archive`): the record's times order the build; a record of another profile cannot."""
    record = json.loads(FA3_MEASURED.read_text())
    other_archive = LockedSdist(record["sdist"]["url"], record["sdist"]["filename"], "4" * 64)
    named = schedule_order(FA3_MEASURED, tmp_path / "empty", other_archive, ("90",), fa3_key(record))
    assert named.kind == "record" and named.object_seconds == {o["name"]: o["seconds"]
                                                               for o in record["outputs"]["objects"]}
    other_profile = CostKey("fa3", record["flash_attn_3"]["commit"], "hopper-training")
    with pytest.raises(ToolkitError, match="records no object times of flash-attention-c75d019d"):
        schedule_order(FA3_MEASURED, tmp_path / "empty", other_archive, ("90",), other_profile)
    fa2_record = measured()  # and an FA2 record never orders an FA3 build, nor the other way round
    with pytest.raises(ToolkitError, match="records no object times"):
        schedule_order(MEASURED, tmp_path / "empty", sdist_of(fa2_record), ("90",), fa3_key(record))


def test_a_record_or_order_from_wins_over_the_knowledge(tmp_path):
    record = measured()
    line_dir = tmp_path / "wheelhouse" / "gpu-machine"
    line_dir.mkdir(parents=True)
    shutil.copy(RESULTS / "2026-11-29-h200-seeded-build" / "build-record.json", line_dir / "x.whl.build.json")
    local = schedule_order(None, line_dir, sdist_of(record), ("90",), fa2_key(record))
    assert local.kind == "record" and local.source_seconds == {}
    assert local.object_seconds["flash_api.o"] == next(
        o["seconds"] for o in json.loads((line_dir / "x.whl.build.json").read_text())["outputs"]["objects"]
        if o["name"] == "flash_api.o")
    named = schedule_order(MEASURED, tmp_path / "empty", sdist_of(record), ("90",), fa2_key(record))
    assert named.kind == "record" and named.object_seconds == {o["name"]: o["seconds"]
                                                               for o in record["outputs"]["objects"]}
    other = LockedSdist("https://example.invalid/x.tar.gz", "flash_attn-9.9.9.tar.gz", "1" * 64)
    unmeasured = schedule_order(None, line_dir, other, ("90",), CostKey("fa2", other.sha256))  # neither measured it
    assert unmeasured.kind == "build.ninja" and unmeasured.record_fields() == {
        "order": "build.ninja", "from_record": None, "from_knowledge": None}
    # the FA2 sdist's sha256 under the fa3 profile names no FA3 costs
    assert schedule_order(None, tmp_path / "empty", sdist_of(record), ("90",),
                          CostKey("fa3", record["sdist"]["sha256"])).kind == "build.ninja"


def broken(tmp_path: Path, edit) -> Path:
    """A copy of the real knowledge file with `edit` applied to its data."""
    data = yaml.safe_load((KNOWLEDGE_DIR / "object_costs.yaml").read_text())
    edit(data)
    path = tmp_path / "object_costs.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def fa3_entry(data: dict) -> dict:
    return next(entry for entry in data["releases"] if entry["profile"] == "fa3")


def first_cost(data: dict) -> tuple[dict, str]:
    costs = data["releases"][0]["cpu_seconds"]
    return costs, next(iter(costs))


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["releases"][0].update(profile="fa4"), "profile 'fa4' is none of fa2, fa3"),
    (lambda d: d["releases"][0].update(source="elsewhere"), "source 'elsewhere' is not a key of sources"),
    (lambda d: d["releases"][0].update(sdist_sha256="d0f9"), "sdist_sha256 'd0f9' is not 64 hex digits"),
    (lambda d: d["releases"][0].update(commit="c75d019dea9d910312974417bc28f190dfdda6d9"),
     "fa2 entries are keyed by sdist_sha256, not commit"),
    (lambda d: d["releases"][0].update(arch="sm90"), "arch 'sm90' is not an sm number like 90"),
    # FA3: an archive's sha256 is no key, the commit must be one flash_attn_3.yaml pins, the profile one of its own
    (lambda d: fa3_entry(d).update(sdist_sha256="2f84c5c1c407e83a1298ca3ced1bc06aaf4c3f51ced3568684c0edb4013aa547"),
     "fa3 entries are keyed by commit and fa3_profile, not sdist_sha256"),
    (lambda d: fa3_entry(d).update(commit="c75d019dea9d"), "commit 'c75d019dea9d' is not a commit (40 hex digits) that"),
    (lambda d: fa3_entry(d).update(commit="0251105a2fb19d2957484b7f023cd8c115286ced"),
     "commit '0251105a2fb19d2957484b7f023cd8c115286ced' is not a commit (40 hex digits) that flash_attn_3.yaml pins"),
    (lambda d: fa3_entry(d).update(fa3_profile="hopper-training-bf8"),
     "fa3_profile 'hopper-training-bf8' is not a profile of flash_attn_3.yaml"),
    (lambda d: fa3_entry(d).pop("fa3_profile"), "fa3_profile: missing"),
    (lambda d: d["releases"][0].pop("cpu_seconds"), "cpu_seconds: missing"),
    (lambda d: d["releases"][0].update(cpu_seconds=[1, 2]), "cpu_seconds must map source paths to seconds"),
    (lambda d: d["releases"][0]["cpu_seconds"].update({"../../etc/passwd": 1.0}), "'../../etc/passwd' is not a relative"),
    (lambda d: d["releases"][0]["cpu_seconds"].update({"/abs.cu": 1.0}), "'/abs.cu' is not a relative path"),
    (lambda d: first_cost(d)[0].update({first_cost(d)[1]: -3}), "-3 is not a positive number"),
    (lambda d: first_cost(d)[0].update({first_cost(d)[1]: float("nan")}), "nan is not a positive number"),
    (lambda d: first_cost(d)[0].update({first_cost(d)[1]: "long"}), "'long' is not a positive number"),
    (lambda d: first_cost(d)[0].update({first_cost(d)[1]: True}), "True is not a positive number"),
    (lambda d: d["releases"].append(dict(d["releases"][0])), "two releases entries for the same source"),
    (lambda d: d["releases"].append(dict(fa3_entry(d), version="3.0.0b")), "two releases entries for the same source"),
    (lambda d: d.pop("releases"), "releases: missing"),
])
def test_a_malformed_knowledge_file_is_one_line_naming_it(tmp_path, edit, message):
    path = broken(tmp_path, edit)
    with pytest.raises(ToolkitError) as err:
        load_object_costs(path)
    text = str(err.value)
    assert len(text.splitlines()) == 1 and text.startswith(f"{path}: ") and message in text
    assert "restore it from the toolkit's repository" in text


def test_a_first_build_with_a_broken_knowledge_file_stops_in_one_line(tmp_path, monkeypatch):
    knowledge = tmp_path / "knowledge"
    shutil.copytree(KNOWLEDGE_DIR, knowledge)
    (knowledge / "object_costs.yaml").write_text("releases: [\n")
    monkeypatch.setattr(knowledge_files, "KNOWLEDGE_DIR", knowledge)
    with pytest.raises(ToolkitError) as err:
        schedule_order(None, tmp_path / "no-records", sdist_of(measured()), ("90",), fa2_key(measured()))
    assert len(str(err.value).splitlines()) == 1
    assert str(err.value).startswith(f"{knowledge / 'object_costs.yaml'}:") and "not valid YAML" in str(err.value)


def bench_model():
    import importlib.util

    spec = importlib.util.spec_from_file_location("build_efficiency", ROOT / "bench" / "build_efficiency.py")
    model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model)
    return model


def test_the_model_shares_cpus_among_nvcc_threads():
    model = bench_model()
    # two 4 s objects of 2 threads each on 2 CPUs: each runs at half speed, both end at 8 s
    log = model.simulated_log(["a", "b"], [4.0, 4.0], jobs=2, cpus=2, threads=2)
    assert [(o["name"], o["start_s"], o["seconds"]) for o in log] == [("a", 0.0, 8.0), ("b", 0.0, 8.0)]
    assert model.simulated_log(["a", "b"], [4.0, 4.0], jobs=1, cpus=2, threads=2)[1]["start_s"] == 4.0


def test_first_build_model_against_the_bound_read_from_the_record():
    """bench/build_efficiency.py --first-build: its bound and ceiling from the record's own figures (json), the
    knowledge's order never behind build.ninja's or the name order."""
    model = bench_model()
    times = [o["seconds"] for o in measured()["outputs"]["objects"]]
    table = {(c["cpus"], len(c["archs"])): c for c in model.first_build_table(release("fa2"))}
    assert sorted(table) == [(16, 1), (16, 4), (32, 1), (32, 4), (64, 1), (64, 4), (128, 1), (128, 4)]
    small = table[(16, 1)]
    assert (small["jobs"], small["nvcc_threads"]) == (20, 1)  # 16 x 1.25, as toolkit build sizes it
    assert small["bound_s"] == pytest.approx(max(max(times), sum(times) / 16), abs=0.1)
    big = table[(128, 1)]  # 73 objects on 124 slots: every order ends with the longest object
    assert big["cpu_utilization_ceiling"] == pytest.approx(sum(times) / (128 * max(times)), abs=1e-3)
    assert {r["wall_s"] for r in big["orders"].values()} == {round(max(times), 1)}
    four = table[(16, 4)]
    assert (four["jobs"], four["nvcc_threads"], four["work_cpu_s"]) == (5, 4, pytest.approx(4 * sum(times), abs=0.1))
    for case in table.values():
        orders = case["orders"]
        assert orders["knowledge"]["wall_s"] <= min(orders["build.ninja"]["wall_s"], orders["name"]["wall_s"])
        assert orders["knowledge"]["wall_s"] >= case["bound_s"] - 0.1
