"""Properties over random clusters and request streams (hypothesis)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import NodeInventory
from gpushare.core.model.requests import PodRequest
from gpushare.core.placement.fragmentation import Shape, fragmentation, unused_by_copies
from gpushare.core.records.allocation import Allocation
from gpushare.core.records.trust import SealKey, Trust
from gpushare.kube.objects import placed
from tests.support.properties import assert_never_overcommitted, clusters, pods

TRUST = Trust.sealed(SealKey(b"properties-test-key-0123456789ab"))


Step = tuple[str, int]


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[dict[str, Any]], list[Step]]:
    size = draw(st.integers(1, 40))
    all_pods = [draw(pods(i)) for i in range(size)]
    steps: list[Step] = []
    for i in range(size):
        steps.append(("place", i))
        if draw(st.booleans()) and i:
            steps.append(("remove", draw(st.integers(0, i))))
    return all_pods, steps


def place(
    scheduler: Scheduler, pod: dict[str, Any], nodes: list[NodeInventory], ledger: Ledger
) -> Allocation | None:
    request = scheduler.read(pod)
    if not isinstance(request, PodRequest):
        return None
    fits = [n for n in nodes if scheduler.verdict(request, n, ledger).fits]
    if not fits:
        return None
    best = max(fits, key=lambda n: scheduler.score(request, n, ledger))
    return scheduler.reserve(request, best, ledger).allocation


@settings(max_examples=150, deadline=None)
@given(nodes=clusters(), stream=streams())
def test_no_gpu_is_ever_overcommitted(
    nodes: list[NodeInventory], stream: tuple[list[dict[str, Any]], list[Step]]
) -> None:
    scheduler, ledger = Scheduler(Settings()), Ledger()
    all_pods, steps = stream
    for action, index in steps:
        if action == "place":
            place(scheduler, all_pods[index], nodes, ledger)
        else:
            scheduler.unreserve(f"uid-{index}", ledger)
        assert_never_overcommitted(nodes, ledger)


@settings(max_examples=150, deadline=None)
@given(nodes=clusters(), stream=streams(), extra=pods(999))
def test_reserve_then_unreserve_is_identity(
    nodes: list[NodeInventory],
    stream: tuple[list[dict[str, Any]], list[Step]],
    extra: dict[str, Any],
) -> None:
    scheduler, ledger = Scheduler(Settings()), Ledger()
    for _, index in stream[1]:
        place(scheduler, stream[0][index], nodes, ledger)
    before = ledger.state()
    place(scheduler, extra, nodes, ledger)
    scheduler.unreserve("uid-999", ledger)
    assert ledger.state() == before


@settings(max_examples=150, deadline=None)
@given(nodes=clusters(), stream=streams())
def test_rebuilding_from_annotations_gives_the_same_state(
    nodes: list[NodeInventory], stream: tuple[list[dict[str, Any]], list[Step]]
) -> None:
    scheduler, ledger = Scheduler(Settings()), Ledger()
    all_pods, steps = stream
    stored: dict[str, dict[str, Any]] = {}
    for action, index in steps:
        pod = all_pods[index]
        if action == "place":
            booked = place(scheduler, pod, nodes, ledger)
            if booked is not None:
                node = next(n for n in nodes if n.name == booked.node)
                dev = node.gpus[0].mem_units
                stored[booked.uid] = placed(pod, booked, trust=TRUST, dev_units=dev)
        else:
            scheduler.unreserve(f"uid-{index}", ledger)
            stored.pop(f"uid-{index}", None)
    rebuilt = Ledger.from_pods(stored.values(), trust=TRUST)
    assert rebuilt.state() == ledger.state()


shapes = st.builds(
    Shape,
    cpu=st.integers(0, 20_000),
    per_gpu=st.integers(1, 1000),
    count=st.integers(1, 4),
)


@settings(max_examples=300, deadline=None)
@given(
    free=st.lists(st.integers(0, 1000), min_size=1, max_size=8),
    cpu_free=st.integers(0, 200_000),
    shape=shapes,
)
def test_counting_copies_finds_no_less_fragment_than_the_one_pod_test(
    free: list[int], cpu_free: int, shape: Shape
) -> None:
    one = fragmentation(free, cpu_free, "G2", ((shape, 1.0),))
    copies = unused_by_copies(free, cpu_free, shape)
    assert 0 <= copies <= sum(free) + 1e-6
    if cpu_free >= shape.cpu:  # below one copy's CPU the fraction counts, the one-pod test not
        assert copies >= one - 1e-6
    fitting = sum(share >= shape.per_gpu for share in free)
    if shape.count == 1 and cpu_free >= shape.cpu * fitting:  # CPU for a copy on every GPU
        assert copies == one
