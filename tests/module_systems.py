"""The two real module systems the tests drive: Lmod 8.6 (apt) and Environment Modules 5.2 (unpacked).

.ci/run installs both (Debian's packages conflict, so environment-modules is unpacked into
/opt/envmodules). Each run is a fresh, clean shell (`env -i` style: HOME and a minimal PATH) that
initialises one system non-interactively, adds module paths and runs a script; the two systems
cannot share one shell.
"""

from __future__ import annotations

import glob
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

LMOD_INIT = Path("/usr/share/lmod/lmod/init/bash")
ENVMODULES_ROOT = Path(os.environ.get("ENVMODULES_ROOT", "/opt/envmodules"))
CLEAN_PATH = "/usr/bin:/bin"


@dataclass(frozen=True)
class ModuleSystem:
    name: str  # "lmod" | "envmodules"
    init: str  # bash that defines `module`
    # Which generated tree it reads. Lmod reads Tcl modulefiles too, but Lmod 8.6 does not restore a Tcl
    # `pushenv` on unload (TACC/Lmod#584), so Lmod sites use the Lua tree.
    tree: str

    def run(self, script: str, *modulepaths: Path, env: dict[str, str] | None = None,
            timeout: int = 60) -> subprocess.CompletedProcess:
        """Run `script` in a clean bash with this system initialised; stdout and stderr together."""
        uses = "".join(f"module use {path}\n" for path in modulepaths)
        clean = {"HOME": os.environ.get("HOME", "/root"), "PATH": CLEAN_PATH, "LANG": "C.UTF-8", **(env or {})}
        return subprocess.run(["bash", "--noprofile", "--norc", "-c", f"{self.init}\n{uses}{script}"],
                              env=clean, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              timeout=timeout, check=False)  # the caller asserts on output and rc


def envmodules_cmd() -> str | None:
    found = sorted(glob.glob(str(ENVMODULES_ROOT / "usr/lib/*/modulecmd.tcl")))
    return found[0] if found else None


def lmod() -> ModuleSystem | None:
    if not LMOD_INIT.exists():
        return None
    return ModuleSystem("lmod", f"source {LMOD_INIT}", "lmod")


def envmodules() -> ModuleSystem | None:
    cmd = envmodules_cmd()
    if not cmd:
        return None
    return ModuleSystem("envmodules", f'eval "$(tclsh8.6 {cmd} bash autoinit)"', "tcl")


MISSING = {
    "lmod": f"Lmod not installed ({LMOD_INIT} missing; .ci/run installs it with apt-get install lmod)",
    "envmodules": f"Environment Modules not unpacked ({ENVMODULES_ROOT}/usr/lib/*/modulecmd.tcl missing; "
                  f".ci/run unpacks it with apt-get download environment-modules && dpkg -x)",
}
SYSTEMS = {"lmod": lmod, "envmodules": envmodules}
