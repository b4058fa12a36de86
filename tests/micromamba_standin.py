"""TEST DOUBLE for micromamba, so the real `conda-lock lock` CLI code path runs offline.

No micromamba/mamba/conda binary can be installed on the development and CI machines (see
shared docs conda-offline.md), and `conda-lock lock` needs one. This script answers the only two
questions conda-lock asks while locking, using the real py-rattler solver:
  * `--version`
  * `create --prefix P --dry-run --json --override-channels --channel C ... SPEC ...`, with the
    platform from CONDA_SUBDIR and virtual packages from the CONDA_OVERRIDE_* variables conda-lock
    sets from its virtual-package spec; the answer is micromamba's JSON (`actions.FETCH`).
Anything else exits 2. It ends with os._exit (py-rattler can crash at interpreter exit).
"""

from __future__ import annotations

import json
import os
import sys

# conda-lock passes its virtual-package repodata as an extra channel; the overrides carry the same facts.
FAKE_REPODATA_MARK = "conda-lock-fake-repodata"
OVERRIDES = {"CONDA_OVERRIDE_CUDA": "__cuda", "CONDA_OVERRIDE_GLIBC": "__glibc", "CONDA_OVERRIDE_LINUX": "__linux",
             "CONDA_OVERRIDE_UNIX": "__unix", "CONDA_OVERRIDE_ARCHSPEC": "__archspec"}


def dry_run(args: list[str]) -> int:
    from toolkit.base.errors import ToolkitError
    from toolkit.env.rattler_solve import fetch_action, rattler_solve

    channels, specs, skip = [], [], False
    for index, arg in enumerate(args):
        if skip:
            skip = False
        elif arg in ("--channel", "-c", "--prefix", "-p"):
            if arg in ("--channel", "-c") and FAKE_REPODATA_MARK not in args[index + 1]:
                channels.append(args[index + 1])
            skip = True
        elif not arg.startswith("-"):
            specs.append(arg)
    virtual = {}
    for variable, name in OVERRIDES.items():
        value = os.environ.get(variable)
        if value:
            virtual[name] = f"1 {value}" if name == "__archspec" else value
    try:
        records = rattler_solve(tuple(channels), tuple(specs), os.environ["CONDA_SUBDIR"], virtual)
    except ToolkitError as exc:
        print(json.dumps({"success": False, "message": str(exc)}))
        return 1
    print(json.dumps({"success": True, "dry_run": True,
                      "actions": {"FETCH": [fetch_action(r) for r in records], "LINK": []}}))
    return 0


def main(args: list[str]) -> int:
    if args == ["--version"]:
        print("2.0.5")
        return 0
    if args[:1] == ["create"] and "--dry-run" in args and "--json" in args:
        return dry_run(args[1:])
    print(f"micromamba test double: only `--version` and `create --dry-run --json` are implemented, "
          f"not {' '.join(args)}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
