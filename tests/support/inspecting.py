"""The views and explanations the inspect renderers and the schema test share."""

from __future__ import annotations

from collections.abc import Iterable

from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.clusterstate import ClusterState
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.model.inventory import Mode, read_node
from gpushare.core.model.kubejson import KubeObject
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.core.records.trust import Trust
from gpushare.inspect.explain import Explanation, explain_pod
from gpushare.inspect.newnode import PlaceholderSight
from gpushare.inspect.view import ClusterView, build_view
from gpushare.kube.objects import gpu_node, gpu_pod


def explain(
    mem: int,
    core: int | None = None,
    *,
    sight: PlaceholderSight | None = None,
    pods: Iterable[KubeObject] = (),
) -> Explanation:
    state = cluster()
    ledger = state.ledger
    pod = gpu_pod("train", mem=mem, core=core, namespace="team-a")
    pod["metadata"]["uid"] = "t"
    pod["status"] = {"phase": "Pending"}
    if sight is not None:
        sight = sight.seeing([*pods, pod])
    before = ledger.state()
    explanation = explain_pod(pod, state, Scheduler(), placeholders=sight)
    assert ledger.state() == before  # the what-if books nothing
    return explanation


def mixed_view() -> ClusterView:
    share = read_node(gpu_node("a-share", ip="10.0.0.1", gpus_units=[15, 15]))
    core = read_node(gpu_node("b-core", ip="10.0.0.2", gpus_units=[15] * 4, mode=Mode.CORE_MEM))
    ledger = Ledger()
    for name, node, mem, core_pct, index in [
        ("train", share, 7, None, 1),
        ("infer", core, 2, 30, 0),
        ("infer2", core, 4, 50, 0),
    ]:
        pod = gpu_pod(name, mem=mem, core=core_pct)
        pod["metadata"]["uid"] = name
        request = read_pod(pod)
        assert isinstance(request, PodRequest)
        ledger.assume(plan(request, node=node.name, indexes=[index], unit=node.unit))
    foreign = gpu_pod("foreign", mem=2, scheduler="default-scheduler")
    foreign["metadata"]["uid"] = "f"
    foreign["spec"]["nodeName"] = "a-share"
    ledger.observe(foreign)
    return build_view([share, core], ledger)


def cluster() -> ClusterState:
    nodes = [
        read_node(gpu_node("node-a", gpus_units=[15, 15])),
        read_node(gpu_node("node-b", gpus_units=[15])),
        read_node(gpu_node("node-c", gpus_units=[16], mode=Mode.CORE_MEM)),
        read_node(gpu_node("node-x", gpus_units=[15], mode=None)),
    ]
    state = ClusterState.listed(settings=Settings(), trust=Trust(), nodes=nodes)
    ledger = state.ledger
    for uid, node, mem, index in [
        ("a0", "node-a", 12, 0),
        ("a1", "node-a", 4, 1),
        ("b", "node-b", 2, 0),
    ]:
        pod = gpu_pod(uid, mem=mem)
        pod["metadata"]["uid"] = uid
        request = read_pod(pod)
        assert isinstance(request, PodRequest)
        ledger.assume(plan(request, node=node, indexes=[index], unit=MemoryUnit.GiB))
    return state
