"""The shape of one compatibility check, shared by spec/rules.py and each implementation's rule module."""

from __future__ import annotations

from collections.abc import Callable

from toolkit.knowledge.facts import Knowledge
from toolkit.spec.envspec import EnvSpec

# (name, field, check): check(spec, kb) is the problem and its fix as one sentence, or None
Check = tuple[str, str, Callable[[EnvSpec, Knowledge], str | None]]
