"""The startup taint: a new GPU node counts as "still starting" until kubelet took our resource.

A node of an autoscaled pool registers with kubelet's resources (CPU, memory) at once, but
``aliyun.com/gpu-mem`` appears in its ``status.allocatable`` only after gpushare's device plugin
started on it and registered with kubelet, seconds to minutes later. Meanwhile an autoscaler
that sees a Ready node without the memory the pending pod asks for concludes the new node does
not help, and adds another one. cluster-autoscaler knows this gap only for a fixed list of vendor
resources (``processors/customresources/gpu_processor.go``, ``utils/gpu/gpu.go``
``GPUVendorResourceNames``; ours is not among them, ../shared/docs/AUTOSCALERS.md).

Both autoscalers have one generic answer, a taint the node is born with and something on the
node removes when it is ready:

- cluster-autoscaler 1.36.1 (``utils/taints/taints.go``): any taint whose **key** starts with
  ``startup-taint.cluster-autoscaler.kubernetes.io/`` (``StartupTaintPrefix``; more keys with
  ``--startup-taint``/``--startup-taint-prefix``) is a startup taint. ``IsStartupTaint`` reads
  the key only, so the effect does not matter. ``FilterOutNodesWithStartupTaints`` (called from
  ``core/static_autoscaler.go`` ``obtainNodeLists``) rewrites such a node as NotReady
  (``GetUnreadyNodeCopy`` with reason ``cluster-autoscaler.kubernetes.io/startup-taint``);
  ``clusterstate/clusterstate.go`` ``updateReadinessStats`` counts a NotReady node younger than
  ``--max-node-startup-time`` (15 min) as NotStarted, which ``calculateUpcomingNodesInNodeGroup``
  leaves among the upcoming nodes, and ``RunOnce`` puts a template node (with the template's
  gpu-mem) in its place in the snapshot, so the pending pod "fits" there and no second node is
  added. ``SanitizeTaints`` drops the taint from every template node (the provider's, or one
  made from a real node: ``simulator/node_info_utils.go`` ``createSanitizedNode``), so pods
  need not tolerate it.
- Karpenter v1.15.0: NodePool ``spec.template.spec.startupTaints`` (``pkg/apis/v1/nodepool.go``:
  "ignored for provisioning purposes"). ``pkg/controllers/nodeclaim/lifecycle/initialization.go``
  keeps a NodeClaim uninitialized while a startup taint (``MatchTaint``: key and effect) is on
  the node, or while a resource its pods requested is zero in allocatable
  (``RequestedResourcesRegistered``); until then ``pkg/controllers/state/statenode.go`` models
  the node with the instance type's allocatable and without the startup taints, so pods are
  packed onto it and no second node is launched.

So the pool puts ``startup-taint.cluster-autoscaler.kubernetes.io/gpushare`` on its nodes
(kubelet ``--register-with-taints``, a node group's taints, a NodePool's ``startupTaints``) and
the node's device plugin removes it, by key, whatever the effect, once kubelet shows a positive
``aliyun.com/gpu-mem`` in allocatable: kubelet writes that figure only after it accepted the
plugin's registration and counted healthy devices. This module decides; ``node.startuptaint``
reads the node and writes the patch.

The patch is a JSON patch whose ``test`` operations hold the node's resourceVersion and its
taints as read: if anything changed the node since (the taint was put back for another reason,
another taint came or went, kubelet's figure moved) the API server applies nothing and the
adapter reads the node again and decides anew, so the write never drops a taint it did not see
nor one that came back after the reading.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from gpushare.core.model.kubejson import KubeObject, meta, node_status_of, spec_of
from gpushare.core.model.quantity import parse_quantity

STARTUP_TAINT = "startup-taint.cluster-autoscaler.kubernetes.io/gpushare"
"""The key the device plugin removes by default: cluster-autoscaler's startup-taint prefix
(``StartupTaintPrefix``) and gpushare's name."""


class Step(Enum):
    """What the device plugin does about its node's startup taint now."""

    REMOVE = "remove"
    """The taint is there and kubelet allocates the GPU memory: send ``patch``."""
    WAIT = "wait"
    """The taint is there but kubelet does not allocate the GPU memory yet: read again later."""
    DONE = "done"
    """Nothing (more) to do: no such taint on the node, or the feature is off."""


@dataclass(frozen=True)
class TaintRelease:
    """The decision for one reading of the node, with the reason in words."""

    step: Step
    reason: str
    patch: tuple[Mapping[str, Any], ...] = ()
    """The JSON patch (RFC 6902) operations, only for ``REMOVE``."""
    removed: tuple[Mapping[str, Any], ...] = ()
    """The taints the patch removes, as the node held them (one per effect the key has)."""


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be a taint key, or None (empty is fine: the feature is off).

    A taint key is a qualified name: an optional DNS subdomain prefix and ``/``, then up to 63
    characters of letters, digits, ``-``, ``_`` and ``.``, beginning and ending alphanumeric.
    """
    if not key:
        return None
    prefix, _, name = key.rpartition("/")
    if prefix and (len(prefix) > 253 or not all(_dns_label(p) for p in prefix.split("."))):
        return f"its prefix {prefix!r} is not a DNS subdomain"
    if not name or len(name) > 63 or not (name[0].isalnum() and name[-1].isalnum()):
        return f"its name {name!r} must be 1 to 63 characters, beginning and ending alphanumeric"
    if not all(c.isascii() and (c.isalnum() or c in "-_.") for c in name):
        return f"its name {name!r} may hold only letters, digits, '-', '_' and '.'"
    return None


def _dns_label(label: str) -> bool:
    return (
        0 < len(label) <= 63
        and label[0].isalnum()
        and label[-1].isalnum()
        and all(c.isascii() and (c.islower() or c.isdigit() or c == "-") for c in label)
    )


def allocatable_positive(node: KubeObject, resource: str) -> bool:
    """Whether kubelet shows a positive amount of ``resource`` in the node's allocatable."""
    raw = (node_status_of(node).get("allocatable") or {}).get(resource)
    parsed = parse_quantity(raw) if raw is not None else "is absent"
    return not isinstance(parsed, str) and parsed.value > 0


def release(node: KubeObject, *, key: str, resource: str) -> TaintRelease:
    """Decide, from the node as read, whether to remove the startup taint ``key`` now.

    ``resource`` is the GPU memory resource kubelet must allocate first (``aliyun.com/gpu-mem``).
    """
    if not key:
        return TaintRelease(Step.DONE, "no startup taint configured")
    taints: Sequence[Mapping[str, Any]] = spec_of(node).get("taints") or []
    ours = tuple(t for t in taints if t.get("key") == key)
    if not ours:
        return TaintRelease(Step.DONE, f"the node has no taint {key}")
    effects = ",".join(sorted(str(t.get("effect", "")) for t in ours))
    if not allocatable_positive(node, resource):
        return TaintRelease(
            Step.WAIT,
            f"keeping taint {key} ({effects}): kubelet allocates no {resource} yet (the "
            "device plugin's registration is not in the node's status)",
        )
    version = str(meta(node).get("resourceVersion") or "")
    kept = [dict(t) for t in taints if t.get("key") != key]
    patch: list[Mapping[str, Any]] = []
    if version:
        patch.append({"op": "test", "path": "/metadata/resourceVersion", "value": version})
    patch += [
        {"op": "test", "path": "/spec/taints", "value": [dict(t) for t in taints]},
        {"op": "replace", "path": "/spec/taints", "value": kept},
    ]
    amount = (node_status_of(node).get("allocatable") or {}).get(resource)
    return TaintRelease(
        Step.REMOVE,
        f"removing taint {key} ({effects}): kubelet allocates {resource}={amount}",
        patch=tuple(patch),
        removed=ours,
    )
