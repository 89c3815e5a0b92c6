"""GKE's node shape on the real node: no NVIDIA runtime, no CDI spec, a host driver directory.

On Container-Optimized OS the driver lives in ``/home/kubernetes/bin/nvidia`` and nothing in the
runtime hands GPUs to containers (issue 59, PLATFORMS.md G2/G3). The real node reproduces that
(``RealNode(driver_root=True)``): the fake NVML as the driver directory's
``lib64/libnvidia-ml.so.1``, ``/dev/null``-numbered device nodes in a device directory, no spec
in containerd's CDI directory, and no NVML on the loader's path.

Before: the chart's defaults (``cdi-cri``, no driver root) make the plugin refuse to start. After:
under ``driver-root`` the plugin reads the GPUs through the driver root's NVML, and each GPU
container sees exactly its placed GPUs' ``/dev/nvidia<i>``, the shared nodes, and the driver
directory read-only at ``/usr/local/nvidia``: only the Allocate answer can have put them there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.cluster import Cluster
from harness.realnode import RealNode, container, pod
from tests.support.e2e import eventually, hold_real_node
from tests.support.realnode import (
    NS,
    compare,
    create,
    fresh_namespace,
    gpu_containers,
    gpu_uuids,
    wait_done,
)

DRIVER_PROBE = (
    "{ echo PROBE_DRIVER_LIBS=$(ls /usr/local/nvidia/lib64 | tr '\\n' ,); "
    'echo PROBE_DRIVER_MOUNT=$(awk \'$2 == "/usr/local/nvidia" {split($4, o, ","); '
    "print o[1]}' /proc/mounts); "
    "echo PROBE_SHARED_NODES=$(for n in nvidiactl nvidia-uvm nvidia-uvm-tools; do "
    "[ -c /dev/$n ] && printf '%s,' $n; done); } >> /dev/termination-log"
)
"""Appended to each GPU container's termination message: the driver directory's files, its
mount's first option (``ro``), and the shared device nodes the container got."""


@pytest.fixture(scope="module")
def gke_node(cluster: Cluster) -> Iterator[RealNode]:
    yield from hold_real_node(
        cluster,
        driver_root=True,
        device_list_strategy="cdi-cri",  # the chart's default, for the "before"
        plugin=False,
        fake_gpus="2x16GiB",  # the fake NVML's GPUs
    )


def test_driver_root_hands_over_exactly_the_placed_gpus_where_the_defaults_refuse(
    gke_node: RealNode,
) -> None:
    cluster = gke_node.cluster
    assert not (gke_node.cdi_dir / "nvidia.yaml").exists()
    before = gke_node.start_plugin()
    eventually(lambda: not before.alive(), 60, "the plugin to refuse its start")
    refusal = [line for line in before.tail(5).splitlines() if line.startswith("error:")]
    print("before:", refusal)
    assert refusal and refusal[-1].startswith(
        "error: cannot read GPUs through NVML (NVMLError_LibraryNotFound: NVML Shared Library "
        "Not Found)"
    )

    gke_node.device_list_strategy = "driver-root"
    gke_node.start_plugin()
    gke_node.wait_capacity()
    fresh_namespace(cluster)
    manifests = [
        pod(
            "driver-root",
            NS,
            [container("a", 3, command=DRIVER_PROBE), container("b", 2, command=DRIVER_PROBE)],
        ),
        pod(
            "driver-root-two-gpus",
            NS,
            [container("main", 20, command=DRIVER_PROBE)],
            labels={"app": "real", "aliyun.com/gpu-count": "2"},
        ),
    ]
    create(cluster, manifests)
    items = wait_done(cluster, {m["metadata"]["name"] for m in manifests}, 180)
    checked, mismatches, seen = compare(items, gpu_uuids(cluster), "driver-root")
    print("after:", seen)
    assert not mismatches, mismatches
    assert checked == sum(len(gpu_containers(p)) for p in items) == 3
    for key, env in seen.items():
        assert env["PROBE_DRIVER_LIBS"] == "libnvidia-ml.so.1,", key
        assert env["PROBE_DRIVER_MOUNT"] == "ro", key
        assert env["PROBE_SHARED_NODES"] == "nvidiactl,nvidia-uvm,", key
        assert env["NVIDIA_VISIBLE_DEVICES"] == "void", key
    assert seen["driver-root-two-gpus/main"]["PROBE_DEVICES"] == "/dev/nvidia0,/dev/nvidia1"
    cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
