"""A hostile tenant's values on the real control plane: the extender keeps watching, answers
every call, and reads quantities as kube-apiserver writes them.

- Finding 4: one pod annotated ``ALIYUN_COM_GPU_MEM_ASSUME_TIME: "²"`` (any pod, GPU or not)
  ended the extender's pod watch: it stayed ready while it never saw another deletion or node.
  Here a node created after that pod must still be used, and ``/readyz`` must stay true.
- Finding 5: bind's ``PodName`` went into the API path unescaped (``../../../nodes/N`` made the
  extender read a Node); wrong JSON types in ``spec.affinity`` got 500s.
- Finding 7: ``aliyun.com/gpu-mem: 1000`` is stored by kube-apiserver as ``"1k"`` and was refused.

No webhook runs in this control plane, as in a cluster where it is down or skipped: the
extender must defend itself.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

NS = "e2e-hostile"
LABEL = "hostile"


def _post(cluster: Cluster, verb: str, body: Any) -> tuple[int, Any]:
    request = urllib.request.Request(
        f"{cluster.extender_url}/{verb}",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def _ready(cluster: Cluster) -> int:
    try:
        with urllib.request.urlopen(f"{cluster.extender_url}/readyz", timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code


def _node_of(cluster: Cluster, name: str) -> str:
    pod = cluster.kubectl_json("get", "pod", name, "-n", NS)
    return str(pod["spec"].get("nodeName") or "")


def test_hostile_values_neither_blind_nor_break_the_extender(cluster: Cluster) -> None:
    cluster.create_namespace(NS, check=False)
    first = labelled_kwok_nodes([f"{LABEL}-0"], LABEL, gpus_units=[15])
    create_nodes(cluster, first)
    later = f"{LABEL}-later"
    big = f"{LABEL}-big"
    try:
        # Finding 4: a plain pod with the annotation, then a node the extender must still see.
        hostile: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "annotated",
                "namespace": NS,
                "annotations": {"ALIYUN_COM_GPU_MEM_ASSUME_TIME": "²"},
            },
            "spec": {
                "nodeSelector": {"gpushare-e2e": "nowhere"},
                "containers": [{"name": "main", "image": "busybox"}],
            },
        }
        apply_all(cluster, [hostile])
        create_nodes(cluster, labelled_kwok_nodes([later], f"{LABEL}-later", gpus_units=[15]))
        apply_all(
            cluster,
            [gpu_pod_manifest("after", NS, 3, selector={"gpushare-e2e": f"{LABEL}-later"})],
        )
        eventually(lambda: _node_of(cluster, "after") == later, 60, "the pod on the later node")
        assert _ready(cluster) == 200

        # Finding 5: names that would leave the API path, wrong types in the pod.
        for name in (f"../../../nodes/{later}", "x?dryRun=All", "x/status"):
            status, reply = _post(
                cluster,
                "bind",
                {"PodName": name, "PodNamespace": NS, "PodUID": "u", "Node": later},
            )
            assert status == 400, reply
            assert "DNS-1123" in reply["detail"][0]["msg"]
        pod = gpu_pod_manifest("typed", NS, 1, selector={})
        pod["spec"]["affinity"] = {"nodeAffinity": []}
        status, reply = _post(cluster, "filter", {"Pod": pod, "NodeNames": [later]})
        assert status == 400 and "Pod.spec.affinity.nodeAffinity" in reply["detail"][0]["msg"]

        # Finding 7: 1000 units, which kube-apiserver stores as "1k".
        create_nodes(cluster, labelled_kwok_nodes([big], f"{LABEL}-big", gpus_units=[1024]))
        apply_all(
            cluster,
            [gpu_pod_manifest("thousand", NS, 1000, selector={"gpushare-e2e": f"{LABEL}-big"})],
        )
        stored = cluster.kubectl_json("get", "pod", "thousand", "-n", NS)
        assert stored["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] == "1k"
        eventually(lambda: _node_of(cluster, "thousand") == big, 60, "the 1k pod bound")
        with urllib.request.urlopen(f"{cluster.extender_url}/inspect", timeout=5) as response:
            view = json.load(response)
        held = {
            node["name"]: sum(g["allocatedUnits"] for g in node["gpus"]) for node in view["nodes"]
        }
        assert held[big] == 1000
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, [n["metadata"]["name"] for n in first] + [later, big])
