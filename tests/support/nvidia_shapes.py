"""DaemonSets shaped like NVIDIA's own components, for the admission tests.

Written here from what NVIDIA publishes about them, not copied: the GPU Operator's operands
(``assets/state-device-plugin``, ``state-dcgm-exporter``, ``gpu-feature-discovery``,
``state-operator-validation`` in github.com/NVIDIA/gpu-operator) and the DaemonSet of
NVIDIA's k8s-device-plugin Helm chart (``deployments/helm/nvidia-device-plugin``). What matters
to gpushare's webhook is kept: ``NVIDIA_VISIBLE_DEVICES=all`` in their env, privileged
containers (the operator's operands) or an unprivileged one (the plugin's chart), the hostPath
volumes, the per-operand node selectors (``nvidia.com/gpu.deploy.<operand>=true``), the
``nvidia.com/gpu`` toleration. Images are placeholders: on kwok nodes nothing runs.

Each DaemonSet also carries ``extra_selector``, so a test can pick which nodes its pods land on
(a kwok node labelled with it) or keep them off every node.
"""

from __future__ import annotations

import copy
from typing import Any

VISIBLE_ALL = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
GPUSHARE_NODE_LABEL = "ack.node.gpu.schedule"
"""The label gpushare's device plugin DaemonSet selects its nodes by (the chart's nodeModes)."""


def _host(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "hostPath": {"path": path, "type": "DirectoryOrCreate"}}


def _privileged(name: str, env: list[dict[str, Any]], mounts: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "image": "registry.invalid/nvidia/placeholder:1",
        "securityContext": {"privileged": True},
        "env": env,
        "volumeMounts": [{"name": m, "mountPath": f"/{m}"} for m in mounts],
    }


def _wait_for_toolkit() -> dict[str, Any]:
    """The init container every operand runs first: wait for the validator's toolkit mark."""
    init = _privileged("toolkit-validation", [], ["run-nvidia"])
    init["command"] = [
        "sh",
        "-c",
        "until [ -f /run-nvidia/validations/toolkit-ready ]; do sleep 5; done",
    ]
    return init


def _daemonset(
    name: str,
    namespace: str,
    operand: str,
    *,
    containers: list[dict[str, Any]],
    init: list[dict[str, Any]],
    volumes: list[dict[str, Any]],
    extra_selector: dict[str, str],
) -> dict[str, Any]:
    labels = {"app": name}
    spec: dict[str, Any] = {
        "nodeSelector": {f"nvidia.com/gpu.deploy.{operand}": "true", **extra_selector},
        "tolerations": [dict(GPU_TOLERATION)],
        "priorityClassName": "system-node-critical",
        "initContainers": init,
        "containers": containers,
        "volumes": volumes,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": namespace, "labels": dict(labels)},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": spec},
        },
    }


def operator_device_plugin(namespace: str, extra_selector: dict[str, str]) -> dict[str, Any]:
    """The GPU Operator's device plugin: privileged, every GPU visible, kubelet's socket dir."""
    env = [
        {"name": "DEVICE_LIST_STRATEGY", "value": "envvar"},
        {"name": "DEVICE_ID_STRATEGY", "value": "uuid"},
        dict(VISIBLE_ALL),
        {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "all"},
    ]
    mounts = ["device-plugin", "run-nvidia", "cdi-root"]
    return _daemonset(
        "nvidia-device-plugin-daemonset",
        namespace,
        "device-plugin",
        containers=[_privileged("nvidia-device-plugin", env, mounts)],
        init=[_wait_for_toolkit()],
        volumes=[
            _host("device-plugin", "/var/lib/kubelet/device-plugins"),
            _host("run-nvidia", "/run/nvidia"),
            _host("cdi-root", "/var/run/cdi"),
        ],
        extra_selector=extra_selector,
    )


def dcgm_exporter(namespace: str, extra_selector: dict[str, str]) -> dict[str, Any]:
    """dcgm-exporter: reads every GPU's counters, and kubelet's pod-resources socket."""
    env = [{"name": "DCGM_EXPORTER_LISTEN", "value": ":9400"}, dict(VISIBLE_ALL)]
    exporter = _privileged("nvidia-dcgm-exporter", env, ["pod-gpu-resources"])
    exporter["ports"] = [{"name": "metrics", "containerPort": 9400}]
    return _daemonset(
        "nvidia-dcgm-exporter",
        namespace,
        "dcgm-exporter",
        containers=[exporter],
        init=[_wait_for_toolkit()],
        volumes=[
            _host("pod-gpu-resources", "/var/lib/kubelet/pod-resources"),
            _host("run-nvidia", "/run/nvidia"),
        ],
        extra_selector=extra_selector,
    )


def feature_discovery(namespace: str, extra_selector: dict[str, str]) -> dict[str, Any]:
    """GPU feature discovery: labels the node from what NVML says of every GPU."""
    env = [
        {"name": "GFD_SLEEP_INTERVAL", "value": "60s"},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        dict(VISIBLE_ALL),
    ]
    return _daemonset(
        "gpu-feature-discovery",
        namespace,
        "gpu-feature-discovery",
        containers=[_privileged("gpu-feature-discovery", env, ["output-dir", "run-nvidia"])],
        init=[_wait_for_toolkit()],
        volumes=[
            _host("output-dir", "/etc/kubernetes/node-feature-discovery/features.d"),
            _host("run-nvidia", "/run/nvidia"),
        ],
        extra_selector=extra_selector,
    )


def operator_validator(namespace: str, extra_selector: dict[str, str]) -> dict[str, Any]:
    """The validator: init containers check the driver, toolkit, CUDA and plugin in turn."""
    init = [
        _privileged(
            f"{component}-validation",
            [{"name": "COMPONENT", "value": component}, dict(VISIBLE_ALL)],
            ["run-nvidia"],
        )
        for component in ("driver", "toolkit", "cuda", "plugin")
    ]
    main = _privileged("nvidia-operator-validator", [dict(VISIBLE_ALL)], ["run-nvidia"])
    main["command"] = ["sh", "-c", "sleep infinity"]
    return _daemonset(
        "nvidia-operator-validator",
        namespace,
        "operator-validator",
        containers=[main],
        init=init,
        volumes=[_host("run-nvidia", "/run/nvidia")],
        extra_selector=extra_selector,
    )


GPU_OPERATOR_SHAPES = {
    "device-plugin": operator_device_plugin,
    "dcgm-exporter": dcgm_exporter,
    "gpu-feature-discovery": feature_discovery,
    "operator-validator": operator_validator,
}
"""The GPU Operator's operands that set NVIDIA_VISIBLE_DEVICES=all, by operand name."""


def k8s_device_plugin(namespace: str, extra_selector: dict[str, str]) -> dict[str, Any]:
    """NVIDIA's k8s-device-plugin as its Helm chart installs it, kept off gpushare's nodes.

    Unprivileged (no privilege escalation, every capability dropped), every GPU visible to
    itself; the node affinity keeps it to GPU nodes that gpushare does not manage, so the two
    plugins never advertise the same GPUs.
    """
    labels = {"app.kubernetes.io/name": "nvidia-device-plugin"}
    container = {
        "name": "nvidia-device-plugin-ctr",
        "image": "registry.invalid/nvidia/k8s-device-plugin:placeholder",
        "command": ["nvidia-device-plugin"],
        "env": [
            {"name": "FAIL_ON_INIT_ERROR", "value": "true"},
            dict(VISIBLE_ALL),
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"},
        ],
        "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [
            {"name": "kubelet-device-plugins-dir", "mountPath": "/var/lib/kubelet/device-plugins"}
        ],
    }
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]},
                            {"key": GPUSHARE_NODE_LABEL, "operator": "DoesNotExist"},
                        ]
                    }
                ]
            }
        }
    }
    spec: dict[str, Any] = {
        "priorityClassName": "system-node-critical",
        "tolerations": [dict(GPU_TOLERATION)],
        "affinity": affinity,
        "containers": [container],
        "volumes": [
            {
                "name": "kubelet-device-plugins-dir",
                "hostPath": {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"},
            }
        ],
    }
    if extra_selector:
        spec["nodeSelector"] = dict(extra_selector)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin", "namespace": namespace, "labels": labels},
        "spec": {
            "selector": {"matchLabels": dict(labels)},
            "template": {"metadata": {"labels": dict(labels)}, "spec": spec},
        },
    }


def tenant_pod(namespace: str, name: str, *, privileged: bool = False) -> dict[str, Any]:
    """A tenant's pod that asks for no GPU and sets NVIDIA_VISIBLE_DEVICES=all (the threat)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": "registry.invalid/cuda:placeholder",
        "env": [dict(VISIBLE_ALL)],
    }
    if privileged:
        container["securityContext"] = {"privileged": True}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeSelector": {"gpushare-e2e": "nowhere"}, "containers": [container]},
    }


def pods_of(daemonset: dict[str, Any]) -> dict[str, Any]:
    """The pod the DaemonSet controller would create from it (for admission of Pod CREATE)."""
    template = copy.deepcopy(daemonset["spec"]["template"])
    metadata = {**template.get("metadata", {}), "name": f"{daemonset['metadata']['name']}-x1"}
    metadata["namespace"] = daemonset["metadata"]["namespace"]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": template["spec"]}
