"""A burst of GPU pods on the real node while its device plugin is killed and started again.

kubelet marks every device of a plugin unhealthy the moment its ListAndWatch stream ends
(``PluginDisconnected`` in pkg/kubelet/cm/devicemanager/manager.go) and refuses to admit a pod
that asks for the resource until a plugin registers again (``devicesToAllocate``: "no healthy
devices present"). Such a pod ends ``Failed`` with ``UnexpectedAdmissionError`` and nobody
re-creates a bare one. The test prints how long the plugin was away (kill to registration, read
from the plugin's log) and how many pods failed; the goal is 0.
``GPUSHARE_RESTART_BURST_PODS`` sets the burst (default 150).
"""

from __future__ import annotations

import os
import random
import threading
import time
from typing import Any

import pytest

from harness.realnode import RealNode, container, pod
from tests.support.realnode import NS, compare, create, gpu_uuids, ns_pods, reasons

FAILED_GRACE_S = 15.0
BURST = int(os.environ.get("GPUSHARE_RESTART_BURST_PODS", "150"))


def burst_pod(rng: random.Random, index: int) -> dict[str, Any]:
    """A short pod of 1-4 GiB, on the host network (no CNI set-up: the pace is kubelet's)."""
    manifest = pod(f"burst-{index:03d}", NS, [container("main", rng.randint(1, 4), command="true")])
    manifest["spec"]["hostNetwork"] = True
    return manifest


def test_a_burst_while_the_device_plugin_is_killed_fails_no_pod(
    real_node: RealNode, ns: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = real_node.cluster
    real_node.set_mode("share", unit="1GiB", fake_gpus="8x32GiB")
    try:
        uuids = gpu_uuids(cluster)
        rng = random.Random(41)
        manifests = [burst_pod(rng, i) for i in range(BURST)]
        first, rest = manifests[: BURST // 3], manifests[BURST // 3 :]
        create(cluster, first)

        def bound() -> int:
            return sum(bool(p["spec"].get("nodeName")) for p in ns_pods(cluster))

        deadline = time.monotonic() + 120
        while bound() < 10 and time.monotonic() < deadline:
            time.sleep(0.2)
        # the rest of the burst arrives while the plugin is down and right after it is back
        more = threading.Thread(target=create, args=(cluster, rest))
        more.start()
        gap = real_node.restart_plugin_timed(9)
        more.join()
        names = {m["metadata"]["name"] for m in manifests}

        failed_since: dict[str, float] = {}

        def finished() -> list[dict[str, Any]] | None:
            """Every pod Succeeded, or Failed for FAILED_GRACE_S under the same UID (the
            extender re-creates a bare pod kubelet refused, under its name)."""
            items = [p for p in ns_pods(cluster) if p["metadata"]["name"] in names]
            if len(items) < len(names):
                return None
            now = time.monotonic()
            for p in items:
                phase = p["status"].get("phase")
                if phase == "Failed":
                    since = failed_since.setdefault(p["metadata"]["uid"], now)
                    if now - since < FAILED_GRACE_S:
                        return None
                elif phase != "Succeeded":
                    return None
            return items

        deadline = time.monotonic() + 420
        items = None
        while items is None and time.monotonic() < deadline:
            items = finished()
            time.sleep(2)
        left = items or ns_pods(cluster)
        recreated = [
            e
            for e in cluster.kubectl_json("get", "events", "-n", NS)["items"]
            if e.get("reason") == "Recreated"
        ]
        failed = [p for p in left if p["status"].get("phase") == "Failed"]
        stuck = [p for p in left if p["status"].get("phase") not in ("Succeeded", "Failed")]
        checked, mismatches, _ = compare(
            [p for p in left if p["status"].get("phase") == "Succeeded"],
            uuids,
            real_node.device_list_strategy,
        )
        with capsys.disabled():
            print(
                f"\n[restart burst] {BURST} pods, plugin away {gap:.2f}s (kill -9 to "
                f"registration): {len(failed)} Failed, {len(recreated)} re-created by the "
                f"extender after kubelet refused them, {len(stuck)} not finished, "
                f"{checked} containers checked, {len(mismatches)} mismatches",
                flush=True,
            )
            for p in (failed + stuck)[:10]:
                print(f"[restart burst]   {p['metadata']['name']}: {reasons(p)}", flush=True)
        assert not failed, [f"{p['metadata']['name']}: {reasons(p)}" for p in failed[:10]]
        assert not stuck and not mismatches, mismatches[:10]
        assert checked == BURST
    finally:
        cluster.kubectl("delete", "pods", "-n", NS, "--all", "--wait=false", check=False)
        real_node.delete_pods()
        real_node.set_mode("share", unit="1GiB", fake_gpus="4x15GiB")
