"""`toolkit bench LINE`: flash-attn's TFLOP/s against torch SDPA's backends and eager attention.

Grid: forward and forward+backward, causal and not, seqlen 512..16k at a fixed number of tokens per
batch (batch = tokens / seqlen) and a fixed model width (heads = 2048 / head_dim), head dims
64/128/256, bf16 and fp16, as upstream's benchmarks/benchmark_flash_attention.py does; where
FlashAttention-3's build has FP8, its FP8 (e4m3) forward on the same shapes, counted the same way, in each of
FP8_VARIANTS (descale factors of 1, upstream's random ones, V column-major where the build compiles it), and its
ratio to the best bf16 backend of the shape judged by gpus.yaml's fp8_gates (the FA3 paper's). FLOPs count
the two matmuls of the forward, 4 * batch * heads * seqlen^2 * head_dim (halved when causal), and
3.5x that for forward+backward (the backward is 2.5x the forward).

Two steps, so that the measuring half runs in the line's python with nothing but torch and
flash-attn: `measure` times everything and writes the raw bench.json; `finish` (the toolkit's own
python) adds the card's peak from toolkit/knowledge/gpus.yaml, checks the throughput targets (one on an
implementation the line does not build, e.g. flash-attn 2.x where it builds FA3 instead, does not apply), plots
bench.png and prints the table. Eager and SDPA-math materialise the seqlen x seqlen matrix and are
skipped above QUADRATIC_MAX_SEQLEN, recorded with the reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from toolkit.attention import formats
from toolkit.base.atomic import write_atomic
from toolkit.base.entry import program
from toolkit.base.errors import ToolkitError
from toolkit.base.jsonfile import read_json
from toolkit.knowledge import files as knowledge_files
from toolkit.verify import machine

if (
    TYPE_CHECKING
):  # torch and rich are imported where used, so that the module imports without torch
    import torch
    from rich.console import Console

    from toolkit.spec.envspec import EnvSpec

SDPA_BACKENDS = {
    "sdpa-flash": "FLASH_ATTENTION",
    "sdpa-cudnn": "CUDNN_ATTENTION",
    "sdpa-efficient": "EFFICIENT_ATTENTION",
    "sdpa-math": "MATH",
}
FP8 = "float8_e4m3fn"  # FP8 (e4m3) forward: rows only for a packaged column that takes it, where its build has it
# torch's words when the requested SDPA backend cannot take the inputs (CUDA, CPU)
NO_KERNEL_MARKERS = ("No available kernel", "No viable backend")
QUADRATIC = ("sdpa-math", "eager")
QUADRATIC_MAX_SEQLEN = 8192
SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128, 256)
DTYPES = ("bfloat16", "float16")
MODES = ("fwd", "fwd+bwd")
MODE_FLOPS = {"fwd": 1.0, "fwd+bwd": 3.5}
TOKENS = 16384
PARTIAL_EVERY = 32  # rows between rewrites of bench.json while the grid runs
MODEL_WIDTH = 2048
VCOLMAJOR_FLAG = (
    "FLASHATTENTION_ENABLE_VCOLMAJOR"  # FA3's build flag for the column-major V kernels
)
GPUS_FILE = Path(__file__).parents[1] / "knowledge" / "gpus.yaml"
DEVICE = "cuda"  # the CPU tests point this at the CPU and hand in a test double for flash-attn

Timer = Callable[
    [Callable[[], Any]], float
]  # runs a function repeatedly, returns milliseconds per call


@dataclass(frozen=True)
class Shape:
    dtype: str
    head_dim: int
    seqlen: int
    batch: int
    nheads: int


@dataclass(frozen=True)
class Fp8Variant:
    """One way of feeding FA3's FP8 forward, each a row of its own: the descale factors (1, or upstream's
    torch.rand(batch, nheads_k) * 2 of hopper/test_flash_attn.py) and V's layout (seqlen-contiguous, as
    hopper/benchmark_attn.py's V_colmajor makes it, only where the build compiles those kernels)."""

    name: str
    random_descale: bool
    v_colmajor: bool = False


FP8_VARIANTS = (
    Fp8Variant("descale-1", False),
    Fp8Variant("descale-random", True),
    Fp8Variant("v-colmajor", True, v_colmajor=True),
)
PLAIN = Fp8Variant("", False)  # every row but FP8's


@dataclass
class Measurement:
    implementation: str
    mode: str
    causal: bool
    dtype: str
    head_dim: int
    seqlen: int
    batch: int
    nheads: int
    status: str  # "ok" | "skipped" (not measurable by design or by the backend) | "error"
    ms: float | None = None
    tflops: float | None = None
    reason: str = ""
    variant: str = ""  # an FP8 row's Fp8Variant name ("" for every other row)


def attention_flops(shape: Shape, causal: bool, mode: str) -> float:
    forward = 4 * shape.batch * shape.nheads * shape.seqlen**2 * shape.head_dim
    return forward / (2 if causal else 1) * MODE_FLOPS[mode]


def shapes(
    tokens: int = TOKENS,
    seqlens: Sequence[int] = SEQLENS,
    head_dims: Sequence[int] = HEAD_DIMS,
    dtypes: Sequence[str] = DTYPES,
) -> list[Shape]:
    return [
        Shape(dtype, d, s, max(1, tokens // s), MODEL_WIDTH // d)
        for dtype in dtypes
        for d in head_dims
        for s in seqlens
    ]


# ---------------------------------------------------------------- the columns: the packaged implementations


@dataclass(frozen=True)
class Packaged:
    """An implementation that comes from an installed package rather than torch, as a bench column: how the
    line's python imports it, what bench.json's header says of it, and how a timed call calls it. A new
    implementation is one entry of PACKAGED (and its row in knowledge/attention_backends.yaml)."""

    name: str  # knowledge/attention_backends.yaml's name, the column's
    module: str  # what a skipped row names when it is not installed
    load: Callable[[], tuple[Any, str]]  # (the module, or None and why it does not import)
    call: Callable[
        [Any, bool], Callable[..., Any]
    ]  # (module, causal) -> fn(q, k, v, **fp8 descale) -> out
    version: Callable[
        [Any], str | None
    ]  # the installed distribution's version (the module in hand)
    build_flags: Callable[[], dict | None] | None = (
        None  # the build's own switches, where it records them
    )
    fp8: bool = False  # takes e4m3 inputs (FP8 rows, where build_flags do not leave FP8 out)
    extension: str | None = None  # its compiled extension module, whose file the header names


def _first(out: Any) -> Any:
    """The output alone, where an implementation returns (out, lse)."""
    return out[0] if isinstance(out, tuple) else out


def _load_fa2() -> tuple[Any, str]:
    """flash-attn 2.x. With only FA4 installed `import flash_attn` gives FA4's namespace package, not FA2."""
    module, error = machine.import_flash_attn()
    if module is not None and not hasattr(module, "flash_attn_func"):
        return None, "flash_attn is only flash-attn-4's namespace package (no flash-attn 2.x)"
    return module, error


def _load_fa3() -> tuple[Any, str]:
    from toolkit.verify.fa3 import import_fa3

    return import_fa3()


def _fa3_version(module: Any) -> str | None:
    from toolkit.verify.fa3 import fa3_version

    return fa3_version()


def _fa3_flags() -> dict | None:
    from toolkit.verify.fa3 import build_flags

    return build_flags()


def _load_fa4() -> tuple[Any, str]:
    from toolkit.verify.fa4 import import_fa4

    return import_fa4()


def _fa4_version(module: Any) -> str | None:
    from toolkit.verify.fa4 import fa4_version

    return fa4_version()


def _called(module: Any, causal: bool) -> Callable[..., Any]:
    """flash_attn_func(q, k, v, causal=...), the interface every FlashAttention shares; FA3 at an older commit
    and FA4 (flash_attn.cute) return (out, lse), FA3 at the pin out alone."""
    return lambda q, k, v, **descale: _first(
        module.flash_attn_func(q, k, v, causal=causal, **descale)
    )


PACKAGED: dict[str, Packaged] = {
    column.name: column
    for column in (
        Packaged(
            "flash-attn-2",
            "flash_attn (flash-attn 2.x)",
            _load_fa2,
            _called,
            lambda module: getattr(module, "__version__", None),
            extension="flash_attn_2_cuda",
        ),
        Packaged(
            "flash-attn-3",
            "flash_attn_interface (flash-attn-3)",
            _load_fa3,
            _called,
            _fa3_version,
            _fa3_flags,
            fp8=True,
        ),
        Packaged(
            "flash-attn-4", "flash_attn.cute (flash-attn-4)", _load_fa4, _called, _fa4_version
        ),
    )
}
PEAK_SHARE = (
    "flash-attn-2"  # the column the table shows as a share of the card's peak, as it always has
)
TORCH_OWN = (
    "sdpa-flash",
    "sdpa-cudnn",
    "sdpa-efficient",
    "sdpa-math",
    "eager",
)  # torch's, no package
IMPLEMENTATIONS = (*PACKAGED, *TORCH_OWN)  # the columns, in the table's order
FP8_IMPLEMENTATIONS = tuple(name for name, column in PACKAGED.items() if column.fp8)


def _attention_fn(
    implementation: str, modules: dict[str, Any], causal: bool, seqlen: int, device: torch.device
) -> tuple[bool, Callable[..., torch.Tensor]]:
    """(wants heads-first layout, fn(q, k, v) -> out) for one implementation."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if implementation in PACKAGED:
        return False, PACKAGED[implementation].call(modules[implementation], causal)
    if (
        implementation == "eager"
    ):  # what transformers' eager attention does, in the inputs' precision
        future = (
            torch.ones(seqlen, seqlen, dtype=torch.bool, device=device).triu(1) if causal else None
        )

        def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            scores = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5)
            if future is not None:
                scores = scores.masked_fill(future, float("-inf"))
            return torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype) @ v

        return True, eager
    backend = getattr(SDPBackend, SDPA_BACKENDS[implementation])

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return True, sdpa


def _timed_call(
    implementation: str,
    modules: dict[str, Any],
    shape: Shape,
    causal: bool,
    mode: str,
    inputs: dict[str, Any],
    device: torch.device,
    variant: Fp8Variant = PLAIN,
) -> Callable[[], Any]:
    import torch

    heads_first, attend = _attention_fn(implementation, modules, causal, shape.seqlen, device)
    q, k, v = inputs["bhsd" if heads_first else "bshd"]
    if (
        "descale" in inputs
    ):  # FP8: FA3's per-(batch, kv head) descale factors, timed as they are used
        plain, descale = attend, inputs["descale"][variant.random_descale]
        v = inputs["v_colmajor"] if variant.v_colmajor else v

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return plain(q, k, v, **descale)

    if mode == "fwd":

        def forward() -> torch.Tensor:
            with torch.no_grad():
                return attend(q, k, v)

        return forward
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    grad_out = torch.randn_like(q)

    def forward_backward() -> tuple[torch.Tensor, ...]:
        return torch.autograd.grad(attend(*leaves), leaves, grad_out)

    return forward_backward


def _row(
    implementation: str,
    shape: Shape,
    causal: bool,
    mode: str,
    status: str,
    reason: str = "",
    variant: Fp8Variant = PLAIN,
) -> Measurement:
    return Measurement(
        implementation,
        mode,
        causal,
        shape.dtype,
        shape.head_dim,
        shape.seqlen,
        shape.batch,
        shape.nheads,
        status,
        reason=reason,
        variant=variant.name,
    )


def _skip_reason(
    implementation: str, shape: Shape, modules: dict[str, Any], variant: Fp8Variant = PLAIN
) -> str:
    if implementation in PACKAGED and modules.get(implementation) is None:
        return f"{PACKAGED[implementation].module} is not installed in this environment"
    if variant.v_colmajor:
        column = PACKAGED[implementation]
        if not ((column.build_flags() if column.build_flags else None) or {}).get(VCOLMAJOR_FLAG):
            return (
                f"this build compiles no column-major V kernels ({VCOLMAJOR_FLAG} off; at the pinned "
                f"commit the API refuses such a V anyway: flash_attn_3.yaml vcolmajor)"
            )
    if implementation in QUADRATIC and shape.seqlen > QUADRATIC_MAX_SEQLEN:
        return (
            f"materialises the seqlen x seqlen matrix: not run above seqlen {QUADRATIC_MAX_SEQLEN}"
        )
    return ""


def measure_one(
    implementation: str,
    modules: dict[str, Any],
    shape: Shape,
    causal: bool,
    mode: str,
    inputs: dict[str, Any],
    device: torch.device,
    timer: Timer,
    variant: Fp8Variant = PLAIN,
) -> Measurement:
    import torch

    row = _row(implementation, shape, causal, mode, "ok", variant=variant)
    row.reason = _skip_reason(implementation, shape, modules, variant)
    if row.reason:
        row.status = "skipped"
        return row
    try:
        with warnings.catch_warnings(
            record=True
        ) as caught:  # torch says why a backend refuses, as warnings
            warnings.simplefilter("always")
            row.ms = timer(
                _timed_call(implementation, modules, shape, causal, mode, inputs, device, variant)
            )
        row.tflops = attention_flops(shape, causal, mode) / (row.ms * 1e-3) / 1e12
    except torch.cuda.OutOfMemoryError:
        row.status, row.reason = "skipped", "out of memory"
    except RuntimeError as exc:
        unsupported = any(marker in str(exc) for marker in NO_KERNEL_MARKERS)
        row.status = "skipped" if unsupported else "error"
        why = (
            "; ".join(str(w.message).strip().splitlines()[0] for w in caught[:1])
            or str(exc).strip()
        )
        row.reason = (
            f"torch has no {implementation} kernel for this shape: {why}"
            if unsupported
            else f"RuntimeError: {str(exc).strip().splitlines()[0]}"
        )[:300]
    except Exception as exc:  # keep benchmarking the rest; the row says what went wrong
        row.status, row.reason = "error", f"{type(exc).__name__}: {exc}"[:300]
    if row.status != "ok" and device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def run_bench(
    modules: dict[str, Any],
    shape_list: list[Shape],
    device: torch.device | str,
    timer: Timer,
    implementations: Sequence[str] = IMPLEMENTATIONS,
    on_row: Callable[[Measurement], None] = lambda row: None,
) -> list[Measurement]:
    """Every implementation x mode x causal on every shape; inputs are made once per shape. An FP8 shape is
    the FP8 columns' forward alone, once per FP8_VARIANTS. `modules`: each packaged implementation's module (PACKAGED's `load`), a
    missing one skipped."""
    import torch

    device = torch.device(device)
    rows = []
    for shape in shape_list:
        fp8 = shape.dtype == FP8
        try:
            inputs = _inputs(shape, device)
            failure = ""
        except (
            Exception
        ) as exc:  # no memory for the inputs, a dead device: every row of the shape says so
            inputs, failure = {}, f"inputs: {type(exc).__name__}: {exc}"[:300]
        for mode in ("fwd",) if fp8 else MODES:
            for causal in (False, True):
                for implementation, variant in [
                    (i, variant)
                    for i in implementations
                    if not fp8 or i in FP8_IMPLEMENTATIONS
                    for variant in (FP8_VARIANTS if fp8 else (PLAIN,))
                ]:
                    row = (
                        measure_one(
                            implementation,
                            modules,
                            shape,
                            causal,
                            mode,
                            inputs,
                            device,
                            timer,
                            variant,
                        )
                        if inputs
                        else _row(implementation, shape, causal, mode, "error", failure, variant)
                    )
                    on_row(row)
                    rows.append(row)
        del inputs
    return rows


def _inputs(shape: Shape, device: torch.device) -> dict:
    """q, k, v in both layouts (random normal, seed 0); for FP8 rounded to e4m3, with the descale factors of
    both kinds (`descale`[random_descale]) and V in the column-major layout as well (`v_colmajor`)."""
    import torch

    torch.manual_seed(0)
    size = (shape.batch, shape.seqlen, shape.nheads, shape.head_dim)
    fp8 = shape.dtype == FP8
    bshd = [
        torch.randn(
            size, device=device, dtype=torch.bfloat16 if fp8 else getattr(torch, shape.dtype)
        )
        for _ in range(3)
    ]
    bshd = [t.to(torch.float8_e4m3fn) for t in bshd] if fp8 else bshd
    inputs: dict = {"bshd": bshd, "bhsd": [t.transpose(1, 2).contiguous() for t in bshd]}
    if fp8:
        ones = torch.ones(shape.batch, shape.nheads, device=device, dtype=torch.float32)
        drawn = [
            torch.rand(shape.batch, shape.nheads, device=device, dtype=torch.float32) * 2
            for _ in range(3)
        ]
        names = ("q_descale", "k_descale", "v_descale")
        inputs["descale"] = {False: dict.fromkeys(names, ones), True: dict(zip(names, drawn))}
        # the layout of hopper/benchmark_attn.py's v_colmajor: seqlen is the contiguous dimension
        inputs["v_colmajor"] = bshd[2].transpose(-1, -3).contiguous().transpose(-1, -3)
    return inputs


def cuda_timer(fn: Callable[[], Any], warmup_ms: float = 10.0, rep_ms: float = 40.0) -> float:
    """Median milliseconds per call from CUDA events, after a warmup (the approach of triton's do_bench)."""
    import torch

    def event() -> torch.cuda.Event:
        return torch.cuda.Event(enable_timing=True)

    fn()
    torch.cuda.synchronize()
    first, last = event(), event()
    first.record()
    for _ in range(3):
        fn()
    last.record()
    torch.cuda.synchronize()
    estimate = max(first.elapsed_time(last) / 3, 1e-3)
    for _ in range(max(1, min(1000, int(warmup_ms / estimate)))):
        fn()
    count = max(5, min(1000, int(rep_ms / estimate)))
    starts, ends = [event() for _ in range(count)], [event() for _ in range(count)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(start.elapsed_time(end) for start, end in zip(starts, ends))


# ---------------------------------------------------------------- measuring side (line's python)


def import_packages() -> tuple[dict[str, Any], list[str]]:
    """Each packaged implementation's module (None where missing), and why each missing one does not import."""
    loaded = {name: column.load() for name, column in PACKAGED.items()}
    errors = [
        f"{PACKAGED[name].module.split()[0]}: {why}"
        for name, (module, why) in loaded.items()
        if module is None
    ]
    return {name: module for name, (module, _) in loaded.items()}, errors


def fp8_shapes(
    modules: dict[str, Any], tokens: int, seqlens: Sequence[int], head_dims: Sequence[int]
) -> tuple[list[Shape], str]:
    """FP8 shapes where an FP8 column is installed and its build has FP8 (its own switches), and what the
    header says."""
    fp8 = [PACKAGED[name] for name in FP8_IMPLEMENTATIONS if modules.get(name) is not None]
    if not fp8:
        return [], f"no {' or '.join(FP8_IMPLEMENTATIONS)} here"
    left_out = [
        c.name
        for c in fp8
        if ((c.build_flags() if c.build_flags else None) or {}).get("FLASHATTENTION_DISABLE_FP8")
    ]
    if len(left_out) == len(fp8):
        return (
            [],
            f"this {' and '.join(left_out)} build leaves FP8 out (its build flags: FLASHATTENTION_DISABLE_FP8)",
        )
    return shapes(tokens, seqlens, head_dims, (FP8,)), (
        "e4m3 inputs, bf16 output, fwd; one row per variant: descale-1 (factors of 1), descale-random "
        "(torch.rand(batch, nheads_k) * 2), v-colmajor (random factors, V seqlen-contiguous)"
    )


def _header(modules: dict[str, Any], fp8_note: str) -> dict[str, dict[str, Any]]:
    """bench.json's entry per packaged implementation (attention_backends.yaml's bench_field: flash_attn_2, ...):
    its version and path, its extension's file and its build's switches where it has them."""
    header = {}
    for name, column in PACKAGED.items():
        module = modules.get(name)
        entry: dict[str, Any] = {
            "version": column.version(module),
            "path": getattr(module, "__file__", None),
        }
        if column.extension:
            entry["extension"] = getattr(sys.modules.get(column.extension), "__file__", None)
        if column.build_flags:
            entry["build_flags"] = column.build_flags()
        if column.fp8:
            entry["fp8"] = fp8_note
        header[name.replace("-", "_")] = entry
    return header


def measure(
    line: str,
    report_dir: Path,
    command: str,
    tokens: int,
    seqlens: Sequence[int],
    head_dims: Sequence[int],
) -> int:
    machine.require_cuda("the benchmark")
    modules, import_errors = import_packages()
    if all(module is None for module in modules.values()):
        raise ToolkitError(
            f"none of {', '.join(PACKAGED)} imports under {sys.executable}: "
            f"{'; '.join(import_errors)} (build and install the line's wheel, or run "
            f"`toolkit verify {line}` for details)"
        )
    fp8_list, fp8_note = fp8_shapes(modules, tokens, seqlens, head_dims)
    shape_list = shapes(tokens, seqlens, head_dims) + fp8_list
    total = (len(shape_list) - len(fp8_list)) * len(MODES) * 2 * len(IMPLEMENTATIONS) + len(
        fp8_list
    ) * 2 * len(FP8_IMPLEMENTATIONS) * len(FP8_VARIANTS)
    started = time.perf_counter()
    environment = machine.environment_info(None, command)
    del environment[
        "flash_attn"
    ]  # the report of one implementation names it here; the bench's, each in its entry
    header = {
        "kind": "bench",
        "schema": formats.SCHEMA,
        "line": line,
        **environment,
        **_header(modules, fp8_note),
        "import_errors": import_errors,
        "tokens": tokens,
        "model_width": MODEL_WIDTH,
        "flops": "fwd: 4*batch*heads*seqlen^2*head_dim (/2 causal); fwd+bwd: 3.5x fwd",
    }
    rows: list[Measurement] = []

    def write(partial: bool) -> None:
        data = {
            **header,
            "duration_s": round(time.perf_counter() - started, 1),
            **(
                {"partial": f"{len(rows)} of {total} rows (the run was still going)"}
                if partial
                else {}
            ),
            "measurements": [asdict(r) for r in rows],
        }
        write_atomic(report_dir / "bench.json", json.dumps(data, indent=2) + "\n")

    def on_row(
        row: Measurement,
    ) -> None:  # the file grows as it goes: a run cut short keeps what it measured
        rows.append(row)
        if len(rows) % PARTIAL_EVERY == 0:
            write(partial=True)
        advance(
            f"error: {row.implementation} {row.mode} {row.dtype} d{row.head_dim} seqlen {row.seqlen}: "
            f"{row.reason}"
            if row.status == "error"
            else ""
        )

    with machine.progress(total, f"bench {line}") as advance:
        run_bench(modules, shape_list, DEVICE, cuda_timer, on_row=on_row)
    write(partial=False)
    return 0


# ---------------------------------------------------------------- report side (toolkit's python)


def gpu_facts(gpu_name: str | None, path: Path = GPUS_FILE) -> tuple[dict | None, list[dict]]:
    """(the gpus.yaml entry this card matches, or None; the throughput targets for that entry)."""
    return knowledge_files.typed(path, lambda data: _gpu_facts(gpu_name, data))


def _gpu_facts(gpu_name: str | None, data: dict) -> tuple[dict | None, list[dict]]:
    entry = next((g for g in data["gpus"] if gpu_name and g["match"] in gpu_name), None)
    if entry is None:
        return None, []
    entry = {**entry, "source": data["sources"][entry["source"]]}
    targets = [
        {**t, "source": data["sources"][t["source"]]}
        for t in data["targets"]
        if t["gpu"] == entry["match"]
    ]
    return entry, targets


@dataclass(frozen=True)
class Fp8Gate:
    """A floor on FA3's FP8 forward (gpus.yaml fp8_gates): a ratio to the best bf16 row of the same shape, or
    TFLOP/s, on every measured seqlen in [min_seqlen, max_seqlen]."""

    gpus: tuple[str, ...]
    head_dim: int
    causal: bool
    min_seqlen: int
    max_seqlen: int | None
    source: str
    min_ratio: float | None = None
    min_tflops: float | None = None

    def covers(self, row: dict) -> bool:
        """A forward row of this gate's shape (any dtype)."""
        return (
            row["mode"] == "fwd"
            and (row["head_dim"], row["causal"]) == (self.head_dim, self.causal)
            and self.min_seqlen <= row["seqlen"] <= (self.max_seqlen or row["seqlen"])
        )

    @property
    def what(self) -> str:
        seqlens = (
            f"seqlen {self.min_seqlen}"
            if self.max_seqlen == self.min_seqlen
            else f"seqlen >= {self.min_seqlen}"
            + (f" and <= {self.max_seqlen}" if self.max_seqlen else "")
        )
        floor = (
            f"FP8 / best bf16 >= {self.min_ratio:.2f}"
            if self.min_ratio is not None
            else f"FP8 >= {self.min_tflops:g} TFLOP/s"
        )
        return f"{floor} at d{self.head_dim} {'causal' if self.causal else 'non-causal'} {seqlens}"


def fp8_gates(gpu_name: str | None, path: Path = GPUS_FILE) -> list[Fp8Gate]:
    """The FP8 gates of the gpus.yaml entry this card matches ([] for a card without any)."""
    return knowledge_files.typed(path, lambda data: _fp8_gates(gpu_name, data))


def _fp8_gates(gpu_name: str | None, data: dict) -> list[Fp8Gate]:
    entry, _ = _gpu_facts(gpu_name, data)
    return [
        Fp8Gate(**{**gate, "gpus": tuple(gate["gpus"]), "source": data["sources"][gate["source"]]})
        for gate in data.get("fp8_gates", [])
        if entry is not None and entry["match"] in gate["gpus"]
    ]


def _best(rows: list[dict]) -> dict | None:
    measured = [r for r in rows if r["status"] == "ok" and r["tflops"]]
    return max(measured, key=lambda r: r["tflops"]) if measured else None


def evaluate_fp8_gates(data: dict, gates: list[Fp8Gate]) -> list[dict]:
    """One result per gate and measured seqlen: the best FP8 row (any FP8 column and variant), the best bf16 row
    of the shape, their ratio, met or not. A gate whose head dim has no FP8 row at all in this bench does not
    apply (`not_applicable` says why); FP8 rows that all failed are "not measured" and miss it."""
    results = []
    for gate in gates:
        fp8 = [
            r for r in data["measurements"] if r["dtype"] == FP8 and gate.covers(r)
        ]  # every FP8 column's rows, whatever their status
        base: dict[str, Any] = {
            "gate": gate.what,
            "source": gate.source,
            "min_ratio": gate.min_ratio,
            "min_tflops": gate.min_tflops,
        }
        if not fp8:
            why = (data.get("flash_attn_3") or {}).get("fp8") or "no FP8 column in this bench"
            results.append(
                {**base, "seqlen": None, "met": False, "not_applicable": f"no FP8 row ({why})"}
            )
            continue
        for seqlen in sorted({r["seqlen"] for r in fp8}):
            best_fp8 = _best([r for r in fp8 if r["seqlen"] == seqlen])
            best_bf16 = _best(
                [
                    r
                    for r in data["measurements"]
                    if r["dtype"] == "bfloat16" and gate.covers(r) and r["seqlen"] == seqlen
                ]
            )
            ratio = best_fp8["tflops"] / best_bf16["tflops"] if best_fp8 and best_bf16 else None
            met = (
                ratio is not None and ratio >= gate.min_ratio
                if gate.min_ratio is not None
                else best_fp8 is not None and best_fp8["tflops"] >= (gate.min_tflops or 0)
            )
            results.append(
                {
                    **base,
                    "seqlen": seqlen,
                    "fp8_tflops": best_fp8 and best_fp8["tflops"],
                    "fp8_row": best_fp8
                    and " ".join(
                        filter(None, (best_fp8["implementation"], best_fp8.get("variant")))
                    ),
                    "bf16_tflops": best_bf16 and best_bf16["tflops"],
                    "bf16_row": best_bf16 and best_bf16["implementation"],
                    "ratio": ratio,
                    "met": met,
                    "not_applicable": None,
                }
            )
    return results


def _gate_line(result: dict) -> str:
    if result["not_applicable"]:
        return f"FP8 gate not applicable: {result['gate']}: {result['not_applicable']}"
    fp8, bf16, ratio = result["fp8_tflops"], result["bf16_tflops"], result["ratio"]
    measured = (
        "FP8 not measured"
        if fp8 is None
        else f"FP8 {fp8:.0f} ({result['fp8_row']})"
        + (
            f" / best bf16 {bf16:.0f} ({result['bf16_row']}) = {ratio:.2f}"
            if ratio is not None
            else " TFLOP/s"
        )
    )
    return (
        f"FP8 gate {'met' if result['met'] else 'MISSED'}: {result['gate']}: seqlen "
        f"{result['seqlen']}: {measured}"
    )


def implementations_not_built(spec: EnvSpec) -> dict[str, str]:
    """Implementations the line's spec does not build, each with why: a target on one does not apply to it."""
    setting = spec.flash_attn_2_left_out()
    return (
        {"flash-attn-2": f"line {spec.line} builds no flash-attn 2.x ({setting})"}
        if setting
        else {}
    )


def evaluate_targets(data: dict, targets: list[dict], not_built: dict[str, str]) -> list[dict]:
    """Each target with the measured TFLOP/s (None when that row is missing or failed), met or not, and
    `not_applicable`: why the line does not build the target's implementation (None where it does)."""
    keys = ("implementation", "mode", "dtype", "head_dim", "causal", "seqlen")
    results = []
    for target in targets:
        row = next((m for m in data["measurements"] if all(m[k] == target[k] for k in keys)), None)
        measured = row["tflops"] if row else None
        results.append(
            {
                **target,
                "measured_tflops": measured,
                "met": measured is not None and measured >= target["min_tflops"],
                "not_applicable": not_built.get(target["implementation"]),
            }
        )
    return results


def _target_line(target: dict) -> str:
    what = (
        f"{target['implementation']} {target['mode']} {target['dtype']} d{target['head_dim']} seqlen "
        f"{target['seqlen']} {'causal' if target['causal'] else 'non-causal'}"
    )
    if target["not_applicable"]:
        return f"target not applicable: {what}: {target['not_applicable']}"
    measured = target["measured_tflops"]
    return (
        f"target {'met' if target['met'] else 'MISSED'}: {what}: "
        f"{'not measured' if measured is None else f'{measured:.1f}'} TFLOP/s (needs >= {target['min_tflops']})"
    )


def finish(
    report_dir: Path, console: Console, not_built: dict[str, str], gpus_file: Path = GPUS_FILE
) -> int:
    """Add peak fractions, targets and FP8 gates (of `gpus_file`) to bench.json, plot bench.png, print the table;
    1 if any target or gate is missed (a target on an implementation in `not_built`, which the line does not
    build, does not apply; nor does a gate with no FP8 row at its head dim)."""
    path = report_dir / "bench.json"
    data = formats.current(
        read_json(path, "bench report", "run the bench again"), path, formats.BENCH
    )
    if not isinstance(data, dict):
        raise ToolkitError(
            f"{path}: not a bench report: a JSON {type(data).__name__} (run the bench again)"
        )
    gpu, targets = gpu_facts(data.get("gpu"), gpus_file)
    peak = gpu["bf16_dense_tflops"] if gpu else None
    data["peak"] = gpu or {
        "match": None,
        "bf16_dense_tflops": None,
        "source": f"{data.get('gpu')!r} is not in {gpus_file.name}: no fraction of peak",
    }
    for row in data["measurements"]:
        row["fraction_of_bf16_peak"] = row["tflops"] / peak if peak and row["tflops"] else None
    data["targets"] = evaluate_targets(data, targets, not_built)
    data["fp8_gates"] = evaluate_fp8_gates(data, fp8_gates(data.get("gpu"), gpus_file))
    write_atomic(path, json.dumps(data, indent=2) + "\n")
    write_atomic(report_dir / "bench.png", plot(data))
    print_table(data, console)
    for target in data["targets"]:
        console.print(_target_line(target), highlight=False)
    for gate in data["fp8_gates"]:
        console.print(_gate_line(gate), highlight=False)
    console.print(
        f"bench {data['line']}: {len(data['measurements'])} measurements in {data['duration_s']} s on "
        f"{data['gpu']}; {path} and {report_dir / 'bench.png'}",
        highlight=False,
    )
    judged = data["targets"] + data["fp8_gates"]
    return 0 if all(t["met"] or t["not_applicable"] for t in judged) else 1


def print_table(data: dict, console: Console) -> None:
    from rich.table import Table

    peak = data["peak"]["bf16_dense_tflops"]
    packages = "".join(
        f"{name} {version}, "
        for name in PACKAGED
        if (version := (data.get(name.replace("-", "_")) or {}).get("version"))
    )
    table = Table(title=f"attention TFLOP/s on {data['gpu']} ({packages}torch {data['torch']})")
    for column in (
        "dtype",
        "d",
        "mode",
        "causal",
        "seqlen",
        *IMPLEMENTATIONS,
        f"{PEAK_SHARE} % peak",
    ):
        table.add_column(column, justify="right")
    grouped: dict[tuple, dict[str, dict]] = {}
    for row in data["measurements"]:
        dtype = " ".join(
            filter(None, (row["dtype"], row.get("variant")))
        )  # an FP8 variant's own line
        key = (dtype, row["head_dim"], row["mode"], row["causal"], row["seqlen"])
        grouped.setdefault(key, {})[row["implementation"]] = row
    for (dtype, head_dim, mode, causal, seqlen), rows in grouped.items():
        cells = [_cell(rows.get(name)) for name in IMPLEMENTATIONS]
        fa = rows.get(PEAK_SHARE)
        share = f"{100 * fa['tflops'] / peak:.0f}%" if peak and fa and fa["tflops"] else "-"
        table.add_row(
            dtype, str(head_dim), mode, "yes" if causal else "no", str(seqlen), *cells, share
        )
    console.print(table)


def _cell(row: dict | None) -> str:
    if row is None:
        return ""
    return f"{row['tflops']:.0f}" if row["status"] == "ok" else row["status"]


def plot(data: dict) -> bytes:
    """TFLOP/s against seqlen: one panel per (dtype, head dim) x (mode, causal), one line per implementation."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    dtypes = sorted({r["dtype"] for r in data["measurements"]})
    head_dims = sorted({r["head_dim"] for r in data["measurements"]})
    columns = [(mode, causal) for mode in MODES for causal in (False, True)]
    rows = [(dtype, d) for dtype in dtypes for d in head_dims]
    lines = [
        (name, variant)
        for name in IMPLEMENTATIONS
        for variant in sorted({r.get("variant", "") for r in data["measurements"]})
    ]
    figure, axes = plt.subplots(
        len(rows),
        len(columns),
        figsize=(4.2 * len(columns), 3.2 * len(rows)),
        squeeze=False,
        sharex=True,
    )
    peak = data["peak"]["bf16_dense_tflops"]
    for (dtype, head_dim), axes_row in zip(rows, axes):
        for (mode, causal), ax in zip(columns, axes_row):
            for name, variant in lines:
                points = sorted(
                    (r["seqlen"], r["tflops"])
                    for r in data["measurements"]
                    if (r["implementation"], r["dtype"], r["head_dim"], r["mode"], r["causal"])
                    == (name, dtype, head_dim, mode, causal)
                    and r.get("variant", "") == variant
                    and r["tflops"]
                )
                if points:
                    label = f"{name} {variant}".strip()
                    ax.plot(*zip(*points), marker="o", markersize=3, label=label)
            if peak:
                ax.axhline(peak, color="grey", linestyle="--", linewidth=0.8)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{dtype} d{head_dim} {mode}{' causal' if causal else ''}", fontsize=9)
            ax.set_ylabel("TFLOP/s", fontsize=8)
            ax.tick_params(labelsize=7)
    axes[0][0].legend(fontsize=7)
    for ax in axes[-1]:
        ax.set_xlabel("seqlen", fontsize=8)
    figure.suptitle(
        f"{data['line']}: attention throughput on {data['gpu']}"
        + (f" (dashed: bf16 dense peak {peak} TFLOP/s)" if peak else "")
    )
    figure.tight_layout(rect=(0, 0, 1, 0.98))  # leave the top strip to the title
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    plt.close(figure)
    return buffer.getvalue()


# ---------------------------------------------------------------- CLI


def _int_list(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _add_grid_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tokens",
        type=int,
        default=TOKENS,
        metavar="N",
        help=f"batch x seqlen per shape (default {TOKENS})",
    )
    parser.add_argument(
        "--seqlens",
        type=_int_list,
        default=SEQLENS,
        metavar="S,S,...",
        help="sequence lengths, comma-separated (default 512..16384)",
    )
    parser.add_argument(
        "--head-dims",
        type=_int_list,
        default=HEAD_DIMS,
        metavar="D,D,...",
        help="head dims, comma-separated (default 64,128,256)",
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "bench",
        description=f"Time each installed FlashAttention ({', '.join(PACKAGED)}) against torch SDPA (flash, cuDNN, "
        "efficient, math) and eager attention: "
        "fwd and fwd+bwd, causal and not, bf16 and fp16. Writes reports/LINE/bench.json and "
        "bench.png; exit 1 without a GPU or when a throughput target in gpus.yaml is missed (a target "
        "on an implementation the line does not build does not apply).",
    )
    machine.add_line_arguments(parser)
    _add_grid_options(parser)
    parser.set_defaults(func=bench_command)


def bench_command(args: argparse.Namespace) -> int:
    from rich.console import Console

    spec = machine.checked_line_spec(args)
    grid = [
        "--tokens",
        str(args.tokens),
        "--seqlens",
        ",".join(map(str, args.seqlens)),
        "--head-dims",
        ",".join(map(str, args.head_dims)),
    ]
    command = " ".join(["toolkit bench", args.line, *grid])
    code, written = machine.measure_for_line(
        args,
        spec,
        "toolkit.verify.bench",
        ["--command", command, *grid],
        lambda line, report_dir: measure(
            line, report_dir, command, args.tokens, args.seqlens, args.head_dims
        ),
        "the benchmark",
        "bench.json",
    )
    if code != 0 or written is None:
        return code or 1
    return finish(written.parent, Console(), implementations_not_built(spec))


@program
def main(argv: list[str] | None = None) -> int:
    """`python -m toolkit.verify.bench LINE`: the measuring half alone, as re-executed under the line's python."""
    parser = argparse.ArgumentParser(
        prog="python -m toolkit.verify.bench",
        description="The measuring half of `toolkit bench`, under the line's python: "
        "writes DIR/bench.json (the toolkit's python finishes it).",
    )
    parser.add_argument(
        "line", metavar="LINE", help="the line being measured (named in the report)"
    )
    parser.add_argument(
        "--report-dir", type=Path, required=True, metavar="DIR", help="where bench.json goes"
    )
    parser.add_argument(
        "--command",
        default="python -m toolkit.verify.bench",
        metavar="TEXT",
        help="the command line the report names",
    )
    _add_grid_options(parser)
    args = parser.parse_args(argv)
    return measure(
        args.line, args.report_dir, args.command, args.tokens, args.seqlens, args.head_dims
    )


if __name__ == "__main__":
    raise SystemExit(main())
