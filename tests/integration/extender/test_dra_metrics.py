"""DRA mode in the extender's ``/metrics`` and ``GET /inspect`` (``--dra-allocator``).

The allocator runs its own loop over the in-memory API (slices, claims, gated pods); once it has
allocated a pod's claim, the per-GPU and per-namespace series and ``/inspect`` show the DRA node
and the pod's share as they show a device-plugin node's, and the decision is counted.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx

from gpushare.core.decision.scheduling import Scheduler, Settings
from gpushare.core.dra.slices import SliceSpec, build_slice
from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.names import (
    ALLOCATION_MODE_DRA,
    DRA_CLAIM_NAME,
    DRA_SCHEDULING_GATE,
    LABEL_ALLOCATION_MODE,
)
from gpushare.core.model.units import MemoryUnit
from gpushare.extender.app import create_app
from gpushare.extender.draallocator import DraAllocator
from gpushare.extender.service import Extender
from gpushare.kube.backoff import Backoff
from gpushare.kube.cache import ClusterCache
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node
from harness.dra import resource_claim
from tests.support.scraping import gpu, samples

GIB = 1024**3


def dra_world(kube: MemoryKube) -> None:
    kube.put_node(
        {
            "metadata": {"name": "d1", "labels": {LABEL_ALLOCATION_MODE: ALLOCATION_MODE_DRA}},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "10.0.0.9"}],
                "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"},
            },
        }
    )
    gpus = tuple(Gpu(index=i, mem_units=16, model="Tesla T4") for i in range(2))
    kube.put_resource_slice(
        build_slice(SliceSpec(node="d1", unit=MemoryUnit.GiB, mode=Mode.SHARE, gpus=gpus))
    )
    kube.put_node(gpu_node("p1", ip="10.0.0.1", gpus_units=[15]))


def gated_pod(kube: MemoryKube, name: str, gib: int) -> None:
    claim = f"{name}-gpushare-x1"
    kube.put_resource_claim(resource_claim(claim, "team-a", gib))
    kube.create_pod(
        {
            "metadata": {"name": name, "namespace": "team-a", "uid": f"uid-{name}"},
            "spec": {
                "schedulerName": "default-scheduler",
                "schedulingGates": [{"name": DRA_SCHEDULING_GATE}],
                "resourceClaims": [{"name": DRA_CLAIM_NAME, "resourceClaimTemplateName": "t"}],
                "containers": [
                    {
                        "name": "main",
                        "image": "x",
                        "resources": {"claims": [{"name": DRA_CLAIM_NAME}]},
                    }
                ],
            },
            "status": {
                "phase": "Pending",
                "resourceClaimStatuses": [{"name": DRA_CLAIM_NAME, "resourceClaimName": claim}],
            },
        }
    )


def test_allocated_claims_show_in_metrics_and_inspect() -> None:
    kube = MemoryKube()
    dra_world(kube)

    async def body() -> dict[str, Any]:
        settings = Settings()
        scheduler = Scheduler(settings)
        cache = ClusterCache(kube, settings=settings, backoff=Backoff(base_s=0.01, cap_s=0.01))
        extender = Extender(api=kube, cache=cache, scheduler=scheduler)
        # ungate_refused: the pod that fits nowhere is ungated, so the wait below has an end
        allocator = DraAllocator(
            api=kube, state=cache.state, scheduler=scheduler, period_s=0.05, ungate_refused=True
        )
        app = create_app(extender, dra_allocator=allocator)
        client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x")

        def take(change: object) -> None:
            extender.take(change)
            allocator.take(change)

        tasks = [asyncio.create_task(cache.run(take)), asyncio.create_task(allocator.run())]
        try:
            gated_pod(kube, "train", 4)
            gated_pod(kube, "huge", 40)
            async with asyncio.timeout(10):
                while True:
                    claim = await kube.get_resource_claim("team-a", "train-gpushare-x1")
                    pod = await kube.get_pod("team-a", "huge")
                    if claim.get("status", {}).get("allocation") and not pod["spec"].get(
                        "schedulingGates"
                    ):
                        break
                    await asyncio.sleep(0.02)
            got = samples((await client.get("/metrics")).text)
            doc = (await client.get("/inspect")).json()
            return {"metrics": got, "inspect": doc}
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await client.aclose()

    result = asyncio.run(body())
    got, doc = result["metrics"], result["inspect"]
    assert got[("gpushare_gpu_memory_bytes", gpu("d1", 0))] == 16 * GIB
    assert got[("gpushare_gpu_memory_allocated_bytes", gpu("d1", 0))] == 4 * GIB
    assert got[("gpushare_gpu_pods", gpu("d1", 0))] == 1.0
    assert got[("gpushare_gpu_memory_allocated_bytes", gpu("d1", 1))] == 0.0
    assert got[("gpushare_gpu_memory_bytes", gpu("p1", 0))] == 15 * GIB  # device plugin's too
    namespace = (("pod_namespace", "team-a"),)
    assert got[("gpushare_namespace_gpu_memory_allocated_bytes", namespace)] == 4 * GIB
    outcome = "gpushare_dra_allocations_total"
    assert got[(outcome, (("outcome", "allocated"),))] == 1.0
    assert got[(outcome, (("outcome", "refused"),))] == 1.0
    assert got[(outcome, (("outcome", "not_ours"),))] == 0.0
    assert got[(outcome, (("outcome", "held"),))] == 0.0
    nodes = {n["name"]: n for n in doc["nodes"]}
    assert set(nodes) == {"d1", "p1"}
    assert nodes["d1"]["ip"] == "10.0.0.9" and nodes["d1"]["mode"] == "share"
    assert [(p["namespace"], p["name"], p["memUnits"]) for p in nodes["d1"]["pods"]] == [
        ("team-a", "train", {"0": 4})
    ]
