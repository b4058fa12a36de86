"""This machine against a line: the toolchain fingerprint, where the line's environment is, the checks that
refuse or warn.
"""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "checks",
    "fingerprint.Fingerprint",
    "fingerprint.Gpu",
    "fingerprint.from_dict",
    "line_env",
    "line_env.LineEnvironment",
    "preflight.preflight_input",
    "preflight.run_preflight",
)
