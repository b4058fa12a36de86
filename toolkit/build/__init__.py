"""flash-attn built from its sdist against a line's toolchain: sizing, the ninja shim, the record, the
wheelhouse, the diagnosis.
"""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "builder.register",
    "diagnose.diagnose",
    "diagnose.register",
    "record.BuildRecord",
    "record.RECORD_SUFFIX",
    "wheelhouse.records",
)
