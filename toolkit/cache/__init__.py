"""The binary cache: built wheels published as a static index and substituted for a build with the same inputs."""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "config.CacheSite",
    "config.configured_caches",
    "export.register",
    "installed.InstalledBuild",
    "installed.identify",
    "kernel_cache.InstalledKernelCache",
    "kernel_cache.identify_kernel_cache",
    "kernel_cache.install_kernel_cache_command",
    "provenance.BuildFacts",
    "provenance.Dependency",
    "publish.Publication",
    "publish.publish",
    "runtime_lock.install_runtime_command",
    "runtime_lock.lock_runtime_command",
    "simple.Link",
    "simple.write_pages",
    "substitute.Substitute",
    "substitute.fetch_substitute",
    "table.Signer",
)
