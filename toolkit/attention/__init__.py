"""Attention backends side by side: which verified one is fastest where (recommend)."""
