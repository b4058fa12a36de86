"""`toolkit recommend LINE`: which verified attention backend is fastest, per GPU and shape, from one bench grid.

Input: a `toolkit bench` bench.json and the verification reports of the packaged backends (`toolkit verify
LINE --impl NAME`, any backend knowledge/attention_backends.yaml marks `verified_by: report`), each read at
today's schema and names (`formats`). A packaged backend counts only if its report passed on the same GPU, and only
for the shapes its passed cases cover; torch's own SDPA backends and eager count as verified (torch is the
yardstick the verification criterion itself measures against). For each (dtype, head dim, causal, fwd or
fwd+bwd) the measured seqlens become bands [s_i, s_i+1), and each band names the fastest verified backend
there, with transformers' attn_implementation for it and, for verl's training shape, verl's override lines.
The JSON this writes is what the toolkit reads back (`lookup`).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import pydantic

from toolkit.attention import backends as attention_backends
from toolkit.attention import formats
from toolkit.attention.formats import (  # noqa: F401  (BenchReport, check_input: recommend's readers, as before)
    DTYPES,
    MODES,
    SCHEMA,
    Backend,
    BenchReport,
    Count,
    Day,
    Dtype,
    Flag,
    Mode,
    Name,
    Positive,
    Text,
    Tflops,
    check_input,
)
from toolkit.attention.verl import VerlLines, VerlShape, lines_for
from toolkit.base.arguments import add_line
from toolkit.base.atomic import write_atomic
from toolkit.base.entry import add_renamed_option, rename_notice
from toolkit.base.errors import ToolkitError, first_problem, shown
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.base.typed import adapter
from toolkit.base.workspace import Workspace

GROUP_KEYS = ("dtype", "head_dim", "causal", "mode")
VERL_SHAPE = (
    VerlShape()
)  # bf16 d128 causal fwd+bwd seqlen 4096, unless `--head-dim` / `--seqlen` say otherwise
# transformers' attn_implementation for a backend, and the SDPA backend inside `sdpa`
AttnImplementation = dict[Literal["name", "sdpa_backend"], Name]


@dataclass(frozen=True)
class Rule:
    __pydantic_config__ = pydantic.ConfigDict(
        extra="forbid"
    )  # every field strict: a typed copy of the file's

    dtype: Dtype
    head_dim: Positive
    causal: Flag
    mode: Mode
    seqlen_min: Count
    seqlen_max: Count | None  # None: and above
    backend: Backend
    attn_implementation: AttnImplementation
    tflops: Tflops
    best_tflops: Tflops  # the fastest of ALL measured backends at seqlen_min (verified or not)
    best_backend: Backend

    @property
    def ratio(self) -> float:
        return self.tflops / self.best_tflops if self.best_tflops else 0.0


@dataclass(frozen=True)
class Verified:
    """Why a backend may be recommended, and for which (dtype, head dim, causal) it was proven."""

    why: str
    shapes: frozenset[tuple[str, int, bool]] | None = (
        None  # None: every shape (torch's own kernels)
    )

    def covers(self, row: dict) -> bool:
        return self.shapes is None or (row["dtype"], row["head_dim"], row["causal"]) in self.shapes

    def to_json(self) -> dict:
        return {
            "why": self.why,
            "shapes": None if self.shapes is None else [list(s) for s in sorted(self.shapes)],
        }


def _shape(case: dict) -> tuple[str, int, bool]:
    params = case["params"]
    return str(params["dtype"]), int(params["head_dim"]), bool(params["causal"])


def verified_backends(reports: dict[str, dict], gpu: str | None) -> dict[str, Verified]:
    """backend -> where it counts as verified. A packaged backend counts, on this GPU only, for each
    (dtype, head dim, causal) that its report's cases passed with no case of that shape failing or erroring:
    a backend whose backward is wrong at head dim 80 is not recommended at head dim 80, nor anywhere a
    report with a setup error or from another GPU would be the only evidence."""
    verified = {
        name: Verified("torch's own kernel (the verification yardstick)")
        for name in attention_backends.torch_backends()
    }
    for backend, report in reports.items():
        summary = report.get("summary", {})
        if summary.get("setup_error") or report.get("gpu") != gpu:
            continue
        cases = report.get("cases") or []
        passed = {_shape(c) for c in cases if c.get("status") == "passed"}
        broken = {_shape(c) for c in cases if c.get("status") in ("failed", "error")}
        if passed - broken:
            verified[backend] = Verified(
                f"{report.get('level')} verification on {gpu}, {report.get('date')}: {summary.get('passed')} passed, "
                f"{summary.get('failed')} failed, {summary.get('unsupported', 0)} unsupported; recommended only "
                f"for the (dtype, head dim, causal) its passed cases cover and no failed case touches",
                frozenset(passed - broken),
            )
    return verified


def recommend(bench: dict, verified: dict[str, Verified]) -> list[Rule]:
    """One rule per band: the fastest verified backend; adjacent bands with the same backend merge."""
    groups: dict[tuple, dict[int, list[dict]]] = {}
    for row in bench["measurements"]:
        if _recommendable(row):
            key = tuple(row[k] for k in GROUP_KEYS)
            groups.setdefault(key, {}).setdefault(row["seqlen"], []).append(row)
    rules: list[Rule] = []
    for key, by_seqlen in sorted(groups.items(), key=lambda item: str(item[0])):
        seqlens = sorted(by_seqlen)
        for index, seqlen in enumerate(seqlens):
            rows = by_seqlen[seqlen]
            best = max(rows, key=lambda r: r["tflops"])
            candidates = [
                r
                for r in rows
                if r["implementation"] in verified and verified[r["implementation"]].covers(r)
            ]
            if not candidates:
                continue
            pick = max(candidates, key=lambda r: r["tflops"])
            upper = seqlens[index + 1] - 1 if index + 1 < len(seqlens) else None
            dtype, head_dim, causal, mode = key
            rule = Rule(
                dtype,
                head_dim,
                causal,
                mode,
                0 if index == 0 else seqlen,
                upper,
                pick["implementation"],
                attention_backends.backends()[pick["implementation"]].to_json(),
                pick["tflops"],
                best["tflops"],
                best["implementation"],
            )
            previous = rules[-1] if rules else None
            if (
                previous
                and (
                    previous.dtype,
                    previous.head_dim,
                    previous.causal,
                    previous.mode,
                    previous.backend,
                )
                == (*key, rule.backend)
                and previous.seqlen_max == rule.seqlen_min - 1
            ):
                rules[-1] = replace(
                    previous, seqlen_max=upper
                )  # TFLOP/s stay those of the band's first seqlen
                continue
            rules.append(rule)
    return rules


def shape_ratios(bench: dict, rules: list[Rule]) -> list[dict]:
    """For every measured shape: the recommended backend's TFLOP/s over the best measured one."""
    out = []
    for row_key, rows in _by_shape(bench).items():
        dtype, head_dim, causal, mode, seqlen = row_key
        rule = lookup_rules(rules, dtype, head_dim, causal, mode, seqlen)
        best = max(rows.values())
        chosen = rows.get(rule.backend) if rule else None
        out.append(
            {
                "dtype": dtype,
                "head_dim": head_dim,
                "causal": causal,
                "mode": mode,
                "seqlen": seqlen,
                "recommended": rule.backend if rule else None,
                "ratio": (chosen or 0.0) / best if best else None,
            }
        )
    return out


def shortfalls(
    bench: dict, ratios: list[dict], reports: dict[str, dict], minimum: float
) -> list[dict]:
    """Each shape whose ratio is below `minimum`, with the backend measured fastest there and why it was not
    recommended: almost always that its verification did not cover the shape (a smoke level proves a few
    shapes), which a number alone ("worst shape 0.801") does not say."""
    shapes = _by_shape(bench)
    out = []
    for r in ratios:
        if r["ratio"] is None or r["ratio"] >= minimum:
            continue
        key = (r["dtype"], r["head_dim"], r["causal"], r["mode"], r["seqlen"])
        fastest = max(shapes[key], key=lambda name: shapes[key][name])
        out.append(
            {
                **r,
                "fastest": fastest,
                "why": _not_verified_why(fastest, key[:3], reports.get(fastest), bench.get("gpu")),
            }
        )
    return out


def _not_verified_why(backend: str, shape: tuple, report: dict | None, gpu: str | None) -> str:
    if report is None:
        return f"no verification report of {backend} was given (pass one with --verified {backend}=VERIFY_JSON)"
    if report.get("summary", {}).get("setup_error") or report.get("gpu") != gpu:
        return f"its verification report is from another GPU or had a setup error (verify {backend} on {gpu} again)"
    cases = report.get("cases") or []
    if any(_shape(c) == shape and c.get("status") in ("failed", "error") for c in cases):
        return "its verification failed on these shapes (it is not recommended there)"
    return (
        f"its verification ({report.get('level')}) did not cover these shapes (verify {backend} with "
        f"`--level full` and pass that report with --verified {backend}=VERIFY_JSON)"
    )


def _by_shape(bench: dict) -> dict[tuple, dict[str, float]]:
    shapes: dict[tuple, dict[str, float]] = {}
    for row in bench["measurements"]:
        if _recommendable(row):
            key = (row["dtype"], row["head_dim"], row["causal"], row["mode"], row["seqlen"])
            shapes.setdefault(key, {})[row["implementation"]] = row["tflops"]
    return shapes


def _recommendable(row: dict) -> bool:
    """A measured row in a precision a recommendation covers (not FA3's FP8 forward: see BenchDtype)."""
    return row["status"] == "ok" and bool(row["tflops"]) and row["dtype"] in DTYPES


def lookup_rules(
    rules: list[Rule], dtype: str, head_dim: int, causal: bool, mode: str, seqlen: int
) -> Rule | None:
    return next(
        (
            r
            for r in rules
            if (r.dtype, r.head_dim, r.causal, r.mode) == (dtype, head_dim, causal, mode)
            and r.seqlen_min <= seqlen
            and (r.seqlen_max is None or seqlen <= r.seqlen_max)
        ),
        None,
    )


def lookup(
    path: Path, gpu: str, dtype: str, head_dim: int, causal: bool, mode: str, seqlen: int
) -> Rule | None:
    """What the toolkit reads back: the rule for a shape on a GPU from a (checked) recommendation file."""
    rec = read_recommendation(path)
    return (
        lookup_rules(list(rec.rules), dtype, head_dim, causal, mode, seqlen)
        if rec.gpu == gpu
        else None
    )


@dataclass(frozen=True)
class VerifiedEntry:
    why: Text
    shapes: list[tuple[Text, Positive, Flag]] | None = None


@dataclass(frozen=True)
class Recommendation:
    """A recommendation file as doctor and the modulefile help read it back: every value checked, so what
    they print is the GPU's name, a date, rules over known backends and which backends were verified, never
    text from the file as is. The file's other entries (shape_ratios, below_min_ratio, targets, verl) are for
    people and are not read back."""

    path: Path
    gpu: Name
    rules: tuple[Rule, ...]
    schema: Literal[2] = SCHEMA
    date: Day = None
    verified: dict[Backend, VerifiedEntry] = field(default_factory=dict)


NOT_WRITTEN, RERUN = (
    "not a recommendation `toolkit recommend` writes",
    "run toolkit recommend again",
)


def check_recommendation(data: object, path: Path) -> Recommendation:
    """Parsed JSON as a Recommendation, or the first bad field as one ToolkitError line."""
    backends = attention_backends.names()
    if not isinstance(data, dict):
        raise ToolkitError(
            f"{path}: {NOT_WRITTEN}: a JSON {type(data).__name__}, not an object ({RERUN})"
        )
    try:
        current = formats.current(data, Path(path), formats.RECOMMENDATION)
        assert isinstance(current, dict)  # an object stays one
        return adapter(Recommendation).validate_python(
            {**current, "path": Path(path)}, context={"backends": backends}
        )
    except pydantic.ValidationError as exc:
        raise ToolkitError(f"{path}: {NOT_WRITTEN}: {first_problem(exc)} ({RERUN})") from None


def read_if_any(path: Path) -> Recommendation | None:
    """The line's recommendation, None where `toolkit recommend LINE` never wrote one."""
    return read_recommendation(path) if Path(path).is_file() else None


def read_recommendation(path: Path) -> Recommendation:
    """`toolkit recommend`'s file, checked field by field (backends are knowledge/attention_backends.yaml's);
    every problem, unreadable file included, is one ToolkitError, which is all doctor, modules and
    the parity report catch."""
    return check_recommendation(read_json(Path(path), "recommendation", RERUN), Path(path))


def how_to_ask(rule: Rule) -> str:
    """What a user writes to get the backend: transformers' attn_implementation (+ the SDPA backend)."""
    impl = rule.attn_implementation
    sdpa = f" + sdpa_kernel(SDPBackend.{impl['sdpa_backend']})" if impl.get("sdpa_backend") else ""
    return f"attn_implementation={impl.get('name', rule.backend)}{sdpa}"


def summary(
    rec: Recommendation, dtype: str = "bfloat16", head_dim: int = 128, causal: bool = False
) -> list[str]:
    """One line per mode: the recommended backend in each seqlen band of one shape family."""
    lines = []
    for mode in MODES:
        bands = sorted(
            (
                r
                for r in rec.rules
                if (r.dtype, r.head_dim, r.causal, r.mode) == (dtype, head_dim, causal, mode)
            ),
            key=lambda r: r.seqlen_min,
        )
        if bands:
            parts = [
                f"seqlen {r.seqlen_min}{'+' if r.seqlen_max is None else f'-{r.seqlen_max}'}: {r.backend} "
                f"({how_to_ask(r)})"
                for r in bands
            ]
            lines.append(
                f"{dtype} d{head_dim}{' causal' if causal else ''} {mode}: {'; '.join(parts)}"
            )
    return lines


def for_parity(path: Path, head_dim: int, seqlen: int, causal: bool = True) -> dict | None:
    """What the line's recommendation names for transformers' parity model (bf16, forward), so the parity
    report says which attn_implementation the toolkit recommends beside the ones it checked. None without
    a recommendation file; its problem as `error` when the file is not one recommend wrote."""
    try:
        rec = read_if_any(path)
    except ToolkitError as exc:
        return {"error": str(exc)}
    if rec is None:
        return None
    rule = lookup_rules(list(rec.rules), "bfloat16", head_dim, causal, "fwd", seqlen)
    shape = f"bfloat16 d{head_dim}{' causal' if causal else ''} fwd seqlen {seqlen}"
    return {
        "from": str(path),
        "gpu": rec.gpu,
        "date": rec.date,
        "shape": shape,
        "backend": rule.backend if rule else None,
        "attn_implementation": rule.attn_implementation if rule else None,
        "how": how_to_ask(rule) if rule else "no measured band covers this shape",
    }


def check_targets(bench: dict, targets: list[dict]) -> list[dict]:
    """The knowledge's ratio targets: FA4 over each named backend on one shape (FA2's committed number
    where this run has no flash-attn-2 row, said so in `versus_source`). FA4's own hook: its targets are
    ratios (knowledge/flash_attn_4.yaml), the other implementations' are floors (gpus.yaml, the bench)."""
    shapes = _by_shape(bench)
    results = []
    for target in targets:
        if not bench.get("gpu") or target["gpu"] not in bench["gpu"]:
            continue
        rows = shapes.get(
            (
                target["dtype"],
                target["head_dim"],
                target["causal"],
                target["mode"],
                target["seqlen"],
            ),
            {},
        )
        fa4 = rows.get("flash-attn-4")
        for other, minimum in target["min_vs"].items():
            base, source = rows.get(other), "this run"
            if base is None and other == "flash-attn-2" and target.get("fa2_tflops"):
                base, source = (
                    float(target["fa2_tflops"]),
                    "committed FA2 measurement (not this run)",
                )
            ratio = fa4 / base if fa4 and base else None
            results.append(
                {
                    **{k: target[k] for k in ("mode", "dtype", "head_dim", "seqlen", "causal")},
                    "versus": other,
                    "flash_attn_4_tflops": fa4,
                    "versus_tflops": base,
                    "versus_source": source,
                    "ratio": ratio,
                    "min_ratio": minimum,
                    "met": ratio is not None and ratio >= minimum,
                }
            )
    return results


def build(
    bench: dict, reports: dict[str, dict], knowledge: dict, shape: VerlShape = VERL_SHAPE
) -> dict:
    """The recommendation file's content; `knowledge`: FA4's (its speed targets and the minimum ratio)."""
    verified = verified_backends(reports, bench.get("gpu"))
    rules = recommend(bench, verified)
    ratios = shape_ratios(bench, rules)
    minimum = knowledge.get("recommended_min_ratio", 0.98)
    worst = min((r["ratio"] for r in ratios if r["ratio"] is not None), default=None)
    return {
        "kind": "attention-recommendation",
        "schema": SCHEMA,
        "gpu": bench.get("gpu"),
        "gpu_capability": bench.get("gpu_capability"),
        "date": bench.get("date"),
        "bench_command": bench.get("command"),
        "torch": bench.get("torch"),
        "versions": _versions(bench),
        "verified": {name: v.to_json() for name, v in verified.items()},
        "rules": [asdict(r) for r in rules],
        "shape_ratios": ratios,
        "worst_ratio": worst,
        "recommended_min_ratio": minimum,
        "below_min_ratio": shortfalls(bench, ratios, reports, minimum),
        "targets": check_targets(bench, knowledge.get("targets", [])),
        "verl": verl_lines(bench, rules, verified, shape).to_json(),
    }


def _versions(bench: dict) -> dict[str, str | None]:
    """Each packaged backend's version as the bench recorded it (text only: the file is for people)."""
    out = {}
    for backend in attention_backends.backends().values():
        if backend.distribution and backend.bench_field:
            entry = bench.get(backend.bench_field)
            version = entry.get("version") if isinstance(entry, dict) else None
            out[backend.distribution] = version if isinstance(version, str) else None
    return out


def verl_lines(
    bench: dict, rules: list[Rule], verified: dict[str, Verified], shape: VerlShape
) -> VerlLines:
    """verl's override lines for the backend recommended at verl's training shape."""
    rule = lookup_rules(rules, shape.dtype, shape.head_dim, shape.causal, shape.mode, shape.seqlen)
    measured = _by_shape(bench).get(
        (shape.dtype, shape.head_dim, shape.causal, shape.mode, shape.seqlen), {}
    )
    row = {"dtype": shape.dtype, "head_dim": shape.head_dim, "causal": shape.causal}
    return lines_for(
        shape,
        rule.backend if rule else None,
        measured,
        [n for n, v in verified.items() if v.covers(row)],
    )


def register(verbs: argparse._SubParsersAction) -> None:
    parser = verbs.add_parser(
        "recommend",
        description="Read one `toolkit bench` grid and the verification reports of the packaged backends, and write, "
        "per GPU, dtype, head dim, mask and sequence length, the fastest backend whose verification "
        "covers that shape, its `attn_implementation` and verl's override lines for verl's training "
        "shape (--head-dim, --seqlen). Doctor and the modulefile help read the file back.",
    )
    add_line(parser, "the line the bench ran for (its reports folder gets the file)", optional=True)
    parser.add_argument(
        "--bench",
        type=Path,
        metavar="BENCH_JSON",
        help="bench.json of `toolkit bench` (default with LINE: reports/LINE/bench.json)",
    )
    packaged = ", ".join(f"{name}=..." for name in attention_backends.packaged())
    parser.add_argument(
        "--verified",
        action="append",
        default=[],
        metavar="BACKEND=VERIFY_JSON",
        help=f"a packaged backend's verification report ({packaged}; default with LINE: each "
        f"verify.json under reports/LINE/ where `toolkit verify` writes it: flash-attn-2's in "
        f"the folder, another backend's in a folder of its name)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        metavar="FILE",
        help="recommendation JSON to write (default with LINE: "
        "reports/LINE/recommendation.json, where doctor and modules read it)",
    )
    parser.add_argument(
        "--head-dim",
        type=int,
        default=VerlShape.head_dim,
        metavar="N",
        help=f"verl's training shape: head dim (default {VerlShape.head_dim})",
    )
    parser.add_argument(
        "--seqlen",
        type=int,
        default=VerlShape.seqlen,
        metavar="N",
        help=f"verl's training shape: sequence length (default {VerlShape.seqlen}; bf16, causal, "
        f"forward+backward)",
    )
    add_renamed_option(parser, "--line", "`toolkit recommend LINE`")
    add_renamed_option(
        parser, "--verify", "--verified BACKEND=VERIFY_JSON (--verify is matrix run's mode)"
    )
    parser.set_defaults(func=recommend_command)


def _verified_backend(name: str) -> str:
    """--verified's BACKEND, an earlier name (`fa4`, `flash-attn`) answered with today's in one notice line."""
    now = attention_backends.current(name)
    if now != name:
        rename_notice("toolkit recommend", f"--verified {name}=", f"--verified {now}=")
    return now


def _read_reports(args: argparse.Namespace) -> tuple[dict, dict[str, dict]]:
    """The bench report and the --verified reports, each read at today's schema and checked (`formats`)
    before anything is built."""
    packaged = attention_backends.packaged()
    reports = {}
    for item in args.verified:
        given, sep, path = item.partition("=")
        if not sep:
            raise ToolkitError(
                f"--verified {item!r}: expected BACKEND=PATH, e.g. "
                f"flash-attn-4=reports/flash-attn-4/verify.json"
            )
        backend = _verified_backend(given)
        if backend not in packaged:
            raise ToolkitError(
                f"--verified {shown(backend)}=PATH: not a packaged backend "
                f"(name one of: {', '.join(packaged)})"
            )
        reports[backend] = formats.read_verify(Path(path))
    return formats.read_bench(args.bench), reports


def _summary_lines(data: dict, out: Path) -> list[str]:
    """What the verb prints: one line per rule, one per target, the worst shape's ratio and verl's lines."""
    lines = []
    for rule in data["rules"]:
        upper = "" if rule["seqlen_max"] is None else rule["seqlen_max"]
        causal = "causal" if rule["causal"] else ""
        lines.append(
            f"{rule['dtype']:9s} d{rule['head_dim']:<4d} {rule['mode']:8s} {causal:6s} "
            f"seqlen {rule['seqlen_min']}-{upper}: {rule['backend']} ({rule['tflops']:.0f} TFLOP/s)"
        )
    for target in data["targets"]:
        ratio = "-" if target["ratio"] is None else f"{target['ratio']:.2f}"
        lines.append(
            f"target {'met' if target['met'] else 'MISSED'}: flash-attn-4 / {target['versus']} {target['mode']} "
            f"{target['dtype']} d{target['head_dim']} seqlen {target['seqlen']}: {ratio} (needs >= "
            f"{target['min_ratio']}; {target['versus_source']})"
        )
    worst = data["worst_ratio"]
    lines.append(
        f"recommended vs best measured, worst shape: {'-' if worst is None else f'{worst:.3f}'} "
        f"(needs >= {data['recommended_min_ratio']}); {out}"
    )
    groups: dict[tuple[str, str], list[str]] = {}
    for r in data["below_min_ratio"]:
        shape = f"{r['dtype']} d{r['head_dim']}{' causal' if r['causal'] else ''} {r['mode']} seqlen {r['seqlen']}"
        groups.setdefault((r["fastest"], r["why"]), []).append(f"{shape} ({r['ratio']:.3f})")
    for (fastest, why), shapes in groups.items():
        lines.append(
            f"below {data['recommended_min_ratio']}: {', '.join(shapes)}: {fastest} measured fastest, "
            f"but {why}"
        )
    return lines + _verl_summary(data["verl"])


def _verl_summary(verl: dict) -> list[str]:
    """verl's lines for its training shape: the overrides, the YAML fragment, the notes."""
    if verl["backend"] is None:
        return [f"verl ({verl['shape']}): {note}" for note in verl["notes"]]
    return [
        f"verl {verl['verl']} ({verl['shape']}): {verl['backend']}, as command-line overrides:",
        *(f"  {line}" for line in verl["overrides"]),
        "or in the trainer's YAML:",
        *(f"  {line}" for line in verl["yaml"].splitlines()),
        *(f"note: {note}" for note in verl["notes"]),
    ]


def default_reports(args: argparse.Namespace, workspace: Workspace) -> None:
    """`toolkit recommend LINE` reads what `toolkit bench LINE` and `toolkit verify LINE` wrote: --bench, where not
    given, is reports/LINE/bench.json, and each packaged backend not given with --verified whose report is in its
    default folder is added."""
    if args.bench is None:
        args.bench = workspace.report_dir(args.line) / "bench.json"
        if not args.bench.is_file():
            raise ToolkitError(
                f"{display_path(args.bench)}: no bench report for {args.line} (run `toolkit bench "
                f"{args.line}` first, or pass --bench FILE)"
            )
    given = {attention_backends.current(item.partition("=")[0]) for item in args.verified}
    for name, backend in attention_backends.backends().items():
        folders = [
            workspace.backend_report_dir(args.line, name)
        ]  # and where a report of schema 1 went
        folders += [workspace.report_dir(args.line) / old for old in backend.formerly]
        report = next((f / "verify.json" for f in folders if (f / "verify.json").is_file()), None)
        if backend.verified_by == "report" and name not in given and report is not None:
            args.verified.append(f"{name}={report}")


def recommend_command(args: argparse.Namespace) -> int:
    from toolkit.knowledge.fa4_pins import knowledge

    if args.line is None and (args.out is None or args.bench is None):
        raise ToolkitError(
            "recommend: give LINE (reads reports/LINE/, writes reports/LINE/recommendation.json), "
            "or --bench FILE and --out FILE"
        )
    if args.line is not None:
        default_reports(args, Workspace())
    args.out = args.out or Workspace().recommendation_file(args.line)
    if (
        args.out.is_dir()
    ):  # before reading anything: the write's rename would fail on it with a traceback
        raise ToolkitError(
            f"{args.out}: a folder, where the recommendation JSON file goes (name a file with "
            f"--out, e.g. {args.out / 'recommendation.json'}, or move the folder away)"
        )
    bench, reports = _read_reports(args)
    data = build(bench, reports, knowledge(), VerlShape(head_dim=args.head_dim, seqlen=args.seqlen))
    check_recommendation(data, args.out)  # never write what doctor and modules would refuse
    lines = _summary_lines(data, args.out)
    try:
        text = json.dumps(data, indent=2, allow_nan=False) + "\n"
    except ValueError:  # a ratio of two finite TFLOP/s can still overflow (1e308 / 1e-300)
        raise ToolkitError(
            f"{args.bench}: a ratio of its TFLOP/s is not finite (run toolkit bench again)"
        ) from None
    write_atomic(args.out, text)
    print("\n".join(lines))
    return 0
