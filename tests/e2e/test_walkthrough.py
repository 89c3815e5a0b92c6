"""The seed walkthrough and the computing-power example, literally, on the real control plane."""

from __future__ import annotations

import json
from typing import Any

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.seeding import kwok_node
from tests.support.e2e import REPO, create_nodes, delete_nodes, eventually

SEED = "cn-zhangjiakou.192.168.66.139"
CORE = "cn-zhangjiakou.192.168.66.140"


def pods_of(cluster: Cluster, selector: str, namespace: str = "default") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "pods", "-n", namespace, "-l", selector
    )["items"]
    return items


def bound(cluster: Cluster, selector: str) -> dict[str, Any] | None:
    pods = [p for p in pods_of(cluster, selector) if p["spec"].get("nodeName")]
    return pods[0] if pods else None


def events_for(cluster: Cluster, pod: str, namespace: str = "default") -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json(
        "get", "events", "-n", namespace, "--field-selector", f"involvedObject.name={pod}"
    )["items"]
    return items


def test_seed_walkthrough(cluster: Cluster) -> None:
    create_nodes(cluster, [kwok_node(SEED, ip="192.168.66.139", gpus_units=[15])])
    try:
        before = cluster.kubectl("inspect", "cgpu").stdout
        print(before)
        assert f"{SEED}  192.168.66.139  0/15" in before and "0/15 (0%)" in before

        cluster.kubectl("apply", "-f", str(REPO / "examples" / "GPUtest.yaml"))
        pod = eventually(lambda: bound(cluster, "job-name=gpu-share-sample"), 60, "pod bound")
        name = pod["metadata"]["name"]
        annotations = pod["metadata"]["annotations"]
        assert pod["spec"]["nodeName"] == SEED
        assert pod["spec"]["schedulerName"] == "ack-co-scheduler"
        assert annotations["ALIYUN_COM_GPU_MEM_IDX"] == "0"
        assert annotations["ALIYUN_COM_GPU_MEM_POD"] == "3"
        assert annotations["ALIYUN_COM_GPU_MEM_DEV"] == "15"
        assert json.loads(annotations["gpushare.io/allocation"])["gpus"] == [
            {"index": 0, "mem": 3, "core": 0}
        ]
        scheduled = eventually(
            lambda: [e for e in events_for(cluster, name) if e["reason"] == "Scheduled"],
            30,
            "Scheduled event",
        )
        assert scheduled[0].get("reportingComponent") == "ack-co-scheduler"

        after = cluster.kubectl("inspect", "cgpu").stdout
        print(after)
        assert f"{SEED}  192.168.66.139  3/15" in after
        assert after.splitlines()[-1] == "3/15 (20%)"

        cluster.kubectl("delete", "job", "gpu-share-sample")
        eventually(lambda: not pods_of(cluster, "job-name=gpu-share-sample"), 60, "pods gone")
        released = eventually(
            lambda: (
                (out := cluster.kubectl("inspect", "cgpu").stdout).endswith("0/15 (0%)\n") and out
            ),
            30,
            "allocation released",
        )
        print(released)
    finally:
        cluster.kubectl("delete", "job", "gpu-share-sample", "--ignore-not-found", check=False)
        delete_nodes(cluster, [SEED])


def test_computing_power_example(cluster: Cluster) -> None:
    create_nodes(
        cluster,
        [
            kwok_node(
                CORE,
                ip="192.168.66.140",
                gpus_units=[15] * 4,
                mode=Mode.CORE_MEM,
                placement="binpack",
            )
        ],
    )
    try:
        status = cluster.kubectl_json("get", "node", CORE)["status"]
        for key in ("capacity", "allocatable"):
            assert status[key]["aliyun.com/gpu-core.percentage"] == "400"
            assert status[key]["aliyun.com/gpu-count"] == "4"
            assert status[key]["aliyun.com/gpu-mem"] == "60"

        cluster.kubectl("apply", "-f", str(REPO / "examples" / "cuda-sample.yaml"))
        pod = eventually(lambda: bound(cluster, "job-name=cuda-sample"), 60, "cuda-sample bound")
        record = json.loads(pod["metadata"]["annotations"]["gpushare.io/allocation"])
        assert pod["spec"]["nodeName"] == CORE
        assert record["gpus"] == [{"index": 0, "mem": 2, "core": 30}]
        details = cluster.kubectl("inspect", "cgpu", "-d").stdout
        print(details)
        assert "Core :       30/400% (7%)" in details

        memory_only = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "memory-only", "namespace": "default"},
            "spec": {
                "schedulerName": "ack-co-scheduler",
                "nodeSelector": {"kubernetes.io/hostname": CORE},
                "containers": [
                    {
                        "name": "main",
                        "image": "busybox",
                        "resources": {"limits": {"aliyun.com/gpu-mem": 2}},
                    }
                ],
            },
        }
        cluster.kubectl("apply", "-f", "-", input=json.dumps(memory_only))

        def refused() -> str:
            out = cluster.kubectl("describe", "pod", "memory-only").stdout
            return out if "FailedScheduling" in out else ""

        described = eventually(refused, 60, "FailedScheduling event")
        print(described)
        assert "node is core_mem and takes only pods that also ask for computing power" in described
        pod_now = cluster.kubectl_json("get", "pod", "memory-only")
        assert not pod_now["spec"].get("nodeName")
    finally:
        cluster.kubectl("delete", "pod", "memory-only", "--ignore-not-found", check=False)
        cluster.kubectl("delete", "job", "cuda-sample", "--ignore-not-found", check=False)
        delete_nodes(cluster, [CORE])
