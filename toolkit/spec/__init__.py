"""A line's spec: the strict loader, the compatibility rules over the knowledge, the patches a line needs.
"""
