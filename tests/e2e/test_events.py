"""Pod Events on the real control plane: `kubectl describe pod` says where and why not."""

from __future__ import annotations

from .cluster import Cluster
from .conftest import create_nodes, delete_nodes, eventually, labelled_kwok_nodes
from .helpers import apply_all, gpu_pod_manifest

NS = "e2e-events"


def test_describe_shows_placement_and_refusal_reasons(cluster: Cluster) -> None:
    names = ["events-0"]
    create_nodes(cluster, labelled_kwok_nodes(names, "events", gpus_units=[15, 15], mode="share"))
    cluster.kubectl("create", "namespace", NS)
    try:
        selector = {"gpushare-e2e": "events"}
        # 16 GiB passes kube-scheduler's node total (30) but no single 15 GiB GPU
        apply_all(
            cluster,
            [
                gpu_pod_manifest("placed", NS, 3, selector=selector),
                gpu_pod_manifest("too-big", NS, 16, selector=selector),
            ],
        )

        def described(pod: str, reason: str) -> str:
            out = cluster.kubectl("describe", "pod", "-n", NS, pod).stdout
            return out if reason in out else ""

        placed = eventually(lambda: described("placed", "GPUShareScheduled"), 90, "placement")
        print(placed)
        assert "GPU0 on events-0, 3/15 GiB" in placed or "GPU1 on events-0, 3/15 GiB" in placed
        refused = eventually(lambda: described("too-big", "GPUShareUnschedulable"), 90, "refusal")
        print(refused)
        assert "0/1 nodes fit: 1 × GPU0: 15 GiB total < 16 GiB requested" in refused
        assert "gpushare-extender" in refused
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, names)
