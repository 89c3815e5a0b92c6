"""The core's ``ClusterState``: taking a node or pod in says what changed, and nothing is called.

The extender acts on these values (``Extender.take``): an ignored allocation is counted once
per pod and reason, a Failed pod goes to the readmitter, GPU share given back tries refused
pods again. Here the state alone, with no cache, no API and no callbacks.
"""

from __future__ import annotations

from typing import Any

from gpushare.core.booking.waiting import Waiting
from gpushare.core.decision.clusterstate import (
    ClusterState,
    NodeChange,
    NodeTaken,
    PodTaken,
    Relisted,
)
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.decision.verbs import (
    BindAsk,
    BindPlan,
    FilterAsk,
    PrioritizeAsk,
    filter_pod,
    namespace_stuck,
    prioritize_pod,
    reserve_bind,
)
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.placement.defragmenting import FragmentationPolicy
from gpushare.core.placement.explain import placement_message
from gpushare.core.records.allocation import plan
from gpushare.core.records.trust import Reason, SealKey, Trust
from gpushare.kube.objects import gpu_node, gpu_pod, placed

SEAL = Trust.sealed(SealKey(b"s" * 32))
NOW_NS = 1_700_000_000 * 10**9


def new_state() -> ClusterState:
    state = ClusterState(settings=Settings(), trust=SEAL)
    state.apply_node("ADDED", gpu_node("n1", gpus_units=[15, 15]))
    return state


def pod(name: str, *, mem: int = 4, namespace: str = "default") -> dict[str, Any]:
    made = gpu_pod(name, mem=mem, namespace=namespace)
    made["metadata"]["uid"] = f"uid-{name}"
    made["metadata"]["resourceVersion"] = "1"
    made["status"] = {"phase": "Pending"}
    return made


def bound(name: str, *, mem: int = 4, trust: Trust = SEAL) -> dict[str, Any]:
    unbound = pod(name, mem=mem)
    request = read_pod(unbound)
    assert isinstance(request, PodRequest)
    return placed(unbound, plan(request, node="n1", indexes=[0], unit=MemoryUnit.GiB), trust=trust)


def test_a_node_event_says_whether_it_added_changed_or_removed_the_node() -> None:
    state = ClusterState(settings=Settings(), trust=SEAL)
    node = gpu_node("n1", gpus_units=[15])
    assert state.apply_node("ADDED", node) == NodeTaken("n1", NodeChange.ADDED)
    assert state.apply_node("MODIFIED", node) == NodeTaken("n1", NodeChange.CHANGED)
    assert "n1" in state.nodes
    assert state.apply_node("BOOKMARK", node) == NodeTaken("n1", NodeChange.NONE)
    assert state.apply_node("DELETED", node) == NodeTaken("n1", NodeChange.REMOVED)
    assert "n1" not in state.nodes


def test_a_pod_that_gives_its_share_back_says_it_freed_it() -> None:
    state = new_state()
    held = bound("a")
    taken = state.apply_pod("ADDED", held)
    assert taken == PodTaken(held)
    assert state.ledger.usage("n1").mem_units == 4
    gone = state.apply_pod("DELETED", held)
    assert gone.freed and state.ledger.usage("n1").mem_units == 0
    assert not state.apply_pod("DELETED", held).freed, "nothing held the second time"


def test_a_pending_pod_is_kept_until_bound_and_a_failed_one_is_said() -> None:
    state = new_state()
    waiting = pod("w")
    assert state.apply_pod("ADDED", waiting) == PodTaken(waiting)
    assert "uid-w" in state.pending
    state.apply_pod("MODIFIED", bound("w"))
    assert "uid-w" not in state.pending
    failed = {**pod("f"), "status": {"phase": "Failed"}}
    assert state.apply_pod("ADDED", failed).failed


def test_an_ignored_allocation_is_said_once_per_reason_and_first_once_per_pod() -> None:
    state = new_state()
    forged = bound("x", trust=Trust.sealed(SealKey(b"f" * 32)))
    first = state.apply_pod("ADDED", forged)
    assert first.ignored is not None and first.ignored.reason is Reason.SEAL_MISMATCH
    assert first.first
    again = state.apply_pod("MODIFIED", {**forged, "metadata": {**forged["metadata"]}})
    assert again.ignored is None, "the same pod and reason is not reported twice"
    usage = state.ledger.usage("n1")
    assert usage.allocations == () and [u.uid for u in usage.unplaced] == ["uid-x"]


def test_a_relist_replaces_the_state_and_keeps_a_bind_booking_of_a_live_pod() -> None:
    state = new_state()
    scheduler = Scheduler(Settings())
    live, gone = pod("live"), pod("gone")
    for each in (live, gone):
        state.apply_pod("ADDED", each)
        plan_ = reserve_bind(
            scheduler, state, BindAsk(pod=each, node="n1", asked_uid="", now_ns=NOW_NS)
        )
        assert isinstance(plan_, BindPlan)
    assert state.ledger.usage("n1").mem_units == 8
    relist = state.relist([gpu_node("n1", gpus_units=[15, 15]), gpu_node("n2")])
    assert state.ledger.usage("n1").mem_units == 8, "nothing changes before finish"
    assert relist.take(live) == PodTaken(live)
    assert relist.finish() == Relisted(nodes=2, pods=1)
    assert set(state.nodes) == {"n1", "n2"}
    assert state.ledger.usage("n1").mem_units == 4, "the booking of the deleted pod went"
    assert set(state.pending) == {"uid-live"}


def test_prioritize_is_one_call_and_a_stuck_namespace_books_no_intent() -> None:
    state = new_state()
    scheduler = Scheduler(Settings())
    stuck, asking = pod("stuck", namespace="t"), pod("next", namespace="t")
    state.apply_pod("ADDED", stuck)
    state.apply_pod("ADDED", asking)

    def ask(names: list[str], stuck: dict[str, set[str]]) -> PrioritizeAsk:
        return PrioritizeAsk(
            pod=asking,
            names=names,
            stuck=stuck,
            now_ns=NOW_NS,
            ttl_ns=30 * 10**9,
            unseen_ttl_ns=3 * 10**9,
        )

    free = prioritize_pod(scheduler, state, ask(["n1", "nx"], {}))
    assert free.names == ["n1"] and free.scores[0] > 0
    assert free.intent is not None and free.intent.node == "n1" and not free.withheld
    assert state.ledger.intent_until("uid-next") == NOW_NS + 30 * 10**9
    assert namespace_stuck("t", {"t": {"uid-stuck"}}, state.pending)
    held = prioritize_pod(scheduler, state, ask(["n1"], {"t": {"uid-stuck"}}))
    assert held.withheld and held.intent is None and held.deadline is None
    assert state.ledger.intent_until("uid-next") is None, "its earlier intent went back"
    assert not namespace_stuck("u", {"t": {"uid-stuck"}}, state.pending)


def test_a_listed_state_is_what_inspect_and_the_simulator_start_from() -> None:
    settings = Settings()
    built = new_state()
    listed = ClusterState.listed(
        settings=settings, trust=SEAL, nodes=built.nodes.values(), pods=[bound("a")]
    )
    assert list(listed.nodes) == ["n1"]
    assert listed.ledger.usage("n1").mem_units == 4


def test_a_bind_plan_carries_the_placement_event_and_the_log_fields() -> None:
    state = new_state()
    waiting = pod("w")
    state.apply_pod("ADDED", waiting)
    ask = BindAsk(pod=waiting, node="n1", asked_uid="uid-w", now_ns=NOW_NS)
    made = reserve_bind(Scheduler(Settings()), state, ask)
    assert isinstance(made, BindPlan) and made.allocation is not None
    node = state.nodes["n1"]
    assert made.placed == placement_message(made.allocation, node, state.ledger.usage("n1"))
    assert made.gpus == ",".join(map(str, made.allocation.indexes)) and made.mem_units == 4


def test_the_verbs_price_scarce_shapes_over_every_node_of_the_state() -> None:
    """No node table is wired into the scheduler: the verbs hand it the state's nodes, also
    when kube-scheduler sends node objects (one node here) instead of names."""
    state = ClusterState(settings=Settings(policy="gpushare"), trust=SEAL)
    for i in range(5):
        state.apply_node("ADDED", gpu_node(f"n{i}", gpus_units=[16, 16]))
    scheduler = Scheduler(Settings(policy="gpushare"))
    policy = scheduler.policy
    assert isinstance(policy, FragmentationPolicy) and policy.defragmenter.supply is not None
    terms = {"now_ns": NOW_NS, "ttl_ns": 30 * 10**9, "unseen_ttl_ns": 3 * 10**9}
    ask = FilterAsk(pod=pod("p"), nodes=[state.nodes["n0"]], stuck={}, packing_profile="", **terms)
    outcome = filter_pod(scheduler, state, ask, Waiting())
    assert outcome.fits and not outcome.one_node
    assert len(policy.defragmenter.supply) == 5
    assert not hasattr(scheduler, "cluster")
