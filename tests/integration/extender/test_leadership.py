"""Which replica leads: its hostname starts the holder of kube-scheduler's Lease.

kube-scheduler v1.36 writes ``holderIdentity`` as ``os.Hostname() + "_" + uuid``
(cmd/kube-scheduler/app/server.go); the autoscaling loop and DRA mode's allocator both ask
``Leadership.leading``, so the standby replica writes nothing for either.
"""

from __future__ import annotations

import asyncio

import pytest

from gpushare.cli.autoscalingoptions import leadership
from gpushare.cli.errors import CommandError
from gpushare.extender.leadership import Leadership
from gpushare.kube.port import KubeDict, NotFound


class Leases:
    def __init__(self, holder: str | None) -> None:
        self.holder = holder
        self.asked: list[tuple[str, str]] = []

    async def get_lease(self, namespace: str, name: str) -> KubeDict:
        self.asked.append((namespace, name))
        if self.holder is None:
            raise NotFound(name)
        return {"metadata": {"name": name}, "spec": {"holderIdentity": self.holder}}


@pytest.mark.parametrize(
    ("identity", "holder", "leads"),
    [
        ("sched-abc", "sched-abc_5f0e", True),
        ("sched-abc", "sched-abc", True),
        ("sched-ab", "sched-abc_5f0e", False),  # a prefix of another pod's name is not it
        ("sched-xyz", "sched-abc_5f0e", False),
        ("", "sched-abc_5f0e", False),
        ("sched-abc", None, False),  # no Lease yet: nobody leads
    ],
)
def test_the_replica_whose_scheduler_holds_the_lease_leads(
    identity: str, holder: str | None, leads: bool
) -> None:
    leases = Leases(holder)
    leader = Leadership("gpushare-scheduler", "gpushare-system", identity)
    assert asyncio.run(leader.leading(leases)) is leads
    assert leases.asked == [("gpushare-system", "gpushare-scheduler")]


def test_without_a_lease_the_one_replica_leads_and_reads_nothing() -> None:
    leases = Leases("someone-else_1")
    assert asyncio.run(Leadership("", "", "me").leading(leases))
    assert leases.asked == []


def _flags(**given: str) -> dict[str, str]:
    return {"leader_lease": "", "leader_lease_namespace": "", "placeholder_namespace": "", **given}


def test_the_lease_namespace_is_its_own_flag_or_the_placeholders() -> None:
    # DRA mode's allocator without placeholders: the chart gives --leader-lease-namespace
    alone = leadership(_flags(leader_lease="s", leader_lease_namespace="gs"))
    assert (alone.lease, alone.namespace) == ("s", "gs")
    both = leadership(_flags(leader_lease="s", placeholder_namespace="ph"))
    assert both.namespace == "ph"
    with pytest.raises(CommandError, match="--leader-lease-namespace"):
        leadership(_flags(leader_lease="s"))
