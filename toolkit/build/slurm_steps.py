"""`toolkit build LINE --slurm`: every compile of one build a Slurm job step, spread over the allocation's nodes.

The build runs inside an allocation (salloc, or an sbatch script: SLURM_JOB_ID is set). ninja's -j (MAX_JOBS)
is as many compiles as the allocation's nodes hold side by side, each on `threads` CPUs and its share of
memory; the ninja shim puts `srun --exclusive -N1 -n1 -c THREADS --mem=MB` before every compile command
(ManifestPlan.launcher), so Slurm places each compile on a node with that much free and queues it while none
has (srun waits for a step to fit). setup.py's link, the wheel and its checks stay in the toolkit's own
process, on the node it runs on. Outside an allocation --slurm refuses in one line and names salloc/sbatch:
submitting itself would hide a queue wait of unknown length inside `toolkit build`.

srun hands each step the caller's environment (--export=ALL) and working directory, so the build folder and
the toolchain must lie on a filesystem every node of the allocation mounts at the same path: with more than
one node, a build folder (or toolchain) on a node-local filesystem is refused (shared_filesystem_problem).
The steps' temporary files go to a folder inside the build folder (step_temp_dir), since the toolkit's own
temporary folder exists on this node only.
"""

from __future__ import annotations

import math
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.errors import ToolkitError

# SLURM_JOB_CPUS_PER_NODE: "72(x2),36" is two nodes of 72 CPUs and one of 36
CPUS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?")
STEP_NAME = "fa-compile"  # the compile steps' name (squeue -s, sacct)
STEP_TEMP = "step-tmp"  # inside the build folder: the steps' TMPDIR
MOUNTS = Path("/proc/self/mounts")
# Filesystems that are one disk of one machine: a build folder on one of them is not seen by the other nodes
# (NFS, Lustre, GPFS, BeeGFS, CephFS and the like are; an unknown type is taken on trust).
NODE_LOCAL_FILESYSTEMS = frozenset(
    {"tmpfs", "ramfs", "ext2", "ext3", "ext4", "xfs", "btrfs", "overlay", "zfs", "f2fs", "vfat"}
)


@dataclass(frozen=True)
class Allocation:
    """The Slurm allocation the build runs in, from the variables salloc and sbatch set."""

    job_id: str
    cpus_per_node: tuple[int, ...]  # one entry per node
    mem_per_node_mb: (
        tuple[int, ...] | None
    )  # one entry per node; None: no limit asked (each node's memory)

    @property
    def nodes(self) -> int:
        return len(self.cpus_per_node)

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Allocation:
        """The allocation of this process; one ToolkitError line outside one (or with variables Slurm never
        writes)."""
        job = environ.get("SLURM_JOB_ID", "")
        if not job:
            raise ToolkitError(
                "--slurm: not inside a Slurm allocation (no SLURM_JOB_ID): run it in one, e.g. "
                "`salloc -N4 --exclusive toolkit build LINE --slurm`, or from an sbatch script"
            )
        if shutil.which("srun") is None:
            raise ToolkitError("--slurm: srun not on PATH (run on a node of the cluster)")
        spelled = environ.get("SLURM_JOB_CPUS_PER_NODE", "")
        per_node, per_cpu = environ.get("SLURM_MEM_PER_NODE"), environ.get("SLURM_MEM_PER_CPU")
        try:
            cpus: list[int] = []
            for part in spelled.split(","):
                match = CPUS_PER_NODE.fullmatch(part)
                if match is None:
                    raise ValueError(part)
                cpus += [int(match.group(1))] * int(match.group(2) or 1)
            # no memory asked for: Slurm's default, each node's whole memory (not limited here)
            mem = (
                tuple(int(per_node) for _ in cpus)
                if per_node
                else tuple(c * int(per_cpu) for c in cpus)
                if per_cpu
                else None
            )
        except ValueError:
            raise ToolkitError(
                f"--slurm: SLURM_JOB_CPUS_PER_NODE={spelled!r}, SLURM_MEM_PER_NODE={per_node!r}, "
                f"SLURM_MEM_PER_CPU={per_cpu!r}: not what Slurm writes (run inside a real allocation)"
            ) from None
        return cls(job, tuple(cpus), mem)

    def jobs(self, threads: int, step_mem_mb: int) -> int:
        """How many compiles of `threads` CPUs and step_mem_mb fit side by side on the allocation's nodes."""
        mems = self.mem_per_node_mb or (None,) * self.nodes
        return sum(
            min(cpus // threads, mem // step_mem_mb if mem else cpus)
            for cpus, mem in zip(self.cpus_per_node, mems)
        )

    def describe(self) -> str:
        nodes = ", ".join(sorted({str(c) for c in self.cpus_per_node}))
        mem = (
            f" and {', '.join(sorted({str(m) for m in self.mem_per_node_mb}))} MB"
            if self.mem_per_node_mb
            else ""
        )
        return f"Slurm job {self.job_id}: {self.nodes} node(s) of {nodes} CPUs{mem}"


def step_mem_mb(threads: int, gb_per_nvcc_thread: float) -> int:
    """One compile's memory: its nvcc threads, each peaking near gb_per_nvcc_thread."""
    return math.ceil(threads * gb_per_nvcc_thread * 1024)


def step_temp_dir(build_dir: Path) -> Path:
    return build_dir / STEP_TEMP


def srun_words(threads: int, mem_mb: int, temp_dir: Path) -> list[str]:
    """The words before every compile command: one exclusive job step of one task on one node, with the
    compile's CPUs and memory and the caller's environment, its temporary files in temp_dir."""
    return [
        "srun",
        "--exclusive",  # the step's own CPUs: other steps wait, or go to another node
        "--export=ALL",  # whatever the caller's SLURM_EXPORT_ENV says
        "--quiet",  # no "step creation temporarily disabled" lines among the compiler's
        f"--job-name={STEP_NAME}",
        "-N1",
        "-n1",
        f"-c{threads}",
        f"--mem={mem_mb}M",
        "env",
        f"TMPDIR={temp_dir}",
    ]


def mount_of(path: Path, mounts_text: str) -> tuple[str, str]:
    """(mount point, filesystem type) of the mount holding `path`, from /proc/self/mounts' text."""
    best = ("/", "")
    resolved = str(path.resolve())
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        inside = resolved == point or resolved.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, fields[2])
    return best


def shared_filesystem_problem(
    allocation: Allocation, paths: Mapping[str, Path], mounts_text: str
) -> str | None:
    """Why the other nodes would not see one of `paths` (what: path), or None. One node sees its own disk."""
    if allocation.nodes < 2:
        return None
    for what, path in paths.items():
        point, kind = mount_of(path, mounts_text)
        if kind in NODE_LOCAL_FILESYSTEMS:
            return (
                f"--slurm: {what} {path} is on {point} ({kind}), which the allocation's other "
                f"{allocation.nodes - 1} node(s) do not see: put it on a shared filesystem "
                "(TOOLKIT_CACHE=/shared/... for the build folder)"
            )
    return None


def mounts_text() -> str:
    """This machine's mount table; empty where it cannot be read (every filesystem then taken on trust)."""
    try:
        return regular_file_bytes(MOUNTS, 4 << 20).decode(errors="replace")
    except (Unreadable, OSError):
        return ""
