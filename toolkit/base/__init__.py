"""The floor every wing stands on: the one error type, paths, bounded reads, JSON files, atomic writes, digests,
file locks, the workspace's folders.
"""
