"""ResourcePolicy on the real control plane: units fill in order, scale-in empties the last.

The apiserver serves the chart's CRD (its schema and CEL rule checked for real), the extender
lists and watches the policies through lightkube, kube-scheduler filters and binds through the
extender, and kube-controller-manager's ReplicaSet controller reads the deletion cost that bind
wrote when the Deployment scales down.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from gpushare.core.model.inventory import Mode
from gpushare.core.resourcepolicies.gating import ANN_DELETION_COST, ANN_POLICY, ANN_UNIT
from gpushare.core.resourcepolicies.resourcepolicy import GROUP, MAX_UNITS, PLURAL
from gpushare.crds import REFUSED_MESSAGE, render_yaml, resource_policy_crd
from harness.cluster import Cluster
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

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


def _deployment(replicas: int, *, ns: str = NS, nodes: str = "rp") -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "rp", "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "rp"}},
            "template": {
                "metadata": {"labels": {"app": "rp"}},
                "spec": {
                    "schedulerName": "ack-co-scheduler",
                    "nodeSelector": {"gpushare-e2e": nodes},
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


def _live_pods(cluster: Cluster, ns: str = NS) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = cluster.kubectl_json("get", "pods", "-n", ns, "-l", "app=rp")[
        "items"
    ]
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def _placed(cluster: Cluster, count: int, ns: str = NS) -> list[dict[str, Any]]:
    """The live pods once exactly ``count`` exist and all are bound, else []."""
    items = _live_pods(cluster, ns)
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


def _generation_read(cluster: Cluster, name: str, ns: str = NS) -> int | None:
    """The policy's metadata.generation as the extender last read it (its /metrics), or None
    when the extender holds no such policy."""
    with urllib.request.urlopen(f"{cluster.extender_url}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    pattern = (
        rf'^gpushare_resource_policy_generation\{{name="{re.escape(name)}",'
        rf'policy_namespace="{re.escape(ns)}",valid="true"\}} ([0-9.]+)$'
    )
    found = re.search(pattern, text, re.MULTILINE)
    return int(float(found.group(1))) if found else None


def _events(cluster: Cluster, ns: str, pod: str, reason: str) -> list[str]:
    listed = cluster.kubectl_json(
        "get",
        "events",
        "-n",
        ns,
        "--field-selector",
        f"involvedObject.name={pod},reason={reason}",
    )
    return [e["message"] for e in listed["items"]]


def _refusals(cluster: Cluster, ns: str, pod: str) -> list[str]:
    """Why the pod waits: kube-scheduler's FailedScheduling, which carries the extender's
    reasons, and gpushare's own Warning where that one could not hold them whole."""
    return [
        *_events(cluster, ns, pod, "FailedScheduling"),
        *_events(cluster, ns, pod, "GPUShareUnschedulable"),
    ]


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
    cluster.create_namespace(f"{NS}-eci")
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


def _units(count: int) -> list[dict[str, Any]]:
    """``count`` units, each a node pool no node is in."""
    return [{"nodeSelector": {"pool": f"none-{i}"}} for i in range(count)]


def test_the_apiserver_refuses_a_policy_over_the_unit_limit(
    cluster: Cluster, policy_crd: None
) -> None:
    ns = f"{NS}-limit"
    cluster.create_namespace(ns)
    try:
        policy = _policy("many", _units(MAX_UNITS + 1))
        policy["metadata"]["namespace"] = ns
        result = _apply(cluster, policy, check=False)
        print(result.stderr)
        assert result.returncode != 0
        assert "spec.units: Too many: 101: must have at most 100 items" in result.stderr
        assert cluster.kubectl_json("get", "resourcepolicies", "-n", ns)["items"] == []
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


def test_a_policy_at_the_unit_limit_does_not_hold_up_another_namespace(
    cluster: Cluster, policy_crd: None
) -> None:
    # Five pods under a policy of 100 units that hold no node are refused on every attempt,
    # with a reason that names three units and counts the rest; meanwhile a GPU pod of another
    # namespace, on the same nodes, binds as it would without them.
    crowded, other, names = f"{NS}-crowded", f"{NS}-other", ["rpl-0", "rpl-1"]
    create_nodes(cluster, labelled_kwok_nodes(names, "rpl", gpus_units=[15], mode=Mode.SHARE))
    cluster.create_namespace(crowded)
    cluster.create_namespace(other)
    try:
        policy = _policy("big", _units(MAX_UNITS))
        policy["metadata"]["namespace"] = crowded
        _apply(cluster, policy)
        eventually(lambda: _generation_read(cluster, "big", crowded) is not None, 30, "read")
        _apply(cluster, _deployment(5, ns=crowded, nodes="rpl"))
        (held, *_) = eventually(
            lambda: [p for p in _live_pods(cluster, crowded) if not p["spec"].get("nodeName")],
            30,
            "the crowded namespace's pods created",
        )
        name = held["metadata"]["name"]
        said = eventually(lambda: _refusals(cluster, crowded, name), 30, "refused")
        print(name, said[0])
        assert "and 97 more units, each full or with no node for this pod" in said[0]

        started = time.monotonic()
        _apply(cluster, _pod("elsewhere", other, "rpl"))
        (bound,) = eventually(lambda: _placed(cluster, 1, other), 30, "the other pod bound")
        print(f"[e2e] another namespace's pod bound in {time.monotonic() - started:.1f}s")
        assert bound["spec"]["nodeName"] in names
        assert ANN_UNIT not in _annotations(bound)
        assert not any(p["spec"].get("nodeName") for p in _live_pods(cluster, crowded))
    finally:
        cluster.kubectl("delete", "namespace", crowded, other, "--wait=false", check=False)
        delete_nodes(cluster, names)


def test_timeout_or_exceed_max_waits_for_unit_one_then_moves_on(
    cluster: Cluster, policy_crd: None
) -> None:
    # Pool a's one node holds one 3 GiB pod. Unit 1 has room by its max (3) but no node for a
    # second pod, so TimeoutOrExceedMax holds that pod there until it is 15 s old.
    ns, a, b = f"{NS}-timeout", ["rpt-a-0"], ["rpt-b-0"]
    nodes = labelled_kwok_nodes(a, "rpt", gpus_units=[3], mode=Mode.SHARE)
    nodes += labelled_kwok_nodes(b, "rpt", gpus_units=[15], mode=Mode.SHARE)
    for node in nodes:
        node["metadata"]["labels"]["pool"] = "a" if node["metadata"]["name"] in a else "b"
    create_nodes(cluster, nodes)
    cluster.create_namespace(ns)
    try:
        policy = _policy(
            "rp", [{"nodeSelector": {"pool": "a"}, "max": 3}, {"nodeSelector": {"pool": "b"}}]
        )
        policy["metadata"]["namespace"] = ns
        policy["spec"]["whenTryNextUnits"] = {"policy": "TimeoutOrExceedMax", "timeout": "15s"}
        _apply(cluster, policy)
        eventually(lambda: _generation_read(cluster, "rp", ns) is not None, 30, "policy read")

        _apply(cluster, _deployment(1, ns=ns, nodes="rpt"))
        (first,) = eventually(lambda: _placed(cluster, 1, ns), 60, "the first replica bound")
        assert first["spec"]["nodeName"] in a

        cluster.kubectl("scale", "deployment", "rp", "-n", ns, "--replicas=2")
        (second,) = eventually(
            lambda: [p for p in _live_pods(cluster, ns) if not p["spec"].get("nodeName")],
            30,
            "the second replica created",
        )
        name = second["metadata"]["name"]
        waiting = eventually(
            lambda: [
                m
                for m in _refusals(cluster, ns, name)
                if "left of whenTryNextUnits timeout 15s" in m
            ],
            30,
            "the second replica told it waits for unit 1",
        )
        print(name, waiting[0])
        assert (
            "waiting for unit 1 (nodeSelector pool=a) (1/3 pods, no node for this pod now)"
            in (waiting[0])
        )
        # still Pending, though pool b has room, until it is 15 s old (checked to 12 s)
        born = datetime.fromisoformat(
            second["metadata"]["creationTimestamp"].replace("Z", "+00:00")
        )
        while time.time() < born.timestamp() + 12:
            assert not _placed(cluster, 2, ns)
            time.sleep(1)

        def bound() -> list[dict[str, Any]]:
            # the timeout's end is no cluster event: kube-scheduler tries a pod the extender
            # refused again at the next change (or after 5 minutes), so the test makes one
            cluster.kubectl(
                "annotate", "pod", name, "-n", ns, "--overwrite", f"e2e/nudge={time.time()}"
            )
            return _placed(cluster, 2, ns)

        both = eventually(bound, 60, "the second replica bound after its timeout")
        (moved,) = [p for p in both if p["metadata"]["name"] == name]
        print(name, "on", moved["spec"]["nodeName"])
        assert moved["spec"]["nodeName"] in b
        assert _annotations(moved)[ANN_UNIT] == "2"
        said = eventually(
            lambda: _events(cluster, ns, name, "GPUSharePolicyUnit"), 30, "the unit event"
        )
        assert (
            f"ResourcePolicy {ns}/rp placed this pod in unit 2 (nodeSelector pool=b) on {b[0]}; it "
            f"moved on because unit 1 (nodeSelector pool=a) has 1 pods (max 3) and no node for "
            f"this pod now, and the pod is older than whenTryNextUnits timeout 15s" in said
        )
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        delete_nodes(cluster, a + b)


def _pod(name: str, ns: str, nodes: str, *, finalizer: str = "") -> dict[str, Any]:
    deployment = _deployment(1, ns=ns, nodes=nodes)
    template = deployment["spec"]["template"]
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": template["metadata"]["labels"]}
    if finalizer:
        meta["finalizers"] = [finalizer]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}


def test_lack_resource_and_no_terminating_waits_for_the_old_pod_to_go(
    cluster: Cluster, policy_crd: None
) -> None:
    # Pool a's node holds one pod. An old pod there is being deleted (a finalizer holds it):
    # LackResourceOrExceedMax would send the new pod to pool b at once; LackResourceAndNo-
    # Terminating keeps it for unit 1 until the old pod is gone, then places it there.
    ns, a, b = f"{NS}-terminating", ["rpn-a-0"], ["rpn-b-0"]
    hold = "e2e.gpushare.io/hold"
    nodes = labelled_kwok_nodes(a, "rpn", gpus_units=[3], mode=Mode.SHARE)
    nodes += labelled_kwok_nodes(b, "rpn", gpus_units=[15], mode=Mode.SHARE)
    for node in nodes:
        node["metadata"]["labels"]["pool"] = "a" if node["metadata"]["name"] in a else "b"
    create_nodes(cluster, nodes)
    cluster.create_namespace(ns)
    try:
        policy = _policy("rp", [{"nodeSelector": {"pool": "a"}}, {"nodeSelector": {"pool": "b"}}])
        policy["metadata"]["namespace"] = ns
        policy["spec"]["whenTryNextUnits"] = {"policy": "LackResourceAndNoTerminating"}
        _apply(cluster, policy)
        eventually(lambda: _generation_read(cluster, "rp", ns) is not None, 30, "policy read")

        _apply(cluster, _pod("old", ns, "rpn", finalizer=hold))
        (old,) = eventually(lambda: _placed(cluster, 1, ns), 60, "the old pod bound")
        assert old["spec"]["nodeName"] in a
        cluster.kubectl("delete", "pod", "old", "-n", ns, "--wait=false")
        _apply(cluster, _pod("new", ns, "rpn"))
        waiting = eventually(
            lambda: [
                m
                for m in _refusals(cluster, ns, "new")
                if "1 of the policy's pods there are terminating" in m
            ],
            30,
            "the new pod told it waits for the terminating one",
        )
        print("new:", waiting[0])
        time.sleep(3)  # pool b has room all along: the pod must still be Pending
        new = cluster.kubectl_json("get", "pod", "new", "-n", ns)
        assert not new["spec"].get("nodeName")

        cluster.kubectl(
            "patch", "pod", "old", "-n", ns, "--type=merge", "-p", '{"metadata":{"finalizers":[]}}'
        )
        (placed,) = eventually(lambda: _placed(cluster, 1, ns), 60, "the new pod bound")
        print("new on", placed["spec"]["nodeName"])
        assert placed["metadata"]["name"] == "new" and placed["spec"]["nodeName"] in a
        assert _annotations(placed)[ANN_UNIT] == "1"
    finally:
        cluster.kubectl(
            "patch",
            "pod",
            "old",
            "-n",
            ns,
            "--type=merge",
            "-p",
            '{"metadata":{"finalizers":[]}}',
            check=False,
        )
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        delete_nodes(cluster, a + b)


def test_units_fill_in_order_and_scale_in_empties_the_last(
    cluster: Cluster, policy_crd: None
) -> None:
    # Pool b's nodes hold one 3 GiB pod each, so its pods are spread one per node while pool
    # a's share a node. Without the deletion cost, the ReplicaSet controller would remove pool
    # a's pods first (pods doubled up on a node go before lone ones); with it, pool b's go.
    nodes = labelled_kwok_nodes(POOL_A, "rp", gpus_units=[15, 15], mode=Mode.SHARE)
    nodes += labelled_kwok_nodes(POOL_B, "rp", gpus_units=[3], mode=Mode.SHARE)
    for node in nodes:
        pool = "a" if node["metadata"]["name"] in POOL_A else "b"
        node["metadata"]["labels"]["pool"] = pool
    create_nodes(cluster, nodes)
    cluster.create_namespace(NS)
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
        # each pod is told which unit took it, and those in unit 2 why unit 1 did not
        for pod in in_b:
            name = pod["metadata"]["name"]
            said = eventually(
                lambda name=name: _events(cluster, NS, name, "GPUSharePolicyUnit"),
                30,
                f"the unit event on {name}",
            )
            print(name, said)
            assert (
                f"ResourcePolicy {NS}/rp placed this pod in unit 2 (nodeSelector pool=b) on "
                f"{pod['spec']['nodeName']}; it moved on because unit 1 (nodeSelector pool=a) "
                f"is full: 2/2 pods" in said
            )
        inspect = cluster.kubectl("inspect", "cgpu", "-d")
        print(inspect.stdout)
        for pod in items:
            unit = "rp(1)" if pod in in_a else "rp(2)"
            (row,) = [
                r for r in inspect.stdout.splitlines() if r.startswith(pod["metadata"]["name"])
            ]
            assert row.split()[-1] == unit

        # 2. scale in: the ReplicaSet controller removes the pool-b pods first
        cluster.kubectl("scale", "deployment", "rp", "-n", NS, "--replicas=2")
        kept = eventually(lambda: _placed(cluster, 2), 60, "scale-in to 2")
        print("after scale-in:", _by_node(kept))
        assert _names(kept) == _names(in_a)

        # 3. raise unit 1's max while its pods run: the next replica goes to pool a, the one
        # after to pool b again
        patched = cluster.kubectl(
            "patch",
            "resourcepolicy",
            "rp",
            "-n",
            NS,
            "--type=json",
            "-p",
            json.dumps([{"op": "replace", "path": "/spec/units/0/max", "value": 3}]),
            "-o",
            "json",
        )
        generation = json.loads(patched.stdout)["metadata"]["generation"]
        eventually(
            lambda: _generation_read(cluster, "rp") == generation,
            30,
            f"the extender to read generation {generation} of the policy",
        )
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
        eventually(
            lambda: _generation_read(cluster, "rp") is None, 30, "the extender to drop the policy"
        )
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
