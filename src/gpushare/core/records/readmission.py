"""What becomes of a GPU pod that kubelet refused because no device plugin served its resources.

From the moment a device plugin's ListAndWatch stream ends, kubelet counts none of its devices
healthy (``PluginDisconnected``, pkg/kubelet/cm/devicemanager/manager.go) until a plugin
registers again, and a pod it admits meanwhile that asks for the resource is refused
(``devicesToAllocate``: "no healthy devices present", or "cannot allocate unregistered
device" after a kubelet restart; "code = Unavailable" when the plugin ended during the pod's
Allocate call): the pod ends ``Failed`` with ``UnexpectedAdmissionError`` and none of its
containers ran. kubelet's predicate can refuse it the same way as
``OutOf<resource>`` while the node it reads shows the resource at 0. A plugin restart is short
(docs/device-plugin.md, "Restarts") and the extender keeps new pods off a node whose kubelet
allocates nothing, but pods bound just before the plugin went away still meet the gap.

Who brings such a pod back:

- a pod with a controller (an owner reference with ``controller: true``): the controller. A
  ReplicaSet, StatefulSet or DaemonSet replaces a Failed pod; a Job counts it toward its
  ``backoffLimit`` and starts another. gpushare only says so in an event.
- a bare pod: nobody, so gpushare re-creates it under the same name, with the same spec less
  the node, and its labels and annotations less gpushare's hand-off, after a Warning event on
  the refused pod that says why. Nothing of it ran, so running it is what its author asked for.
  Not re-created: a pod being deleted, a pod with finalizers (its deletion waits on someone
  else) and a pod re-created ``MAX_RECREATIONS`` times already (the extender counts them).
"""

from __future__ import annotations

import copy
import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpushare.core.model.kubejson import (
    KubeObject,
    annotations_of,
    meta,
    name_of,
    node_name_of,
    pod_status_of,
)
from gpushare.core.model.names import (
    ANN_ALLOCATION,
    ANN_REFUSAL_REPORTED,
    ANN_RETRY,
    POD_ANNOTATIONS,
    ResourceNames,
)

MAX_RECREATIONS = 3
"""Re-creations of one pod (namespace and name) the extender makes before leaving it Failed."""

REFUSED_BY_KUBELET = "UnexpectedAdmissionError"
REFUSAL_TEXTS = (
    "no healthy devices present",
    "cannot allocate unregistered device",
    "has been stopped",
)
"""What kubelet's device manager says when no plugin serves the resource; each names it. The
last is its ``errEndpointStopped`` ("endpoint %v has been stopped", pkg/kubelet/cm/devicemanager
types.go), returned by Allocate and GetPreferredAllocation on an endpoint kubelet stopped when
the plugin went away; the endpoint's printed form carries the resource name."""
CUT_OFF = (
    "rpc error: code = Unavailable",
    "rpc error: code = Canceled desc = grpc: the client connection is closing",
)
"""kubelet's messages when the plugin went away during the pod's Allocate or
GetPreferredAllocation call: its socket closed ("error reading from server: EOF"), or kubelet
closed its client of the plugin's endpoint meanwhile (the plugin stopped serving, or registered
again). They name no resource, and the pod is one gpushare placed, so the plugin was
gpushare's."""


class Step(enum.Enum):
    """What to do about a Failed pod."""

    NOTHING = "nothing"
    CONTROLLER = "controller"
    """Its controller replaces it; say so."""
    RECREATE = "recreate"
    """A bare pod: re-create it under its name."""


@dataclass(frozen=True)
class Readmission:
    """The step for one pod and the sentence that explains it (empty for NOTHING)."""

    step: Step
    why: str = ""


def refusal(pod: KubeObject, names: ResourceNames) -> str:
    """kubelet's message when it refused a GPU pod gpushare placed for want of a serving device
    plugin; empty for any other pod."""
    status = pod_status_of(pod)
    if status.get("phase") != "Failed" or ANN_ALLOCATION not in annotations_of(pod):
        return ""
    reason, message = str(status.get("reason") or ""), str(status.get("message") or "")
    ours = (names.mem, names.core)
    if reason == REFUSED_BY_KUBELET and any(t in message for t in REFUSAL_TEXTS):
        return message if any(n in message for n in ours) else ""
    if reason == REFUSED_BY_KUBELET and any(t in message for t in CUT_OFF):
        return message
    if reason in (f"OutOf{n}" for n in ours):
        return message or reason
    return ""


def _controller(pod: KubeObject) -> str:
    for ref in meta(pod).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return f"{ref.get('kind')}/{ref.get('name')}"
    return ""


def readmission(
    pod: KubeObject, names: ResourceNames, recreated: int = 0, *, recreate: bool = True
) -> Readmission:
    """What to do about ``pod``, re-created ``recreated`` times already; ``recreate``: whether
    bare pods are re-created at all (``scheduler.extender.recreateRefusedPods``), so that the
    sentence says what will happen."""
    message = refusal(pod, names)
    if not message or ANN_REFUSAL_REPORTED in annotations_of(pod):
        return Readmission(Step.NOTHING)
    node = node_name_of(pod) or "its node"
    said = (
        f"kubelet on {node} refused the pod while no device plugin served its GPU resources "
        f"({message.strip()}); none of its containers ran"
    )
    owner = _controller(pod)
    if owner:
        return Readmission(Step.CONTROLLER, f"{said}; its controller {owner} replaces it")
    if meta(pod).get("deletionTimestamp") or meta(pod).get("finalizers"):
        return Readmission(Step.NOTHING)
    if not recreate:
        return Readmission(
            Step.NOTHING,
            f"{said}; it stays Failed (gpushare re-creates such pods only with the chart's "
            "scheduler.extender.recreateRefusedPods: true): create it again once the node's "
            f"device plugin serves (kubectl describe node {node})",
        )
    if recreated >= MAX_RECREATIONS:
        return Readmission(
            Step.NOTHING,
            f"{said}; gpushare re-created it {recreated} times already and leaves it Failed: "
            "see why the node's device plugin is not serving (kubectl describe node "
            f"{node}), then create the pod again",
        )
    return Readmission(
        Step.RECREATE,
        f"{said}; gpushare re-creates it under the same name (re-creation {recreated + 1} of "
        f"at most {MAX_RECREATIONS})",
    )


def replacement(pod: KubeObject) -> dict[str, Any]:
    """The pod to create in place of a refused bare pod: its spec less the node, its labels,
    annotations and non-controller owners, without gpushare's hand-off annotations."""
    source = meta(pod)
    dropped = {*POD_ANNOTATIONS, ANN_RETRY, ANN_REFUSAL_REPORTED}
    metadata: dict[str, Any] = {"name": name_of(pod), "namespace": source.get("namespace")}
    for key in ("labels", "ownerReferences"):
        if source.get(key):
            metadata[key] = copy.deepcopy(source[key])
    annotations = {k: v for k, v in annotations_of(pod).items() if k not in dropped}
    if annotations:
        metadata["annotations"] = annotations
    spec = copy.deepcopy(dict(pod.get("spec") or {}))
    spec.pop("nodeName", None)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
