"""Bind called again for a pod that is, or may already be, bound.

kube-scheduler retries a bind whose reply it did not get in time (``httpTimeout``), and a
binding call can time out after the API server has stored it. Bind must then find the pod
bound and leave its allocation alone: the annotations are the device plugin's only record of
the pod's GPU, and the ledger's only record after a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from gpushare.core.model.names import ANN_ALLOCATION, ANN_IDX
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from gpushare.kube.port import Conflict, KubeDict, Unreachable
from tests.support.rig import Rig, binding, run_with_rig

NODE = "two-gpus"
OTHER = "other"


def two_gpu_cluster(kube: MemoryKube | None = None) -> MemoryKube:
    kube = kube or MemoryKube()
    kube.put_node(gpu_node(NODE, gpus_units=[15, 15]))
    kube.put_node(gpu_node(OTHER, gpus_units=[15]))
    return kube


async def annotations(rig: Rig, name: str) -> dict[str, str]:
    stored = await rig.kube.get_pod("default", name)
    return dict(stored["metadata"].get("annotations") or {})


def per_gpu(rig: Rig, node: str = NODE) -> dict[int, int]:
    usage = rig.cache.state.ledger.usage(node)
    return {index: held.mem_units for index, held in sorted(usage.gpus.items())}


def test_a_repeated_bind_succeeds_and_leaves_the_allocation_alone() -> None:
    kube = two_gpu_cluster()
    a = kube.create_pod(gpu_pod("a", mem=10))
    b = kube.create_pod(gpu_pod("b", mem=15))

    async def body(rig: Rig) -> None:
        assert await rig.post("bind", binding(a, NODE)) == {"Error": ""}
        await rig.settle()
        before = await annotations(rig, "a")
        calls = len(rig.kube.calls)
        assert await rig.post("bind", binding(a, NODE)) == {"Error": ""}
        await rig.settle()
        assert await annotations(rig, "a") == before
        written = [c for c in rig.kube.calls[calls:] if c in ("patch_pod_annotations", "bind_pod")]
        assert written == []  # neither re-planned nor rewritten
        assert per_gpu(rig) == {int(before[ANN_IDX]): 10}
        # the 15 GiB pod goes to the other GPU, never on top of a's 10 GiB
        assert await rig.post("bind", binding(b, NODE)) == {"Error": ""}
        await rig.settle()
        assert sorted(per_gpu(rig).values()) == [10, 15]

    run_with_rig(kube, body)


def test_a_bind_to_another_node_is_refused_and_keeps_the_allocation() -> None:
    kube = two_gpu_cluster()
    a = kube.create_pod(gpu_pod("a", mem=10))

    async def body(rig: Rig) -> None:
        assert await rig.post("bind", binding(a, NODE)) == {"Error": ""}
        await rig.settle()
        before = await annotations(rig, "a")
        reply = await rig.post("bind", binding(a, OTHER))
        assert f"already bound to node {NODE}" in reply["Error"]
        await rig.settle()
        assert await annotations(rig, "a") == before
        assert sum(per_gpu(rig).values()) == 10 and per_gpu(rig, OTHER) == {}

    run_with_rig(kube, body)


class TimesOutAfterBinding(MemoryKube):
    """The binding is stored, but the reply never arrives (the API server was paused)."""

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        await super().bind_pod(namespace, name, uid, node, **kwargs)
        raise Unreachable("POST pods/binding: timed out after 5s")


def test_a_binding_that_timed_out_but_went_through_is_a_success() -> None:
    kube = two_gpu_cluster(TimesOutAfterBinding())
    a = kube.create_pod(gpu_pod("a", mem=10))

    async def body(rig: Rig) -> None:
        assert await rig.post("bind", binding(a, NODE)) == {"Error": ""}
        await rig.settle()
        assert ANN_ALLOCATION in await annotations(rig, "a")
        assert sum(per_gpu(rig).values()) == 10
        # and kube-scheduler's retry of the same bind is answered alike, without a write
        calls = len(rig.kube.calls)
        assert await rig.post("bind", binding(a, NODE)) == {"Error": ""}
        assert "bind_pod" not in rig.kube.calls[calls:]

    run_with_rig(kube, body)


class BoundMeanwhile(MemoryKube):
    """Another scheduler binds the pod between gpushare's read and its binding."""

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        await super().bind_pod(namespace, name, uid, OTHER)
        await super().bind_pod(namespace, name, uid, node, **kwargs)


def test_a_binding_refused_because_the_pod_is_bound_meanwhile_writes_and_books_nothing() -> None:
    kube = two_gpu_cluster(BoundMeanwhile())
    a = kube.create_pod(gpu_pod("a", mem=10))

    async def body(rig: Rig) -> None:
        reply = await rig.post("bind", binding(a, NODE))
        assert f"already bound to node {OTHER}" in reply["Error"]
        await rig.settle()
        stored = await rig.kube.get_pod("default", "a")
        assert stored["spec"]["nodeName"] == OTHER
        # the binding carried the annotations, and the API server refused it whole
        assert ANN_ALLOCATION not in stored["metadata"].get("annotations", {})
        assert per_gpu(rig) == {}

    run_with_rig(kube, body)


class Yielding(MemoryKube):
    """Gives the event loop away before every call, as a real API client does."""

    async def get_pod(self, namespace: str, name: str) -> KubeDict:
        await asyncio.sleep(0)
        return await super().get_pod(namespace, name)

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str,
    ) -> KubeDict:
        await asyncio.sleep(0)
        return await super().patch_pod_annotations(
            namespace, name, annotations, resource_version=resource_version
        )

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        await asyncio.sleep(0)
        await super().bind_pod(namespace, name, uid, node, **kwargs)


def test_two_identical_binds_at_once_both_succeed_with_one_allocation() -> None:
    kube = two_gpu_cluster(Yielding())
    a = kube.create_pod(gpu_pod("a", mem=10))

    async def body(rig: Rig) -> None:
        replies: list[Any] = await asyncio.gather(
            rig.post("bind", binding(a, NODE)), rig.post("bind", binding(a, NODE))
        )
        assert replies == [{"Error": ""}, {"Error": ""}]
        await rig.settle()
        assert ANN_ALLOCATION in await annotations(rig, "a")
        assert rig.kube.calls.count("bind_pod") == 1
        assert sum(per_gpu(rig).values()) == 10

    run_with_rig(kube, body)


def test_memory_kube_refuses_a_second_binding_like_the_api_server() -> None:
    kube = two_gpu_cluster()
    a = kube.create_pod(gpu_pod("a", mem=10))

    async def body() -> None:
        uid = a["metadata"]["uid"]
        await kube.bind_pod("default", "a", uid, NODE)
        for node in (NODE, OTHER):
            try:
                await kube.bind_pod("default", "a", uid, node)
            except Conflict as err:
                assert f'already assigned to node "{NODE}"' in str(err)
            else:
                raise AssertionError("a second binding must be a Conflict")

    asyncio.run(body())


class BlindAfterBinding(MemoryKube):
    """The binding call fails and the API cannot be read afterwards either."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str, **kwargs: Any) -> None:
        self.down = True
        raise Unreachable("POST pods/binding: timed out after 5s")

    async def get_pod(self, namespace: str, name: str) -> KubeDict:
        if self.down:
            raise Unreachable("GET pod: connection refused")
        return await super().get_pod(namespace, name)


def test_when_the_outcome_cannot_be_read_the_allocation_is_kept() -> None:
    kube = two_gpu_cluster(BlindAfterBinding())
    a = kube.create_pod(gpu_pod("a", mem=10))

    async def body(rig: Rig) -> None:
        reply = await rig.post("bind", binding(a, NODE))
        assert "cannot read pod default/a to learn whether it is bound" in reply["Error"]
        await rig.settle()
        # whether the binding (and the annotations it carries) landed is unknown, so the
        # booking is held until the pod is seen again
        assert sum(per_gpu(rig).values()) == 10

    run_with_rig(kube, body)
