"""plan_domain(): when a rack is drained as one, held by the guard per domain, or left to
the per-node policy. Table tests."""

from __future__ import annotations

import pytest

from shared.domain.errors import ValidationError
from shared.policies.domains import DomainDecisionKind, DomainView, plan_domain
from shared.policies.repair import RepairConfig, load_repair_config

HALF = RepairConfig(domain_drain_fraction=0.5, max_domains_out=1)
RACK = frozenset(f"n{i}" for i in range(4))
D, H, N = DomainDecisionKind.DRAIN, DomainDecisionKind.HOLD, DomainDecisionKind.NONE

# (bad before this diagnosis, drained already, racks drained in the partition, config, kind)
TABLE = [
    ((), False, 0, HALF, N),  # 1 of 4: per node
    (("n1",), False, 0, HALF, D),  # 2 of 4 reaches 0.5: drain
    (("n1", "n2", "n3"), False, 0, HALF, D),
    (("n1",), True, 1, HALF, N),  # drained already: no second drain
    (("n1",), False, 1, HALF, H),  # another rack is out: the guard per domain holds
    (("n1",), False, 1, RepairConfig(domain_drain_fraction=0.5, max_domains_out=2), D),
    (("n1",), False, 0, RepairConfig(domain_drain_fraction=0.75), N),  # 2 of 4 < 0.75
    (("n1", "n2"), False, 0, RepairConfig(domain_drain_fraction=0.75), D),
    (("n1", "n2", "n3"), False, 0, RepairConfig(), N),  # off by default
    (("x9",), False, 0, HALF, N),  # a bad node of another rack does not count
    (("n0",), False, 0, HALF, N),  # the diagnosed node counted once
]


@pytest.mark.parametrize(("bad", "drained", "out", "config", "kind"), TABLE)
def test_plan_domain(bad: tuple[str, ...], drained: bool, out: int, config: RepairConfig,
                     kind: DomainDecisionKind) -> None:
    view = DomainView("r0", RACK, frozenset(bad), drained, out)
    decision = plan_domain(view, "n0", config)
    assert decision.kind is kind
    if kind is not N:
        assert "r0" in decision.reason


def test_a_node_without_a_rack_is_never_part_of_a_domain_decision() -> None:
    view = DomainView("", frozenset({"n0", "n1"}), frozenset({"n1"}), False, 0)
    assert plan_domain(view, "n0", HALF).kind is N


@pytest.mark.parametrize(("mapping", "field"), [
    ({"domain_drain_fraction": 1.5}, "domain_drain_fraction"),
    ({"max_domains_out": -1}, "max_domains_out"),
    ({"max_domains_out": 1.5}, "max_domains_out"),
])
def test_bad_domain_settings_name_the_field(mapping: dict[str, object], field: str) -> None:
    with pytest.raises(ValidationError) as err:
        load_repair_config(mapping)
    assert err.value.path == field
