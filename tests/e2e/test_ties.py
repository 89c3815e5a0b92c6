"""Packing survives kube-scheduler's choice among equals: equal GPU scores do not spread the pods.

kube-scheduler adds the extender's 0..10 score (times weight) to its plugins' scores and picks at
random among the best totals. In the ``ack-co-scheduler`` profile no generic score differs
between these nodes (``schedconfig.packing_profile``), so if many nodes shared the extender's top
score, the random pick alone would scatter GPU pods over empty nodes (and in the default profile
LeastAllocated would push them there). The extender gives its top score to one node only, so
they stay packed.
"""

from __future__ import annotations

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest, per_gpu_memory, pods
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

NS = "e2e-ties"


def test_twelve_thirds_fill_four_gpus_of_six_empty_nodes(cluster: Cluster) -> None:
    names = [f"tie-{i}" for i in range(6)]
    create_nodes(cluster, labelled_kwok_nodes(names, "ties", gpus_units=[15, 15], mode=Mode.CGPU))
    cluster.create_namespace(NS)
    try:
        selector = {"gpushare-e2e": "ties"}
        manifests = []
        for i in range(12):
            pod = gpu_pod_manifest(f"t{i:02d}", NS, 5, selector=selector)
            # a CPU request: under LeastAllocated (default profile) empty nodes would win
            pod["spec"]["containers"][0]["resources"]["requests"] = {"cpu": "2", "memory": "4Gi"}
            manifests.append(pod)
        apply_all(cluster, manifests)

        def all_bound() -> list[dict]:  # type: ignore[type-arg]
            items = pods(cluster, NS)
            return items if sum(bool(p["spec"].get("nodeName")) for p in items) == 12 else []

        held = per_gpu_memory(eventually(all_bound, 120, "12 pods bound"))
        print("memory per GPU:", dict(held))
        assert sorted(held.values()) == [15, 15, 15, 15]
        assert len({node for node, _ in held}) == 2
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, names)
