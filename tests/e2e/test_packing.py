"""Packing on the real control plane: 20 pods fill 4 GPUs, the 21st waits with a reason."""

from __future__ import annotations

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest, per_gpu_memory, pods
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

NS = "e2e-pack"


def test_twenty_pods_fill_four_gpus_and_the_21st_waits(cluster: Cluster) -> None:
    names = ["pack-0", "pack-1"]
    create_nodes(cluster, labelled_kwok_nodes(names, "pack", gpus_units=[15, 15], mode=Mode.CGPU))
    cluster.create_namespace(NS)
    try:
        selector = {"gpushare-e2e": "pack"}
        apply_all(
            cluster, [gpu_pod_manifest(f"p{i:02d}", NS, 3, selector=selector) for i in range(20)]
        )

        def all_bound() -> list[dict]:  # type: ignore[type-arg]
            items = pods(cluster, NS)
            return items if sum(bool(p["spec"].get("nodeName")) for p in items) == 20 else []

        items = eventually(all_bound, 120, "20 pods bound")
        held = per_gpu_memory(items)
        print("memory per GPU:", held)
        assert sorted(held) == [(n, i) for n in names for i in (0, 1)]
        assert all(v == 15 for v in held.values())

        apply_all(cluster, [gpu_pod_manifest("p20", NS, 3, selector=selector)])

        def refused() -> str:
            out = cluster.kubectl("describe", "pod", "-n", NS, "p20").stdout
            return out if "FailedScheduling" in out else ""

        described = eventually(refused, 60, "FailedScheduling for the 21st pod")
        print(described)
        # gpu-mem is ignored by kube-scheduler's NodeResourcesFit (schedconfig), so the
        # extender judges the full nodes and its reason, per GPU, is the one described
        assert "GPU0: 0/15 GiB free < 3 GiB requested" in described
        assert "Insufficient aliyun.com/gpu-mem" not in described
        assert not cluster.kubectl_json("get", "pod", "-n", NS, "p20")["spec"].get("nodeName")

        victim = items[0]["metadata"]["name"]
        cluster.kubectl("delete", "pod", "-n", NS, victim)
        landed = eventually(
            lambda: cluster.kubectl_json("get", "pod", "-n", NS, "p20")["spec"].get("nodeName"),
            90,
            "the 21st pod to land after a delete",
        )
        print("p20 landed on", landed)
        after = per_gpu_memory(pods(cluster, NS))
        assert all(v <= 15 for v in after.values())
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, names)
