"""Write published.yaml: the real conda-forge records the replica serves, chosen by solving every line.

    python tests/conda_forge_replica/select_published.py \\
        --lock NVIDIA/numba-cuda GITDIR pixi.lock \\
        --lock WFU-HPC/deac-docs GITDIR one-offs/biophysics/install-bindcraft.sh:62-6879 ...

Each --lock names a public repository, a git directory holding it (e.g. what the `fetch` tool brings) and a
lockfile path in it (pixi.lock v5/v6; `:A-B` takes lines A-B of a file that embeds one). Every version of that
file in the history is read; the union of their conda entries is the pool (first seen, newest commit first).
Then every spec line of envs/ with a `locked` toolchain is solved for every platform it lists (and the
variants the tests solve, --variant) against the pool plus records.yaml's own records, as py-rattler solves a
lock: the newest build the pool holds wins. The pool records the solves chose are written, verbatim, with the
commit they were read at. Run where the mirrors are (conda-forge itself is not reachable here).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path[:0] = [str(HERE), str(ROOT)]
from replica import build_number, channel_folder, load_records, published_record  # noqa: E402

from toolkit.base.errors import ToolkitError  # noqa: E402
from toolkit.env.lock import conda_request  # noqa: E402
from toolkit.env.rattler_solve import rattler_solve  # noqa: E402
from toolkit.spec.envspec import load_spec  # noqa: E402

KEEP = ("url", "sha256", "md5", "depends", "constrains", "build_number", "noarch", "license", "size", "timestamp")


def pool(locks: list[tuple[str, str, str]]) -> dict[str, dict]:
    """url -> lockfile entry (with `source`: REPO@COMMIT:PATH) over every version of every lockfile."""
    found: dict[str, dict] = {}
    for repo, gitdir, where in locks:
        path, _, lines = where.partition(":")
        log = subprocess.run(["git", "-C", gitdir, "log", "--format=%H", "--", path], capture_output=True, text=True,
                             check=True).stdout.split()
        for commit in log:
            text = subprocess.run(["git", "-C", gitdir, "show", f"{commit}:{path}"], capture_output=True, text=True,
                                  check=True).stdout
            if lines:
                first, last = (int(n) for n in lines.split("-"))
                text = "\n".join(text.splitlines()[first - 1:last])
            for entry in yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)).get("packages", []):
                url = entry.get("conda") or (entry.get("url") if entry.get("kind") == "conda" else None)
                if url and url.startswith("https://conda.anaconda.org/") and url not in found:
                    kept = {k: entry[k] for k in KEEP if k in entry and entry[k] not in (None, [])}
                    found[url] = {"url": url, **kept, "source": f"{repo}@{commit[:12]}:{path}"}
    return found


def write_channels(root: Path, records: list[dict]) -> None:
    """repodata.json per channel and subdir (a solve needs no archives)."""
    index: dict[tuple[str, str], dict] = {}
    for record in records:
        key = (channel_folder(record.get("channel", "conda-forge")), record["subdir"])
        filename = record.get("url", "").rsplit("/", 1)[-1] or f"{record['name']}-{record['version']}-{record['build']}.conda"
        table = "packages" if filename.endswith(".tar.bz2") else "packages.conda"
        repodata = index.setdefault(key, {"info": {"subdir": key[1]}, "packages": {}, "packages.conda": {}})
        repodata[table][filename] = {
            "name": record["name"], "version": str(record["version"]), "build": str(record["build"]),
            "build_number": int(record.get("build_number", build_number(str(record["build"])))),
            "depends": list(record.get("depends", ())), "constrains": list(record.get("constrains", ())),
            "subdir": record["subdir"], **({"noarch": record["noarch"]} if record.get("noarch") else {}),
            **({"sha256": record["sha256"]} if record.get("sha256") else {})}
    channels = {channel for channel, _ in index}
    for channel in channels:
        for subdir in ("noarch", "linux-64", "linux-aarch64"):
            repodata = index.get((channel, subdir), {"info": {"subdir": subdir}, "packages": {}, "packages.conda": {}})
            (root / channel / subdir).mkdir(parents=True, exist_ok=True)
            (root / channel / subdir / "repodata.json").write_text(json.dumps(repodata))


def solves(root: Path, variants: list[str]) -> tuple[set[str], list[str]]:
    """(urls of the chosen records, one line per line x platform) for every locked line of envs/ and variant."""
    chosen: set[str] = set()
    report = []
    specs = [(path.stem, load_spec(path)) for path in sorted((ROOT / "envs").glob("*.yaml")) if path.stem != "base"]
    for variant in variants:  # LINE:key=value,key=value -> a spec file extending LINE
        line, _, pairs = variant.partition(":")
        folder = root / "variants" / variant.replace(":", "-").replace(",", "-").replace("=", "")
        folder.mkdir(parents=True)
        for name in ("base.yaml", f"{line}.yaml"):
            (folder / name).write_text((ROOT / "envs" / name).read_text())
        (folder / "variant.yaml").write_text(f"extends: {line}\n" + "".join(
            f"{k}: {v}\n" for k, v in (pair.split("=") for pair in pairs.split(","))))
        specs.append((variant, load_spec(folder / "variant.yaml")))
    for name, spec in specs:
        if spec.toolchain.kind != "locked":
            continue
        request = conda_request(spec)
        channels = tuple((root / channel_folder(c)).as_uri() for c in spec.channels)
        for platform in spec.platforms:
            try:
                records = rattler_solve(channels, request.specs, platform, request.virtual_packages[platform])
            except ToolkitError as exc:
                report.append(f"{name} {platform}: no solve: {str(exc)[:200]}")
                continue
            chosen |= {"/".join(str(r.url).rsplit("/", 2)[-2:]) for r in records}  # subdir/filename
            nvcc = next((f"{r.version}-{r.build}" for r in records if r.name.normalized == "cuda-nvcc"), "-")
            report.append(f"{name} {platform}: {len(records)} records, cuda-nvcc {nvcc}")
    return chosen, report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lock", nargs=3, action="append", metavar=("REPO", "GITDIR", "PATH"), required=True)
    parser.add_argument("--variant", action="append", default=[], help="LINE:key=value,... solved as well")
    parser.add_argument("--out", type=Path, default=HERE / "published.yaml")
    args = parser.parse_args(argv)
    found = pool([tuple(lock) for lock in args.lock])
    own = load_records(published=None)  # records.yaml's own
    with tempfile.TemporaryDirectory() as tmp:
        write_channels(Path(tmp), [published_record(entry) for entry in found.values()] + own)
        chosen, report = solves(Path(tmp), args.variant)
    print("\n".join(report))
    by_tail = {"/".join(url.rsplit("/", 2)[-2:]): url for url in found}
    picked = [found[by_tail[tail]] for tail in sorted(chosen) if tail in by_tail]
    sources = sorted({entry["source"].split(":")[0] for entry in picked})
    header = ("# Real conda records, verbatim from public lockfiles (pixi.lock): the ones a solve of every locked line\n"
              "# of envs/ picks from them. Written by select_published.py; each names the commit it was read at.\n")
    sources = "".join(f"  {s}: https://github.com/{s.split('@')[0]}/tree/{s.split('@')[1]}\n" for s in sources)
    records = "".join("- " + yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=1 << 20) for entry in picked)
    args.out.write_text(f"{header}sources:\n{sources}records:\n{records}")
    print(f"{len(picked)} published records from {len(found)} in the pool -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
