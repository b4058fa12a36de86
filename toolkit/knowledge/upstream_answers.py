"""The answers `toolkit knowledge check-updates` reads beyond PyPI's release lists, each typed before a field is used.

GitHub's REST API (the commits touching a path, a branch's root tree), the Hugging Face Hub's model API (a kernels
repository's revision), a transformers wheel (the `attn_implementation` names its AttentionInterface registers)
and a verl sdist (its flash-attn pin and the index it routes flash-attn through). Each reader takes the untrusted
bytes of one answer, live or recorded, and gives a dataclass or one ToolkitError line naming the URL; nothing is
unpacked to disk, imported or run: a wheel's Python is parsed with `ast`, a pyproject with `tomllib`.
`trimmed` says what a recording keeps of each (only what the readers read), so a test replays today's answers.
"""

from __future__ import annotations

import ast
import io
import tarfile
import zipfile
from dataclasses import dataclass, field
from typing import TypeVar

import pydantic
import tomllib
from packaging.requirements import InvalidRequirement, Requirement

from toolkit.base.errors import ToolkitError, first_problem
from toolkit.base.jsonfile import parse_json
from toolkit.base.typed import adapter
from toolkit.knowledge.frameworks import VerlFlashAttn

GITHUB_API = "https://api.github.com/repos/{repo}"
HUB_MODEL = "https://huggingface.co/api/models/{repo}"
ANSWER_FIX = "the index answered something else: check again later, or record the answers again with --record"
# What a recording keeps of an archive: the one member each reader reads (the rest is megabytes of no use here).
TRANSFORMERS_MEMBER = "transformers/modeling_utils.py"
PYPROJECT = "pyproject.toml"
T = TypeVar("T")
MAX_MEMBER_BYTES = 8 << 20  # modeling_utils.py of transformers 5.25.0 is 282,488 bytes


def _typed(typed: pydantic.TypeAdapter[T], answer: bytes, url: str, what: str) -> T:
    data = parse_json(answer, url, what, ANSWER_FIX)
    try:
        return typed.validate_python(data)
    except pydantic.ValidationError as exc:
        raise ToolkitError(
            f"{url}: unreadable {what} ({first_problem(exc)}; {ANSWER_FIX})"
        ) from None


# ---------------------------------------------------------------- GitHub


@dataclass(frozen=True)
class GitPerson:
    date: str  # ISO 8601


@dataclass(frozen=True)
class GitCommitBody:
    committer: GitPerson
    message: str = ""


@dataclass(frozen=True)
class GithubCommit:
    """One entry of GET /repos/{repo}/commits (the fields read; the others are ignored)."""

    sha: str
    commit: GitCommitBody

    @property
    def day(self) -> str:
        return self.commit.committer.date[:10]

    @property
    def subject(self) -> str:
        return self.commit.message.splitlines()[0] if self.commit.message else ""


@dataclass(frozen=True)
class TreeEntry:
    path: str
    type: str  # "tree", "blob" or "commit" (a submodule)
    sha: str


@dataclass(frozen=True)
class GithubTree:
    """GET /repos/{repo}/git/trees/{branch}: the root of the branch, one entry per top-level path."""

    sha: str
    tree: list[TreeEntry] = field(default_factory=list)
    truncated: bool = False

    def entry(self, path: str) -> TreeEntry | None:
        return next((e for e in self.tree if e.path == path), None)


def commits_url(repo: str, path: str, since: str) -> str:
    """The commits touching `path` from the day `since` on, newest first (100 at most: enough to date the oldest
    the knowledge lacks unless upstream is more than 100 commits ahead, which the finding then says)."""
    return (
        f"{GITHUB_API.format(repo=repo)}/commits?path={path}&since={since}T00:00:00Z&per_page=100"
    )


def tree_url(repo: str, branch: str) -> str:
    return f"{GITHUB_API.format(repo=repo)}/git/trees/{branch}"


def github_commits(answer: bytes, url: str) -> list[GithubCommit]:
    return _typed(adapter(list[GithubCommit]), answer, url, "GitHub commits answer")


def github_tree(answer: bytes, url: str) -> GithubTree:
    return _typed(adapter(GithubTree), answer, url, "GitHub tree answer")


# ---------------------------------------------------------------- the Hugging Face Hub


@dataclass(frozen=True)
class HubModel:
    """GET https://huggingface.co/api/models/{repo}: the revision at main and when it last changed."""

    id: str
    sha: str
    lastModified: str


def hub_model(answer: bytes, url: str) -> HubModel:
    return _typed(adapter(HubModel), answer, url, "Hugging Face Hub answer")


# ---------------------------------------------------------------- a transformers wheel


@dataclass(frozen=True)
class AttnNames:
    """The names transformers' AttentionInterface accepts as `attn_implementation` (its _global_mapping keys, and
    "eager", which get_interface accepts without an entry); empty `names` with `problem` where the source has no
    such mapping any more (a refactor upstream: a finding, not an error)."""

    names: tuple[str, ...]
    problem: str = ""


def _member(names: list[str], want: str) -> str | None:
    """The archive member `want`, at the top or one folder down (an sdist's verl-0.9.1/pyproject.toml)."""
    return next(
        (n for n in names if n == want or n.split("/", 1)[-1] == want and n.count("/") == 1), None
    )


def _zip_member(answer: bytes, url: str, want: str) -> bytes | None:
    try:
        with zipfile.ZipFile(io.BytesIO(answer)) as zf:
            infos = {i.filename: i for i in zf.infolist()}
            if want not in infos:
                return None
            if infos[want].file_size > MAX_MEMBER_BYTES:
                raise ToolkitError(
                    f"{url}: {want} is larger than {MAX_MEMBER_BYTES:,} bytes ({ANSWER_FIX})"
                )
            return zf.read(want)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise ToolkitError(f"{url}: not a readable wheel ({exc}; {ANSWER_FIX})") from None


def attn_implementation_names(answer: bytes, url: str) -> AttnNames:
    """The names registered in AttentionInterface._global_mapping of the wheel's modeling_utils.py, read by `ast`."""
    source = _zip_member(answer, url, TRANSFORMERS_MEMBER)
    if source is None:
        return AttnNames((), f"the wheel has no {TRANSFORMERS_MEMBER}")
    try:
        tree = ast.parse(source.decode())
    except (SyntaxError, UnicodeDecodeError, ValueError) as exc:
        return AttnNames((), f"{TRANSFORMERS_MEMBER} does not parse ({exc})")
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == "AttentionInterface":
            for stmt in node.body:
                if (
                    isinstance(stmt, ast.Assign)
                    and isinstance(stmt.value, ast.Dict)
                    and any(
                        isinstance(t, ast.Name) and t.id == "_global_mapping" for t in stmt.targets
                    )
                ):
                    keys = [k.value for k in stmt.value.keys if isinstance(k, ast.Constant)]
                    return AttnNames(tuple(sorted({"eager", *map(str, keys)})))
    return AttnNames((), f"{TRANSFORMERS_MEMBER} has no AttentionInterface._global_mapping dict")


# ---------------------------------------------------------------- a verl sdist


def _tar_member(answer: bytes, url: str, want: str) -> bytes | None:
    try:
        with tarfile.open(fileobj=io.BytesIO(answer), mode="r:gz") as tar:
            members = {m.name: m for m in tar.getmembers()}
            name = _member(list(members), want)
            if name is None or not members[name].isfile():
                return None
            if members[name].size > MAX_MEMBER_BYTES:
                raise ToolkitError(
                    f"{url}: {name} is larger than {MAX_MEMBER_BYTES:,} bytes ({ANSWER_FIX})"
                )
            handle = tar.extractfile(members[name])
            return handle.read() if handle else None
    except (tarfile.TarError, OSError, EOFError, ValueError) as exc:
        raise ToolkitError(f"{url}: not a readable sdist ({exc}; {ANSWER_FIX})") from None


def verl_flash_attn(answer: bytes, url: str) -> list[VerlFlashAttn]:
    """Every optional-dependency extra of the sdist's pyproject.toml that names flash-attn, with its routing."""
    text = _tar_member(answer, url, PYPROJECT)
    if text is None:
        raise ToolkitError(f"{url}: the sdist has no {PYPROJECT} ({ANSWER_FIX})")
    try:
        data = tomllib.loads(text.decode())
        extras = data.get("project", {}).get("optional-dependencies", {})
        uv = data.get("tool", {}).get("uv", {})
        index = uv.get("sources", {}).get("flash-attn", {}).get("index", "")
        urls = {i.get("name"): i.get("url", "") for i in uv.get("index", [])}
        out = []
        for extra, requirements in extras.items():
            for text_req in requirements:
                req = Requirement(text_req)
                if req.name == "flash-attn":
                    out.append(VerlFlashAttn(extra, str(req.specifier), index, urls.get(index, "")))
    except (
        tomllib.TOMLDecodeError,
        UnicodeDecodeError,
        InvalidRequirement,
        AttributeError,
        TypeError,
    ) as exc:
        raise ToolkitError(f"{url}: unreadable {PYPROJECT} ({exc}; {ANSWER_FIX})") from None
    return out


# ---------------------------------------------------------------- recording


def trimmed_archive(url: str, answer: bytes) -> bytes | None:
    """What --record keeps of a wheel or an sdist: an archive of the one member its reader reads, the bytes as
    served (None: `url` is no archive)."""
    out = io.BytesIO()
    if url.endswith(".whl"):
        body = _zip_member(answer, url, TRANSFORMERS_MEMBER)
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
            if body is not None:
                zf.writestr(TRANSFORMERS_MEMBER, body)
        return out.getvalue()
    if url.endswith(".tar.gz"):
        body = _tar_member(answer, url, PYPROJECT)
        with tarfile.open(fileobj=out, mode="w:gz") as tar:
            if body is not None:
                info = tarfile.TarInfo(
                    f"{url.rsplit('/', 1)[-1].removesuffix('.tar.gz')}/{PYPROJECT}"
                )
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))
        return out.getvalue()
    return None
