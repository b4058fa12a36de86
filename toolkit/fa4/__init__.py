"""FlashAttention-4: its install beside flash-attn 2, its kernel cache, its verbs.
"""
