"""The ``envvar`` device-list strategy on the containerd that lacks CDI: Debian's 1.6.

Every other real-node test runs containerd 2 with ``cdi-cri``. Nodes without CDI still exist,
and there the plugin hands the GPUs over in ``NVIDIA_VISIBLE_DEVICES`` alone, for the NVIDIA
runtime hook to read. This smoke test keeps that path working under a real kubelet and runtime:
the variable names the placed GPUs, and, with runc alone and no hook, the container gets no GPU
device node and none of the CDI spec's variables (nothing but the variable is handed over).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.cluster import Cluster
from harness.realnode import RealNode, container, pod
from tests.support.e2e import hold_real_node
from tests.support.realnode import (
    NS,
    compare,
    create,
    fresh_namespace,
    gpu_containers,
    gpu_uuids,
    wait_done,
)


@pytest.fixture(scope="module")
def debian_node(cluster: Cluster) -> Iterator[RealNode]:
    yield from hold_real_node(cluster, containerd="debian", device_list_strategy="envvar")


def test_envvar_on_debian_containerd_1_6(debian_node: RealNode) -> None:
    cluster = debian_node.cluster
    server = debian_node.ctr("version").stdout.partition("Server:")[2]
    assert "Version:  1.6" in server, server  # Debian's daemon, not the one built for v2
    fresh_namespace(cluster)
    manifests = [
        pod("envvar", NS, [container("a", 3), container("b", 2)]),
        pod(
            "envvar-two-gpus",
            NS,
            [container("main", 20)],
            labels={"app": "real", "aliyun.com/gpu-count": "2"},
        ),
    ]
    create(cluster, manifests)
    items = wait_done(cluster, {m["metadata"]["name"] for m in manifests}, 180)
    checked, mismatches, seen = compare(items, gpu_uuids(cluster), "envvar")
    print(seen)
    assert not mismatches, mismatches
    assert checked == sum(len(gpu_containers(p)) for p in items) == 3
    assert all(env["NVIDIA_VISIBLE_DEVICES"].startswith("GPU-fake-") for env in seen.values())
    cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
