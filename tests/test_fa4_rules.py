"""FA4 in a line's spec (issue 16): the `flash_attn_4:` section and the rules that refuse impossible
combinations before anything is installed. Specs are the project's real envs/*.yaml, copied, with a
child line on top."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from toolkit.cli import main
from toolkit.spec import rules
from toolkit.spec.envspec import Fa4Request, load_spec

ROOT = Path(__file__).resolve().parent.parent


def line(tmp_path: Path, text: str, name: str = "cu130") -> Path:
    envs = tmp_path / "envs"
    shutil.copytree(ROOT / "envs", envs, dirs_exist_ok=True)
    path = envs / f"{name}-fa4.yaml"
    path.write_text(text)
    return path


def messages(path: Path) -> dict[str, str]:
    return {v.field: str(v) for v in rules.violations(load_spec(path))}


def test_the_fa4_line_of_the_gpu_machine_passes_every_rule():
    spec = load_spec(ROOT / "envs" / "gpu-machine-fa4.yaml")
    assert spec.flash_attn_4 == Fa4Request("4.0.0b40", with_flash_attn_2=False)
    assert rules.violations(spec) == []
    assert load_spec(ROOT / "envs" / "gpu-machine.yaml").flash_attn_4 is None


def test_fa4_on_sm80_is_refused_with_the_file_and_line(tmp_path):
    path = line(tmp_path, 'extends: cu130\narchs: ["80", "90"]\nflash_attn_4:\n  version: "4.0.0b36"\n'
                          '  with_flash_attn_2: false\nplatforms: [linux-64]\n')
    found = messages(path)
    assert list(found) == ["archs"]
    assert found["archs"].startswith(f"{path.name}:2: archs: flash-attn-4 4.0.0b36 needs sm_90+") or \
        ":2: archs: flash-attn-4 4.0.0b36 needs sm_90+" in found["archs"]
    assert "sm_80" in found["archs"]


def test_beside_fa2_is_allowed_for_a_read_fa2_and_refused_for_another(tmp_path):
    """cu130's flash-attn 2.8.3.post2 is in beside_flash_attn_2 (its package read); an unread FA2 is refused."""
    path = line(tmp_path, 'extends: cu130\narchs: ["90"]\nflash_attn_4:\n  version: "4.0.0b36"\n')
    assert load_spec(path).flash_attn_4.with_flash_attn_2
    assert "flash_attn_4.with_flash_attn_2" not in messages(path)
    other = line(tmp_path, 'extends: cu130\narchs: ["90"]\nflash_attn_2:\n  version: "2.8.3"\n'
                           'flash_attn_4:\n  version: "4.0.0b36"\n')
    found = messages(other)
    assert "flash_attn_4.with_flash_attn_2" in found, found
    assert "both install flash_attn/cute" in found["flash_attn_4.with_flash_attn_2"]
    assert "2.8.3.post2" in found["flash_attn_4.with_flash_attn_2"]


def test_a_platform_without_pinned_wheels_is_refused(tmp_path):
    found = messages(line(tmp_path, 'extends: cu130\narchs: ["90"]\nflash_attn_4:\n  version: "4.0.0b36"\n'))
    assert "pinned for linux-64 only, the line also locks linux-aarch64" in found.get("platforms", ""), found
    found = messages(line(tmp_path, 'extends: cu130\narchs: ["90"]\nplatforms: [linux-64]\nflash_attn_4:\n'
                                    '  version: "4.0.0b36"\n'))
    assert "platforms" not in found, found


@pytest.mark.parametrize("text,field,words", [
    ('flash_attn_4:\n  version: "4.0.0b99"\n  with_flash_attn_2: false\n', "flash_attn_4.version",
     "no hash-pinned wheels"),
    ('flash_attn_4:\n  with_flash_attn_2: false\n', "flash_attn_4", "needs a version"),
    ('python: "3.11"\nflash_attn_4:\n  version: "4.0.0b36"\n  with_flash_attn_2: false\n', "python",
     "do not run on Python 3.11"),
])
def test_unknown_release_missing_version_and_unpinned_python(tmp_path, text, field, words):
    path = line(tmp_path, 'extends: cu130\narchs: ["90"]\n' + text)
    found = messages(path)
    assert field in found and words in found[field], found


@pytest.mark.parametrize("parent,words", [("cu118", "comes for CUDA 12, 13 only"),
                                          ("cu126", "pins the libs-cu13 flavor of nvidia-cutlass-dsl only")])
def test_the_cutlass_dsl_flavor_must_exist_and_be_pinned_for_the_cuda_major(tmp_path, parent, words):
    path = line(tmp_path, f'extends: {parent}\narchs: ["90"]\nflash_attn_4:\n  version: "4.0.0b36"\n'
                          '  with_flash_attn_2: false\n', name=parent)
    found = messages(path)
    assert words in found.get("cuda", ""), found


def test_toolkit_check_reports_it_in_one_line_per_problem(tmp_path, capsys):
    path = line(tmp_path, 'extends: cu130\narchs: ["80"]\npython: "3.11"\nflash_attn_4:\n  version: "4.0.0b36"\n')
    assert main(["check", str(path)]) == 1  # archs, python and platforms (cu130 also locks linux-aarch64)
    out = capsys.readouterr()
    lines = [x for x in (out.out + out.err).splitlines() if "flash-attn-4" in x]
    assert len(lines) == 3 and all(x.count("\n") == 0 for x in lines)
