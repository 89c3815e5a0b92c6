"""Scale: 1,000 kwok nodes x 8 GPUs and 5,000 GPU pods submitted at once.

A benchmark that prints numbers, not a timed assertion: the scheduling throughput of the
``ack-co-scheduler`` profile (through the extender) next to the default profile placing the same
number of plain pods on the same nodes, in the same run, both staged (``staged.py``: all pods
created while kube-scheduler is stopped, timed from the first bind to the last). The
assertions are about correctness: every pod that fits is bound, no GPU is over-committed, and
no bind finds its share taken by a pod scheduled before it (the intents of ``core.booking.ledger``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster
from harness.helpers import per_gpu_memory
from harness.seeding import labelled_kwok_nodes
from harness.staged import create_in_parallel, run_stage, stage_pods
from tests.support.e2e import eventually

NODES = int(os.environ.get("GPUSHARE_E2E_SCALE_NODES", "1000"))
PODS = int(os.environ.get("GPUSHARE_E2E_SCALE_PODS", "5000"))


def test_thousand_nodes_five_thousand_pods(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
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
    plain_pods, gpu_pods = stage_pods(
        PODS, 2026, selector, gpu_namespace="e2e-scale-gpu", plain_namespace="e2e-scale-plain"
    )

    def say(text: str) -> None:
        with capsys.disabled():
            print(text, flush=True)

    try:
        plain = run_stage(cluster, "plain", "e2e-scale-plain", plain_pods, gpu=False, progress=say)
        gpu = run_stage(cluster, "gpu", "e2e-scale-gpu", gpu_pods, gpu=True, progress=say)
    finally:
        if not cluster.processes["kube-scheduler"].alive():
            cluster.start_scheduler()

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
    assert gpu.binds.get("unfit", 0) == 0, f"binds found their share taken: {gpu.binds}"
    # the pods state no preference: filter answers with the top node alone and kube-scheduler
    # takes it without scoring or asking prioritize
    assert not gpu.routes_ms.get("prioritize"), f"prioritize was called: {gpu.routes_ms}"
    total = sum(held.values())
    gpus_used = len(held)
    result = {
        "nodes": NODES,
        "gpus": NODES * 8,
        "pods": PODS,
        "gpu_mem_units": total,
        "nodes_ready_seconds": round(nodes_up, 1),
        "method": "staged: pods created with kube-scheduler stopped, first bind to last",
        "ack_co_scheduler_pods_per_second": round(gpu.pods_per_second, 1),
        "default_scheduler_pods_per_second": round(plain.pods_per_second, 1),
        "ratio_ack_to_default": round(gpu.pods_per_second / plain.pods_per_second, 2),
        "gpu_binds": gpu.binds,
        "gpu_schedule_attempts": gpu.attempts,
        "extender_routes_ms": gpu.routes_ms,
        "cpu_share": {k: round(v, 2) for k, v in gpu.cpu_share.items()},
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
