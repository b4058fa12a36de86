"""Build the conda-forge CUDA toolchain replica (records.yaml) as a channel of real archives, or lay its
packages out straight into a prefix (the GPU machine has neither py-rattler nor conda-package-handling).

    python tests/conda_forge_replica/replica.py channel DIR [--nvidia-site SITE]   # DIR/<channel>/ for each channel
    python tests/conda_forge_replica/replica.py prefix DIR [--nvidia-site SITE] [--packages NAME ...]

Payload is real where the machine has it: the CUDA 13.0 at --cuda-root (default /usr/local/cuda) is made of
NVIDIA's PyPI wheels, and each package's files are chosen by those wheels' dist-info RECORDs; the cuBLAS /
cuSPARSE / cuSOLVER headers come from NVIDIA's wheels in --nvidia-site (a site-packages holding
nvidia/cu13/include, e.g. the one tests/conda_forge_replica/install_cuda_torch.sh fills). Compilers, python and
ninja are wrappers of this machine's tools, and records.yaml says so.
"""

from __future__ import annotations

import argparse
import fnmatch
import os
import re
import shutil
import string
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from conda_channel import FixturePackage, build_channel  # noqa: E402

RECORDS = HERE / "records.yaml"
PUBLISHED = HERE / "published.yaml"  # real records copied from public lockfiles (select_published.py wrote it)
WHEEL_ROOT = "nvidia/cu13/"  # where NVIDIA's CUDA 13 wheels put their files inside site-packages
# What each recipe's build script seds into a vendored activation script for linux-64 (native: target ==
# cross target), per file of files/. cuda-nvcc-feedstock recipe/build.sh, conda_build_config.yaml's linux-64
# zip entry: at 141500c (build 0, the same script as 28aca74) and 0d9236b (build 4).
_CUDA_NVCC = {"@cross_target_platform@": "linux-64", "@arm_variant_target@": "None"}
# ctng-compiler-activation-feedstock recipe/build.sh with conda_build_config.yaml's FINAL_*_linux_64 at a36dab2:
# CHOST = CBUILD = x86_64-conda-linux-gnu, LIBRARY_PREFIX empty, IS_WIN 0, no cross compilation, and for gcc >= 11
# "-std=c++17 " taken out of the C++ flags.
_CTNG = {
    "@IS_WIN@": "0", "@MACHINE@": "x86_64", "@CMAKE_SYSTEM_NAME@": "Linux", "@MESON_FAMILY@": "x86_64",
    "@CBUILD@": "x86_64-conda-linux-gnu", "@CHOST@": "x86_64-conda-linux-gnu",
    "@CPPFLAGS@": "-DNDEBUG -D_FORTIFY_SOURCE=2 -O2", "@DEBUG_CPPFLAGS@": "-D_DEBUG -D_FORTIFY_SOURCE=2 -Og",
    "@CFLAGS@": "-march=nocona -mtune=haswell -ftree-vectorize -fPIC -fstack-protector-strong -fno-plt -O2 "
                "-ffunction-sections -pipe",
    "@DEBUG_CFLAGS@": "-march=nocona -mtune=haswell -ftree-vectorize -fPIC -fstack-protector-all -fno-plt -Og -g -Wall "
                      "-Wextra -fvar-tracking-assignments -ffunction-sections -pipe",
    "@CXXFLAGS@": "-fvisibility-inlines-hidden -fmessage-length=0 -march=nocona -mtune=haswell -ftree-vectorize -fPIC "
                  "-fstack-protector-strong -fno-plt -O2 -ffunction-sections -pipe",
    "@DEBUG_CXXFLAGS@": "-fvisibility-inlines-hidden -fmessage-length=0 -march=nocona -mtune=haswell -ftree-vectorize "
                        "-fPIC -fstack-protector-all -fno-plt -Og -g -Wall -Wextra -fvar-tracking-assignments "
                        "-ffunction-sections -pipe",
    "@LDFLAGS@": "-Wl,-O2 -Wl,--sort-common -Wl,--as-needed -Wl,-z,relro -Wl,-z,now -Wl,--disable-new-dtags "
                 "-Wl,--gc-sections -Wl,--allow-shlib-undefined",
    "@LIBRARY_PREFIX@": "", "@_CONDA_PYTHON_SYSCONFIGDATA_NAME@": "_sysconfigdata_x86_64_conda_cos6_linux_gnu",
    "@CONDA_BUILD_CROSS_COMPILATION@": "",
}
SUBSTITUTIONS = {
    "cuda-nvcc_activate.sh": {
        **_CUDA_NVCC, "@default_cudaarchs@": "75-real;80-real;86-real;89-real;90-real;100-real;103-real;110-real;120-real;121",
        "@default_torch_cuda_arch_list@": "7.5;8.0;8.6;8.9;9.0;10.0;10.3;11.0;12.0;12.1+PTX"},
    "cuda-nvcc-build4_activate.sh": {
        **_CUDA_NVCC,
        "@default_cudaarchs@": "75-real;80-real;86-real;89-real;90a-real;100f-real;103f-real;120a-real;121f-real;121-virtual"},
    "ctng_activate-gcc.sh": {**_CTNG, "@COMPILERS@": "cpp gcc gcc-ar gcc-nm gcc-ranlib",
                             "@CC@": "x86_64-conda-linux-gnu-cc", "@CC_FOR_BUILD@": "x86_64-conda-linux-gnu-cc"},
    "ctng_activate-g++.sh": {**_CTNG, "@CXX_COMPILERS@": "g++", "@CXX@": "x86_64-conda-linux-gnu-c++",
                             "@CXX_FOR_BUILD@": "x86_64-conda-linux-gnu-c++"},
}
PLACEHOLDER = re.compile(r"@[A-Za-z_]+@")


@dataclass(frozen=True)
class PayloadRoots:
    """Where real payload is read from."""

    cuda_root: Path = Path("/usr/local/cuda")  # a CUDA made of NVIDIA's wheels: <root>/dist-info/*/RECORD
    nvidia_site: Path | None = None  # a site-packages with NVIDIA's library wheels (cublas, cusparse, cusolver)


def load_records(path: Path = RECORDS, published: Path | None = PUBLISHED) -> list[dict]:
    """Every record the replica serves: the published ones (none for published=None), then records.yaml's own
    (template instances expanded), each with the payload records.yaml gives its name/version/subdir."""
    data = yaml.safe_load(path.read_text())
    records = [published_record(entry) for entry in yaml.safe_load(published.read_text())["records"]] if published else []
    records += list(data["records"])
    for family in data.get("families", []):
        for values in family["instances"]:
            records += [_substitute(record, values) for record in family["records"]]
    for record in records:
        record.update(_payload_of(record, data.get("payloads", [])))
        record["depends"] = [d for d in record.get("depends", ()) if d]  # a template's empty entry ($arm on linux-64)
    return records


def published_record(entry: dict) -> dict:
    """A lockfile's package entry (pixi.lock v5/v6: url, sha256, md5, depends, constrains) as an index record:
    channel, subdir, name, version and build from the url (explicit fields win, as in the lockfile)."""
    channel_url, subdir, filename = entry["url"].rsplit("/", 2)
    name, version, build = re.sub(r"\.(conda|tar\.bz2)$", "", filename).rsplit("-", 2)
    record = {"name": name, "version": version, "build": build, "subdir": subdir,
              "channel": channel_url.split("conda.anaconda.org/", 1)[1], **entry}
    if subdir == "noarch" and "noarch" not in record:  # pixi.lock omits it; conda-forge's py* builds are python
        record["noarch"] = "python" if build.startswith("py") else "generic"
    return record


def _payload_of(record: dict, payloads: list[dict]) -> dict:
    """The payload entry whose name, version and build globs and subdir match the record (at most one), as record
    fields (cuda-nvcc_linux-64 13.0.88's builds 0 and 4 install different activation scripts)."""
    for entry in payloads:
        if (entry["name"] == record["name"] and fnmatch.fnmatch(str(record["version"]), entry.get("version", "*"))
                and fnmatch.fnmatch(str(record["build"]), entry.get("build", "*"))
                and entry.get("subdir", record["subdir"]) == record["subdir"]):
            return {k: v for k, v in entry.items() if k in ("payload", "payload_note", "stand_in")}
    return {}


def _substitute(value, values: dict):
    if isinstance(value, str):
        return string.Template(value).substitute(values)
    if isinstance(value, list):
        return [_substitute(item, values) for item in value]
    if isinstance(value, dict):
        return {key: _substitute(item, values) for key, item in value.items()}
    return value


# ---------------------------------------------------------------- payload


def wheel_files(wheel: str, roots: PayloadRoots) -> tuple[Path, list[str]] | None:
    """The base directory and the RECORD paths (below nvidia/cu13/) of NVIDIA wheel `wheel`; None if absent."""
    candidates = [(roots.cuda_root, roots.cuda_root / "dist-info")]
    if roots.nvidia_site:
        candidates.append((roots.nvidia_site / WHEEL_ROOT, roots.nvidia_site))
    for base, dist_infos in candidates:
        found = sorted(dist_infos.glob(f"{wheel}-*.dist-info/RECORD")) if dist_infos.is_dir() else []
        if found:
            rows = (line.split(",")[0] for line in found[-1].read_text().splitlines())
            return base, [row[len(WHEEL_ROOT):] for row in rows if row.startswith(WHEEL_ROOT)]
    return None  # not on this machine (no --nvidia-site, or a torch without that wheel): that payload stays absent


def patched_profile(original: str, patch: str) -> str:
    """conda-forge's nvcc.profile: the wheel's profile with the feedstock's one-hunk patch, checked to apply exactly."""
    lines = patch.splitlines()
    hunk = [line or " " for line in lines[next(i for i, line in enumerate(lines) if line.startswith("@@")) + 1:]]
    old = [line[1:] for line in hunk if line[0] in " -"]
    new = [line[1:] for line in hunk if line[0] in " +"]
    if "\n".join(original.splitlines()).rstrip() != "\n".join(old).rstrip():
        raise SystemExit("replica: nvcc.profile.patch does not apply to this nvcc's bin/nvcc.profile")
    return "\n".join(new).rstrip() + "\n"


def payload(record: dict, roots: PayloadRoots) -> tuple[dict[str, str], dict[str, str], dict[str, str], list[str]]:
    """(text files, files copied from disk, symlinks, wheels absent from this machine) of one record's payload."""
    texts, disk, links, absent = {}, {}, {}, []
    for entry in record.get("payload", []):
        if "wheel" in entry:
            found = wheel_files(entry["wheel"], roots)
            if found is None:
                absent.append(entry["wheel"])
                continue
            base, rows = found
            prefix = entry["from"].rstrip("/") + "/"
            for row in rows:
                rest = row[len(prefix):]
                if row.startswith(prefix) and any(fnmatch.fnmatch(rest, g) for g in entry.get("only", ["*"])):
                    disk[f"{entry['to']}/{rest}"] = str(base / row)
        elif "link" in entry:
            links[entry["link"]] = entry["target"]
        elif "file" in entry:
            texts[entry["to"]] = rendered(entry["file"])
        elif "profile" in entry:
            texts[entry["profile"]] = patched_profile((roots.cuda_root / "bin" / "nvcc.profile").read_text(),
                                                      (HERE / "files" / "nvcc.profile.patch").read_text())
        elif "wrapper" in entry:
            texts[entry["to"]] = wrapper(entry["wrapper"])
    return texts, disk, links, absent


def rendered(name: str) -> str:
    """A committed file of files/ as its package installs it: the recipe's placeholders substituted (SUBSTITUTIONS),
    checked to leave none behind."""
    text = (HERE / "files" / name).read_text()
    for key, value in SUBSTITUTIONS.get(name, {}).items():
        text = text.replace(key, value)
    left = PLACEHOLDER.findall(text) if name in SUBSTITUTIONS else []
    if left:
        raise SystemExit(f"replica: files/{name}: placeholders {sorted(set(left))} have no value in SUBSTITUTIONS")
    return text


def wrapper(tool: str) -> str:
    """NOT REAL payload: a script running this machine's tool (python: the interpreter $FIXTURE_PYTHON names)."""
    if tool == "python":
        return '#!/bin/sh\nexec "${FIXTURE_PYTHON:-python3}" "$@"\n'
    found = shutil.which(tool) or (str(Path(sys.executable).parent / tool) if tool == "ninja" else None)
    if not found:
        raise SystemExit(f"replica: {tool} not found on PATH (the replica's {tool} wraps this machine's)")
    return f'#!/bin/sh\n# replica: not conda-forge\'s {tool}, this machine\'s\nexec {found} "$@"\n'


def build_number(build: str) -> int:
    """conda's build number from a build string: h7480c83_3 -> 3, h9e4cc4f_0_cpython -> 0, 0 -> 0."""
    found = re.search(r"(?:^|_)(\d+)(?:_|$)", build)
    return int(found.group(1)) if found else 0


def real_payload(record: dict) -> bool:
    """The CUDA packages whose files are all real (not `stand_in`: wrappers and the compilers' links to them)."""
    return bool(record.get("payload")) and not record.get("stand_in")


CONDA_FORGE = "conda-forge"


def channels() -> list[str]:
    """The channels the records belong to (conda-forge, nvidia/label/cuda-11.8.0)."""
    return list(dict.fromkeys(record.get("channel", CONDA_FORGE) for record in load_records()))


def packages(roots: PayloadRoots, with_payload: bool = True, channel: str = CONDA_FORGE) -> list[FixturePackage]:
    """Every record of one channel as a FixturePackage; payload only where asked (solves need none)."""
    out, seen = [], set()
    for record in load_records():
        if record.get("channel", CONDA_FORGE) != channel:
            continue
        key = (record["subdir"], record["name"], str(record["version"]), str(record["build"]))
        if key in seen:  # a family instance repeating a record (cuda-version 12.4 of 12.4.99 and 12.4.131)
            continue
        seen.add(key)
        texts, disk, links, absent = payload(record, roots) if with_payload else ({}, {}, {}, [])
        notes = [f"record from {record['source']}", *([f"payload: {record['payload_note']}"]
                                                       if record.get("payload_note") else []),
                 *([f"payload absent: no {', '.join(absent)} wheel on the machine that built it"] if absent else [])]
        out.append(FixturePackage(
            name=record["name"], version=str(record["version"]), build=str(record["build"]), subdir=record["subdir"],
            depends=tuple(record.get("depends", ())), constrains=tuple(record.get("constrains", ())),
            noarch=record.get("noarch"), files=texts, disk_files=disk, links=links,
            build_number=int(record.get("build_number", build_number(str(record["build"])))),
            about="conda-forge replica; " + "; ".join(notes)))
    return out


def channel_folder(channel: str) -> str:
    """nvidia/label/cuda-11.8.0 -> nvidia-label-cuda-11.8.0 (one local folder per channel)."""
    return channel.replace("/", "-")


def newest_builds(records: list[dict]) -> list[dict]:
    """Of the records with one name and version, the highest build number: what a solver installs (cuda-nvcc
    13.0.88 has builds 0 and 4, whose activation scripts differ)."""
    def number(record: dict) -> int:
        return int(record.get("build_number", build_number(str(record["build"]))))

    best: dict[tuple, dict] = {}
    for record in records:
        key = (record["subdir"], record["name"], str(record["version"]))
        if key not in best or number(record) > number(best[key]):
            best[key] = record
    return [record for record in records if best[(record["subdir"], record["name"], str(record["version"]))] is record]


def layout_prefix(dest: Path, roots: PayloadRoots, names: set[str] | None = None) -> list[str]:
    """Install the real payload of the 13.0 CUDA packages (or those named) straight into dest, as conda would.

    For the GPU machine, which has no conda installer: the layout (paths, symlinks, files) is the channel's,
    without conda-meta/. Returns the package names laid out."""
    done = []
    for record in newest_builds(load_records()):
        if not real_payload(record) or (names and record["name"] not in names):
            continue
        texts, disk, links, absent = payload(record, roots)
        for relative, text in texts.items():
            _write(dest / relative, text.encode(), executable=relative.startswith("bin/"))
        missing = [relative for relative, source in disk.items() if not Path(source).exists()]
        for relative, source in disk.items():
            if relative not in missing:
                (dest / relative).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, dest / relative)
        for relative, target in links.items():
            (dest / relative).parent.mkdir(parents=True, exist_ok=True)
            (dest / relative).unlink(missing_ok=True)
            os.symlink(target, dest / relative)
        if absent or missing:  # a CUDA installed otherwise than from the wheels may lack a few of their files
            print(f"replica: {record['name']}: absent here: wheels {absent or '-'}, {len(missing)} files "
                  f"{missing[:3]}{' ...' if len(missing) > 3 else ''}")
        done.append(record["name"])
    return done


def _write(path: Path, data: bytes, executable: bool) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    if executable:
        path.chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["channel", "prefix"])
    parser.add_argument("dest", type=Path)
    parser.add_argument("--cuda-root", type=Path, default=Path("/usr/local/cuda"))
    parser.add_argument("--nvidia-site", type=Path, help="site-packages holding NVIDIA's cublas/cusparse/cusolver wheels")
    parser.add_argument("--packages", nargs="*", help="prefix: only these packages")
    args = parser.parse_args(argv)
    roots = PayloadRoots(args.cuda_root.resolve(), args.nvidia_site)
    if args.what == "channel":
        for channel in channels():
            build_channel(args.dest / channel_folder(channel), packages(roots, channel=channel))
            print(f"replica channel {channel}: {args.dest / channel_folder(channel)}")
    else:
        laid = layout_prefix(args.dest.absolute(), roots, set(args.packages or ()))
        print(f"replica prefix: {args.dest} ({len(laid)} packages: {', '.join(laid)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
