"""The device plugin on the real node with the chart's identity: its own RBAC and policies.

The chart granted the plugin ``list`` and ``patch`` on pods but not ``watch``; its pod watch was
refused (403) at every start, no pod was ever marked served, and the hand-off rule then held
any pod of a size still unserved on another GPU: 16 pods of 5 GiB filled GPU 0 and the 17th
waited for ever with 7 GPUs empty. The e2e tests ran the plugin as admin, which hid it. Here it
runs as the chart runs it (harness.identities: a token of the chart's ServiceAccount bound to
the node, the chart's ClusterRole and ValidatingAdmissionPolicies), on 8 fake 80 GiB GPUs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from gpushare.core.model.names import ANN_ASSIGNED
from harness.cluster import Cluster
from harness.identities import DEVICE_PLUGIN_SA, NAMESPACE
from harness.realnode import RealNode, container, pod
from tests.support.e2e import eventually, hold_real_node

NS = "e2e-identity"
PODS, MEM_GIB = 17, 5


@pytest.fixture(scope="module")
def node(cluster: Cluster) -> Iterator[RealNode]:
    yield from hold_real_node(cluster, fake_gpus="8x80GiB")


def test_17_pods_of_5_gib_all_run_and_are_marked_served_under_the_charts_identity(
    node: RealNode,
) -> None:
    cluster = node.cluster
    who = json.loads(
        cluster.kubectl(
            "auth", "whoami", "-o", "json", f"--kubeconfig={node.plugin_kubeconfig()}"
        ).stdout
    )["status"]["userInfo"]
    assert who["username"] == f"system:serviceaccount:{NAMESPACE}:{DEVICE_PLUGIN_SA}"
    assert who["extra"]["authentication.kubernetes.io/node-name"] == [node.name]

    cluster.create_namespace(NS, check=False)
    started = time.monotonic()
    try:
        body = {
            "apiVersion": "v1",
            "kind": "List",
            "items": [
                pod(f"p{i:02d}", NS, [container("main", MEM_GIB, command="sleep 3600")])
                for i in range(PODS)
            ],
        }
        cluster.kubectl("create", "-f", "-", input=json.dumps(body))

        def phases() -> dict[str, int]:
            items = cluster.kubectl_json("get", "pods", "-n", NS)["items"]
            counted: dict[str, int] = {}
            for item in items:
                phase = item["status"].get("phase", "?")
                counted[phase] = counted.get(phase, 0) + 1
            return counted

        try:
            eventually(lambda: phases().get("Running") == PODS, 180, f"{PODS} pods Running")
        finally:
            print(
                f"[e2e] {PODS} x {MEM_GIB} GiB on 8 x 80 GiB, chart identity: {phases()} "
                f"after {time.monotonic() - started:.1f}s",
                flush=True,
            )

        def served() -> list[str]:
            items = cluster.kubectl_json("get", "pods", "-n", NS)["items"]
            return [
                i["metadata"]["name"]
                for i in items
                if (i["metadata"].get("annotations") or {}).get(ANN_ASSIGNED) == "true"
            ]

        eventually(lambda: len(served()) == PODS, 60, "every pod marked served")
        log = (cluster.root / "logs" / "gpushare-device-plugin.log").read_text()
        assert "phase=watch-refused" not in log
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        node.delete_pods()
