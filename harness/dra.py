"""DRA mode on kwok nodes: the driver's ResourceSlices, the DeviceClass, claims and pods by hand.

gpushare's DRA driver publishes its node's ResourceSlice through kubelet's DRA plugin API
(kubelet's ``pkg/kubelet/cm/dra``: the plugin registers with kubelet, which owns the slice
controller and the slice's owner reference to its Node). A kwok node has no kubelet, so no driver
can run there; :func:`publishing_slices` stands in for it on the nodes of a group, those an
autoscaler adds included: each new node gets the slice ``core.dra.slices.build_slice`` makes for
its GPUs, owned by the Node as kubelet's controller makes it, so the garbage collector removes
it with the node. It writes with the admin identity (the driver's own RBAC is the chart's, not
exercised here).

The objects a converted pod needs are written by hand in the shape docs/dra.md gives (the
webhook's conversion is not used): the ``gpu.gpushare.io`` DeviceClass the chart installs, one
``ResourceClaimTemplate`` per pod shape with one request per GPU container, and pods naming it.
No scheduling gate: the stock allocator of kube-scheduler allocates the claims.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpushare.core.dra.slices import SliceSpec, build_slice, quantity, slice_name
from gpushare.core.model.inventory import Mode
from gpushare.core.model.names import (
    DRA_CAPACITY_MEMORY,
    DRA_CLAIM_NAME,
    DRA_DEVICE_CLASS,
    DRA_DRIVER,
)
from harness.autoscalers import GROUP_LABEL, GpuShape
from harness.cluster import Cluster

RESOURCE_API = "resource.k8s.io/v1"


def device_class() -> dict[str, Any]:
    """The ``gpu.gpushare.io`` DeviceClass (docs/dra.md): every device of gpushare's driver."""
    return {
        "apiVersion": RESOURCE_API,
        "kind": "DeviceClass",
        "metadata": {"name": DRA_DEVICE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRA_DRIVER}"'}}]},
    }


def node_slice(node: Mapping[str, Any], shape: GpuShape) -> dict[str, Any]:
    """The slice gpushare's driver publishes for ``node`` (its GPUs: ``shape``), owned by the
    Node as kubelet's slice controller makes it."""
    name = str(node["metadata"]["name"])
    spec = SliceSpec(node=name, unit=shape.unit, mode=Mode.SHARE, gpus=shape.inventory(name))
    obj = build_slice(spec)
    obj["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "name": name,
            "uid": node["metadata"]["uid"],
            "controller": True,
        }
    ]
    return obj


def claim_template(name: str, namespace: str, mem_gib: Mapping[str, int]) -> dict[str, Any]:
    """A ResourceClaimTemplate in the webhook's shape (docs/dra.md): one request per GPU
    container (``mem_gib``: container name to GiB of one GPU), one device of the class with
    that much ``memory``; ``cores`` not requested (its default, 0: ACK's share)."""
    requests = [
        {
            "name": container,
            "exactly": {
                "deviceClassName": DRA_DEVICE_CLASS,
                "allocationMode": "ExactCount",
                "count": 1,
                "capacity": {"requests": {DRA_CAPACITY_MEMORY: quantity(gib * 1024)}},
            },
        }
        for container, gib in mem_gib.items()
    ]
    return {
        "apiVersion": RESOURCE_API,
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": requests}}},
    }


def dra_pod(
    name: str,
    namespace: str,
    template: str,
    *,
    selector: Mapping[str, str],
    containers: tuple[str, ...] = ("main",),
    annotations: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as the webhook leaves it (docs/dra.md), without the scheduling gate: its claim
    ``gpushare`` made from ``template``, each container naming its own request."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": "e2e"},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "nodeSelector": dict(selector),
            "resourceClaims": [{"name": DRA_CLAIM_NAME, "resourceClaimTemplateName": template}],
            "containers": [
                {
                    "name": c,
                    "image": "busybox",
                    "resources": {"claims": [{"name": DRA_CLAIM_NAME, "request": c}]},
                }
                for c in containers
            ],
        },
    }


def pod_claim(cluster: Cluster, namespace: str, pod: str) -> dict[str, Any] | None:
    """The ResourceClaim kube-controller-manager made for the pod's ``gpushare`` claim (named
    in ``status.resourceClaimStatuses``), or None before it exists."""
    obj = cluster.kubectl_json("get", "pod", "-n", namespace, pod)
    for entry in (obj.get("status") or {}).get("resourceClaimStatuses") or []:
        if entry.get("name") == DRA_CLAIM_NAME and entry.get("resourceClaimName"):
            found: dict[str, Any] = cluster.kubectl_json(
                "get", "resourceclaim", "-n", namespace, entry["resourceClaimName"]
            )
            return found
    return None


def allocated_devices(claim: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(pool, device) of each result of the claim's allocation (the pool is the node)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    results = (allocation.get("devices") or {}).get("results") or []
    return [(str(r["pool"]), str(r["device"])) for r in results]


@dataclass
class SlicePublisher:
    """What :func:`publishing_slices` did: the moment it published each node's slice."""

    published: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def publish_slice(cluster: Cluster, node: Mapping[str, Any], shape: GpuShape) -> None:
    """Create ``node``'s slice (once: an existing one is left as it is)."""
    cluster.kubectl("create", "-f", "-", input=json.dumps(node_slice(node, shape)), check=False)


@contextlib.contextmanager
def publishing_slices(
    cluster: Cluster, shapes: Mapping[str, GpuShape], *, period_s: float = 0.5
) -> Iterator[SlicePublisher]:
    """Publish, as gpushare's driver would, the slice of every node of ``shapes``' groups
    (``GROUP_LABEL`` value to the GPUs its driver finds) that has none, until the block ends
    (module docstring)."""
    done = SlicePublisher()
    stop = threading.Event()
    selector = f"{GROUP_LABEL} in ({','.join(shapes)})"

    def loop() -> None:
        while not stop.wait(period_s):
            try:
                items = cluster.kubectl_json("get", "nodes", "-l", selector)["items"]
                held = {
                    s["metadata"]["name"]
                    for s in cluster.kubectl_json("get", "resourceslices")["items"]
                }
            except Exception as err:  # a busy apiserver: next round
                done.errors.append(f"{type(err).__name__}: {err}")
                continue
            for node in items:
                name = node["metadata"]["name"]
                if slice_name(name) in held or node["metadata"].get("deletionTimestamp"):
                    continue
                publish_slice(cluster, node, shapes[node["metadata"]["labels"][GROUP_LABEL]])
                done.published.setdefault(name, time.monotonic())

    thread = threading.Thread(target=loop, name="publishing-slices", daemon=True)
    thread.start()
    try:
        yield done
    finally:
        stop.set()
        thread.join(timeout=30)
