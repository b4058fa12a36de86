"""envspec's versions of conda packages read without py-rattler (PLAIN_CONDA_VERSION) are versions rattler's strict
parse reads: the oracle is py-rattler itself, on every form the pattern takes and on forms it leaves to rattler."""

from __future__ import annotations

import pytest
from rattler import MatchSpec
from rattler.exceptions import InvalidMatchSpecError

from toolkit.spec.envspec import PLAIN_CONDA_VERSION, _conda_version

TAKEN = ["*", "3.12.*", "13.0.*", "14.*", "1.*", "2024.1.1.*", ">=13.0", "<14", ">=13.0,<13.1", "==1.2", "!=1.2",
         ">1,<=2.0.1", "==2.14.1", ">=3.10,<3.13,!=3.11.2"]
LEFT = ["1.2", "=1.2", ">=1.2.*", "1.2|1.3", "1.2.3a0", "1.0rc1", "~=1.2", ">= 1.2", "", " *", "1.2,", "1..2",
        "*.*", "1.*.2", ">=1.2 ,<2", "3.12.*\n", "x", "$(id)"]


@pytest.mark.parametrize("text", TAKEN)
def test_each_form_read_without_rattler_is_one_rattler_reads(text):
    assert PLAIN_CONDA_VERSION.fullmatch(text)
    MatchSpec(f"x {text}", strict=True)  # rattler's own verdict: no exception


@pytest.mark.parametrize("text", LEFT)
def test_other_forms_get_rattlers_verdict(text):
    assert not PLAIN_CONDA_VERSION.fullmatch(text)
    try:
        MatchSpec(f"x {text}", strict=True)
    except InvalidMatchSpecError:
        with pytest.raises(ValueError):
            _conda_version(text)
    else:
        _conda_version(text)
