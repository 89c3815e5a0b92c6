"""Operations on the real control plane: a GPU out of service, and choosing a model by label.

kwok nodes stand in for GPU nodes. The model labels are written by the device plugin's own
``publish`` (fake NVML backend) through the API server, as it does on a real node.
"""

from __future__ import annotations

import asyncio
import json

from gpushare.core.model.gpumodel import LABEL_MODEL
from gpushare.core.model.names import ANN_NODE_GPUS_DISABLED
from gpushare.deviceplugin.config import PluginConfig
from gpushare.kube.lightkube_api import LightkubeAPI
from gpushare.node.gpus import FakeGpus, GpuInfo
from gpushare.node.publishing import publish
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest, pods
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

NS = "e2e-ops"
NS_MODEL = "e2e-ops-model"


def gpus_of(cluster: Cluster, name: str) -> list[int]:
    record = cluster.kubectl_json("get", "pod", "-n", NS, name)["metadata"]["annotations"]
    return [share["index"] for share in json.loads(record["gpushare.io/allocation"])["gpus"]]


def bound(cluster: Cluster, name: str, namespace: str = NS) -> str:
    return str(
        cluster.kubectl_json("get", "pod", "-n", namespace, name)["spec"].get("nodeName") or ""
    )


def test_gpu_out_of_service_is_avoided_and_used_again_once_removed(cluster: Cluster) -> None:
    node = "ops-off-0"
    create_nodes(cluster, labelled_kwok_nodes([node], "ops-off", gpus_units=[15, 15]))
    cluster.create_namespace(NS)
    selector = {"gpushare-e2e": "ops-off"}
    try:
        cluster.kubectl("annotate", "node", node, f"{ANN_NODE_GPUS_DISABLED}=0")
        # binpack would put both on GPU0; with GPU0 out of service both go to GPU1
        apply_all(cluster, [gpu_pod_manifest(f"a{i}", NS, 3, selector=selector) for i in (0, 1)])
        for name in ("a0", "a1"):
            eventually(lambda name=name: bound(cluster, name), 60, f"{name} bound")  # type: ignore[misc]
            assert gpus_of(cluster, name) == [1]
        # a pod only GPU0 could hold waits, and says why
        apply_all(cluster, [gpu_pod_manifest("big", NS, 13, selector=selector)])

        def refused() -> str:
            out = cluster.kubectl("describe", "pod", "-n", NS, "big").stdout
            return out if "FailedScheduling" in out else ""

        described = eventually(refused, 60, "FailedScheduling for the big pod")
        assert f"GPU0: out of service ({ANN_NODE_GPUS_DISABLED} on the node)" in described
        shown = cluster.kubectl("inspect", "cgpu").stdout
        print(shown)
        [row] = [line for line in shown.splitlines() if line.startswith(node)]
        assert row.split()[2:4] == ["0/15*", "6/15"]
        assert f"({ANN_NODE_GPUS_DISABLED}): {node} GPU0." in shown
        doc = json.loads(cluster.kubectl("inspect", "cgpu", "-o", "json").stdout)
        [mine] = [n for n in doc["nodes"] if n["name"] == node]
        assert [g["outOfService"] for g in mine["gpus"]] == [True, False]
        cluster.kubectl("annotate", "node", node, f"{ANN_NODE_GPUS_DISABLED}-")
        eventually(lambda: bound(cluster, "big"), 90, "big bound once GPU0 is back")
        assert gpus_of(cluster, "big") == [0]
        # the pods placed while GPU0 was out kept their share on GPU1 throughout
        assert all(gpus_of(cluster, n) == [1] for n in ("a0", "a1"))
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, [node])


async def _publish(cluster: Cluster, node: str, model: str) -> None:
    api = LightkubeAPI.connect(str(cluster.kubeconfig))
    gpus = FakeGpus([GpuInfo(i, f"GPU-{node}-{i}", model, 15360) for i in range(2)])
    try:
        await publish(api, gpus, PluginConfig(node=node))
    finally:
        await api.close()


def test_node_selector_on_the_published_model_label(cluster: Cluster) -> None:
    names = ["ops-t4", "ops-a10"]
    create_nodes(cluster, labelled_kwok_nodes(names, "ops-model", gpus_units=[15, 15]))
    cluster.create_namespace(NS_MODEL)
    try:
        asyncio.run(_publish(cluster, "ops-t4", "Tesla T4"))
        asyncio.run(_publish(cluster, "ops-a10", "NVIDIA A10"))
        labels = cluster.kubectl_json("get", "node", "ops-a10")["metadata"]["labels"]
        assert labels[LABEL_MODEL] == "NVIDIA-A10"
        pods_wanted = {"want-a10": "NVIDIA-A10", "want-t4": "Tesla-T4"}
        apply_all(
            cluster,
            [
                gpu_pod_manifest(
                    name, NS_MODEL, 3, selector={"gpushare-e2e": "ops-model", LABEL_MODEL: model}
                )
                for name, model in pods_wanted.items()
            ],
        )
        for name, where in (("want-a10", "ops-a10"), ("want-t4", "ops-t4")):
            eventually(lambda name=name: bound(cluster, name, NS_MODEL), 60, f"{name} bound")  # type: ignore[misc]
            assert bound(cluster, name, NS_MODEL) == where
        print({p["metadata"]["name"]: p["spec"].get("nodeName") for p in pods(cluster, NS_MODEL)})
    finally:
        cluster.kubectl("delete", "namespace", NS_MODEL, "--wait=false", check=False)
        delete_nodes(cluster, names)
