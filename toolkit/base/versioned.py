"""File formats that carry their version: each file the toolkit writes records a schema number, and its reader
brings an older file up to the current schema one step at a time (so a record from ten GPU minutes ago is read,
not rebuilt) or refuses a schema it does not know in one line, which each reader words with the command that
writes the file anew.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

Upgrade = Callable[[dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class Format:
    """One file format: its name, the schema this toolkit writes, and how each older schema becomes the next."""

    what: str  # "build record": how a refusal names the file's kind
    schema: int  # the schema written now
    upgrades: Mapping[int, Upgrade] = field(
        default_factory=dict
    )  # schema n's data -> schema n + 1's
    unnumbered: int | None = (
        None  # the schema of files written before the number was recorded (None: refused)
    )

    def current(self, data: object) -> dict[str, Any]:
        """`data` as the current schema (its "schema" key included); ValueError, one line, when it cannot be."""
        if not isinstance(data, dict):
            raise ValueError(f"not a {self.what}: a JSON object was expected")
        schema = data.get("schema", self.unnumbered)
        if type(schema) is not int:
            raise ValueError(f"not a {self.what}: no schema number")
        while schema != self.schema:
            upgrade = self.upgrades.get(schema)
            if upgrade is None:
                known = (
                    f"schemas {min(self.upgrades)} to {self.schema}"
                    if self.upgrades
                    else f"schema {self.schema}"
                )
                raise ValueError(f"a {self.what} of schema {schema}; this toolkit reads {known}")
            schema += 1
            data = {**upgrade(data), "schema": schema}
        return {**data, "schema": schema}
