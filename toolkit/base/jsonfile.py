"""The one reader of JSON files a user can edit, replace or damage: records, reports, plans, answers.

`json.loads` has failures that are not a `ValueError`: a few thousand nested brackets raise
RecursionError, and a number of over 4300 digits a plain ValueError whose text advises calling
sys.set_int_max_str_digits. A FIFO named x.json blocks a plain open(), /dev/zero or a sparse file fills
memory before any parse. `read_json` turns each of these into one ToolkitError line naming the file,
what it should have been and the fix, as the spec loader does for YAML (spec.read_spec_text).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.errors import ToolkitError
from toolkit.base.paths import display_path

# The largest JSON file the toolkit reads: a conda-meta record of a CUDA or torch package lists every file
# with its sha256, a few MB (the largest of the cu126 line's prefix, libcublas, is 0.2 MB; libtorch's 3 MB).
MAX_JSON_BYTES = 64 << 20


def read_json(path: Path, what: str, fix: str, limit: int = MAX_JSON_BYTES) -> Any:
    """The parsed content of the JSON file at `path`, or a one-line ToolkitError
    "path[:line]: unreadable WHAT (reason; FIX)". The caller checks the value's shape."""
    where = display_path(path)
    return parse_json(_regular_file_bytes(Path(path), limit, where, what, fix), where, what, fix)


def parse_json(data: bytes | str, where: str, what: str, fix: str) -> Any:
    """JSON text already read (an archive member, an index's answer); `where` names its source."""
    try:
        text = data.decode("utf-8-sig") if isinstance(data, bytes) else data
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ToolkitError(
            f"{where}:{exc.lineno}: unreadable {what} (not JSON: {exc.msg} at column "
            f"{exc.colno}; {fix})"
        ) from None
    except UnicodeDecodeError as exc:
        raise _unreadable(
            where,
            what,
            f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} at offset {exc.start}",
            fix,
        ) from None
    except RecursionError:
        raise _unreadable(where, what, "nested too deeply to parse", fix) from None
    except ValueError:  # the only other one json.loads raises: int() refusing a very long number
        raise _unreadable(
            where, what, f"a number of more than {sys.get_int_max_str_digits()} digits", fix
        ) from None


def _regular_file_bytes(path: Path, limit: int, where: str, what: str, fix: str) -> bytes:
    """At most `limit` bytes of a regular file (bounded_read), or the reason as one line."""
    try:
        return regular_file_bytes(path, limit)
    except Unreadable as exc:
        reason = exc.reason(limit)
        raise _unreadable(where, what, reason, fix) from None


def _unreadable(where: str, what: str, reason: str, fix: str) -> ToolkitError:
    return ToolkitError(f"{where}: unreadable {what} ({reason}; {fix})")
