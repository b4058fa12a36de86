"""verl's keys, as `toolkit recommend` writes them, checked against the real verl release on PyPI.

The knowledge (toolkit/knowledge/attention_backends.yaml, `verl`) pins verl 0.9.1's wheel by url and sha256; this
test fetches it through the toolkit's one download cache (toolkit/env/download.py), checks the pin against
PyPI's JSON API, and reads the wheel's own files: the generated trainer config must have a mapping at every
`<model>.override_config` the override lines name, verl's model config must fall back to the default the
knowledge names, and every transformers verl accepts must have flash_attention_4 by doctor's table.
Needs PyPI: skipped without it, failed in CI (FA_REQUIRE_PYPI=1).
"""

from __future__ import annotations

import hashlib
import json
import re
import urllib.error
import urllib.request
import zipfile
from email.parser import Parser

import pytest
import yaml
from conftest import pypi_unreachable
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from toolkit.attention import backends
from toolkit.doctor.command import doctor_knowledge
from toolkit.env.download import fetch_verified

pytestmark = pytest.mark.network
PYPI_JSON = "https://pypi.org/pypi/verl/json"  # the project's JSON: releases -> files with url and sha256


def _pypi_json() -> dict:
    try:
        with urllib.request.urlopen(PYPI_JSON, timeout=60) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as exc:
        pytest.fail(f"{PYPI_JSON}: PyPI answered {exc.code} {exc.reason}")
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        pypi_unreachable(exc)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> zipfile.ZipFile:
    """The pinned verl wheel, its pin first checked against what PyPI publishes for that release."""
    facts = backends.verl()
    published = {f["filename"]: f for f in _pypi_json()["releases"][facts.version]}
    entry = published[facts.wheel.filename]
    assert entry["digests"]["sha256"] == facts.wheel.sha256 and entry["size"] == facts.wheel.size
    # PyPI's url is absolute (files.pythonhosted.org/packages/...); a mirror may answer with a relative one
    assert entry["url"].rsplit("/packages/", 1)[1] == facts.wheel.url.rsplit("/packages/", 1)[1]
    path = fetch_verified(facts.wheel, tmp_path_factory.mktemp("verl-wheel"), f"verl {facts.version} wheel")
    assert hashlib.sha256(path.read_bytes()).hexdigest() == facts.wheel.sha256
    return zipfile.ZipFile(path)


def test_every_override_key_is_a_model_section_of_verl_s_trainer_config(wheel):
    facts = backends.verl()
    config = yaml.safe_load(wheel.read(facts.trainer_config))
    keys = facts.keys()
    assert keys == ["actor_rollout_ref.model.override_config.attn_implementation",
                    "critic.model.override_config.attn_implementation"]
    for key in keys:
        *parents, leaf = key.split(".")
        node = config
        for part in parents:
            assert isinstance(node, dict) and part in node, (key, part)
            node = node[part]
        assert node == {} and leaf == "attn_implementation"  # override_config ships empty: the line adds the key
        model = config
        for part in parents[:-1]:
            model = model[part]
        assert model["_target_"] == "verl.workers.config.HFModelConfig"  # the class that reads override_config


def test_verl_falls_back_to_the_default_the_knowledge_names(wheel):
    source = wheel.read("verl/workers/config/model.py").decode()
    found = re.findall(r'override_config\.get\("attn_implementation", "([a-z_0-9]+)"\)', source)
    assert found == [backends.verl().default_attn_implementation] == ["flash_attention_2"]


def test_every_transformers_verl_accepts_has_flash_attention_4(wheel):
    """So the recommendation's flash_attention_4 line is one verl's transformers can load."""
    metadata = Parser().parsestr(wheel.read(f"verl-{backends.verl().version}.dist-info/METADATA").decode())
    wanted = [Requirement(r) for r in metadata.get_all("Requires-Dist")]
    transformers = next(r for r in wanted if r.name == "transformers" and r.marker is None)
    lowest = min(Version(s.version) for s in transformers.specifier if s.operator == ">=")
    fa4 = next(e for e in doctor_knowledge().attn_implementations if e["name"] == "flash_attention_4")
    assert lowest in SpecifierSet(fa4["transformers"]) and lowest == Version("5.5.3")

