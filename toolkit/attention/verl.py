"""What a verl user pastes to train with the recommended attention: override lines and a YAML fragment.

verl (an RL post-training framework on transformers) loads every model with
`<model>.override_config.attn_implementation`, flash_attention_2 when the config names none
(knowledge/attention_backends.yaml, `verl`). verl trains, so the shape that counts is forward+backward,
causal; the recommendation's rule for that shape names the backend, and this module says it in verl's keys.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import asdict, dataclass, field

from toolkit.attention.backends import backends, by_attn_implementation, verl


@dataclass(frozen=True)
class VerlShape:
    """The training shape the verl lines are chosen for (verl trains causal language models)."""

    head_dim: int = 128
    seqlen: int = 4096
    dtype: str = "bfloat16"
    causal: bool = True
    mode: str = "fwd+bwd"

    def __str__(self) -> str:
        return f"{self.dtype} d{self.head_dim}{' causal' if self.causal else ''} {self.mode} seqlen {self.seqlen}"


@dataclass(frozen=True)
class VerlLines:
    verl: str  # the verl release whose keys these are
    shape: str
    backend: str | None  # None: no verified backend was measured at the shape
    attn_implementation: str | None
    overrides: list[str] = field(
        default_factory=list
    )  # command-line overrides, one per model section
    yaml: str = ""  # the same as a fragment of the trainer config
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return asdict(self)


def overrides(attn_implementation: str) -> list[str]:
    return [f"{key}={attn_implementation}" for key in verl().keys()]


def yaml_fragment(attn_implementation: str) -> str:
    """The same keys nested as the trainer config nests them."""
    import yaml

    tree: dict = {}
    for key in verl().keys():
        *parents, leaf = key.split(".")
        node = tree
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = attn_implementation
    return yaml.safe_dump(tree, sort_keys=False)


def lines_for(
    shape: VerlShape, backend: str | None, measured: dict[str, float], verified: Collection[str]
) -> VerlLines:
    """verl's lines for the backend recommended at `shape` (`measured`: TFLOP/s there per backend)."""
    facts = verl()
    if backend is None:
        return VerlLines(
            facts.version,
            str(shape),
            None,
            None,
            notes=[
                f"no verified backend was measured at {shape}: bench that shape (toolkit bench LINE --head-dims "
                f"{shape.head_dim}) and pass the verification reports with --verified"
            ],
        )
    chosen = backends()[backend]
    name = chosen.attn_implementation
    notes = [
        note
        for note in (
            _sdpa_note(chosen.sdpa_backend, backend),
            _default_note(facts.default_attn_implementation, backend, measured, verified),
        )
        if note
    ]
    return VerlLines(
        facts.version, str(shape), backend, name, overrides(name), yaml_fragment(name), notes
    )


def _sdpa_note(kernel: str | None, backend: str) -> str:
    if not kernel:
        return ""
    return (
        f"{backend} is SDPA's {kernel} kernel: verl passes only attn_implementation=sdpa and torch picks the "
        f"kernel, so this speed is not guaranteed (verl's config cannot pin an SDPA kernel)"
    )


def _default_note(
    default: str, backend: str, measured: dict[str, float], verified: Collection[str]
) -> str:
    """How verl's own default fares at the shape, where it is not the recommendation."""
    known = by_attn_implementation(default)
    if known is None or known.name == backend:
        return ""
    if known.name not in verified:
        return f"verl's default {default} ({known.name}) was not verified on this GPU: it is not recommended"
    if known.name not in measured or not measured.get(backend):
        return f"verl's default {default} ({known.name}) was not measured at this shape"
    return (
        f"verl's default {default} ({known.name}) measured {measured[known.name]:.0f} TFLOP/s here, "
        f"{measured[known.name] / measured[backend]:.2f}x the recommended {backend}"
    )
