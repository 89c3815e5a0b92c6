"""The ``ValidatingWebhookConfiguration`` that points the API server at ``gpushare webhook``.

One renderer serves ``gpushare webhook-config``, the chart's reference and the e2e test, so
what is tested is what is installed.

**failurePolicy defaults to Ignore.** The webhook only moves a refusal earlier: the extender's
filter applies the same rules (``core.requests``) and leaves an invalid pod Pending with the
same sentences, so nothing unsafe gets through while the webhook is down. ``Fail`` would block
the creation of every matched Pod, Job and Deployment in the selected namespaces, GPU or not
(a webhook cannot be scoped by resource name), whenever the webhook is unreachable: a
scheduling add-on must not take the cluster's workloads down with it. Choose ``Fail`` when
refusals at ``kubectl apply`` time must hold, and run two webhook replicas.

Pods are matched on CREATE only: the extender's bind patches pod annotations, and an UPDATE
rule would put the webhook in the path of every bind. Workloads are matched on CREATE and
UPDATE so that a changed pod template is checked too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

FailurePolicy = Literal["Ignore", "Fail"]

DEFAULT_FAILURE_POLICY: FailurePolicy = "Ignore"
WEBHOOK_NAME = "validate.gpushare.io"
CONFIGURATION_NAME = "gpushare-webhook"
PATH = "/validate"
DEFAULT_PORT = 9443
DEFAULT_EXCLUDED_NAMESPACES = ("kube-system",)

RULES: tuple[tuple[str, str, tuple[str, ...], tuple[str, ...]], ...] = (
    ("", "v1", ("pods",), ("CREATE",)),
    ("", "v1", ("replicationcontrollers",), ("CREATE", "UPDATE")),
    ("batch", "v1", ("jobs", "cronjobs"), ("CREATE", "UPDATE")),
    (
        "apps",
        "v1",
        ("deployments", "statefulsets", "daemonsets", "replicasets"),
        ("CREATE", "UPDATE"),
    ),
)
"""(API group, version, resources, operations): the kinds ``core.admission`` reads."""


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
    name: str = CONFIGURATION_NAME,
) -> dict[str, Any]:
    """The configuration as a dict; ``ca_bundle`` is base64 PEM, one of url/service is given."""
    if (url is None) == (service is None):
        raise ValueError("give exactly one of url (outside the cluster) or service")
    if failure_policy not in ("Ignore", "Fail"):
        raise ValueError(f"failurePolicy={failure_policy!r}: use Ignore (default) or Fail")
    client: dict[str, Any] = {"caBundle": ca_bundle}
    if url is not None:
        client["url"] = url
    else:
        assert service is not None
        client["service"] = {"path": PATH, **service}
    namespace_selector: dict[str, Any] = {}
    if excluded_namespaces:
        namespace_selector["matchExpressions"] = [
            {
                "key": "kubernetes.io/metadata.name",
                "operator": "NotIn",
                "values": list(excluded_namespaces),
            }
        ]
    if namespace_labels:
        namespace_selector["matchLabels"] = dict(namespace_labels)
    webhook: dict[str, Any] = {
        "name": WEBHOOK_NAME,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": failure_policy,
        "matchPolicy": "Equivalent",
        "timeoutSeconds": timeout_seconds,
        "clientConfig": client,
        "namespaceSelector": namespace_selector,
        "rules": [
            {
                "apiGroups": [group],
                "apiVersions": [version],
                "resources": list(resources),
                "operations": list(operations),
                "scope": "Namespaced",
            }
            for group, version, resources, operations in RULES
        ],
    }
    if object_labels:
        webhook["objectSelector"] = {"matchLabels": dict(object_labels)}
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/name": "gpushare"}},
        "webhooks": [webhook],
    }
