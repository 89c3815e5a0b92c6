"""A hostile tenant's pods: forged allocations and ``spec.nodeName`` never take anyone's GPU.

Each test is one finding, reproduced with what a tenant may do in their own namespace: create a
pod with any annotations, with any ``schedulerName``, and with ``spec.nodeName`` set (which skips
the scheduler). The forged records are written the way gpushare spells them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import grpc
import pytest
from prometheus_client import generate_latest

from gpushare.core.model.containers import ContainerKind
from gpushare.core.model.names import ANN_ASSIGNED
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import Allocation, ContainerShare, GpuShare, to_annotations
from gpushare.deviceplugin.metrics import registry_for
from gpushare.inspect.cli import collect
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod
from tests.support.pluginrig import MEM, NODE, pod, run
from tests.support.pluginrig import Rig as PluginRig
from tests.support.rig import Rig, run_with_rig
from tests.support.scraping import samples

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
        await rig.cache.sync(rig.extender.take)  # a relist does not count the pod again
        await rig.extender.events.drain()
        metrics = samples((await rig.client.get("/metrics")).text)
        assert metrics[("gpushare_untrusted_allocations_total", (("reason", "no_seal"),))] == 1
        warnings = [e for e in kube.events() if e["reason"] == "GPUShareUntrustedAllocation"]
        assert [e["involvedObject"]["name"] for e in warnings] == ["squatter"]
        assert "no seal" in warnings[0]["message"]

    run_with_rig(kube, body)


async def waiting_and_intruder(r: PluginRig) -> tuple[dict[str, Any], dict[str, Any]]:
    """A placed 5 GiB pod waiting for kubelet, and a 5 GiB stranger bound by nodeName beside it."""
    await r.kubelet.wait_devices(MEM, 30)
    waiting = await r.place(pod("waiting", 5))
    assert waiting is not None
    manifest = pod("intruder", 5)
    manifest["spec"]["nodeName"] = NODE
    intruder = r.kube.create_pod(manifest)
    await r.settle()
    return waiting, intruder


async def assigned(r: PluginRig, name: str) -> str:
    stored = await r.kube.get_pod("default", name)
    return str(stored["metadata"].get("annotations", {}).get(ANN_ASSIGNED, ""))


def test_finding_2_a_nodename_pod_with_a_forged_allocation_is_not_served() -> None:
    """GPU0 is 15/15; a pod created with nodeName and a forged 8 GiB on GPU0 gets nothing."""

    async def body(r: PluginRig) -> None:
        await r.kubelet.wait_devices(MEM, 30)
        full = await r.place(pod("full", 15))
        assert full is not None
        await r.kubelet.admit(full)
        manifest = pod("overcommit", 8)
        manifest["spec"]["nodeName"] = NODE
        intruder = r.kube.create_pod(forged(manifest, node=NODE, gpus=[(0, 8)], container="c0"))
        await r.settle()
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await r.kubelet.admit(intruder)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "default/overcommit" in str(refused.value.details())
        await asyncio.sleep(0.3)  # several served-checks
        assert await assigned(r, "overcommit") == "false"
        usage = r.cache.state.ledger.usage(NODE)
        assert usage.on(0).mem_units == 15
        assert usage.unplaced_mem_units == 8  # on the node as a whole, never on GPU0
        assert r.plugin.stats.untrusted == {"no_seal": 1}  # once, though read on every check
        exported = samples(generate_latest(registry_for(r.plugin, NODE)).decode())
        key = (
            "gpushare_device_plugin_untrusted_allocations_total",
            (("node", NODE), ("reason", "no_seal")),
        )
        assert exported[key] == 1

    run(body)


def test_finding_3_a_nodename_pod_never_gets_a_waiting_pods_answer() -> None:
    """A 5 GiB pod gpushare placed waits; a 5 GiB pod created with nodeName is admitted first.

    The intruder is refused. Then, as the real kubelet does, the waiting pod's Allocate comes
    at once, before the intruder's Failed phase reaches the API (kubelet writes it
    asynchronously): the plugin holds that refusal back until it sees the intruder Failed, and
    serves the waiting pod its own answer.
    """

    async def body(r: PluginRig) -> None:
        waiting, intruder = await waiting_and_intruder(r)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await r.kubelet.admit(intruder)
        details = str(refused.value.details())
        assert "pod default/intruder (it carries no gpushare allocation)" in details
        assert "default/waiting" in details
        r.kubelet.forget("default", "intruder")
        admitting = asyncio.create_task(r.kubelet.admit(waiting))
        await asyncio.sleep(0.3)
        assert not admitting.done()  # held back: the intruder is not seen Failed yet
        r.kube.update_pod("default", "intruder", phase="Failed")
        admitted = await admitting
        assert admitted.envs["c0"]["ALIYUN_COM_GPU_MEM_CONTAINER"] == "5"

    run(body)


def test_finding_3_a_stranger_that_vanishes_still_counts() -> None:
    """Force-deleted, a stranger may still be the pod kubelet admits: the refusal stands."""

    async def body(r: PluginRig) -> None:
        waiting, _ = await waiting_and_intruder(r)
        admitting = asyncio.create_task(r.kubelet.admit(waiting))
        await asyncio.sleep(0.3)
        r.kube.delete_pod("default", "intruder")
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await admitting
        assert "default/intruder" in str(refused.value.details())

    run(body)
