"""One gcc cap per nvcc (toolkit/knowledge/nvcc_gcc.py): the spec rule and the machine check answer from it alike.

The header case reads the real nvcc 13.0 of tests/cuda_toolchain.py (NVIDIA's PyPI wheels: in CI the py-cu130 lock's); the other
lines' caps are the knowledge's (toolkit/knowledge/cuda_lines.yaml, each with its source).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from cuda_toolchain import HOST_CONFIG
from hypothesis import given, settings
from hypothesis import strategies as st

from toolkit.knowledge.facts import load_knowledge
from toolkit.knowledge.nvcc_gcc import (
    CUDA_LINES_FILE,
    GccCap,
    gcc_cap,
    host_config_cap,
    lines_accepting,
)
from toolkit.machine import checks as machine_checks
from toolkit.machine.fingerprint import Fingerprint, from_dict
from toolkit.spec import rules
from toolkit.spec.rules import checked_spec

ROOT = Path(__file__).resolve().parent.parent
KB = load_knowledge()
H200 = from_dict(json.loads((ROOT / "tests" / "fingerprints" / "healthy-h200.json").read_text())["fingerprint"])
SPEC = checked_spec(ROOT / "envs" / "gpu-machine.yaml")  # external: the conda packaging rule stays out of it


def machine(cuda: str, gcc: int) -> Fingerprint:
    """The recorded H200 machine (tests/fingerprints/healthy-h200.json) with this nvcc line and gcc major."""
    return replace(H200, nvcc_version=f"{cuda}.0", gcc_version=f"{gcc}.1.0", host_config_h=None)


@settings(max_examples=60, deadline=None)
@given(cuda=st.sampled_from(sorted(KB.cuda_lines)), gcc=st.integers(min_value=7, max_value=20))
def test_the_spec_rule_and_the_machine_check_agree_for_every_line_and_gcc(cuda, gcc):
    spec = replace(SPEC, cuda=cuda, gcc=str(gcc))
    refused_by_spec = rules.gcc_within_nvcc(spec, KB) is not None
    finding = machine_checks.host_gcc(machine(cuda, gcc), None)
    assert refused_by_spec == (finding.status == "fail") == (gcc > KB.cuda_lines[cuda].max_gcc)
    if refused_by_spec:
        assert f"max gcc {KB.cuda_lines[cuda].max_gcc}" in rules.gcc_within_nvcc(spec, KB)
        assert f"per {CUDA_LINES_FILE}" in finding.message


def test_the_header_read_from_the_machine_wins_over_the_knowledge():
    assert gcc_cap("12.6", KB, header_cap=11, host_config_h="/x/crt/host_config.h") == GccCap(11, "/x/crt/host_config.h")
    assert gcc_cap("12.6", KB) == GccCap(KB.cuda_lines["12.6"].max_gcc, CUDA_LINES_FILE)
    assert gcc_cap("9.9", KB) is None and gcc_cap(None, KB) is None
    finding = machine_checks.host_gcc(machine("12.6", 12), 11)  # gcc 12 is within 12.6's knowledge, not the header
    assert finding.status == "fail" and "(max gcc 11, per crt/host_config.h)" in finding.message


@pytest.mark.nvcc
def test_the_real_nvcc_13_header_agrees_with_the_knowledge():
    assert host_config_cap(str(HOST_CONFIG)) == KB.cuda_lines["13.0"].max_gcc
    assert host_config_cap(None) is None and host_config_cap("/nonexistent/host_config.h") is None


def test_the_alternative_line_is_the_first_that_accepts_the_gcc():
    newest = max(line.max_gcc for line in KB.cuda_lines.values())
    accepting = lines_accepting(newest, KB)
    assert accepting and all(KB.cuda_lines[c].max_gcc >= newest for c in accepting)
    oldest = min(KB.cuda_lines, key=lambda c: KB.cuda_lines[c].max_gcc)
    message = rules.gcc_within_nvcc(replace(SPEC, cuda=oldest, gcc=str(newest)), KB)
    assert message and message.endswith(f" or CUDA {accepting[0]}+)")
    assert lines_accepting(newest + 1, KB) == []
