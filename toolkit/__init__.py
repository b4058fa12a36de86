"""Reproducible, verified FlashAttention build environments across CUDA lines."""

__version__ = "0.1.0"
