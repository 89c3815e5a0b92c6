"""Intents: the GPUs booked at prioritize for the top node, until the bind comes.

Properties over random clusters and random interleavings of kube-scheduler's calls: nothing is
ever over-committed, the ledger holds exactly the binds' bookings plus the live intents (a
model kept beside it), an expired intent always gives its booking back, and with binds
lagging any number of pods behind, a bind to the node the extender put on top never finds its
share taken.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.hostresources import NOTHING, HostResources
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.requests import PodRequest
from gpushare.core.records.allocation import Allocation
from gpushare.core.records.trust import SealKey, Trust
from gpushare.kube.objects import gpu_node, gpu_pod, placed
from tests.support.properties import assert_never_overcommitted, clusters, pods

TTL = 30 * 10**9
TRUST = Trust.sealed(SealKey(b"intents-test-key-0123456789abcdef"))


def ask(
    scheduler: Scheduler, pod: dict[str, Any], nodes: list[NodeInventory], ledger: Ledger, now: int
) -> tuple[list[str], Allocation | None]:
    """One scheduling cycle as the extender sees it: filter (the pod's earlier intent given
    back), prioritize, intent on the top node. Returns the passing names and the intent."""
    request = scheduler.read(pod)
    assert isinstance(request, PodRequest)
    scheduler.drop_intent(request.uid, ledger)
    passing = [n.name for n in nodes if scheduler.verdict(request, n, ledger).fits]
    if not passing:
        return [], None
    scores = scheduler.prioritize(pod, [n for n in nodes if n.name in passing], ledger)
    names = list(scores)
    table = {n.name: n for n in nodes}
    intent = scheduler.intend(
        pod, names, [scores[n] for n in names], table, ledger, until_ns=now + TTL
    )
    return passing, intent


def held(ledger: Ledger) -> dict[str, Allocation]:
    return {a.uid: a for a in ledger.allocations()}


def host_by_node(ledger: Ledger, nodes: list[NodeInventory]) -> dict[str, HostResources]:
    return {n.name: ledger.usage(n.name).host for n in nodes}


Op = tuple[str, int, int]

operations = st.lists(
    st.tuples(
        st.sampled_from(
            ["ask", "ask", "bind_top", "bind_other", "bind_409", "tick", "delete", "seen"]
        ),
        st.integers(0, 11),
        st.integers(0, 40),
    ),
    min_size=1,
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(nodes=clusters(), stream=st.lists(pods(0), min_size=12, max_size=12), ops=operations)
def test_the_ledger_holds_the_bookings_and_the_live_intents_and_nothing_more(
    nodes: list[NodeInventory], stream: list[dict[str, Any]], ops: list[Op]
) -> None:
    for i, pod in enumerate(stream):
        pod["metadata"]["uid"] = f"uid-{i}"
        pod["metadata"]["name"] = f"p{i}"
    scheduler, ledger = Scheduler(Settings()), Ledger(trust=TRUST)
    table = {n.name: n for n in nodes}
    now = 0
    booked: dict[str, Allocation] = {}
    intents: dict[str, tuple[Allocation, int]] = {}
    hosts: dict[str, tuple[str, HostResources]] = {}
    seen: set[str] = set()
    for action, index, amount in ops:
        pod = stream[index]
        uid = f"uid-{index}"
        request = scheduler.read(pod)
        assert isinstance(request, PodRequest)
        if uid in seen and action != "delete":
            continue  # bound: kube-scheduler asks nothing more about it
        if action == "ask" and uid in booked:
            # its bind has booked; a retried bind may come, a new attempt may not
            assert ask(scheduler, pod, nodes, ledger, now)[1] is None
        elif action == "ask":
            if uid in intents:
                hosts.pop(uid, None)
            intents.pop(uid, None)
            _, intent = ask(scheduler, pod, nodes, ledger, now)
            if intent is not None:
                assert uid not in booked, "an intent never replaces a bind's booking"
                intents[uid] = (intent, now + TTL)
                hosts[uid] = (intent.node, request.host)
        elif action in ("bind_top", "bind_other"):
            if action == "bind_top" and uid in intents:
                target = table[intents[uid][0].node]
            else:
                target = nodes[amount % len(nodes)]
            result = scheduler.reserve(request, target, ledger, now_ns=now).allocation
            if result is not None:
                booked[uid] = result
                intents.pop(uid, None)
                hosts[uid] = (result.node, request.host)
            else:
                scheduler.drop_intent(uid, ledger)
                if uid in intents:
                    hosts.pop(uid, None)
                intents.pop(uid, None)
        elif action == "bind_409":
            # a bind books, then its binding meets a 409 and writes nothing: its booking goes,
            # an intent with it, and a booking kept from an earlier bind comes back
            kept = ledger.kept(uid)
            assert (kept is not None) == (uid in booked)
            target = nodes[amount % len(nodes)]
            result = scheduler.reserve(request, target, ledger, now_ns=now).allocation
            if result is not None:
                scheduler.unreserve(uid, ledger, kept=kept)
            else:
                scheduler.drop_intent(uid, ledger)
            if uid in intents:
                hosts.pop(uid, None)
            intents.pop(uid, None)
        elif action == "tick":
            now += amount * 10**9
            expired = set(ledger.expire(now))
            due = {u for u, (_, until) in intents.items() if until <= now}
            assert expired == due
            for gone in due:
                intents.pop(gone)
                hosts.pop(gone, None)
                assert ledger.holding(gone) is None, "an expired intent gives its booking back"
        elif action == "delete":
            ledger.forget(uid)
            seen.discard(uid)
            booked.pop(uid, None)
            intents.pop(uid, None)
            hosts.pop(uid, None)
        elif action == "seen" and uid in booked:
            allocation = booked[uid]
            dev = table[allocation.node].gpus[0].mem_units
            ledger.observe(placed(pod, allocation, trust=TRUST, dev_units=dev))
            hosts[uid] = (allocation.node, request.host)
            seen.add(uid)
        assert_never_overcommitted(nodes, ledger)
        expected = {**booked, **{u: a for u, (a, _) in intents.items()}}
        assert held(ledger) == expected
        assert {u: ledger.intent_until(u) for u in intents} == {
            u: until for u, (_, until) in intents.items()
        }
        sums: dict[str, HostResources] = {n.name: NOTHING for n in nodes}
        for node_name, host in hosts.values():
            sums[node_name] = sums[node_name] + host
        assert host_by_node(ledger, nodes) == sums
    ledger.expire(now + TTL)
    assert held(ledger) == booked, "once every deadline has passed, only the binds hold"


@settings(max_examples=200, deadline=None)
@given(
    nodes=clusters(),
    stream=st.lists(pods(0), min_size=1, max_size=30),
    lag=st.integers(1, 6),
)
def test_a_bind_to_the_top_node_never_finds_its_share_taken_however_many_binds_are_in_flight(
    nodes: list[NodeInventory], stream: list[dict[str, Any]], lag: int
) -> None:
    """kube-scheduler filters and prioritizes pod k while the binds of up to ``lag`` pods
    before it are still on their way; each bind goes to the node the extender put on top."""
    for i, pod in enumerate(stream):
        pod["metadata"]["uid"] = f"uid-{i}"
        pod["metadata"]["name"] = f"p{i}"
    scheduler, ledger = Scheduler(Settings()), Ledger()
    table = {n.name: n for n in nodes}
    in_flight: list[tuple[dict[str, Any], Allocation]] = []
    unfit = []

    def bind_oldest() -> None:
        pod, intent = in_flight.pop(0)
        request = scheduler.read(pod)
        assert isinstance(request, PodRequest)
        result = scheduler.reserve(request, table[intent.node], ledger)
        if result.allocation is None:
            unfit.append((pod["metadata"]["name"], result.status.message))

    for pod in stream:
        _, intent = ask(scheduler, pod, nodes, ledger, 0)
        if intent is not None:
            in_flight.append((pod, intent))
        if len(in_flight) > lag:
            bind_oldest()
        assert_never_overcommitted(nodes, ledger)
    while in_flight:
        bind_oldest()
    assert unfit == []
    assert_never_overcommitted(nodes, ledger)


def test_without_intents_the_same_burst_does_race() -> None:
    """The case intents exist for: two 10 GiB pods on one 15 GiB GPU, the second asked about
    before the first's bind. Without the intent both are sent to the same node and the second
    bind fails; with it the second pod is told there is no room and goes elsewhere."""
    nodes = [read_node(gpu_node(name, gpus_units=[15])) for name in ("n0", "n1")]
    first, second = (gpu_pod(f"p{i}", mem=10) for i in range(2))
    for i, pod in enumerate((first, second)):
        pod["metadata"]["uid"] = f"uid-{i}"
    scheduler, ledger = Scheduler(Settings()), Ledger()
    _, one = ask(scheduler, first, nodes, ledger, 0)
    passing, two = ask(scheduler, second, nodes, ledger, 0)
    assert one is not None and two is not None
    assert one.node != two.node
    assert passing == [two.node]
