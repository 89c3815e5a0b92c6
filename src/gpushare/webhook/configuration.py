"""The webhook configurations that point the API server at ``gpushare webhook``.

One renderer serves ``gpushare webhook-config``, the chart's reference and the e2e test, so
what is tested is what is installed: the ``ValidatingWebhookConfiguration`` (``/validate``) and
the ``MutatingWebhookConfiguration`` that steers GPU pods naming no scheduler to gpushare's
(``/mutate``, ``steering_configuration``), with DRA mode's two webhooks in front of it
(``dra_webhooks``: a pod they convert asks no ACK resource any more, so steering is not sent it).

**Pods are matched on CREATE and UPDATE, and ``pods/ephemeralcontainers`` on UPDATE**: the
hand-off annotations must not be forged at creation nor patched in later (a merge patch is an
UPDATE of the pod), and ``kubectl debug`` adds containers through that subresource. Workloads
are matched on CREATE and UPDATE so that a changed pod template is checked too.

**Trusted identities skip the webhook** (``matchConditions``): the extender's bind and the
device plugin's ``ASSIGNED`` patch are UPDATEs of tenants' pods, and they must neither wait on
the webhook nor fail with it. The webhook trusts the same names (``--trusted-user``), so a
configuration without the condition decides the same.

**Only what gpushare must see is sent** (``matchConditions``, evaluated by the API server):
pods and workload templates that ask for gpushare's memory or core share, and, where the
``NVIDIA_VISIBLE_DEVICES`` rule is in effect, those that set that variable outside its exempt
namespaces. Everything else is never sent, so a webhook that is down or slow holds up GPU pods
only: ordinary pods and Deployments are created as if it were not installed. What must hold for
every pod while it is down (the hand-off annotations, ``nodeName``) is the
ValidatingAdmissionPolicy's, below. A namespace labelled ``gpushare.io/webhook=skip``
(:data:`OPT_OUT_LABEL`) is never sent anything: for administrators, who can label namespaces;
there is no per-object opt-out, since a tenant can label its own pods.

**failurePolicy defaults to Fail.** With ``Ignore``, anyone who can make the webhook slow past
``timeoutSeconds`` (or who acts while it is down or being upgraded) gets every bypass it refuses:
forged allocations, ``nodeName``, the isolation's variables. Those are not refused again later:
the extender never sees a pod created with ``nodeName``, and kubelet runs whatever env it is
given. With ``Fail`` the cost is availability: while no replica answers, matched pods and
workloads in the selected namespaces cannot be created or updated (the extender and the device
plugin pass, by the condition above). So run two replicas with a PodDisruptionBudget, and keep
the webhook's own namespace and ``kube-system`` out of the namespaceSelector so the webhook and
the control plane can always start. The chart adds a ValidatingAdmissionPolicy
(``webhook.policy``) that the API server evaluates itself, so the annotation and ``nodeName``
rules hold even when the webhook cannot be reached.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from gpushare.core.model.names import DEFAULT_NAMES, DEFAULT_SCHEDULER, ResourceNames

FailurePolicy = Literal["Ignore", "Fail"]

DEFAULT_FAILURE_POLICY: FailurePolicy = "Fail"
WEBHOOK_NAME = "validate.gpushare.io"
CONFIGURATION_NAME = "gpushare-webhook"
PATH = "/validate"
STEERING_WEBHOOK_NAME = "steer.gpushare.io"
STEERING_PATH = "/mutate"
DRA_NAMESPACE_WEBHOOK = ("dra-namespace.gpushare.io", "/mutate-dra-namespace")
"""DRA mode's webhook for namespaces labelled ``gpushare.io/allocation-mode=dra``, and its path."""
DRA_WEBHOOK = ("dra.gpushare.io", "/mutate-dra")
"""DRA mode's webhook for the other namespaces (pods that demand DRA nodes, or every GPU pod
under ``--dra-default-mode=dra``), and its path."""
DEMANDS_DRA_NODES = (
    "(has(object.spec.nodeSelector) && 'gpushare.io/allocation-mode' in object.spec.nodeSelector"
    " && object.spec.nodeSelector['gpushare.io/allocation-mode'] == 'dra') || "
    "(has(object.spec.affinity) && has(object.spec.affinity.nodeAffinity) && "
    "has(object.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution))"
)
"""CEL: the pod may demand DRA nodes (the webhook reads a required node affinity itself,
``core.dra.claims.demanded_by_pod``); what ``dra.gpushare.io`` is sent outside
``--dra-default-mode=dra``."""
DEFAULT_PORT = 9443
DEFAULT_EXCLUDED_NAMESPACES = ("kube-system",)
OPT_OUT_LABEL = "gpushare.io/webhook"
"""A namespace labelled with it, value ``skip``, is sent nothing by either webhook."""
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

RULES: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("", "v1", ("pods",), ("CREATE", "UPDATE")),
    ("", "v1", ("pods/ephemeralcontainers",), ("UPDATE",)),
    ("", "v1", ("replicationcontrollers",), ("CREATE", "UPDATE")),
    ("batch", "v1", ("jobs", "cronjobs"), ("CREATE", "UPDATE")),
    (
        "apps",
        "v1",
        ("deployments", "statefulsets", "daemonsets", "replicasets"),
        ("CREATE", "UPDATE"),
    ),
)
"""(API group, version, resources, operations): the kinds ``core.admitting.admission`` reads."""


def new_pods_rule() -> dict[str, Any]:
    """The rule of the mutating webhooks (steering, DRA mode's): new pods only. A fresh dict
    each time: a list shared by two webhooks of one document is dumped as a YAML alias."""
    return {
        "apiGroups": [""],
        "apiVersions": ["v1"],
        "resources": ["pods"],
        "operations": ["CREATE"],
        "scope": "Namespaced",
    }


def not_trusted(users: Sequence[str], groups: Sequence[str]) -> dict[str, str] | None:
    """The matchCondition that leaves the trusted identities out; None when there are none.

    The lists are JSON arrays, which CEL reads as list literals; the chart writes them with
    Helm's ``toJson``, hence no spaces.
    """
    terms = []
    if users:
        terms.append(f"!(request.userInfo.username in {_cel_list(users)})")
    if groups:
        terms.append(f"!request.userInfo.groups.exists(g, g in {_cel_list(groups)})")
    if not terms:
        return None
    return {"name": "not-trusted", "expression": " && ".join(terms)}


def _cel_list(items: Sequence[str]) -> str:
    return json.dumps(list(items), separators=(",", ":"))


def namespace_selector(
    excluded_namespaces: Sequence[str], namespace_labels: Mapping[str, str] | None
) -> dict[str, Any]:
    """Namespaces checked: all but the excluded ones, and only those with the labels if given."""
    expressions: list[dict[str, Any]] = [
        {"key": OPT_OUT_LABEL, "operator": "NotIn", "values": ["skip"]}
    ]
    if excluded_namespaces:
        expressions.insert(
            0,
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": list(excluded_namespaces),
            },
        )
    selector: dict[str, Any] = {"matchExpressions": expressions}
    if namespace_labels:
        selector["matchLabels"] = dict(namespace_labels)
    return selector


def asks_gpushare(names: ResourceNames, pod: str = "object") -> str:
    """CEL: the pod's containers or init containers ask for gpushare's memory or core share."""
    return asks_gpushare_in(names, f"{pod}.spec")


def asks_gpushare_in(names: ResourceNames, spec: str) -> str:
    """CEL: the pod spec ``spec``'s containers or init containers ask for gpushare's share."""
    resources = f"['{names.mem}', '{names.core}']"

    def asks(containers: str) -> str:
        return (
            f"{containers}.exists(c, has(c.resources) && {resources}.exists(r, "
            f"(has(c.resources.limits) && r in c.resources.limits) || "
            f"(has(c.resources.requests) && r in c.resources.requests)))"
        )

    return (
        f"{asks(f'{spec}.containers')} || "
        f"(has({spec}.initContainers) && {asks(f'{spec}.initContainers')})"
    )


POD_SPEC = (
    "(object.kind == 'Pod' ? object.spec : object.kind == 'CronJob' ? "
    "object.spec.jobTemplate.spec.template.spec : object.spec.template.spec)"
)
"""CEL: the pod spec of any kind the webhook is sent (a pod, or a workload's template)."""


def sets_nvidia_visible_devices(spec: str) -> str:
    """CEL: a container of ``spec`` sets NVIDIA_VISIBLE_DEVICES, or takes names under an
    ``envFrom`` prefix that can start it."""
    name = NVIDIA_VISIBLE_DEVICES

    def sets(containers: str) -> str:
        return (
            f"{containers}.exists(c, (has(c.env) && c.env.exists(e, e.name == '{name}')) || "
            f"(has(c.envFrom) && c.envFrom.exists(f, has(f.prefix) && f.prefix != '' && "
            f"'{name}'.startsWith(f.prefix))))"
        )

    return " || ".join(
        sets(f"{spec}.{kind}")
        if kind == "containers"
        else f"(has({spec}.{kind}) && {sets(f'{spec}.{kind}')})"
        for kind in ("containers", "initContainers", "ephemeralContainers")
    )


def must_see(
    names: ResourceNames, *, nvidia_visible_devices: bool, exempt_namespaces: Sequence[str]
) -> dict[str, str]:
    """The matchCondition sending the webhook only what gpushare must see (module docstring)."""
    expression = asks_gpushare_in(names, POD_SPEC)
    if nvidia_visible_devices:
        exempt = (
            f"!(request.namespace in {_cel_list(exempt_namespaces)}) && "
            if exempt_namespaces
            else ""
        )
        expression = f"{expression} || ({exempt}({sets_nvidia_visible_devices(POD_SPEC)}))"
    return {"name": "gpushare-must-see", "expression": expression}


def _client(
    url: str | None, service: Mapping[str, Any] | None, ca_bundle: str, path: str
) -> dict[str, Any]:
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url (outside the cluster) or service")
    client: dict[str, Any] = {"caBundle": ca_bundle}
    if url is not None:
        client["url"] = url
    else:
        assert service is not None
        client["service"] = {"path": path, **service}
    return client


def _webhook(
    name: str,
    client: dict[str, Any],
    failure_policy: str,
    timeout_seconds: int,
    selector: dict[str, Any],
) -> dict[str, Any]:
    """What both webhooks share: the call, its failure policy and the namespaces."""
    if failure_policy not in ("Ignore", "Fail"):
        raise ValueError(f"failurePolicy={failure_policy!r}: use Fail (default) or Ignore")
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "timeoutSeconds": timeout_seconds,
        "clientConfig": client,
        "namespaceSelector": selector,
    }


def _document(kind: str, name: str, webhook: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpushare"}},
        "webhooks": [webhook],
    }


def webhook_configuration(
    *,
    ca_bundle: str,
    url: str | None = None,
    service: Mapping[str, Any] | None = None,
    failure_policy: FailurePolicy = DEFAULT_FAILURE_POLICY,
    timeout_seconds: int = 5,
    excluded_namespaces: Sequence[str] = DEFAULT_EXCLUDED_NAMESPACES,
    namespace_labels: Mapping[str, str] | None = None,
    object_labels: Mapping[str, str] | None = None,
    trusted_users: Sequence[str] = (),
    trusted_groups: Sequence[str] = (),
    name: str = CONFIGURATION_NAME,
    names: ResourceNames = DEFAULT_NAMES,
    nvidia_visible_devices: bool = True,
    nvidia_visible_devices_exempt: Sequence[str] = (),
) -> dict[str, Any]:
    """The configuration as a dict; ``ca_bundle`` is base64 PEM, one of url/service is given.

    ``nvidia_visible_devices``: the webhook refuses that variable (outside the exempt
    namespaces), so pods that set it are sent too.
    """
    webhook = _webhook(
        WEBHOOK_NAME,
        _client(url, service, ca_bundle, PATH),
        failure_policy,
        timeout_seconds,
        namespace_selector(excluded_namespaces, namespace_labels),
    )
    webhook["rules"] = [
        {
            "apiGroups": [group],
            "apiVersions": [version],
            "resources": list(resources),
            "operations": list(operations),
            "scope": "Namespaced",
        }
        for group, version, resources, operations in RULES
    ]
    if object_labels:
        webhook["objectSelector"] = {"matchLabels": dict(object_labels)}
    conditions = [
        must_see(
            names,
            nvidia_visible_devices=nvidia_visible_devices,
            exempt_namespaces=nvidia_visible_devices_exempt,
        )
    ]
    condition = not_trusted(trusted_users, trusted_groups)
    if condition:
        conditions.append(condition)
    webhook["matchConditions"] = conditions
    return _document("ValidatingWebhookConfiguration", name, webhook)


def steering_configuration(
    *,
    ca_bundle: str,
    url: str | None = None,
    service: Mapping[str, Any] | None = None,
    failure_policy: FailurePolicy = DEFAULT_FAILURE_POLICY,
    timeout_seconds: int = 5,
    excluded_namespaces: Sequence[str] = DEFAULT_EXCLUDED_NAMESPACES,
    namespace_labels: Mapping[str, str] | None = None,
    steer_from: Sequence[str] = (DEFAULT_SCHEDULER,),
    names: ResourceNames = DEFAULT_NAMES,
    name: str = CONFIGURATION_NAME,
    tolerating: str = "",
) -> dict[str, Any]:
    """The ``MutatingWebhookConfiguration`` that sends new GPU pods naming no scheduler to
    ``/mutate`` (``core.admitting.admission.mutate``).

    ``tolerating``: gpushare's scheduler name when the webhook adds tolerations
    (``--steer-toleration``); GPU pods naming it are then sent too, to get them.

    **Only those pods are sent** (``matchConditions``, evaluated by the API server): a pod that
    names another scheduler, or asks for no gpushare resource, never waits on the webhook, so
    ``failurePolicy`` touches nothing else.

    **failurePolicy defaults to Fail**, because the pod it would let through is broken anyway:
    the cluster's own scheduler places it by the device plugin's ``aliyun.com/gpu-mem``
    capacity alone, without the extender's GPU choice, and the device plugin then has no
    allocation to hand its container, which fails to start on the node. With Fail, creating
    such a pod fails at once, naming this webhook, while no replica answers; with Ignore it is
    created and fails on the node instead. A pod that names ``ack-co-scheduler`` itself never
    depends on this webhook.
    """
    if not steer_from:
        raise ValueError("steer_from is empty: with no name to steer from, install no steering")
    sent = [*steer_from, tolerating] if tolerating and tolerating not in steer_from else steer_from
    webhook = _webhook(
        STEERING_WEBHOOK_NAME,
        _client(url, service, ca_bundle, STEERING_PATH),
        failure_policy,
        timeout_seconds,
        namespace_selector(excluded_namespaces, namespace_labels),
    )
    webhook["reinvocationPolicy"] = "Never"
    webhook |= {
        "rules": [new_pods_rule()],
        "matchConditions": [
            {
                "name": "names-no-scheduler",
                "expression": "!has(object.spec.schedulerName) || "
                f"object.spec.schedulerName in {_cel_list(sent)}",
            },
            {"name": "asks-gpushare", "expression": asks_gpushare(names)},
        ],
    }
    return _document("MutatingWebhookConfiguration", name, webhook)


def dra_webhooks(
    *,
    ca_bundle: str,
    url: str | None = None,
    service: Mapping[str, Any] | None = None,
    failure_policy: FailurePolicy = DEFAULT_FAILURE_POLICY,
    timeout_seconds: int = 5,
    excluded_namespaces: Sequence[str] = DEFAULT_EXCLUDED_NAMESPACES,
    namespace_labels: Mapping[str, str] | None = None,
    names: ResourceNames = DEFAULT_NAMES,
    default_mode: str = "device-plugin",
) -> list[dict[str, Any]]:
    """DRA mode's two webhooks (docs/dra.md), for the front of the mutating configuration:
    ``dra-namespace.gpushare.io`` for namespaces labelled for DRA mode, ``dra.gpushare.io`` for
    the others (a namespace's pods reach one of them, never both). Each is sent new GPU pods
    that name no claims; ``dra.gpushare.io`` only those that demand DRA nodes unless
    ``default_mode`` is ``dra``. ``url`` is the webhook's base (``https://HOST:PORT``), each
    path added. ``NoneOnDryRun``: the webhook creates the pod's ResourceClaimTemplate, but not
    on a dry run."""
    if default_mode not in ("device-plugin", "dra"):
        raise ValueError(f"default_mode={default_mode!r}: use device-plugin or dra")
    out = []
    for name, path in (DRA_NAMESPACE_WEBHOOK, DRA_WEBHOOK):
        by_namespace = path == DRA_NAMESPACE_WEBHOOK[1]
        selector = namespace_selector(excluded_namespaces, namespace_labels)
        selector["matchExpressions"].append(
            {
                "key": "gpushare.io/allocation-mode",
                "operator": "In" if by_namespace else "NotIn",
                "values": ["dra"],
            }
        )
        webhook = _webhook(
            name,
            _client(None if url is None else url + path, service, ca_bundle, path),
            failure_policy,
            timeout_seconds,
            selector,
        )
        conditions = [
            {"name": "asks-gpushare", "expression": asks_gpushare(names)},
            {
                "name": "names-no-claims",
                "expression": "!has(object.spec.resourceClaims) || "
                "size(object.spec.resourceClaims) == 0",
            },
        ]
        if not by_namespace and default_mode != "dra":
            conditions.append({"name": "demands-dra-nodes", "expression": DEMANDS_DRA_NODES})
        webhook |= {
            "sideEffects": "NoneOnDryRun",
            "reinvocationPolicy": "Never",
            "rules": [new_pods_rule()],
            "matchConditions": conditions,
        }
        out.append(webhook)
    return out


def mutating_configuration(
    webhooks: Sequence[dict[str, Any]], name: str = CONFIGURATION_NAME
) -> dict[str, Any]:
    """One ``MutatingWebhookConfiguration`` of ``webhooks`` (DRA mode's, then steering's)."""
    document = _document("MutatingWebhookConfiguration", name, webhooks[0])
    document["webhooks"] = list(webhooks)
    return document
