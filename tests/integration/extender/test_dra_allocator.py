"""The DRA allocator's loop over an in-memory DRA API: claims allocated, gates removed.

The API double keeps slices, claims, nodes and pods as dicts, checks ``resourceVersion`` on
every claim write as the API server does (a stale one is a Conflict) and can be told to
answer Conflict once, so the read-again path runs.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from gpushare.core.decision.clusterstate import ClusterState, PodTaken
from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.dra.allocate import FINALIZER
from gpushare.core.dra.slices import SliceSpec, build_slice
from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.names import DRA_CLAIM_NAME, DRA_SCHEDULING_GATE
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.trust import Trust
from gpushare.core.resourcepolicies.gating import ANN_POLICY, ANN_UNIT
from gpushare.core.resourcepolicies.policybook import PolicyBook
from gpushare.extender.draallocator import DraAllocator
from gpushare.kube.port import Conflict, KubeDict, NotFound, WatchEvent
from harness.dra import resource_claim


class DraDouble:
    """Just enough of ``DraAPI`` for the loop, with the API server's version checks."""

    def __init__(self) -> None:
        self.slices: list[KubeDict] = []
        self.nodes: list[KubeDict] = []
        self.claims: dict[str, KubeDict] = {}
        self.pods: dict[str, KubeDict] = {}
        self.version = 1
        self.conflicts = 0
        """Status writes to answer with Conflict before one lands."""

    def _bump(self, obj: KubeDict) -> KubeDict:
        self.version += 1
        obj["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(obj)

    async def list_resource_slices(self) -> tuple[list[KubeDict], str]:
        return copy.deepcopy(self.slices), "1"

    async def list_resource_claims(self) -> tuple[list[KubeDict], str]:
        return copy.deepcopy(list(self.claims.values())), "1"

    async def list_dra_nodes(self) -> tuple[list[KubeDict], str]:
        return copy.deepcopy(self.nodes), "1"

    async def _never(self, _: str) -> AsyncIterator[WatchEvent]:
        await asyncio.Event().wait()
        yield WatchEvent("BOOKMARK", {})

    watch_resource_slices = watch_resource_claims = watch_dra_nodes = _never

    async def get_resource_claim(self, namespace: str, name: str) -> KubeDict:
        if f"{namespace}/{name}" not in self.claims:
            raise NotFound(name)
        return copy.deepcopy(self.claims[f"{namespace}/{name}"])

    def _stored(self, claim: Mapping[str, Any]) -> KubeDict:
        key = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
        stored = self.claims[key]
        if claim["metadata"].get("resourceVersion") != stored["metadata"]["resourceVersion"]:
            raise Conflict(f"claim {key} changed")
        return stored

    async def replace_resource_claim(self, claim: Mapping[str, Any]) -> KubeDict:
        stored = self._stored(claim)
        stored["metadata"] = copy.deepcopy(dict(claim["metadata"]))
        return self._bump(stored)

    async def replace_resource_claim_status(self, claim: Mapping[str, Any]) -> KubeDict:
        stored = self._stored(claim)
        if self.conflicts:
            self.conflicts -= 1
            self._bump(stored)  # someone else wrote meanwhile
            raise Conflict("claim changed")
        stored["status"] = copy.deepcopy(claim["status"])
        return self._bump(stored)

    async def patch_pod_annotations(
        self,
        namespace: str,
        name: str,
        annotations: Mapping[str, str | None],
        *,
        resource_version: str,
        labels: Mapping[str, str] | None = None,
    ) -> KubeDict:
        pod = self.pods[f"{namespace}/{name}"]
        if pod["metadata"].get("resourceVersion") != resource_version:
            raise Conflict(f"pod {name} changed")
        notes = pod["metadata"].setdefault("annotations", {})
        for key, value in annotations.items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
        pod["metadata"].setdefault("labels", {}).update(labels or {})
        return self._bump(pod)

    async def patch_pod_json(
        self, namespace: str, name: str, operations: Sequence[Mapping[str, Any]]
    ) -> KubeDict:
        pod = self.pods[f"{namespace}/{name}"]
        for op in operations:
            if op["op"] == "test" and pod["spec"].get("schedulingGates") != op["value"]:
                raise Conflict("gates changed")
            if op["op"] == "remove":
                pod["spec"].pop("schedulingGates", None)
            if op["op"] == "replace":
                pod["spec"]["schedulingGates"] = op["value"]
        return copy.deepcopy(pod)


def _world(api: DraDouble, sizes: dict[str, tuple[int, ...]]) -> None:
    for node, gpus in sizes.items():
        spec = SliceSpec(
            node=node,
            unit=MemoryUnit.GiB,
            mode=Mode.SHARE,
            gpus=tuple(
                Gpu(index=i, mem_units=m, uuid=f"GPU-{node}-{i}") for i, m in enumerate(gpus)
            ),
        )
        api.slices.append(build_slice(spec))
        api.nodes.append(
            {
                "metadata": {"name": node, "labels": {}},
                "spec": {},
                "status": {"allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}},
            }
        )


def _pod_and_claim(api: DraDouble, name: str, gib: int) -> KubeDict:
    claim = resource_claim(
        f"{name}-gpushare-x1",
        "default",
        gib,
        metadata={"uid": f"claim-{name}", "resourceVersion": "1"},
    )
    api.claims[f"default/{name}-gpushare-x1"] = claim
    pod = {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}"},
        "spec": {
            "schedulingGates": [{"name": DRA_SCHEDULING_GATE}],
            "resourceClaims": [{"name": DRA_CLAIM_NAME, "resourceClaimTemplateName": "gpushare-t"}],
            "containers": [{"name": "main", "resources": {"claims": [{"name": DRA_CLAIM_NAME}]}}],
        },
        "status": {
            "resourceClaimStatuses": [
                {"name": DRA_CLAIM_NAME, "resourceClaimName": f"{name}-gpushare-x1"}
            ]
        },
    }
    api.pods[f"default/{name}"] = pod
    return copy.deepcopy(pod)


def _seen(allocator: DraAllocator, api: DraDouble, pod: KubeDict) -> None:
    """The claim as the claims watch brings it, then the pod as the pod watch does."""
    name = pod["status"].get("resourceClaimStatuses", [{}])[0].get("resourceClaimName")
    if name:
        allocator.claims.put(copy.deepcopy(api.claims[f"default/{name}"]))
    allocator.take(PodTaken(pod))


def _allocator(api: DraDouble) -> DraAllocator:
    state = ClusterState(settings=Settings(), trust=Trust())
    return DraAllocator(api=api, state=state, scheduler=Scheduler(Settings()))  # type: ignore[arg-type]


async def _synced(allocator: DraAllocator) -> asyncio.Task[None]:
    task = asyncio.create_task(allocator.run())
    while not (allocator.slices.synced and allocator.claims.synced and allocator.nodes.synced):
        await asyncio.sleep(0)
    return task


def _device(api: DraDouble, name: str) -> tuple[str, str]:
    result = api.claims[f"default/{name}-gpushare-x1"]["status"]["allocation"]["devices"]["results"]
    return result[0]["pool"], result[0]["device"]


def test_gated_pods_are_allocated_binpacked_and_ungated() -> None:
    async def body() -> None:
        api = DraDouble()
        _world(api, {"n1": (16, 16), "n2": (16,)})
        allocator = _allocator(api)
        task = await _synced(allocator)
        for name in ("a", "b"):
            _seen(allocator, api, _pod_and_claim(api, name, 4))
            api.conflicts = 1 if name == "b" else 0  # b's first status write loses a race
            done = await allocator.round()
            assert done.allocated == [f"default/{name}"] and done.ungated == [f"default/{name}"]
        assert _device(api, "a") == _device(api, "b") == ("n1", "gpu-0")
        for name in ("a", "b"):
            claim = api.claims[f"default/{name}-gpushare-x1"]
            assert FINALIZER in claim["metadata"]["finalizers"]
            assert claim["status"]["reservedFor"][0]["uid"] == f"uid-{name}"
            assert "schedulingGates" not in api.pods[f"default/{name}"]["spec"]
        assert not allocator.gated
        task.cancel()

    asyncio.run(body())


def test_a_pod_that_fits_nowhere_waits_gated_until_room_frees() -> None:
    """Ungated, the scheduler's own allocator could take it up at the moment gpushare places
    another pod in the room that freed: the GPU overcommitted by two allocators."""

    async def body() -> None:
        api = DraDouble()
        _world(api, {"n1": (16,)})
        allocator = _allocator(api)
        task = await _synced(allocator)
        _seen(allocator, api, _pod_and_claim(api, "first", 8))
        assert (await allocator.round()).allocated == ["default/first"]
        _seen(allocator, api, _pod_and_claim(api, "big", 12))
        for refused in (["default/big"], []):  # counted when told, then waiting
            done = await allocator.round()
            assert done.refused == refused and not done.ungated, done
        assert api.pods["default/big"]["spec"]["schedulingGates"]
        assert "status" not in api.claims["default/big-gpushare-x1"]
        # the first pod's claim goes (the resourceclaim controller deallocates it)
        del api.claims["default/first-gpushare-x1"]
        allocator.claims.objects.pop("default/first-gpushare-x1")
        allocator.claims.revision += 1
        allocator.state.ledger.forget("claim-first")
        done = await allocator.round()
        assert done.allocated == ["default/big"] and done.ungated == ["default/big"]
        task.cancel()

    asyncio.run(body())


def test_with_ungate_refused_a_pod_that_fits_nowhere_is_ungated_for_the_autoscaler() -> None:
    async def body() -> None:
        api = DraDouble()
        _world(api, {"n1": (8,)})
        allocator = _allocator(api)
        allocator.ungate_refused = True
        task = await _synced(allocator)
        _seen(allocator, api, _pod_and_claim(api, "big", 12))
        done = await allocator.round()
        assert done.refused == ["default/big"] and done.ungated == ["default/big"]
        assert "status" not in api.claims["default/big-gpushare-x1"]
        task.cancel()

    asyncio.run(body())


def test_a_pod_whose_claim_is_not_made_yet_waits_gated() -> None:
    async def body() -> None:
        api = DraDouble()
        _world(api, {"n1": (8,)})
        allocator = _allocator(api)
        task = await _synced(allocator)
        pod = _pod_and_claim(api, "early", 2)
        pod["status"] = {}
        _seen(allocator, api, pod)
        done = await allocator.round()
        assert done.waiting == ["default/early"] and not done.ungated
        task.cancel()

    asyncio.run(body())


def _policy_world(api: DraDouble, units: list[dict[str, Any]]) -> tuple[DraAllocator, PolicyBook]:
    """n1 (pool a) and n2 (pool b), 16 GiB each, and a ResourcePolicy over pods app=web."""
    _world(api, {"n1": (16,), "n2": (16,)})
    book = PolicyBook()
    for node, pool in (("n1", "a"), ("n2", "b")):
        book.observe_node({"metadata": {"name": node, "labels": {"pool": pool}}})
    book.put_policy(
        {
            "apiVersion": "scheduling.alibabacloud.com/v1alpha1",
            "kind": "ResourcePolicy",
            "metadata": {"name": "web", "namespace": "default", "uid": "rp"},
            "spec": {"selector": {"app": "web"}, "strategy": "prefer", "units": units},
        }
    )
    state = ClusterState(settings=Settings(), trust=Trust())
    allocator = DraAllocator(
        api=api,  # type: ignore[arg-type]
        state=state,
        scheduler=Scheduler(Settings()),
        book=book,
        clock=lambda: 1_000_000.0,
    )
    return allocator, book


def _web_pod(api: DraDouble, name: str) -> KubeDict:
    pod = _pod_and_claim(api, name, 4)
    for stored in (pod, api.pods[f"default/{name}"]):
        stored["metadata"]["labels"] = {"app": "web"}
        stored["metadata"]["resourceVersion"] = "7"
    return pod


def _bound(book: PolicyBook, api: DraDouble, name: str) -> None:
    """The pod as the watch shows it once kube-scheduler bound it where its claim says."""
    pod = copy.deepcopy(api.pods[f"default/{name}"])
    pod["spec"]["nodeName"] = _device(api, name)[0]
    book.observe_pod(pod)


def test_a_resource_policy_orders_dra_pods_and_marks_them_as_bind_does() -> None:
    async def body() -> None:
        api = DraDouble()
        units = [
            {"resource": "ecs", "nodeSelector": {"pool": "a"}, "max": 1, "podLabels": {"t": "1"}},
            {"resource": "ecs", "nodeSelector": {"pool": "b"}},
        ]
        allocator, book = _policy_world(api, units)
        task = await _synced(allocator)
        # binpack alone would put both on n1's GPU; the policy's max sends the second to n2
        for name, node in (("w1", "n1"), ("w2", "n2")):
            _seen(allocator, api, _web_pod(api, name))
            done = await allocator.round()
            assert done.allocated == [f"default/{name}"], done
            assert _device(api, name) == (node, "gpu-0")
            _bound(book, api, name)
        first, second = api.pods["default/w1"]["metadata"], api.pods["default/w2"]["metadata"]
        assert first["labels"] == {"app": "web", "t": "1"}
        assert first["annotations"][ANN_POLICY] == "web" == second["annotations"][ANN_POLICY]
        assert (first["annotations"][ANN_UNIT], second["annotations"][ANN_UNIT]) == ("1", "2")
        assert second["labels"] == {"app": "web"}
        task.cancel()

    asyncio.run(body())


def test_a_pod_the_policy_keeps_off_every_fitting_node_stays_gated() -> None:
    async def body() -> None:
        api = DraDouble()
        units = [{"resource": "ecs", "nodeSelector": {"pool": "a"}, "max": 1}]
        allocator, book = _policy_world(api, units)
        events: list[tuple[str, str]] = []
        allocator._tell = lambda pod, kind, reason, message: events.append((reason, message))  # type: ignore[method-assign]
        task = await _synced(allocator)
        _seen(allocator, api, _web_pod(api, "w1"))
        assert (await allocator.round()).allocated == ["default/w1"]
        _bound(book, api, "w1")
        _seen(allocator, api, _web_pod(api, "w2"))
        for anew in (["default/w2"], []):  # told once, however many rounds it waits
            done = await allocator.round()
            assert done.held == ["default/w2"] and not done.ungated, done
            assert done.held_anew == anew
        assert api.pods["default/w2"]["spec"]["schedulingGates"]
        assert "status" not in api.claims["default/w2-gpushare-x1"]
        held = [message for reason, message in events if reason == "DRAHeld"]
        assert len(held) == 1 and "nodes n1, n2: ResourcePolicy default/web" in held[0], held
        # the unit's pod goes: w2 takes its place
        book.forget_pod("uid-w1")
        done = await allocator.round()
        assert done.allocated == ["default/w2"] and _device(api, "w2") == ("n1", "gpu-0")
        task.cancel()

    asyncio.run(body())


def test_a_stale_pod_gets_no_claim_until_its_marks_are_written() -> None:
    async def body() -> None:
        api = DraDouble()
        units = [{"resource": "ecs", "nodeSelector": {"pool": "a"}, "podLabels": {"t": "1"}}]
        allocator, book = _policy_world(api, units)
        task = await _synced(allocator)
        pod = _web_pod(api, "w1")
        api.pods["default/w1"]["metadata"]["resourceVersion"] = "8"  # changed since the watch
        _seen(allocator, api, pod)
        done = await allocator.round()
        assert done.waiting == ["default/w1"] and not done.allocated
        assert "status" not in api.claims["default/w1-gpushare-x1"]
        assert not book.placed("default")  # the unit's assumption given back
        _seen(allocator, api, copy.deepcopy(api.pods["default/w1"]))
        assert (await allocator.round()).allocated == ["default/w1"]
        assert api.pods["default/w1"]["metadata"]["labels"]["t"] == "1"
        task.cancel()

    asyncio.run(body())


def test_a_gated_pod_deleted_while_it_waits_is_forgotten() -> None:
    """Its DELETED event's object still carries the gate (an unbound pod is deleted at once)."""

    async def body() -> None:
        api = DraDouble()
        _world(api, {"n1": (8,)})
        allocator = _allocator(api)
        task = await _synced(allocator)
        pod = _pod_and_claim(api, "big", 12)
        _seen(allocator, api, pod)
        assert (await allocator.round()).refused == ["default/big"]
        allocator.take(PodTaken(pod, deleted=True))
        assert not allocator.gated and not allocator._held
        task.cancel()

    asyncio.run(body())
