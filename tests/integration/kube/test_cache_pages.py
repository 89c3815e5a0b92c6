"""The cache takes a relist's pods in a page at a time and ends where one whole list ends.

A cluster's pods are never all decoded at once: ``list_pod_pages`` hands them over in pages
and the cache reads each into the new state before asking for the next. What the extender
decides on stays as it was until the last page, then the new state replaces it at once;
bookings made while the pages came in are carried over like those made before.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from collections.abc import AsyncIterator, Callable
from typing import Any

from gpushare.core.decision.scheduling import Settings
from gpushare.core.model.hostresources import NOTHING as NO_HOST
from gpushare.core.model.kubejson import read_fields
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.placement.defragmenting import WorkloadFeed
from gpushare.core.records.allocation import Allocation, plan
from gpushare.core.records.trust import SealKey, Trust
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod, placed
from gpushare.kube.port import KubeDict, WatchEvent

NODES = ("n0", "n1", "n2")


class PagedKube(MemoryKube):
    """Pods in pages of ``size``, ``between`` called after each page; no whole list."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.between: Callable[[int], None] = lambda _: None
        self.pages = 0

    async def list_pods(self, node: str = "") -> tuple[list[KubeDict], str]:
        raise AssertionError("the cache lists pods a page at a time")

    async def list_pod_pages(self) -> AsyncIterator[tuple[list[KubeDict], str]]:
        pods, version = await MemoryKube.list_pods(self)
        for start in range(0, len(pods), self.size):
            self.pages += 1
            yield pods[start : start + self.size], version
            self.between(self.pages)


def _allocation(pod: KubeDict, node: str, index: int) -> Allocation:
    request = read_pod(pod)
    assert isinstance(request, PodRequest)
    return plan(request, node=node, indexes=[index], unit=MemoryUnit.GiB)


def fill(kube: MemoryKube) -> list[KubeDict]:
    """Nodes, sealed GPU pods, plain bound pods, pending GPU pods, a finished pod."""
    trust = Trust.sealed(SealKey(kube.seal_key))
    for name in NODES:
        kube.put_node(gpu_node(name, gpus_units=[15, 15]))
    pending = []
    for i in range(12):
        node = NODES[i % len(NODES)]
        obj = gpu_pod(f"g{i}", mem=1 + i % 4)
        obj["metadata"]["uid"] = f"uid-g{i}"
        kube.create_pod(placed(obj, _allocation(obj, node, i % 2), trust=trust))
        plain = gpu_pod(f"c{i}", mem=None, scheduler="default-scheduler")
        plain["spec"]["nodeName"] = node
        plain["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "500m"}}
        kube.create_pod(plain)
        pending.append(kube.create_pod(gpu_pod(f"p{i}", mem=2)))
    kube.create_pod(gpu_pod("done", mem=3))
    kube.update_pod("default", "done", phase="Succeeded")
    return pending


def state(cache: ClusterCache, uids: list[str]) -> dict[str, Any]:
    """What the extender decides on, per pod and in all."""
    assert cache.state.workload is not None and cache.state.book is not None
    return {
        "holding": {u: cache.state.ledger.holding(u) for u in uids},
        "host": {u: cache.state.ledger.host_of(u) for u in uids},
        "intent": {u: cache.state.ledger.intent_until(u) for u in uids},
        "pending": sorted(cache.state.pending),
        "terms": len(cache.state.placed_terms),
        "workload": (cache.state.workload.seen, cache.state.workload.workload()),
        "placed": sorted(p.uid for p in cache.state.book.placed()),
        "nodes": sorted(cache.state.nodes),
    }


def new_cache(kube: MemoryKube) -> ClusterCache:
    return ClusterCache(kube, settings=Settings(), workload=WorkloadFeed(), book=PolicyBook())


def test_pages_end_where_one_whole_list_ends() -> None:
    whole, paged = MemoryKube(), PagedKube(size=5)
    fill(whole)
    fill(paged)
    uids = [str(p["metadata"]["uid"]) for p in whole.pods()]
    one, many = new_cache(whole), new_cache(paged)
    asyncio.run(one.sync())
    asyncio.run(many.sync())
    assert paged.pages == 8  # 37 pods
    assert state(many, uids) == state(one, uids)


def test_bookings_made_while_the_pages_come_in_are_kept() -> None:
    kube = PagedKube(size=4)
    pending = fill(kube)
    cache = new_cache(kube)
    asyncio.run(cache.sync())
    first, second = pending[0], pending[1]
    booked = {}

    def book(page: int) -> None:
        if page == 2:  # a bind books while the list is under way
            allocation = _allocation(first, "n0", 0)
            cache.state.ledger.assume(allocation, NO_HOST)
            booked["bind"] = allocation
        if page == 5:  # and prioritize books an intent
            allocation = _allocation(second, "n1", 1)
            cache.state.ledger.intend(allocation, NO_HOST, until_ns=123)
            booked["intent"] = allocation

    kube.between = book
    kube.pages = 0
    before = cache.state.ledger
    asyncio.run(cache.sync())
    assert cache.state.ledger is not before
    kept = cache.state.ledger.kept(str(first["metadata"]["uid"]))
    assert kept is not None and kept.allocation == booked["bind"]
    assert cache.state.ledger.intent_until(str(second["metadata"]["uid"])) == 123
    assert cache.state.ledger.holding(str(second["metadata"]["uid"])) == booked["intent"]


def test_a_pending_pod_is_kept_as_the_fields_the_core_reads_listed_or_watched() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("n0", gpus_units=[15]))
    heavy = gpu_pod("p0", mem=2)
    heavy["spec"]["containers"][0].update(image="registry.example/app:1", env=[{"name": "A"}])
    heavy["spec"]["volumes"] = [{"name": "token", "projected": {"sources": [{"x": {}}]}}]
    listed = kube.create_pod(heavy)
    cache = ClusterCache(kube, settings=Settings())
    asyncio.run(cache.sync())
    watched = json.loads(json.dumps(listed))
    watched["metadata"]["uid"] = "uid-watched"
    cache.apply_pod(WatchEvent(type="ADDED", object=watched))
    for pod in (listed, watched):
        kept = cache.state.pending[pod["metadata"]["uid"]]
        assert kept == read_fields(pod)
        [container] = kept["spec"]["containers"]
        assert set(container) == {"name", "resources"}
        assert kept["spec"]["volumes"] == [{"name": "token", "projected": {}}]


class _Listed(dict[str, Any]):
    """A listed node that can be watched for being freed (a plain dict cannot)."""


def test_the_listed_nodes_are_let_go_before_the_pods_are_listed() -> None:
    """A node as listed is several KiB; the cache keeps what it reads of each (inventory,
    labels, taints) and drops the objects before the pod pages, whose state would come on top
    of them: 5,000 nodes are about 32 MiB."""
    kube = PagedKube(size=4)
    fill(kube)
    seen: list[weakref.ref[_Listed]] = []

    async def list_nodes() -> tuple[list[KubeDict], str]:
        nodes, version = await MemoryKube.list_nodes(kube)
        listed = [_Listed(n) for n in nodes]
        seen.extend(weakref.ref(n) for n in listed)
        return list(listed), version

    alive: list[int] = []
    kube.list_nodes = list_nodes  # type: ignore[method-assign]
    kube.between = lambda _: alive.append(sum(ref() is not None for ref in seen))
    cache = ClusterCache(kube, settings=Settings(), book=PolicyBook())
    asyncio.run(cache.sync())
    assert len(seen) == len(NODES) and set(cache.state.nodes) == set(NODES)
    assert cache.state.book is not None and set(cache.state.book.node_labels) == set(NODES)
    assert alive and set(alive) == {0}


def test_a_bound_pods_status_updates_are_passed_over_and_its_changes_taken_in() -> None:
    """kubelet's status updates of a bound pod repeat what the cache read of it: they are
    not judged, read and booked again. A change of what is read (labels, annotations, spec,
    a phase that ends the pod) is taken in, and an unbound pod is always kept as watched
    (bind starts from that copy's resourceVersion)."""
    kube = MemoryKube()
    pending = fill(kube)
    cache = new_cache(kube)
    asyncio.run(cache.sync())
    taken: list[str] = []
    observe = cache.state.ledger.observe

    def counted(pod: KubeDict) -> Any:
        taken.append(pod["metadata"]["name"])
        return observe(pod)

    cache.state.ledger.observe = counted  # type: ignore[method-assign]
    bound = json.loads(json.dumps(asyncio.run(kube.get_pod("default", "g0"))))

    def event(change: Callable[[KubeDict], None], version: int) -> WatchEvent:
        changed = json.loads(json.dumps(bound))
        changed["metadata"]["resourceVersion"] = str(version)
        change(changed)
        return WatchEvent(type="MODIFIED", object=changed)

    def running(pod: KubeDict) -> None:
        pod["status"] = {"phase": "Running", "containerStatuses": [{"name": "main"}]}

    cache.apply_pod(event(lambda pod: None, 900))  # first sight since the list: taken in
    for version in (901, 902):
        cache.apply_pod(event(running, version))
    assert taken == ["g0"]

    def labelled(pod: KubeDict) -> None:
        pod["metadata"]["labels"]["team"] = "a"

    def labelled_running(pod: KubeDict) -> None:
        labelled(pod)
        running(pod)

    cache.apply_pod(event(labelled, 903))
    cache.apply_pod(event(labelled_running, 904))
    assert taken == ["g0", "g0"]

    def done(pod: KubeDict) -> None:
        labelled(pod)
        pod["status"] = {"phase": "Succeeded"}

    cache.apply_pod(event(done, 905))
    assert taken == ["g0", "g0", "g0"]
    assert cache.state.ledger.holding(bound["metadata"]["uid"]) is None
    waiting = json.loads(json.dumps(pending[0]))
    for version in (906, 907):
        waiting["metadata"]["resourceVersion"] = str(version)
        cache.apply_pod(WatchEvent(type="MODIFIED", object=json.loads(json.dumps(waiting))))
    assert taken[3:] == ["p0", "p0"]
    assert cache.state.pending[waiting["metadata"]["uid"]]["metadata"]["resourceVersion"] == "907"
