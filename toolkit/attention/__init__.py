"""Attention backends side by side: which verified one is fastest where (recommend)."""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "backends",
    "formats",
    "recommend.Recommendation",
    "recommend.for_parity",
    "recommend.lookup_rules",
    "recommend.read_if_any",
    "recommend.register",
    "recommend.summary",
    "verl.VerlShape",
    "verl.overrides",
)
