"""The one error type users see: a single line naming the file and the fix."""

from __future__ import annotations

import reprlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pydantic

SHOWN = reprlib.Repr()
SHOWN.maxstring, SHOWN.maxother, SHOWN.maxlong, SHOWN.maxlist, SHOWN.maxdict, SHOWN.maxlevel = (
    60,
    60,
    40,
    6,
    4,
    2,
)


class ToolkitError(Exception):
    """A failure caused by input or environment, reported as one line, never a traceback."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.exit_code = exit_code


def shown(value: Any) -> str:
    """A value as an error message quotes it: repr (control characters escaped), cut to a readable length."""
    return SHOWN.repr(value)


def first_problem(exc: pydantic.ValidationError) -> str:
    """pydantic's first complaint as "field.path: problem": `rules[3].attn_implementation.sdpa_backend: ']]' is
    not a name`, so the one line says which value to fix (every typed file format's reader uses it)."""
    error = exc.errors()[0]
    at = "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}"
        for part in error["loc"]
        if part != "[key]"
    )
    if error["type"] == "value_error":
        problem = str(error["ctx"]["error"])
    elif error["type"] == "missing":
        problem = "field required"
    else:
        problem = f"{error['msg'][0].lower()}{error['msg'][1:]}, not {shown(error['input'])}"
    return f"{at.lstrip('.') or 'top level'}: {'key: ' if '[key]' in error['loc'] else ''}{problem}"
