"""The extender app in-process: wire format, bind safety, cache sync and restarts."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from gpushare.core.booking.ledger import Ledger
from gpushare.core.decision.scheduling import Settings
from gpushare.core.decision.yielding import HOLD_S
from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import ANN_ALLOCATION, ANN_ASSIGNED, ANN_IDX, ANN_RETRY
from gpushare.core.model.requests import PodRequest, Rejection, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation, plan
from gpushare.core.records.trust import SealKey, Trust
from gpushare.extender.app import server_config
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod, placed
from gpushare.kube.port import Conflict, KubeDict, KubeError
from tests.support.promql import scrape
from tests.support.rig import ConflictOnce, Rig, binding, run_with_rig

SEED = "cn-zhangjiakou.192.168.66.139"


WIRE_KEY = b"a fixed key, so the seal is golden"


def seed_cluster() -> MemoryKube:
    kube = MemoryKube(seal_key=WIRE_KEY)
    kube.put_node(gpu_node(SEED, ip="192.168.66.139", gpus_units=[15]))
    kube.put_node(gpu_node("core-node", ip="10.0.0.2", gpus_units=[15] * 4, mode=Mode.CORE_MEM))
    return kube


def dump(data: Any) -> str:
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def test_wire_format_of_filter_prioritize_and_bind(golden: Callable[[str, str], None]) -> None:
    kube = seed_cluster()
    pod = kube.create_pod(gpu_pod("gpu-share-sample-66191", mem=3))

    async def body(rig: Rig) -> None:
        names = [SEED, "core-node", "ghost-node"]
        filtered = await rig.post("filter", {"Pod": pod, "NodeNames": names})
        golden("extender_filter.json", dump(filtered))
        assert filtered["NodeNames"] == [SEED]
        assert set(filtered) == {
            "Nodes",
            "NodeNames",
            "FailedNodes",
            "FailedAndUnresolvableNodes",
            "Error",
        }
        scores = await rig.post("prioritize", {"Pod": pod, "NodeNames": [SEED]})
        golden("extender_prioritize.json", dump(scores))
        assert scores == [{"Host": SEED, "Score": 10}]  # the best (only) node asked about
        bound = await rig.post(
            "bind",
            {
                "PodName": pod["metadata"]["name"],
                "PodNamespace": "default",
                "PodUID": pod["metadata"]["uid"],
                "Node": SEED,
            },
        )
        assert bound == {"Error": ""}
        stored = await rig.kube.get_pod("default", pod["metadata"]["name"])
        annotations = stored["metadata"]["annotations"]
        golden("extender_bind_annotations.json", dump(annotations))
        assert stored["spec"]["nodeName"] == SEED
        assert annotations[ANN_IDX] == "0" and annotations[ANN_ASSIGNED] == "false"

    run_with_rig(kube, body)


def test_filter_with_full_node_objects_returns_nodes() -> None:
    kube = seed_cluster()
    pod = gpu_pod("p", mem=3)

    async def body(rig: Rig) -> None:
        filtered = await rig.post("filter", {"Pod": pod, "Nodes": {"items": rig.kube.nodes()}})
        assert [n["metadata"]["name"] for n in filtered["Nodes"]["items"]] == [SEED]
        assert filtered["NodeNames"] is None
        assert "core-node" in filtered["FailedAndUnresolvableNodes"]

    run_with_rig(kube, body)


def test_invalid_pod_fails_every_node_with_its_reason() -> None:
    kube = seed_cluster()
    pod = gpu_pod("bad", mem=2, core=33)

    async def body(rig: Rig) -> None:
        filtered = await rig.post("filter", {"Pod": pod, "NodeNames": [SEED, "core-node"]})
        reasons = filtered["FailedAndUnresolvableNodes"]
        assert set(reasons) == {SEED, "core-node"}
        assert "is not a multiple of 5" in reasons["core-node"]

    run_with_rig(kube, body)


def test_readyz_waits_for_the_first_sync() -> None:
    async def body(rig: Rig) -> None:
        rig.cache.synced = False
        response = await rig.client.get("/readyz")
        assert response.status_code == 503
        await rig.cache.sync(rig.extender.take)
        assert (await rig.client.get("/readyz")).status_code == 200
        assert (await rig.client.get("/healthz")).text == "ok"

    run_with_rig(seed_cluster(), body)


def test_relists_after_410_gone() -> None:
    async def body(rig: Rig) -> None:
        assert rig.cache.relists == 1
        # The event lands and the log is compacted before the watch reads it: Gone.
        rig.kube.put_node(gpu_node("late-node", gpus_units=[24]))
        rig.kube.compact()
        for _ in range(20):
            await rig.settle()
            if "late-node" in rig.cache.state.nodes:
                break
        assert rig.cache.relists == 2 and "late-node" in rig.cache.state.nodes

    run_with_rig(seed_cluster(), body)


def test_prioritize_names_only_the_nodes_that_score() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("part", gpus_units=[15]))
    for i in range(5):
        kube.put_node(gpu_node(f"empty-{i}", gpus_units=[15]))
    kube.create_pod(placed_pod(kube, "held", 10, "part"))
    pod = kube.create_pod(gpu_pod("p", mem=4))
    names = ["part", *(f"empty-{i}" for i in range(5))]

    async def body(rig: Rig) -> None:
        await rig.settle()
        # the part-used GPU fits best; the empty ones score 0 and are left out (0 either way)
        reply = await rig.post("prioritize", {"Pod": pod, "NodeNames": names})
        assert reply == [{"Host": "part", "Score": 10}]
        outcome = await rig.driver.schedule(pod, names)
        assert outcome.node == "part"

    run_with_rig(kube, body)


def test_bind_retries_after_a_resource_version_conflict() -> None:
    kube = ConflictOnce()
    kube.put_node(gpu_node(SEED, gpus_units=[15]))
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def body(rig: Rig) -> None:
        outcome = await rig.driver.schedule(pod, [SEED])
        assert outcome.bound
        assert kube.conflicts == 1
        metrics = (await rig.client.get("/metrics")).text
        assert 'gpushare_bind_total{outcome="conflict"} 1.0' in metrics
        assert 'gpushare_bind_total{outcome="bound"} 1.0' in metrics
        assert rig.cache.state.ledger.usage(SEED).mem_units == 3

    run_with_rig(kube, body)


class CountsReads(MemoryKube):
    """Counts pod reads; ``behind`` changes a pod in the API without the watch hearing of it."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    async def get_pod(self, namespace: str, name: str) -> KubeDict:
        self.reads += 1
        return await super().get_pod(namespace, name)


def one_pod(kube: MemoryKube) -> KubeDict:
    """A 15 GiB node SEED and an unbound 3 GiB pod ``p``."""
    kube.put_node(gpu_node(SEED, gpus_units=[15]))
    return kube.create_pod(gpu_pod("p", mem=3))


def keep_a_booking(rig: Rig, pod: KubeDict) -> Allocation:
    """Book GPU 0 of SEED for the pod, as a bind whose outcome was unknown leaves it."""
    request = read_pod(pod)
    assert isinstance(request, PodRequest)
    kept = plan(request, node=SEED, indexes=[0], unit=MemoryUnit.GiB)
    rig.cache.state.ledger.assume(kept)
    return kept


def test_bind_starts_from_the_watched_pod_without_reading_it() -> None:
    kube = CountsReads()
    pod = one_pod(kube)

    async def body(rig: Rig) -> None:
        await rig.settle()
        assert pod["metadata"]["uid"] in rig.cache.state.pending
        outcome = await rig.driver.schedule(pod, [SEED])
        assert outcome.bound and kube.reads == 0
        await rig.settle()
        # bound: the watch's copy is dropped, and a retried bind reads the pod and finds it
        assert pod["metadata"]["uid"] not in rig.cache.state.pending
        reply = await rig.post("bind", binding(pod, SEED))
        assert reply["Error"] == "" and kube.reads == 1
        assert rig.cache.state.ledger.usage(SEED).mem_units == 3

    run_with_rig(kube, body)


def test_a_watched_copy_behind_the_api_costs_a_409_and_a_read_never_a_stale_write() -> None:
    kube = CountsReads()
    pod = one_pod(kube)

    async def body(rig: Rig) -> None:
        await rig.settle()
        uid = pod["metadata"]["uid"]
        stale = rig.cache.state.pending[uid]
        # the API moves on and the watch has not told the cache yet
        kube.update_pod("default", "p", message="touched")
        await rig.settle()
        rig.cache.state.pending[uid] = stale
        reply = await rig.post("bind", binding(pod, SEED))
        assert reply["Error"] == "" and kube.reads == 1
        stored = await kube.get_pod("default", "p")
        assert stored["status"]["message"] == "touched"
        assert ANN_ALLOCATION in stored["metadata"]["annotations"]
        metrics = (await rig.client.get("/metrics")).text
        assert 'gpushare_bind_total{outcome="conflict"} 1.0' in metrics
        assert 'gpushare_bind_total{outcome="bound"} 1.0' in metrics
        assert rig.cache.state.ledger.usage(SEED).mem_units == 3

    run_with_rig(kube, body)


def test_a_booking_kept_from_an_unknown_bind_sends_the_next_bind_to_a_fresh_read() -> None:
    """After a bind whose outcome was unknown (the API server stalled), the pod keeps its
    booking, and the watch may have stalled too: the retried bind must read the pod as it is
    (the first binding may have landed), not trust the watch's copy and give the booking back
    on the 409 that copy earns."""
    kube = CountsReads()
    pod = one_pod(kube)

    async def body(rig: Rig) -> None:
        await rig.settle()
        uid = pod["metadata"]["uid"]
        keep_a_booking(rig, pod)
        assert uid in rig.cache.state.pending
        reply = await rig.post("bind", binding(pod, SEED))
        assert reply["Error"] == "" and kube.reads == 1
        assert rig.cache.state.ledger.usage(SEED).mem_units == 3

    run_with_rig(kube, body)


class EarlierBindingLands(CountsReads):
    """The binding of an earlier bind whose outcome was unknown lands just as the next bind
    writes: that bind meets a 409, and the read after it finds the pod bound."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger: Ledger | None = None
        self.booked_with: dict[str, str] = {}
        """The annotations the earlier binding carries."""
        self.booked_at_read: list[int] = []
        self.landed = False

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        if not self.landed:
            self.landed = True
            await super().bind_pod(namespace, name, uid, node, annotations=self.booked_with)
            raise Conflict(f'pod {name} is already assigned to node "{node}"')
        await super().bind_pod(namespace, name, uid, node, **kwargs)

    async def get_pod(self, namespace: str, name: str) -> KubeDict:
        assert self.ledger is not None
        self.booked_at_read.append(self.ledger.usage(SEED).mem_units)
        return await super().get_pod(namespace, name)


def test_a_409_from_the_earlier_binding_keeps_its_booking_until_the_watch_shows_it() -> None:
    """The pod kept a booking from a bind whose outcome was unknown; the next bind books
    again, and its binding meets a 409 because the first one landed. Between that 409 and the
    watch showing the pod bound with the first bind's annotations, its GPU stays booked (it
    was given back there before, and a pod filtered then could have been placed on it)."""
    kube = EarlierBindingLands()
    pod = one_pod(kube)

    async def body(rig: Rig) -> None:
        await rig.settle()
        kube.ledger = rig.cache.state.ledger
        kept = keep_a_booking(rig, pod)
        kube.booked_with = placed(pod, kept, trust=rig.cache.state.trust)["metadata"]["annotations"]
        reply = await rig.post("bind", binding(pod, SEED))
        # read 1 starts the bind (a kept booking); read 2 follows the 409 and finds it bound
        assert reply["Error"] == "" and kube.reads == 2
        assert kube.booked_at_read == [3, 3]
        assert rig.cache.state.ledger.usage(SEED).mem_units == 3
        await rig.settle()
        assert rig.cache.state.ledger.usage(SEED).mem_units == 3

    run_with_rig(kube, body)


def test_a_409_with_nothing_kept_gives_the_booking_back() -> None:
    kube = EarlierBindingLands()
    pod = one_pod(kube)

    async def body(rig: Rig) -> None:
        await rig.settle()
        kube.ledger = rig.cache.state.ledger
        reply = await rig.post("bind", binding(pod, SEED))
        # bound by another hand without gpushare's annotations: an error, nothing booked
        assert "is bound to" in reply["Error"] or "already" in reply["Error"], reply
        assert kube.booked_at_read[-1] == 0

    run_with_rig(kube, body)


class AlwaysConflict(MemoryKube):
    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        raise Conflict("the object has been modified")


def test_bind_gives_up_after_repeated_conflicts_and_frees_the_booking() -> None:
    kube = AlwaysConflict()
    kube.put_node(gpu_node(SEED, gpus_units=[15]))
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def body(rig: Rig) -> None:
        outcome = await rig.driver.schedule(pod, [SEED])
        assert not outcome.bound and "changed or was bound while binding" in outcome.error
        assert rig.cache.state.ledger.usage(SEED).mem_units == 0

    run_with_rig(kube, body)


class BindingFails(MemoryKube):
    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        raise KubeError("pods/binding refused")


class Exploding(MemoryKube):
    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        raise RuntimeError("unexpected")


@pytest.mark.parametrize(
    ("kube_class", "error"),
    [
        (BindingFails, "pods/binding refused"),
        # a bug must become an error reply, not a 500 with a booking left behind
        (Exploding, "internal error RuntimeError: unexpected"),
    ],
)
def test_failed_binding_clears_annotations_and_booking(
    kube_class: type[MemoryKube], error: str
) -> None:
    kube = kube_class()
    kube.put_node(gpu_node(SEED, gpus_units=[15]))
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def body(rig: Rig) -> None:
        outcome = await rig.driver.schedule(pod, [SEED])
        assert error in outcome.error
        await rig.settle()
        stored = await rig.kube.get_pod("default", "p")
        assert ANN_ALLOCATION not in stored["metadata"].get("annotations", {})
        assert rig.cache.state.ledger.usage(SEED).mem_units == 0

    run_with_rig(kube, body)


def test_concurrent_binds_never_double_book() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node(SEED, gpus_units=[15]))
    pods = [kube.create_pod(gpu_pod(f"p{i}", mem=10)) for i in range(4)]

    async def body(rig: Rig) -> None:
        results = await asyncio.gather(
            *(
                rig.post(
                    "bind",
                    {
                        "PodName": p["metadata"]["name"],
                        "PodNamespace": "default",
                        "PodUID": p["metadata"]["uid"],
                        "Node": SEED,
                    },
                )
                for p in pods
            )
        )
        errors = [r["Error"] for r in results]
        assert errors.count("") == 1
        assert all("no longer fits" in e for e in errors if e)
        await rig.settle()
        assert rig.cache.state.ledger.usage(SEED).on(0).mem_units == 10

    run_with_rig(kube, body)


def test_restart_rebuilds_the_ledger_from_annotations() -> None:
    kube = seed_cluster()
    pods = [kube.create_pod(gpu_pod(f"p{i}", mem=4)) for i in range(3)]

    async def first(rig: Rig) -> Any:
        for pod in pods:
            assert (await rig.driver.schedule(pod, [SEED, "core-node"])).bound
        await rig.settle()
        return (await rig.client.get("/inspect")).json()

    async def second(rig: Rig) -> Any:
        return (await rig.client.get("/inspect")).json()

    before = run_with_rig(kube, first)
    after = run_with_rig(kube, second)
    assert before == after
    by_name = {n["name"]: n for n in after["nodes"]}
    assert by_name[SEED]["allocatedUnits"] == 12


def test_finished_and_deleted_pods_free_their_share() -> None:
    kube = seed_cluster()
    pods = [kube.create_pod(gpu_pod(f"p{i}", mem=5)) for i in range(3)]

    async def body(rig: Rig) -> None:
        for pod in pods:
            assert (await rig.driver.schedule(pod, [SEED])).bound
        await rig.settle()
        fourth = kube.create_pod(gpu_pod("p3", mem=5))
        assert not (await rig.driver.schedule(fourth, [SEED])).bound
        kube.update_pod("default", "p0", phase="Succeeded")
        kube.delete_pod("default", "p1")
        await rig.settle()
        assert rig.cache.state.ledger.usage(SEED).mem_units == 5
        assert (await rig.driver.schedule(fourth, [SEED])).bound

    run_with_rig(kube, body)


def test_metrics_expose_gpu_allocation() -> None:
    kube = seed_cluster()
    pod = kube.create_pod(gpu_pod("p", mem=2, core=30))

    async def body(rig: Rig) -> None:
        assert (await rig.driver.schedule(pod, [SEED, "core-node"])).bound
        await rig.settle()
        text = (await rig.client.get("/metrics")).text
        series = scrape(text, {})
        gpu0 = {"gpu": "0", "model": "Tesla T4", "node": "core-node"}

        def value(name: str, labels: dict[str, str]) -> float:
            return series[frozenset({**labels, "__name__": name}.items())]

        assert value("gpushare_gpu_memory_allocated_bytes", gpu0) == 2 * 2**30
        assert value("gpushare_gpu_core_allocated_ratio", gpu0) == 0.3
        assert value("gpushare_gpu_pods", gpu0) == 1
        assert value("gpushare_gpu_memory_allocated_bytes", {**gpu0, "gpu": "1"}) == 0
        assert "gpushare_cache_synced 1.0" in text
        assert 'gpushare_extender_requests_total{outcome="fits",verb="filter"} 1.0' in text

    run_with_rig(kube, body)


def test_relist_drops_assumptions_of_pods_that_vanished() -> None:
    kube = seed_cluster()
    pod = kube.create_pod(gpu_pod("p", mem=5))

    async def body(rig: Rig) -> None:
        request = rig.extender.scheduler.read(pod)
        node = rig.cache.state.nodes[SEED]
        assert not isinstance(request, Rejection)
        rig.extender.scheduler.reserve(request, node, rig.cache.state.ledger)
        await rig.cache.sync(rig.extender.take)  # the pod still exists: the booking stays
        assert rig.cache.state.ledger.usage(SEED).mem_units == 5
        kube.delete_pod_unseen("default", "p")
        await rig.cache.sync(rig.extender.take)
        assert rig.cache.state.ledger.usage(SEED).mem_units == 0

    run_with_rig(kube, body)


def placed_pod(kube: MemoryKube, name: str, mem: int, node: str) -> KubeDict:
    """A pod already bound to GPU 0 of ``node``, with the annotations gpushare writes."""
    obj = gpu_pod(name, mem=mem)
    obj["metadata"]["uid"] = f"uid-{name}"
    request = read_pod(obj)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node=node, indexes=[0], unit=MemoryUnit.GiB)
    return placed(obj, allocation, trust=Trust.sealed(SealKey(kube.seal_key)))


@pytest.mark.parametrize(
    ("policy", "expected"), [("binpack", "full"), ("fgd", "roomy"), ("gpushare", "roomy")]
)
def test_fragmentation_aware_policy_learns_from_the_cache_and_avoids_fragments(
    policy: str, expected: str
) -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("full", gpus_units=[15]))
    kube.put_node(gpu_node("roomy", gpus_units=[15]))
    for name, mem, where in (("a", 4, "full"), ("b", 5, "full"), ("c", 5, "roomy")):
        kube.create_pod(placed_pod(kube, name, mem, where))
    for i in range(3):  # pending 4 GiB pods: the workload the cache sees coming
        kube.create_pod(gpu_pod(f"w{i}", mem=4))

    async def body(rig: Rig) -> None:
        pod = rig.kube.create_pod(gpu_pod("new", mem=3))
        await rig.settle()
        assert rig.extender.scheduler.workload is rig.cache.state.workload
        assert rig.cache.state.workload is not None and rig.cache.state.workload.seen == 7
        scores = await rig.post("prioritize", {"Pod": pod, "NodeNames": ["full", "roomy"]})
        outcome = await rig.driver.schedule(pod, ["full", "roomy"])
        assert outcome.node == expected, scores
        await rig.settle()
        # "full" keeps 6 GiB for the 4 GiB pods only when the 3 GiB pod went elsewhere
        stored = await rig.kube.get_pod("default", "new")
        assert stored["spec"]["nodeName"] == expected
        assert rig.cache.state.workload.seen == 7  # the bind's MODIFIED events count nothing again

    run_with_rig(kube, body, Settings(policy=policy))


def nested(depth: int) -> bytes:
    return b'{"Pod": ' + b'{"a": ' * depth + b"{}" + b"}" * depth + b"}"


def pod_with(spec: object) -> bytes:
    return json.dumps(
        {"Pod": {"metadata": {"name": "p"}, "spec": spec}, "NodeNames": [SEED]}
    ).encode()


@pytest.mark.parametrize(
    ("body", "loc", "msg"),
    [
        (b'{"NodeNames": []}', ["body"], "missing required field `Pod`"),
        (b'{"Pod": 1}', ["body", "Pod"], "Pod: expected an object, got a number"),
        (b'{"Pod": {}, "NodeNames": ["a", 3]}', ["body", "NodeNames", 1], "got a number"),
        (b'{"Pod": {}, "Nodes": {"items": [1]}}', ["body", "Nodes", "items", 0], "an object"),
        (b"{nope", ["body"], "not JSON"),
        (
            pod_with({"containers": None}),
            ["body", "Pod", "spec", "containers"],
            "Pod.spec.containers: expected a list, got null",
        ),
        (
            pod_with({"containers": "main"}),
            ["body", "Pod", "spec", "containers"],
            "Pod.spec.containers: expected a list, got a string",
        ),
        (
            pod_with({"containers": [None]}),
            ["body", "Pod", "spec", "containers", 0],
            "Pod.spec.containers[0]: expected an object, got null",
        ),
        (
            pod_with({"containers": [{"name": "c", "resources": {"limits": 3}}]}),
            ["body", "Pod", "spec", "containers", 0, "resources", "limits"],
            "Pod.spec.containers[0].resources.limits: expected an object, got a number",
        ),
        (
            pod_with({"initContainers": [{"name": "c", "resources": []}]}),
            ["body", "Pod", "spec", "initContainers", 0, "resources"],
            "expected an object, got a list",
        ),
        (pod_with(3), ["body", "Pod", "spec"], "Pod.spec: expected an object, got a number"),
        (
            b'{"Pod": {"metadata": {"labels": {"a": 1}}}, "NodeNames": []}',
            ["body", "Pod", "metadata", "labels", "a"],
            "expected a string, got a number",
        ),
        (
            b'{"Pod": {}, "Nodes": {"items": [{"metadata": null}]}}',
            ["body", "Nodes", "items", 0, "metadata"],
            "Nodes.items[0].metadata: expected an object, got null",
        ),
        (
            b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}',
            ["body", "Nodes", "items", 0, "metadata", "name"],
            "Nodes.items[0].metadata.name: expected a non-empty string, got nothing",
        ),
        (
            b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "n"}, "status": '
            b'{"capacity": []}}]}}',
            ["body", "Nodes", "items", 0, "status", "capacity"],
            "expected an object, got a list",
        ),
        (nested(5000), ["body"], "nested too deeply"),
        (b'{"Pod": {}, "NodeNames": ["n\xff"]}', ["body"], "not UTF-8: byte 0xff at offset 28"),
    ],
)
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_bad_bodies_get_400_naming_the_field_and_rule(
    verb: str, body: bytes, loc: list[object], msg: str
) -> None:
    async def check(rig: Rig) -> None:
        response = await rig.client.post(f"/{verb}", content=body)
        assert response.status_code == 400, response.text
        [detail] = response.json()["detail"]
        assert detail["loc"] == loc and msg in detail["msg"]

    run_with_rig(seed_cluster(), check)


BIND = {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": SEED}


@pytest.mark.parametrize(
    ("body", "loc", "msg"),
    [
        (json.dumps({**BIND, "Node": None}).encode(), ["body", "Node"], "Node: expected a string"),
        (json.dumps({"PodName": "p"}).encode(), ["body"], "missing required field `PodNamespace`"),
        (b"[]", ["body"], "expected an object, got a list"),
        (b"{nope", ["body"], "not JSON"),
        (b'{"PodName": "p\xff"}', ["body"], "not UTF-8: byte 0xff at offset 14"),
        (b'{"x": ' * 5000 + b"{}" + b"}" * 5000, ["body"], "nested too deeply"),
    ],
)
def test_bad_bind_bodies_get_400_naming_the_field_and_rule(
    body: bytes, loc: list[object], msg: str
) -> None:
    async def check(rig: Rig) -> None:
        response = await rig.client.post("/bind", content=body)
        assert response.status_code == 400, response.text
        [detail] = response.json()["detail"]
        assert detail["loc"] == loc and msg in detail["msg"]

    run_with_rig(seed_cluster(), check)


def test_server_config_uses_the_c_loop_and_parser_and_logs_access_only_at_debug() -> None:
    config = server_config(object(), host="127.0.0.1", port=0, log_level="info")
    assert (config.loop, config.http, config.access_log) == ("uvloop", "httptools", False)
    assert server_config(object(), host="h", port=1, log_level="DEBUG").access_log
    config.load()  # both are installed: uvicorn resolves them without falling back
    assert config.http_protocol_class.__name__ == "HttpToolsProtocol"


def test_a_quantity_the_api_server_keeps_as_written_is_placed_as_its_number() -> None:
    kube = seed_cluster()
    # kube-apiserver stores "+3" and "3e0" as written (they are already short)
    pods = [kube.create_pod(gpu_pod(f"p{i}", mem=mem)) for i, mem in enumerate(["+3", "3e0"])]

    async def body(rig: Rig) -> None:
        for pod in pods:
            assert (await rig.driver.schedule(pod, [SEED])).bound
        await rig.settle()
        assert rig.cache.state.ledger.usage(SEED).mem_units == 6

    run_with_rig(kube, body)


def test_the_verbs_answer_alike_by_the_short_way_and_through_fastapi() -> None:
    """``_ExtenderApp`` answers POST on the verbs itself; the FastAPI routes stay for the
    OpenAPI page and other methods, and give the same replies."""
    kube = seed_cluster()
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def body(rig: Rig) -> None:
        app = rig.client._transport.app  # type: ignore[attr-defined]
        routed = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=super(type(app), app).__call__),
            base_url="http://extender",
        )
        args = {"Pod": pod, "NodeNames": [SEED, "core-node"]}
        for verb, payload in (("filter", args), ("prioritize", args), ("filter", {"Pod": 1})):
            short = await rig.client.post(f"/{verb}", json=payload)
            long = await routed.post(f"/{verb}", json=payload)
            assert (short.status_code, short.json()) == (long.status_code, long.json())
            assert short.headers["content-type"] == "application/json"
        assert short.status_code == 400 and "Pod" in short.text
        assert (await rig.client.get("/filter")).status_code == 405
        await routed.aclose()

    run_with_rig(kube, body)


def test_the_openapi_page_describes_every_verb_from_the_wire_structs() -> None:
    """One description of the wire format: the structs that decode and encode also document."""

    async def body(rig: Rig) -> None:
        page = (await rig.client.get("/openapi.json")).json()
        components = page["components"]["schemas"]
        for name in (
            "ExtenderArgs",
            "NodeList",
            "ExtenderFilterResult",
            "HostPriority",
            "ExtenderBindingArgs",
            "ExtenderBindingResult",
        ):
            assert name in components, name
        assert set(components["ExtenderBindingArgs"]["required"]) == {
            "PodName",
            "PodNamespace",
            "PodUID",
            "Node",
        }
        refs: list[str] = []

        def walk(node: Any) -> None:
            if isinstance(node, dict):
                if "$ref" in node:
                    refs.append(node["$ref"])
                for value in node.values():
                    walk(value)
            elif isinstance(node, list):
                for value in node:
                    walk(value)

        for verb, request, reply in (
            ("filter", "ExtenderArgs", "ExtenderFilterResult"),
            ("prioritize", "ExtenderArgs", None),
            ("bind", "ExtenderBindingArgs", "ExtenderBindingResult"),
        ):
            operation = page["paths"][f"/{verb}"]["post"]
            body_schema = operation["requestBody"]["content"]["application/json"]["schema"]
            reply_schema = operation["responses"]["200"]["content"]["application/json"]["schema"]
            assert body_schema == {"$ref": f"#/components/schemas/{request}"}
            if reply:
                assert reply_schema == {"$ref": f"#/components/schemas/{reply}"}
            else:
                assert reply_schema["items"] == {"$ref": "#/components/schemas/HostPriority"}
        walk(page)
        assert refs and all(r.rsplit("/", 1)[1] in components for r in refs)

    run_with_rig(seed_cluster(), body)


def test_a_pod_scheduled_before_the_previous_bind_does_not_race_it() -> None:
    """kube-scheduler filters and prioritizes the next pod before the previous bind arrives:
    the intent booked at prioritize sends it to the other node, and both binds succeed."""
    kube = MemoryKube()
    for name in ("n0", "n1"):
        kube.put_node(gpu_node(name, gpus_units=[15]))
    first, second = (kube.create_pod(gpu_pod(f"p{i}", mem=10)) for i in range(2))

    async def body(rig: Rig) -> None:
        chosen = []
        for pod in (first, second):
            filtered = await rig.post("filter", {"Pod": pod, "NodeNames": ["n0", "n1"]})
            passing = filtered["NodeNames"]
            scores = await rig.post("prioritize", {"Pod": pod, "NodeNames": passing})
            chosen.append(max(scores, key=lambda s: s["Score"])["Host"])
        assert sorted(chosen) == ["n0", "n1"]
        replies = [
            await rig.post("bind", binding(p, n))
            for p, n in zip((first, second), chosen, strict=True)
        ]
        assert replies == [{"Error": ""}, {"Error": ""}]
        await rig.settle()
        ledger = rig.cache.state.ledger
        assert [ledger.usage(n).on(0).mem_units for n in ("n0", "n1")] == [10, 10]
        assert list(ledger.intents()) == []
        # one write per pod: the binding carries the annotations
        assert rig.kube.calls.count("patch_pod_annotations") == 0
        assert rig.kube.calls.count("bind_pod") == 2
        for name in ("p0", "p1"):
            stored = await rig.kube.get_pod("default", name)
            assert ANN_ALLOCATION in stored["metadata"]["annotations"]

    run_with_rig(kube, body)


def test_an_intent_is_given_back_when_its_pod_is_filtered_again_or_its_time_is_up() -> None:
    kube = MemoryKube()
    kube.put_node(gpu_node("n0", gpus_units=[15]))
    kube.put_node(gpu_node("n1", gpus_units=[15]))
    # the default profile: the filter answers with every node and prioritize books the intent
    pod = kube.create_pod(gpu_pod("p0", mem=10, scheduler="default-scheduler"))
    # another namespace: p0's own waits for its pod to be bound or gone (``namespace_stuck``)
    other = kube.create_pod(gpu_pod("p1", mem=10, namespace="other", scheduler="default-scheduler"))
    now = [1_700_000_000 * 10**9]
    both = ["n0", "n1"]

    async def body(rig: Rig) -> None:
        rig.extender.clock_ns = lambda: now[0]
        ledger = rig.cache.state.ledger
        await rig.post("filter", {"Pod": pod, "NodeNames": both})
        assert ledger.usage("n0").on(0).mem_units + ledger.usage("n1").on(0).mem_units == 0
        await rig.post("prioritize", {"Pod": pod, "NodeNames": ["n0"]})
        assert ledger.usage("n0").on(0).mem_units == 10
        refused = await rig.post("filter", {"Pod": other, "NodeNames": ["n0"]})
        assert refused["NodeNames"] == []
        # the same pod tried again: its own intent no longer counts against anyone
        await rig.post("filter", {"Pod": pod, "NodeNames": both})
        assert ledger.usage("n0").on(0).mem_units == 0
        await rig.post("prioritize", {"Pod": pod, "NodeNames": ["n0"]})
        now[0] += int(rig.extender.intent_ttl_s * 1e9)
        passed = await rig.post("filter", {"Pod": other, "NodeNames": ["n0"]})
        assert passed["NodeNames"] == ["n0"]
        text = (await rig.client.get("/metrics")).text
        assert 'gpushare_intents_total{outcome="expired"} 1.0' in text
        assert 'gpushare_intents_total{outcome="dropped"} 1.0' in text
        # two at prioritize, and one at the last filter, where n0 was the only node
        assert 'gpushare_intents_total{outcome="booked"} 3.0' in text
        assert ledger.usage("n0").on(0).mem_units == 10

    run_with_rig(kube, body)


def test_an_intent_past_its_deadline_is_given_back_by_the_clock_and_the_refused_pods_retried() -> (
    None
):
    """A pod waiting in PreBind (a volume never provisioned) sends no bind: its intent goes
    back by the clock, with no filter call, and the pods refused meanwhile are touched so
    kube-scheduler tries them again before its 5-minute flush."""
    kube = MemoryKube()
    kube.put_node(gpu_node("n0", gpus_units=[16]))
    stuck = kube.create_pod(gpu_pod("stuck", mem=15))
    victim = kube.create_pod(gpu_pod("victim", mem=15, namespace="other"))
    now = [1_700_000_000 * 10**9]

    async def body(rig: Rig) -> None:
        rig.extender.clock_ns = lambda: now[0]
        ledger = rig.cache.state.ledger
        booked = await rig.post("filter", {"Pod": stuck, "NodeNames": ["n0"]})
        assert booked["NodeNames"] == ["n0"] and ledger.usage("n0").on(0).mem_units == 15
        refused = await rig.post("filter", {"Pod": victim, "NodeNames": ["n0"]})
        assert refused["NodeNames"] == []
        assert rig.extender.sweep() == [], "nothing came back yet"
        now[0] += int(rig.extender.intent_ttl_s * 1e9)
        due = rig.extender.sweep()
        assert ledger.usage("n0").on(0).mem_units == 0, "given back without a filter call"
        assert [pod.name for pod in due] == ["victim"]
        await rig.extender.retry(due)
        stored = await rig.kube.get_pod("other", "victim")
        assert ANN_RETRY in stored["metadata"]["annotations"]
        assert rig.extender.sweep() == [], "touched once per refusal"
        # refused again after the touch: it waits for the next time GPUs come back
        await rig.post("filter", {"Pod": stuck, "NodeNames": ["n0"]})
        await rig.post("filter", {"Pod": victim, "NodeNames": ["n0"]})
        assert rig.extender.sweep() == []
        text = (await rig.client.get("/metrics")).text
        assert 'gpushare_retries_total{outcome="touched"} 1.0' in text
        assert 'gpushare_intents_total{outcome="expired"} 1.0' in text

    run_with_rig(kube, body)


def test_a_namespace_whose_intent_ran_out_books_none_while_that_pod_is_pending() -> None:
    """A tenant's next pods would most likely wait in PreBind too: they are placed as before,
    with nothing booked, until the stuck pod is bound or gone; other namespaces book as ever."""
    kube = MemoryKube()
    kube.put_node(gpu_node("n0", gpus_units=[16, 16, 16]))
    stuck = kube.create_pod(gpu_pod("stuck", mem=15, namespace="a"))
    again = kube.create_pod(gpu_pod("again", mem=15, namespace="a"))
    other = kube.create_pod(gpu_pod("other", mem=15, namespace="b"))
    now = [1_700_000_000 * 10**9]

    async def body(rig: Rig) -> None:
        rig.extender.clock_ns = lambda: now[0]
        ledger = rig.cache.state.ledger
        await rig.post("filter", {"Pod": stuck, "NodeNames": ["n0"]})
        now[0] += int(rig.extender.intent_ttl_s * 1e9)
        rig.extender.sweep()
        answer = await rig.post("filter", {"Pod": again, "NodeNames": ["n0"]})
        assert answer["NodeNames"] == ["n0"], "placed all the same"
        assert ledger.intent_until(again["metadata"]["uid"]) is None
        await rig.post("filter", {"Pod": other, "NodeNames": ["n0"]})
        assert ledger.intent_until(other["metadata"]["uid"]) is not None
        rig.kube.delete_pod("a", "stuck")
        await rig.settle()
        await rig.post("filter", {"Pod": again, "NodeNames": ["n0"]})
        assert ledger.intent_until(again["metadata"]["uid"]) is not None
        text = (await rig.client.get("/metrics")).text
        assert 'gpushare_intents_total{outcome="withheld"} 1.0' in text

    run_with_rig(kube, body)


def born(pod: dict[str, Any], when: str, priority: int | None = None) -> dict[str, Any]:
    """The pod with the creation time (and priority) the API server would have written."""
    pod["metadata"]["creationTimestamp"] = when
    if priority is not None:
        pod["spec"]["priority"] = priority
    return pod


def test_an_intent_older_than_the_hold_gives_way_to_a_pod_that_fits_nowhere_else() -> None:
    """Issue 56's waves: pods stuck in PreBind, created again before their intents ran out,
    held the pool whatever rule remembered pods or namespaces. After ``HOLD_S`` an intent only
    prefers: a pod that fits nowhere while it stands is placed, and the stuck pod's
    namespace counts as stuck (as if its intent had run out)."""
    kube = MemoryKube()
    kube.put_node(gpu_node("n0", gpus_units=[16]))
    stuck = kube.create_pod(born(gpu_pod("stuck", mem=15, namespace="a"), "2026-01-01T00:00:10Z"))
    victim = kube.create_pod(born(gpu_pod("victim", mem=15, namespace="b"), "2026-01-01T00:00:20Z"))
    now = [1_700_000_000 * 10**9]

    async def body(rig: Rig) -> None:
        rig.extender.clock_ns = lambda: now[0]
        ledger = rig.cache.state.ledger
        await rig.post("filter", {"Pod": stuck, "NodeNames": ["n0"]})
        assert ledger.intent_until(stuck["metadata"]["uid"]) is not None
        # within the hold, the stuck pod was there first: the victim waits
        now[0] += int(HOLD_S * 1e9) - 10**9
        answer = await rig.post("filter", {"Pod": victim, "NodeNames": ["n0"]})
        assert answer["NodeNames"] == [], answer
        assert ledger.intent_until(stuck["metadata"]["uid"]) is not None, "booked again"
        now[0] += 2 * 10**9
        answer = await rig.post("filter", {"Pod": victim, "NodeNames": ["n0"]})
        assert answer["NodeNames"] == ["n0"], answer
        assert ledger.intent_until(stuck["metadata"]["uid"]) is None
        assert ledger.intent_until(victim["metadata"]["uid"]) is not None
        assert rig.extender.intents.stuck_pods == {"a": {stuck["metadata"]["uid"]}}
        text = (await rig.client.get("/metrics")).text
        assert 'gpushare_intents_total{outcome="yielded"} 1.0' in text
        # the stuck pod's bind, were it to come, finds the GPU taken and fails
        bound = await rig.post("bind", binding(stuck, "n0"))
        assert bound.get("Error"), bound

    run_with_rig(kube, body)


def test_a_fresh_intent_gives_way_only_to_a_pod_that_was_there_first() -> None:
    """A pod created again is the newest there is: its fresh intent gives way to a pod that
    was waiting before it (higher priority, or equal and created earlier), never the other
    way round, so the first pod of a burst keeps its share."""
    kube = MemoryKube()
    kube.put_node(gpu_node("n0", gpus_units=[16]))
    old = kube.create_pod(born(gpu_pod("old", mem=15, namespace="b"), "2026-01-01T00:00:05Z"))
    young = kube.create_pod(born(gpu_pod("young", mem=15, namespace="a"), "2026-01-01T00:00:30Z"))
    urgent = kube.create_pod(
        born(gpu_pod("urgent", mem=15, namespace="c"), "2026-01-01T00:00:40Z", priority=1000)
    )
    now = [1_700_000_000 * 10**9]

    async def body(rig: Rig) -> None:
        rig.extender.clock_ns = lambda: now[0]
        ledger = rig.cache.state.ledger
        await rig.post("filter", {"Pod": young, "NodeNames": ["n0"]})
        answer = await rig.post("filter", {"Pod": old, "NodeNames": ["n0"]})
        assert answer["NodeNames"] == ["n0"], "the older pod takes the younger one's share"
        assert ledger.intent_until(young["metadata"]["uid"]) is None
        answer = await rig.post("filter", {"Pod": young, "NodeNames": ["n0"]})
        assert answer["NodeNames"] == [], "and keeps it against the younger one"
        assert ledger.intent_until(old["metadata"]["uid"]) is not None
        answer = await rig.post("filter", {"Pod": urgent, "NodeNames": ["n0"]})
        assert answer["NodeNames"] == ["n0"], "a higher priority goes first"
        assert rig.extender.intents.stuck_pods == {}, "none was held past the hold"

    run_with_rig(kube, body)


def spread_cluster(**node_spec: Any) -> MemoryKube:
    """Three nodes where a 3 GiB pod fits everywhere, one of them half full."""
    kube = MemoryKube()
    for i in range(3):
        node = gpu_node(f"n{i}", gpus_units=[15])
        node.setdefault("spec", {}).update(node_spec if i == 2 else {})
        kube.put_node(node)
    kube.create_pod(placed_pod(kube, "busy", 8, "n1"))
    return kube


NAMES = ["n0", "n1", "n2"]


async def answers(rig: Rig) -> str:
    text = (await rig.client.get("/metrics")).text
    return "\n".join(line for line in text.splitlines() if "filter_answers_total{" in line)


def test_the_filter_answers_a_packing_profile_pod_with_its_top_node_alone_and_books_it() -> None:
    """kube-scheduler takes a lone feasible node without scoring or prioritize; the node is
    the one prioritize would have put on top, and its GPU is booked for the pod at once."""
    kube = spread_cluster()
    first = kube.create_pod(gpu_pod("first", mem=3))
    twin = kube.create_pod(gpu_pod("twin", mem=3, scheduler="default-scheduler"))
    second = kube.create_pod(gpu_pod("second", mem=6))

    async def body(rig: Rig) -> None:
        await rig.settle()
        every = await rig.post("filter", {"Pod": twin, "NodeNames": NAMES})
        assert every["NodeNames"] == NAMES
        scores = await rig.post("prioritize", {"Pod": twin, "NodeNames": NAMES})
        top = max(scores, key=lambda s: s["Score"])["Host"]
        await rig.post("filter", {"Pod": twin, "NodeNames": []})  # gives the twin's back
        ledger = rig.cache.state.ledger
        held = {name: ledger.usage(name).mem_units for name in NAMES}
        alone = await rig.post("filter", {"Pod": first, "NodeNames": NAMES})
        assert alone["NodeNames"] == [top] and alone["FailedNodes"] == {}
        assert ledger.usage(top).mem_units == held[top] + 3, "booked as the pod's intent"
        # the next pod is filtered against it, as if the first were bound already
        uid = first["metadata"]["uid"]
        assert ledger.intent_until(uid) is not None
        after = await rig.post("filter", {"Pod": second, "NodeNames": NAMES})
        [chosen] = after["NodeNames"]
        expected = held[top] + 3 + (6 if chosen == top else 0)
        assert ledger.usage(top).mem_units == expected
        assert (await rig.post("bind", binding(first, top)))["Error"] == ""
        assert ledger.intent_until(uid) is None and ledger.usage(top).mem_units == expected
        assert 'answer="top_node"} 2.0' in await answers(rig)
        assert 'answer="other_profile"} 1.0' in await answers(rig)

    run_with_rig(kube, body)


def test_the_filter_answers_with_every_node_when_kube_schedulers_scores_may_differ() -> None:
    kube = spread_cluster(taints=[{"key": "k", "effect": "PreferNoSchedule"}])
    soft = gpu_pod("soft", mem=3)
    soft["spec"]["affinity"] = {
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": []}}
            ]
        }
    }
    soft = kube.create_pod(soft)
    plain = kube.create_pod(gpu_pod("plain", mem=3))

    async def body(rig: Rig) -> None:
        await rig.settle()
        every = await rig.post("filter", {"Pod": soft, "NodeNames": NAMES})
        assert every["NodeNames"] == NAMES
        # n2's PreferNoSchedule taint counts only when n2 is among the nodes
        every = await rig.post("filter", {"Pod": plain, "NodeNames": NAMES})
        assert every["NodeNames"] == NAMES
        alone = await rig.post("filter", {"Pod": plain, "NodeNames": ["n0", "n1"]})
        assert alone["NodeNames"] == ["n1"]
        counted = await answers(rig)
        assert 'answer="stated_preference"} 1.0' in counted
        assert 'answer="prefer_no_schedule_taint"} 1.0' in counted

    run_with_rig(kube, body)


def test_a_placed_pods_preferred_anti_affinity_that_matches_keeps_every_node() -> None:
    kube = spread_cluster()
    guard = placed_pod(kube, "guard", 1, "n0")
    term = {"labelSelector": {"matchLabels": {"app": "web"}}, "topologyKey": "h"}
    guard["spec"]["affinity"] = {
        "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 100, "podAffinityTerm": term}
            ]
        }
    }
    kube.create_pod(guard)
    web = gpu_pod("web", mem=3)
    web["metadata"]["labels"] = {"app": "web"}
    web = kube.create_pod(web)
    batch = kube.create_pod(gpu_pod("batch", mem=3))

    async def body(rig: Rig) -> None:
        await rig.settle()
        assert (await rig.post("filter", {"Pod": web, "NodeNames": NAMES}))["NodeNames"] == NAMES
        assert len((await rig.post("filter", {"Pod": batch, "NodeNames": NAMES}))["NodeNames"]) == 1
        kube.delete_pod("default", "guard")
        await rig.settle()
        assert len((await rig.post("filter", {"Pod": web, "NodeNames": NAMES}))["NodeNames"]) == 1
        assert 'answer="placed_affinity"} 1.0' in await answers(rig)

    run_with_rig(kube, body)


def test_no_packing_profile_means_every_node_for_every_pod() -> None:
    kube = spread_cluster()
    pod = kube.create_pod(gpu_pod("p", mem=3))

    async def body(rig: Rig) -> None:
        await rig.settle()
        rig.extender.packing_profile = ""
        assert (await rig.post("filter", {"Pod": pod, "NodeNames": NAMES}))["NodeNames"] == NAMES

    run_with_rig(kube, body)
