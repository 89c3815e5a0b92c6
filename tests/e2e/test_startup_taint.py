"""The device plugin removes its node's startup taint, under the chart's identity, on the real
kube-apiserver, once (and only once) kubelet allocates the node's GPU memory.

A node of an autoscaled pool is born with ``startup-taint.cluster-autoscaler.kubernetes.io/
gpushare``; cluster-autoscaler 1.36.1 counts a node with a startup taint as still starting
(``utils/taints/taints.go`` ``FilterOutNodesWithStartupTaints``), so it adds no second node for
the same pending pod while the plugin has not registered (../shared/docs/AUTOSCALERS.md,
"Resources that appear late on a new node"). Here the node is a kwok node and the test writes
``aliyun.com/gpu-mem`` into its allocatable as kubelet does after the plugin's registration; the
code that removes the taint is the plugin's own (``node.startuptaint.release_when_serving``),
with the token of the chart's ServiceAccount bound to that node, under the chart's RBAC and its
node policy (``deviceplugin-policy.yaml``), which lets the plugin drop that key and nothing else.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare.core.model.startuptaint import STARTUP_TAINT, Step
from gpushare.kube.lightkube_api import LightkubeAPI
from gpushare.kube.port import Conflict, Forbidden
from gpushare.node.startuptaint import release_once, release_when_serving
from harness.cluster import Cluster
from harness.identities import device_plugin_kubeconfig
from harness.seeding import kwok_node
from tests.support.e2e import delete_nodes

MEM = "aliyun.com/gpu-mem"
OURS = {"key": STARTUP_TAINT, "effect": "NoSchedule"}
OTHER = {"key": "example.com/dedicated", "value": "gpu", "effect": "NoSchedule"}
NODES = ("startup-taint-1", "startup-taint-2")


def newborn(name: str) -> dict[str, Any]:
    """A GPU node as it registers: the startup taint and another, no GPU memory yet."""
    node = kwok_node(name, gpus_units=[16] * 4)
    for field in ("capacity", "allocatable"):
        del node["status"][field][MEM]
    node["spec"] = {"taints": [OTHER, OURS]}
    return node


@pytest.fixture
def nodes(cluster: Cluster) -> Iterator[tuple[str, ...]]:
    cluster.create_nodes([newborn(n) for n in NODES])
    yield NODES
    delete_nodes(cluster, list(NODES))


def taints(cluster: Cluster, node: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = cluster.kubectl_json("get", "node", node)["spec"].get(
        "taints", []
    )
    return found


def kubelet_allocates(cluster: Cluster, node: str, amount: str) -> None:
    """Write the GPU memory into the node's status, as kubelet does after a registration."""
    body = {"status": {"capacity": {MEM: amount}, "allocatable": {MEM: amount}}}
    cluster.kubectl(
        "patch", "node", node, "--subresource=status", "--type=merge", "-p", json.dumps(body)
    )


def test_the_plugin_removes_the_startup_taint_once_kubelet_allocates_gpu_memory(
    cluster: Cluster, nodes: tuple[str, ...]
) -> None:
    mine, neighbour = nodes
    config = str(device_plugin_kubeconfig(cluster, mine))

    async def scenario() -> None:
        api = LightkubeAPI.connect(config)
        try:
            await steps(api)
        finally:
            await api.close()

    async def steps(api: LightkubeAPI) -> None:
        # no gpu-mem yet: read, decided, left alone (twice, a plugin's loop a few times)
        waiting = await release_once(api, mine, key=STARTUP_TAINT, resource=MEM)
        assert waiting.step is Step.WAIT, waiting
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(
                release_when_serving(api, mine, key=STARTUP_TAINT, resource=MEM, interval_s=0.2),
                1.5,
            )
        assert OURS in taints(cluster, mine)

        # a write made from an old reading is refused whole by the API server (422 -> Conflict)
        stale = await api.get_node(mine)
        kubelet_allocates(cluster, mine, "0")
        ops = [
            {
                "op": "test",
                "path": "/metadata/resourceVersion",
                "value": stale["metadata"]["resourceVersion"],
            },
            {"op": "replace", "path": "/spec/taints", "value": [OTHER]},
        ]
        with pytest.raises(Conflict):
            await api.patch_node_json(mine, ops)
        assert OURS in taints(cluster, mine)

        # the node policy: the plugin may drop its startup taint only, on its own node only
        with pytest.raises(Forbidden, match="stay as they are"):
            await api.patch_node_json(
                mine, [{"op": "replace", "path": "/spec/taints", "value": [OURS]}]
            )
        with pytest.raises(Forbidden, match="stay as they are"):  # nor cordon it on the way
            await api.patch_node_json(
                mine,
                [
                    {"op": "replace", "path": "/spec/taints", "value": [OTHER]},
                    {"op": "add", "path": "/spec/unschedulable", "value": True},
                ],
            )
        kubelet_allocates(cluster, neighbour, "64")
        with pytest.raises(Forbidden, match=f"may write that node only, not node '{neighbour}'"):
            await release_once(api, neighbour, key=STARTUP_TAINT, resource=MEM)
        assert OURS in taints(cluster, neighbour)

        # kubelet took the registration: the plugin's loop removes the taint, the other stays
        kubelet_allocates(cluster, mine, "64")
        done = await asyncio.wait_for(
            release_when_serving(api, mine, key=STARTUP_TAINT, resource=MEM, interval_s=0.2), 30
        )
        assert done.step is Step.REMOVE and done.removed == (OURS,)
        # and a second run finds nothing to do
        again = await release_once(api, mine, key=STARTUP_TAINT, resource=MEM)
        assert again.step is Step.DONE

    asyncio.run(scenario())
    left = taints(cluster, mine)
    assert OURS not in left and OTHER in left
