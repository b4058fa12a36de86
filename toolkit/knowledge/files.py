"""The one reader of the knowledge files (toolkit/knowledge/*.yaml): every stage's facts come through here.

A knowledge file is the toolkit's own data, but a person edits it (a new release, a patch, a failure
pattern), so a missing file, broken YAML or an entry without a field it needs is one ToolkitError that
names the file, never a traceback from deep inside a stage. `typed` hands the mapping to the caller's
builder, which turns it into its dataclasses; a KeyError or a bad value raised there is reported against
the file too.

Kept apart from knowledge.py (which needs `packaging`), and importing only the standard library until a
file is read, because modules of the measuring side import it: a verification suite runs in the line's own
python with only torch and pyyaml and reads its implementation's knowledge file through here.
Lock files (lockfile.py) and specs (spec.py, with its strict loader) are not knowledge and have readers of
their own.
"""

from __future__ import annotations

import copy
import hashlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path

KNOWLEDGE_DIR = Path(__file__).parent
RESTORE = "restore it from the toolkit's repository"

T = TypeVar("T")
PARSED: dict[
    str, dict[str, Any]
] = {}  # sha256 of a file's bytes -> its mapping: each text is parsed once a process


def read(name: str | Path) -> dict[str, Any]:
    """The top-level mapping of a knowledge file: a file name (str) in toolkit/knowledge/, or a Path (another
    copy, e.g. a test's; relative to the working directory)."""
    import yaml  # here, so that importing this module costs nothing where no file is read

    where = display_path(_path(name))
    try:
        text = _path(name).read_bytes()
        key = hashlib.sha256(
            text
        ).hexdigest()  # by content, not name or mtime: an edited copy is read anew
        if key not in PARSED:
            PARSED[key] = yaml.load(
                text.decode(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)
            )  # libyaml
        data = copy.deepcopy(
            PARSED[key]
        )  # callers may change what they get; the next reader gets the file's
    except FileNotFoundError:
        raise ToolkitError(f"{where}: knowledge file not found ({RESTORE})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ToolkitError(
            f"{where}: cannot read the knowledge file ({_first_line(exc)}; {RESTORE})"
        ) from None
    except yaml.MarkedYAMLError as exc:
        line = f":{exc.problem_mark.line + 1}" if exc.problem_mark else ""
        raise ToolkitError(
            f"{where}{line}: not valid YAML: {exc.problem} (fix the file or {RESTORE})"
        ) from None
    except yaml.YAMLError as exc:
        raise ToolkitError(
            f"{where}: not valid YAML: {_first_line(exc)} (fix the file or {RESTORE})"
        ) from None
    if not isinstance(data, dict):
        raise ToolkitError(
            f"{where}: expected a mapping at the top of the knowledge file ({RESTORE})"
        )
    return data


def typed(name: str | Path, build: Callable[[dict[str, Any]], T]) -> T:
    """`build` applied to the file's mapping; a field it misses or a value it rejects names the file."""
    data = read(name)
    where = display_path(_path(name))
    try:
        return build(data)
    except KeyError as exc:
        raise ToolkitError(f"{where}: {exc.args[0]}: missing (add it, or {RESTORE})") from None
    except (TypeError, ValueError, AttributeError, re.error) as exc:
        raise ToolkitError(
            f"{where}: malformed entry: {_first_line(exc)} (fix it, or {RESTORE})"
        ) from None


def _path(name: str | Path) -> Path:
    return name if isinstance(name, Path) else KNOWLEDGE_DIR / name


def _first_line(exc: BaseException) -> str:
    text = getattr(exc, "strerror", None) or str(exc)
    return text.splitlines()[0] if text else type(exc).__name__
