"""`toolkit caches`: the toolkit's caches on this machine ($XDG_CACHE_HOME/fa-envkit, shared by every project of the
user), what each holds and its size (`show`, the default step); `prune`, what no install reads again (uv's
unreachable entries, the folders earlier versions of the toolkit kept there); `clear`, all of them.

They only grow otherwise: uv's holds every pip layer's wheels unpacked (a CUDA torch line: 4-6 GB a torch
version), the verified conda archives and py-rattler's unpacked copies of them each a CUDA layer's size again.
An environment already installed never reads a cache: py-rattler and uv link or copy each file into it (a hard
link keeps its data when the cache's name for it goes), so removing one costs only the next install's downloads.

A cache folder that is a symbolic link (one moved to a scratch filesystem) is shown and left as it is: nothing
outside the toolkit's own folders is removed. Every install holds a shared lock on the caches while it uses them
(Workspace.caches_in_use): `prune` and `clear` remove nothing while one runs (one line says so), and an install
started meanwhile waits for them. A folder is renamed into a temporary of the toolkit's before it is removed, so
one that a killed `clear` left is no cache any more, and the next `caches` run removes it (clean_stale).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from toolkit.base.arguments import add_json
from toolkit.base.atomic import checkpoint, clean_stale, owned_dir
from toolkit.base.entry import add_verb_with_default_step
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import held_if_free, lock_file_for
from toolkit.base.paths import printable, tree_bytes
from toolkit.base.workspace import Workspace

# Folders an earlier version of the toolkit kept in the user's cache, which nothing reads now.
FORMER = {
    "wheels": "the pip layers' verified wheels, as versions before uv installed them kept them (uv's cache has "
    "them now)",
}


@dataclass(frozen=True)
class CacheFolder:
    """One of the toolkit's cache folders, as `show` reports it."""

    name: str
    path: str
    holds: str
    former: bool  # kept by an earlier version: nothing reads it now
    size_bytes: int
    link_to: str | None  # a symbolic link's target: shown, never removed

    @property
    def removable(self) -> bool:
        return self.link_to is None and os.path.isdir(self.path)


def cache_folders(
    workspace: Workspace, acted_on: Callable[[Path, bool], bool] = lambda path, former: True
) -> list[CacheFolder]:
    """Every folder the toolkit keeps in the user's cache (those that do not exist too, as 0 bytes), or those
    `acted_on(path, former)` picks: only their files are walked for their size."""
    kinds = [
        (workspace.uv_cache, "uv's cache: the pip layers' wheels, downloaded and unpacked", False),
        (workspace.conda_package_cache, "the verified conda archives", False),
        (workspace.rattler_cache, "py-rattler's package cache: those archives unpacked", False),
        *((workspace.user_cache / name, holds, True) for name, holds in FORMER.items()),
    ]
    return [
        CacheFolder(
            name=path.name,
            path=str(path),
            holds=holds,
            former=former,
            size_bytes=0 if path.is_symlink() else tree_bytes(path),
            link_to=os.readlink(path) if path.is_symlink() else None,
        )
        for path, holds, former in kinds
        if acted_on(path, former)
    ]


def remove_folder(folder: CacheFolder, user_cache: Path) -> None:
    """The folder renamed into a temporary of the toolkit's beside it (an install sees it whole or not at all),
    then removed; a rename refused is one line."""
    with owned_dir(user_cache, f"removing-{folder.name}") as gone:
        try:
            os.rename(folder.path, gone / folder.name)
        except OSError as exc:
            raise ToolkitError(
                f"{printable(folder.path)}: cannot remove it ({exc.strerror}); nothing of it was removed"
            ) from None
        checkpoint("caches:remove")


def uv_cache_command(step: str, folder: CacheFolder) -> None:
    """`uv cache prune` / `uv cache clean` of uv's cache: uv's own rules for what is unreachable, under uv's lock
    on its cache, read-only entries included."""
    from toolkit.base.children import run_tied
    from toolkit.env.engine import locking_environment
    from toolkit.env.pypi_lock import uv_executable

    done = run_tied(
        [uv_executable(), "cache", step, "--cache-dir", folder.path],
        capture_output=True,
        text=True,
        env=locking_environment(),
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolkitError(
            f"{printable(folder.path)}: `uv cache {step}` failed ({printable(last)})"
        )


def shrink(workspace: Workspace, everything: bool) -> list[tuple[CacheFolder, int]]:
    """`prune` (everything False) or `clear`; each folder acted on with the bytes it has now."""
    if not workspace.user_cache.is_dir():
        if os.path.lexists(workspace.user_cache):
            raise ToolkitError(
                f"{printable(str(workspace.user_cache))}: not a folder, and the toolkit's caches would be in it: move it away "
                f"(or set XDG_CACHE_HOME to another folder); nothing was removed"
            )
        return []  # no cache yet: nothing to remove
    clean_stale(workspace.user_cache)  # what a killed `clear` left
    done = []
    with held_if_free(workspace.caches_in_use) as free:
        if not free:
            raise ToolkitError(
                f"{printable(str(workspace.user_cache))}: a running install is using the caches (it holds "
                f"{lock_file_for(workspace.caches_in_use).name}): run `toolkit caches "
                f"{'clear' if everything else 'prune'}` again when it has ended; nothing was removed"
            )

        # prune: uv's (by uv's rules) and the former folders
        def acted_on(path: Path, former: bool) -> bool:
            return everything or former or path == workspace.uv_cache

        for folder in cache_folders(workspace, acted_on):  # the others' files are not even walked
            if not folder.removable:
                continue
            if folder.path == str(workspace.uv_cache):
                uv_cache_command("clean" if everything else "prune", folder)
            else:
                remove_folder(folder, workspace.user_cache)
            done.append((folder, tree_bytes(Path(folder.path))))
    return done


def size_text(size: int) -> str:
    return f"{size / 1e9:.2f} GB" if size >= 1e8 else f"{size / 1e6:.1f} MB"


def caches_show_command(args: argparse.Namespace) -> int:
    workspace = Workspace()
    if workspace.user_cache.is_dir():
        clean_stale(workspace.user_cache)  # what a killed `clear` left, not counted anywhere
    folders = cache_folders(workspace)
    if args.json:
        print(json.dumps([asdict(f) for f in folders], indent=2))
        return 0
    for f in folders:
        where = printable(f"{f.path} -> {f.link_to} (a link: left to you)" if f.link_to else f.path)
        state = "" if os.path.lexists(f.path) else " (none)"
        former = " (an earlier version's: `toolkit caches prune` removes it)" if f.former else ""
        print(f"{size_text(f.size_bytes):>9}  {where}{state}\n           {f.holds}{former}")
    total = sum(f.size_bytes for f in folders)
    print(f"{size_text(total):>9}  in all")
    return 0


def caches_prune_command(args: argparse.Namespace) -> int:
    return report(shrink(Workspace(), everything=False))


def caches_clear_command(args: argparse.Namespace) -> int:
    return report(shrink(Workspace(), everything=True))


def report(done: list[tuple[CacheFolder, int]]) -> int:
    for folder, left in done:
        print(
            f"{printable(folder.path)}: {size_text(folder.size_bytes)} -> {size_text(left)}"
            + (" (removed)" if not os.path.lexists(folder.path) else "")
        )
    freed = sum(folder.size_bytes - left for folder, left in done)
    print(f"{size_text(freed)} freed")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    steps = add_verb_with_default_step(
        subparsers,
        "caches",
        "show",
        description="`toolkit caches [show]`: the toolkit's caches in $XDG_CACHE_HOME/fa-envkit (~/.cache/fa-envkit), "
        "what each holds and its size. `toolkit caches prune`: what no install reads again (uv's unreachable "
        "entries, folders an earlier version kept). `toolkit caches clear`: all of them, downloaded again when next "
        "needed; installed environments keep working (their files are links or copies, not references).",
    )
    for name, help, description, handler in STEPS:
        step = steps.add_parser(name, help=help, description=description)
        if name == "show":
            add_json(step)
        step.set_defaults(func=handler)


# each step: its name, help line, description and handler
STEPS = (
    (
        "show",
        "each cache folder, what it holds and its size",
        "Each of the toolkit's cache folders in $XDG_CACHE_HOME/fa-envkit: its path (a symbolic link with its "
        "target: never removed), what it holds and the bytes of its files.",
        caches_show_command,
    ),
    (
        "prune",
        "remove what no install reads again (uv's unreachable entries, former folders)",
        "`uv cache prune` of uv's cache (uv's own rules), and the folders an earlier version of the toolkit kept "
        "there; the verified conda archives and py-rattler's cache stay.",
        caches_prune_command,
    ),
    (
        "clear",
        "remove every cache folder (downloaded again when next needed)",
        "Every cache folder removed (uv's by `uv cache clean`); the next install downloads what it needs again. "
        "Installed environments keep working: their files are links or copies.",
        caches_clear_command,
    ),
)
