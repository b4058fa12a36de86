"""The build step of a JIT kernel: warm FlashAttention-4's on-disk kernel cache and prove it works.

FA4 compiles each kernel variant on its first call in every process (1-2 s forward, 4.5-5 s
forward+backward on an H200) unless FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 points it at a cache
folder (knowledge: cache; off by default, Dao-AILab/flash-attention#2635). `warm` compiles the
variants users run, each in a FRESH process with its own empty cache (that first call is the cold
latency), merges them into one cache folder, then calls each variant again in a fresh process using
that cache (the warm latency). The cache is packed as an artifact beside its kernel-cache record (<key>.kernel-cache.json,
KernelCacheRecord: not a build record's suffix, so it can lie in wheelhouse/<line>/ beside them) keyed
by (FA4 version, cutlass-dsl version, arch, torch, python): FA4 itself namespaces entries under a
fingerprint of its sources and the cutlass/tvm_ffi versions, so a mismatched cache is never loaded,
only missed.

`python -m toolkit.fa4.jit call ...` is the child: it needs torch and flash_attn.cute only.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic

from toolkit.base import children
from toolkit.base.atomic import clean_stale, copy_atomic, publish_dir, publish_file, write_atomic
from toolkit.base.digest import sha256_file
from toolkit.base.entry import program
from toolkit.base.errors import ToolkitError, first_problem
from toolkit.base.fslock import locked
from toolkit.base.jsonfile import parse_json, read_json
from toolkit.base.paths import display_path, folder_argument, printable
from toolkit.base.typed import adapter
from toolkit.base.versioned import Format
from toolkit.base.workspace import KERNEL_CACHE_RECORD_SUFFIX

CACHE_ENV = {"FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED": "1"}
CACHE_DIR_ENV = "FLASH_ATTENTION_CUTE_DSL_CACHE_DIR"
# The CuTe DSL's own file cache (cutlass/base_dsl/env_manager.py: CUTE_DSL_CACHE_DIR, default a folder in
# /tmp): pointed inside the same cache folder, so a cold run starts from nothing and the artifact holds it.
DSL_CACHE_DIR_ENV = "CUTE_DSL_CACHE_DIR"
DSL_SUBDIR = "cute-dsl"
MODES = ("fwd", "fwd+bwd")
DTYPES = ("bfloat16", "float16")
HEAD_DIMS = (64, 128)
MODEL_WIDTH = 2048  # heads = width / head_dim, as toolkit/verify/bench.py
CALL_TOKENS = (
    8192  # batch x seqlen of the call that triggers the compile (the compile key has no seqlen)
)
CALL_SEQLEN = 2048
# In a cache-install's --dest: the files it wrote there (the rest is FA4's, or the user's, and stays).
INSTALLED = ".fa-envkit-cache-install.json"
SHA256 = re.compile(r"[0-9a-f]{64}")
RECORD_SUFFIX = (
    KERNEL_CACHE_RECORD_SUFFIX  # never a build record's: both may share wheelhouse/<line>/
)


@dataclass(frozen=True)
class Variant:
    head_dim: int
    dtype: str
    causal: bool
    mode: str

    @property
    def name(self) -> str:
        return f"{self.mode}-{self.dtype}-d{self.head_dim}{'-causal' if self.causal else ''}"

    @classmethod
    def parse(cls, text: str) -> Variant:
        """fwd-bfloat16-d128[-causal] -> Variant (the form `name` writes); argparse shows the error."""
        parts = text.split("-")
        causal = parts[-1] == "causal"
        if (
            len(parts) != 3 + causal
            or parts[0] not in MODES
            or parts[1] not in DTYPES
            or not parts[2].removeprefix("d").isdigit()
            or not parts[2].startswith("d")
        ):
            raise argparse.ArgumentTypeError(
                f"variant {text!r}: expected MODE-DTYPE-dHEADDIM[-causal] with MODE in "
                f"{MODES}, DTYPE in {DTYPES}, e.g. fwd+bwd-bfloat16-d128-causal"
            )
        return cls(int(parts[2][1:]), parts[1], causal, parts[0])


def default_variants(
    head_dims: tuple[int, ...] = HEAD_DIMS, dtypes: tuple[str, ...] = DTYPES
) -> list[Variant]:
    """What users run: head dims 64/128, bf16/fp16, causal or not, forward and forward+backward."""
    return [
        Variant(d, dtype, causal, mode)
        for mode in MODES
        for dtype in dtypes
        for d in head_dims
        for causal in (False, True)
    ]


def training_step(variants: list[Variant]) -> list[Variant]:
    """A training step's set: every forward+backward variant (a model's layers share one head dim and
    dtype, but a run mixes causal training with non-causal evaluation, and models mix head dims)."""
    return [v for v in variants if v.mode == "fwd+bwd"]


# ---------------------------------------------------------------- the child: one fresh process


def call_variants(
    variants: list[Variant],
    device: str = "cuda",
    tokens: int = CALL_TOKENS,
    seqlen: int = CALL_SEQLEN,
) -> dict:
    """Import FA4, then call each variant twice: first call (compile or cache load + run), second call."""
    started = time.perf_counter()
    import torch

    import_torch_s = time.perf_counter() - started
    from flash_attn.cute import flash_attn_func

    import_s = time.perf_counter() - started
    results = []
    step_start = time.perf_counter()
    for variant in variants:
        dtype = getattr(torch, variant.dtype)
        size = (max(1, tokens // seqlen), seqlen, MODEL_WIDTH // variant.head_dim, variant.head_dim)
        q, k, v = (
            torch.randn(size, device=device, dtype=dtype, requires_grad=variant.mode != "fwd")
            for _ in range(3)
        )

        def once(
            variant: Variant = variant, q: Any = q, k: Any = k, v: Any = v
        ) -> None:  # bound now: called in this iteration
            if variant.mode == "fwd":
                with torch.no_grad():
                    flash_attn_func(q, k, v, causal=variant.causal)
            else:
                out = flash_attn_func(q, k, v, causal=variant.causal)[0]
                out.backward(torch.ones_like(out))
            if device == "cuda":
                torch.cuda.synchronize()

        times = []
        for _ in range(2):
            begin = time.perf_counter()
            once()
            times.append(time.perf_counter() - begin)
        results.append(
            {
                "variant": variant.name,
                "first_call_s": round(times[0], 4),
                "second_call_s": round(times[1], 4),
            }
        )
    return {
        "import_torch_s": round(import_torch_s, 3),
        "import_s": round(import_s, 3),
        "step_s": round(time.perf_counter() - step_start, 4),
        "calls": results,
    }


def run_child(
    python: str,
    variants: list[Variant],
    cache_dir: Path,
    env: dict[str, str],
    timeout: float = 300,
    call_args: tuple[str, ...] = (),
) -> dict:
    """One fresh process calling `variants` with the cache at `cache_dir`; its JSON, or an error row.
    `call_args`: the child's --device/--tokens/--seqlen (the CPU tests call small shapes on the CPU)."""
    command = [python, "-m", "toolkit.fa4.jit", "call", *call_args, *[v.name for v in variants]]
    child_env = {**os.environ, **env, **cache_env(cache_dir)}
    begin = time.perf_counter()
    try:
        done = children.run_tied(
            command,
            capture_output=True,
            text=True,
            env=child_env,
            timeout=timeout,
            cwd=Path(__file__).resolve().parents[2],
        )
    except subprocess.TimeoutExpired:
        return {
            "error": f"timed out after {timeout} s",
            "wall_s": round(time.perf_counter() - begin, 2),
        }
    wall = round(time.perf_counter() - begin, 2)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": tail[:400], "wall_s": wall}
    return {**json.loads(lines[-1]), "wall_s": wall}


# ---------------------------------------------------------------- the parent: warm, measure, pack


def cache_env(cache_dir: Path) -> dict[str, str]:
    """What makes FA4 (and the CuTe DSL under it) read and write the cache at cache_dir."""
    return {
        **CACHE_ENV,
        CACHE_DIR_ENV: str(cache_dir),
        DSL_CACHE_DIR_ENV: str(cache_dir / DSL_SUBDIR),
    }


def cache_entries(cache_dir: Path) -> list[Path]:
    """The files worth keeping: not locks, not half-written exports (FA4 writes .HASH.PID.tmp.o, renames)."""
    return sorted(
        p
        for p in cache_dir.rglob("*")
        if p.is_file() and not p.name.startswith(".") and not p.name.endswith((".lock", ".tmp"))
    )


def merge_cache(source: Path, dest: Path) -> int:
    """Copy every cache entry from one cache folder into another; returns how many were new."""
    added = 0
    for entry in cache_entries(source):
        target = dest / entry.relative_to(source)
        if not target.exists():  # a reader (a warm run beside this merge) never sees half an entry
            copy_atomic(entry, target)
            added += 1
    return added


def warm(
    python: str,
    variants: list[Variant],
    cache_dir: Path,
    env: dict[str, str],
    on_row: Callable[[dict[str, Any]], object] = lambda row: None,
    call_args: tuple[str, ...] = (),
    budget_s: float | None = None,
    jobs: int = 1,
) -> dict:
    """Per variant: a cold run (fresh process, empty cache of its own), its entries merged into cache_dir,
    then a warm run (fresh process reading cache_dir); `jobs` variants at a time (compiles are CPU-bound
    and single-threaded, so a few share a 16-core machine without slowing each other much; the report
    records `jobs`). Then a training step's set, cold and warm, alone. With `budget_s`, no new variant
    starts once it is spent (those are listed as not reached)."""
    from concurrent.futures import ThreadPoolExecutor

    cache_dir.mkdir(parents=True, exist_ok=True)
    deadline = None if budget_s is None else time.monotonic() + budget_s
    with tempfile.TemporaryDirectory(prefix="fa4-cold-") as scratch:

        def one(variant: Variant) -> dict:
            if deadline is not None and time.monotonic() > deadline:
                skipped = {"error": "not reached: time budget spent"}
                return {
                    "variant": variant.name,
                    "cold": skipped,
                    "warm": skipped,
                    "cache_entries_added": 0,
                }
            cold_dir = Path(scratch) / variant.name
            cold = run_child(python, [variant], cold_dir, env, call_args=call_args)
            added = merge_cache(cold_dir, cache_dir) if cold_dir.is_dir() else 0
            warm_result = run_child(python, [variant], cache_dir, env, call_args=call_args)
            return {
                "variant": variant.name,
                "cold": cold,
                "warm": warm_result,
                "cache_entries_added": added,
            }

        rows = []
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            for row in pool.map(one, variants):  # in order, as each finishes
                on_row(row)
                rows.append(row)
        reached = {row["variant"] for row in rows if "error" not in row["cold"]}
        step = [v for v in training_step(variants) if v.name in reached]
        step_cold = (
            run_child(python, step, Path(scratch) / "step-cold", env, call_args=call_args)
            if step
            else {}
        )
    step_warm = run_child(python, step, cache_dir, env, call_args=call_args) if step else {}
    return {
        "variants": rows,
        "jobs": jobs,
        "training_step": {"variants": [v.name for v in step], "cold": step_cold, "warm": step_warm},
    }


def cache_key(python: str, env: dict[str, str], arch: str) -> dict:
    """(FA4 version, cutlass-dsl version, arch, torch, python) of the interpreter that fills the cache."""
    probe = (
        "import importlib.metadata as m, json, sys\n"
        "v = lambda n: m.version(n)\n"
        "print(json.dumps({'flash_attn_4': v('flash-attn-4'), 'cutlass_dsl': v('nvidia-cutlass-dsl'),"
        " 'torch': v('torch'), 'python': '%d.%d' % sys.version_info[:2]}))"
    )
    done = children.run_tied(
        [python, "-c", probe], capture_output=True, text=True, env={**os.environ, **env}
    )
    if done.returncode != 0:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolkitError(
            f"{python}: flash-attn-4 is not installed where this python sees it ({tail}) "
            f"(run `toolkit fa4 install` and pass its PYTHONPATH)"
        )
    answer = parse_json(
        done.stdout, python, "answer to the version probe", "pass --python of the FA4 install"
    )
    names = ("flash_attn_4", "cutlass_dsl", "torch", "python")
    if not (
        isinstance(answer, dict)
        and set(answer) == set(names)
        and all(isinstance(v, str) for v in answer.values())
        and all(v.isprintable() for v in answer.values())
    ):
        raise ToolkitError(
            f"{python}: did not answer the version probe as a Python interpreter does (pass --python "
            f"of the FA4 install)"
        )
    return {**answer, "arch": arch}


def key_id(key: dict) -> str:
    text = "fa4-{flash_attn_4}-cutlass{cutlass_dsl}-sm{arch}-torch{torch}-py{python}".format(**key)
    return text.replace("+", "_")


def _sha256(value: object) -> object:
    if not isinstance(value, str) or not SHA256.fullmatch(value):
        raise ValueError("not a sha256 hex digest")
    return value


def _file_name(value: object) -> object:
    if not isinstance(value, str) or value != Path(value).name or value in ("", ".", ".."):
        raise ValueError("must be a file name beside the record")
    return value


Text = Annotated[str, pydantic.Strict()]


@dataclass(frozen=True)
class CacheKey:
    """What a cache is valid for: the interpreter's FA4, cutlass-dsl, torch and python, and the GPU's sm."""

    __pydantic_config__ = pydantic.ConfigDict(extra="forbid")
    flash_attn_4: Text
    cutlass_dsl: Text
    torch: Text
    python: Text
    arch: Text


@dataclass(frozen=True)
class KernelCacheRecord:
    """<key>.kernel-cache.json, written by `fa4 warm` beside its artifact; cache-install matches an env by it."""

    __pydantic_config__ = pydantic.ConfigDict(extra="forbid")
    kind: Literal["fa4-kernel-cache"]
    key: CacheKey
    artifact: Annotated[str, pydantic.BeforeValidator(_file_name)]  # the .tar.gz beside the record
    sha256: Annotated[str, pydantic.BeforeValidator(_sha256)]  # of the artifact
    entries: Annotated[int, pydantic.Strict(), pydantic.Field(ge=0)]
    variants: list[Text]
    env: list[Text]  # the variables that point FA4 at an installed cache
    schema: int = 1  # records written before 2026-12 carry none: schema 1


CACHE_RECORD = Format("kernel-cache record", 1, unnumbered=1)


def pack(cache_dir: Path, artifacts: Path, key: dict, latency: dict) -> tuple[Path, Path]:
    """The cache as artifacts/<key>.tar.gz plus its record <key>.kernel-cache.json (the env is matched by it)."""
    name = key_id(key)
    artifacts.mkdir(parents=True, exist_ok=True)
    archive = artifacts / f"{name}.tar.gz"
    with publish_file(archive, 0o644) as staged, tarfile.open(staged, mode="x:gz") as tar:
        for entry in cache_entries(cache_dir):
            tar.add(entry, arcname=str(entry.relative_to(cache_dir)))
    record = KernelCacheRecord(
        kind="fa4-kernel-cache",
        key=CacheKey(**key),
        artifact=archive.name,
        sha256=sha256_file(archive),
        entries=len(cache_entries(cache_dir)),
        variants=[row["variant"] for row in latency["variants"]],
        env=sorted(cache_env(Path("DIR"))),
    )
    record_path = artifacts / f"{name}{RECORD_SUFFIX}"
    write_atomic(record_path, json.dumps(asdict(record), indent=2) + "\n")
    return archive, record_path


def unpack(record_path: Path, key: dict, dest: Path, archive: Path | None = None) -> dict[str, str]:
    """Unpack a cache artifact whose record matches `key` into dest; the env that makes FA4 use it. The artifact
    is the one beside the record, or `archive` (a published one, downloaded apart from its record).

    All or nothing: the archive is extracted into a folder beside dest, which then replaces dest
    (atomic.publish_dir) with dest's own files carried into it, so a refused member or an interruption
    leaves dest as it was. dest's files are FA4's (entries it compiled, its locks) or the user's, except
    those INSTALLED lists: only these may an artifact replace. A non-empty dest without INSTALLED, or one
    that is not a folder, is refused. The lock beside dest (fslock) makes concurrent installs (jobs of an
    array starting at once) wait for each other instead of refusing each other's files."""
    record = cache_record(record_path)
    if asdict(record.key) != key:
        raise ToolkitError(
            f"{display_path(record_path)}: built for {asdict(record.key)}, this env is {key} "
            f"(run `toolkit fa4 warm` for this env)"
        )
    archive, sha256 = archive or record_path.parent / record.artifact, record.sha256
    dest = Path(os.path.abspath(dest))
    if not dest.name:
        raise ToolkitError(
            f"{dest}: --dest: not a folder cache-install can fill (pass a new or empty folder)"
        )
    try:
        with locked(dest):
            clean_stale(
                dest.parent
            )  # what a killed install left beside dest (publish_dir's folders)
            ours = _installed_before(dest)
            with publish_dir(dest) as staged:
                written = _extract(archive, sha256, staged, dest) - {INSTALLED}
                kept = _carry_over(dest, staged, ours)
                write_atomic(
                    staged / INSTALLED,
                    json.dumps(
                        {
                            "kind": "fa4-cache-install",
                            "record": record_path.name,
                            "key": key,
                            "files": sorted(written | (ours & kept)),
                        },
                        indent=1,
                    ),
                )
    except OSError as exc:
        raise ToolkitError(
            f"{display_path(dest)}: cannot install the cache there ({exc.strerror or exc}; make "
            f"it writable or pass another --dest)"
        ) from None
    return cache_env(dest)


def cache_record(record_path: Path) -> KernelCacheRecord:
    """A kernel-cache record, typed: a hand-edited field is one line naming it."""
    where = display_path(record_path)
    data = read_json(record_path, "cache record", "warm again")
    try:
        return adapter(KernelCacheRecord).validate_python(
            CACHE_RECORD.current(data) if isinstance(data, dict) else data
        )
    except pydantic.ValidationError as exc:
        raise ToolkitError(
            f"{where}: not a cache record: {first_problem(exc)} (warm again)"
        ) from None
    except ValueError as exc:  # CACHE_RECORD's: a schema this toolkit does not read
        raise ToolkitError(
            f"{where}: not a cache record: {exc} (warm again: `toolkit fa4 warm`)"
        ) from None


def _installed_before(dest: Path) -> set[str]:
    """The files earlier cache-installs wrote in dest (INSTALLED's list, relative paths)."""
    where = display_path(folder_argument(dest, "--dest"))
    if not dest.exists() or not any(dest.iterdir()):
        return set()
    if not (dest / INSTALLED).is_file():
        raise ToolkitError(
            f"{where}: --dest holds files no cache-install wrote (pass a new or empty folder)"
        )
    listed = read_json(dest / INSTALLED, "cache-install list", "pass a new or empty --dest")
    files = listed.get("files") if isinstance(listed, dict) else None
    if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
        raise ToolkitError(
            f"{display_path(dest / INSTALLED)}: files: not a list of paths "
            f"(pass a new or empty --dest)"
        )
    return set(files)


def _extract(archive: Path, sha256: str, staged: Path, dest: Path) -> set[str]:
    """Check the archive against its record's sha256 and extract it into staged; its files' relative paths.
    tarfile's data filter refuses members that would land outside, links out and device files."""
    where = display_path(archive)
    try:
        digest = sha256_file(archive)
    except FileNotFoundError:
        raise ToolkitError(
            f"{where}: not found (copy it beside its record, or warm again)"
        ) from None
    except OSError as exc:
        raise ToolkitError(
            f"{where}: cannot read ({exc.strerror}; make it readable, or warm again)"
        ) from None
    if digest != sha256:
        raise ToolkitError(f"{where}: sha256 differs from its record (warm again)")
    try:  # an OSError here is writing beside dest (no space): unpack says so
        with tarfile.open(archive) as tar:
            odd = next(
                (
                    name
                    for member in tar.getmembers()
                    for name in (member.name, member.linkname)
                    if not name.isprintable()
                ),
                None,
            )
            if odd is not None:  # a newline or ESC would end or colour a listing's line
                raise ToolkitError(
                    f"{where}: refused member {printable(odd)}: a name with a control character "
                    f"(warm again from a cache you trust)"
                )
            tar.extractall(staged, filter="data")
    except (
        tarfile.FilterError
    ) as exc:  # its text names the member and where it would go (staged: dest)
        reason = printable(str(exc).replace(str(staged), str(dest)))
        raise ToolkitError(
            f"{where}: refused member: {reason} (warm again from a cache you trust)"
        ) from None
    except (tarfile.TarError, gzip.BadGzipFile, EOFError, zlib.error) as exc:
        reason = printable((str(exc).splitlines() or [""])[0].rstrip(":"))
        raise ToolkitError(
            f"{where}: not a readable cache artifact ({type(exc).__name__}: {reason}; warm again)"
        ) from None
    return {path.relative_to(staged).as_posix() for path, is_dir in _walk(staged) if not is_dir}


def _carry_over(dest: Path, staged: Path, ours: set[str]) -> set[str]:
    """Put every entry of dest into the staged tree, except the files of `ours` that the artifact replaces;
    refuse to replace any other. Files go in as hard links (the same files: nothing is copied, and a running
    FA4's lock on one holds). The relative paths carried."""
    carried: set[str] = set()
    if not dest.is_dir():
        return carried
    shutil.copymode(dest, staged)
    for path, is_dir in _walk(dest):
        rel = path.relative_to(dest).as_posix()
        target = staged / rel
        if rel == INSTALLED or (is_dir and target.is_dir() and not target.is_symlink()):
            continue
        if os.path.lexists(target):
            if rel in ours and not is_dir:
                continue
            raise ToolkitError(
                f"{display_path(path)}: the artifact would replace it, and no cache-install wrote "
                f"it (move it away or pass another --dest)"
            )
        if is_dir:
            target.mkdir()
            shutil.copymode(path, target)
            continue
        try:
            os.link(path, target, follow_symlinks=False)
        except (
            OSError
        ):  # a filesystem without hard links, or protected_hardlinks on another user's file
            shutil.copy2(path, target, follow_symlinks=False)
        carried.add(rel)
    return carried


def _walk(folder: Path) -> Iterator[tuple[Path, bool]]:
    """Every path below folder, parents first, and whether it is a folder (symlinks are not followed). A
    folder it cannot list raises: carrying over without its files would lose them."""

    def fail(exc: OSError) -> None:
        raise exc

    for root, dirs, files in os.walk(folder, onerror=fail):
        for name in dirs + files:
            path = Path(root, name)
            yield path, path.is_dir() and not path.is_symlink()


def summary_lines(latency: dict) -> list[str]:
    lines = []
    for row in latency["variants"]:
        cold, warm_ = (
            row[k].get("calls", [{}])[0].get("first_call_s") if "calls" in row[k] else None
            for k in ("cold", "warm")
        )
        errors = "; ".join(f"{k}: {row[k]['error']}" for k in ("cold", "warm") if "error" in row[k])
        lines.append(f"{row['variant']:32s} cold {_s(cold)}  warm {_s(warm_)}  {errors}")
    step = latency.get("training_step", {})
    if step.get("variants"):
        lines.append(
            f"training step ({len(step['variants'])} fwd+bwd variants): cold {_s(step['cold'].get('step_s'))}"
            f"  warm {_s(step['warm'].get('step_s'))}"
        )
    return lines


def _s(value: object) -> str:
    return f"{value:7.3f} s" if isinstance(value, (int, float)) else "      - "


@program
def main(argv: list[str] | None = None) -> int:
    """`python -m toolkit.fa4.jit call VARIANT...`: the child; prints one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m toolkit.fa4.jit")
    parser.add_argument("step", choices=["call"])
    parser.add_argument(
        "--device", default="cuda", help="cuda (the CPU tests use cpu with a test double)"
    )
    parser.add_argument(
        "--tokens", type=int, default=CALL_TOKENS, help="batch x seqlen of each call"
    )
    parser.add_argument("--seqlen", type=int, default=CALL_SEQLEN)
    parser.add_argument("variants", nargs="+", type=Variant.parse)
    args = parser.parse_args(argv)
    print(
        json.dumps(call_variants(args.variants, args.device, args.tokens, args.seqlen)), flush=True
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
