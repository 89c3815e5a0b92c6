"""ResourcePolicy on the real control plane: units fill in order, scale-in empties the last.

The apiserver serves the chart's CRD (its schema and CEL rule checked for real), the extender
lists and watches the policies through lightkube, kube-scheduler filters and binds through the
extender, and kube-controller-manager's ReplicaSet controller reads the deletion cost that bind
wrote when the Deployment scales down.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpushare.core.gating import ANN_DELETION_COST, ANN_POLICY, ANN_UNIT
from gpushare.core.resourcepolicy import GROUP, PLURAL
from gpushare.crds import REFUSED_MESSAGE, render_yaml, resource_policy_crd

from .cluster import Cluster
from .conftest import create_nodes, delete_nodes, eventually, labelled_kwok_nodes

NS = "e2e-rp"
CRD = f"{PLURAL}.{GROUP}"
POOL_A = ["rp-a-0"]
POOL_B = ["rp-b-0", "rp-b-1"]


def _policy(name: str, units: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "ResourcePolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"app": "rp"}, "units": units},
    }


def _deployment(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "rp", "namespace": NS},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "rp"}},
            "template": {
                "metadata": {"labels": {"app": "rp"}},
                "spec": {
                    "schedulerName": "ack-co-scheduler",
                    "nodeSelector": {"gpushare-e2e": "rp"},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": "busybox",
                            "resources": {"limits": {"aliyun.com/gpu-mem": 3}},
                        }
                    ],
                },
            },
        },
    }


def _apply(cluster: Cluster, obj: dict[str, Any], *, check: bool = True) -> Any:
    return cluster.kubectl("apply", "-f", "-", input=json.dumps(obj), check=check)


def _live_pods(cluster: Cluster) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", NS, "-l", "app=rp")[
        "items"
    ]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _placed(cluster: Cluster, count: int) -> list[dict[str, Any]]:
    """The live pods once exactly ``count`` exist and all are bound, else []."""
    items = _live_pods(cluster)
    if len(items) == count and all(p["spec"].get("nodeName") for p in items):
        return items
    return []


def _by_node(items: list[dict[str, Any]]) -> dict[str, list[str]]:
    nodes: dict[str, list[str]] = {}
    for pod in items:
        nodes.setdefault(pod["spec"]["nodeName"], []).append(pod["metadata"]["name"])
    return nodes


def _names(items: list[dict[str, Any]]) -> set[str]:
    return {p["metadata"]["name"] for p in items}


def _annotations(pod: dict[str, Any]) -> dict[str, str]:
    return dict(pod["metadata"].get("annotations") or {})


def _all_ready(cluster: Cluster, count: int) -> list[dict[str, Any]]:
    items = _placed(cluster, count)
    ready = [
        p
        for p in items
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p.get("status", {}).get("conditions", [])
        )
    ]
    return items if len(ready) == count else []


@pytest.fixture(scope="module")
def policy_crd(cluster: Cluster) -> Iterator[None]:
    """The chart's CRD, Established, with the extender restarted so that it lists policies
    at once (without the CRD at start-up it looks again only every 30 s)."""
    cluster.kubectl("apply", "-f", "-", input=render_yaml(resource_policy_crd()))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    cluster.start_extender()
    try:
        yield
    finally:
        cluster.kubectl("delete", "crd", CRD, "--wait=false", check=False)


def test_the_apiserver_refuses_an_eci_unit_with_the_crds_message(
    cluster: Cluster, policy_crd: None
) -> None:
    cluster.kubectl("create", "namespace", f"{NS}-eci")
    try:
        policy = _policy("overflow", [{"nodeSelector": {"pool": "a"}}, {"resource": "eci"}])
        policy["metadata"]["namespace"] = f"{NS}-eci"
        result = _apply(cluster, policy, check=False)
        print(result.stderr)
        assert result.returncode != 0
        assert "spec.units[1].resource" in result.stderr
        assert REFUSED_MESSAGE in result.stderr
        listed = cluster.kubectl_json("get", "resourcepolicies", "-n", f"{NS}-eci")
        assert listed["items"] == []
    finally:
        cluster.kubectl("delete", "namespace", f"{NS}-eci", "--wait=false", check=False)


def test_units_fill_in_order_and_scale_in_empties_the_last(
    cluster: Cluster, policy_crd: None
) -> None:
    # Pool b's nodes hold one 3 GiB pod each, so its pods are spread one per node while pool
    # a's share a node. Without the deletion cost, the ReplicaSet controller would remove pool
    # a's pods first (pods doubled up on a node go before lone ones); with it, pool b's go.
    nodes = labelled_kwok_nodes(POOL_A, "rp", gpus_units=[15, 15], mode="share")
    nodes += labelled_kwok_nodes(POOL_B, "rp", gpus_units=[3], mode="share")
    for node in nodes:
        pool = "a" if node["metadata"]["name"] in POOL_A else "b"
        node["metadata"]["labels"]["pool"] = pool
    create_nodes(cluster, nodes)
    cluster.kubectl("create", "namespace", NS)
    started = time.monotonic()
    try:
        policy = _policy(
            "rp",
            [
                {
                    "nodeSelector": {"pool": "a"},
                    "max": 2,
                    "podLabels": {"rp-tier": "first"},
                    "podAnnotations": {"rp-note": "pool a"},
                },
                {
                    "resource": "ecs",
                    "nodeSelector": {"pool": "b"},
                    "podLabels": {"rp-tier": "second"},
                },
            ],
        )
        _apply(cluster, policy)
        stored = cluster.kubectl_json("get", "resourcepolicy", "-n", NS, "rp")
        assert stored["spec"]["units"][0]["resource"] == "ecs"  # the CRD's default

        # 1. four replicas: two in pool a (its max), the rest in pool b
        _apply(cluster, _deployment(4))
        items = eventually(lambda: _all_ready(cluster, 4), 120, "4 replicas bound and Ready")
        print("placed:", _by_node(items))
        in_a = [p for p in items if p["spec"]["nodeName"] in POOL_A]
        in_b = [p for p in items if p["spec"]["nodeName"] in POOL_B]
        assert len(in_a) == 2 and len(in_b) == 2
        assert {p["spec"]["nodeName"] for p in in_b} == set(POOL_B)
        for pod in in_a:
            notes = _annotations(pod)
            assert notes[ANN_POLICY] == "rp"
            assert notes[ANN_UNIT] == "1"
            assert notes[ANN_DELETION_COST] == "0"
            assert notes["rp-note"] == "pool a"
            assert pod["metadata"]["labels"]["rp-tier"] == "first"
        for pod in in_b:
            notes = _annotations(pod)
            assert notes[ANN_UNIT] == "2"
            assert notes[ANN_DELETION_COST] == "-1"
            assert "rp-note" not in notes
            assert pod["metadata"]["labels"]["rp-tier"] == "second"

        # 2. scale in: the ReplicaSet controller removes the pool-b pods first
        cluster.kubectl("scale", "deployment", "rp", "-n", NS, "--replicas=2")
        kept = eventually(lambda: _placed(cluster, 2), 60, "scale-in to 2")
        print("after scale-in:", _by_node(kept))
        assert _names(kept) == _names(in_a)

        # 3. raise unit 1's max while its pods run: the next replica goes to pool a, the one
        # after to pool b again
        cluster.kubectl(
            "patch",
            "resourcepolicy",
            "rp",
            "-n",
            NS,
            "--type=json",
            "-p",
            json.dumps([{"op": "replace", "path": "/spec/units/0/max", "value": 3}]),
        )
        time.sleep(2)  # the extender's watch takes the change in well under a second
        cluster.kubectl("scale", "deployment", "rp", "-n", NS, "--replicas=3")
        three = eventually(lambda: _placed(cluster, 3), 60, "a third replica bound")
        (third,) = [p for p in three if p["metadata"]["name"] not in _names(kept)]
        print("third replica:", third["metadata"]["name"], "on", third["spec"]["nodeName"])
        assert third["spec"]["nodeName"] in POOL_A
        assert _annotations(third)[ANN_UNIT] == "1"
        cluster.kubectl("scale", "deployment", "rp", "-n", NS, "--replicas=4")
        four = eventually(lambda: _placed(cluster, 4), 60, "a fourth replica bound")
        (fourth,) = [p for p in four if p["metadata"]["name"] not in _names(three)]
        print("fourth replica:", fourth["metadata"]["name"], "on", fourth["spec"]["nodeName"])
        assert fourth["spec"]["nodeName"] in POOL_B
        assert _annotations(fourth)[ANN_DELETION_COST] == "-1"

        # 4. without the CRD (its policies go with it) the extender orders nothing any more
        cluster.kubectl("delete", "crd", CRD, "--timeout=60s")
        time.sleep(2)
        cluster.kubectl("scale", "deployment", "rp", "-n", NS, "--replicas=5")
        five = eventually(lambda: _placed(cluster, 5), 60, "a fifth replica bound")
        (fifth,) = [p for p in five if p["metadata"]["name"] not in _names(four)]
        print("fifth replica:", fifth["metadata"]["name"], "on", fifth["spec"]["nodeName"])
        assert ANN_UNIT not in _annotations(fifth)
        assert ANN_DELETION_COST not in _annotations(fifth)
        print(f"[e2e] resource policy scenario took {time.monotonic() - started:.1f}s")
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        delete_nodes(cluster, POOL_A + POOL_B)
