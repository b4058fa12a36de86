"""tests/test_pypi_install.py's real flash-attn kernel compile, with py-cu132-fa3's venv (nvcc 13.2.86, torch 2.15.0
headers) instead of py-cu130's: flash_fwd_hdim32_fp16_sm80.cu for sm_80, sm_100, sm_120, then the arch check."""
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, "/work/wt/fa3cu132")
sys.path.insert(0, "/work/wt/fa3cu132/tests")
from test_pypi_install import BLACKWELL_LINE_ARCHS, FA_NVCC_FLAGS
from test_replica import _torch_include_flags

from toolkit.knowledge.archs import ArchCoverage, compiled_entries, cubin_archs
from toolkit.machine.line_env import include_environment

prefix = Path("/work/wt/fa3cu132/.envs/py-cu132-fa3")
site = prefix / "lib/python3.11/site-packages"
home = site / "nvidia/cu13"
src = Path(sys.argv[1])
inc = subprocess.run([str(prefix / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                     capture_output=True, text=True, check=True).stdout.strip()
flags = [*_torch_include_flags(str(site), home), f"-I{src}/csrc/flash_attn", f"-I{src}/csrc/flash_attn/src",
         f"-I{src}/csrc/cutlass/include", f"-I{inc}", "-D_GLIBCXX_USE_CXX11_ABI=1"]
env = {**{k: v for k, v in os.environ.items() if k not in ("CPATH", "CPLUS_INCLUDE_PATH", "C_INCLUDE_PATH")},
       **include_environment(home), "PATH": f"{home / 'bin'}{os.pathsep}{os.environ['PATH']}"}
gencode = [a for arch in BLACKWELL_LINE_ARCHS for a in ("-gencode", f"arch=compute_{arch},code=sm_{arch}")]
out = Path(sys.argv[2])
started = time.monotonic()
done = subprocess.run([str(home / "bin/nvcc"), "-c", *FA_NVCC_FLAGS, *gencode, "--threads", "1", *flags,
                       f"{src}/csrc/flash_attn/src/flash_fwd_hdim32_fp16_sm80.cu", "-o", str(out)],
                      capture_output=True, text=True, env=env)
print("nvcc exit", done.returncode, f"{time.monotonic() - started:.0f} s", done.stderr[-2000:])
c = ArchCoverage.of(BLACKWELL_LINE_ARCHS, compiled_entries(out))
print("coverage:", c.missing, c.summary(), "pure-python:", sorted(cubin_archs(out)))
