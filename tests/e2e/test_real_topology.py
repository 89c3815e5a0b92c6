"""Issue 18 on the real node: the device plugin publishes how its GPUs are connected, and a pod
over two GPUs gets the best-connected pair, even where packing alone would split it.

The real node's device plugin runs ``--fake-gpus 4x15GiB --fake-topology nvlink-pairs``: GPUs
0-1 and 2-3 are NVLink-bridged pairs, the pairs across NUMA nodes (distance 6). Two pods hold
GPU memory so that best fit ranks GPU0 first and leaves GPU1 too full: 5 GiB on GPU0, then
12 GiB on GPU1 (GPU0's 10 free GiB cannot take it). A pod asking 16 GiB over two GPUs (8 GiB
each) then fits on GPU0, GPU2 and GPU3; packing alone takes the tightest two, GPU0 and GPU2,
across sockets, and does so here while the plugin publishes no topology. With the topology
published it takes GPU2 and GPU3, and the container's environment, written by the device
plugin from the sealed allocation, names those two.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare.core.model.names import ANN_ALLOCATION, ANN_NODE_GPUS, ANN_NODE_TOPOLOGY
from gpushare.core.model.topology import layout
from harness.cluster import Cluster
from harness.realnode import NODE_NAME, RealNode, container, hand_off, pod, probe_env
from tests.support.e2e import eventually

NS = "e2e-topology"
LAYOUT = "nvlink-pairs"


def get_pod(cluster: Cluster, name: str) -> dict[str, Any]:
    found: dict[str, Any] = cluster.kubectl_json("get", "pod", "-n", NS, name)
    return found


def held(item: dict[str, Any]) -> list[int]:
    record = json.loads((item["metadata"].get("annotations") or {}).get(ANN_ALLOCATION, "{}"))
    return sorted(g["index"] for g in record.get("gpus", []))


def running(cluster: Cluster, name: str) -> dict[str, Any]:
    return eventually(  # type: ignore[no-any-return]
        lambda: (item := get_pod(cluster, name))["status"].get("phase") == "Running" and item,
        90,
        f"{name} Running on the real node",
    )


def finished(cluster: Cluster, name: str) -> dict[str, Any]:
    return eventually(  # type: ignore[no-any-return]
        lambda: (item := get_pod(cluster, name))["status"].get("phase") == "Succeeded" and item,
        120,
        f"{name} Succeeded on the real node",
    )


def probed(item: dict[str, Any]) -> dict[str, str]:
    (entry,) = item["status"]["containerStatuses"]
    return probe_env(entry["state"]["terminated"]["message"])


def uuids(cluster: Cluster) -> dict[int, str]:
    node = cluster.kubectl_json("get", "node", NODE_NAME)
    return {
        g["index"]: g["uuid"] for g in json.loads(node["metadata"]["annotations"][ANN_NODE_GPUS])
    }


def topology_on_node(cluster: Cluster) -> str:
    node = cluster.kubectl_json("get", "node", NODE_NAME)
    return str((node["metadata"].get("annotations") or {}).get(ANN_NODE_TOPOLOGY, ""))


def restart_plugin(node: RealNode, topology: str) -> None:
    node.fake_topology = topology
    node.start_plugin()
    node.wait_capacity()


def pair_pod(name: str) -> dict[str, Any]:
    return pod(
        name, NS, [container("main", 16)], labels={"app": "real", "aliyun.com/gpu-count": "2"}
    )


@pytest.fixture
def ns(real_node: RealNode) -> Iterator[str]:
    cluster = real_node.cluster
    cluster.kubectl("delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=180)
    cluster.create_namespace(NS)
    yield NS
    cluster.kubectl(
        "delete", "namespace", NS, "--ignore-not-found", "--wait=true", timeout=180, check=False
    )
    if real_node.fake_topology:
        restart_plugin(real_node, "")


def test_a_two_gpu_pod_gets_the_nvlink_pair_the_plugin_published(
    real_node: RealNode, ns: str
) -> None:
    cluster = real_node.cluster
    assert topology_on_node(cluster) == ""
    create = lambda manifest: cluster.kubectl("create", "-f", "-", input=json.dumps(manifest))  # noqa: E731

    # occupancy: 5 GiB on GPU0, then 12 GiB on GPU1 (GPU0's 10 free GiB cannot take it)
    create(pod("small", NS, [container("main", 5, command="sleep 3600")]))
    assert held(running(cluster, "small")) == [0]
    create(pod("big", NS, [container("main", 12, command="sleep 3600")]))
    assert held(running(cluster, "big")) == [1]

    # no topology published: packing alone takes the tightest two GPUs, 0 and 2
    create(pair_pod("packed"))
    packed = finished(cluster, "packed")
    assert held(packed) == [0, 2]
    cluster.kubectl("delete", "pod", "-n", NS, "packed", "--wait=true", timeout=60)

    # the plugin restarted with a topology writes it on its node, in core.model.topology's format
    restart_plugin(real_node, LAYOUT)
    text = eventually(lambda: topology_on_node(cluster), 30, "the topology annotation")
    distance, _ = layout(LAYOUT, 4)
    assert json.loads(text) == {"version": 1, "distance": [list(row) for row in distance]}

    create(pair_pod("paired"))
    paired = finished(cluster, "paired")
    assert held(paired) == [2, 3]
    env = probed(paired)
    print(env)
    by_index = uuids(cluster)
    want = hand_off([2, 3], by_index, real_node.device_list_strategy)
    assert {k: env.get(k) for k in want} == want
    assert env["ALIYUN_COM_GPU_MEM_IDX"] == "2,3"
    assert env["ALIYUN_COM_GPU_MEM_CONTAINER"] == "16"
    # the pods that held GPUs kept them throughout the restart
    assert held(get_pod(cluster, "small")) == [0] and held(get_pod(cluster, "big")) == [1]
