"""`toolkit export LINE --index URL --for uv|pip|pixi|requirements`: what a user pastes into their own project to
install the line's published, verified wheels, with the torch they were built against.

Everything comes from the index (cache/index.py: its pages, table entries and build records), never from a
wheelhouse, so it runs on a user's machine. The torch pin is the build record's (`inputs.toolchain.torch`, the
torch the wheel was compiled against; its public version, since PyPI's and PyTorch's indexes spell the local
`+cu130` differently), from PyTorch's index of the record's `torch_cuda` (knowledge/cuda_lines.yaml) unless
--torch-index names another (a mirror). See docs/binary-cache.md for each snippet and how it was tested.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass

from packaging.version import InvalidVersion, Version

from toolkit.base.arguments import add_line
from toolkit.base.errors import ToolkitError
from toolkit.cache.config import checked_url, configured_caches
from toolkit.cache.index import PublishedBuild, line_builds
from toolkit.knowledge.facts import load_knowledge

FORMATS = ("uv", "pip", "pixi", "requirements")
THEN = "nothing was exported"
INDEX_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# pixi's manifest tables and keys the pixi snippet uses, as pixi documents them:
# https://pixi.sh/latest/reference/pixi_manifest/#the-pypi-options-table and #pypi-dependencies
PIXI_PYPI_OPTIONS = (
    "index-url",
    "extra-index-urls",
    "find-links",
    "no-build-isolation",
    "no-build",
    "no-binary",
    "index-strategy",
)
PIXI_DEPENDENCY_KEYS = (
    "version",
    "extras",
    "index",
    "git",
    "rev",
    "branch",
    "tag",
    "subdirectory",
    "path",
    "editable",
    "url",
)


@dataclass(frozen=True)
class Pin:
    """One requirement of the export: `name==version`, from `index` (None: the user's default index)."""

    name: str
    version: str
    index: str | None
    hashes: tuple[
        str, ...
    ] = ()  # sha256 of each published file of that version (none for torch: not ours)

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Export:
    line: str
    index: str  # the PEP 503 root: <cache>/simple
    builds: list[PublishedBuild]
    pins: list[Pin]  # torch first (where the records name one), then the published projects
    torch_built: str | None  # the records' torch, local part included ("2.11.0+cu130")
    torch_index_name: str | None  # uv's name for the torch index

    @property
    def published(self) -> list[Pin]:
        return [pin for pin in self.pins if pin.index == self.index]


def gather(line: str, url: str, torch_index: str | None) -> Export:
    """The line's published builds and the pins that install them."""
    (site,) = [
        s for s in configured_caches([url]) if s.url == url
    ]  # a URL the config lists keeps its key
    builds = line_builds(site, line, THEN)
    torches = {str(build.record.toolchain.get("torch") or "") for build in builds}
    if len(torches) > 1:
        raise ToolkitError(
            f"{site.url}: line {line}'s published wheels were built against different torches "
            f"({', '.join(sorted(torches))}): export cannot pin one (publish one build of each)"
        )
    (torch_built,) = torches
    index = f"{site.url}/simple"
    pins: list[Pin] = []
    for build in builds:
        version = str(build.link.version)
        if pins and pins[-1].name == build.project:  # another file (python tag) of the same version
            pins[-1] = Pin(build.project, version, index, (*pins[-1].hashes, build.link.sha256))
        else:
            pins.append(Pin(build.project, version, index, (build.link.sha256,)))
    torch_name = None
    if torch_built:
        try:
            public = Version(torch_built).public
        except InvalidVersion:
            raise ToolkitError(
                f"{builds[0].record_url}: toolchain torch {torch_built!r} is not a version "
                f"(tell the cache's publisher; {THEN})"
            ) from None
        torch_index = torch_index or _pytorch_index(builds[0])
        if torch_index:
            torch_index = checked_url(torch_index, "--torch-index")
            torch_name = f"pytorch-{_cuda_tag(builds[0]) or 'torch'}"
        pins.insert(0, Pin("torch", public, torch_index))
    return Export(line, index, builds, pins, torch_built or None, torch_name)


def _cuda_tag(build: PublishedBuild) -> str | None:
    cuda = build.record.toolchain.get("torch_cuda")
    return "cu" + str(cuda).replace(".", "") if cuda else None


def _pytorch_index(build: PublishedBuild) -> str | None:
    """PyTorch's wheel index of the CUDA the record's torch was built with, where PyTorch has one."""
    cuda = build.record.toolchain.get("torch_cuda")
    known = load_knowledge().cuda_lines.get(str(cuda)) if cuda else None
    return known.torch_index if known else None


def _toml(value: str) -> str:
    """A TOML basic string: JSON's string escapes are TOML's, so no value from the index can break out."""
    return json.dumps(value)


def _comment(text: str) -> str:
    """A comment line; a value from the index can never end it and start a line of TOML or requirements."""
    return "# " + " ".join(text.split()).rstrip("\\")  # pip joins a line ending in \\ with the next


def header(export: Export, how: list[str]) -> list[str]:
    lines = [
        _comment(
            f"flash-attn builds of line {export.line}, published at {export.index}: written by "
            f"`toolkit export {export.line} --for ...` from the index (each wheel vouched for by the "
            f"publisher's table entry)"
        )
    ]
    for build in export.builds:
        toolchain = build.record.toolchain
        lines.append(
            _comment(
                f"{build.link.filename}: sha256 {build.link.sha256}; built against torch "
                f"{toolchain.get('torch') or 'unknown'}, python {toolchain.get('python_version') or 'unknown'}, "
                f"archs {' '.join(build.record.archs) or 'unknown'}"
            )
        )
        report = (
            f"verification report {build.report_url}"
            if build.report_exists()
            else "no verification report published"
        )
        lines.append(_comment(f"  {report}; build record {build.record_url}"))
    return lines + [_comment(text) for text in how]


def uv_snippet(export: Export, index_name: str) -> str:
    adds = " ".join(f'"{pin.requirement}"' for pin in export.pins)
    how = [
        "Paste into your project's pyproject.toml, then add the pins (uv keeps these sources):",
        f"  uv add {adds}",
    ]
    if export.torch_built and not export.torch_index_name:
        how.append(
            "torch comes from your default index (no PyTorch index is known for its CUDA: --torch-index URL)"
        )
    out = header(export, how) + [
        "",
        "[[tool.uv.index]]",
        f"name = {_toml(index_name)}",
        f"url = {_toml(export.index)}",
        "explicit = true",
    ]
    torch = export.pins[0] if export.torch_built else None
    if torch and torch.index and export.torch_index_name:
        out += [
            "",
            "[[tool.uv.index]]",
            f"name = {_toml(export.torch_index_name)}",
            f"url = {_toml(torch.index)}",
            "explicit = true",
        ]
    out += ["", "[tool.uv.sources]"]
    out += [f"{pin.name} = {{ index = {_toml(index_name)} }}" for pin in export.published]
    if torch and torch.index and export.torch_index_name:
        out.append(f"torch = {{ index = {_toml(export.torch_index_name)} }}")
    return "\n".join(out) + "\n"


def _hashed(pins: list[Pin]) -> list[str]:
    out = []
    for pin in pins:
        out.append(f"{pin.requirement} \\")
        out += [
            f"    --hash=sha256:{sha}" + (" \\" if n < len(pin.hashes) - 1 else "")
            for n, sha in enumerate(pin.hashes)
        ]
    return out


def _torch_step(export: Export, tool: str) -> list[str]:
    if not export.torch_built:
        return []
    torch = export.pins[0]
    where = f" --index-url {torch.index}" if torch.index else ""
    return [
        f"first the torch the wheels were built against (its dependencies are not pinned here): "
        f'{tool} install "{torch.requirement}"{where}'
    ]


def pip_snippet(export: Export) -> str:
    how = [
        "Save as requirements-flash-attn.txt: pip checks each wheel against its sha256 (hash-checking mode).",
        *_torch_step(export, "pip"),
        "then: pip install -r requirements-flash-attn.txt (uv pip install -r reads it too)",
    ]
    return (
        "\n".join(
            [*header(export, how), f"--extra-index-url {export.index}", *_hashed(export.published)]
        )
        + "\n"
    )


def requirements_snippet(export: Export) -> str:
    how = [
        "Pinned requirements with hashes, without index options: give the index to the installer, e.g.",
        f"  pip install --extra-index-url {export.index} -r requirements.txt",
        *_torch_step(export, "pip"),
    ]
    return "\n".join([*header(export, how), *_hashed(export.published)]) + "\n"


def pixi_snippet(export: Export) -> str:
    how = [
        "Paste into pixi.toml (in pyproject.toml: [tool.pixi.pypi-options], [tool.pixi.pypi-dependencies]); "
        "pixi resolves PyPI packages with uv, so [dependencies] must hold a python (the builds' python above).",
        "Tables and keys as pixi documents them: https://pixi.sh/latest/reference/pixi_manifest/",
    ]
    out = header(export, how) + [
        "",
        "[pypi-options]",
        f"extra-index-urls = [{_toml(export.index)}]",
        "",
        "[pypi-dependencies]",
    ]
    for pin in export.pins:
        index = f", index = {_toml(pin.index)}" if pin.index else ""
        out.append(f"{pin.name} = {{ version = {_toml('==' + pin.version)}{index} }}")
    return "\n".join(out) + "\n"


def export_command(args: argparse.Namespace) -> int:
    url = checked_url(args.index.rstrip("/").removesuffix("/simple"), "--index")
    if not INDEX_NAME.fullmatch(args.name):
        raise ToolkitError(
            f"--name {args.name!r}: uv's index names are letters, digits, '-', '_' and '.'"
        )
    export = gather(args.line, url, args.torch_index)
    snippets = {
        "uv": lambda: uv_snippet(export, args.name),
        "pip": lambda: pip_snippet(export),
        "pixi": lambda: pixi_snippet(export),
        "requirements": lambda: requirements_snippet(export),
    }
    print(snippets[args.format](), end="")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "export",
        description="Read the line's published wheels from a binary cache (`toolkit publish`'s index: its pages, "
        "table entries and build records, each checked) and print what a user's project needs to "
        "install them: uv's explicit [[tool.uv.index]] and [tool.uv.sources], a pip requirements "
        "file with the index and --hash lines, pixi's [pypi-options] and [pypi-dependencies], or "
        "plain pinned requirements with hashes; each with the torch the wheels were built against.",
    )
    add_line(parser, "the line whose published wheels to export")
    parser.add_argument(
        "--index",
        required=True,
        metavar="URL",
        help="the published cache (file://, http(s)://: the folder `toolkit publish --to` wrote); "
        "a public_key configured for it in .fa-envkit/caches.toml is checked",
    )
    parser.add_argument(
        "--for",
        dest="format",
        required=True,
        choices=FORMATS,
        metavar="TOOL",
        help=f"the snippet's tool: {', '.join(FORMATS)}",
    )
    parser.add_argument(
        "--torch-index",
        metavar="URL",
        help="where torch comes from (default: PyTorch's index of the builds' CUDA)",
    )
    parser.add_argument(
        "--name",
        default="fa-envkit",
        metavar="NAME",
        help="uv's name for the index (default: fa-envkit)",
    )
    parser.set_defaults(func=export_command)
