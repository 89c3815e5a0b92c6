"""Pod Events on the real control plane: `kubectl describe pod` says where and why not."""

from __future__ import annotations

import time

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

NS = "e2e-events"


def test_describe_shows_placement_and_refusal_reasons(cluster: Cluster) -> None:
    names = ["events-0"]
    create_nodes(
        cluster, labelled_kwok_nodes(names, "events", gpus_units=[15, 15], mode=Mode.SHARE)
    )
    cluster.create_namespace(NS)
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
        # one Warning: kube-scheduler's FailedScheduling carries gpushare's reason whole, so
        # gpushare writes no GPUShareUnschedulable of its own
        refused = eventually(
            lambda: described("too-big", "GPU0: 15 GiB total < 16 GiB requested"), 90, "refusal"
        )
        print(refused)
        assert "FailedScheduling" in refused and "GPU1: 15 GiB total < 16 GiB requested" in refused
        time.sleep(3)  # the extender's event worker would have written its own by now
        again = cluster.kubectl("describe", "pod", "-n", NS, "too-big").stdout
        assert "GPUShareUnschedulable" not in again
        warnings = cluster.kubectl_json(
            "get",
            "events",
            "-n",
            NS,
            "--field-selector",
            "involvedObject.name=too-big,type=Warning",
        )["items"]
        assert {e["reason"] for e in warnings} == {"FailedScheduling"}

        # twelve node sizes, twelve distinct reasons: more than kube-scheduler's message holds
        # whole, so gpushare's counted summary is written beside it
        many = [f"events-{u}" for u in range(16, 40, 2)]
        create_nodes(
            cluster,
            [
                n
                for u in range(16, 40, 2)
                for n in labelled_kwok_nodes(
                    [f"events-{u}"], "events-many", gpus_units=[u, u], mode=Mode.SHARE
                )
            ],
        )
        names += many
        apply_all(
            cluster, [gpu_pod_manifest("giant", NS, 41, selector={"gpushare-e2e": "events-many"})]
        )
        # kube-scheduler may try the pod before its cache holds all twelve new nodes (it then
        # asks about fewer); the node's arrival requeues the pod, and the new count is a new
        # message, so a new event
        summary = eventually(
            lambda: described("giant", "0/12 nodes kube-scheduler asked gpushare about fit"),
            150,
            "summary over all twelve nodes",
        )
        print(summary)
        assert "GPUShareUnschedulable" in summary
        assert "FailedScheduling" in summary
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, names)


def _failed_scheduling(cluster: Cluster, pod: str) -> str:
    """The pod's FailedScheduling messages as ``kubectl describe pod`` prints them."""
    out = cluster.kubectl("describe", "pod", "-n", REASONS_NS, pod).stdout
    lines = [line for line in out.splitlines() if "FailedScheduling" in line]
    return "\n".join(lines)


REASONS_NS = "e2e-reasons"


def test_describe_shows_gpushares_reason_where_kube_scheduler_refused_before(
    cluster: Cluster,
) -> None:
    """A pod larger than the node's total, or one writing ``3Gi``, was refused by kube-scheduler's
    NodeResourcesFit ("Insufficient aliyun.com/gpu-mem") before the extender was asked; with the
    resources ignored by the scheduler (schedconfig.IGNORED_BY_SCHEDULER) the FailedScheduling
    event carries gpushare's sentence, and the counts beside it do not contradict each other."""
    names = ["reasons-0", "reasons-other"]
    nodes = labelled_kwok_nodes(names[:1], "reasons", gpus_units=[15, 15], mode=Mode.SHARE)
    nodes += labelled_kwok_nodes(names[1:], "reasons-other", gpus_units=[15], mode=Mode.SHARE)
    create_nodes(cluster, nodes)
    cluster.create_namespace(REASONS_NS)
    try:
        selector = {"gpushare-e2e": "reasons"}
        over_total = gpu_pod_manifest("over-total", REASONS_NS, 40, selector=selector)
        suffixed = gpu_pod_manifest("suffixed", REASONS_NS, 3, selector=selector)
        suffixed["spec"]["containers"][0]["resources"]["limits"]["aliyun.com/gpu-mem"] = "3Gi"
        apply_all(cluster, [over_total, suffixed])

        def refused(pod: str, text: str) -> str:
            lines = _failed_scheduling(cluster, pod)
            return lines if text in lines else ""

        big = eventually(
            lambda: refused("over-total", "GPU0: 15 GiB total < 40 GiB requested"),
            90,
            "gpushare's reason in over-total's FailedScheduling",
        )
        print(big)
        assert "GPU1: 15 GiB total < 40 GiB requested" in big
        assert "Insufficient aliyun.com/gpu-mem" not in big
        # kube-scheduler counts every node, its own plugins' reasons beside gpushare's; with
        # gpushare's reason whole in it, the extender writes no second Warning
        assert "nodes are available" in big and "didn't match Pod's node affinity/selector" in big
        described = cluster.kubectl("describe", "pod", "-n", REASONS_NS, "over-total").stdout
        assert "GPUShareUnschedulable" not in described

        bytes_written = eventually(
            lambda: refused("suffixed", "'3Gi' has a unit suffix (Gi, x2^30)"),
            90,
            "gpushare's reason in suffixed's FailedScheduling",
        )
        print(bytes_written)
        assert "for 3 GiB write 3" in bytes_written
        assert "Insufficient aliyun.com/gpu-mem" not in bytes_written
    finally:
        cluster.kubectl("delete", "namespace", REASONS_NS, "--wait=false", check=False)
        delete_nodes(cluster, names)
