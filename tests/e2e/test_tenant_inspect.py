"""``kubectl inspect cgpu`` as a tenant: a ServiceAccount that may only list its namespace's pods.

Its kubeconfig carries a token from ``kubectl create token`` and names the namespace in its
context, as a platform team hands one out; nothing else is granted, so nodes, other namespaces,
the seal Secret and the extender's Deployment are all forbidden to it.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest, pods
from harness.identities import tenant_kubeconfig
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually, kubectl_inspect

TENANT, NEIGHBOUR = "tenant-a", "tenant-b"
NODE = "tenant-view-0"


def as_tenant(cluster: Cluster, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return kubectl_inspect(cluster, *args, config=config)


def test_a_service_account_with_namespace_rights_sees_its_namespace(
    cluster: Cluster, tmp_path: Path
) -> None:
    create_nodes(
        cluster,
        labelled_kwok_nodes([NODE], "tenant", gpus_units=[15, 15], mode=Mode.SHARE),
    )
    for namespace in (TENANT, NEIGHBOUR):
        cluster.create_namespace(namespace)
    try:
        selector = {"gpushare-e2e": "tenant"}
        apply_all(cluster, [gpu_pod_manifest("train", TENANT, 3, selector=selector)])
        apply_all(cluster, [gpu_pod_manifest("neighbour", NEIGHBOUR, 4, selector=selector)])

        def bound() -> list[dict[str, Any]]:
            items = pods(cluster, TENANT) + pods(cluster, NEIGHBOUR)
            return items if all(p["spec"].get("nodeName") == NODE for p in items) else []

        eventually(bound, 90, "both pods bound")
        config = tenant_kubeconfig(
            cluster, TENANT, tmp_path / "tenant.kubeconfig", role="pod-reader", resources="pods"
        )

        table = as_tenant(cluster, config)
        assert table.returncode == 0
        # kwok leaves status.hostIP empty (a kubelet sets it), so the address is "-"
        assert table.stdout.startswith("NAME ") and f"\n{NODE}  - " in table.stdout
        assert "3/15" in table.stdout and "7/" not in table.stdout  # only its own 3 GiB
        assert "Note: pods outside namespace tenant-a: forbidden" in table.stdout
        assert "Note: nodes: forbidden" in table.stdout

        details = as_tenant(cluster, config, "-d")
        assert "train" in details.stdout and "neighbour" not in details.stdout

        data = json.loads(as_tenant(cluster, config, "-o", "json").stdout)
        assert data["scope"]["forbidden"] == ["nodes", "pods outside namespace tenant-a"]
        assert [p["name"] for n in data["nodes"] for p in n["pods"]] == ["train"]

        explain = as_tenant(cluster, config, "--explain", "train")
        assert explain.returncode == 1
        assert "needs every node and every pod" in explain.stderr

        admin = cluster.kubectl("inspect", "cgpu", "-n", TENANT, "-d").stdout
        print(admin)
        assert "train" in admin and "neighbour" not in admin
        assert "Allocated :  7 (23%)" in admin  # the neighbour's 4 GiB count on the node
    finally:
        for namespace in (TENANT, NEIGHBOUR):
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        delete_nodes(cluster, [NODE])
