"""NVIDIA_VISIBLE_DEVICES at admission: refused from tenants unless the nodes ignore it.

The rule (``core.admitting.tampering.VisibleDevicesRule``) is a mode (auto, refuse, allow) beside
the
device plugin's hand-off (cdi-cri, envvar), and a list of exempt namespaces. Every combination
is checked against every kind of namespace, on privileged and unprivileged pods, with and without
gpushare resources; then the NVIDIA components' DaemonSets as NVIDIA ships them, and the wording
of a refusal.
"""

from __future__ import annotations

import itertools
from typing import Any

import click
import pytest

from gpushare.cli.webhook import _visible_devices_rule
from gpushare.core.admitting.admission import AdmissionSettings, decide
from gpushare.core.admitting.tampering import (
    DEFAULT_EXEMPT_NAMESPACES,
    VisibleDevicesRule,
)
from tests.support.nvidia_shapes import GPU_OPERATOR_SHAPES, k8s_device_plugin, pods_of, tenant_pod

MEM = "aliyun.com/gpu-mem"
RELEASE_NS = "gpushare-system"
EXEMPT = (RELEASE_NS, *DEFAULT_EXEMPT_NAMESPACES)
"""What the chart passes by default: its release namespace, then the value's list."""
TENANT = "system:serviceaccount:team-a:default"
ADMIN = ("kubernetes-admin", ("system:masters", "system:authenticated"))

MODES = {
    # (mode, strategy): refused outside the exempt namespaces? (auto with cdi-cri: unprivileged)
    ("auto", "cdi-cri"): True,
    ("auto", "envvar"): True,
    ("refuse", "cdi-cri"): True,
    ("refuse", "envvar"): True,
    ("allow", "cdi-cri"): False,
    ("allow", "envvar"): False,
}
NAMESPACES = {
    # namespace: exempt by the chart's defaults?
    "team-a": False,
    "nvidia-device-plugin": True,
    "gpu-operator": True,
    "nvidia-gpu-operator": True,
    "kube-system": True,
    RELEASE_NS: True,
}


def settings(mode: str, strategy: str, exempt: tuple[str, ...] = EXEMPT) -> AdmissionSettings:
    return AdmissionSettings(visible_devices=VisibleDevicesRule.resolve(mode, strategy, exempt))


KINDS = {"Pod": ("", "pods"), "DaemonSet": ("apps", "daemonsets")}


def review(
    obj: dict[str, Any], *, user: str = TENANT, groups: tuple[str, ...] = ()
) -> dict[str, Any]:
    group, resource = KINDS[obj["kind"]]
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0b4f8a52-6a43-4cf1-9a1e-000000000039",
            "kind": {"group": group, "version": "v1", "kind": obj["kind"]},
            "resource": {"group": group, "version": "v1", "resource": resource},
            "name": obj["metadata"]["name"],
            "namespace": obj["metadata"]["namespace"],
            "operation": "CREATE",
            "userInfo": {"username": user, "groups": list(groups)},
            "object": obj,
        },
    }


def response(obj: dict[str, Any], config: AdmissionSettings, **who: Any) -> dict[str, Any]:
    answer: dict[str, Any] = decide(review(obj, **who), config).review["response"]
    return answer


def gpushare_pod(namespace: str, *, privileged: bool) -> dict[str, Any]:
    pod = tenant_pod(namespace, "shared", privileged=privileged)
    pod["spec"]["containers"][0]["resources"] = {"limits": {MEM: "2"}}
    pod["spec"]["schedulerName"] = "ack-co-scheduler"
    return pod


@pytest.mark.parametrize(
    ("mode", "strategy", "namespace", "privileged", "gpushare"),
    list(itertools.product(["auto", "refuse", "allow"], ["cdi-cri", "envvar"], NAMESPACES,
                           [False, True], [False, True])),
)  # fmt: skip
def test_every_mode_namespace_and_privilege(
    mode: str, strategy: str, namespace: str, privileged: bool, gpushare: bool
) -> None:
    """Refused exactly when the mode refuses and the namespace is not exempt; gpushare resources
    change nothing, privilege only under auto beside CDI hand-off (where the toolkit setting the
    webhook cannot see is about unprivileged containers; a privileged one sees every device)."""
    make = gpushare_pod if gpushare else _plain_pod
    pod = make(namespace, privileged=privileged)
    answer = response(pod, settings(mode, strategy))
    spared = privileged and (mode, strategy) == ("auto", "cdi-cri")
    refused = MODES[(mode, strategy)] and not NAMESPACES[namespace] and not spared
    assert answer["allowed"] is not refused, answer
    if refused:
        assert answer["status"]["code"] == 403
        assert "NVIDIA_VISIBLE_DEVICES='all' is refused" in answer["status"]["message"]
        assert f"in namespace {namespace!r}, which is not exempt" in answer["status"]["message"]


def _plain_pod(namespace: str, *, privileged: bool) -> dict[str, Any]:
    return tenant_pod(namespace, "plain", privileged=privileged)


@pytest.mark.parametrize("operand", sorted(GPU_OPERATOR_SHAPES))
@pytest.mark.parametrize("namespace", ["gpu-operator", "nvidia-gpu-operator", "team-a"])
def test_gpu_operator_daemonsets_and_their_pods_pass_under_the_defaults(
    operand: str, namespace: str
) -> None:
    """cdi-cri and auto (the chart's defaults): in the operator's namespace or any other, the
    DaemonSet and the pod its controller creates are admitted unchanged, even from a tenant."""
    daemonset = GPU_OPERATOR_SHAPES[operand](namespace, {})
    defaults = settings("auto", "cdi-cri")
    for obj in (daemonset, pods_of(daemonset)):
        assert response(obj, defaults) == {"uid": review(obj)["request"]["uid"], "allowed": True}
        assert response(obj, defaults, user=ADMIN[0], groups=ADMIN[1])["allowed"]


@pytest.mark.parametrize("operand", sorted(GPU_OPERATOR_SHAPES))
def test_with_refuse_the_operator_passes_only_in_its_exempt_namespace(operand: str) -> None:
    refuse = settings("refuse", "cdi-cri")
    for namespace in ("gpu-operator", "nvidia-gpu-operator"):
        daemonset = GPU_OPERATOR_SHAPES[operand](namespace, {})
        assert response(daemonset, refuse)["allowed"]
        assert response(pods_of(daemonset), refuse)["allowed"]
    elsewhere = GPU_OPERATOR_SHAPES[operand]("team-a", {})
    # even for system:masters: the rule is about the pod, not who sends it
    answer = response(elsewhere, refuse, user=ADMIN[0], groups=ADMIN[1])
    assert answer["allowed"] is False
    message = answer["status"]["message"]
    assert message.startswith(f"DaemonSet team-a/{elsewhere['metadata']['name']} (pod template")
    assert "spec.template.spec.containers[0].env[" in message or "initContainers" in message


def test_nvidias_device_plugin_for_other_nodes_passes_in_its_charts_namespace() -> None:
    """Unprivileged with every GPU visible: exempt by default in its chart's own namespace
    (nvidia-device-plugin), refused in another one unless that is listed."""
    defaults = settings("auto", "cdi-cri")
    daemonset = k8s_device_plugin("nvidia-device-plugin", {})
    assert response(daemonset, defaults)["allowed"]
    assert response(pods_of(daemonset), defaults)["allowed"]
    assert response(daemonset, settings("refuse", "cdi-cri"))["allowed"]
    elsewhere = k8s_device_plugin("nvidia", {})
    assert not response(elsewhere, defaults)["allowed"]
    listed = settings("auto", "cdi-cri", (*EXEMPT, "nvidia"))
    assert response(elsewhere, listed)["allowed"]


def test_the_refusal_names_the_variable_the_rule_and_what_to_do() -> None:
    pod = tenant_pod("team-a", "greedy")
    envvar = response(pod, settings("auto", "envvar"))["status"]["message"]
    assert envvar.startswith(
        'Pod team-a/greedy is refused: container "main" (spec.containers[0].env[0]): '
        "NVIDIA_VISIBLE_DEVICES='all' is refused on every pod in namespace 'team-a', which is "
        "not exempt from this rule: "
    )
    for words in (
        "mounts every GPU it names into the container",
        "device-list strategy envvar",
        "remove it",
        "webhook.nvidiaVisibleDevicesExemptNamespaces; now gpu-operator, gpushare-system, "
        "kube-system, nvidia-device-plugin, nvidia-gpu-operator",
        "devicePlugin.deviceListStrategy=cdi-cri",
        "accept-nvidia-visible-devices-envvar-when-unprivileged = false",
    ):
        assert words in envvar, words
    refuse = response(pod, settings("refuse", "cdi-cri"))["status"]["message"]
    assert "the webhook is set to refuse it (nvidia-visible-devices mode refuse)" in refuse
    assert "set webhook.nvidiaVisibleDevices=allow with CDI hand-off" in refuse


@pytest.mark.parametrize("gpushare", [False, True])
def test_a_tenants_variable_is_refused_under_the_chart_defaults(gpushare: bool) -> None:
    """Issue 56: ``NVIDIA_VISIBLE_DEVICES=all`` from a tenant was admitted under the defaults
    (auto beside cdi-cri), safe only on nodes whose toolkit ignores it from unprivileged
    containers, which the webhook cannot see; now refused, in a GPU-sharing pod and in a pod
    without GPU resources alike, naming the field, the value, the rule and what to do."""
    pod = gpushare_pod("team-a", privileged=False) if gpushare else tenant_pod("team-a", "greedy")
    answer = response(pod, settings("auto", "cdi-cri"))
    assert answer["allowed"] is False and answer["status"]["code"] == 403
    message = answer["status"]["message"]
    name = pod["metadata"]["name"]
    scope = "on a pod that asks for aliyun.com/gpu-mem" if gpushare else "on every pod"
    assert message.startswith(
        f'Pod team-a/{name} is refused: container "main" (spec.containers[0].env[0]): '
        f"NVIDIA_VISIBLE_DEVICES='all' is refused {scope} (from unprivileged containers) in "
        "namespace 'team-a', which is not exempt from this rule: "
    ), message
    for words in (
        "device-list strategy cdi-cri",
        "harmless only on nodes whose NVIDIA Container Toolkit ignores it from unprivileged "
        "containers, which the webhook cannot see",
        "remove it",
        "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false",
        "set webhook.nvidiaVisibleDevices=allow with CDI hand-off",
    ):
        assert words in message, words
    # 'void' still hides GPUs on a pod without gpushare resources
    if not gpushare:
        pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
        assert response(pod, settings("auto", "cdi-cri"))["allowed"]


def test_hiding_values_and_the_other_variables_keep_their_rules() -> None:
    refuse = settings("refuse", "envvar")
    for hidden in ("void", "none"):
        pod = tenant_pod("team-a", "hides")
        pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": hidden}]
        assert response(pod, refuse)["allowed"]
    # LD_PRELOAD on a gpushare pod is refused in every mode, exempt namespace or not
    for mode, strategy in MODES:
        for namespace in ("team-a", "gpu-operator"):
            pod = gpushare_pod(namespace, privileged=False)
            pod["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/x.so"}]
            answer = response(pod, settings(mode, strategy))
            assert answer["allowed"] is False
            assert "LD_PRELOAD='/x.so'" in answer["status"]["message"]


def test_env_from_with_an_nvidia_prefix_follows_the_rule() -> None:
    pod = tenant_pod("team-a", "imports")
    pod["spec"]["containers"][0]["env"] = []
    pod["spec"]["containers"][0]["envFrom"] = [{"prefix": "NVIDIA_", "configMapRef": {"name": "c"}}]
    refused = response(pod, settings("auto", "envvar"))
    assert "prefix 'NVIDIA_' can make NVIDIA_VISIBLE_DEVICES" in refused["status"]["message"]
    assert not response(pod, settings("auto", "cdi-cri"))["allowed"]
    assert response(pod, settings("allow", "cdi-cri"))["allowed"]
    pod["metadata"]["namespace"] = "gpu-operator"
    assert response(pod, settings("auto", "envvar"))["allowed"]


def test_the_library_default_refuses_outside_nvidias_namespaces() -> None:
    """AdmissionSettings() says nothing of the nodes, so it takes the reading safe on any."""
    rule = AdmissionSettings().visible_devices
    assert rule.refused and rule.exempt == frozenset(DEFAULT_EXEMPT_NAMESPACES)
    assert not response(tenant_pod("team-a", "p"), AdmissionSettings())["allowed"]
    assert response(tenant_pod("gpu-operator", "p"), AdmissionSettings())["allowed"]


@pytest.mark.parametrize(
    ("mode", "strategy", "exempt", "words"),
    [
        ("deny", "cdi-cri", EXEMPT, "mode 'deny' is not one of auto, refuse, allow"),
        ("auto", "volume-mounts", EXEMPT, "strategy 'volume-mounts' is not one of cdi-cri"),
        ("auto", "cdi-cri", ("gpu-operator", " "), "exempt namespace ' ' is not a namespace"),
    ],
)
def test_bad_settings_are_refused_naming_what_to_write(
    mode: str, strategy: str, exempt: tuple[str, ...], words: str
) -> None:
    with pytest.raises(ValueError, match=words):
        VisibleDevicesRule.resolve(mode, strategy, exempt)
    with pytest.raises(click.BadParameter, match=words):
        _visible_devices_rule(mode, strategy, exempt)


def test_driver_root_is_read_as_cdi_cri_is_refused_from_unprivileged_tenants() -> None:
    """The chart passes the device plugin's strategy to the webhook; driver-root nodes are meant
    to have no NVIDIA runtime, which the webhook cannot see, so auto stays as under cdi-cri."""
    rule = VisibleDevicesRule.resolve("auto", "driver-root")
    assert rule.refused and rule.unprivileged_only
    assert "device-list strategy driver-root" in rule.because
    assert not VisibleDevicesRule.resolve("allow", "driver-root").refused
