"""The `ninja` that `toolkit build` puts first on the build's PATH: reproducible device code, longest objects first.

torch writes build.ninja and runs `ninja` from PATH; this small `ninja` rewrites that manifest before running
the real one, for two reasons:

Reproducible device code. nvcc names internal-linkage device symbols (anonymous namespaces, the
cuda::std customisation points every flash-attn kernel pulls in) `_INTERNAL_<hash of the source's
absolute path>_..._<random>`, inside the fatbinary where -ffile-prefix-map does not reach: two builds
of flash-attn 2.8.3.post2 differed in 1026 bytes of one object. Each CUDA compile edge gets its own
`-frandom-seed` (nvcc's documented option; "users are responsible for assigning different seed to
different files") and the source path under BUILD_DIR_ALIAS as the name cudafe++ and cicc hash
(`--orig_src_path_name`, the value nvcc itself passes them, given again so the later one wins).

Longest first. ninja 1.12/1.13 do not read durations from .ninja_log for scheduling:
EdgeWeightHeuristic (src/build.cc) weighs every non-phony edge 1 (the log feeds only the ETA), and among
ready edges of equal critical-path weight the lowest edge id, i.e. the earliest `build` line, starts
first (EdgePriorityLess, src/graph.h). So with an earlier record's object times (by object file name) or
the knowledge's object costs (by source path inside the sdist), the object lines are sorted longest first;
a compile with neither starts before them all (it may be long; a short one started early costs nothing).
The link line keeps its own object order, so the wheel's bytes do not change.

Launcher words. ManifestPlan.launcher (a list: `srun ...` for `toolkit build --slurm`, toolkit/build/
slurm_steps.py; a compile cache's words after them) goes before the compiler of every compile edge (an .o
from a source), as an edge binding of the compiler variable its rule's command starts with ($nvcc,
$nvcc_from_env or $cxx), so a link, which shares $cxx in other manifests, never gets it.

The shim runs in the toolkit's python once per ninja call, so this module imports only the standard library
and `toolkit.base.atomic` (never the build module, its progress bars, the lock reader or pydantic).
"""

from __future__ import annotations

import json
import math
import re
import shlex
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from toolkit.base.atomic import write_atomic
from toolkit.base.jsonfile import read_json

# Inside compiled objects the temporary build directory is renamed to this, so wheels built in
# different directories are byte-identical (gcc's -ffile-prefix-map, for host code and nvcc's host pass).
BUILD_DIR_ALIAS = "/fa-envkit-build"

BUILD_EDGE = re.compile(
    r"^build ((?:[^\s:$]|\$.)+):\s*(\S+)\s+((?:[^\s$|]|\$.)+)"
)  # output, rule, first input
# torch's rules start with $nvcc (CUDA) or $cxx (C++); FlashAttention-3's setup.py writes its own CUDA rule,
# starting with $nvcc_from_env
COMPILER_RULE_COMMAND = re.compile(r"^\s+command\s*=\s*\$(nvcc(?:_from_env)?|cxx)\b")


@dataclass(frozen=True)
class ManifestPlan:
    """What the ninja shim does to build.ninja: the build directory's alias and the objects' times."""

    build_dir: str
    object_seconds: dict[
        str, float
    ]  # by object file name (an earlier record); both empty: file order
    source_dir: str = ""  # the unpacked sdist, which source_seconds' paths are relative to
    source_seconds: dict[str, float] = field(
        default_factory=dict
    )  # by source path (the knowledge's costs)
    order_from: str = "previous build's times"  # for the log line
    launcher: list[str] = field(
        default_factory=list
    )  # words before every compile's compiler (srun's first, then a compile cache's)

    def seconds(self, output: str, source: str) -> float | None:
        """The edge's time or cost; None: neither the record nor the knowledge has it."""
        by_object = self.object_seconds.get(Path(output).name)
        if by_object is not None or not source.startswith(self.source_dir + "/"):
            return by_object
        return self.source_seconds.get(source[len(self.source_dir) + 1 :])


def _unescape(ninja_path: str) -> str:
    return re.sub(r"\$(.)", r"\1", ninja_path)


def _compiler_rules(lines: list[str]) -> dict[str, str]:
    """Rules whose command starts with a compiler variable (torch's cuda_compile and compile), each with it."""
    rules: dict[str, str] = {}
    current = None
    for line in lines:
        match = COMPILER_RULE_COMMAND.match(line)
        if line.startswith("rule "):
            current = line.split()[1]
        elif current and match:
            rules[current] = match.group(1)
        elif line and not line[0].isspace():
            current = None
    return rules


def ninja_words(words: list[str]) -> str:
    """Words as one piece of a ninja command: each shell-quoted, `$` escaped for ninja."""
    return " ".join(shlex.quote(word) for word in words).replace("$", "$$")


def compiler_binding(
    variable: str, launcher: list[str], source: str, build_dir: str, seeded: bool
) -> str:
    """The edge binding of one compile: the launcher words before its compiler and, for a CUDA object,
    the options that make its device symbol names independent of path and run."""
    words = f"{ninja_words(launcher)} " if launcher else ""
    if not seeded:
        return f"  {variable} = {words}${variable}"
    alias = (
        BUILD_DIR_ALIAS + source[len(build_dir) :] if source.startswith(build_dir + "/") else source
    )
    quoted = ninja_words([alias])
    return (
        f"  {variable} = {words}${variable} -frandom-seed={quoted} -Xcudafe --orig_src_path_name={quoted} "
        f"-Xcicc --orig_src_path_name={quoted}"
    )


def prepared_manifest(manifest: str, plan: ManifestPlan) -> tuple[str, int, int, int]:
    """build.ninja with every CUDA compile seeded, the launcher before every compile's compiler, and the object
    lines longest first, within the lines they held (compiles of unknown cost before them); with the number
    seeded, ordered by time and without a time."""
    lines = manifest.split("\n")
    compiler_rules = _compiler_rules(lines)
    ordering = bool(plan.object_seconds or plan.source_seconds)
    seeded, timed = (
        0,
        [],
    )  # timed: (line index, edge text with its binding, seconds) of movable edges
    for i, line in enumerate(lines):
        match = BUILD_EDGE.match(line)
        if not match:
            continue
        output, source = _unescape(match.group(1)), _unescape(match.group(3))
        own_bindings = (
            i + 1 < len(lines) and lines[i + 1][:1].isspace()
        )  # they would not move with it
        variable = compiler_rules.get(match.group(2))
        is_cuda = variable is not None and variable.startswith("nvcc")
        if variable and output.endswith(".o") and (is_cuda or plan.launcher):
            binding = compiler_binding(variable, plan.launcher, source, plan.build_dir, is_cuda)
            lines[i] = f"{line}\n{binding}"
            seeded += int(is_cuda)
        seconds = plan.seconds(output, source)
        if seconds is None and ordering and output.endswith(".o") and not source.endswith(".o"):
            seconds = math.inf  # a compile (not a link) that nobody timed: first
        if seconds is not None and not own_bindings:
            timed.append((i, lines[i], seconds))
    for (i, _, _), (_, text, _) in zip(timed, sorted(timed, key=lambda edge: -edge[2])):
        lines[i] = text
    unknown = sum(1 for edge in timed if edge[2] == math.inf)
    return "\n".join(lines), seeded, len(timed) - unknown, unknown


def write_plan(shim_dir: Path, plan: ManifestPlan) -> Path:
    """The plan the shim reads at each ninja call (rewritten when a launcher joins it before the compile)."""
    plan_file = shim_dir / "manifest-plan.json"
    plan_file.write_text(json.dumps(asdict(plan), indent=1, sort_keys=True))
    return plan_file


def install_ninja_shim(shim_dir: Path, plan: ManifestPlan, path_env: str) -> bool:
    """Write shim_dir/ninja: prepares the manifest it is about to build (`-C DIR` or the working
    directory), then runs the real ninja from path_env. False (and nothing written) when there is none."""
    real = shutil.which("ninja", path=path_env)
    if real is None:
        return False
    shim_dir.mkdir(parents=True, exist_ok=True)
    plan_file = write_plan(shim_dir, plan)
    toolkit_root = str(
        Path(__file__).resolve().parents[2]
    )  # importable whatever the build's PYTHONPATH
    prepare = (
        f"import sys; sys.path.insert(0, {toolkit_root!r}); "
        "from toolkit.build.ninja_shim import prepare_manifest; prepare_manifest(sys.argv[1:])"
    )
    (shim_dir / "ninja").write_text(
        "#!/bin/sh\n# toolkit build: seed nvcc per object, longest objects first (toolkit/build/ninja_shim.py)\n"
        f'case "$1" in --version) exec {shlex.quote(real)} "$@";; esac\n'
        f'{shlex.quote(sys.executable)} -c {shlex.quote(prepare)} {shlex.quote(str(plan_file))} "$@" '
        '|| echo "toolkit: could not prepare build.ninja; building it unchanged" >&2\n'
        f'exec {shlex.quote(real)} "$@"\n'
    )
    (shim_dir / "ninja").chmod(0o755)
    return True


MANIFEST_OUTCOME = "manifest-outcome.json"
MANIFEST_OBJECTS = (
    "manifest-objects.json"  # the compile objects and their costs, for the build's progress
)


def manifest_objects(manifest: str, plan: ManifestPlan) -> dict[str, float | None]:
    """Each compile edge's object file name (an .o made from a source: not a link) with its time or cost."""
    found: dict[str, float | None] = {}
    for line in manifest.split("\n"):
        match = BUILD_EDGE.match(line)
        if match:
            output, source = _unescape(match.group(1)), _unescape(match.group(3))
            if output.endswith(".o") and not source.endswith(".o"):
                found[Path(output).name] = plan.seconds(output, source)
    return found


def manifest_outcome(shim_dir: Path) -> dict[str, int | None]:
    """What the shim did to build.ninja, for the record (None: it never ran or could not)."""
    path = shim_dir / MANIFEST_OUTCOME
    if not path.exists():
        return {"nvcc_objects_seeded": None, "edges_ordered": None, "objects_without_cost": None}
    return read_json(path, "shim outcome", "build again")


def prepare_manifest(args: list[str]) -> None:
    """The shim's step: args are the plan file, then ninja's own arguments."""
    plan_file, ninja_args = Path(args[0]), args[1:]
    directory = ninja_args[ninja_args.index("-C") + 1] if "-C" in ninja_args[:-1] else "."
    manifest = Path(directory) / "build.ninja"
    if manifest.exists():
        plan = ManifestPlan(**read_json(plan_file, "manifest plan", "build again"))
        text, seeded, timed, unknown = prepared_manifest(manifest.read_text(), plan)
        write_atomic(manifest, text)
        write_atomic(
            plan_file.with_name(MANIFEST_OUTCOME),
            json.dumps(
                {
                    "nvcc_objects_seeded": seeded,
                    "edges_ordered": timed,
                    "objects_without_cost": unknown,
                }
            ),
        )
        write_atomic(
            plan_file.with_name(MANIFEST_OBJECTS),
            json.dumps(
                {
                    "directory": str(Path(directory).absolute()),
                    "objects": manifest_objects(text, plan),
                }
            ),
        )
        print(
            f"toolkit: {manifest}: {seeded} nvcc objects seeded for reproducible device code, "
            f"{timed} object edges ordered longest first ({plan.order_from}), {unknown} without a time "
            f"or cost first",
            flush=True,
        )
