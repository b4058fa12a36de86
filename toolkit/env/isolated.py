"""Process isolation: run one function in a fresh interpreter that ends with os._exit.

py-rattler sometimes crashes at interpreter exit after a solve or install (3-10% of runs, see
docs/conda-offline.md); a worker that skips finalization avoids it, and keeps py-rattler's runtime
out of the caller's process. The function travels by module and name, its arguments and result by
pickle; ToolkitErrors cross back as ToolkitErrors, anything else as one line after its traceback.
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import sys
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from toolkit.base.atomic import owned_dir
from toolkit.base.children import run_tied
from toolkit.base.errors import ToolkitError


def run_isolated(function: Callable[..., Any], *args: Any) -> Any:
    """function(*args) in a worker interpreter; its result, or its ToolkitError raised here."""
    with owned_dir(Path(tempfile.gettempdir()), "worker") as tmp:
        job, result = tmp / "job.pickle", tmp / "result.pickle"
        job.write_bytes(pickle.dumps((function.__module__, function.__qualname__, args)))
        code = "from toolkit.env.isolated import worker_main; worker_main()"
        # an interruption kills and waits for the worker (run_tied does) before tmp is removed; a SIGKILL of this
        # process ends it too (base/children's supervisor)
        process = run_tied([sys.executable, "-c", code, str(job), str(result)])
        if not result.exists():
            raise ToolkitError(
                f"{function.__qualname__}: worker process died (exit {process.returncode}; "
                f"re-run the same command)"
            )
        status, value = pickle.loads(result.read_bytes())
    if status == "error":
        raise ToolkitError(value)
    return value


def worker_main() -> None:
    """The worker's side: run the pickled job, write the outcome, and leave without finalization."""
    job, result = Path(sys.argv[1]), Path(sys.argv[2])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its parent handles Ctrl-C (and kills it)
    module, name, args = pickle.loads(job.read_bytes())
    try:
        outcome = ("ok", getattr(importlib.import_module(module), name)(*args))
    except ToolkitError as exc:
        outcome = ("error", str(exc))
    except Exception as exc:  # a bug, not bad input: keep its traceback visible
        traceback.print_exc()
        outcome = (
            "error",
            f"{name}: internal error {exc.__class__.__name__}: {exc} (traceback above)",
        )
    result.write_bytes(pickle.dumps(outcome))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
