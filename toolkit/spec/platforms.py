"""The conda platforms a line may lock and build for: the spec checks a line's list against them, the lock reader
a lock's (a module of its own, so that reading a lock does not import the spec's loader)."""

PLATFORMS = ("linux-64", "linux-aarch64")
