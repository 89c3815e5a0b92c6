"""Kill the extender while pods are being placed: the ledger comes back, nothing double-books."""

from __future__ import annotations

import json
import time
import urllib.request

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.helpers import apply_all, gpu_pod_manifest, per_gpu_memory, pods
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

NS = "e2e-restart"


def test_extender_restart_loses_nothing(cluster: Cluster) -> None:
    names = ["restart-0", "restart-1"]
    create_nodes(
        cluster, labelled_kwok_nodes(names, "restart", gpus_units=[15, 15], mode=Mode.SHARE)
    )
    cluster.create_namespace(NS)
    selector = {"gpushare-e2e": "restart"}
    try:
        # 12 pods of 5 GiB fill the 4 GPUs exactly (3 per GPU); 2 more can never fit. The first
        # six are bound before the crash, so only their annotations tell the restarted extender
        # which GPUs they hold; the rest arrive while it dies and while it is down.
        first = [gpu_pod_manifest(f"a{i}", NS, 5, selector=selector) for i in range(6)]
        second = [gpu_pod_manifest(f"b{i}", NS, 5, selector=selector) for i in range(8)]
        apply_all(cluster, first)
        eventually(
            lambda: sum(bool(p["spec"].get("nodeName")) for p in pods(cluster, NS)) == 6,
            60,
            "the first six pods bound",
        )
        apply_all(cluster, second)
        cluster.kill_extender()
        killed_at = sum(bool(p["spec"].get("nodeName")) for p in pods(cluster, NS))
        print(f"extender killed with {killed_at} of 14 pods bound")
        time.sleep(3)
        cluster.start_extender()

        def twelve_bound() -> list[dict]:  # type: ignore[type-arg]
            items = pods(cluster, NS)
            return items if sum(bool(p["spec"].get("nodeName")) for p in items) == 12 else []

        items = eventually(twelve_bound, 180, "12 pods bound after the restart")
        held = per_gpu_memory(items)
        print("memory per GPU after restart:", held)
        assert all(v == 15 for v in held.values()) and len(held) == 4
        time.sleep(5)  # the two extra pods keep failing, never double-booking
        assert sum(bool(p["spec"].get("nodeName")) for p in pods(cluster, NS)) == 12
        with urllib.request.urlopen(f"{cluster.extender_url}/inspect", timeout=5) as response:
            ledger = json.load(response)
        from_extender = {
            (n["name"], g["index"]): g["allocatedUnits"]
            for n in ledger["nodes"]
            if n["name"] in names
            for g in n["gpus"]
        }
        assert from_extender == held
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, names)
