"""Scale: 1,000 kwok nodes x 8 GPUs and 5,000 GPU pods submitted at once.

A benchmark that prints numbers, not a timed assertion: the scheduling throughput of the
``ack-co-scheduler`` profile (through the extender) next to the default profile placing the same
number of plain pods on the same nodes, in the same run. The assertions are about correctness:
every pod that fits is bound, and no GPU is over-committed.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from gpushare.core.inventory import Mode

from .cluster import Cluster
from .conftest import eventually, labelled_kwok_nodes
from .helpers import gpu_pod_manifest, per_gpu_memory

NODES = int(os.environ.get("GPUSHARE_E2E_SCALE_NODES", "1000"))
PODS = int(os.environ.get("GPUSHARE_E2E_SCALE_PODS", "5000"))
SIZES = [1, 1, 2, 2, 3, 4, 4, 6, 8, 12]


def create_in_parallel(cluster: Cluster, manifests: list[dict[str, Any]], workers: int = 4) -> None:
    chunks = [manifests[i::workers] for i in range(workers)]

    def create(chunk: list[dict[str, Any]]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": chunk})
        cluster.kubectl("create", "-f", "-", input=body, timeout=900)

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, chunks))


def count_unbound(cluster: Cluster, namespace: str) -> int:
    out = cluster.kubectl(
        "get",
        "pods",
        "-n",
        namespace,
        "--field-selector",
        "spec.nodeName=",
        "-o",
        "name",
        timeout=120,
    ).stdout
    return len(out.split())


def timed_placement(cluster: Cluster, namespace: str, manifests: list[dict[str, Any]]) -> float:
    cluster.kubectl("create", "namespace", namespace)
    start = time.monotonic()
    create_in_parallel(cluster, manifests)
    eventually(
        lambda: count_unbound(cluster, namespace) == 0, 900, f"all pods in {namespace} bound"
    )
    return time.monotonic() - start


def test_thousand_nodes_five_thousand_pods(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    rng = random.Random(2026)
    names = [f"scale-{i:04d}" for i in range(NODES)]
    nodes = labelled_kwok_nodes(names, "scale", gpus_units=[15] * 8, mode=Mode.CGPU)
    started = time.monotonic()
    create_in_parallel(cluster, nodes)

    def ready() -> bool:
        out = cluster.kubectl(
            "get",
            "nodes",
            "-l",
            "gpushare-e2e=scale",
            "-o",
            "jsonpath={range .items[*]}{.status.conditions[?(@.type=='Ready')].status}{'\\n'}{end}",
            timeout=120,
        ).stdout
        return out.split().count("True") == NODES

    eventually(ready, 600, f"{NODES} nodes Ready")
    nodes_up = time.monotonic() - started
    selector = {"gpushare-e2e": "scale"}
    gpu_pods = [
        gpu_pod_manifest(f"g{i:05d}", "e2e-scale-gpu", rng.choice(SIZES), selector=selector)
        for i in range(PODS)
    ]
    gpu_seconds = timed_placement(cluster, "e2e-scale-gpu", gpu_pods)

    plain = []
    for i in range(PODS):
        pod = gpu_pod_manifest(f"c{i:05d}", "e2e-scale-plain", 1, selector=selector)
        pod["spec"]["schedulerName"] = "default-scheduler"
        pod["spec"]["containers"][0]["resources"] = {}
        plain.append(pod)
    plain_seconds = timed_placement(cluster, "e2e-scale-plain", plain)

    out = subprocess.run(
        [str(cluster.binaries["kubectl"]), "get", "pods", "-n", "e2e-scale-gpu", "-o", "json"],
        env=cluster.env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    items = json.loads(out)["items"]
    held = per_gpu_memory(items)
    per_gpu_pods: dict[tuple[str, int], int] = {}
    for pod in items:
        record = json.loads(pod["metadata"]["annotations"]["gpushare.io/allocation"])
        for share in record["gpus"]:
            key = (record["node"], share["index"])
            per_gpu_pods[key] = per_gpu_pods.get(key, 0) + 1
    assert len(items) == PODS and all(p["spec"].get("nodeName") for p in items)
    assert max(held.values()) <= 15, "a GPU is over-committed"
    assert max(per_gpu_pods.values()) <= 20, "a GPU holds more pods than isolation allows"
    total = sum(held.values())
    gpus_used = len(held)
    result = {
        "nodes": NODES,
        "gpus": NODES * 8,
        "pods": PODS,
        "gpu_mem_units": total,
        "nodes_ready_seconds": round(nodes_up, 1),
        "ack_co_scheduler_seconds": round(gpu_seconds, 1),
        "ack_co_scheduler_pods_per_second": round(PODS / gpu_seconds, 1),
        "default_scheduler_seconds": round(plain_seconds, 1),
        "default_scheduler_pods_per_second": round(PODS / plain_seconds, 1),
        "ratio_ack_to_default": round(plain_seconds / gpu_seconds, 2),
        "gpus_touched": gpus_used,
        "mean_fill_of_touched_gpus": round(total / (gpus_used * 15), 3),
    }
    with capsys.disabled():
        print("\n[e2e scale] " + json.dumps(result), flush=True)
    out_dir = os.environ.get("GPUSHARE_E2E_OUT")
    if out_dir:
        with open(os.path.join(out_dir, "scale.json"), "w") as handle:
            json.dump(result, handle, indent=2)
    cluster.kubectl(
        "delete", "namespace", "e2e-scale-gpu", "e2e-scale-plain", "--wait=false", check=False
    )
    # Later tests count every GPU in the cluster, so wait until the scale nodes are gone.
    # (kubectl delete --wait watches each of the 1,000 objects and can hang; poll instead.)
    cluster.kubectl(
        "delete", "nodes", "-l", "gpushare-e2e=scale", "--wait=false", check=False, timeout=300
    )
    eventually(
        lambda: (
            not cluster.kubectl(
                "get", "nodes", "-l", "gpushare-e2e=scale", "-o", "name", timeout=120
            ).stdout.strip()
        ),
        300,
        "scale nodes deleted",
    )
