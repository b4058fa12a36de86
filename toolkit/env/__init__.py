"""A line's environment: the lock (conda and pip layers, FA4's wheels), the engines that solve and install it,
the install record.
"""

# The wing's face: what other wings and the entry may import from it, as module or module.name (tests/test_wings.py
# holds every import across wings to this list and every entry to a use).
PUBLIC = (
    "download.fetch_content_pinned",
    "download.fetch_verified",
    "engine.locking_environment",
    "fa4_lock.read_fa4_lock",
    "fa4_lock.write_fa4_lock",
    "install.register",
    "install_record.Fa4Record",
    "install_record.PrefixRecord",
    "install_record.record_rows",
    "lock.PipTarget",
    "lock.missing_lock",
    "lock.register",
    "lock.virtual_packages",
    "lockfile.FAST_LOADER",
    "lockfile.KEY_DIGEST",
    "lockfile.KEY_LINE",
    "lockfile.KEY_PYLOCK_SHA256",
    "lockfile.LockedEnv",
    "lockfile.LockedPackage",
    "lockfile.LockedSdist",
    "lockfile.lock_digest",
    "lockfile.read_lock",
    "lockfile.stale_reason",
    "pypi_install.cuda_home",
    "pypi_install.site_packages",
    "pypi_lock",
    "standin.record_hash",
)
