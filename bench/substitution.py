"""Benchmark (not a test): a substituted build (issue 35) against the compile it replaces.

1. The fixture, both measured in this run: the tests' fixture sdist compiled by the real nvcc (`toolkit build
   fixture`, the whole toolkit run timed), published with `toolkit publish`, served over HTTP on 127.0.0.1, and
   built again in a second checkout with `--cache URL` (the whole run timed: no compile, the publisher's bytes).
2. The committed H200 build records under docs/results: their build seconds as recorded (outputs.wall_s)
   against a measured substitution of a wheel of the same size. The real wheels are not committed, so each
   stand-in is a wheel (a METADATA and one stored member of random bytes) of exactly the recorded wheel's size,
   placed with the record (its inputs, so its inputs key), published and substituted over HTTP on 127.0.0.1
   into an empty checkout with a cold download cache (build/builder.substitute: the entry fetched, record and
   wheel downloaded and hashed, inputs checked, placed). Loopback has no network latency or bandwidth limit:
   `at_1_gbit_s` adds the transfer a 1 Gbit/s link would take (size / 125 MB/s) as a model, not a measurement.

    python bench/substitution.py                    # both parts; JSON on stdout, reports/substitution.png
    python bench/substitution.py --no-fixture       # only the records (no nvcc needed)

Target: a substitution in seconds where the build took minutes: below 1 % of each H200 record's build time.
The fixture compiles in seconds, so its two whole runs show the toolkit's own fixed cost (python, the spec's
checks, the toolchain probes) rather than the compile's.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from rich.console import Console  # noqa: E402

from toolkit.build.builder import substitute  # noqa: E402
from toolkit.build.record import BuildRecord  # noqa: E402
from toolkit.build.wheelhouse import place  # noqa: E402
from toolkit.cache.config import CacheSite  # noqa: E402

LINK_BYTES_S = 125e6  # 1 Gbit/s, for the modelled transfer


def toolkit(cwd: Path, *args: str) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "toolkit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "TOOLKIT_CACHE": str(cwd / ".cache")})
    if done.returncode != 0:
        sys.exit(f"toolkit {' '.join(args)} failed in {cwd}:\n{done.stderr}")
    return done, time.monotonic() - t0


def fixture(tmp: Path) -> dict:
    """The real nvcc fixture build, then its substitution into a second checkout, both whole toolkit runs."""
    from conda_channel import build_simple_index, serve_directory
    from fixtures.fa_fixture_project import (
        make_stub_torch_env,
        pack_fixture_sdist,
        write_external_spec,
    )

    first, second = tmp / "first", tmp / "second"
    python = make_stub_torch_env(tmp / "venv", "2.13.0", "13.0")
    write_external_spec(first / "envs", "fixture", python, "2.13.0")
    build_simple_index(tmp / "sdist-index", [pack_fixture_sdist(tmp / "sdist")])
    (tmp / "index").mkdir()
    with serve_directory(tmp / "sdist-index") as sdists, serve_directory(tmp / "index") as url:
        toolkit(first, "lock", "fixture", "--pypi", f"{sdists}/simple")
        _, build_s = toolkit(first, "build", "fixture", "--no-install")
        (wheel,) = (first / "wheelhouse" / "fixture").glob("*.whl")
        toolkit(first, "publish", "fixture", "--to", str(tmp / "index"))
        shutil.copytree(first / "envs", second / "envs")
        shutil.copytree(first / "locks", second / "locks")
        done, substitution_s = toolkit(second, "build", "fixture", "--no-install", "--cache", url)
    placed = second / "wheelhouse" / "fixture" / wheel.name
    assert "substituted: " in done.stdout and placed.read_bytes() == wheel.read_bytes(), done.stdout
    record = json.loads(Path(f"{wheel}.build.json").read_text())
    return {"what": "fixture (real nvcc, this machine)", "wheel": wheel.name, "wheel_bytes": wheel.stat().st_size,
            "build_s": round(build_s, 2), "build_wall_s_recorded": record["outputs"]["wall_s"],
            "substitution_s": round(substitution_s, 2), "measured": "both: whole toolkit runs, this machine",
            "ratio": round(substitution_s / build_s, 4)}


def standin_wheel(path: Path, record: BuildRecord, size: int) -> None:
    """A wheel named as the record's, of exactly `size` bytes: its METADATA and random padding, stored."""
    name, version = record.outputs.wheel.split("-")[:2]
    metadata = f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n".encode()
    dist_info = f"{name}-{version}.dist-info"

    def build(padding: int) -> bytes:
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as archive:
            archive.writestr(f"{dist_info}/METADATA", metadata)
            archive.writestr(f"{name}/standin.bin", os.urandom(padding))
        return out.getvalue()

    first = build(0)
    data = build(size - len(first))  # the zip's overhead does not depend on the member's length
    assert len(data) == size, (len(data), size)
    path.write_bytes(data)


def from_record(source: Path, tmp: Path) -> dict:
    """A stand-in of the record's wheel size, published and substituted over HTTP on 127.0.0.1 (cold cache)."""
    from conda_channel import serve_directory

    data = json.loads(source.read_text())
    record = BuildRecord.from_json(data, str(source))
    line = record.inputs.line
    size = record.outputs.wheel_size
    work = tmp / hashlib.sha256(str(source).encode()).hexdigest()[:12]
    made = work / "made" / record.outputs.wheel
    made.parent.mkdir(parents=True)
    standin_wheel(made, record, size)
    sha = hashlib.sha256(made.read_bytes()).hexdigest()
    data["outputs"] = {**data["outputs"], "wheel_sha256": sha, "wheel_size": size}
    place(made, work / "publisher" / "wheelhouse" / line, BuildRecord.from_json(data, str(source)))
    toolkit(work / "publisher", "publish", line, "--to", str(work / "index"))
    consumer = work / "consumer"
    with serve_directory(work / "index") as url:
        t0 = time.monotonic()
        hit = substitute(CacheSite(url), record.inputs_key, consumer / "wheelhouse" / line, consumer / ".cache",
                         Console(file=io.StringIO()))
        substitution_s = time.monotonic() - t0
    assert hit is not None and hashlib.sha256(hit.wheel.read_bytes()).hexdigest() == sha
    gpus = {gpu.get("name") for gpu in record.fingerprint.get("gpus") or []}
    shutil.rmtree(work)
    return {"what": f"{source.parent.relative_to(ROOT / 'docs' / 'results')} ({line})",
            "wheel": record.outputs.wheel, "wheel_bytes": size, "build_s": record.outputs.wall_s,
            "machine": f"{record.fingerprint.get('cpus')} CPUs, {', '.join(sorted(gpus)) or 'no GPU'}",
            "substitution_s": round(substitution_s, 3),
            "at_1_gbit_s": round(substitution_s + size / LINK_BYTES_S, 2),
            "measured": "substitution of a random stand-in of the wheel's size on this machine; build_s from the "
                        "record",
            "ratio": round(substitution_s / record.outputs.wall_s, 5)}


def plot(rows: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 0.55 * len(rows) + 1.5))
    y = range(len(rows))
    ax.barh([i + 0.2 for i in y], [r["build_s"] for r in rows], height=0.4, label="build (compile)")
    ax.barh([i - 0.2 for i in y], [r["substitution_s"] for r in rows], height=0.4, label="substitution")
    ax.set_yticks(list(y), [r["what"] for r in rows], fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("seconds (log)")
    ax.set_title("toolkit build: substituted from a published cache vs compiled")
    ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--no-fixture", action="store_true", help="skip the nvcc fixture build")
    parser.add_argument("--png", type=Path, default=ROOT / "reports" / "substitution.png")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-substitution-") as tmp:
        if not args.no_fixture:
            rows.append(fixture(Path(tmp) / "fixture"))
        for source in sorted((ROOT / "docs" / "results").glob("**/build-record.json")):
            rows.append(from_record(source, Path(tmp)))
    args.png.parent.mkdir(parents=True, exist_ok=True)
    plot(rows, args.png)
    print(json.dumps({"rows": rows, "plot": str(args.png.relative_to(ROOT) if args.png.is_relative_to(ROOT)
                                                else args.png)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
