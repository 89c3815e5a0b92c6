"""The scheduler's reserve and unreserve over every booking store, as a ReservePlugin's are.

kube-scheduler's framework asks of a Reserve plugin that Unreserve be idempotent and safe to
call when Reserve failed part-way. ``Scheduler.reserve_pod`` books the pod's ResourcePolicy
unit and its GPUs in one call, and ``Scheduler.unreserve`` gives both back. Each test would
fail if a store counted a pod twice, if a second unreserve took anything else back, or if a
reserve that failed on the GPUs left the unit behind.
"""

from __future__ import annotations

from typing import Any

from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Reservation, Scheduler, Settings
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.requests import PodRequest
from gpushare.core.records.allocation import Allocation
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.core.resourcepolicies.policyplugin import reserve_unit
from gpushare.kube.objects import gpu_pod
from tests.support.policies import node, policy_obj

NOW_NS = 1_767_226_200 * 10**9


def web(name: str, mem: int) -> dict[str, Any]:
    pod = gpu_pod(name, mem=mem)
    pod["metadata"].setdefault("labels", {})["app"] = "web"
    return pod


class World:
    """One 16 GiB node in each pool, and a policy: pool a first (at most 2 pods), then b."""

    def __init__(self) -> None:
        self.scheduler = Scheduler(Settings())
        self.ledger = Ledger()
        self.book = PolicyBook()
        nodes = [node("a1", "a"), node("b1", "b")]
        self.book.replace_nodes(nodes)
        self.book.put_policy(policy_obj())
        self.table = {n["metadata"]["name"]: read_node(n) for n in nodes}

    def request(self, pod: dict[str, Any]) -> PodRequest:
        request = self.scheduler.read(pod)
        assert isinstance(request, PodRequest), request
        return request

    def reserve(self, pod: dict[str, Any], on: str) -> Reservation:
        inventory: NodeInventory = self.table[on]
        return self.scheduler.reserve_pod(
            pod, self.request(pod), inventory, self.ledger, book=self.book, now_ns=NOW_NS
        )

    def unreserve(self, pod: dict[str, Any]) -> None:
        self.scheduler.unreserve(self.request(pod).uid, self.ledger, book=self.book)

    def held(self) -> dict[str, Allocation]:
        return {a.uid: a for a in self.ledger.allocations()}

    def unit_of_next(self) -> int:
        """The unit the policy opens to a new web pod now."""
        gate = self.book.gate(web("next", 1), fitting=["a1", "b1"], now_s=NOW_NS / 1e9)
        assert gate is not None and gate.chosen is not None
        return gate.chosen.number


def test_reserving_a_pod_twice_books_it_once_in_every_store() -> None:
    world = World()
    first, second = web("p", 8), web("q", 8)
    assert world.reserve(first, "a1").status.ok
    again = world.reserve(first, "a1")
    assert again.status.ok, "its own booking is left out of the check"
    assert list(world.held()) == [world.request(first).uid]
    assert [p.uid for p in world.book.placed()] == [world.request(first).uid]
    # the GPU holds 8 of 16 GiB, and the unit 1 of 2 places: both are still open to another
    assert world.reserve(second, "a1").status.ok
    assert world.unit_of_next() == 2, "pool a is full with two pods, not three"


def test_unreserving_twice_gives_back_once_and_nothing_else() -> None:
    world = World()
    mine, other = web("p", 8), web("q", 8)
    assert world.reserve(other, "a1").status.ok
    assert world.reserve(mine, "a1").status.ok
    world.unreserve(mine)
    after_one = (world.held(), [p.uid for p in world.book.placed()])
    world.unreserve(mine)
    assert (world.held(), [p.uid for p in world.book.placed()]) == after_one
    assert list(world.held()) == [world.request(other).uid]
    assert world.unit_of_next() == 1, "the other pod still counts in pool a"


def test_a_reserve_that_fails_on_the_gpus_leaves_no_unit_behind() -> None:
    world = World()
    big = web("big", 20)  # the unit opens to it, no GPU of 16 GiB holds it
    refused = world.reserve(big, "a1")
    assert not refused.status.ok and refused.allocation is None
    assert world.held() == {}
    assert world.book.placed() == [], "the unit assumed before the GPUs was given back"


def test_unreserve_after_a_reserve_that_stopped_part_way_gives_back_what_it_took() -> None:
    world = World()
    other, mine = web("q", 8), web("p", 8)
    assert world.reserve(other, "a1").status.ok
    # the unit is assumed, then the reserve stops before the GPUs (the process is told to
    # give back): unreserve must take back the unit and leave the other pod's bookings
    unit = reserve_unit(world.book, mine, "a1", now_s=NOW_NS / 1e9)
    assert unit.status.ok and unit.gate is not None
    assert len(world.book.placed()) == 2
    world.unreserve(mine)
    world.unreserve(mine)
    assert [p.uid for p in world.book.placed()] == [world.request(other).uid]
    assert list(world.held()) == [world.request(other).uid]
