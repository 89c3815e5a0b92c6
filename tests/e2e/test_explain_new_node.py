"""``kubectl inspect cgpu --explain`` on the real API server names the placeholder that asks an
autoscaler for a new node for a pod no GPU holds (docs/autoscaling.md).

The extender's ``--placeholder-namespace`` is read from its Deployment (kept at 0 replicas: only
its flags matter here), the placeholder is written as the extender writes it
(``core.autoscaling.placeholders.manifest``), and the pod it stands for asks 20 GiB of a node
whose GPUs have 15 GiB each: kube-scheduler's node-level filter passes it (30 GiB in all) and
gpushare refuses it on every GPU, the trap of ../shared/docs/AUTOSCALERS.md 1d.
"""

from __future__ import annotations

import json
from typing import Any

from gpushare.core.autoscaling.placeholders import PlaceholderSettings, manifest
from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest, pods
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

TEAM, RELEASE = "team-newnode", "gpushare-newnode"
NODE = "explain-newnode-0"
PLACEHOLDER = "gpushare-placeholder-e2e000000001"


def extender_deployment() -> dict[str, Any]:
    """The chart's scheduler Deployment as far as ``--explain`` reads it."""
    container = {
        "name": "extender",
        "image": "registry.k8s.io/pause:3.10",
        "args": ["extender", f"--placeholder-namespace={RELEASE}"],
    }
    labels = {"app": "gpushare-scheduler"}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpushare-scheduler", "namespace": RELEASE},
        "spec": {
            "replicas": 0,
            "selector": {"matchLabels": labels},
            "template": {"metadata": {"labels": labels}, "spec": {"containers": [container]}},
        },
    }


def explain(cluster: Cluster) -> str:
    out = cluster.kubectl(
        "inspect", "cgpu", "--explain", f"{TEAM}/big", "--extender-namespace", RELEASE
    )
    print(out.stdout + out.stderr)
    assert "Traceback" not in out.stderr
    return str(out.stdout)


def test_explain_names_the_placeholder_asking_for_a_new_node(cluster: Cluster) -> None:
    create_nodes(
        cluster, labelled_kwok_nodes([NODE], "newnode", gpus_units=[15, 15], mode=Mode.SHARE)
    )
    for namespace in (TEAM, RELEASE):
        cluster.create_namespace(namespace)
    try:
        selector = {"gpushare-e2e": "newnode"}
        apply_all(cluster, [gpu_pod_manifest("big", TEAM, 20, selector=selector)])
        apply_all(cluster, [extender_deployment()])
        big = eventually(lambda: pods(cluster, TEAM), 30, "the pod listed")[0]
        assert not big["spec"].get("nodeName")

        before = explain(cluster)
        assert "NEW NODE: no placeholder stands for it yet" in before
        assert f"keeps them in namespace {RELEASE}" in before

        body = manifest(
            big,
            name=PLACEHOLDER,
            covers=[big["metadata"]["uid"], "another-tenants-uid"],
            keys=[f"{TEAM}/big", "tenant-z/secret-job"],
            gpus=1,
            gpu_mib=15360,
            node_names=[NODE],
            settings=PlaceholderSettings(namespace=RELEASE),
        )
        cluster.kubectl("create", "-f", "-", input=json.dumps(body))
        after = explain(cluster)
        assert (
            f"NEW NODE: waits for a new node: placeholder {PLACEHOLDER} asks the autoscaler "
            f"for one (1 GPU(s) of 15 GiB)" in after
        )
        assert "secret-job" not in after and "tenant-z" not in after
    finally:
        for namespace in (TEAM, RELEASE):
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        delete_nodes(cluster, [NODE])
