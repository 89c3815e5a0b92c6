"""A randomized stress on the real node: hundreds of pods of mixed shapes, created and deleted
concurrently, admitted by the real kubelet in whatever order it takes them.

Every container that ran is compared with its pod's ``gpushare.io/allocation``; the test prints
the number of containers checked, the mismatches (the goal is 0) and the pods left Pending with
why. ``GPUSHARE_STRESS_PODS`` sets the number of pods (default 500).
"""

from __future__ import annotations

import json
import os
import random
import time
from typing import Any

import pytest

from harness.cluster import Cluster
from harness.realnode import RealNode, container, pod
from tests.support.realnode import NS, compare, fresh_namespace, gpu_uuids, ns_pods, reasons

TOTAL = int(os.environ.get("GPUSHARE_STRESS_PODS", "500"))
WAVE = 30
IN_FLIGHT = 70


def random_pod(rng: random.Random, index: int) -> dict[str, Any]:
    """One pod of a random shape: 1-8 units, sometimes two containers, an init container or
    two GPUs; each container runs for a random moment after probing."""
    pause = f"sleep {rng.choice(['0', '0.5', '1', '2', '3'])}"
    shape = rng.random()
    labels = {"app": "stress"}
    init = None
    if shape < 0.15:
        containers = [
            container("a", rng.randint(1, 4), command=pause),
            container("b", rng.randint(1, 4), command=pause),
        ]
    elif shape < 0.25:
        labels["aliyun.com/gpu-count"] = "2"
        containers = [container("main", 2 * rng.randint(1, 4), command=pause)]
    elif shape < 0.35:
        containers = [container("main", rng.randint(1, 4), command=pause)]
        init = [container("setup", rng.randint(1, 6))]
    else:
        containers = [container("main", rng.randint(1, 8), command=pause)]
    manifest = pod(f"st-{index:04d}", NS, containers, labels=labels, init=init)
    manifest["spec"]["hostNetwork"] = True  # no CNI set-up per pod: the kubelet's pace is the
    return manifest  # device plugin's and the runtime's, not the bridge plugin's


def create(cluster: Cluster, manifests: list[dict[str, Any]]) -> None:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": manifests})
    cluster.kubectl("create", "-f", "-", input=body, timeout=300)


def test_randomized_stress_on_the_real_node(
    real_node: RealNode, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = real_node.cluster
    real_node.set_mode("share", unit="1GiB", fake_gpus="8x32GiB")
    fresh_namespace(cluster)
    rng = random.Random(int(os.environ.get("GPUSHARE_STRESS_SEED", "13")))
    uuids = gpu_uuids(cluster)
    created = checked = 0
    mismatches: list[str] = []
    done: set[str] = set()
    deleted_early: set[str] = set()
    started = time.monotonic()
    deadline = started + 900
    last_report = 0.0
    try:
        while time.monotonic() < deadline:
            items = ns_pods(cluster)
            live = [p for p in items if p["metadata"]["name"] not in done | deleted_early]
            finished = [p for p in live if p["status"].get("phase") in ("Succeeded", "Failed")]
            failed = [p for p in finished if p["status"]["phase"] == "Failed"]
            for p in failed:
                mismatches.append(f"{p['metadata']['name']} Failed: {reasons(p)}")
            n, wrong, _ = compare(
                [p for p in finished if p not in failed], uuids, real_node.device_list_strategy
            )
            checked += n
            mismatches.extend(wrong)
            names = [p["metadata"]["name"] for p in finished]
            done.update(names)
            # some pods are deleted while they wait or run, at random
            unfinished = [p for p in live if p not in finished]
            victims = [p["metadata"]["name"] for p in unfinished if rng.random() < 0.03]
            deleted_early.update(victims)
            if names or victims:
                cluster.kubectl(
                    "delete", "pods", "-n", NS, *names, *victims, "--wait=false", check=False
                )
            in_flight = len(unfinished) - len(victims)
            if created < TOTAL and in_flight < IN_FLIGHT:
                wave = [random_pod(rng, created + i) for i in range(min(WAVE, TOTAL - created))]
                create(cluster, wave)
                created += len(wave)
            elif created >= TOTAL and in_flight == 0:
                break
            if time.monotonic() - last_report > 15:
                last_report = time.monotonic()
                print(
                    f"[stress] {time.monotonic() - started:.0f}s: created {created}/{TOTAL}, "
                    f"finished {len(done)}, deleted early {len(deleted_early)}, in flight "
                    f"{in_flight}, containers checked {checked}, mismatches {len(mismatches)}",
                    flush=True,
                )
            time.sleep(1)
        pending = [
            f"{p['metadata']['name']}: {p['status'].get('phase')} {reasons(p)}"
            for p in ns_pods(cluster)
            if p["metadata"]["name"] not in done | deleted_early
        ]
        elapsed = time.monotonic() - started
        with capsys.disabled():
            print(
                f"\n[stress] {created} pods in {elapsed:.0f}s: {len(done)} finished, "
                f"{len(deleted_early)} deleted early; {checked} containers checked, "
                f"{len(mismatches)} mismatches; {len(pending)} left Pending",
                flush=True,
            )
            for line in mismatches[:20] + pending[:20]:
                print(f"[stress]   {line}", flush=True)
        assert created == TOTAL
        assert not mismatches, mismatches[:20]
        assert not pending, pending[:20]
        assert checked >= len(done)
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=true", timeout=300, check=False)
        real_node.set_mode("share", unit="1GiB", fake_gpus="4x15GiB")
