"""Which platform a node runs on, read from the node object alone, and that platform's own
switch for keeping its NVIDIA device plugin off the node.

Every managed offering ships a plugin of its own that offers ``nvidia.com/gpu``, and gpushare's
device plugin refuses to share a node with another one (``node.preflight.refuse_other_plugin``).
A refusal that names only the GPU Operator's label sends an EKS, GKE or AKS user looking for a
label their platform does not read; each platform has its own switch, set where the node pool is
made. This module tells the platform apart from what the API server already holds about the
node, so the message can name the right switch, and reads nothing else (no cloud API, no file).

What tells the platforms apart (labels and fields each platform writes on its nodes; the
switches are the vendors' word, none is exercised here; sources in ../shared/docs/PLATFORMS.md):

- the GPU Operator, on any platform: it labels the nodes it manages
  ``nvidia.com/gpu.deploy.device-plugin``; its switch is that label set to ``false`` [S20].
  Checked first, since a user who installed the operator runs its plugin, not the platform's.
- OpenShift: ``node.openshift.io/os_id`` (``rhcos``, ``rhel``); NVIDIA's plugin there comes
  from the GPU Operator, so the switch is the operator's label [S19].
- Bottlerocket: ``status.nodeInfo.osImage`` starts with ``Bottlerocket``. Its NVIDIA variants
  run NVIDIA's plugin as a host service; ``settings.kubelet-device-plugins.nvidia.enabled =
  false`` turns it off (bottlerocket-core-kit#914, newer releases only) [S10].
- EKS (Amazon Linux): ``eks.amazonaws.com/nodegroup`` or ``eks.amazonaws.com/compute-type``,
  or ``spec.providerID`` ``aws://``. eksctl installs NVIDIA's plugin for GPU nodegroups unless
  told ``--install-nvidia-plugin=false`` (eksctl "GPU Support"; AL2023 from 0.204) [S13].
- GKE: ``cloud.google.com/gke-nodepool``. GKE's own plugin runs unless the node pool carries
  the node label ``gke-no-default-nvidia-gpu-device-plugin=true`` and its accelerator says
  ``gpu-driver-version=disabled`` (then Google's driver installer is yours to run) [S2].
- AKS: any ``kubernetes.azure.com/`` label. AKS-managed GPU node pools
  (``gpuProfile.nvidia.managementMode: Managed``) install NVIDIA's plugin; a pool left
  ``Unmanaged`` (the default) installs the driver only, and ``--gpu-driver none`` not even that,
  for the GPU Operator [S15].
- k3s and RKE2: ``status.nodeInfo.kubeletVersion`` ends in ``+k3sN`` or ``+rke2rN``. Neither
  ships a plugin: the one there is NVIDIA's chart or the operator, and NVIDIA's chart is kept
  off gpushare's nodes by a node affinity (docs/gpu-operator.md) [S16].
- anything else (kubeadm and the rest): the operator's label, or that affinity.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

from gpushare.core.model.kubejson import KubeObject, labels_of, name_of, spec_of, status_of

OPERATOR_LABEL = "nvidia.com/gpu.deploy.device-plugin"
"""The GPU Operator's per-node switch for its device plugin."""

CHART_AFFINITY = (
    "give NVIDIA's k8s-device-plugin DaemonSet a required node affinity "
    "ack.node.gpu.schedule DoesNotExist (docs/gpu-operator.md)"
)
"""How NVIDIA's standalone chart (or any plugin DaemonSet) is kept off gpushare's nodes."""


class Platform(Enum):
    """Where a node runs, as far as its own object tells."""

    GKE = "gke"
    EKS = "eks"
    BOTTLEROCKET = "bottlerocket"
    AKS = "aks"
    OPENSHIFT = "openshift"
    K3S = "k3s"
    RKE2 = "rke2"
    KUBERNETES = "kubernetes"
    """kubeadm or any other distribution none of the marks above names."""


@dataclass(frozen=True)
class NodePlatform:
    """A node's platform and whether the GPU Operator manages it."""

    platform: Platform
    operator: bool
    """The node carries the GPU Operator's device-plugin label."""


def detect(node: KubeObject) -> NodePlatform:
    """The node's platform from its labels, ``status.nodeInfo`` and ``spec.providerID``."""
    labels = labels_of(node)
    info = status_of(node).get("nodeInfo") or {}
    if not isinstance(info, Mapping):
        info = {}
    os_image = str(info.get("osImage", ""))
    kubelet = str(info.get("kubeletVersion", ""))
    provider = str(spec_of(node).get("providerID", ""))
    operator = OPERATOR_LABEL in labels
    if "node.openshift.io/os_id" in labels:
        return NodePlatform(Platform.OPENSHIFT, operator)
    if os_image.startswith("Bottlerocket"):
        return NodePlatform(Platform.BOTTLEROCKET, operator)
    if "cloud.google.com/gke-nodepool" in labels:
        return NodePlatform(Platform.GKE, operator)
    if any(key.startswith("kubernetes.azure.com/") for key in labels):
        return NodePlatform(Platform.AKS, operator)
    eks_labels = ("eks.amazonaws.com/nodegroup", "eks.amazonaws.com/compute-type")
    if any(key in labels for key in eks_labels) or provider.startswith("aws://"):
        return NodePlatform(Platform.EKS, operator)
    if "+k3s" in kubelet:
        return NodePlatform(Platform.K3S, operator)
    if "+rke2" in kubelet:
        return NodePlatform(Platform.RKE2, operator)
    return NodePlatform(Platform.KUBERNETES, operator)


def _operator_switch(node_name: str) -> str:
    return (
        f"kubectl label node {node_name} --overwrite {OPERATOR_LABEL}=false "
        f"(see docs/gpu-operator.md)"
    )


def plugin_switch(node: KubeObject) -> str:
    """What keeps the platform's (or the operator's) NVIDIA plugin off this node, in words a
    user can act on: the command or setting, and where it is set."""
    found = detect(node)
    node_name = name_of(node)
    if found.operator or found.platform is Platform.OPENSHIFT:
        where = "OpenShift: " if found.platform is Platform.OPENSHIFT else ""
        return f"{where}With the GPU Operator: {_operator_switch(node_name)}"
    if found.platform is Platform.BOTTLEROCKET:
        return (
            "Bottlerocket runs NVIDIA's plugin as a host service: set "
            "settings.kubelet-device-plugins.nvidia.enabled = false in the node's user data "
            "(or apiclient set settings.kubelet-device-plugins.nvidia.enabled=false; newer "
            "Bottlerocket releases only) and restart the node"
        )
    if found.platform is Platform.EKS:
        return (
            "EKS: eksctl installs NVIDIA's plugin on GPU nodegroups; create them with "
            "eksctl create nodegroup --install-nvidia-plugin=false, or, where it is installed "
            f"already (nvidia-device-plugin-daemonset in kube-system), {CHART_AFFINITY}"
        )
    if found.platform is Platform.GKE:
        return (
            "GKE: GKE's own plugin serves this node pool; make the pool with the node label "
            "gke-no-default-nvidia-gpu-device-plugin=true and --accelerator ...,"
            "gpu-driver-version=disabled (then install the driver with Google's "
            "driver-installer DaemonSet)"
        )
    if found.platform is Platform.AKS:
        return (
            "AKS: a managed GPU node pool (gpuProfile.nvidia.managementMode Managed) runs "
            "NVIDIA's plugin; use a pool left Unmanaged (the default, driver only), or "
            "az aks nodepool add --gpu-driver none with the GPU Operator and its label "
            f"{OPERATOR_LABEL}=false"
        )
    name = {Platform.K3S: "k3s", Platform.RKE2: "RKE2"}.get(found.platform)
    where = f"{name} ships no NVIDIA plugin, so this one was installed: " if name else ""
    chart = CHART_AFFINITY if name else CHART_AFFINITY[0].upper() + CHART_AFFINITY[1:]
    return f"{where}{chart}; with the GPU Operator: {_operator_switch(node_name)}"
