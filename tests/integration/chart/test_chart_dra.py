"""The chart's DRA mode (dra.*): off by default; on, the DeviceClass, the claim policy and the
webhook's DRA path with the one permission it needs.

The conversion's rules are tested on the core (tests/unit/core/dra) and the objects on the real
API server (tests/e2e/test_dra_objects.py); here: what the values render.
"""

from __future__ import annotations

from typing import Any

from tests.support.chart import RELEASE, find, needs_helm, render

pytestmark = needs_helm

ON = ("--set", "dra.enabled=true")


def webhook_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    spec = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]
    [container] = [c for c in spec["containers"] if c["name"] == "webhook"]
    return dict(container)


def test_dra_mode_is_off_by_default() -> None:
    docs = render()
    assert not [d for d in docs if d["kind"] == "DeviceClass"]
    assert not [d for d in docs if d["metadata"]["name"].endswith("-dra-claims")]
    assert not [a for a in webhook_container(docs)["args"] if a.startswith("--dra")]
    mutating = find(docs, "MutatingWebhookConfiguration")
    assert [w["name"] for w in mutating["webhooks"]] == ["steer.gpushare.io"]
    assert find(docs, "ServiceAccount", "-webhook")["automountServiceAccountToken"] is False


def test_dra_mode_renders_the_class_the_policy_and_the_webhook_path() -> None:
    docs = render(*ON, "--set", "dra.memoryUnit=128MiB", "--set", "dra.claims.maxCount=16")
    device_class = find(docs, "DeviceClass")
    assert device_class["metadata"]["name"] == "gpu.gpushare.io"
    assert device_class["spec"]["selectors"] == [
        {"cel": {"expression": 'device.driver == "gpushare.io"'}}
    ]
    policy = find(docs, "ValidatingAdmissionPolicy", "-dra-claims")
    assert policy["metadata"]["name"] == f"{RELEASE}-dra-claims"
    rules = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rules[0]["resources"] == ["resourceclaims", "resourceclaimtemplates"]
    expressions = " ".join(v["expression"] for v in policy["spec"]["validations"])
    assert "adminAccess" in expressions and "'All'" in expressions and "> 16" in expressions
    binding = find(docs, "ValidatingAdmissionPolicyBinding", "-dra-claims")
    assert binding["spec"]["validationActions"] == ["Deny"]

    args = webhook_container(docs)["args"]
    assert {"--dra", "--dra-memory-unit=128MiB", "--dra-default-mode=device-plugin"} <= set(args)
    assert find(docs, "ServiceAccount", "-webhook")["automountServiceAccountToken"] is True
    role = find(docs, "ClusterRole", "-webhook-dra")
    assert role["rules"] == [
        {
            "apiGroups": ["resource.k8s.io"],
            "resources": ["resourceclaimtemplates"],
            "verbs": ["create", "get"],
        }
    ]
    mutating = find(docs, "MutatingWebhookConfiguration")
    hooks = {w["name"]: w for w in mutating["webhooks"]}
    assert list(hooks) == ["dra-namespace.gpushare.io", "dra.gpushare.io", "steer.gpushare.io"]
    by_namespace, by_pod = hooks["dra-namespace.gpushare.io"], hooks["dra.gpushare.io"]
    for hook, path, operator in (
        (by_namespace, "/mutate-dra-namespace", "In"),
        (by_pod, "/mutate-dra", "NotIn"),
    ):
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert hook["clientConfig"]["service"]["path"] == path
        assert {
            "key": "gpushare.io/allocation-mode",
            "operator": operator,
            "values": ["dra"],
        } in hook["namespaceSelector"]["matchExpressions"]
    conditions = {c["name"] for c in by_pod["matchConditions"]}
    assert conditions == {"asks-gpushare", "names-no-claims", "demands-dra-nodes"}
    # the hand-off policy keeps the gate and accepts the webhook's mark beside it
    handoff = find(docs, "ValidatingAdmissionPolicy", "-handoff")
    names = {v["name"] for v in handoff["spec"]["variables"]}
    assert {"draGated", "oldDraGated"} <= names


def test_a_cluster_wide_default_sends_every_gpu_pod_and_steering_can_be_off() -> None:
    docs = render(*ON, "--set", "dra.defaultMode=dra", "--set", "webhook.steer.enabled=false")
    hooks = {w["name"]: w for w in find(docs, "MutatingWebhookConfiguration")["webhooks"]}
    assert list(hooks) == ["dra-namespace.gpushare.io", "dra.gpushare.io"]
    assert {c["name"] for c in hooks["dra.gpushare.io"]["matchConditions"]} == {
        "asks-gpushare",
        "names-no-claims",
    }
    assert "--dra-default-mode=dra" in webhook_container(docs)["args"]


def test_under_a_test_api_server_the_dra_driver_uses_the_nodes_network() -> None:
    """testing.apiServer names an address the node's network reaches (no kube-proxy): the
    driver calls the API server, so it runs there as the device plugin does; DRA mode's
    webhook is told the address too but stays on the pod network (its Service routes to it)."""
    testing = ("--set", "testing.apiServer=127.0.0.1:6443")
    for docs, on in ((render(*ON, *testing), True), (render(*ON), False)):
        spec = find(docs, "DaemonSet", "-dra-driver")["spec"]["template"]["spec"]
        assert spec.get("hostNetwork", False) is on
        [container] = spec["containers"]
        env = {e["name"]: e.get("value") for e in container.get("env", [])}
        assert (env.get("KUBERNETES_SERVICE_HOST") == "127.0.0.1") is on, env
        webhook = find(docs, "Deployment", "-webhook")["spec"]["template"]["spec"]
        assert "hostNetwork" not in webhook
        env = {e["name"]: e.get("value") for e in webhook_container(docs).get("env", [])}
        assert (env.get("KUBERNETES_SERVICE_HOST") == "127.0.0.1") is on, env
