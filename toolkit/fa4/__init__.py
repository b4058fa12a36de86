"""FlashAttention-4: its install beside flash-attn 2, its kernel cache, its verbs."""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "cli.register",
    "install.restore_after_flash_attn_2",
    "jit.CACHE_DIR_ENV",
    "jit.INSTALLED",
    "jit.cache_entries",
    "jit.cache_record",
    "jit.key_id",
    "jit.unpack",
)
