"""The files the attention choice reads, typed and versioned: `toolkit verify`'s verify.json, `toolkit bench`'s
bench.json and `toolkit recommend`'s recommendation.json (its model, `Recommendation`, is recommend's).

Each file says its `schema`. Schema 2 names the implementations as issue 31 does (`flash-attn-2`,
`flash-attn-4`, bench.json's `flash_attn_2`); a file of schema 1 (or of none: every file written before, the
committed results under docs/results/ included) is read by mapping its old names (`flash-attn`, `fa4`, from
knowledge/attention_backends.yaml's `formerly`) to the new, in memory: a committed file is never rewritten. A
schema this toolkit does not know is refused in one line naming the command that writes the file again.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Final, Literal, get_args

import pydantic

from toolkit.attention import backends as attention_backends
from toolkit.base.errors import ToolkitError, first_problem, shown
from toolkit.base.jsonfile import read_json
from toolkit.base.typed import adapter

SCHEMA: Final = 2  # the schema every report the toolkit writes now says
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9 ._()+-]{0,80}")  # a GPU's or an SDPA backend's name
Dtype = Literal[
    "bfloat16", "float16"
]  # what a recommendation covers: transformers' attn_implementation runs these
# `toolkit bench` also measures FlashAttention-3's FP8 forward; no attn_implementation asks for FP8, so those rows are
# read (checked) but never become a rule or a ratio
BenchDtype = Literal["bfloat16", "float16", "float8_e4m3fn"]
Mode = Literal["fwd", "fwd+bwd"]
DTYPES, MODES = get_args(Dtype), get_args(Mode)


def _plain_name(value: str) -> str:
    """Names reach doctor's rows and the modulefile help: letters, digits and a few signs, nothing a Lua or
    Tcl string or a shell line could take as syntax."""
    if not NAME.fullmatch(value):
        raise ValueError(f"{shown(value)} is not a name")
    return value


def _known_backend(value: str, info: pydantic.ValidationInfo) -> str:
    """A backend the knowledge's attn_implementation table names (the table comes in the context)."""
    known = (info.context or {}).get("backends", ())
    if value not in known:
        raise ValueError(f"{shown(value)} is not a backend (known backends: {', '.join(known)})")
    return value


def _day(value: str | None) -> str:
    """A date as doctor shows it: the day of an ISO timestamp, or nothing."""
    day = (value or "")[:10]
    if not re.fullmatch(r"(\d{4}-\d\d-\d\d)?", day):
        raise ValueError(f"{shown(value)} is not an ISO date")
    return day


def _stamp(value: str | None) -> str | None:
    """A bench's ISO timestamp, kept whole: the recommendation copies it, and its reader takes the day."""
    _day(value)
    return value


Name = Annotated[str, pydantic.Strict(), pydantic.AfterValidator(_plain_name)]
Backend = Annotated[str, pydantic.Strict(), pydantic.AfterValidator(_known_backend)]
Count = Annotated[int, pydantic.Strict(), pydantic.Field(ge=0)]
Positive = Annotated[int, pydantic.Strict(), pydantic.Field(gt=0)]
Tflops = Annotated[
    float, pydantic.Strict(), pydantic.Field(ge=0, allow_inf_nan=False)
]  # strict: an int, no str
Flag = Annotated[bool, pydantic.Strict()]
Day = Annotated[str | None, pydantic.Strict(), pydantic.AfterValidator(_day)]
Stamp = Annotated[str | None, pydantic.Strict(), pydantic.AfterValidator(_stamp)]
Text = Annotated[str, pydantic.Strict()]


Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Format:
    """One kind of file: what it is called in a refusal, the command that writes it again, and how a schema-1
    file's implementation names become today's (`rename`: the schema-1 data and the name mapping, a new dict)."""

    what: str
    regenerate: str
    rename: Callable[[dict[str, Any], Callable[[object], object]], dict[str, Any]]


def _renamed_rows(rows: object, key: str, name: Callable[[object], object]) -> object:
    """`rows` with each row's `key` renamed (rows of another shape are left for the model to refuse)."""
    if not isinstance(rows, list):
        return rows
    return [
        {**row, key: name(row[key])} if isinstance(row, dict) and key in row else row
        for row in rows
    ]


def _bench_1(data: dict[str, Any], name: Callable[[object], object]) -> dict[str, Any]:
    """bench.json 1 -> 2: each row's and target's implementation; FA2's version entry `flash_attn` -> `flash_attn_2`."""
    out = {key: value for key, value in data.items() if key != "flash_attn"}
    if "flash_attn" in data:
        out["flash_attn_2"] = data["flash_attn"]
    return {
        **out,
        "measurements": _renamed_rows(data.get("measurements"), "implementation", name),
        **(
            {"targets": _renamed_rows(data["targets"], "implementation", name)}
            if "targets" in data
            else {}
        ),
    }


def _verify_1(data: dict[str, Any], name: Callable[[object], object]) -> dict[str, Any]:
    """verify.json 1 -> 2: the parity report's recommended backend."""
    rec = data.get("recommended")
    return (
        {**data, "recommended": {**rec, "backend": name(rec.get("backend"))}}
        if isinstance(rec, dict)
        else data
    )


def _recommendation_1(data: dict[str, Any], name: Callable[[object], object]) -> dict[str, Any]:
    """recommendation.json 1 -> 2: every place a backend is named (rules, verified, ratios, targets, verl)."""
    out = dict(data)
    for key, row_keys in (
        ("rules", ("backend", "best_backend")),
        ("shape_ratios", ("recommended",)),
        ("below_min_ratio", ("fastest",)),
        ("targets", ("versus",)),
    ):
        for row_key in row_keys if key in data else ():
            out[key] = _renamed_rows(out[key], row_key, name)
    if isinstance(data.get("verified"), dict):  # the first files said why alone, for every shape
        out["verified"] = {
            name(key): {"why": value} if isinstance(value, str) else value
            for key, value in data["verified"].items()
        }
    if isinstance(data.get("verl"), dict):
        out["verl"] = {**data["verl"], "backend": name(data["verl"].get("backend"))}
    return out


BENCH = Format("`toolkit bench` report", "run toolkit bench again", _bench_1)
VERIFY = Format("verify report", "run the verification again", _verify_1)
RECOMMENDATION = Format(
    "recommendation `toolkit recommend` writes", "run toolkit recommend again", _recommendation_1
)


def _current_name(value: object) -> object:
    return attention_backends.current(value) if isinstance(value, str) else value


def current(data: object, path: Path, fmt: Format) -> object:
    """`data` at schema SCHEMA: as it is when it says so, its old names mapped when it says 1 or nothing; any
    other schema is one ToolkitError line. Data of another shape is returned for the model to refuse."""
    if not isinstance(data, dict):
        return data
    schema = data.get("schema", 1)
    if schema == SCHEMA and type(schema) is int:
        return data
    if schema != 1 or type(schema) is not int:
        raise ToolkitError(
            f"{path}: a {fmt.what} of schema {shown(schema)}, which this toolkit does not read (it "
            f"reads schemas 1 and {SCHEMA}; {fmt.regenerate})"
        )
    return {**fmt.rename(data, _current_name), "schema": SCHEMA}


@dataclass(frozen=True)
class BenchRow:
    """A `toolkit bench` row as recommend reads it (bench.Measurement; its other fields are not read here)."""

    implementation: Backend
    mode: Mode
    causal: Flag
    dtype: BenchDtype
    head_dim: Positive
    seqlen: Positive
    status: Literal["ok", "skipped", "error"]
    tflops: Tflops | None = None


@dataclass(frozen=True)
class Versions:
    version: Text | None = None


@dataclass(frozen=True)
class BenchReport:
    """The bench.json entries that reach the recommendation: a GPU name and a date its reader takes, versions
    as text, finite TFLOP/s, and only backends the knowledge names (so nothing written is NaN or refused)."""

    gpu: Name
    measurements: list[BenchRow]
    schema: Literal[2] = SCHEMA
    kind: Literal["bench"] = "bench"
    line: Text | None = None
    date: Stamp = None
    gpu_capability: Text | None = None
    command: Text | None = None
    torch: Text | None = None
    flash_attn_2: Versions = field(default_factory=Versions)
    flash_attn_3: Versions = field(default_factory=Versions)
    flash_attn_4: Versions = field(default_factory=Versions)


@dataclass(frozen=True)
class CaseShape:
    """The part of a verify case's params that says which shape it proved (verify.cases.Case)."""

    dtype: Text
    head_dim: Positive
    causal: Flag


@dataclass(frozen=True)
class VerifyCase:
    status: Text
    params: CaseShape


@dataclass(frozen=True)
class VerifyReport:
    """A `toolkit verify` report as the toolkit reads it back (`verified_backends`, `toolkit verify`'s tables):
    its cases' outcomes and shapes, the summary, the GPU; the rest is for people and the JUnit file."""

    schema: Literal[2] = SCHEMA
    kind: Literal["verify"] = "verify"
    line: Text | None = None
    level: Text | None = None
    summary: dict[str, Any] = field(default_factory=dict)
    cases: list[VerifyCase] | None = None
    gpu: Text | None = None


def check_input(
    model: type, data: object, path: Path, what: str, fix: str, backends: tuple[str, ...]
) -> dict[str, Any]:
    """`data` unchanged once it has `model`'s shape; else its first bad field, as one ToolkitError line."""
    try:
        adapter(model).validate_python(data, context={"backends": backends})
    except pydantic.ValidationError as exc:
        raise ToolkitError(f"{path}: not a {what}: {first_problem(exc)} ({fix})") from None
    return data  # type: ignore[return-value]  # validated: a dict of that shape


def checked(data: object, path: Path, fmt: Format, model: type) -> dict[str, Any]:
    """`data` (a parsed file) at today's schema and names, checked against `model`; else one ToolkitError line."""
    return check_input(
        model, current(data, path, fmt), path, fmt.what, fmt.regenerate, attention_backends.names()
    )


def read_report(path: Path, fmt: Format, model: type) -> dict[str, Any]:
    """A bench or verify report a toolkit run wrote, read and `checked`."""
    data = read_json(
        Path(path), "JSON report", "pass the bench.json or verify.json a toolkit run wrote"
    )
    return checked(data, Path(path), fmt, model)


def read_bench(path: Path) -> dict[str, Any]:
    return read_report(path, BENCH, BenchReport)


def read_verify(path: Path) -> dict[str, Any]:
    return read_report(path, VERIFY, VerifyReport)
