"""`toolkit verify LINE --impl NAME` (issue 31): one verb for every implementation's suite, the earlier spellings
(`--backend`, `flash-attn`, `fa4`) answered with the new one, and FA4's options reaching the verb. No torch needed:
these stop before anything is measured."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from toolkit.cli import build_parser, main

ROOT = Path(__file__).resolve().parent.parent


def test_verify_impl_flash_attn_4_help_lists_the_verbs_options():
    """`python -m toolkit verify LINE --impl flash-attn-4 --help`, the check the issue names."""
    done = subprocess.run([sys.executable, "-m", "toolkit", "verify", "gpu-machine", "--impl", "flash-attn-4", "--help"],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          timeout=120)
    assert done.returncode == 0 and done.stderr == ""
    assert "--impl NAME" in done.stdout and "--arch ARCH" in done.stdout and "--level LEVEL" in done.stdout


@pytest.mark.parametrize(("argv", "impl", "notices"), [
    (["--impl", "flash-attn-4", "--arch", "100"], "flash-attn-4", []),
    (["--backend", "flash-attn-3"], "flash-attn-3", ["--backend is now --impl"]),
    (["--backend", "flash-attn"], "flash-attn-2", ["--backend is now --impl", "flash-attn is now flash-attn-2"]),
    (["--impl", "fa4"], "flash-attn-4", ["fa4 is now flash-attn-4"]),
    ([], "flash-attn-2", []),
])
def test_old_spellings_reach_the_same_suite_after_one_notice_each(capsys, argv, impl, notices):
    args = build_parser().parse_args(["verify", "gpu-machine", *argv])
    assert args.impl == impl and args.func.__name__ == "verify_command"
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ", 1)[1] for line in err] == [f"{n}; the old spelling still works" for n in notices]
    assert all(line.startswith("toolkit verify: ") for line in err)


def test_fa3s_parity_level_reaches_the_environment_under_either_spelling(capsys, tmp_path):
    """FA3's parity level was refused ("no transformers parity for FA3 yet"); it has one now (issue 34 item 5), so
    `--level parity` goes on to the line's environment under --impl and --backend alike, the old spelling adding
    only its notice. The interpreter passed does not exist: the run stops there, before anything is measured."""
    missing = tmp_path / "no-env" / "bin" / "python"
    for option in ("--impl", "--backend"):
        assert main(["verify", "gpu-machine-fa3", option, "flash-attn-3", "--level", "parity", "--python",
                     str(missing), "--envs", str(ROOT / "envs"), "--report-dir", str(tmp_path / "reports")]) == 1
        err = capsys.readouterr().err.splitlines()
        # no GPU here: that is said first; on a GPU machine, the missing interpreter
        assert (err[-1] == "error: no CUDA GPU visible (no /dev/nvidia* device): run verification on a GPU machine"
                or f"environment python {missing} does not exist" in err[-1]), err
        assert len(err) == (2 if option == "--backend" else 1)
    assert not (tmp_path / "no-env").exists() and not (tmp_path / "reports").exists()
