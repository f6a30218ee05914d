"""The behavior an operator named (``reportFaultyNodes``) is the one Compute Engine hears."""

from __future__ import annotations

from shared.adapters.compute.gce.api import fault_behavior


def test_a_named_behavior_wins_over_keywords() -> None:
    reason = "host reported faulty: UNRECOVERABLE_GPU_ERROR: slow after Xid 79"
    assert fault_behavior(reason) == "UNRECOVERABLE_GPU_ERROR"
    assert fault_behavior("host reported faulty: BEHAVIOR_UNSPECIFIED: gpu slow") == \
        "BEHAVIOR_UNSPECIFIED"
    assert fault_behavior("Xid 79: replace") == "UNRECOVERABLE_GPU_ERROR"  # by keyword
