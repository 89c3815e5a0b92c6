"""``kubectl inspect cgpu`` in DRA mode: nodes from ResourceSlices, holdings from claims.

The slices are published as the DRA driver publishes them (``core.dra.slices.build_slice``) and
the claims carry ``status.allocation`` as an allocator writes it, all through the in-memory
Kubernetes port and the plugin's own ``collect`` and ``render``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from gpushare.core.decision.scheduling import Settings
from gpushare.core.dra.slices import SliceSpec, build_slice, device_name
from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.names import (
    ALLOCATION_MODE_DRA,
    ANN_ASSIGNED,
    DRA_CLAIM_NAME,
    DRA_DRIVER,
    LABEL_ALLOCATION_MODE,
)
from gpushare.core.model.requests import PodRequest, read_pod
from gpushare.core.model.units import MemoryUnit
from gpushare.core.records.allocation import plan
from gpushare.inspect.cli import CannotExplain, collect, collect_explanation, render
from gpushare.inspect.scope import Scope
from gpushare.kube.memory import MemoryKube
from gpushare.kube.objects import gpu_node, gpu_pod, placed
from gpushare.kube.sealing import keyless_trust


def dra_node(
    kube: MemoryKube, name: str, ip: str, sizes: list[int], mode: Mode = Mode.SHARE
) -> None:
    """A node in DRA mode: no gpushare annotation, its GPUs in its slice."""
    kube.put_node(
        {
            "metadata": {"name": name, "labels": {LABEL_ALLOCATION_MODE: ALLOCATION_MODE_DRA}},
            "status": {
                "addresses": [{"type": "InternalIP", "address": ip}],
                "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"},
            },
        }
    )
    gpus = tuple(Gpu(index=i, mem_units=m, model="Tesla T4") for i, m in enumerate(sizes))
    kube.put_resource_slice(
        build_slice(SliceSpec(node=name, unit=MemoryUnit.GiB, mode=mode, gpus=gpus))
    )


def dra_pod(
    kube: MemoryKube,
    name: str,
    namespace: str,
    node: str,
    index: int,
    gib: int,
    *,
    pool: str = "",
    cores: int = 0,
    **labels: str,
) -> None:
    """A running pod whose claim holds ``gib`` GiB of GPU ``index`` on ``node``."""
    uid = f"uid-{namespace}-{name}"
    claim = f"{name}-{DRA_CLAIM_NAME}"
    kube.create_pod(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": uid, "labels": labels},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "x"}],
                "resourceClaims": [{"name": DRA_CLAIM_NAME, "resourceClaimName": claim}],
            },
            "status": {"phase": "Running", "hostIP": "10.0.0.1"},
        }
    )
    consumed: dict[str, Any] = {"memory": f"{gib}Gi"}
    if cores:
        consumed["cores"] = str(cores)
    kube.put_resource_claim(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "status": {
                "allocation": {
                    "devices": {
                        "results": [
                            {
                                "request": "app",
                                "driver": DRA_DRIVER,
                                "pool": pool or node,
                                "device": device_name(index),
                                "consumedCapacity": consumed,
                            }
                        ]
                    }
                },
                "reservedFor": [{"resource": "pods", "name": name, "uid": uid}],
            },
        }
    )


def dp_pod(kube: MemoryKube, name: str, namespace: str, node: str, index: int, gib: int) -> None:
    """The same holding through the device plugin: a pod bound with gpushare's record."""
    pod: dict[str, Any] = gpu_pod(name, mem=gib, namespace=namespace)
    pod["metadata"]["uid"] = f"uid-{namespace}-{name}"
    pod["status"] = {"phase": "Running", "hostIP": "10.0.0.1"}
    request = read_pod(pod)
    assert isinstance(request, PodRequest)
    allocation = plan(request, node=node, indexes=[index], unit=MemoryUnit.GiB)
    bound = placed(pod, allocation, trust=keyless_trust(kube))
    bound["metadata"]["annotations"][ANN_ASSIGNED] = "true"  # the device plugin handed it out
    kube.create_pod(bound)


def dra_cluster() -> MemoryKube:
    kube = MemoryKube()
    dra_node(kube, "n1", "10.0.0.1", [15, 15])
    dra_pod(kube, "train", "team-a", "n1", 1, 3, app="train")
    dra_pod(kube, "serve", "team-b", "n1", 1, 2, app="serve")
    return kube


def dp_cluster() -> MemoryKube:
    kube = MemoryKube()
    kube.put_node(gpu_node("n1", ip="10.0.0.1", gpus_units=[15, 15]))
    dp_pod(kube, "train", "team-a", "n1", 1, 3)
    dp_pod(kube, "serve", "team-b", "n1", 1, 2)
    return kube


def text(
    kube: MemoryKube, *, details: bool = False, output: str = "text", home: str = "", **scope: Any
) -> str:
    view = asyncio.run(collect(kube, trust=keyless_trust(kube), scope=Scope(**scope), home=home))
    return render(view, details=details, output=output)


def test_a_dra_node_with_two_claims_shows_both_pods_on_their_gpu() -> None:
    kube = dra_cluster()
    out = text(kube, details=True)
    assert "NAME:       n1" in out and "10.0.0.1" in out
    train = next(line for line in out.splitlines() if "train" in line)
    serve = next(line for line in out.splitlines() if "serve" in line)
    # GPU0 holds nothing, GPU1 the pod's GiB
    assert train.split()[-3:] == ["0", "3", "assigned"] and serve.split()[-3:-1] == ["0", "2"]
    data = json.loads(text(kube, output="json"))
    [node] = data["nodes"]
    assert node["mode"] == "share" and node["ip"] == "10.0.0.1"
    assert [g["allocatedUnits"] for g in node["gpus"]] == [0, 5]
    assert {p["name"]: p["memUnits"] for p in node["pods"]} == {
        "train": {"1": 3},
        "serve": {"1": 2},
    }
    assert data["cluster"]["allocatedMib"] == 5 * 1024 and data["ignored"] == []


def test_a_dra_node_is_shown_exactly_as_the_same_device_plugin_node() -> None:
    for details in (False, True):
        assert text(dra_cluster(), details=details) == text(dp_cluster(), details=details)
    dra, dp = (
        json.loads(text(dra_cluster(), output="json")),
        json.loads(text(dp_cluster(), output="json")),
    )
    for doc in (dra, dp):
        for pod in doc["nodes"][0]["pods"]:
            pod.pop("state")  # bound (a claim) or assigned (the device plugin's hand-off)
    assert dra == dp


def test_dra_and_device_plugin_nodes_side_by_side() -> None:
    kube = dra_cluster()
    kube.put_node(gpu_node("n2", ip="10.0.0.2", gpus_units=[15]))
    dp_pod(kube, "infer", "team-a", "n2", 0, 8)
    data = json.loads(text(kube, output="json"))
    assert [(n["name"], n["allocatedUnits"]) for n in data["nodes"]] == [("n1", 5), ("n2", 8)]


def test_a_claim_on_a_pool_no_slice_publishes_is_ignored_with_its_reason() -> None:
    kube = dra_cluster()
    dra_pod(kube, "ghost", "team-a", "n1", 0, 4, pool="n9")
    data = json.loads(text(kube, output="json"))
    [ignored] = data["ignored"]
    assert ignored["name"] == "ghost" and ignored["node"] == "n9"
    assert "no gpushare ResourceSlice publishes this pool" in ignored["reason"]
    assert [g["allocatedUnits"] for g in data["nodes"][0]["gpus"]] == [0, 5]
    out = text(kube, details=True)
    assert "ghost" in out


def test_a_tenant_claim_above_the_gpu_counts_as_recorded_and_never_on_another_gpu() -> None:
    # the trust rule: what counts is status.allocation's device and capacity, nothing else
    kube = dra_cluster()
    dra_pod(kube, "greedy", "team-c", "n1", 7, 4)
    data = json.loads(text(kube, output="json"))
    assert [g["allocatedUnits"] for g in data["nodes"][0]["gpus"]] == [0, 5]
    assert data["ignored"][0]["name"] == "greedy"
    assert "publishes no such device" in data["ignored"][0]["reason"]


def test_a_namespace_shows_its_claims_and_the_node_full() -> None:
    out = text(dra_cluster(), details=True, namespace="team-a")
    assert "train" in out and "serve" not in out
    assert "Allocated :  5 (16%)" in out


def test_a_tenant_without_node_slice_or_cluster_rights_sees_its_claims() -> None:
    kube = dra_cluster()
    kube.forbidden |= {
        "list_nodes",
        "list_pods:*",
        "list_resource_slices",
        "list_resource_claims:*",
    }
    out = text(kube, details=True, home="team-a")
    assert "train" in out and "serve" not in out
    assert "Note: resourceslices: forbidden" in out
    data = json.loads(text(kube, output="json", home="team-a"))
    [node] = data["nodes"]
    assert node["seenFrom"] == "pods" and node["allocatedUnits"] == 3
    assert data["scope"]["forbidden"] == [
        "nodes",
        "pods outside namespace team-a",
        "resourceslices",
    ]
    assert [(g["index"], g["totalUnits"]) for g in node["gpus"]] == [(1, 3)]


def test_a_tenant_without_claim_rights_is_told_dra_holdings_are_missing() -> None:
    kube = dra_cluster()
    kube.forbidden |= {"list_pods:*", "list_resource_claims:*", "list_resource_claims:team-a"}
    out = text(kube, home="team-a")
    assert "Note: resourceclaims: forbidden" in out


def test_a_device_plugin_cluster_whose_reader_may_not_list_dra_objects_is_unchanged() -> None:
    kube = dp_cluster()
    before = text(kube, details=True)
    kube.forbidden |= {"list_resource_slices", "list_resource_claims:*"}
    assert text(kube, details=True) == before
    assert "Note:" not in before


def test_explain_says_it_covers_device_plugin_nodes_only() -> None:
    kube = dra_cluster()
    with pytest.raises(CannotExplain, match=r"DRA mode.*covers device-plugin nodes only"):
        asyncio.run(collect_explanation(kube, "team-a", "train", settings=Settings()))
    kube.put_node(gpu_node("n2", ip="10.0.0.2", gpus_units=[15]))
    kube.create_pod(gpu_pod("small", mem=2, namespace="team-a"))
    notes: list[str] = []
    explanation = asyncio.run(
        collect_explanation(kube, "team-a", "small", settings=Settings(), notes=notes)
    )
    assert explanation is not None
    assert notes == [
        "note: --explain covers device-plugin nodes only; 1 DRA node(s) (n1) are not scored "
        "(docs/dra.md, limits)"
    ]


def test_a_mixed_cluster_golden(golden: Callable[[str, str], None]) -> None:
    """A core_mem DRA node with shares of memory and computing power, a device-plugin node,
    and a claim on a device the slice does not publish: the table, -d and -o json."""
    kube = MemoryKube()
    dra_node(kube, "dra-a", "10.0.1.1", [16, 16, 16], mode=Mode.CORE_MEM)
    dra_pod(kube, "train", "ml", "dra-a", 0, 8, cores=50)
    dra_pod(kube, "tune", "ml", "dra-a", 0, 4, cores=25)
    dra_pod(kube, "serve", "web", "dra-a", 2, 6, cores=30)
    dra_pod(kube, "stray", "web", "dra-a", 5, 2)
    kube.put_node(gpu_node("dp-b", ip="10.0.1.2", gpus_units=[15, 15]))
    dp_pod(kube, "infer", "web", "dp-b", 1, 7)
    golden("inspect_dra_summary.txt", text(kube))
    golden("inspect_dra_details.txt", text(kube, details=True))
    golden("inspect_dra.json", text(kube, output="json"))
