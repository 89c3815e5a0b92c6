"""DRA mode's objects on the real API server, scheduler and controller-manager (v1.36.3).

What runs: kube-apiserver validating every object (the slices ``core.dra.slices.build_slice``
writes for a 1 GiB and a 128 MiB node, the chart's DeviceClass and claim policy, the templates
the webhook makes); ``gpushare webhook --dra`` with the chart's ServiceAccount, RBAC and
MutatingWebhookConfiguration (pointed at its URL) turning the seed's Job into a claim;
kube-controller-manager making each pod's ResourceClaim from its template; kube-scheduler's stock
allocator (the DynamicResources plugin) allocating it; kwok nodes (no kubelet: nothing prepares
the claims, nothing here needs it).

gpushare's DRA allocator (which lifts the scheduling gate ``gpushare.io/dra-allocation`` after
placing a claim) is not part of this test: the test lifts the gate itself, as the allocator's
identity (the chart's scheduler ServiceAccount, which the chart's hand-off policy trusts), so
the stock allocator places the claims. The same lift by a tenant is refused by that policy.
"""

from __future__ import annotations

import copy
import json
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpushare.core.dra.slices import SliceSpec, build_slice
from gpushare.core.model.inventory import Gpu, Mode
from gpushare.core.model.names import DRA_SCHEDULING_GATE
from gpushare.core.model.units import MemoryUnit
from harness.cluster import Cluster
from harness.identities import (
    SCHEDULER_SA,
    apply_chart_identities,
    service_account_kubeconfig,
)
from harness.seeding import KWOK_ANNOTATION, KWOK_VALUE
from tests.support.dra import dra_webhook
from tests.support.e2e import eventually

NS = "e2e-dra"
GIB_NODE = "e2e-dra-gib"
MIB_NODE = "e2e-dra-mib"
MIB_TAINT = {"key": "e2e-dra/fine-unit", "value": "only", "effect": "NoSchedule"}
EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "gpushare" / "examples"
MEM = "aliyun.com/gpu-mem"


def node(name: str, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {"kubernetes.io/hostname": name, "gpushare.io/allocation-mode": "dra"},
            "annotations": {KWOK_ANNOTATION: KWOK_VALUE},
        },
        "spec": {"taints": taints or []},
        "status": {"capacity": resources, "allocatable": resources},
    }


def gpu(name: str, index: int, mem_units: int) -> Gpu:
    return Gpu(index=index, mem_units=mem_units, uuid=f"GPU-{name}-{index}", model="Tesla T4")


def apply(cluster: Cluster, *objects: dict[str, Any], check: bool = True) -> Any:
    body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
    return cluster.kubectl("apply", "-f", "-", input=body, check=check)


def create(cluster: Cluster, obj: dict[str, Any], kubeconfig: Path | None = None) -> Any:
    args = ("--kubeconfig", str(kubeconfig)) if kubeconfig else ()
    return cluster.kubectl("create", *args, "-f", "-", input=json.dumps(obj), check=False)


def dry_run(cluster: Cluster, obj: dict[str, Any]) -> Any:
    """``kubectl create --dry-run=server -o json``: the object as admission leaves it, unstored."""
    return cluster.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", input=json.dumps(obj), check=False
    )


def pod_of_job(cluster: Cluster, job: str) -> dict[str, Any]:
    def found() -> dict[str, Any] | None:
        items = cluster.kubectl_json("get", "pods", "-n", NS, "-l", f"job-name={job}")["items"]
        return items[0] if items else None

    return eventually(found, 60, f"the pod of Job {job}")  # type: ignore[no-any-return]


def claim_of(cluster: Cluster, pod: str) -> dict[str, Any]:
    """The pod's ResourceClaim (made by kube-controller-manager from its template)."""

    def found() -> dict[str, Any] | None:
        status = cluster.kubectl_json("get", "pod", pod, "-n", NS).get("status", {})
        for entry in status.get("resourceClaimStatuses") or []:
            if entry.get("resourceClaimName"):
                return cluster.kubectl_json(  # type: ignore[no-any-return]
                    "get", "resourceclaim", entry["resourceClaimName"], "-n", NS
                )
        return None

    return eventually(found, 60, f"the ResourceClaim of {pod}")  # type: ignore[no-any-return]


def allocated(cluster: Cluster, claim: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        obj = cluster.kubectl_json("get", "resourceclaim", claim, "-n", NS)
        return obj if obj.get("status", {}).get("allocation") else None

    return eventually(done, 60, f"claim {claim} allocated")  # type: ignore[no-any-return]


def unschedulable(cluster: Cluster, pod: str) -> str:
    """The scheduler's reason, from the pod's PodScheduled condition, once it says so."""

    def reason() -> str | None:
        status = cluster.kubectl_json("get", "pod", pod, "-n", NS).get("status", {})
        for condition in status.get("conditions") or []:
            if condition["type"] == "PodScheduled" and condition.get("reason") == "Unschedulable":
                return str(condition.get("message", ""))
        return None

    return eventually(reason, 60, f"{pod} reported unschedulable")  # type: ignore[no-any-return]


def lift_gate(cluster: Cluster, pod: str, kubeconfig: Path) -> None:
    """What gpushare's DRA allocator does last (here without placing anything first)."""
    gates = cluster.kubectl_json("get", "pod", pod, "-n", NS)["spec"].get("schedulingGates", [])
    kept = [g for g in gates if g["name"] != DRA_SCHEDULING_GATE]
    patch = json.dumps([{"op": "replace", "path": "/spec/schedulingGates", "value": kept}])
    cluster.kubectl(
        "--kubeconfig", str(kubeconfig), "patch", "pod", pod, "-n", NS, "--type=json", "-p", patch
    )


def gpu_pod(name: str, mem: int) -> dict[str, Any]:
    """A pod as a tenant writes it for ACK, in the DRA namespace."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"limits": {MEM: mem}}}
            ],
        },
    }


def consumed(claim: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(device, consumed memory, shareID) of each result of an allocated claim."""
    results = claim["status"]["allocation"]["devices"]["results"]
    return [
        (r["pool"] + "/" + r["device"], r["consumedCapacity"]["memory"], r.get("shareID", ""))
        for r in results
    ]


@pytest.fixture(scope="module")
def dra(cluster: Cluster) -> Iterator[dict[str, Path]]:
    """Nodes and slices, the chart's DRA objects and hand-off policy, the webhook; cleaned up."""
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="gs-dra-", dir="/tmp"))
    apply_chart_identities(cluster)
    allocator = service_account_kubeconfig(cluster, SCHEDULER_SA, root / "allocator.kubeconfig")
    nodes = [node(GIB_NODE), node(MIB_NODE, [MIB_TAINT])]
    try:
        cluster.create_nodes(nodes)
        cluster.create_namespace(NS)
        cluster.kubectl("label", "namespace", NS, "gpushare.io/allocation-mode=dra")
        # the policy's adminAccess rule is what this test checks, not the API server's own
        # namespace rule for admin access (DRAAdminAccess), which would refuse first
        cluster.kubectl("label", "namespace", NS, "resource.kubernetes.io/admin-access=true")
        with dra_webhook(cluster, root, probe_namespace=NS):
            print(f"[e2e] DRA set up in {time.monotonic() - started:.1f}s", flush=True)
            yield {"allocator": allocator, "root": root}
    finally:
        cluster.kubectl("delete", "namespace", NS, "--wait=false", check=False)
        cluster.kubectl("delete", "resourceslice", "-l", "e2e-dra=yes", check=False)
        cluster.kubectl("delete", "node", GIB_NODE, MIB_NODE, "--wait=false", check=False)


def labelled(slice_obj: dict[str, Any]) -> dict[str, Any]:
    slice_obj["metadata"]["labels"] = {"e2e-dra": "yes"}
    return slice_obj


def test_dra_objects_on_the_real_control_plane(cluster: Cluster, dra: dict[str, Path]) -> None:
    started = time.monotonic()
    allocator = dra["allocator"]

    # 1. Slices as the driver writes them: one 15 GiB GPU in 1 GiB steps, one 8 GiB GPU in
    # 128 MiB steps (core_mem); the API server validates their capacities and policies.
    gib = labelled(
        build_slice(SliceSpec(GIB_NODE, MemoryUnit.GiB, Mode.SHARE, (gpu(GIB_NODE, 0, 15),)))
    )
    mib = labelled(
        build_slice(SliceSpec(MIB_NODE, MemoryUnit.MiB128, Mode.CORE_MEM, (gpu(MIB_NODE, 0, 64),)))
    )
    for s in (gib, mib):
        result = create(cluster, s)
        assert result.returncode == 0, result.stderr
    stored = cluster.kubectl_json("get", "resourceslice", mib["metadata"]["name"])
    memory = stored["spec"]["devices"][0]["capacity"]["memory"]
    assert memory["value"] == "8Gi" and memory["requestPolicy"]["validRange"]["step"] == "128Mi"
    device_class = cluster.kubectl_json("get", "deviceclass", "gpu.gpushare.io")
    assert device_class["spec"]["selectors"][0]["cel"]["expression"] == (
        'device.driver == "gpushare.io"'
    )

    # 2. The seed's Job as written: the webhook turns its pod into a claim; the template it
    # created is stored (validated by the API server and the claim policy).
    seed = yaml.safe_load((EXAMPLES / "GPUtest.yaml").read_text())
    seed["metadata"]["namespace"] = NS
    result = create(cluster, seed)
    assert result.returncode == 0, result.stderr
    pod = pod_of_job(cluster, seed["metadata"]["name"])
    name = pod["metadata"]["name"]
    (entry,) = pod["spec"]["resourceClaims"]
    template = cluster.kubectl_json(
        "get", "resourceclaimtemplate", entry["resourceClaimTemplateName"], "-n", NS
    )
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["capacity"]["requests"] == {"memory": "3Gi"}
    assert MEM not in pod["spec"]["containers"][0]["resources"].get("limits", {})
    assert pod["spec"]["schedulingGates"] == [{"name": DRA_SCHEDULING_GATE}]
    assert "gpushare.io/dra-requests" in pod["metadata"]["annotations"]

    # A second pod of the same shape finds the template stored (AlreadyExists, same spec);
    # it stays behind its gate, holding nothing.
    same = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "same-shape", "namespace": NS},
        "spec": copy.deepcopy(seed["spec"]["template"]["spec"]),
    }
    result = create(cluster, same)
    assert result.returncode == 0, result.stderr
    again = cluster.kubectl_json("get", "pod", "same-shape", "-n", NS)["spec"]["resourceClaims"]
    assert again == [entry]

    # 3. A tenant (here the admin, not one of gpushare's identities) may not lift the gate.
    lifted = cluster.kubectl(
        "patch",
        "pod",
        name,
        "-n",
        NS,
        "--type=json",
        "-p",
        json.dumps([{"op": "remove", "path": "/spec/schedulingGates"}]),
        check=False,
    )
    assert lifted.returncode != 0
    assert "only gpushare's DRA allocator lifts it" in lifted.stderr, lifted.stderr

    # 4. Lifted by the allocator's identity, the stock allocator places the 3 GiB claim.
    claim = claim_of(cluster, name)
    lift_gate(cluster, name, allocator)
    first = allocated(cluster, claim["metadata"]["name"])
    assert consumed(first)[0][:2] == (f"{GIB_NODE}/gpu-0", "3Gi")
    print(f"[e2e] seed Job allocated: {consumed(first)}", flush=True)

    # 5. A second claim on the same GPU: 4 GiB beside the 3, another share of gpu-0.
    assert create(cluster, gpu_pod("second", 4)).returncode == 0
    second_claim = claim_of(cluster, "second")
    lift_gate(cluster, "second", allocator)
    second = allocated(cluster, second_claim["metadata"]["name"])
    assert consumed(second)[0][:2] == (f"{GIB_NODE}/gpu-0", "4Gi")
    assert consumed(second)[0][2] != consumed(first)[0][2]  # two shares of one device

    # 6. More than the GPU has left (9 GiB of the 8 free), and more than any GPU has (40 GiB):
    # both stay unschedulable, with the scheduler's reason.
    for pod_name, mem in (("over-free", 9), ("over-any", 40)):
        assert create(cluster, gpu_pod(pod_name, mem)).returncode == 0
        claim_of(cluster, pod_name)
        lift_gate(cluster, pod_name, allocator)
        reason = unschedulable(cluster, pod_name)
        print(f"[e2e] {pod_name}: {reason}", flush=True)
        assert "cannot allocate all claims" in reason, reason

    # 7. A claim written by hand on the 128 MiB node: 300Mi rounds up to 384Mi (3 x 128 MiB).
    hand_claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "by-hand", "namespace": NS},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {
                            "deviceClassName": "gpu.gpushare.io",
                            "capacity": {"requests": {"memory": "300Mi"}},
                        },
                    }
                ]
            }
        },
    }
    result = create(cluster, hand_claim)
    assert result.returncode == 0, result.stderr
    hand_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "by-hand", "namespace": NS},
        "spec": {
            "tolerations": [{**MIB_TAINT, "operator": "Equal"}],
            "nodeSelector": {"kubernetes.io/hostname": MIB_NODE},
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "by-hand"}],
            "containers": [
                {"name": "main", "image": "busybox", "resources": {"claims": [{"name": "gpu"}]}}
            ],
        },
    }
    result = create(cluster, hand_pod)
    assert result.returncode == 0, result.stderr
    assert consumed(allocated(cluster, "by-hand"))[0][:2] == (f"{MIB_NODE}/gpu-0", "384Mi")

    # 8. The claim policy: adminAccess, allocationMode All and a count above 8 are refused,
    # each with the field, the value, the rule and what to do.
    for field, value, needle in (
        ("adminAccess", True, "exactly.adminAccess=true is refused"),
        ("allocationMode", "All", "allocationMode=All is refused"),
        ("count", 9, "asks a count above 8"),
    ):
        bad = copy.deepcopy(hand_claim)
        bad["metadata"]["name"] = f"bad-{field.lower()}"
        exactly = bad["spec"]["devices"]["requests"][0]["exactly"]
        exactly[field] = value
        if field == "count":
            exactly["allocationMode"] = "ExactCount"
        result = create(cluster, bad)
        assert result.returncode != 0, f"{field} was accepted"
        print(f"[e2e] {field} refused: {result.stderr.strip()}", flush=True)
        assert needle in result.stderr, result.stderr
        assert 'spec.devices.requests["gpu"]' in result.stderr, result.stderr
    print(f"[e2e] DRA objects checked in {time.monotonic() - started:.1f}s", flush=True)


def test_pods_outside_dra_namespaces_are_not_converted(
    cluster: Cluster, dra: dict[str, Path]
) -> None:
    other = "e2e-dra-plain"
    cluster.create_namespace(other, check=False)
    try:
        plain = gpu_pod("plain", 2)
        plain["metadata"]["namespace"] = other
        plain["spec"]["nodeSelector"] = {"gpushare-e2e": "dra-nowhere"}
        result = dry_run(cluster, plain)
        assert result.returncode == 0, result.stderr
        assert "resourceClaims" not in json.loads(result.stdout)["spec"]
        demanding = copy.deepcopy(plain)
        demanding["spec"]["nodeSelector"] = {"gpushare.io/allocation-mode": "dra"}
        result = dry_run(cluster, demanding)
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["spec"]["resourceClaims"][0]["name"] == "gpushare"
        # a dry run creates no template
        assert not cluster.kubectl_json("get", "resourceclaimtemplates", "-n", other)["items"]
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
