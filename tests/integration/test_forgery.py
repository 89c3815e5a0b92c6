"""A hostile tenant's pods: forged allocations and ``spec.nodeName`` never take anyone's GPU.

Each test is one finding, reproduced with what a tenant may do in their own namespace: create a
pod with any annotations, with any ``schedulerName``, and with ``spec.nodeName`` set (which skips
the scheduler). The forged records are written the way gpushare spells them.
"""

from __future__ import annotations

from typing import Any

from gpushare.core.allocation import Allocation, ContainerShare, GpuShare, to_annotations
from gpushare.core.requests import ContainerKind
from gpushare.core.units import MemoryUnit
from gpushare.inspect.cli import collect
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod

from .conftest import Rig, run_with_rig
from .test_observability import samples

VICTIM = "victim-node"


def forged(
    manifest: dict[str, Any], *, node: str, gpus: list[tuple[int, int]], container: str
) -> dict[str, Any]:
    """The manifest with a hand-written allocation: ``gpus`` is [(index, units)]."""
    shares = tuple(GpuShare(index=i, mem_units=m) for i, m in gpus)
    allocation = Allocation(
        uid="",
        namespace="default",
        name=manifest["metadata"]["name"],
        node=node,
        unit=MemoryUnit.GiB,
        gpus=shares,
        containers=(ContainerShare(name=container, kind=ContainerKind.APP, gpus=shares),),
    )
    manifest["metadata"]["annotations"] = to_annotations(allocation, dev_units=15)
    return manifest


def test_finding_1_a_forged_allocation_fills_no_gpu() -> None:
    """A pod asking for no GPU, never scheduled, naming both GPUs of a node at 15 GiB each."""
    kube = MemoryKube()
    kube.put_node(gpu_node(VICTIM, gpus_units=[15, 15]))
    squatter = forged(
        gpu_pod("squatter", mem=None, scheduler="nobody", namespace="default"),
        node=VICTIM,
        gpus=[(0, 15), (1, 15)],
        container="main",
    )
    kube.create_pod(squatter)

    async def body(rig: Rig) -> None:
        view = await collect(kube)
        (node,) = view.nodes
        assert [g.allocated_units for g in node.gpus] == [0, 0]
        assert [(i.name, i.reason) for i in view.ignored] == [("squatter", "no seal")]
        small = kube.create_pod(gpu_pod("small", mem=1))
        await rig.settle()
        outcome = await rig.driver.schedule(small, [VICTIM])
        assert outcome.bound, outcome.event(1)
        await rig.cache.sync()  # a relist does not count the pod again
        await rig.extender.events.drain()
        metrics = samples((await rig.client.get("/metrics")).text)
        assert metrics[("gpushare_untrusted_allocations_total", (("reason", "no_seal"),))] == 1
        warnings = [e for e in kube.events() if e["reason"] == "GPUShareUntrustedAllocation"]
        assert [e["involvedObject"]["name"] for e in warnings] == ["squatter"]
        assert "no seal" in warnings[0]["message"]

    run_with_rig(kube, body)
