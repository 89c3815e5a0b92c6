"""The one decision cache: node lists, node names and reserve share it and never disagree."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gpushare.core.booking.changes import NodeTable
from gpushare.core.booking.ledger import Ledger, NodeUsage
from gpushare.core.decision.decider import Decision
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model import requests
from gpushare.core.model.inventory import NodeInventory, read_node
from gpushare.core.model.requests import PodRequest
from gpushare.core.placement.defragmenting import WorkloadFeed
from gpushare.core.placement.fragmentation import WorkloadEstimate
from gpushare.kube.objects import gpu_node, gpu_pod


def pod(name: str, mem: int) -> dict[str, Any]:
    obj = gpu_pod(name, mem=mem)
    obj["metadata"]["uid"] = f"uid-{name}"
    return obj


def request_of(scheduler: Scheduler, obj: dict[str, Any]) -> PodRequest:
    request = scheduler.read(obj)
    assert isinstance(request, PodRequest)
    return request


def made(name: str, gpus: list[int], handoff: bool = False) -> NodeInventory:
    obj = gpu_node(name, gpus_units=gpus)
    if handoff:
        obj["metadata"]["annotations"]["gpushare.io/handoff"] = "podresources"
    return read_node(obj)


def counting(scheduler: Scheduler) -> list[str]:
    """Names of the nodes the scheduler decides from now on (cache misses)."""
    decided: list[str] = []
    decide = scheduler.decider.decide

    def counted(request: PodRequest, node: NodeInventory, usage: NodeUsage) -> Decision:
        decided.append(node.name)
        return decide(request, node, usage)

    scheduler.decider.decide = counted  # type: ignore[method-assign]
    return decided


@pytest.mark.parametrize("policy", ["binpack", "spread", "fgd", "gpushare"])
def test_one_scheduler_answers_alike_by_names_by_nodes_and_at_reserve(policy: str) -> None:
    """Both ways in read and fill one cache; each answer equals a scheduler with none.

    Binds, released pods, workload refreshes (every 2 pods) and replaced nodes happen between
    the calls; look-alike nodes (decided once by name) are read back node by node with their
    own names, and hand-off nodes with pending pods are decided on their own.
    """
    rng = random.Random(11)

    def node(i: int) -> NodeInventory:
        return made(f"n{i}", [15, 15] if i % 2 else [24], handoff=i in (0, 3))

    table = NodeTable((f"n{i}", node(i)) for i in range(8))
    names = list(table)
    ledger = Ledger()
    feed = WorkloadFeed(estimate=WorkloadEstimate(refresh=2))
    shared = Scheduler(Settings(policy=policy), workload=feed)
    bound = 0
    for step in range(50):
        new = pod(f"p{step}", rng.choice([2, 3, 5, 8, 12]))
        feed.observe(new)
        fresh = Scheduler(Settings(policy=policy), workload=feed)
        want = fresh.filter(new, table.values(), ledger).verdicts
        by_names = shared.filter_names(new, names, table, ledger)
        by_nodes = shared.filter(new, table.values(), ledger).verdicts
        assert by_nodes == want
        assert by_names.passing == [v.node for v in want if v.fits]
        assert by_names.failed == {v.node: v.message for v in want if v.status.may_pass_later}
        fitting = [table[n] for n in by_names.passing]
        scores = fresh.prioritize(new, fitting, ledger)
        assert shared.prioritize(new, fitting, ledger) == scores
        tens = shared.prioritize_names(new, by_names.passing, table, ledger)
        assert tens == list(scores.values())
        if tens and max(tens) > 0:  # the node the intent books is the filter's one-node answer
            top = by_names.passing[tens.index(max(tens))]
            assert shared.top_name(request_of(shared, new), by_names.passing, table, ledger) == top
        if by_names.passing:
            target = table[max(by_names.passing, key=scores.__getitem__)]
            request = request_of(shared, new)
            expected = fresh.verdict(request, target, ledger)
            booked = shared.reserve(request, target, ledger).allocation
            assert booked is not None
            assert (booked.node, booked.indexes) == (target.name, expected.gpus)
            bound += 1
        if step % 7 == 6:  # nodes replaced, as watch events would
            table["n1"] = node(1)
            table["n3"] = node(3)
        if step % 5 == 4:
            ledger.forget(f"uid-p{step - 3}")
    assert bound > 20


def test_reserve_reuses_the_decision_made_for_the_names() -> None:
    """Bind's check finds the filter's decision: the chosen node is not decided again."""
    table = NodeTable((f"n{i}", made(f"n{i}", [15, 15])) for i in range(6))
    # a workload that does not refresh between these pods (a refresh re-decides every group)
    steady = WorkloadFeed(estimate=WorkloadEstimate(refresh=100))
    ledger, scheduler = Ledger(), Scheduler(Settings(policy="gpushare"), workload=steady)
    decided = counting(scheduler)
    first = pod("first", 4)
    passing = scheduler.filter_names(first, list(table), table, ledger).passing
    scores = scheduler.prioritize_names(first, passing, table, ledger)
    assert len(decided) == 1  # six look-alikes: one decision
    chosen = passing[scores.index(max(scores))]
    booked = scheduler.reserve(request_of(scheduler, first), table[chosen], ledger).allocation
    assert booked is not None and booked.node == chosen
    assert len(decided) == 1
    # the bind changed one node: the next pod of the shape decides that node only
    scheduler.filter_names(pod("second", 4), list(table), table, ledger)
    assert decided[1:] == [chosen]


def test_a_workload_refresh_decides_again_only_the_groups_the_pod_fits() -> None:
    """After the policy's version changes, nodes the pod did not fit keep their decision
    (fitting is the filter's alone); every answer still equals a fresh scheduler's."""
    full, most, empty = made("full", [15]), made("most", [15]), made("empty", [15])
    table = NodeTable([("full", full), ("most", most), ("empty", empty)])
    ledger = Ledger()
    feed = WorkloadFeed(estimate=WorkloadEstimate(refresh=1))
    scheduler = Scheduler(Settings(policy="gpushare"), workload=feed)
    for name, mem, node in (("a", 12, full), ("b", 10, most)):
        booked = scheduler.reserve(request_of(scheduler, pod(name, mem)), node, ledger).allocation
        assert booked is not None
    asked = pod("asked", 8)
    feed.observe(asked)
    names = list(table)
    scheduler.filter_names(asked, names, table, ledger)
    decided = counting(scheduler)
    version = scheduler.decider.version
    for step, mem in enumerate((1, 2, 4, 12, 3)):  # a new shape each time: a new workload
        feed.observe(pod(f"w{step}", mem))
        if scheduler.decider.version != version:
            break
    assert scheduler.decider.version != version
    again = scheduler.filter_names(asked, names, table, ledger)
    assert decided == ["empty"]  # 3 and 5 GiB free: neither fits 8, both decisions kept
    fresh = Scheduler(Settings(policy="gpushare"), workload=feed)
    want = fresh.filter_names(asked, names, table, ledger)
    assert (again.passing, again.failed) == (want.passing, want.failed)
    assert scheduler.top_name(request_of(scheduler, asked), again.passing, table, ledger) == (
        fresh.top_name(request_of(fresh, asked), want.passing, table, ledger)
    )


def test_one_pod_version_is_read_once_and_a_bodys_reading_never_reaches_bind(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kube-scheduler asks about one version of a pending pod again and again, after the
    watch has shown it: that version is read once, for the workload, the filters and bind.
    A pod with no version is read each time. What a filter body said is kept apart: bind
    reads the stored pod for itself, even under the same UID and version."""
    reads: list[str] = []
    read_pod = requests.read_pod

    def counted(obj: Any, **kwargs: Any) -> Any:
        reads.append(obj["metadata"].get("resourceVersion", ""))
        return read_pod(obj, **kwargs)

    monkeypatch.setattr(requests, "read_pod", counted)
    scheduler = Scheduler(Settings())
    assert scheduler.workload is not None
    table = NodeTable([("n0", made("n0", [15]))])
    ledger = Ledger()
    stored = pod("p", 4)
    stored["metadata"]["resourceVersion"] = "7"
    scheduler.workload.observe(stored)  # the watch
    for _ in range(3):
        assert scheduler.filter_names(stored, ["n0"], table, ledger).passing == ["n0"]
    assert request_of(scheduler, stored).mem_units == 4  # bind
    assert reads == ["7"]
    unversioned = pod("q", 4)
    for _ in range(2):
        scheduler.filter_names(unversioned, ["n0"], table, ledger)
    assert reads == ["7", "", ""]
    forged = pod("r", 1)
    forged["metadata"]["resourceVersion"] = "9"
    for _ in range(2):
        assert scheduler.filter_names(forged, ["n0"], table, ledger).passing == ["n0"]
    real = pod("r", 20)
    real["metadata"]["resourceVersion"] = "9"
    assert request_of(scheduler, real).mem_units == 20
    assert reads == ["7", "", "", "9", "9"]


def test_a_pods_own_share_is_left_out_for_it_and_counted_for_others() -> None:
    """Re-binding: the pod's own holding does not count against it, and what it was told is
    not remembered for a look-alike pod, on either way in."""
    table = NodeTable([("n0", made("n0", [15])), ("n1", made("n1", [4]))])
    ledger, scheduler = Ledger(), Scheduler(Settings(policy="binpack"))
    mine, other = pod("mine", 10), pod("other", 10)
    alone = Scheduler(Settings(policy="binpack")).prioritize(mine, [table["n0"]], Ledger())
    booked = scheduler.reserve(request_of(scheduler, mine), table["n0"], ledger).allocation
    assert booked is not None
    for _ in range(2):
        assert scheduler.filter_names(mine, ["n0", "n1"], table, ledger).passing == ["n0"]
        assert scheduler.filter(mine, table.values(), ledger).passing == ["n0"]
        assert scheduler.prioritize_names(mine, ["n0"], table, ledger) == [alone["n0"]]
        assert scheduler.top_name(request_of(scheduler, mine), ["n0"], table, ledger) == "n0"
        assert scheduler.top_name(request_of(scheduler, other), ["n0", "n1"], table, ledger) == ""
        assert scheduler.prioritize(mine, [table["n0"]], ledger) == alone
        assert scheduler.filter_names(other, ["n0", "n1"], table, ledger).passing == []
        assert scheduler.filter(other, table.values(), ledger).passing == []
        again = scheduler.reserve(request_of(scheduler, mine), table["n0"], ledger).allocation
        assert again is not None


def test_another_table_or_ledger_starts_over() -> None:
    """Decisions count only for the node table and ledger they were made on."""
    scheduler = Scheduler(Settings(policy="binpack"))
    roomy = NodeTable([("a", made("a", [15]))])
    small = NodeTable([("a", made("a", [4]))])
    ledger = Ledger()
    asked = pod("p", 8)
    assert scheduler.filter_names(asked, ["a"], roomy, ledger).passing == ["a"]
    assert scheduler.filter_names(asked, ["a"], small, ledger).passing == []
    assert scheduler.filter(asked, small.values(), ledger).passing == []
    assert scheduler.filter(asked, roomy.values(), ledger).passing == ["a"]
    busy = Ledger()
    held = scheduler.reserve(request_of(scheduler, pod("held", 10)), roomy["a"], busy).allocation
    assert held is not None
    assert scheduler.filter_names(asked, ["a"], roomy, busy).passing == []
    assert scheduler.filter(asked, roomy.values(), busy).passing == []
    assert scheduler.filter_names(asked, ["a"], roomy, ledger).passing == ["a"]


def test_keys_past_the_limit_start_over_without_changing_answers() -> None:
    table = NodeTable((f"n{i}", made(f"n{i}", [15])) for i in range(3))
    ledger = Ledger()
    small, roomy = Scheduler(Settings(), keys_kept=1), Scheduler(Settings())
    for step in range(12):
        asked = pod(f"p{step}", 2 + step % 3)
        a = small.filter_names(asked, list(table), table, ledger).passing
        assert a == roomy.filter_names(asked, list(table), table, ledger).passing
        assert small.prioritize_names(asked, a, table, ledger) == roomy.prioritize_names(
            asked, a, table, ledger
        )
        booked = small.reserve(request_of(small, asked), table[a[step % len(a)]], ledger).allocation
        assert booked is not None
    assert len(small.decisions) == 1


def test_the_one_node_answer_keeps_its_rule_over_ties_and_names_that_do_not_fit() -> None:
    """``top_name`` without a re-binding takes a shortcut; it must still give the best raw score
    among the names that fit, the first in sort order among equals, names that do not fit
    left out, whatever order the names come in."""
    rng = random.Random(5)
    # many look-alikes (equal scores), a few fuller ones (other scores), two that cannot fit
    sizes = [[15, 15]] * 9 + [[15, 15]] * 4 + [[2]] * 2
    table = NodeTable((f"n{i:02d}", made(f"n{i:02d}", gpus)) for i, gpus in enumerate(sizes))
    ledger = Ledger()
    scheduler = Scheduler(Settings(policy="binpack"))
    for i in range(9, 13):  # the same usage on four: binpack likes them better, all alike
        filler = pod(f"fill{i}", 3)
        booked = scheduler.reserve(
            request_of(scheduler, filler), table[f"n{i:02d}"], ledger
        ).allocation
        assert booked is not None
    asking = pod("asking", 6)
    request = request_of(scheduler, asking)
    for _ in range(20):
        names = list(table)
        rng.shuffle(names)
        names = names[: rng.randint(1, len(names))]
        fits = scheduler.decisions.on_names(request, set(names), table, ledger).fits
        fitting = [n for n in names if n in fits]
        want = ""
        if fitting:
            best = max(fits[n] for n in fitting)
            want = min(n for n in fitting if fits[n] == best)
        assert scheduler.top_name(request, names, table, ledger) == want
        # the filter's own pass: scores line up with its passing names, names the table
        # does not hold are reported missing, in order, and the answer is the same
        unknown = [f"gone{i}" for i in range(rng.randint(0, 2))]
        asked = names + unknown
        rng.shuffle(asked)
        found = scheduler.filter_names(asking, asked, table, ledger)
        in_order = [n for n in asked if n in fits]
        assert found.passing == in_order and found.scores == [fits[n] for n in in_order]
        assert found.missing == [n for n in asked if n in unknown]
        top = scheduler.top_name(request, found.passing, table, ledger, scores=found.scores)
        assert top == want
    assert scheduler.top_name(request, ["n13", "n14"], table, ledger) == ""


def test_a_filter_over_some_names_reports_only_those() -> None:
    """The refused nodes a filter reports are among the names asked about, when the cache
    knows refusals on others (``_within``'s copy is for when every refusal was asked about)."""
    table = NodeTable((f"n{i}", made(f"n{i}", [15] if i < 3 else [2])) for i in range(6))
    ledger, scheduler = Ledger(), Scheduler(Settings(policy="binpack"))
    big = pod("big", 8)
    everything = scheduler.filter_names(big, list(table), table, ledger)
    assert sorted({**everything.failed, **everything.unresolvable}) == ["n3", "n4", "n5"]
    some = scheduler.filter_names(big, ["n0", "n4"], table, ledger)
    assert some.passing == ["n0"]
    assert sorted({**some.failed, **some.unresolvable}) == ["n4"]
