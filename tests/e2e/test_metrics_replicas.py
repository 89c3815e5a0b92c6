"""Two extenders on the real control plane: the dashboard's totals are the cluster's GPU memory.

The chart runs two scheduler replicas, each an extender beside a kube-scheduler; only the
leading kube-scheduler calls its extender, and the standby's extender keeps its cache warm. Here
the cluster's extender (called by kube-scheduler) is the leader's and a second ``gpushare
extender`` process, which nobody calls, is the standby's. Both /metrics are scraped into one
sample set with their own ``instance``, as Prometheus would, and the dashboard's own panel
expressions are evaluated on it by Prometheus's own engine (tests/support/promqlengine.py), with the
node variable picking this test's kwok nodes. Then the leader's extender goes away, as at a
hand-over, and the standby's numbers alone must still add up.
"""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path
from typing import Any

from gpushare.core.model.inventory import Mode
from harness.cluster import Cluster, free_port, wait_for
from harness.helpers import apply_all, gpu_pod_manifest, pods
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually
from tests.support.promql import labelled, merge, scrape
from tests.support.promqlengine import Vector, evaluate

NS = "e2e-metrics"
GIB = 2**30
NODES = {"obs-0": [15, 15], "obs-1": [24, 24, 24, 24], "obs-2": [16]}
"""GiB per GPU of this test's nodes: the cluster's GPU memory the dashboard must add up to."""
PODS = {"m-a": 3, "m-b": 10, "m-c": 20, "m-d": 4, "m-e": 15}
DASHBOARD = Path(__file__).parents[2] / "charts" / "gpushare" / "dashboards" / "gpushare.json"
TARGET = {"namespace": "gpushare-system", "job": "gpushare"}
PICKED = {"namespace": ".*", "node": "obs-.*"}
"""The variables as Grafana fills them: every namespace, and a regex for this test's nodes."""


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as reply:
        return str(reply.read().decode())


def panels() -> dict[str, dict[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return {p["title"]: {t["refId"]: t["expr"] for t in p["targets"]} for p in dashboard["panels"]}


def total(expr: str, samples: Vector) -> float:
    value = evaluate(expr, samples, PICKED)
    assert isinstance(value, dict) and len(value) == 1, value
    return next(iter(value.values()))


def check_totals(samples: Vector, allocated: float) -> None:
    memory = panels()["GPU memory, allocated and total"]
    cluster_memory = sum(sum(units) for units in NODES.values()) * GIB
    assert total(memory["B"], samples) == cluster_memory
    assert total(memory["A"], samples) == allocated
    table = panels()["Per node"]
    per_node = labelled(evaluate(table["B"], samples, PICKED), "node")
    assert per_node == {(n,): sum(u) * GIB for n, u in NODES.items()}
    shares = labelled(evaluate(table["C"], samples, PICKED), "node")
    assert sum(shares.values()) == len(PODS)


def test_two_extenders_add_up_to_the_clusters_gpu_memory_once(cluster: Cluster) -> None:
    names = list(NODES)
    create_nodes(
        cluster,
        [
            node
            for name, units in NODES.items()
            for node in labelled_kwok_nodes([name], "metrics", gpus_units=units, mode=Mode.SHARE)
        ],
    )
    cluster.create_namespace(NS)
    port, metrics_port = free_port(), free_port()
    standby = cluster._spawn(
        "gpushare-extender-standby",
        [
            str(Path(sys.executable).parent / "gpushare"),
            "extender",
            "--kubeconfig",
            str(cluster.kubeconfig),
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            # plain HTTP: this test adds up series; test_metrics_access checks who may read them
            "--no-metrics-authorization",
            "--seal-key-file",
            str(cluster.seal_key),
            "--log-level",
            "warning",
        ],
    )
    try:
        wait_for(
            "standby extender /readyz",
            lambda: get(f"http://127.0.0.1:{port}/readyz") == "ok",
            60,
            standby,
        )
        selector = {"gpushare-e2e": "metrics"}
        apply_all(cluster, [gpu_pod_manifest(n, NS, m, selector=selector) for n, m in PODS.items()])
        eventually(
            lambda: (
                all(p["spec"].get("nodeName") for p in pods(cluster, NS))
                and len(pods(cluster, NS)) == len(PODS)
            ),
            120,
            "every pod bound",
        )
        allocated = float(sum(PODS.values()) * GIB)
        urls = [f"{cluster.extender_url}/metrics", f"http://127.0.0.1:{metrics_port}/metrics"]

        def scraped() -> list[Vector]:
            return [
                scrape(get(url), {**TARGET, "instance": f"replica-{i}"})
                for i, url in enumerate(urls)
            ]

        def agree() -> list[Vector] | None:
            replicas = scraped()
            memory = panels()["GPU memory, allocated and total"]["A"]
            held = [total(memory, r) for r in replicas]
            return replicas if held == [allocated, allocated] else None

        replicas = eventually(agree, 60, "both extenders counting every bound pod")
        samples = merge(*replicas)
        assert (
            total('sum(gpushare_gpu_memory_bytes{node=~"obs-.*"})', samples)
            == 2 * sum(sum(u) for u in NODES.values()) * GIB
        )  # each replica reports every GPU: a plain sum counts them twice
        check_totals(samples, allocated)
        for replica in replicas:
            assert not [k for k in replica if dict(k)["__name__"].endswith("_created")]
            info: list[dict[str, Any]] = [
                dict(k) for k in replica if dict(k)["__name__"] == "gpushare_build_info"
            ]
            assert [i["component"] for i in info] == ["extender"]

        # the leader's extender goes away (a hand-over): the standby's view alone adds up
        cluster.kill_extender()
        check_totals(scrape(get(urls[1]), {**TARGET, "instance": "replica-1"}), allocated)
    finally:
        standby.stop()
        if not cluster.processes["gpushare-extender"].alive():
            cluster.start_extender()
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, names)
