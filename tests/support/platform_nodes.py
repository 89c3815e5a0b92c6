"""Nodes as each managed platform writes them (labels, ``status.nodeInfo``,
``spec.providerID``), trimmed to what tells them apart plus the usual well-known labels, each
offering one ``nvidia.com/gpu`` as the platform's own plugin makes kubelet do. Sources of the
marks: ../shared/docs/PLATFORMS.md; ``gpushare.core.model.platform`` says which mark is whose.
"""

from __future__ import annotations

from typing import Any

from gpushare.core.model.names import LABEL_MODE
from gpushare.core.model.platform import OPERATOR_LABEL

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
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "containerd://1.7.27",
                "kernelVersion": "6.1.0",
                "operatingSystem": "linux",
                "architecture": "amd64",
                "machineID": "0" * 32,
                "systemUUID": "00000000-0000-0000-0000-000000000000",
                "bootID": "00000000-0000-0000-0000-000000000001",
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
