"""The ``ValidatingAdmissionPolicies`` that hold the device plugin to its own node.

RBAC cannot say "your own node": a ClusterRole that lets the device plugin patch nodes and pods
lets every plugin pod patch every node and every pod in the cluster, so a token stolen from any
GPU node could relabel, untaint or re-address any node, or rewrite any pod's annotations and
image. Kubelet's NodeRestriction admission plugin closes the same gap for kubelets; these two
policies (one for nodes, one for pods) do it for the device plugin, in CEL that the API server
evaluates itself:

- **who**: the device plugin's ServiceAccount only (a matchCondition), authenticated by the token
  kubelet mounts into its pod. Since Kubernetes 1.30 such a token names the node the pod runs
  on, and the API server puts it into the user's extra
  ``authentication.kubernetes.io/node-name`` (feature ``ServiceAccountTokenPodNodeInfo``: beta
  and on by default in 1.30, GA and locked on since 1.32). A token without it (``kubectl create
  token`` without ``--bound-object-kind Pod``, a Secret's legacy token) is refused outright: it
  could be used from anywhere.
- **what**: UPDATE of ``nodes``, ``nodes/status`` and ``pods``, nothing else: no create, delete
  or other subresource, whatever RBAC grants later.
- **where**: its own node, and pods already bound to it (``oldObject.spec.nodeName``).
- **which keys**: on the node, only the annotations and ACK's GPU labels it publishes
  (:data:`NODE_ANNOTATIONS`, :data:`NODE_LABELS`), with the other labels, finalizers, owner
  references and the whole spec (taints, unschedulable, podCIDR, providerID) as they were, but
  for one change: removing every taint with the startup taint's key (``core.model.startuptaint``,
  when the chart names one), the other taints and spec fields (:data:`NODE_SPEC_FIELDS`) kept; in
  node status, only ``<count resource>`` in capacity and allocatable, with metadata and the
  other status fields as they were (the addresses the API server dials for logs and exec among
  them); on a pod, only :data:`POD_ANNOTATIONS`, with labels, finalizers, owner references and
  the whole spec as they were.

A merge patch reaches admission as an UPDATE of the whole object (``oldObject`` before,
``object`` after), so comparing the two sees exactly what the patch changed. Node status fields
newer than Kubernetes 1.30's (``runtimeHandlers``, ``features``, ...) are not compared, so that
the policy type-checks on every version the chart supports; they describe the kubelet's
runtime, which kubelet rewrites.

Reads are not admission's: ``get``/``list`` of nodes and pods stay cluster-wide (RBAC cannot
scope a list by field selector), so a stolen token still reads every pod's spec.
"""

from __future__ import annotations

from typing import Any

from gpushare.core.model.gpumodel import LABEL_COUNT, LABEL_MEM, LABEL_MODEL
from gpushare.core.model.names import (
    ANN_ASSIGNED,
    ANN_NODE_GPU_USED,
    ANN_NODE_GPUS,
    ANN_NODE_HANDOFF,
    ANN_NODE_TOPOLOGY,
    ANN_NODE_UNIT,
    DEFAULT_NAMES,
    LABEL_NODE_GPUS_PUBLISHED,
)
from gpushare.core.model.startuptaint import STARTUP_TAINT

POLICY_NAME = "gpushare-device-plugin"
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
"""The user extra a pod-bound ServiceAccount token carries (ServiceAccountTokenPodNodeInfo)."""
NODE_ANNOTATIONS = (
    ANN_NODE_GPUS,
    ANN_NODE_UNIT,
    ANN_NODE_HANDOFF,
    ANN_NODE_TOPOLOGY,
    ANN_NODE_GPU_USED,
)
"""What the device plugin writes on its node: ``node.publishing`` the first four,
``node.usage`` the GPU use summary (tests/unit/webhook/test_node_policy_keys.py finds every
annotation the plugin's source writes and checks it is here)."""
NODE_LABELS = (LABEL_MODEL, LABEL_COUNT, LABEL_MEM, LABEL_NODE_GPUS_PUBLISHED)
"""ACK's GPU labels ``node.publishing`` writes on its node (``core.model.gpumodel``), and
gpushare's own that says it published them (placeholders for Karpenter read it)."""
POD_ANNOTATIONS = (ANN_ASSIGNED,)
"""What ``deviceplugin.kubelet.reconcile`` writes on a pod it served."""
NODE_STATUS_FIELDS = (
    "phase",
    "conditions",
    "addresses",
    "daemonEndpoints",
    "nodeInfo",
    "images",
    "volumesInUse",
    "volumesAttached",
    "config",
)
"""NodeStatus fields besides capacity and allocatable, as of Kubernetes 1.30."""
NODE_SPEC_FIELDS = (
    "podCIDR",
    "podCIDRs",
    "providerID",
    "unschedulable",
    "configSource",
    "externalID",
)
"""NodeSpec fields besides taints, as of Kubernetes 1.30: kept when the startup taint goes."""


def _list(items: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{i}'" for i in items) + "]"


def _same(path: str) -> str:
    """``path`` (below object) is as it was: both absent, or both present and equal."""
    new, old = f"object.{path}", f"oldObject.{path}"
    return f"(has({new}) == has({old}) && (!has({new}) || {new} == {old}))"


def _annotations_only(keys: str, field: str = "Annotations") -> str:
    """No annotation (or label, with ``field``) but those in the CEL list ``keys`` is added,
    changed or removed."""
    new, old = f"variables.new{field}", f"variables.old{field}"
    return (
        f"{new}.all(k, k in {keys} || (k in {old} && {old}[k] == {new}[k])) && "
        f"{old}.all(k, k in {keys} || k in {new})"
    )


def _only_count(field: str) -> str:
    """In status.<field>, no resource but the count resource differs."""
    new, old = f"variables.new{field.capitalize()}", f"variables.old{field.capitalize()}"
    return (
        f"{new}.all(k, k == variables.count || (k in {old} && {old}[k] == {new}[k])) && "
        f"{old}.all(k, k == variables.count || k in {new})"
    )


def _map(path: str) -> str:
    return f"has({path}) ? {path} : {{}}"


def _common_variables() -> list[dict[str, str]]:
    extra = f"request.userInfo.extra['{NODE_NAME_EXTRA}']"
    return [
        {
            "name": "nodeName",
            "expression": f"has(request.userInfo.extra) && '{NODE_NAME_EXTRA}' in "
            f"request.userInfo.extra && size({extra}) == 1 ? {extra}[0] : ''",
        },
        {
            "name": "subResource",
            "expression": "has(request.subResource) ? request.subResource : ''",
        },
        {"name": "newAnnotations", "expression": _map("object.metadata.annotations")},
        {"name": "oldAnnotations", "expression": _map("oldObject.metadata.annotations")},
    ]


def _only(allowed: str, what: str) -> dict[str, str]:
    """Refuse every operation and subresource but UPDATE of the ``allowed`` subresources."""
    return {
        "expression": f"request.operation == 'UPDATE' && variables.subResource in {allowed}",
        "messageExpression": f"'the device plugin may update {what}, nothing else: ' + "
        "request.operation + ' of ' + request.resource.resource + (variables.subResource != '' "
        "? '/' + variables.subResource : '') + ' is refused'",
        "reason": "Forbidden",
    }


NAMED = {
    "expression": "variables.nodeName != ''",
    "message": "the device plugin's credentials name no node: it must authenticate with the "
    "ServiceAccount token kubelet mounts into its pod, which names the pod's node "
    f"({NODE_NAME_EXTRA}, Kubernetes 1.30 and later); a token made by hand or kept in a Secret "
    "is refused",
    "reason": "Forbidden",
}
KEPT = " && ".join(
    _same(p) for p in ("metadata.labels", "metadata.finalizers", "metadata.ownerReferences")
)
NODE_KEPT = " && ".join(_same(p) for p in ("metadata.finalizers", "metadata.ownerReferences"))
UPDATE = "request.operation != 'UPDATE' || "


def _spec_kept(startup_taint: str) -> str:
    """The node's spec is as it was, or (with a startup taint key) only lost that key's taints."""
    if not startup_taint:
        return _same("spec")
    key = f"'{startup_taint}'"
    old = "oldObject.spec.taints"
    others = " && ".join(_same(f"spec.{f}") for f in NODE_SPEC_FIELDS)
    return (
        f"({_same('spec')} || (has({old}) && {old}.exists(t, t.key == {key}) && "
        f"(has(object.spec.taints) ? object.spec.taints : []) == {old}.filter(t, t.key != {key})"
        f" && {others}))"
    )


def _node_spec(count: str, startup_taint: str) -> dict[str, Any]:
    status = " && ".join(_same(f"status.{f}") for f in NODE_STATUS_FIELDS)
    spared = f" but for removing the startup taint {startup_taint}" if startup_taint else ""
    return {
        "variables": [
            *_common_variables(),
            {"name": "newLabels", "expression": _map("object.metadata.labels")},
            {"name": "oldLabels", "expression": _map("oldObject.metadata.labels")},
            {"name": "count", "expression": f"'{count}'"},
            {"name": "newCapacity", "expression": _map("object.status.capacity")},
            {"name": "oldCapacity", "expression": _map("oldObject.status.capacity")},
            {"name": "newAllocatable", "expression": _map("object.status.allocatable")},
            {"name": "oldAllocatable", "expression": _map("oldObject.status.allocatable")},
        ],
        "validations": [
            _only("['', 'status']", "its node and the node status"),
            NAMED,
            {
                "expression": f"{UPDATE}request.name == variables.nodeName",
                "messageExpression": "'the device plugin on node \\'' + variables.nodeName + "
                "'\\' may write that node only, not node \\'' + request.name + '\\''",
                "reason": "Forbidden",
            },
            {
                "expression": f"{UPDATE}variables.subResource != '' || ("
                f"{_annotations_only(_list(NODE_ANNOTATIONS))} && "
                f"{_annotations_only(_list(NODE_LABELS), 'Labels')} && {NODE_KEPT} && "
                f"{_spec_kept(startup_taint)})",
                "message": "the device plugin may change only the annotations "
                f"{', '.join(NODE_ANNOTATIONS)} and the labels {', '.join(NODE_LABELS)} of its "
                "node; finalizers, owner references, other labels and annotations and the spec "
                f"(taints, unschedulable, podCIDR, providerID) stay as they are{spared}",
                "reason": "Forbidden",
            },
            {
                "expression": f"{UPDATE}variables.subResource != 'status' || ("
                f"{_same('metadata.annotations')} && {_same('metadata.labels')} && "
                f"{_only_count('capacity')} && {_only_count('allocatable')} && {status})",
                "message": f"the device plugin may change only {count} in its node's status "
                "capacity and allocatable; the other resources, conditions, addresses, daemon "
                "endpoints, node info, images, volumes and config, and the node's labels and "
                "annotations, stay as they are",
                "reason": "Forbidden",
            },
        ],
    }


def _pod_spec() -> dict[str, Any]:
    return {
        "variables": _common_variables(),
        "validations": [
            _only("['']", "pods"),
            NAMED,
            {
                "expression": f"{UPDATE}has(oldObject.spec.nodeName) && "
                "oldObject.spec.nodeName == variables.nodeName",
                "messageExpression": "'the device plugin on node \\'' + variables.nodeName + "
                "'\\' may write the pods bound to that node only, not pod ' + request.namespace "
                "+ '/' + request.name",
                "reason": "Forbidden",
            },
            {
                "expression": f"{UPDATE}variables.subResource != '' || ("
                f"{_annotations_only(_list(POD_ANNOTATIONS))} && {KEPT} && {_same('spec')})",
                "message": "the device plugin may change only the annotation "
                f"{', '.join(POD_ANNOTATIONS)} of a pod bound to its node; labels, finalizers, "
                "owner references, other annotations and the spec stay as they are",
                "reason": "Forbidden",
            },
        ],
    }


def device_plugin_policies(
    *,
    service_account: str,
    count_resource: str = DEFAULT_NAMES.count,
    name: str = POLICY_NAME,
    startup_taint: str = STARTUP_TAINT,
) -> list[dict[str, Any]]:
    """Two policies, ``<name>-nodes`` and ``<name>-pods``, each with its binding (Deny).

    One policy per kind, because the API server type-checks a policy's expressions against
    every kind it matches, and a node has no ``spec.nodeName`` nor a pod ``status.addresses``.
    ``service_account`` is the username the device plugin authenticates as,
    ``system:serviceaccount:<namespace>:<name>``; ``startup_taint`` the taint key it may
    remove from its node (empty: none).
    """
    labels = {"app.kubernetes.io/name": "gpushare"}
    documents: list[dict[str, Any]] = []
    for kind, spec in (
        ("nodes", _node_spec(count_resource, startup_taint)),
        ("pods", _pod_spec()),
    ):
        named = f"{name}-{kind}"
        documents.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": named, "labels": labels},
                "spec": {
                    "failurePolicy": "Fail",
                    "matchConstraints": {
                        "resourceRules": [
                            {
                                "apiGroups": [""],
                                "apiVersions": ["v1"],
                                "resources": [kind, f"{kind}/*"],
                                "operations": ["*"],
                                "scope": "*",
                            }
                        ]
                    },
                    "matchConditions": [
                        {
                            "name": "device-plugin",
                            "expression": f"request.userInfo.username == '{service_account}'",
                        }
                    ],
                    **spec,
                },
            }
        )
        documents.append(
            {
                "apiVersion": "admissionregistration.k8s.io/v1",
                "kind": "ValidatingAdmissionPolicyBinding",
                "metadata": {"name": named, "labels": labels},
                "spec": {"policyName": named, "validationActions": ["Deny"]},
            }
        )
    return documents
