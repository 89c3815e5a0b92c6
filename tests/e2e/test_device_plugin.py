"""The device plugin on the real control plane, with a fake kubelet on temporary sockets.

The plugin runs as its own process (``gpushare device-plugin --fake-gpus``), reads and writes
the node and pods through the real kube-apiserver, registers with the fake kubelet, and serves
pods that kube-scheduler placed through the extender. kubelet admits them in a random order;
every container must get exactly the GPUs its pod was placed on.
"""

from __future__ import annotations

import asyncio
import json
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from tests import grpc_loop
from tests.integration.fake_kubelet import FakeKubelet

from .cluster import Cluster, Process
from .conftest import create_nodes, delete_nodes

NODE = "dp-node"
NS = "e2e-dp"
MEM = "aliyun.com/gpu-mem"


def node_manifest() -> dict[str, Any]:
    resources = {MEM: "30", "cpu": "32", "memory": "128Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": NODE,
            "labels": {"ack.node.gpu.schedule": "share", "kubernetes.io/hostname": NODE},
            "annotations": {"kwok.x-k8s.io/node": "fake"},
        },
        "status": {"capacity": dict(resources), "allocatable": dict(resources)},
    }


def pod_manifest(name: str, size: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "schedulerName": "ack-co-scheduler",
            "nodeSelector": {"kubernetes.io/hostname": NODE},
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {MEM: size}}}
            ],
        },
    }


def test_device_plugin_serves_pods_placed_through_the_real_scheduler(cluster: Cluster) -> None:
    create_nodes(cluster, [node_manifest()])
    cluster.kubectl("create", "namespace", NS)
    root = Path(tempfile.mkdtemp(prefix="gs-e2e-", dir="/tmp"))
    plugin = Process(
        "gpushare-device-plugin",
        [
            str(Path(sys.executable).parent / "gpushare"),
            "device-plugin",
            "--node-name",
            NODE,
            "--fake-gpus",
            "2x15GiB",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--device-plugin-dir",
            str(root / "dp"),
            "--pod-resources-socket",
            str(root / "podres.sock"),
            "--state-dir",
            str(root / "state"),
            "--kubelet-config",
            str(root / "none"),
            "--cpu-manager-state",
            str(root / "none"),
        ],
        cluster.root / "logs" / "device-plugin.log",
    )
    try:
        result = grpc_loop.run(asyncio.wait_for(scenario(cluster, plugin, root), 240))
        print(f"[e2e device plugin] {json.dumps(result)}")
        assert result["mismatches"] == 0 and result["admitted"] == 8
    finally:
        plugin.stop()
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, [NODE])
        shutil.rmtree(root, ignore_errors=True)


async def kubectl_json(cluster: Cluster, *args: str) -> Any:
    return await asyncio.to_thread(cluster.kubectl_json, *args)


async def scenario(cluster: Cluster, plugin: Process, root: Path) -> dict[str, Any]:
    kubelet = FakeKubelet(root / "dp", root / "podres.sock")
    await kubelet.start()
    plugin.start()
    try:
        for _ in range(200):
            if MEM in kubelet.registrations and len(kubelet.devices.get(MEM, {})) == 30:
                break
            await asyncio.sleep(0.1)
        assert MEM in kubelet.registrations, plugin.tail()
        for _ in range(100):
            node = await kubectl_json(cluster, "get", "node", NODE)
            if node["metadata"].get("annotations", {}).get("gpushare.io/handoff"):
                break
            await asyncio.sleep(0.2)
        annotations = node["metadata"]["annotations"]
        assert json.loads(annotations["gpushare.io/gpus"])[1]["memUnits"] == 15
        assert node["status"]["capacity"]["aliyun.com/gpu-count"] == "2"

        sizes = [3, 3, 2, 2, 3, 2, 3, 2]
        body = json.dumps(
            {
                "apiVersion": "v1",
                "kind": "List",
                "items": [pod_manifest(f"p{i}", s) for i, s in enumerate(sizes)],
            }
        )
        await asyncio.to_thread(cluster.kubectl, "create", "-f", "-", input=body)
        rng = random.Random(11)
        admitted: set[str] = set()
        mismatches = checked = 0
        for _ in range(400):
            pods = (await kubectl_json(cluster, "get", "pods", "-n", NS))["items"]
            ready = [
                p
                for p in pods
                if p["spec"].get("nodeName") and p["metadata"]["name"] not in admitted
            ]
            if not ready and len(admitted) == len(sizes):
                break
            rng.shuffle(ready)
            for pod in ready[: rng.randint(1, max(1, len(ready)))]:
                done = await kubelet.admit(pod)
                admitted.add(pod["metadata"]["name"])
                record = json.loads(pod["metadata"]["annotations"]["gpushare.io/allocation"])
                layout = ",".join(
                    f"{g['index']}:{g['mem']}" for g in record["containers"][0]["gpus"]
                )
                checked += 1
                mismatches += done.envs["main"]["GPUSHARE_MEM_PER_GPU"] != layout
            await asyncio.sleep(0.3)
        served = 0
        for _ in range(100):
            pods = (await kubectl_json(cluster, "get", "pods", "-n", NS))["items"]
            served = sum(
                p["metadata"]["annotations"].get("ALIYUN_COM_GPU_MEM_ASSIGNED") == "true"
                for p in pods
            )
            if served == len(sizes):
                break
            await asyncio.sleep(0.2)
        assert served == len(sizes), plugin.tail()
        return {
            "admitted": len(admitted),
            "checked": checked,
            "mismatches": mismatches,
            "served": served,
        }
    finally:
        await kubelet.stop()
