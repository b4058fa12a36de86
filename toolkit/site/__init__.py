"""A site's view of many lines: HPC modulefiles, the matrix, Slurm and local scale-out."""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "matrix.register",
    "modules.register",
    "publish.register",
)
