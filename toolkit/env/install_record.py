"""Install records: what the toolkit installed into a folder, read and written only here.

Two installs leave one, written last and atomically, so a folder with a record holds a finished install:
- `toolkit install` in a conda prefix: `PrefixRecord` (etc/fa-envkit/lock.json), which lock made it and
  for which folder. It also makes the prefix the toolkit's own: install never replaces or deletes a folder
  without one written for that folder.
- `toolkit fa4 install` in its --target folder: `Fa4Record` (fa4-install.json), the wheels installed,
  what came from the base python, and what PYTHONPATH must hold.

Both are typed dataclasses with a schema number (1: records written before the number was recorded have
none); reading validates every field's type (pydantic, as for the build record), so a record of another
shape is no record rather than a half-filled object, and one of a schema this toolkit does not know is
refused with the command that writes it anew (each `load` names it).
"""

from __future__ import annotations

import csv
import io
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import ClassVar, Self

import pydantic

from toolkit.base.atomic import write_atomic
from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.errors import ToolkitError, first_problem
from toolkit.base.jsonfile import read_json
from toolkit.base.paths import display_path
from toolkit.base.typed import adapter
from toolkit.base.versioned import Format


@dataclass(frozen=True)
class InstallRecord:
    """The one reader and writer of install records; each kind names its FILE inside the folder."""

    FILE: ClassVar[Path]
    SCHEMA: ClassVar[int] = 1

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "schema": self.SCHEMA}, indent=2) + "\n"

    def write(self, folder: Path) -> Path:
        """Atomically: a reader sees the whole record or none."""
        path = Path(folder) / self.FILE
        write_atomic(path, self.to_json())
        return path

    @classmethod
    def from_json(cls, data: object) -> Self:
        """A record from parsed JSON; ValueError unless it is this kind's, of this schema (records
        written before the schema number was recorded have none: schema 1)."""
        current = Format(cls.__name__, cls.SCHEMA, unnumbered=1).current(data)
        fields = {key: value for key, value in current.items() if key != "schema"}
        try:
            return adapter(cls).validate_python(fields)
        except pydantic.ValidationError as exc:
            raise ValueError(first_problem(exc)) from None

    @classmethod
    def read(cls, folder: Path) -> Self | None:
        """The folder's record, or None when it has none (or one this toolkit did not write)."""
        try:
            return cls.load(folder, "")
        except ToolkitError:
            return None

    @classmethod
    def load(cls, folder: Path, fix: str) -> Self:
        """The folder's record; a one-line ToolkitError naming the file and `fix` when there is none."""
        path = Path(folder) / cls.FILE
        data = read_json(path, "install record", fix)
        try:
            return cls.from_json(data)
        except ValueError as exc:  # from_json's own: one line
            raise ToolkitError(
                f"{display_path(path)}: unreadable install record ({exc}; {fix})"
            ) from None


@dataclass(frozen=True)
class PrefixRecord(InstallRecord):
    """A prefix `toolkit install` made (a conda prefix, a pypi line's venv): which lock, for which platform,
    from which inputs."""

    FILE: ClassVar[Path] = Path("etc") / "fa-envkit" / "lock.json"

    line: str
    lock: str
    platform: str
    input_hash: str
    lock_sha256: str
    prefix: str | None = (
        None  # the folder it was written for (a copy elsewhere is no record there); None before
    )
    written: list[str] = field(
        default_factory=list
    )  # paths the toolkit made that no installer's record lists
    stand_ins: dict[str, str] = field(
        default_factory=dict
    )  # name -> "version from <site-packages>" (--torch-from)


@dataclass(frozen=True)
class Fa4Record(InstallRecord):
    """A folder `toolkit fa4 install` filled: FA4's wheels, what the base python gave, PYTHONPATH."""

    FILE: ClassVar[Path] = Path("fa4-install.json")

    release: str
    cuda_major: str
    target: str
    python: str
    installed: list[str]  # name==version
    from_base: dict[str, str]  # distributions the target python already had and that were used
    python_path: list[str]  # what PYTHONPATH must hold for `import flash_attn.cute`
    flash_attn_2: str | None = None  # the flash-attn 2.x version in the same folder, if any
    replaced_from_flash_attn_2: list[str] = field(
        default_factory=list
    )  # its flash_attn/cute files, given way

    def env(self) -> dict[str, str]:
        return {"PYTHONPATH": os.pathsep.join(self.python_path)}


# The largest RECORD read: torch's, the largest of a line's, lists ~20,000 files in ~2 MB.
MAX_RECORD_BYTES = 64 << 20


def record_rows(path: Path, fix: str) -> list[list[str]]:
    """The rows of a pip RECORD (csv: path, hash, size), the one reader of them; unreadable is one line,
    and a FIFO, a device or a huge file in its place is refused unread (bounded_read)."""
    try:
        text = regular_file_bytes(path, MAX_RECORD_BYTES).decode()
        return [row for row in csv.reader(io.StringIO(text, newline="")) if row]
    except Unreadable as exc:
        reason = exc.reason(MAX_RECORD_BYTES)
    except (csv.Error, UnicodeDecodeError) as exc:
        reason = exc.__class__.__name__
    raise ToolkitError(f"{display_path(path)}: unreadable ({reason}; {fix})")
