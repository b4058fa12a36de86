"""`toolkit doctor`: the facts gathered once, the rows judged from them."""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = ("command.register",)
