"""PEP 503 pages (with PEP 658/714 metadata attributes): the one writer of the simple index's HTML, used by
the wheelhouse's own index (build/wheelhouse.py) and by a published cache (cache/publish.py)."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Link:
    """One file on a project's page: where it is (relative to the page), its sha256 and what resolvers read
    without fetching it: its Requires-Python and the sha256 of its `<file>.metadata` (PEP 658), where known."""

    href: str
    name: str
    sha256: str
    requires_python: str | None = None
    metadata_sha256: str | None = None


def normalize(project: str) -> str:
    """PEP 503 project name normalization."""
    return re.sub(r"[-_.]+", "-", project).lower()


def project_of(wheel_name: str) -> str:
    """The normalized project of a wheel's file name (its first dash-separated part)."""
    return normalize(wheel_name.split("-")[0])


def write_pages(simple: Path, links: list[Link]) -> None:
    """simple/index.html and simple/<project>/index.html into the (empty, staged) folder `simple`."""
    projects: dict[str, list[Link]] = {}
    for link in links:
        projects.setdefault(project_of(link.name), []).append(link)
    root_links = []
    for project, found in sorted(projects.items()):
        (simple / project).mkdir()
        anchors = "\n".join(_anchor(link) for link in sorted(found, key=lambda link: link.name))
        (simple / project / "index.html").write_text(_page(f"Links for {project}", anchors))
        root_links.append(f'<a href="{project}/">{project}</a><br>')
    (simple / "index.html").write_text(_page("Simple index", "\n".join(root_links)))


def _anchor(link: Link) -> str:
    attributes = f'href="{html.escape(f"{link.href}#sha256={link.sha256}")}"'
    if link.requires_python:
        attributes += f' data-requires-python="{html.escape(link.requires_python)}"'
    if link.metadata_sha256:  # PEP 714's name, and PEP 658's for older clients
        attributes += (
            f' data-core-metadata="sha256={link.metadata_sha256}"'
            f' data-dist-info-metadata="sha256={link.metadata_sha256}"'
        )
    return f"<a {attributes}>{html.escape(link.name)}</a><br>"


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html>\n<html><head><meta name="pypi:repository-version" content="1.0">'
        f"<title>{title}</title></head>\n<body><h1>{title}</h1>\n{body}\n</body></html>\n"
    )
