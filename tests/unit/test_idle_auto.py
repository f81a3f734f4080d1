"""Issue 46, part 4: ``hibernate`` is the default idle action where the node supports it.

The device plugin says on its Node whether its driver can hibernate kernels
(``gpushare-hub.io/checkpoint``: ``yes`` or ``no: <why>``, core/checkpointing.py); the idle action
``auto``, the service's default, is ``hibernate`` for a slice on such a node and ``notify`` elsewhere.
"""

from __future__ import annotations

import pytest

from gpushare_hub.core import checkpointing
from gpushare_hub.core.isolation import read_node_isolation
from gpushare_hub.core.names import CHECKPOINT_ANNOTATION
from gpushare_hub.service.idle import AUTO, HIBERNATE, NONE, NOTIFY, PARK, IdleRule
from gpushare_hub.service.settings import ServiceSettings


@pytest.mark.parametrize(
    ("driver", "machine", "mps", "said"),
    [
        ("580.159.04", "x86_64", False, "yes"),
        ("570.86.10", "x86_64", False, "yes"),
        ("simulated", "x86_64", False, "yes"),
        (
            "550.54.15",
            "x86_64",
            False,
            "no: driver 550.54.15 has no CUDA checkpoint API (it needs 570 or newer)",
        ),
        ("", "x86_64", False, "no: the driver's version is unknown (the checkpoint API needs 570 or newer)"),
        ("580.159.04", "aarch64", False, "no: CUDA's checkpoint is x86-64 only, and this node is aarch64"),
        (
            "580.159.04",
            "x86_64",
            True,
            "no: MPS runs on this node, and gpushare-hub does not hibernate MPS clients",
        ),
    ],
)
def test_the_plugin_says_whether_its_node_can_hibernate_kernels(driver, machine, mps, said):
    assert checkpointing.support(driver, machine, mps) == said


def test_only_yes_on_the_node_counts():
    def read(value: object) -> bool:
        annotations = {CHECKPOINT_ANNOTATION: value} if value is not None else {}
        return read_node_isolation("gpu-1", annotations, "t", "c", "m", CHECKPOINT_ANNOTATION).checkpoint

    assert read("yes") is True
    for value in (None, "", "no: driver 550", "YES", "true", 1, ["yes"]):
        assert read(value) is False, value


def test_auto_hibernates_where_the_node_can_and_notifies_elsewhere():
    rule = IdleRule()  # the service's default
    assert rule.action == AUTO
    assert rule.action_for([], "t4-5g", checkpoint=True) == HIBERNATE
    assert rule.action_for([], "t4-5g", checkpoint=False) == NOTIFY
    assert rule.hibernate_after([], "t4-5g", checkpoint=True) == rule.return_after
    assert rule.hibernate_after([], "t4-5g", checkpoint=False) is None
    # An explicit action stands, on any node; auto in a group or a slice resolves the same way.
    parking = IdleRule(action=PARK, per_group={"course": AUTO}, per_slice={"t4-whole": AUTO})
    assert parking.action_for(["other"], "t4-5g", checkpoint=True) == PARK
    assert parking.action_for(["course"], "t4-5g", checkpoint=True) == HIBERNATE
    assert parking.action_for(["course"], "t4-5g", checkpoint=False) == NOTIFY
    assert parking.action_for([], "t4-whole", checkpoint=False) == NOTIFY
    # The mildest of a user's groups applies once auto is resolved.
    mixed = IdleRule(action=PARK, per_group={"a": AUTO, "b": NONE})
    assert mixed.action_for(["a", "b"], "x", checkpoint=True) == NONE
    assert IdleRule(action=NOTIFY, exempt_groups=("staff",)).action_for(["staff"], "x", True) == NONE


def test_the_services_default_is_auto():
    assert ServiceSettings().gpu_idle_action == AUTO
