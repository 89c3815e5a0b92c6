"""Planning ahead on the real control plane: kube-scheduler takes the nominated node.

The extender runs with ``--plan-ahead``; a burst of GPU pods is staged (created while
kube-scheduler is stopped, ``staged.py``). Once kube-scheduler starts filtering, the extender
plans pods ahead of it and writes ``status.nominatedNodeName``; a ``kubectl get --watch``
records each pod's nominations and its node. kube-scheduler v1.36.3 tries a nominated node
first and alone (``evaluateNominatedNode``), and the binding clears the nomination.
"""

from __future__ import annotations

import subprocess
import threading
from collections import defaultdict

from gpushare.core.inventory import Mode

from .cluster import Cluster
from .conftest import labelled_kwok_nodes
from .helpers import per_gpu_memory, pods
from .staged import create_in_parallel, run_stage, stage_pods

NAMESPACE = "e2e-planning"
NODES = 20
PODS = 240


def watch_nominations(cluster: Cluster) -> tuple[subprocess.Popen[str], list[str]]:
    """Every pod change in the namespace as ``name nominated node`` lines, as they come."""
    template = "{.metadata.name} {.status.nominatedNodeName} {.spec.nodeName}{'\\n'}"
    process = subprocess.Popen(
        [
            str(cluster.binaries["kubectl"]),
            "get",
            "pods",
            "-n",
            NAMESPACE,
            "--watch",
            "-o",
            f"jsonpath={template}",
        ],
        env=cluster.env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines: list[str] = []

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    return process, lines


def test_planned_pods_are_bound_to_the_node_they_were_nominated_to(cluster: Cluster) -> None:
    names = [f"plan-{i:02d}" for i in range(NODES)]
    create_in_parallel(
        cluster, labelled_kwok_nodes(names, "planning", gpus_units=[15] * 8, mode=Mode.CGPU)
    )
    cluster.extender_args = ["--plan-ahead", "32"]
    cluster.start_extender()
    _, gpu_pods = stage_pods(
        PODS, 7, {"gpushare-e2e": "planning"}, gpu_namespace=NAMESPACE, plain_namespace="unused"
    )
    watcher, lines = watch_nominations(cluster)
    try:
        stage = run_stage(cluster, "planning", NAMESPACE, gpu_pods, gpu=True, timeout=300)
    finally:
        watcher.terminate()
        watcher.wait(timeout=10)
        cluster.extender_args = []
        cluster.start_extender()
    print(f"[e2e planning] {stage.as_dict()}")
    nominated: dict[str, set[str]] = defaultdict(set)
    for line in lines:
        fields = line.rstrip("\n").split(" ")
        if len(fields) == 3 and fields[1]:  # name, nomination, node (empty until bound)
            nominated[fields[0]].add(fields[1])
    items = pods(cluster, NAMESPACE)
    placed = {p["metadata"]["name"]: p["spec"].get("nodeName", "") for p in items}
    assert stage.bound == PODS and all(placed.values())
    assert stage.retries == 0
    assert max(per_gpu_memory(items).values()) <= 15
    planned = stage.plans.get("nominated", 0)
    assert planned >= PODS // 2, stage.plans
    # each planned pod has one nomination, and lands there (nothing else took its booking)
    seen = {name: nodes for name, nodes in nominated.items() if nodes}
    assert len(seen) >= planned - 1  # the watch may miss a pod bound at once after its plan
    took = sum(1 for name, nodes in seen.items() if nodes == {placed[name]})
    assert took >= 0.95 * len(seen), {n: (v, placed[n]) for n, v in seen.items()}
    cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false")
