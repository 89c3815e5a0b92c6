"""The ``ValidatingAdmissionPolicy`` that keeps the hand-off rules while the webhook is down.

The webhook's failurePolicy decides what happens when it cannot answer; a policy the API server
evaluates itself (CEL, ``admissionregistration.k8s.io/v1``, GA since Kubernetes 1.30) has no
such gap. It carries the two rules a forger needs most, in the same words as
``core.admitting.tampering``:

- a pod's ``gpushare.io/*`` and ``ALIYUN_COM_GPU_MEM_*`` annotations cannot be set on CREATE,
  nor added, changed or removed on UPDATE, by anyone but the trusted identities;
- ``spec.nodeName`` cannot be set on CREATE on a pod whose containers ask for a gpushare
  resource under limits or requests;
- DRA mode's scheduling gate ``gpushare.io/dra-allocation`` cannot be lifted by anyone but the
  trusted identities, and ``gpushare.io/dra-requests`` (the DRA webhook's mark) is accepted on a
  new pod only beside that gate.

The isolation's variables stay with the webhook (their prefix rules and messages are longer
than a policy should carry): a tenant who catches the webhook down can switch a container's
isolation off, but not take another pod's GPU memory in the ledger.

It also matches ``pods/status``, which the webhook leaves out. The status subresource keeps
the spec but lets metadata change, so an identity allowed to write pod status could otherwise
rewrite annotations there; every kubelet status update passes through it, which an in-process
expression can afford and a webhook call under ``Fail`` cannot.

The trusted identities are left out by a matchCondition, as in the webhook's configuration.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpushare.core.admitting.tampering import HANDOFF_ANNOTATION_PREFIXES
from gpushare.core.model.names import (
    ANN_DRA_REQUESTS,
    DEFAULT_NAMES,
    DRA_SCHEDULING_GATE,
    ResourceNames,
)
from gpushare.webhook.configuration import (
    DEFAULT_EXCLUDED_NAMESPACES,
    asks_gpushare,
    namespace_selector,
    not_trusted,
)

POLICY_NAME = "gpushare-handoff"

_HANDOFF = "variables.handoff.exists(p, k.startsWith(p))"


def _variables(names: ResourceNames) -> list[dict[str, str]]:
    prefixes = ", ".join(f"'{p}'" for p in HANDOFF_ANNOTATION_PREFIXES)
    return [
        {"name": "handoff", "expression": f"[{prefixes}]"},
        {
            "name": "annotations",
            "expression": "has(object.metadata.annotations) ? object.metadata.annotations : {}",
        },
        {
            "name": "oldAnnotations",
            "expression": "request.operation == 'UPDATE' && has(oldObject.metadata.annotations)"
            " ? oldObject.metadata.annotations : {}",
        },
        {"name": "asksGpushare", "expression": asks_gpushare(names)},
        {
            "name": "draGated",
            "expression": "has(object.spec.schedulingGates) && "
            f"object.spec.schedulingGates.exists(g, g.name == '{DRA_SCHEDULING_GATE}')",
        },
        {
            "name": "oldDraGated",
            "expression": "request.operation == 'UPDATE' && has(oldObject.spec.schedulingGates) "
            f"&& oldObject.spec.schedulingGates.exists(g, g.name == '{DRA_SCHEDULING_GATE}')",
        },
    ]


def _lit(text: str) -> str:
    """A CEL string literal (single-quoted) for the text."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


_KEPT = (
    "((k in variables.oldAnnotations && variables.oldAnnotations[k] == variables.annotations[k])"
    f" || (k == '{ANN_DRA_REQUESTS}' && request.operation == 'CREATE' && variables.draGated))"
)
_BY = " + ' by \"' + request.userInfo.username + '\" is refused: ' + "


def _validations(scheduler_name: str) -> list[dict[str, str]]:
    rule = (
        "gpushare.io/* and ALIYUN_COM_GPU_MEM_* annotations record the GPU a pod was given, and "
        "only gpushare's extender and device plugin may add, change or remove them"
    )
    place = (
        "a pod placed without the gpushare scheduler gets no GPU allocation; remove "
        f"spec.nodeName and let the scheduler place it (schedulerName: {scheduler_name}, with a "
        "nodeSelector or node affinity to choose nodes)"
    )
    gate = (
        "only gpushare's DRA allocator lifts it, once it has placed the pod's claim (lifted by "
        "anyone else, the stock allocator places the claim outside gpushare's placement); leave "
        "the gate, gpushare lifts it"
    )
    return [
        {
            "expression": f"variables.annotations.all(k, !{_HANDOFF} || {_KEPT})",
            "message": f"metadata.annotations: {rule}; remove the annotation on create, leave "
            "it as it was on update",
            "messageExpression": "'metadata.annotations' + variables.annotations.filter(k, "
            f"{_HANDOFF} && !{_KEPT})"
            ".map(k, '[\"' + k + '\"]=\\'' + variables.annotations[k] + '\\'').join(', ')"
            f"{_BY}{_lit(f'{rule}; ')} + (request.operation == 'CREATE' ? "
            "'remove the annotation' : 'leave it as it was')",
            "reason": "Forbidden",
        },
        {
            "expression": f"variables.oldAnnotations.all(k, !{_HANDOFF} || "
            "k in variables.annotations)",
            "message": f"metadata.annotations: removing one is refused: {rule}; leave it as it was",
            "messageExpression": "'metadata.annotations' + variables.oldAnnotations.filter(k, "
            f"{_HANDOFF} && !(k in variables.annotations))"
            ".map(k, '[\"' + k + '\"]').join(', ') + ' removed'"
            f"{_BY}{_lit(f'{rule}; leave it as it was')}",
            "reason": "Forbidden",
        },
        {
            "expression": "!variables.oldDraGated || variables.draGated",
            "message": f'spec.schedulingGates: removing the gate "{DRA_SCHEDULING_GATE}" is '
            f"refused: {gate}",
            "messageExpression": f'\'spec.schedulingGates: the gate "{DRA_SCHEDULING_GATE}" '
            f"removed'{_BY}{_lit(gate)}",
            "reason": "Forbidden",
        },
        {
            "expression": "request.operation != 'CREATE' || !has(object.spec.nodeName) || "
            "object.spec.nodeName == '' || !variables.asksGpushare",
            "message": f"spec.nodeName is refused on a pod that asks for gpushare resources: "
            f"{place}",
            "messageExpression": "'spec.nodeName=\\'' + object.spec.nodeName + '\\' is "
            f"refused on a pod that asks for gpushare resources: ' + {_lit(place)}",
            "reason": "Forbidden",
        },
    ]


def handoff_policy(
    *,
    names: ResourceNames = DEFAULT_NAMES,
    scheduler_name: str = "ack-co-scheduler",
    trusted_users: Sequence[str] = (),
    trusted_groups: Sequence[str] = (),
    excluded_namespaces: Sequence[str] = DEFAULT_EXCLUDED_NAMESPACES,
    namespace_labels: Mapping[str, str] | None = None,
    name: str = POLICY_NAME,
) -> list[dict[str, Any]]:
    """The policy and its binding (which namespaces, and Deny), as two documents."""
    spec: dict[str, Any] = {
        "failurePolicy": "Fail",
        "matchConstraints": {
            "resourceRules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods", "pods/status"],
                    "operations": ["CREATE", "UPDATE"],
                    "scope": "Namespaced",
                }
            ]
        },
        "variables": _variables(names),
        "validations": _validations(scheduler_name),
    }
    condition = not_trusted(trusted_users, trusted_groups)
    if condition:
        spec["matchConditions"] = [condition]
    labels = {"app.kubernetes.io/name": "gpushare"}
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": name, "labels": labels},
        "spec": spec,
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {
                "namespaceSelector": namespace_selector(excluded_namespaces, namespace_labels)
            },
        },
    }
    return [policy, binding]
