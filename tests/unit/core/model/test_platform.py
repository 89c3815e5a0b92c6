"""A node's platform from its own object, and the refusal beside another plugin naming that
platform's switch.

The nodes are shaped as each platform writes them (labels, ``status.nodeInfo``,
``spec.providerID``; trimmed to what tells them apart plus the usual well-known labels). The
switches are the vendors' word, cited in ../shared/docs/PLATFORMS.md ([S2] GKE, [S10]
Bottlerocket, [S13] eksctl, [S15] AKS, [S19] OpenShift, [S20] GPU Operator); nothing here runs
a platform.
"""

from __future__ import annotations

from typing import Any

import pytest

from gpushare.core.model.names import LABEL_MODE
from gpushare.core.model.platform import OPERATOR_LABEL, Platform, detect, plugin_switch
from gpushare.node.preflight import refuse_other_plugin

COMMON = {
    "kubernetes.io/os": "linux",
    "kubernetes.io/arch": "amd64",
    LABEL_MODE: "share",
}


def node(
    name: str,
    labels: dict[str, str],
    *,
    os_image: str,
    kubelet: str,
    provider: str = "",
) -> dict[str, Any]:
    spec = {"providerID": provider} if provider else {}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {**COMMON, "kubernetes.io/hostname": name, **labels}},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": "7910m", "memory": "28Gi", "nvidia.com/gpu": "1"},
            "nodeInfo": {
                "osImage": os_image,
                "kubeletVersion": kubelet,
                "containerRuntimeVersion": "containerd://1.7.27",
            },
        },
    }


GKE = node(
    "gke-gpu-pool-1a2b3c4d-x7k9",
    {
        "cloud.google.com/gke-nodepool": "gpu-pool",
        "cloud.google.com/gke-accelerator": "nvidia-tesla-t4",
        "cloud.google.com/gke-os-distribution": "cos",
        "cloud.google.com/machine-family": "n1",
    },
    os_image="Container-Optimized OS from Google",
    kubelet="v1.33.5-gke.1201000",
    provider="gce://my-project/us-central1-a/gke-gpu-pool-1a2b3c4d-x7k9",
)
EKS_AL2023 = node(
    "ip-192-168-12-34.us-west-2.compute.internal",
    {
        "eks.amazonaws.com/nodegroup": "gpu-ng",
        "eks.amazonaws.com/capacityType": "ON_DEMAND",
        "alpha.eksctl.io/nodegroup-name": "gpu-ng",
        "node.kubernetes.io/instance-type": "g5.xlarge",
    },
    os_image="Amazon Linux 2023.9.20251014",
    kubelet="v1.33.5-eks-113cf36",
    provider="aws:///us-west-2a/i-0123456789abcdef0",
)
EKS_SELF_MANAGED = node(
    "ip-10-0-1-5.ec2.internal",
    {"node.kubernetes.io/instance-type": "g4dn.xlarge"},
    os_image="Amazon Linux 2023.9.20251014",
    kubelet="v1.33.5-eks-113cf36",
    provider="aws:///us-east-1b/i-0fedcba9876543210",
)
BOTTLEROCKET = node(
    "ip-192-168-40-7.us-west-2.compute.internal",
    {
        "eks.amazonaws.com/nodegroup": "br-gpu",
        "node.kubernetes.io/instance-type": "g5.2xlarge",
    },
    os_image="Bottlerocket OS 1.50.0 (aws-k8s-1.33-nvidia)",
    kubelet="v1.33.4-eks-e386d34",
    provider="aws:///us-west-2b/i-0aaaabbbbccccdddd",
)
AKS = node(
    "aks-gpunp-12345678-vmss000000",
    {
        "kubernetes.azure.com/agentpool": "gpunp",
        "kubernetes.azure.com/cluster": "MC_rg_aks_eastus",
        "kubernetes.azure.com/accelerator": "nvidia",
        "kubernetes.azure.com/dcgm-exporter": "enabled",
        "agentpool": "gpunp",
    },
    os_image="Ubuntu 22.04.5 LTS",
    kubelet="v1.33.3",
    provider="azure:///subscriptions/0000/resourceGroups/mc_rg/providers/Microsoft.Compute/"
    "virtualMachineScaleSets/aks-gpunp-12345678-vmss/virtualMachines/0",
)
OPENSHIFT = node(
    "worker-gpu-0.ocp.example.com",
    {
        "node.openshift.io/os_id": "rhcos",
        "node-role.kubernetes.io/worker": "",
        OPERATOR_LABEL: "true",
    },
    os_image="Red Hat Enterprise Linux CoreOS 9.6.20251010-0 (Plow)",
    kubelet="v1.32.9",
)
K3S = node(
    "k3s-gpu-1",
    {"node.kubernetes.io/instance-type": "k3s"},
    os_image="Ubuntu 24.04.3 LTS",
    kubelet="v1.33.5+k3s1",
    provider="k3s://k3s-gpu-1",
)
RKE2 = node(
    "rke2-gpu-1",
    {"node.kubernetes.io/instance-type": "rke2"},
    os_image="Rocky Linux 9.6 (Blue Onyx)",
    kubelet="v1.33.5+rke2r1",
    provider="rke2://rke2-gpu-1",
)
KUBEADM = node("gpu-1", {}, os_image="Ubuntu 24.04.3 LTS", kubelet="v1.36.3")
KUBEADM_OPERATOR = node(
    "gpu-2", {OPERATOR_LABEL: "true"}, os_image="Ubuntu 24.04.3 LTS", kubelet="v1.36.3"
)

CASES: list[tuple[dict[str, Any], Platform, bool, list[str]]] = [
    # (node, platform, operator label, what the refusal must say)
    (
        GKE,
        Platform.GKE,
        False,
        ["gke-no-default-nvidia-gpu-device-plugin=true", "gpu-driver-version=disabled"],
    ),
    (EKS_AL2023, Platform.EKS, False, ["--install-nvidia-plugin=false"]),
    (EKS_SELF_MANAGED, Platform.EKS, False, ["--install-nvidia-plugin=false"]),
    (
        BOTTLEROCKET,
        Platform.BOTTLEROCKET,
        False,
        ["settings.kubelet-device-plugins.nvidia.enabled = false"],
    ),
    (AKS, Platform.AKS, False, ["managementMode", "--gpu-driver none"]),
    (
        OPENSHIFT,
        Platform.OPENSHIFT,
        True,
        [f"kubectl label node worker-gpu-0.ocp.example.com --overwrite {OPERATOR_LABEL}=false"],
    ),
    (
        K3S,
        Platform.K3S,
        False,
        ["k3s ships no NVIDIA plugin", "ack.node.gpu.schedule DoesNotExist"],
    ),
    (RKE2, Platform.RKE2, False, ["RKE2 ships no NVIDIA plugin", "DoesNotExist"]),
    (KUBEADM, Platform.KUBERNETES, False, ["DoesNotExist", f"{OPERATOR_LABEL}=false"]),
    (
        KUBEADM_OPERATOR,
        Platform.KUBERNETES,
        True,
        [f"kubectl label node gpu-2 --overwrite {OPERATOR_LABEL}=false"],
    ),
]


@pytest.mark.parametrize(
    ("obj", "platform", "operator", "words"), CASES, ids=[c[0]["metadata"]["name"] for c in CASES]
)
def test_each_platform_is_told_apart_and_its_switch_named(
    obj: dict[str, Any], platform: Platform, operator: bool, words: list[str]
) -> None:
    found = detect(obj)
    assert (found.platform, found.operator) == (platform, operator)
    message = refuse_other_plugin(obj)
    assert message is not None
    assert f"node {obj['metadata']['name']} already offers nvidia.com/gpu=1" in message
    for word in words:
        assert word in message, (word, message)


def test_other_platforms_switches_stay_out_of_a_message() -> None:
    """An EKS node is not told about GKE's label, nor a GKE node about eksctl."""
    eks, gke = plugin_switch(EKS_AL2023), plugin_switch(GKE)
    assert "gke-no-default" not in eks and "--install-nvidia-plugin" not in gke
    assert OPERATOR_LABEL not in eks and OPERATOR_LABEL not in gke


def test_the_operator_wins_over_the_platform_it_runs_on() -> None:
    """The GPU Operator on GKE: its label is the switch, not GKE's node-pool label."""
    labelled = {**GKE, "metadata": {**GKE["metadata"]}}
    labelled["metadata"]["labels"] = {**GKE["metadata"]["labels"], OPERATOR_LABEL: "true"}
    assert detect(labelled).platform is Platform.GKE
    switch = plugin_switch(labelled)
    assert f"{OPERATOR_LABEL}=false" in switch and "gke-no-default" not in switch


def test_a_node_without_status_or_spec_reads_as_plain_kubernetes() -> None:
    bare = {"metadata": {"name": "n"}}
    assert detect(bare).platform is Platform.KUBERNETES
    assert "DoesNotExist" in plugin_switch(bare)
