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

from gpushare.core.model.platform import OPERATOR_LABEL, Platform, detect, plugin_switch
from gpushare.node.preflight import refuse_other_plugin
from tests.support.platform_nodes import (
    AKS,
    BOTTLEROCKET,
    EKS_AL2023,
    EKS_SELF_MANAGED,
    GKE,
    K3S,
    KUBEADM,
    KUBEADM_OPERATOR,
    OPENSHIFT,
    RKE2,
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
