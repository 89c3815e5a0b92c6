"""DRA mode's allocator on the real control plane: gpushare places gated pods' claims.

kube-apiserver, kube-scheduler and kube-controller-manager v1.36.3 (DRA with consumable
capacity on by default), kwok nodes labelled for DRA mode with the slices their driver would
publish (``build_slice``), and ``gpushare extender --dra-allocator`` under the chart's identity
and RBAC (``dra.allocator.enabled``). The pods are written as the webhook converts them
(docs/dra.md): a ResourceClaimTemplate, the claim in the pod, the gate. gpushare allocates
the claim (its status names gpushare's shareIDs, the node selector and the pod), removes the
gate, kube-scheduler binds the pod where the claim says, kwok runs it; deleting the pod frees the
share; a pod that fits nowhere keeps its gate and is told why (``DRANoFit``). A
ResourcePolicy (the chart's CRD, served for real) orders DRA pods as it orders the extender's:
its first unit's node until its ``max``, then the next, each pod marked as bind marks it, and a
pod the policy keeps off every node that fits stays gated with the reason.
"""

from __future__ import annotations

from typing import Any

import yaml

from gpushare.core.dra.allocate import FINALIZER
from gpushare.core.dra.slices import SliceSpec, build_slice
from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.names import (
    ALLOCATION_MODE_DRA,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
    LABEL_ALLOCATION_MODE,
    LABEL_PLACEMENT,
)
from gpushare.core.model.units import MemoryUnit
from gpushare.core.resourcepolicies.gating import ANN_POLICY, ANN_UNIT
from gpushare.core.resourcepolicies.resourcepolicy import GROUP, PLURAL
from gpushare.crds import render_yaml, resource_policy_crd
from harness.cluster import Cluster
from harness.dra import claim_template, device_class, dra_pod, pod_claim
from harness.identities import (
    EXTENDER_VALUES,
    IDENTITY_TEMPLATES,
    apply_chart_identities,
    chart_documents,
)
from harness.seeding import labelled_kwok_nodes
from tests.support.e2e import create_nodes, delete_nodes, eventually

NS = "e2e-dra-alloc"
NODES = {"dra-pack": None, "dra-spread": "spread"}
CRD = f"{PLURAL}.{GROUP}"


def _apply(cluster: Cluster, docs: list[dict[str, Any]]) -> None:
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(docs))


def _template(gib: int) -> dict[str, Any]:
    return claim_template(f"gpushare-{gib}g", NS, {"main": gib})


def _pod(name: str, gib: int, node: str) -> dict[str, Any]:
    selector = {"kubernetes.io/hostname": node} if node else {}
    template = f"gpushare-{gib}g"
    return dra_pod(name, NS, template, selector=selector, gated=True, tolerate_all=True)


def _ordered(name: str, app: str) -> dict[str, Any]:
    """A 4 GiB pod of ``app`` with no node selector: its ResourcePolicy picks the node."""
    pod = _pod(name, 4, "")
    pod["metadata"]["labels"]["app"] = app
    return pod


def _policy(name: str, app: str, units: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/v1alpha1",
        "kind": "ResourcePolicy",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"selector": {"app": app}, "units": units},
    }


def _unit(node: str, **more: Any) -> dict[str, Any]:
    return {"resource": "ecs", "nodeSelector": {"kubernetes.io/hostname": node}, **more}


def _claim_of(cluster: Cluster, pod: str) -> dict[str, Any]:
    return pod_claim(cluster, NS, pod) or {}


def _running_on(cluster: Cluster, pod: str) -> tuple[str, str]:
    """(node, device) once the pod runs with its claim allocated by gpushare."""

    def ready() -> tuple[str, str] | None:
        got = cluster.kubectl_json("get", "pod", "-n", NS, pod)
        if (got.get("status") or {}).get("phase") != "Running":
            return None
        claim = _claim_of(cluster, pod)
        allocation = (claim.get("status") or {}).get("allocation")
        if not allocation:
            return None
        return got["spec"]["nodeName"], allocation["devices"]["results"][0]["device"]

    found: tuple[str, str] = eventually(ready, 60, f"pod {pod} running with its claim")
    claim = _claim_of(cluster, pod)
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert result["driver"] == DRA_DRIVER and result["pool"] == found[0]
    assert result["shareID"] and result["consumedCapacity"]["memory"].endswith("Gi")
    assert FINALIZER in claim["metadata"]["finalizers"]
    assert [r["name"] for r in claim["status"]["reservedFor"]] == [pod]
    return found


def test_gpushare_allocates_gated_claims(cluster: Cluster) -> None:
    names = list(NODES)
    nodes = labelled_kwok_nodes(names, "dra", gpus_units=[16, 16], mode=Mode.SHARE)
    for node in nodes:
        node["metadata"]["labels"][LABEL_ALLOCATION_MODE] = ALLOCATION_MODE_DRA
        if NODES[node["metadata"]["name"]]:
            node["metadata"]["labels"][LABEL_PLACEMENT] = str(NODES[node["metadata"]["name"]])
    values = (*EXTENDER_VALUES, "--set", "dra.allocator.enabled=true")
    _apply(cluster, chart_documents(cluster, IDENTITY_TEMPLATES, values=values))
    # the CRD before the extender starts: it lists policies at start-up, then watches them
    cluster.kubectl("apply", "-f", "-", input=render_yaml(resource_policy_crd()))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD}", "--timeout=60s")
    cluster.start_extender(extra=["--dra-allocator"])
    create_nodes(cluster, nodes)
    slices = [
        build_slice(
            SliceSpec(
                node=name,
                unit=MemoryUnit.GiB,
                mode=Mode.SHARE,
                gpus=tuple(Gpu(index=i, mem_units=16, uuid=f"GPU-{name}-{i}") for i in (0, 1)),
            )
        )
        for name in names
    ]
    cluster.create_namespace(NS)
    try:
        _apply(cluster, [device_class(), *slices, _template(4), _template(12), _template(40)])
        # binpack: the second pod shares the first one's GPU (as first-fit would too)
        _apply(cluster, [_pod("pack-a", 4, "dra-pack")])
        first = _running_on(cluster, "pack-a")
        _apply(cluster, [_pod("pack-b", 4, "dra-pack")])
        assert _running_on(cluster, "pack-b") == first == ("dra-pack", "gpu-0")
        # where gpushare differs from first-fit: a spread node gives its second pod the other
        # GPU (first-fit: gpu-0 again)
        _apply(cluster, [_pod("spread-a", 4, "dra-spread")])
        one = _running_on(cluster, "spread-a")
        _apply(cluster, [_pod("spread-b", 4, "dra-spread")])
        two = _running_on(cluster, "spread-b")
        assert one[0] == two[0] == "dra-spread" and one[1] != two[1]
        # deleting a pod frees its share: its claim goes, and 12 GiB fit on gpu-0 again
        claim = _claim_of(cluster, "pack-a")["metadata"]["name"]
        cluster.kubectl("delete", "pod", "-n", NS, "pack-a", "--wait=true")
        eventually(
            lambda: (
                cluster.kubectl("get", "resourceclaim", "-n", NS, claim, check=False).returncode
                != 0
            ),
            60,
            f"claim {claim} gone with its pod",
        )
        _apply(cluster, [_pod("pack-c", 12, "dra-pack")])
        assert _running_on(cluster, "pack-c") == ("dra-pack", "gpu-0")
        # fits nowhere: it keeps its gate (the stock allocator must not race gpushare for the
        # room the next claim frees) and is told why
        _apply(cluster, [_pod("huge", 40, "dra-pack")])

        def refused() -> str:
            out = cluster.kubectl("describe", "pod", "-n", NS, "huge").stdout
            return out if "DRANoFit" in out else ""

        described = eventually(refused, 60, "the pod that fits nowhere told why")
        print(described)
        got = cluster.kubectl_json("get", "pod", "-n", NS, "huge")
        assert got["spec"].get("schedulingGates") and not got["spec"].get("nodeName")
        assert not (_claim_of(cluster, "huge").get("status") or {}).get("allocation")
        cluster.kubectl("delete", "pod", "-n", NS, "huge", "--wait=true")
        # ResourcePolicy: dra-spread holds one web pod, then dra-pack takes the rest (binpack
        # alone would have put both on dra-pack's free GPU)
        web = [_unit("dra-spread", max=1, podLabels={"tier": "first"}), _unit("dra-pack")]
        _apply(cluster, [_policy("web", "web", web), _policy("solo", "solo", web[:1])])
        for name, node, unit in (("web-1", "dra-spread", "1"), ("web-2", "dra-pack", "2")):
            _apply(cluster, [_ordered(name, "web")])
            assert _running_on(cluster, name)[0] == node
            marks = cluster.kubectl_json("get", "pod", "-n", NS, name)["metadata"]
            assert marks["annotations"][ANN_POLICY] == "web"
            assert marks["annotations"][ANN_UNIT] == unit
            assert (marks["labels"].get("tier") == "first") == (unit == "1")
        # a pod the policy keeps off every node that fits stays gated, with the reason
        _apply(cluster, [_ordered("solo-1", "solo")])
        assert _running_on(cluster, "solo-1")[0] == "dra-spread"
        _apply(cluster, [_ordered("solo-2", "solo")])

        def held() -> str:
            out = cluster.kubectl("describe", "pod", "-n", NS, "solo-2").stdout
            return out if "DRAHeld" in out else ""

        described = eventually(held, 60, "the pod the policy keeps off every node held")
        print(described)
        assert "ResourcePolicy" in described and "is full" in described
        got = cluster.kubectl_json("get", "pod", "-n", NS, "solo-2")
        assert got["spec"].get("schedulingGates") and not got["spec"].get("nodeName")
        # its unit's pod goes: it takes the place
        cluster.kubectl("delete", "pod", "-n", NS, "solo-1", "--wait=true")
        assert _running_on(cluster, "solo-2")[0] == "dra-spread"
    finally:
        cluster.kubectl("delete", "crd", CRD, "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        cluster.kubectl(
            "delete", "resourceslice", *[s["metadata"]["name"] for s in slices], check=False
        )
        # the chart installs its own DeviceClass later in the session (test_helm_dra)
        cluster.kubectl(
            "delete", "deviceclass", DRA_DEVICE_CLASS, "--ignore-not-found", check=False
        )
        delete_nodes(cluster, names)
        cluster.start_extender(extra=())
        apply_chart_identities(cluster)
