"""A report's conditions: the fast parse of well-formed ones and the validating one agree,
bad ones name the field, and a parsed condition copies and pickles as itself."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shared.domain.errors import ValidationError
from shared.domain.health import Condition, ConditionStatus

T = 1_800_000_000.0

conditions = st.fixed_dictionaries(
    {"type": st.sampled_from(["XidError", "EccUncorrectable", "ThermalThrottling"]),
     "status": st.sampled_from(["true", "false", "unknown", "TRUE", "False"]),
     "reason": st.one_of(st.text(max_size=8), st.integers()),
     "since": st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.integers())},
    optional={"details": st.one_of(st.none(), st.dictionaries(st.text(max_size=4),
                                                                st.integers(), max_size=2))})


@given(st.lists(conditions, max_size=6))
def test_the_fast_parse_builds_what_the_validators_would(raw: list[dict[str, Any]]) -> None:
    """Well-formed conditions take the fast path (a float ``since``, a lower-case status);
    the others the validators: either way the same condition."""
    want = tuple(Condition(c["type"], ConditionStatus(c["status"].lower()), str(c["reason"]),
                           float(c["since"]), dict(c.get("details") or {})) for c in raw)
    assert Condition.parse_all(raw) == want


@pytest.mark.parametrize(("bad", "field"), [
    ({"type": "XidError", "status": "maybe", "reason": "", "since": T}, "status"),
    ({"status": "true", "reason": "", "since": T}, "type"),
    ({"type": "XidError", "status": "true", "reason": ""}, "since"),
    ({"type": "XidError", "status": "true", "since": T, "details": [1]}, "details"),
])
def test_a_bad_condition_names_its_field(bad: dict[str, Any], field: str) -> None:
    good = {"type": "XidError", "status": "false", "reason": "", "since": T}
    with pytest.raises(ValidationError) as err:
        Condition.parse_all([good, bad])
    assert err.value.path == field


def test_a_parsed_condition_copies_pickles_and_keeps_its_details_its_own() -> None:
    details = {"xids": [79]}
    plain, with_details = Condition.parse_all([
        {"type": "XidError", "status": "false", "reason": "", "since": T},
        {"type": "XidError", "status": "true", "reason": "Xid 79", "since": T,
         "details": details}])
    details["xids"].append(48)
    details["gpus"] = [0]
    assert with_details.details == {"xids": [79, 48]}  # a copy of the mapping (not deep)
    for cond in (plain, with_details):
        assert copy.deepcopy(cond) == cond
        assert pickle.loads(pickle.dumps(cond)) == cond
    assert plain.details == {} and dict(plain.details) == {}
    assert plain.status is ConditionStatus.FALSE
    assert plain.to_dict()["details"] == {}
