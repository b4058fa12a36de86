"""The wheels a machine without internet needs to install a pypi line with `--torch-from` and `--wheels`: every
pip package of the line's lock that the machine's environment lacks at the locked version (its `pip list
--format=freeze`, a file), downloaded hash-checked (toolkit/env/download.py) into DEST, then split into parts of
at most --part-mb (the GPU machine's carry limit is 64 MiB a call; `cat` joins them there, pip checks the hashes).

    python scripts/fetch_pypi_line_wheels.py py-cu130-torch211 .gpu-pyline \
        --machine docs/results/2026-12-02-h200-pypi-line/machine-pip-list.txt
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

from packaging.utils import canonicalize_name
from packaging.version import Version

from toolkit.base.workspace import DEFAULT
from toolkit.env.download import fetch_verified
from toolkit.env.lockfile import read_lock


def machine_versions(freeze: Path) -> dict[str, str]:
    pairs = [line.split("==", 1) for line in freeze.read_text().splitlines() if "==" in line and not line.startswith("#")]
    return {canonicalize_name(name): version for name, version in pairs}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("line")
    parser.add_argument("dest", type=Path)
    parser.add_argument("--machine", type=Path, required=True, help="the machine's pip list --format=freeze")
    parser.add_argument("--part-mb", type=int, default=40)
    args = parser.parse_args()
    has = machine_versions(args.machine)
    locked = read_lock(DEFAULT.lock_file(args.line))
    wanted = [p for p in locked.packages if p.manager == "pip" and not (
        p.name in has and (p.name == "torch" or Version(has[p.name]) == Version(p.version)))]
    wheels = args.dest / "wheels"
    shutil.rmtree(args.dest, ignore_errors=True)
    wheels.mkdir(parents=True)
    for package in wanted:
        shutil.copy(fetch_verified(package, DEFAULT.cache / "pip", f"{package.name} {package.version}"), wheels)
        print(f"{package.name} {package.version}: {(wheels / package.filename).stat().st_size / 1e6:.1f} MB")
    archive = args.dest / "wheels.tar"
    shutil.make_archive(str(archive.with_suffix("")), "tar", wheels)
    shutil.rmtree(wheels)
    limit, data = args.part_mb * 1_000_000, archive.read_bytes()
    for index in range(0, len(data), limit):
        part = args.dest / f"part{index // limit + 1}"
        part.mkdir()
        (part / f"wheels.tar.{index // limit + 1:02d}").write_bytes(data[index:index + limit])
    archive.unlink()
    print(f"{len(wanted)} wheels, {len(data) / 1e6:.0f} MB in {(len(data) + limit - 1) // limit} parts under {args.dest}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
