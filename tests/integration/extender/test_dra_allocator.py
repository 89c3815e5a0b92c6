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
from gpushare.core.model.names import DRA_CLAIM_NAME, DRA_DEVICE_CLASS, DRA_SCHEDULING_GATE
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.trust import Trust
from gpushare.extender.draallocator import DraAllocator
from gpushare.kube.port import Conflict, KubeDict, NotFound, WatchEvent


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
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {
            "name": f"{name}-gpushare-x1",
            "namespace": "default",
            "uid": f"claim-{name}",
            "resourceVersion": "1",
        },
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "main",
                        "exactly": {
                            "deviceClassName": DRA_DEVICE_CLASS,
                            "allocationMode": "ExactCount",
                            "count": 1,
                            "capacity": {"requests": {"memory": f"{gib}Gi"}},
                        },
                    }
                ]
            }
        },
    }
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


def test_a_pod_that_fits_nowhere_is_ungated_unallocated() -> None:
    async def body() -> None:
        api = DraDouble()
        _world(api, {"n1": (8,)})
        allocator = _allocator(api)
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
