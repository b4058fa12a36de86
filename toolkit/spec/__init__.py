"""A line's spec: the strict loader, the compatibility rules over the knowledge, the patches a line needs."""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "envspec.EnvSpec",
    "envspec.load_spec",
    "envspec.resolve_spec_arg",
    "envspec.spec_paths",
    "fa4",
    "patches",
    "patches.AppliedPatch",
    "patches.PatchRecord",
    "platforms.PLATFORMS",
    "rules.checked_spec",
    "rules.register",
)
